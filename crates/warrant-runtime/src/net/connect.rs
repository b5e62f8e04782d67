//! The connector beneath TLS: resolves a destination, vets every address, then dials only the
//! vetted ones, so hyper never resolves a name itself.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::Uri;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use super::guard::Guard;
use super::{Dialer, NetError, Resolver};

/// What every connection attempt of one client shares.
pub(crate) struct Shared {
    pub(crate) guard: Guard,
    pub(crate) resolver: Arc<dyn Resolver>,
    pub(crate) dialer: Arc<dyn Dialer>,
    pub(crate) connect_timeout: Duration,
}

/// A `tower_service::Service<Uri>` that resolves, vets, then dials. Its errors are `NetError`s, so
/// the client can tell a refusal or a failed dial from a TLS failure above it.
#[derive(Clone)]
pub(crate) struct GuardedConnector {
    shared: Arc<Shared>,
}

impl GuardedConnector {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        Self { shared }
    }
}

type Connecting = Pin<Box<dyn Future<Output = Result<TokioIo<TcpStream>, NetError>> + Send>>;

impl tower_service::Service<Uri> for GuardedConnector {
    type Response = TokioIo<TcpStream>;
    type Error = NetError;
    type Future = Connecting;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, dst: Uri) -> Self::Future {
        let shared = Arc::clone(&self.shared);
        Box::pin(async move { connect(&shared, &dst).await.map(TokioIo::new) })
    }
}

async fn connect(shared: &Shared, dst: &Uri) -> Result<TcpStream, NetError> {
    let https = match dst.scheme_str() {
        Some("https") => true,
        Some("http") => false,
        other => return Err(NetError::InvalidRequest(format!("unsupported scheme {other:?}"))),
    };
    let host = dst
        .host()
        .ok_or_else(|| NetError::InvalidRequest("the url has no host".into()))?;
    let port = dst.port_u16().unwrap_or(if https { 443 } else { 80 });
    let addrs = shared
        .guard
        .vet(https, host, port, shared.resolver.as_ref())
        .await?;
    let mut last = NetError::Connect(format!("{host}: no address to dial"));
    for ip in addrs {
        let addr = SocketAddr::new(ip, port);
        tracing::debug!(host, %addr, "dialing a vetted address");
        match tokio::time::timeout(shared.connect_timeout, shared.dialer.dial(addr)).await {
            Ok(Ok(stream)) => return Ok(stream),
            Ok(Err(err)) => last = NetError::Connect(format!("{addr}: {err}")),
            Err(_) => last = NetError::Connect(format!("{addr}: connect timeout")),
        }
    }
    Err(last)
}
