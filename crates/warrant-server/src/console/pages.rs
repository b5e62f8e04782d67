//! The console's pages: the approvals inbox and an approval's page (with the decision forms),
//! the ledger, runs and contracts. Each reads only the signed-in reviewer's tenant; an
//! approval is shown to the principals policy lets review it and to its proposer (who sees no
//! decision form, and whom `Authority::review` refuses anyway); anyone else gets a 404.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use maud::{Markup, html};
use serde::Deserialize;
use serde_json::{Value, json};
use time::OffsetDateTime;
use warrant_core::pipeline::ReviewRefusal;
use warrant_core::records::{
    ApprovalFilter, ApprovalRequest, ApprovalStatus, LedgerEntry, LedgerFilter, Outcome, Verdict,
};

use super::session::{Reviewer, see_other, urlencode};
use super::{Page, page, problem};
use crate::error::ApiError;
use crate::routes::rfc3339;
use crate::state::AppState;

/// The inbox counts pending requests up to this many (and says "1000+" past it): the count's
/// cost stays bounded whatever the backlog.
pub const COUNT_AT_MOST: u32 = 1000;

/// The pending count as the inbox shows it.
fn shown_count(n: u64) -> String {
    if n >= u64::from(COUNT_AT_MOST) {
        format!("{COUNT_AT_MOST}+")
    } else {
        n.to_string()
    }
}

/// Approvals per inbox page.
const INBOX_PAGE: usize = 50;
/// Store pages of pending requests an inbox page reads at most to find [`INBOX_PAGE`] that
/// policy lets this reviewer review.
const INBOX_SCAN_PAGES: usize = 20;

/// `/console`: the inbox.
pub(crate) async fn home(_reviewer: Reviewer) -> Response {
    see_other("/console/approvals")
}

fn status_badge(status: &str) -> Markup {
    html! { span class={ "status " (status) } { (status) } }
}

fn when(t: OffsetDateTime) -> Markup {
    let text = rfc3339(t);
    html! { time datetime=(text) { (text.replace('T', " ").trim_end_matches('Z')) " UTC" } }
}

fn pretty(value: &Value) -> String {
    serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string())
}

/// A query value: `None` when absent or blank.
fn given(value: Option<&String>) -> Option<String> {
    value.map(|v| v.trim().to_owned()).filter(|v| !v.is_empty())
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct InboxQuery {
    tool: Option<String>,
    proposer: Option<String>,
    cursor: Option<String>,
}

/// The pending approvals this reviewer may decide, newest first.
pub(crate) async fn inbox(
    State(state): State<Arc<AppState>>,
    reviewer: Reviewer,
    Query(q): Query<InboxQuery>,
) -> Result<Response, ApiError> {
    let tenant = reviewer.caller.principal.tenant();
    let now = state.env.now();
    let mut filter = ApprovalFilter {
        status: Some(ApprovalStatus::Pending),
        tool: given(q.tool.as_ref()),
        proposer: given(q.proposer.as_ref()),
        cursor: given(q.cursor.as_ref()),
        limit: u32::try_from(INBOX_PAGE).unwrap_or(50),
    };
    let mut shown: Vec<ApprovalRequest> = Vec::new();
    let mut next_cursor = None;
    for _ in 0..INBOX_SCAN_PAGES {
        let page = state.store.page_approvals(tenant, &filter, now).await?;
        let reviewable = state
            .authority
            .reviewable(&reviewer.caller.principal, page.approvals)
            .await?;
        shown.extend(reviewable);
        next_cursor = page.next_cursor;
        if shown.len() >= INBOX_PAGE || next_cursor.is_none() {
            break;
        }
        filter.cursor.clone_from(&next_cursor);
    }
    if shown.len() > INBOX_PAGE {
        // Continue after the last one shown.
        shown.truncate(INBOX_PAGE);
        next_cursor = shown.last().map(warrant_core::store::approval_cursor);
    }
    let pending = state
        .store
        .count_approvals(tenant, ApprovalStatus::Pending, now, COUNT_AT_MOST)
        .await?;
    let pending = shown_count(pending);
    let title = format!("Approvals ({pending} pending)");
    let more = next_cursor.map(|c| {
        let mut href = format!("/console/approvals?cursor={}", urlencode(&c));
        if let Some(t) = &filter.tool {
            href.push_str(&format!("&tool={}", urlencode(t)));
        }
        if let Some(p) = &filter.proposer {
            href.push_str(&format!("&proposer={}", urlencode(p)));
        }
        href
    });
    let body = html! {
        div data-pending-count=(pending) {
            h1 { "Approvals " span.muted { "(" (pending) " pending in " (tenant) ")" } }
            p.notice.fresh { "New approval requests have arrived. " a href="/console/approvals" { "Reload" } }
            form.filters method="get" action="/console/approvals" {
                label { "Tool" input type="text" name="tool" value=[filter.tool.as_deref()]; }
                label { "Proposer" input type="text" name="proposer" value=[filter.proposer.as_deref()]; }
                button type="submit" { "Filter" }
                @if filter.tool.is_some() || filter.proposer.is_some() {
                    a href="/console/approvals" { "Clear" }
                }
            }
            @if shown.is_empty() {
                p.muted { "Nothing waits for your review." }
            } @else {
                table #inbox {
                    thead { tr { th { "Tool" } th { "Proposer" } th { "Requested" } th { "Expires" } th { "Payload digest" } } }
                    tbody {
                        @for a in &shown {
                            tr {
                                td { a href={ "/console/approvals/" (a.request.id) } { (a.request.tool) } }
                                td { (a.request.proposer) }
                                td { (when(a.request.created_at)) }
                                td { time data-expires=(rfc3339(a.request.expires_at)) { (rfc3339(a.request.expires_at)) } }
                                td.mono { (short(&a.request.payload_digest)) }
                            }
                        }
                    }
                }
            }
            @if let Some(href) = more {
                p.pager { a href=(href) { "Older requests →" } }
            }
        }
    };
    let p = Page {
        title,
        reviewer: Some(&reviewer),
        section: "approvals",
    };
    Ok(page(&p, body).into_response())
}

fn short(digest: &str) -> String {
    let hex = digest.strip_prefix("sha256:").unwrap_or(digest);
    format!("sha256:{}…", &hex[..hex.len().min(12)])
}

/// `{"pending": n}`: the inbox polls this to refresh itself.
pub(crate) async fn pending_count(
    State(state): State<Arc<AppState>>,
    reviewer: Reviewer,
) -> Result<Json<Value>, ApiError> {
    let n = state
        .store
        .count_approvals(
            reviewer.caller.principal.tenant(),
            ApprovalStatus::Pending,
            state.env.now(),
            COUNT_AT_MOST,
        )
        .await?;
    Ok(Json(json!({ "pending": shown_count(n) })))
}

/// An approval request, for a reviewer policy allows or for its proposer.
async fn visible_approval(
    state: &AppState,
    reviewer: &Reviewer,
    id: &str,
) -> Result<Option<(ApprovalRequest, bool)>, ApiError> {
    let principal = &reviewer.caller.principal;
    let Some(found) = state
        .store
        .get_approval(principal.tenant(), id, state.env.now())
        .await?
    else {
        return Ok(None);
    };
    let may_review = state.authority.may_review(principal, &found).await?;
    let proposer = found.request.proposer == principal.id();
    Ok((may_review || proposer).then_some((found, may_review && !proposer)))
}

/// One approval request: the contract, the proposer and trace, the exact payload and its
/// digest, what policy said, the proposer's budget and recent calls, and — for a reviewer
/// who may decide it while it is pending — the approve and reject forms.
pub(crate) async fn approval(
    State(state): State<Arc<AppState>>,
    reviewer: Reviewer,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let Some((a, may_decide)) = visible_approval(&state, &reviewer, &id).await? else {
        return Ok(problem(
            StatusCode::NOT_FOUND,
            "Not found",
            "There is no such approval request.",
        ));
    };
    let tenant = reviewer.caller.principal.tenant();
    let now = state.env.now();
    let r = &a.request;
    let contract = state.registry.by_id(tenant, &r.contract_id, now).await?;
    let rows = state
        .store
        .list_ledger(
            tenant,
            &LedgerFilter {
                approval_id: Some(r.id.clone()),
                limit: 20,
                ..LedgerFilter::default()
            },
        )
        .await?
        .entries;
    let proposal = rows
        .iter()
        .filter(|e| e.decision.as_str() == "needs_approval")
        .min_by_key(|e| e.created_at);
    let recent = state
        .store
        .list_ledger(
            tenant,
            &LedgerFilter {
                principal: Some(r.proposer.clone()),
                limit: 10,
                ..LedgerFilter::default()
            },
        )
        .await?
        .entries;
    let budget = match &contract {
        Some(c) => match c.budget().calls_per_day {
            Some(limit) => {
                let key = warrant_core::budget::day_key(&r.proposer, c.name(), now.date());
                let used = state.store.budget_used(tenant, &key).await?;
                Some(format!("{used} of {limit} calls today by {}", r.proposer))
            }
            None => None,
        },
        None => None,
    };
    let proposer_here = r.proposer == reviewer.caller.principal.id();
    // Sensitive values in clear only where policy lets this viewer reveal them.
    let revealed = state
        .authority
        .revealed_arguments(&reviewer.caller.principal, &a)
        .await?;
    if revealed.is_some() {
        // Who saw which request's sensitive values, and when: the audit trail of a reveal
        // (never the values).
        metrics::counter!("warrant_console_reveals_total").increment(1);
        tracing::info!(
            approval = %r.id,
            tenant,
            viewer = reviewer.caller.principal.id(),
            "sensitive values revealed on an approval page"
        );
    }
    let masked = contract
        .as_deref()
        .is_some_and(warrant_core::Contract::has_sensitive_fields);
    let edit_fields = contract
        .as_deref()
        .filter(|_| may_decide && editable(&a))
        .and_then(editable_fields);
    let body = html! {
        p { a href="/console/approvals" { "← Approvals" } }
        h1 { (r.tool) " " (status_badge(a.status.as_str())) }
        dl.facts {
            dt { "Approval" } dd.mono { (r.id) }
            dt { "Proposer" } dd { (r.proposer) }
            @if let Some(p) = proposal {
                dt { "Trace" } dd.mono { a href={ "/console/ledger?trace=" (urlencode(&p.trace_id)) } { (p.trace_id) } }
                dt { "Policy" } dd { "needs approval" @if let Some(stage) = &p.stage { " at the " (stage) " stage" } @if let Some(d) = &p.detail { ": " (d) } }
            }
            dt { "Requested" } dd { (when(r.created_at)) }
            dt { "Expires" } dd { (when(r.expires_at)) " " @if a.status == ApprovalStatus::Pending { "(" time data-expires=(rfc3339(r.expires_at)) { "" } ")" } }
            @if let Some(key) = &r.idempotency_key { dt { "Idempotency key" } dd.mono { (key) } }
            @if let Some(rule) = &r.reviewers { dt { "Reviewers" } dd.mono { (rule.to_json()) } }
            @if let Some(b) = &budget { dt { "Budget" } dd { (b) } }
            @if let Some(who) = &a.reviewer { dt { "Decided by" } dd { (who) @if let Some(at) = a.decided_at { " at " (when(at)) } } }
            @if let Some(reason) = &a.reason { dt { "Reason" } dd { (reason) } }
            @if let Some(by) = &a.consumed_by { dt { "Executed as" } dd.mono { a href={ "/console/ledger/" (by) } { (by) } } }
        }
        h2 { "Payload" }
        @if let Some(exact) = &revealed {
            p.muted #revealed { "The exact arguments this approval is bound to, sensitive values included: policy lets you reveal them. Digest: " code { (r.payload_digest) } }
            pre #payload { (pretty(&Value::Object(exact.clone()))) }
        } @else if masked {
            p.muted #masked { "The exact arguments this approval is bound to. Sensitive values are masked (shown as their keyed hashes, as in the ledger): policy does not let you reveal them" @if a.request.sealed_arguments.is_none() { ", or they are no longer kept" } ". Digest: " code { (r.payload_digest) } }
            pre #payload { (pretty(&r.arguments)) }
        } @else {
            p.muted { "The exact arguments this approval is bound to. Digest: " code { (r.payload_digest) } }
            pre #payload { (pretty(&r.arguments)) }
        }
        @if a.status == ApprovalStatus::Pending {
            @if may_decide {
                div.decide {
                    form method="post" action={ "/console/approvals/" (r.id) "/approve" } {
                        input type="hidden" name="csrf" value=(reviewer.session.csrf);
                        label for="approve-reason" { "Reason for approving" }
                        textarea #approve-reason name="reason" required maxlength="1000" {}
                        button.approve type="submit" { "Approve" }
                    }
                    form method="post" action={ "/console/approvals/" (r.id) "/reject" } {
                        input type="hidden" name="csrf" value=(reviewer.session.csrf);
                        label for="reject-reason" { "Reason for rejecting" }
                        textarea #reject-reason name="reason" required maxlength="1000" {}
                        button.reject type="submit" { "Reject" }
                    }
                }
                @if let Some(fields) = edit_fields.as_ref() {
                    details.edit {
                        summary { "Approve with edits" }
                        p.muted { "Change the arguments, then approve: the edited call goes through the whole pipeline again (policy, guards, budget) as the proposer, is bound to its own digest, and runs at once. This request is rejected; its original payload can never run on your approval." }
                        form method="post" action={ "/console/approvals/" (r.id) "/edit" } {
                            input type="hidden" name="csrf" value=(reviewer.session.csrf);
                            @for f in fields {
                                (edit_field(f, r.arguments.get(&f.name)))
                            }
                            label for="edit-why" { "Reason for the edit" }
                            textarea #edit-why name="reason" required maxlength="900" {}
                            button.approve type="submit" { "Approve the edited call" }
                        }
                    }
                }
            } @else if proposer_here {
                p.notice { "You proposed this call: another reviewer decides it." }
            }
        }
        h2 { "Contract" }
        @match &contract {
            Some(c) => {
                dl.facts {
                    dt { "Tool" } dd { (c.qualified_name()) "@" (c.version()) }
                    dt { "Content id" } dd.mono { (c.id_str()) }
                    dt { "Effect" } dd { (c.effect().as_str()) }
                    dt { "Scopes" } dd { @for s in c.scopes() { code { (s) } " " } }
                    dt { "Approval" } dd { (c.approval().as_str()) }
                    dt { "Owner" } dd { (c.owner()) }
                    dt { "Description" } dd { (c.description()) }
                }
                details { summary { "The contract document" } pre { (pretty(c.document())) } }
            }
            None => p.muted { "The contract " code { (r.contract_id) } " is no longer registered." }
        }
        @if !rows.is_empty() {
            h2 { "Ledger rows of this approval" }
            (ledger_table(&rows))
        }
        h2 { "Recent calls by " (r.proposer) }
        (ledger_table(&recent))
    };
    let p = Page {
        title: format!("Approval of {}", r.tool),
        reviewer: Some(&reviewer),
        section: "approvals",
    };
    Ok(page(&p, body).into_response())
}

#[derive(Debug, Deserialize)]
pub(crate) struct DecisionForm {
    /// Missing reads as empty, which no token equals (a `403`, not a parse error).
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    reason: String,
}

/// Approves a request (a reviewer policy allows, not the proposer), with a reason.
pub(crate) async fn approve(
    State(state): State<Arc<AppState>>,
    reviewer: Reviewer,
    Path(id): Path<String>,
    axum::Form(form): axum::Form<DecisionForm>,
) -> Response {
    decide_owned(state, reviewer, id, Verdict::Approve, form).await
}

/// Rejects a request, with a reason.
pub(crate) async fn reject(
    State(state): State<Arc<AppState>>,
    reviewer: Reviewer,
    Path(id): Path<String>,
    axum::Form(form): axum::Form<DecisionForm>,
) -> Response {
    decide_owned(state, reviewer, id, Verdict::Reject, form).await
}

/// [`decide`], owned by the runtime with what follows the verdict (`review::owned`).
async fn decide_owned(
    state: Arc<AppState>,
    reviewer: Reviewer,
    id: String,
    verdict: Verdict,
    form: DecisionForm,
) -> Response {
    let work = {
        let state = Arc::clone(&state);
        async move { decide(&state, &reviewer, &id, verdict, &form).await }
    };
    crate::review::owned(&state, work).await.unwrap_or_else(|| {
        problem(
            StatusCode::INTERNAL_SERVER_ERROR,
            "Something went wrong",
            "The decision could not be completed; reload the page to see where it stands.",
        )
    })
}

async fn decide(
    state: &AppState,
    reviewer: &Reviewer,
    id: &str,
    verdict: Verdict,
    form: &DecisionForm,
) -> Response {
    if let Some(refused) = reviewer.csrf_refusal(&form.csrf) {
        return refused;
    }
    let reason = form.reason.trim();
    if reason.is_empty() || reason.chars().count() > 1000 {
        return problem(
            StatusCode::BAD_REQUEST,
            "A reason is required",
            "Say why, in at most 1000 characters, and submit again.",
        );
    }
    match state
        .authority
        .review(&reviewer.caller.principal, id, verdict, Some(reason))
        .await
    {
        Ok(Ok(approval)) => {
            crate::review::after_decision(state, &approval).await;
            metrics::counter!("warrant_console_decisions_total", "verdict" => approval.status.as_str())
                .increment(1);
            see_other(&format!("/console/approvals/{}", urlencode(id)))
        }
        Ok(Err(refusal)) => match refusal {
            ReviewRefusal::NotFound => problem(
                StatusCode::NOT_FOUND,
                "Not found",
                "There is no such approval request.",
            ),
            ReviewRefusal::Forbidden(_) => problem(
                StatusCode::FORBIDDEN,
                "Not yours to decide",
                "Policy does not let you review this tool.",
            ),
            ReviewRefusal::SelfReview => problem(
                StatusCode::FORBIDDEN,
                "Not yours to decide",
                "The proposer of a call cannot review it.",
            ),
            ReviewRefusal::NotPending(status) => problem(
                StatusCode::CONFLICT,
                "Already decided",
                &format!("This approval request is {status}."),
            ),
            ReviewRefusal::Expired => {
                problem(StatusCode::CONFLICT, "Expired", "This approval request expired.")
            }
        },
        Err(e) => ApiError::from(e).into_response(),
    }
}

fn ledger_table(rows: &[LedgerEntry]) -> Markup {
    html! {
        @if rows.is_empty() {
            p.muted { "No rows." }
        } @else {
            table {
                thead { tr { th { "When" } th { "Tool" } th { "Principal" } th { "Decision" } th { "Outcome" } th { "Code" } } }
                tbody {
                    @for e in rows {
                        tr {
                            td { a href={ "/console/ledger/" (e.id) } { (when(e.created_at)) } }
                            td { (e.tool) }
                            td { (e.principal) }
                            td { (status_badge(e.decision.as_str())) }
                            td { @if let Some(o) = e.outcome { (status_badge(o.as_str())) } }
                            td.mono { @if let Some(c) = &e.error_code { (c) } }
                        }
                    }
                }
            }
        }
    }
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct LedgerQuery {
    tool: Option<String>,
    outcome: Option<String>,
    principal: Option<String>,
    trace: Option<String>,
    since: Option<String>,
    until: Option<String>,
    cursor: Option<String>,
}

fn parse_time(text: Option<&String>) -> Result<Option<OffsetDateTime>, String> {
    let Some(text) = given(text) else {
        return Ok(None);
    };
    // RFC 3339, or the `datetime-local` input's `YYYY-MM-DDTHH:MM` (read as UTC).
    let full = if text.len() == 16 {
        format!("{text}:00Z")
    } else {
        text.clone()
    };
    OffsetDateTime::parse(&full, &time::format_description::well_known::Rfc3339)
        .map(Some)
        .map_err(|_| format!("`{text}` is not a time (RFC 3339, e.g. 2026-12-02T10:00:00Z)"))
}

/// The tenant's ledger, newest first, with filters.
pub(crate) async fn ledger(
    State(state): State<Arc<AppState>>,
    reviewer: Reviewer,
    Query(q): Query<LedgerQuery>,
) -> Result<Response, ApiError> {
    let outcome = match given(q.outcome.as_ref()) {
        Some(o) => {
            Some(Outcome::parse(&o).ok_or_else(|| ApiError::bad_request(format!("unknown outcome `{o}`")))?)
        }
        None => None,
    };
    let since = parse_time(q.since.as_ref()).map_err(ApiError::bad_request)?;
    let until = parse_time(q.until.as_ref()).map_err(ApiError::bad_request)?;
    let filter = LedgerFilter {
        tool: given(q.tool.as_ref()),
        outcome,
        principal: given(q.principal.as_ref()),
        since,
        until,
        trace_id: given(q.trace.as_ref()),
        approval_id: None,
        cursor: given(q.cursor.as_ref()),
        limit: 50,
    };
    let tenant = reviewer.caller.principal.tenant();
    let page_rows = state.store.list_ledger(tenant, &filter).await?;
    let next = page_rows.next_cursor.map(|c| {
        let mut pairs = vec![("cursor", c)];
        for (k, v) in [
            ("tool", &filter.tool),
            ("principal", &filter.principal),
            ("trace", &filter.trace_id),
            ("outcome", &filter.outcome.map(|o| o.as_str().to_owned())),
            ("since", &given(q.since.as_ref())),
            ("until", &given(q.until.as_ref())),
        ] {
            if let Some(v) = v {
                pairs.push((k, v.clone()));
            }
        }
        let query: Vec<String> = pairs
            .iter()
            .map(|(k, v)| format!("{k}={}", urlencode(v)))
            .collect();
        format!("/console/ledger?{}", query.join("&"))
    });
    let outcomes = [
        "attempting",
        "committed",
        "failed",
        "unknown",
        "reconciled_committed",
        "reconciled_not_committed",
        "replayed",
    ];
    let body = html! {
        h1 { "Ledger " span.muted { "(" (tenant) ")" } }
        form.filters method="get" action="/console/ledger" {
            label { "Tool" input type="text" name="tool" value=[filter.tool.as_deref()]; }
            label { "Outcome" select name="outcome" {
                option value="" { "any" }
                @for o in outcomes {
                    @if filter.outcome.map(|x| x.as_str()) == Some(o) { option value=(o) selected { (o) } } @else { option value=(o) { (o) } }
                }
            } }
            label { "Principal" input type="text" name="principal" value=[filter.principal.as_deref()]; }
            label { "Trace id" input type="text" name="trace" value=[filter.trace_id.as_deref()]; }
            label { "Since (UTC)" input type="text" name="since" placeholder="2026-12-02T00:00:00Z" value=[given(q.since.as_ref())]; }
            label { "Until (UTC)" input type="text" name="until" placeholder="2026-12-03T00:00:00Z" value=[given(q.until.as_ref())]; }
            button type="submit" { "Filter" }
            a href="/console/ledger" { "Clear" }
        }
        (ledger_table(&page_rows.entries))
        @if let Some(href) = next { p.pager { a href=(href) { "Older rows →" } } }
    };
    let p = Page {
        title: "Ledger".to_owned(),
        reviewer: Some(&reviewer),
        section: "ledger",
    };
    Ok(page(&p, body).into_response())
}

/// One ledger row, as stored (redacted values stay redacted).
pub(crate) async fn ledger_row(
    State(state): State<Arc<AppState>>,
    reviewer: Reviewer,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let Some(e) = state
        .store
        .get_ledger(reviewer.caller.principal.tenant(), &id)
        .await?
    else {
        return Ok(problem(
            StatusCode::NOT_FOUND,
            "Not found",
            "There is no such ledger row.",
        ));
    };
    let body = html! {
        p { a href="/console/ledger" { "← Ledger" } }
        h1 { (e.tool) " " (status_badge(e.decision.as_str())) @if let Some(o) = e.outcome { " " (status_badge(o.as_str())) } }
        dl.facts {
            dt { "Row" } dd.mono { (e.id) }
            dt { "Principal" } dd { (e.principal) }
            dt { "Trace" } dd.mono { a href={ "/console/ledger?trace=" (urlencode(&e.trace_id)) } { (e.trace_id) } }
            dt { "Created" } dd { (when(e.created_at)) }
            dt { "Updated" } dd { (when(e.updated_at)) }
            @if let Some(c) = &e.contract_id { dt { "Contract" } dd.mono { (c) } }
            @if let Some(d) = &e.payload_digest { dt { "Payload digest" } dd.mono { (d) } }
            @if let Some(s) = &e.stage { dt { "Stage" } dd { (s) } }
            @if let Some(c) = &e.error_code { dt { "Error class" } dd.mono { (c) } }
            @if let Some(d) = &e.detail { dt { "Detail" } dd { (d) } }
            dt { "Attempts" } dd { (e.attempts) }
            @if let Some(ms) = e.latency_ms { dt { "Latency" } dd { (ms) " ms" } }
            dt { "Cost" } dd { (e.cost) }
            @if let Some(a) = &e.approval_id { dt { "Approval" } dd.mono { a href={ "/console/approvals/" (a) } { (a) } } }
            @if let Some(k) = &e.idempotency_key { dt { "Idempotency key" } dd.mono { (k) } }
            @if let Some(r) = &e.run_id { dt { "Run" } dd.mono { a href={ "/console/runs/" (r) } { (r) } @if let Some(s) = &e.step_id { " · " (s) } } }
        }
        @if let Some(args) = &e.arguments {
            h2 { "Arguments" }
            pre { (pretty(args)) }
        }
    };
    let p = Page {
        title: format!("Ledger row {}", e.id),
        reviewer: Some(&reviewer),
        section: "ledger",
    };
    Ok(page(&p, body).into_response())
}

/// The tenant's latest runs.
pub(crate) async fn runs(
    State(state): State<Arc<AppState>>,
    reviewer: Reviewer,
) -> Result<Response, ApiError> {
    let list = state
        .store
        .list_runs(reviewer.caller.principal.tenant(), 100)
        .await?;
    let body = html! {
        h1 { "Runs" }
        @if list.is_empty() {
            p.muted { "No workflow runs yet." }
        } @else {
            table {
                thead { tr { th { "Run" } th { "Workflow" } th { "Status" } th { "Next step" } th { "Cost" } th { "Started" } } }
                tbody {
                    @for r in &list {
                        tr {
                            td.mono { a href={ "/console/runs/" (r.id) } { (r.id) } }
                            td { (r.workflow) "@" (r.version) }
                            td { (status_badge(r.status.as_str())) }
                            td { @if let Some(s) = &r.next_step { (s) } }
                            td { (r.cost) }
                            td { (when(r.created_at)) }
                        }
                    }
                }
            }
        }
    };
    let p = Page {
        title: "Runs".to_owned(),
        reviewer: Some(&reviewer),
        section: "runs",
    };
    Ok(page(&p, body).into_response())
}

/// One run: its workflow's steps (the graph, each with the state it reached), the steps it
/// executed with their ledger rows, and its cost.
pub(crate) async fn run(
    State(state): State<Arc<AppState>>,
    reviewer: Reviewer,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let tenant = reviewer.caller.principal.tenant();
    let Some(r) = state.store.get_run(tenant, &id).await? else {
        return Ok(problem(
            StatusCode::NOT_FOUND,
            "Not found",
            "There is no such run.",
        ));
    };
    let steps = state.store.run_steps(tenant, &id).await?;
    let workflow = state.store.get_workflow(tenant, &r.workflow, r.version).await?;
    let graph: Vec<(String, String, String)> = workflow
        .as_ref()
        .and_then(|w| w.document.get("steps").and_then(Value::as_array).cloned())
        .unwrap_or_default()
        .iter()
        .map(|s| {
            let id = s.get("id").and_then(Value::as_str).unwrap_or("?").to_owned();
            let kind = ["model", "tool", "review", "branch", "end"]
                .into_iter()
                .find(|k| s.get(*k).is_some())
                .unwrap_or("?")
                .to_owned();
            let mut to: Vec<String> = Vec::new();
            for key in ["next", "on_approve", "on_reject"] {
                if let Some(n) = s.get(key).and_then(Value::as_str) {
                    to.push(format!("{key} → {n}"));
                }
            }
            if let Some(cases) = s.pointer("/branch/cases").and_then(Value::as_array) {
                for c in cases {
                    if let Some(n) = c.get("next").and_then(Value::as_str) {
                        to.push(format!("case → {n}"));
                    }
                }
            }
            if let Some(n) = s.pointer("/branch/else").and_then(Value::as_str) {
                to.push(format!("else → {n}"));
            }
            (id, kind, to.join(", "))
        })
        .collect();
    let reached = |step: &str| -> String {
        let last = steps.iter().rev().find(|s| s.step_id == step);
        match (last, r.next_step.as_deref()) {
            (_, Some(next)) if next == step => r.status.as_str().to_owned(),
            (Some(s), _) => s.status.clone(),
            (None, _) => "not reached".to_owned(),
        }
    };
    let body = html! {
        p { a href="/console/runs" { "← Runs" } }
        h1 { (r.workflow) "@" (r.version) " " (status_badge(r.status.as_str())) }
        dl.facts {
            dt { "Run" } dd.mono { (r.id) }
            dt { "Definition" } dd.mono { (r.digest) }
            dt { "Started" } dd { (when(r.created_at)) }
            dt { "Updated" } dd { (when(r.updated_at)) }
            dt { "Cost" } dd { (r.cost) }
            @if let Some(e) = &r.error { dt { "Error" } dd { (e) } }
        }
        h2 { "Input" }
        pre { (pretty(&r.input)) }
        h2 { "Workflow" }
        table {
            thead { tr { th { "Step" } th { "Kind" } th { "Goes to" } th { "State" } } }
            tbody {
                @for (step, kind, to) in &graph {
                    tr { td.mono { (step) } td { (kind) } td { (to) } td { (status_badge(&reached(step))) } }
                }
            }
        }
        h2 { "Executed steps" }
        table {
            thead { tr { th { "#" } th { "Step" } th { "Kind" } th { "Status" } th { "Ledger" } th { "Cost" } th { "Finished" } th { "Detail" } } }
            tbody {
                @for s in &steps {
                    tr {
                        td { (s.seq) }
                        td.mono { (s.step_id) }
                        td { (s.kind) }
                        td { (status_badge(&s.status)) }
                        td.mono { @if let Some(l) = &s.ledger_id { a href={ "/console/ledger/" (l) } { (l) } } }
                        td { (s.cost) }
                        td { (when(s.finished_at)) }
                        td { @if let Some(d) = &s.detail { (d) } }
                    }
                }
            }
        }
    };
    let p = Page {
        title: format!("Run {}", r.id),
        reviewer: Some(&reviewer),
        section: "runs",
    };
    Ok(page(&p, body).into_response())
}

/// The contracts this tenant can call (its own and the platform's), every version.
pub(crate) async fn contracts(
    State(state): State<Arc<AppState>>,
    reviewer: Reviewer,
) -> Result<Response, ApiError> {
    let tenant = reviewer.caller.principal.tenant();
    let all = state.store.list_contracts().await?;
    let visible: Vec<_> = all.iter().filter(|c| c.namespace.visible_to(tenant)).collect();
    let now = state.env.now();
    let body = html! {
        h1 { "Contracts" }
        table {
            thead { tr { th { "Name" } th { "Version" } th { "Namespace" } th { "Effect" } th { "Content id" } th { "Registered" } th { "Retired" } th { "" } } }
            tbody {
                @for c in &visible {
                    tr {
                        td { (c.name) }
                        td { (c.version) }
                        td { @if c.namespace.as_stored().is_empty() { "platform" } @else { (c.namespace.as_stored()) } }
                        td { @if let Some(e) = c.body.get("effect").and_then(Value::as_str) { (e) } }
                        td.mono { (short(&c.content_id)) }
                        td { (when(c.registered_at)) }
                        td { @if let Some(at) = c.retired_at { (when(at)) @if at > now { " (scheduled)" } } }
                        td {
                            @if c.version > 1 && visible.iter().any(|o| o.name == c.name && o.namespace == c.namespace && o.version == c.version - 1) {
                                a href={ "/console/contracts/diff?namespace=" (urlencode(c.namespace.as_stored())) "&name=" (urlencode(&c.name)) "&from=" (c.version - 1) "&to=" (c.version) } { "changes from v" (c.version - 1) }
                            }
                        }
                    }
                }
            }
        }
    };
    let p = Page {
        title: "Contracts".to_owned(),
        reviewer: Some(&reviewer),
        section: "contracts",
    };
    Ok(page(&p, body).into_response())
}

#[derive(Debug, Deserialize)]
pub(crate) struct DiffQuery {
    namespace: String,
    name: String,
    from: u32,
    to: u32,
}

/// How a line of a contract diff changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Change {
    Equal,
    Delete,
    Insert,
}

/// The lines of `new` against `old`, each with how it changed: Myers' diff over the lines
/// (`similar`'s slice diff — only the one algorithm and element type, which keeps its code
/// small; its whole-text API instantiates every algorithm for several element types).
fn line_diff<'a>(old: &'a str, new: &'a str) -> Vec<(Change, &'a str)> {
    let (old, new): (Vec<&str>, Vec<&str>) = (old.lines().collect(), new.lines().collect());
    let mut hook = similar::algorithms::Replace::new(similar::algorithms::Capture::default());
    // The capture hook cannot fail (its error type is `Infallible`).
    let _ = similar::algorithms::myers::diff(&mut hook, &old, 0..old.len(), &new, 0..new.len());
    let mut out = Vec::with_capacity(old.len().max(new.len()));
    for op in hook.into_inner().into_ops() {
        let (tag, from, to) = op.as_tag_tuple();
        let (deleted, inserted) = match tag {
            similar::DiffTag::Equal => {
                out.extend(
                    old.get(from)
                        .unwrap_or_default()
                        .iter()
                        .map(|l| (Change::Equal, *l)),
                );
                continue;
            }
            similar::DiffTag::Delete => (from, 0..0),
            similar::DiffTag::Insert => (0..0, to),
            similar::DiffTag::Replace => (from, to),
        };
        out.extend(
            old.get(deleted)
                .unwrap_or_default()
                .iter()
                .map(|l| (Change::Delete, *l)),
        );
        out.extend(
            new.get(inserted)
                .unwrap_or_default()
                .iter()
                .map(|l| (Change::Insert, *l)),
        );
    }
    out
}

/// The changes between two versions of a contract the tenant can see: its documents as
/// pretty JSON (keys sorted), compared line by line.
pub(crate) async fn contract_diff(
    State(state): State<Arc<AppState>>,
    reviewer: Reviewer,
    Query(q): Query<DiffQuery>,
) -> Result<Response, ApiError> {
    let tenant = reviewer.caller.principal.tenant();
    let namespace = warrant_core::contract::Namespace::from_stored(&q.namespace);
    let not_found = || {
        problem(
            StatusCode::NOT_FOUND,
            "Not found",
            "There is no such contract version.",
        )
    };
    if !namespace.visible_to(tenant) {
        return Ok(not_found());
    }
    let (Some(from), Some(to)) = (
        state.store.get_contract(&namespace, &q.name, q.from).await?,
        state.store.get_contract(&namespace, &q.name, q.to).await?,
    ) else {
        return Ok(not_found());
    };
    let (old, new) = (pretty(&from.body), pretty(&to.body));
    let lines = line_diff(&old, &new);
    let body = html! {
        p { a href="/console/contracts" { "← Contracts" } }
        h1 { (q.name) ": v" (q.from) " → v" (q.to) }
        dl.facts {
            dt { "v" (q.from) } dd.mono { (from.content_id) }
            dt { "v" (q.to) } dd.mono { (to.content_id) }
        }
        @if old == new {
            p.muted { "The two documents are the same." }
        } @else {
            pre.diff {
                @for (change, line) in &lines {
                    @match change {
                        Change::Delete => span.del { "- " (line) },
                        Change::Insert => span.add { "+ " (line) },
                        Change::Equal => span { "  " (line) },
                    }
                }
            }
        }
    };
    let p = Page {
        title: format!("{} v{} → v{}", q.name, q.from, q.to),
        reviewer: Some(&reviewer),
        section: "contracts",
    };
    Ok(page(&p, body).into_response())
}

/// One editable argument: a top-level property of the contract's input.
#[derive(Debug)]
struct EditField {
    name: String,
    kind: FieldKind,
    required: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FieldKind {
    Text,
    Integer,
    Number,
    Boolean,
    /// Anything else, edited as JSON.
    Json,
}

/// Whether an approval request may be approved with edits: a direct call's (a workflow's
/// review binds the step's exact payload, and the run waits for that one).
fn editable(a: &ApprovalRequest) -> bool {
    !crate::review::of_a_run(a)
}

/// The fields of the edit form, from the contract's input schema: its top-level properties.
/// `None` — no edits offered — for an input that is not an object with properties, or that has
/// a sensitive field anywhere (the stored arguments hold only its keyed hash, so an edit could
/// not carry the real value).
fn editable_fields(contract: &warrant_core::Contract) -> Option<Vec<EditField>> {
    if contract.has_sensitive_fields() {
        return None;
    }
    let input = contract.input_document()?;
    let required: Vec<&str> = input
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let properties = input.get("properties")?.as_object()?;
    let fields = properties
        .iter()
        .map(|(name, schema)| EditField {
            name: name.clone(),
            kind: match schema.get("type").and_then(Value::as_str) {
                Some("string") if schema.get("enum").is_none() => FieldKind::Text,
                Some("integer") => FieldKind::Integer,
                Some("number") => FieldKind::Number,
                Some("boolean") => FieldKind::Boolean,
                _ => FieldKind::Json,
            },
            required: required.contains(&name.as_str()),
        })
        .collect::<Vec<_>>();
    (!fields.is_empty()).then_some(fields)
}

fn edit_field(f: &EditField, current: Option<&Value>) -> Markup {
    let id = format!("edit-arg-{}", f.name);
    let field = format!("arg:{}", f.name);
    let text = match (f.kind, current) {
        (_, None) => String::new(),
        (FieldKind::Text, Some(Value::String(v))) => v.clone(),
        (FieldKind::Json, Some(v)) => pretty(v),
        (_, Some(v)) => v.to_string(),
    };
    html! {
        label for=(id) { (f.name) @if f.required { " (required)" } }
        @match f.kind {
            FieldKind::Text => input #(id) type="text" name=(field) value=(text) required[f.required];,
            FieldKind::Integer => input #(id) type="number" step="1" name=(field) value=(text) required[f.required];,
            FieldKind::Number => input #(id) type="number" step="any" name=(field) value=(text) required[f.required];,
            FieldKind::Boolean => select #(id) name=(field) {
                @if !f.required { option value="" { "(absent)" } }
                @for v in ["true", "false"] {
                    @if text == v { option value=(v) selected { (v) } } @else { option value=(v) { (v) } }
                }
            },
            FieldKind::Json => textarea #(id) name=(field) { (text) },
        }
    }
}

/// The edited arguments from the form: each field typed by the input schema; an empty
/// optional field is absent. The result is still untrusted: the pipeline's strict parser and
/// schema check it.
fn edited_arguments(
    fields: &[EditField],
    form: &[(String, String)],
) -> Result<serde_json::Map<String, Value>, String> {
    let mut out = serde_json::Map::new();
    for f in fields {
        let key = format!("arg:{}", f.name);
        let raw = form.iter().find(|(k, _)| *k == key).map(|(_, v)| v.as_str());
        let text = raw.unwrap_or("");
        if text.trim().is_empty() && !(f.required && f.kind == FieldKind::Text && raw.is_some()) {
            if f.required {
                return Err(format!("`{}` is required", f.name));
            }
            continue;
        }
        let value = match f.kind {
            FieldKind::Text => Value::String(text.to_owned()),
            FieldKind::Integer => Value::from(
                text.trim()
                    .parse::<i64>()
                    .map_err(|_| format!("`{}` is not an integer", f.name))?,
            ),
            FieldKind::Number => {
                let n: f64 = text
                    .trim()
                    .parse()
                    .map_err(|_| format!("`{}` is not a number", f.name))?;
                serde_json::Number::from_f64(n)
                    .map(Value::Number)
                    .ok_or_else(|| format!("`{}` is not a finite number", f.name))?
            }
            FieldKind::Boolean => match text {
                "true" => Value::Bool(true),
                "false" => Value::Bool(false),
                _ => return Err(format!("`{}` is true or false", f.name)),
            },
            FieldKind::Json => {
                serde_json::from_str(text).map_err(|e| format!("`{}` is not JSON: {e}", f.name))?
            }
        };
        out.insert(f.name.clone(), value);
    }
    Ok(out)
}

/// Approves a request with edits: the edited arguments, parsed by the input schema's types,
/// are proposed again as the proposer (the proposer's current authority) through `submit` —
/// strict parser, schema, policy, guards, budget — held for review and so bound to the
/// edited payload's digest; the original request is rejected (its payload can never run on
/// this decision), the edited one approved by this reviewer (both reasons name the other
/// request and the original digest), and the edited call is executed at once with its
/// approval, as the proposer, under the original idempotency key.
///
/// Owned by the runtime (`review::owned`), as a decision is: the edit's steps run to their end
/// even if the reviewer's request goes away between them (the test
/// `an_edit_in_the_console_outlives_the_reviewers_request`).
pub(crate) async fn edit(
    State(state): State<Arc<AppState>>,
    reviewer: Reviewer,
    Path(id): Path<String>,
    axum::Form(form): axum::Form<Vec<(String, String)>>,
) -> Result<Response, ApiError> {
    let work = edit_now(Arc::clone(&state), reviewer, id, form);
    crate::review::owned(&state, work).await.unwrap_or_else(|| {
        Ok(problem(
            StatusCode::INTERNAL_SERVER_ERROR,
            "Something went wrong",
            "The edit could not be completed; reload the page to see where it stands.",
        ))
    })
}

/// [`edit`]'s work.
async fn edit_now(
    state: Arc<AppState>,
    reviewer: Reviewer,
    id: String,
    form: Vec<(String, String)>,
) -> Result<Response, ApiError> {
    let field = |name: &str| {
        form.iter()
            .find(|(k, _)| k == name)
            .map_or("", |(_, v)| v.as_str())
    };
    if let Some(refused) = reviewer.csrf_refusal(field("csrf")) {
        return Ok(refused);
    }
    let reason = field("reason").trim().to_owned();
    if reason.is_empty() || reason.chars().count() > 900 {
        return Ok(problem(
            StatusCode::BAD_REQUEST,
            "A reason is required",
            "Say why you edit the call, in at most 900 characters, and submit again.",
        ));
    }
    let Some((a, may_decide)) = visible_approval(&state, &reviewer, &id).await? else {
        return Ok(problem(
            StatusCode::NOT_FOUND,
            "Not found",
            "There is no such approval request.",
        ));
    };
    if !may_decide {
        return Ok(problem(
            StatusCode::FORBIDDEN,
            "Not yours to decide",
            "The proposer of a call cannot review it.",
        ));
    }
    if a.status != ApprovalStatus::Pending {
        return Ok(problem(
            StatusCode::CONFLICT,
            "Already decided",
            &format!("This approval request is {}.", a.status.as_str()),
        ));
    }
    let tenant = reviewer.caller.principal.tenant();
    let now = state.env.now();
    let contract = state.registry.by_id(tenant, &a.request.contract_id, now).await?;
    let Some((contract, fields)) = contract
        .filter(|_| editable(&a))
        .and_then(|c| editable_fields(&c).map(|f| (c, f)))
    else {
        return Ok(problem(
            StatusCode::BAD_REQUEST,
            "Edits are not offered here",
            "This request cannot be approved with edits (a workflow's review, a sensitive field, or a retired contract).",
        ));
    };
    let edited = match edited_arguments(&fields, &form) {
        Ok(edited) => edited,
        Err(why) => return Ok(problem(StatusCode::BAD_REQUEST, "The edit is not valid", &why)),
    };
    let outcome =
        crate::review::approve_with_edits(&state, &reviewer.caller.principal, &a, &contract, edited, &reason)
            .await?;
    let new_id = match outcome {
        Ok(edited) => edited.approval_id,
        Err(refusal) => {
            let (status, title) = refusal.status_and_title();
            return Ok(problem(status, title, &refusal.to_string()));
        }
    };
    Ok(see_other(&format!("/console/approvals/{}", urlencode(&new_id))))
}

#[cfg(test)]
mod tests {
    use super::{Change, line_diff};

    #[test]
    fn a_line_diff_keeps_every_line_once_in_order() {
        use Change::{Delete, Equal, Insert};
        assert_eq!(
            line_diff("a\nb\nc\nd", "a\nx\nc\nd\ne"),
            [
                (Equal, "a"),
                (Delete, "b"),
                (Insert, "x"),
                (Equal, "c"),
                (Equal, "d"),
                (Insert, "e")
            ]
        );
        assert_eq!(line_diff("", "a"), [(Insert, "a")]);
        assert_eq!(line_diff("a\nb", ""), [(Delete, "a"), (Delete, "b")]);
        assert_eq!(line_diff("same", "same"), [(Equal, "same")]);
    }
}
