//! The one error shape of the HTTP API: `{"error": {"stage", "code", "message", "pointer"?}}`.
//! Internal errors are logged with an id and never echoed; clients see the id only.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use warrant_core::store::StoreError;
use warrant_core::{RejectCode, Rejection, Stage};

/// An API error: a status and the JSON body.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    body: Value,
    /// Seconds for a `Retry-After` header, when the client should come back later.
    retry_after: Option<u64>,
}

/// The `Retry-After` of a `503 STORE_OVERLOADED`, in seconds: the queue drains in well
/// under a second on a healthy disk.
pub const OVERLOADED_RETRY_AFTER: u64 = 1;

/// The counter of requests answered `503 STORE_OVERLOADED`.
pub const OVERLOADED_METRIC: &str = "warrant_http_store_overloaded_total";

impl ApiError {
    /// An error outside the decision stages (`auth`, `request`, `route`, …).
    pub fn new(status: StatusCode, stage: &str, code: &str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            body: json!({"error": {"stage": stage, "code": code, "message": message.into()}}),
            retry_after: None,
        }
    }

    /// 401: no usable credential.
    pub fn unauthorized(message: &str) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "auth", "UNAUTHENTICATED", message)
    }

    /// 403: the caller may not do this.
    pub fn forbidden(message: &str) -> Self {
        Self::new(StatusCode::FORBIDDEN, "auth", "FORBIDDEN", message)
    }

    /// 404 for a resource of the caller's tenant that does not exist (or belongs to another
    /// tenant: the two are indistinguishable on purpose).
    pub fn not_found(what: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "request",
            "NOT_FOUND",
            format!("no such {what}"),
        )
    }

    /// 413 for a request body over the limit (the edge's and the MCP lane's).
    pub fn payload_too_large() -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "request",
            "PAYLOAD_TOO_LARGE",
            "the request body is too large",
        )
    }

    /// 400 for a malformed request outside the proposal pipeline.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "request", "BAD_REQUEST", message)
    }

    /// A decision-stage refusal, with the status the idempotency draft and HTTP semantics ask
    /// for.
    pub fn rejection(rejection: &Rejection) -> Self {
        let mut error = json!({
            "stage": rejection.stage().as_str(),
            "code": rejection.code().as_str(),
            "message": rejection.detail(),
        });
        if let (Some(p), Value::Object(map)) = (rejection.pointer(), &mut error) {
            map.insert("pointer".into(), Value::String(p.to_owned()));
        }
        ApiError {
            status: rejection_status(rejection.code()),
            body: json!({ "error": error }),
            retry_after: None,
        }
    }

    /// An internal failure: logged with an incident id, answered without details.
    pub fn internal(error: &dyn std::fmt::Display) -> Self {
        let incident = hex::encode(rand_bytes());
        tracing::error!(incident, %error, "internal error");
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "INTERNAL",
            format!("internal error (incident {incident})"),
        )
    }

    /// Adds top-level fields (e.g. `ledger_id`) beside `error`.
    #[must_use]
    pub fn with(mut self, key: &str, value: Value) -> Self {
        if let Value::Object(map) = &mut self.body {
            map.insert(key.to_owned(), value);
        }
        self
    }

    /// The status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// Asks the client to come back after `seconds` (a `Retry-After` header).
    #[must_use]
    pub fn retry_after(mut self, seconds: u64) -> Self {
        self.retry_after = Some(seconds);
        self
    }
}

fn rand_bytes() -> [u8; 6] {
    rand::random()
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Unavailable(_) => {
                tracing::error!(error = %e, "store unavailable");
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "internal",
                    "STORE_UNAVAILABLE",
                    "the store is unavailable; retry later",
                )
            }
            StoreError::Overloaded(_) => {
                // Expected under overload: counted, logged below ERROR, answered at once.
                metrics::counter!(OVERLOADED_METRIC).increment(1);
                tracing::warn!(error = %e, "store overloaded");
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "internal",
                    "STORE_OVERLOADED",
                    "the store is overloaded; retry later",
                )
                .retry_after(OVERLOADED_RETRY_AFTER)
            }
            other => ApiError::internal(&other),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(self.body)).into_response();
        if let Some(seconds) = self.retry_after {
            response.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from(seconds),
            );
        }
        response
    }
}

/// The HTTP status of a refusal.
pub fn rejection_status(code: RejectCode) -> StatusCode {
    match code {
        RejectCode::IdempotencyKeyReused => StatusCode::UNPROCESSABLE_ENTITY,
        RejectCode::IdempotencyInFlight => StatusCode::CONFLICT,
        code => match code.stage() {
            Stage::Parse | Stage::Identity | Stage::Idempotency => StatusCode::BAD_REQUEST,
            Stage::Contract => StatusCode::NOT_FOUND,
            Stage::Schema => StatusCode::UNPROCESSABLE_ENTITY,
            Stage::Policy | Stage::Scope | Stage::Guard | Stage::Approval => StatusCode::FORBIDDEN,
            Stage::Budget => StatusCode::TOO_MANY_REQUESTS,
        },
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]

    use super::*;

    #[test]
    fn an_overloaded_store_answers_503_with_retry_after_and_a_stable_code() {
        let response =
            ApiError::from(StoreError::Overloaded("the SQLite write queue is full".into())).into_response();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            response.headers().get(axum::http::header::RETRY_AFTER).unwrap(),
            "1"
        );
        let unavailable = ApiError::from(StoreError::Unavailable("down".into()));
        assert_eq!(unavailable.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            ApiError::from(StoreError::Overloaded("full".into())).body["error"]["code"],
            "STORE_OVERLOADED"
        );
    }
}
