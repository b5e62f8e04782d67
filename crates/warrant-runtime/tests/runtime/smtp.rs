//! A real SMTP receiver on loopback (RFC 5321's minimum: EHLO/HELO, MAIL, RCPT, DATA, RSET,
//! NOOP, QUIT), recording every accepted message's envelope and data.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

#[derive(Debug, Clone, Default)]
pub struct Received {
    pub from: String,
    pub recipients: Vec<String>,
    pub data: String,
}

#[derive(Default)]
pub struct Sink {
    pub messages: Mutex<Vec<Received>>,
}

fn path_of(arg: &str) -> String {
    let start = arg.find('<').map_or(0, |i| i + 1);
    let end = arg.rfind('>').unwrap_or(arg.len());
    arg[start..end].to_owned()
}

async fn session(stream: tokio::net::TcpStream, sink: Arc<Sink>) -> std::io::Result<()> {
    let (read, mut write) = stream.into_split();
    let mut lines = BufReader::new(read);
    write.write_all(b"220 sink.test ESMTP\r\n").await?;
    let mut current = Received::default();
    let mut line = String::new();
    loop {
        line.clear();
        if lines.read_line(&mut line).await? == 0 {
            return Ok(());
        }
        let upper = line.to_ascii_uppercase();
        let reply: &[u8] = if upper.starts_with("EHLO") {
            b"250-sink.test\r\n250 8BITMIME\r\n"
        } else if upper.starts_with("HELO") || upper.starts_with("NOOP") {
            b"250 ok\r\n"
        } else if upper.starts_with("MAIL FROM:") {
            current = Received {
                from: path_of(&line[10..]),
                ..Received::default()
            };
            b"250 ok\r\n"
        } else if upper.starts_with("RCPT TO:") {
            current.recipients.push(path_of(&line[8..]));
            b"250 ok\r\n"
        } else if upper.starts_with("DATA") {
            write.write_all(b"354 go ahead\r\n").await?;
            let mut data = String::new();
            loop {
                line.clear();
                if lines.read_line(&mut line).await? == 0 {
                    return Ok(());
                }
                if line == ".\r\n" {
                    break;
                }
                data.push_str(&line);
            }
            current.data = data;
            sink.messages.lock().unwrap().push(std::mem::take(&mut current));
            b"250 queued\r\n"
        } else if upper.starts_with("RSET") {
            current = Received::default();
            b"250 ok\r\n"
        } else if upper.starts_with("QUIT") {
            write.write_all(b"221 bye\r\n").await?;
            return Ok(());
        } else {
            b"502 not implemented\r\n"
        };
        write.write_all(reply).await?;
    }
}

pub async fn start() -> (SocketAddr, Arc<Sink>) {
    let sink = Arc::new(Sink::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let s = sink.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(session(stream, s.clone()));
        }
    });
    (addr, sink)
}
