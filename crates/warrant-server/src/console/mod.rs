//! The reviewer console (`/console`): server-rendered HTML (maud, escaped by construction),
//! plain forms that work without JavaScript, one small script and one stylesheet served from
//! the binary. Every page calls the same code as the API: the inbox and the approval page read
//! what `/v1/approvals` reads and decide through `Authority::review`; the ledger, runs and
//! contracts pages read the tenant's own records only.
//!
//! Every console response carries `Content-Security-Policy: default-src 'self';
//! frame-ancestors 'none'` (no inline script or style anywhere), `no-store` caching and no
//! referrer; sign-in and forms are in [`session`].

pub mod pages;
pub mod session;

use std::sync::Arc;

use axum::Router;
use axum::extract::Request;
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::http::{HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use maud::{DOCTYPE, Markup, html};

use crate::state::AppState;

pub use session::Reviewer;

/// The console's routes (and the API route that makes sign-in links).
pub fn router() -> Router<Arc<AppState>> {
    let pages = Router::new()
        .route("/console", get(pages::home))
        .route("/console/", get(pages::home))
        .route("/console/signin", get(session::signin_form).post(session::signin))
        .route("/console/signout", post(session::signout))
        .route("/console/link/{link}", get(session::link_form))
        .route("/console/link", post(session::link_signin))
        .route("/console/approvals", get(pages::inbox))
        .route("/console/approvals/count", get(pages::pending_count))
        .route("/console/approvals/{id}", get(pages::approval))
        .route("/console/approvals/{id}/approve", post(pages::approve))
        .route("/console/approvals/{id}/reject", post(pages::reject))
        .route("/console/approvals/{id}/edit", post(pages::edit))
        .route("/console/ledger", get(pages::ledger))
        .route("/console/ledger/{id}", get(pages::ledger_row))
        .route("/console/runs", get(pages::runs))
        .route("/console/runs/{id}", get(pages::run))
        .route("/console/contracts", get(pages::contracts))
        .route("/console/contracts/diff", get(pages::contract_diff))
        .route("/console/static/console.css", get(stylesheet))
        .route("/console/static/console.js", get(script))
        .fallback(|| async { problem(StatusCode::NOT_FOUND, "Not found", "There is no such page.") })
        .layer(axum::middleware::from_fn(headers));
    Router::new()
        .merge(pages)
        .route("/v1/console/links", post(session::create_link))
}

/// The console's security headers, on every console response.
async fn headers(request: Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    let h = response.headers_mut();
    h.insert(
        "content-security-policy",
        HeaderValue::from_static(
            "default-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'; object-src 'none'",
        ),
    );
    h.insert("x-frame-options", HeaderValue::from_static("DENY"));
    h.insert("x-content-type-options", HeaderValue::from_static("nosniff"));
    h.insert("referrer-policy", HeaderValue::from_static("no-referrer"));
    if !h.contains_key(CACHE_CONTROL) {
        h.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    response
}

const STYLESHEET: &str = include_str!("console.css");
const SCRIPT: &str = include_str!("console.js");

async fn stylesheet() -> Response {
    asset(STYLESHEET, "text/css; charset=utf-8")
}

async fn script() -> Response {
    asset(SCRIPT, "text/javascript; charset=utf-8")
}

fn asset(body: &'static str, content_type: &'static str) -> Response {
    let mut response = body.into_response();
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
        .headers_mut()
        .insert(CACHE_CONTROL, HeaderValue::from_static("public, max-age=300"));
    response
}

/// What the layout needs to know about the page and who is looking.
#[derive(Debug)]
pub struct Page<'a> {
    /// The page's title (before " · Warrant").
    pub title: String,
    /// The signed-in reviewer, if any (the header's name, tenant and sign-out).
    pub reviewer: Option<&'a Reviewer>,
    /// The navigation entry to mark.
    pub section: &'static str,
}

impl Page<'_> {
    /// A page for someone not signed in.
    pub fn anonymous(title: &str) -> Page<'static> {
        Page {
            title: title.to_owned(),
            reviewer: None,
            section: "",
        }
    }
}

/// The layout around a page's body.
pub fn page(p: &Page<'_>, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (p.title) " · Warrant" }
                link rel="stylesheet" href="/console/static/console.css";
                script src="/console/static/console.js" defer {}
            }
            body {
                header {
                    a.brand href="/console/approvals" { "Warrant" }
                    @if let Some(r) = p.reviewer {
                        nav {
                            @for (section, href, label) in [
                                ("approvals", "/console/approvals", "Approvals"),
                                ("ledger", "/console/ledger", "Ledger"),
                                ("runs", "/console/runs", "Runs"),
                                ("contracts", "/console/contracts", "Contracts"),
                            ] {
                                @if section == p.section {
                                    a.current href=(href) aria-current="page" { (label) }
                                } @else {
                                    a href=(href) { (label) }
                                }
                            }
                        }
                        span.who { (r.caller.principal.id()) " · " (r.caller.principal.tenant()) }
                        (session::signout_button(&r.session.csrf))
                    }
                }
                main { (body) }
            }
        }
    }
}

/// An error page with `status`.
pub fn problem(status: StatusCode, title: &str, detail: &str) -> Response {
    let body = html! {
        h1 { (title) }
        p { (detail) }
        p { a href="/console/approvals" { "Back to the approvals" } }
    };
    (status, page(&Page::anonymous(title), body)).into_response()
}
