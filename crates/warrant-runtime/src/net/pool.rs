//! Idle upstream connections, kept per origin for the next request to it.
//!
//! Written here rather than taken from `hyper_util`'s legacy client, whose pool this replaces:
//! for one call through a kept connection, that client cost about 10,000 instructions of its
//! own (docs/benchmarks.md) — its pool's key hashed with SipHash one byte at a time on checkout
//! and on return, a connect future built and raced against the checkout on every request, and
//! two dozen moves of its nested futures. The pool is a short list behind a mutex: a gateway
//! talks to few origins, so the list is scanned, not hashed. A connection is hyper's own
//! HTTP/1 connection (`hyper::client::conn::http1`), driven by a task of its own.

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::uri::Authority;
use http_body_util::Full;
use hyper::client::conn::http1::SendRequest;

/// The most idle connections kept, all origins together; one returned beyond it is closed.
const MAX_IDLE: usize = 256;

/// The sending half of one HTTP/1 connection.
pub(super) type Sender = SendRequest<Full<Bytes>>;

/// Where a connection goes: its scheme and authority, as the request's URI spells them (the
/// URL parser has lower-cased the host and dropped a default port; `Authority` compares
/// without regard to case anyway).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Origin {
    pub(super) https: bool,
    pub(super) authority: Authority,
}

/// The idle connections, newest last.
pub(super) struct Pool {
    idle: Mutex<Vec<Idle>>,
    /// How long a connection may stay idle before it is closed instead of used.
    idle_timeout: Duration,
}

struct Idle {
    origin: Origin,
    sender: Sender,
    since: Instant,
}

impl Pool {
    pub(super) fn new(idle_timeout: Duration) -> Self {
        Self {
            idle: Mutex::new(Vec::new()),
            idle_timeout,
        }
    }

    /// The newest idle connection to `origin`, if one is still open; connections found closed
    /// or idle too long, to any origin, are dropped (closed) on the way. Nothing else closes
    /// an idle connection: without checkouts, it stays open until its upstream closes it.
    pub(super) fn checkout(&self, origin: &Origin) -> Option<Sender> {
        let now = Instant::now();
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        idle.retain(|c| !c.sender.is_closed() && now.saturating_duration_since(c.since) < self.idle_timeout);
        let at = idle.iter().rposition(|c| c.origin == *origin)?;
        Some(idle.remove(at).sender)
    }

    /// Keeps a connection whose last response was read to its end, unless it is closed or the
    /// pool is full.
    pub(super) fn put(&self, origin: Origin, sender: Sender) {
        if sender.is_closed() {
            return;
        }
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        if idle.len() < MAX_IDLE {
            idle.push(Idle {
                origin,
                sender,
                since: Instant::now(),
            });
        }
    }

    /// How many connections are idle (tests).
    #[cfg(test)]
    pub(super) fn idle(&self) -> usize {
        self.idle.lock().unwrap_or_else(PoisonError::into_inner).len()
    }
}
