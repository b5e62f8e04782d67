//! Console sign-in: an API key exchanged for a server-side session, or a one-time sign-in link
//! (`warrant console link`) exchanged once; sign-out; the anti-forgery token of every form.
//!
//! The session cookie is `HttpOnly`, `SameSite=Strict`, scoped to `/console`, and `Secure` when
//! the public URL is https. The store keeps only the SHA-256 of a session or link token, and the
//! hash of the API key it was made with: every request reads the key again (through the key
//! cache), so revoking the key ends its sessions. A form carries the session's CSRF token, checked
//! in constant time; the sign-in form, served before any session exists, carries a token that
//! must equal a short-lived cookie set with it (double submit).

use std::sync::Arc;

use axum::extract::{FromRequestParts, Path, State};
use axum::http::header::{COOKIE, LOCATION, SET_COOKIE};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use maud::{Markup, html};
use serde::Deserialize;
use serde_json::json;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use time::Duration;
use warrant_core::records::{ConsoleSession, ConsoleSessionKind};
use warrant_store::keys::hash_presented;

use super::{Page, page, problem};
use crate::auth::{AuthRefusal, Caller};
use crate::error::ApiError;
use crate::state::AppState;

/// How long a console session lasts (server-side), from sign-in.
pub const SESSION_TTL: Duration = Duration::hours(8);
/// How long a sign-in link made by `warrant console link` can be used (once).
pub const LINK_TTL: Duration = Duration::minutes(15);
/// How long the sign-in form's anti-forgery cookie lives.
const SIGNIN_TTL: Duration = Duration::minutes(30);

const SESSION_COOKIE: &str = "warrant_session";
const SIGNIN_COOKIE: &str = "warrant_signin";

/// A fresh random token (256 bits, hex).
fn token() -> String {
    hex::encode(rand::random::<[u8; 32]>())
}

/// What the store keeps of a token.
fn hash(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// Whether two tokens are equal, in time independent of where they differ.
pub(crate) fn same_token(a: &str, b: &str) -> bool {
    a.len() == b.len() && bool::from(a.as_bytes().ct_eq(b.as_bytes()))
}

/// The value of cookie `name` in the request's `Cookie` headers.
fn cookie<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.trim())
}

/// A `Set-Cookie` value for the console's path.
fn set_cookie(state: &AppState, name: &str, value: &str, max_age: Duration) -> HeaderValue {
    let secure = if state.public_url.starts_with("https://") {
        "; Secure"
    } else {
        ""
    };
    let text = format!(
        "{name}={value}; Path=/console; HttpOnly; SameSite=Strict; Max-Age={}{secure}",
        max_age.whole_seconds().max(0)
    );
    HeaderValue::from_str(&text).unwrap_or_else(|_| HeaderValue::from_static("warrant_session=; Max-Age=0"))
}

/// A `303 See Other` to `to` (a console path).
pub(crate) fn see_other(to: &str) -> Response {
    let mut response = StatusCode::SEE_OTHER.into_response();
    if let Ok(value) = HeaderValue::from_str(to) {
        response.headers_mut().insert(LOCATION, value);
    }
    response
}

/// A path to return to after sign-in: a console path only (never another origin).
fn safe_next(next: Option<&str>) -> &str {
    match next {
        Some(n)
            if n.starts_with("/console")
                && !n.starts_with("//")
                && !n.contains("\\")
                && n.bytes().all(|b| b.is_ascii_graphic()) =>
        {
            n
        }
        _ => "/console/approvals",
    }
}

/// A signed-in reviewer: the principal of the session's key (read again on every request),
/// and the session.
#[derive(Debug, Clone)]
pub struct Reviewer {
    /// Who.
    pub caller: Caller,
    /// The session (its CSRF token goes in every form).
    pub session: ConsoleSession,
}

impl Reviewer {
    /// The `403` page refusing a form whose anti-forgery token is not this session's, or
    /// `None` when it is.
    pub fn csrf_refusal(&self, presented: &str) -> Option<Response> {
        if same_token(presented, &self.session.csrf) {
            None
        } else {
            metrics::counter!("warrant_console_csrf_refused_total").increment(1);
            Some(problem(
                StatusCode::FORBIDDEN,
                "Form refused",
                "The form's anti-forgery token is missing or not this session's. Reload the page and try again.",
            ))
        }
    }
}

/// Why a request has no reviewer: sent to the sign-in page (with the way back).
#[derive(Debug)]
pub enum NotSignedIn {
    /// No valid session.
    SignIn(String),
    /// The store failed.
    Store(ApiError),
}

impl IntoResponse for NotSignedIn {
    fn into_response(self) -> Response {
        match self {
            NotSignedIn::SignIn(next) => {
                let to = format!("/console/signin?next={}", urlencode(&next));
                see_other(&to)
            }
            NotSignedIn::Store(e) => e.into_response(),
        }
    }
}

/// Percent-encodes everything but unreserved characters and `/`.
pub(crate) fn urlencode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' => {
                out.push(char::from(b))
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

impl FromRequestParts<Arc<AppState>> for Reviewer {
    type Rejection = NotSignedIn;

    async fn from_request_parts(parts: &mut Parts, state: &Arc<AppState>) -> Result<Self, Self::Rejection> {
        let back = || {
            let path = parts.uri.path_and_query().map_or("/console", |p| p.as_str());
            NotSignedIn::SignIn(safe_next(Some(path)).to_owned())
        };
        let Some(token) = cookie(&parts.headers, SESSION_COOKIE) else {
            return Err(back());
        };
        let now = state.env.now();
        let session = state
            .store
            .get_console_session(&hash(token), now)
            .await
            .map_err(|e| NotSignedIn::Store(e.into()))?;
        let Some(session) = session else {
            return Err(back());
        };
        match crate::auth::caller_by_hash(state, &session.key_hash).await {
            Ok(Some(caller)) => Ok(Reviewer { caller, session }),
            Ok(None) => Err(back()),
            Err(e) => Err(NotSignedIn::Store(e)),
        }
    }
}

#[derive(Debug, Deserialize)]
pub(crate) struct NextQuery {
    next: Option<String>,
}

/// The sign-in page: an API key field, with a fresh anti-forgery token (cookie and field).
pub(crate) async fn signin_form(
    State(state): State<Arc<AppState>>,
    axum::extract::Query(q): axum::extract::Query<NextQuery>,
) -> Response {
    signin_page(&state, safe_next(q.next.as_deref()), None, StatusCode::OK)
}

fn signin_page(state: &AppState, next: &str, error: Option<&str>, status: StatusCode) -> Response {
    let csrf = token();
    let body = html! {
        h1 { "Sign in" }
        p { "Sign in with your Warrant API key. Your key is exchanged for a session and is not kept in the browser." }
        @if let Some(error) = error {
            p.error role="alert" { (error) }
        }
        form method="post" action="/console/signin" {
            input type="hidden" name="csrf" value=(csrf);
            input type="hidden" name="next" value=(next);
            label for="key" { "API key" }
            input #key type="password" name="key" autocomplete="current-password" required placeholder="wrn_…";
            button type="submit" { "Sign in" }
        }
        p.hint { "An operator or admin can also make you a one-time sign-in link: " code { "warrant console link" } "." }
    };
    let mut response = (status, page(&Page::anonymous("Sign in"), body)).into_response();
    response
        .headers_mut()
        .append(SET_COOKIE, set_cookie(state, SIGNIN_COOKIE, &csrf, SIGNIN_TTL));
    response
}

#[derive(Debug, Deserialize)]
pub(crate) struct SigninForm {
    /// Missing reads as empty, which no token equals (a `403`, not a parse error).
    #[serde(default)]
    csrf: String,
    key: String,
    next: Option<String>,
}

/// Exchanges an API key for a session.
pub(crate) async fn signin(
    State(state): State<Arc<AppState>>,
    parts: Parts,
    axum::Form(form): axum::Form<SigninForm>,
) -> Response {
    let next = safe_next(form.next.as_deref()).to_owned();
    let expected = cookie(&parts.headers, SIGNIN_COOKIE).unwrap_or_default();
    if expected.is_empty() || !same_token(&form.csrf, expected) {
        metrics::counter!("warrant_console_csrf_refused_total").increment(1);
        return signin_page(
            &state,
            &next,
            Some("The sign-in form expired or was not this browser's. Try again."),
            StatusCode::FORBIDDEN,
        );
    }
    let caller = match crate::auth::authenticate_presented(&state, &parts, form.key.trim()).await {
        Ok(caller) => caller,
        Err(AuthRefusal::Limited(_)) => {
            return signin_page(
                &state,
                &next,
                Some("Too many failed sign-ins from this address. Wait a minute and try again."),
                StatusCode::TOO_MANY_REQUESTS,
            );
        }
        Err(AuthRefusal::Store(e)) => return e.into_response(),
        Err(_) => {
            return signin_page(
                &state,
                &next,
                Some("That key is unknown, revoked or malformed."),
                StatusCode::UNAUTHORIZED,
            );
        }
    };
    let Some(key_hash) = hash_presented(form.key.trim()) else {
        return signin_page(
            &state,
            &next,
            Some("That key is malformed."),
            StatusCode::UNAUTHORIZED,
        );
    };
    start_session(&state, &caller, key_hash, &next).await
}

/// Creates a session for `caller` and sends the browser on to `next` with its cookie.
async fn start_session(state: &AppState, caller: &Caller, key_hash: String, next: &str) -> Response {
    let session_token = token();
    let now = state.env.now();
    let session = ConsoleSession {
        token_hash: hash(&session_token),
        kind: ConsoleSessionKind::Session,
        key_hash,
        csrf: token(),
        created_at: now,
        expires_at: now + SESSION_TTL,
    };
    if let Err(e) = state.store.create_console_session(&session).await {
        return ApiError::from(e).into_response();
    }
    tracing::info!(
        principal = caller.principal.id(),
        tenant = caller.principal.tenant(),
        "console sign-in"
    );
    metrics::counter!("warrant_console_signins_total").increment(1);
    let mut response = see_other(next);
    let headers = response.headers_mut();
    headers.append(
        SET_COOKIE,
        set_cookie(state, SESSION_COOKIE, &session_token, SESSION_TTL),
    );
    headers.append(SET_COOKIE, set_cookie(state, SIGNIN_COOKIE, "", Duration::ZERO));
    response
}

#[derive(Debug, Deserialize)]
pub(crate) struct CsrfForm {
    /// Missing reads as empty, which no token equals (a `403`, not a parse error).
    #[serde(default)]
    csrf: String,
}

/// Ends the session.
pub(crate) async fn signout(
    State(state): State<Arc<AppState>>,
    reviewer: Reviewer,
    axum::Form(form): axum::Form<CsrfForm>,
) -> Response {
    if let Some(refused) = reviewer.csrf_refusal(&form.csrf) {
        return refused;
    }
    if let Err(e) = state
        .store
        .delete_console_session(&reviewer.session.token_hash)
        .await
    {
        return ApiError::from(e).into_response();
    }
    let mut response = see_other("/console/signin");
    response
        .headers_mut()
        .append(SET_COOKIE, set_cookie(&state, SESSION_COOKIE, "", Duration::ZERO));
    response
}

/// A one-time sign-in link's page: a button that signs in (a `GET` never does, so a link
/// preview cannot use the link up). The token is in the path, which the request log records
/// only as the route's template.
pub(crate) async fn link_form(State(state): State<Arc<AppState>>, Path(link): Path<String>) -> Response {
    let csrf = token();
    let body = html! {
        h1 { "Sign in with a link" }
        p { "This one-time link signs you in to the Warrant console. It works once." }
        form method="post" action="/console/link" {
            input type="hidden" name="csrf" value=(csrf);
            input type="hidden" name="link" value=(link);
            button type="submit" { "Sign in" }
        }
    };
    let mut response = page(&Page::anonymous("Sign in"), body).into_response();
    response
        .headers_mut()
        .append(SET_COOKIE, set_cookie(&state, SIGNIN_COOKIE, &csrf, SIGNIN_TTL));
    response
}

#[derive(Debug, Deserialize)]
pub(crate) struct LinkForm {
    /// Missing reads as empty, which no token equals (a `403`, not a parse error).
    #[serde(default)]
    csrf: String,
    link: String,
}

/// Exchanges a one-time link for a session.
pub(crate) async fn link_signin(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    axum::Form(form): axum::Form<LinkForm>,
) -> Response {
    let expected = cookie(&headers, SIGNIN_COOKIE).unwrap_or_default();
    if expected.is_empty() || !same_token(&form.csrf, expected) {
        metrics::counter!("warrant_console_csrf_refused_total").increment(1);
        return problem(
            StatusCode::FORBIDDEN,
            "Form refused",
            "The sign-in form expired or was not this browser's. Open the link again.",
        );
    }
    let link = match state
        .store
        .take_console_link(&hash(form.link.trim()), state.env.now())
        .await
    {
        Ok(Some(link)) => link,
        Ok(None) => {
            return problem(
                StatusCode::UNAUTHORIZED,
                "Link not valid",
                "This sign-in link was used already, has expired, or never existed. Ask for a new one.",
            );
        }
        Err(e) => return ApiError::from(e).into_response(),
    };
    match crate::auth::caller_by_hash(&state, &link.key_hash).await {
        Ok(Some(caller)) => start_session(&state, &caller, link.key_hash, "/console/approvals").await,
        Ok(None) => problem(
            StatusCode::UNAUTHORIZED,
            "Link not valid",
            "The key this link was made for has been revoked.",
        ),
        Err(e) => e.into_response(),
    }
}

/// `POST /v1/console/links`: a one-time sign-in link for the caller's own key (what
/// `warrant console link` prints). Whoever opens it signs in as the caller, once, within
/// [`LINK_TTL`].
#[utoipa::path(post, path = "/v1/console/links", tag = "console",
    responses((status = 201, description = "the link (shown once)", body = crate::openapi::ConsoleLink),
        (status = 401, description = "no valid key", body = crate::openapi::ErrorBody)))]
pub(crate) async fn create_link(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    parts: Parts,
) -> Result<Response, ApiError> {
    let key_hash = crate::auth::bearer(&parts)
        .and_then(hash_presented)
        .ok_or_else(|| ApiError::unauthorized("missing bearer key"))?;
    let link = token();
    let now = state.env.now();
    let record = ConsoleSession {
        token_hash: hash(&link),
        kind: ConsoleSessionKind::Link,
        key_hash,
        csrf: token(),
        created_at: now,
        expires_at: now + LINK_TTL,
    };
    state.store.create_console_session(&record).await?;
    tracing::info!(principal = caller.principal.id(), "console sign-in link made");
    let body = json!({
        "url": format!("{}/console/link/{link}", state.public_url),
        "expires_at": crate::routes::rfc3339(record.expires_at),
        "principal": caller.principal.id(),
        "tenant": caller.principal.tenant(),
    });
    Ok((StatusCode::CREATED, axum::Json(body)).into_response())
}

/// The sign-out button (in every signed-in page's header).
pub(crate) fn signout_button(csrf: &str) -> Markup {
    html! {
        form.inline method="post" action="/console/signout" {
            input type="hidden" name="csrf" value=(csrf);
            button.link type="submit" { "Sign out" }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_console_paths_are_returned_to() {
        assert_eq!(
            safe_next(Some("/console/approvals/apr_1")),
            "/console/approvals/apr_1"
        );
        for hostile in [
            "https://evil.example/",
            "//evil.example/console",
            "/console\\@evil",
            "/v1/keys",
            "/console/a b",
        ] {
            assert_eq!(safe_next(Some(hostile)), "/console/approvals", "{hostile}");
        }
        assert_eq!(safe_next(None), "/console/approvals");
    }

    #[test]
    fn cookies_are_found_by_exact_name() {
        let mut headers = HeaderMap::new();
        headers.insert(
            COOKIE,
            HeaderValue::from_static("a=1; warrant_session_x=2; warrant_session=tok"),
        );
        assert_eq!(cookie(&headers, SESSION_COOKIE), Some("tok"));
        assert_eq!(cookie(&headers, "missing"), None);
    }

    #[test]
    fn tokens_compare_in_full() {
        let t = token();
        assert!(same_token(&t, &t.clone()));
        assert!(!same_token(&t, &t[..63]));
        assert!(!same_token(&t, &token()));
        assert_eq!(hash(&t).len(), 64);
    }
}
