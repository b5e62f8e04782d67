//! Trace ids: one per proposal, taken from a W3C `traceparent` header when the caller sends a
//! valid one, otherwise fresh.

use std::sync::{Arc, LazyLock, PoisonError, RwLock};
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::middleware::Next;
use axum::response::Response;
use metrics::{Counter, Histogram};
use tokio::sync::Semaphore;
use tracing::Instrument;

/// The trace id of the request being served (set by [`observe`]).
#[derive(Debug, Clone)]
pub struct TraceId(pub String);

/// The in-flight limit every route but the health probes shares: one semaphore, whose permit
/// a request holds while its handler runs.
#[derive(Debug, Clone)]
pub struct Slots(Arc<Semaphore>);

impl Slots {
    /// At most `concurrency` requests in flight (at least one).
    pub fn new(concurrency: usize) -> Self {
        Self(Arc::new(Semaphore::new(concurrency.max(1))))
    }
}

/// Per request on a matched route: one trace id (from `traceparent` or fresh) in the request's
/// extensions and on its tracing span; the in-flight limit (a request that finds no permit is
/// answered 503 `OVERLOADED` with `Retry-After` at once: it never queues), except for the
/// health probes (`routes::health::PROBE_PATHS`), so an orchestrator still gets an answer
/// from a busy gateway; and the request counter and latency histogram by route. One route
/// layer for the three: each layer of its own wrapped every request in another future.
pub async fn observe(State(slots): State<Slots>, mut request: Request, next: Next) -> Response {
    let route = request.extensions().get::<MatchedPath>().cloned();
    let route = route.as_ref().map_or("unmatched", MatchedPath::as_str);
    let method = request.method().clone();
    let trace = trace_id(request.headers());
    request.extensions_mut().insert(TraceId(trace.clone()));
    let start = Instant::now();
    let permit = if crate::routes::health::PROBE_PATHS.contains(&route) {
        None
    } else {
        match slots.0.try_acquire() {
            Ok(permit) => Some(permit),
            Err(_) => {
                let response = crate::overloaded("too many requests in flight");
                record(route, &method, response.status(), start.elapsed().as_secs_f64());
                return response;
            }
        }
    };
    // Displayed, not debug-formatted: the formatter writes a span's fields when it opens,
    // and a `Debug` string is quoted and escaped character by character on every request.
    let span = tracing::info_span!(
        "request",
        method = %method.as_str(),
        route = %route,
        trace_id = %trace
    );
    let response = next.run(request).instrument(span).await;
    drop(permit);
    record(route, &method, response.status(), start.elapsed().as_secs_f64());
    response
}

/// The request metrics of one route and method.
struct ByMethod {
    method: Method,
    duration: Histogram,
    requests: Vec<(StatusCode, Counter)>,
}

/// The request metrics' handles by route, method and status, resolved once each. `counter!`
/// with owned labels allocates every label and hashes the whole key into the registry on each
/// call; these are two of them per request. The keys are bounded: this layer runs on matched
/// routes only (`route_layer`), with the methods they accept.
static REQUEST_METRICS: LazyLock<RwLock<foldhash::HashMap<Box<str>, Vec<ByMethod>>>> =
    LazyLock::new(RwLock::default);

/// Counts one request and records its duration.
fn record(route: &str, method: &Method, status: StatusCode, seconds: f64) {
    {
        let known = REQUEST_METRICS.read().unwrap_or_else(PoisonError::into_inner);
        let handles = known
            .get(route)
            .and_then(|methods| methods.iter().find(|m| m.method == *method))
            .and_then(|m| Some((&m.duration, &m.requests.iter().find(|(s, _)| *s == status)?.1)));
        if let Some((duration, requests)) = handles {
            duration.record(seconds);
            requests.increment(1);
            return;
        }
    }
    let mut known = REQUEST_METRICS.write().unwrap_or_else(PoisonError::into_inner);
    let methods = known.entry(route.into()).or_default();
    let by_method = match methods.iter().position(|m| m.method == *method) {
        Some(at) => methods.get_mut(at),
        None => {
            methods.push(ByMethod {
                method: method.clone(),
                duration: metrics::histogram!(
                    "warrant_http_request_duration_seconds",
                    "route" => route.to_owned(),
                    "method" => method.as_str().to_owned()
                ),
                requests: Vec::new(),
            });
            methods.last_mut()
        }
    };
    let Some(by_method) = by_method else {
        return;
    };
    by_method.duration.record(seconds);
    if let Some((_, requests)) = by_method.requests.iter().find(|(s, _)| *s == status) {
        requests.increment(1);
    } else {
        let requests = metrics::counter!(
            "warrant_http_requests_total",
            "route" => route.to_owned(),
            "method" => method.as_str().to_owned(),
            "status" => status.as_u16().to_string()
        );
        requests.increment(1);
        by_method.requests.push((status, requests));
    }
}

/// The W3C `traceparent` header (named once, not parsed again on every request).
const TRACEPARENT: axum::http::HeaderName = axum::http::HeaderName::from_static("traceparent");

/// The trace id of a request: the `trace-id` field of a valid `traceparent`
/// (`00-<32 hex>-<16 hex>-<2 hex>`, not all zeros), or 32 fresh random hex digits.
pub fn trace_id(headers: &HeaderMap) -> String {
    headers
        .get(&TRACEPARENT)
        .and_then(|v| v.to_str().ok())
        .and_then(parse_traceparent)
        .unwrap_or_else(|| warrant_core::canon::hex_lower(&rand::random::<[u8; 16]>()))
}

/// The trace id of a valid W3C `traceparent` value.
pub fn parse_traceparent(text: &str) -> Option<String> {
    let mut parts = text.trim().split('-');
    let (version, trace, parent, flags) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    let ok = hex(version, 2)
        && version != "ff"
        && hex(trace, 32)
        && trace.bytes().any(|b| b != b'0')
        && hex(parent, 16)
        && parent.bytes().any(|b| b != b'0')
        && hex(flags, 2)
        && (version != "00" || parts.next().is_none());
    ok.then(|| trace.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparent() {
        let t = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert_eq!(
            parse_traceparent(t).as_deref(),
            Some("4bf92f3577b34da6a3ce929d0e0e4736")
        );
        for bad in [
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "garbage",
        ] {
            assert_eq!(parse_traceparent(bad), None, "{bad}");
        }
    }
}
