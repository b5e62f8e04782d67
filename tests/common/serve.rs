//! Starting the real `warrant serve` binary for a test and reading its banner.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

/// A running `warrant serve` process; killed when dropped.
pub struct Served {
    pub child: Child,
    /// The base URL it printed.
    pub url: String,
    /// Keys printed on a first start, by name (`admin`, `agent`).
    pub keys: HashMap<String, String>,
    /// The banner's lines, up to and with the `ready` line.
    pub banner: Vec<String>,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `warrant serve` (in the repository root, stderr discarded, unless `configure` says
/// otherwise) with `configure` applied to the command, and reads the banner up to its `ready`
/// line.
pub fn serve(configure: impl FnOnce(&mut Command)) -> Served {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_warrant"));
    cmd.current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["serve", "--listen", "127.0.0.1:0"])
        .env_remove("WARRANT_CONFIG")
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    configure(&mut cmd);
    let mut child = cmd.spawn().unwrap();
    let lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut url = String::new();
    let mut keys = HashMap::new();
    let mut banner = Vec::new();
    for line in lines {
        let line = line.unwrap();
        banner.push(line.clone());
        if let Some(u) = line.strip_prefix("warrant is listening on ") {
            url = u.to_owned();
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        if let [name, key] = words.as_slice()
            && key.starts_with("wrn_")
        {
            keys.insert((*name).to_owned(), (*key).to_owned());
        }
        if line.starts_with("ready") {
            break;
        }
    }
    assert!(url.starts_with("http://127.0.0.1:"), "no banner: {url}");
    Served {
        child,
        url,
        keys,
        banner,
    }
}
