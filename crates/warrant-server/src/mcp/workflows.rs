//! Published workflows as MCP tools: `workflow-<name>` starts a run of the newest published
//! version of `<name>` with the call's arguments as its input, and answers the run's id and
//! status at once (the tool's effect class is `async`: the run goes on without the caller).
//!
//! The input is the client's own bytes of `params.arguments` (the strict parser reads them, as
//! for a proposal), and the run starts through [`crate::runs::start`] — the same code as
//! `POST /v1/workflows/{name}/{version}/runs`. A caller sees, and may start, a workflow only
//! when its grants cover the scopes of every contract the workflow calls or proposes (the same
//! rule that hides a contract tool it could not call). Contract names are `[a-z][a-z0-9_]*`,
//! so `workflow-…` never names a contract; and a hyphen, unlike a dot, is allowed in the
//! function names of the model APIs clients bridge MCP tools to (`^[a-zA-Z0-9_-]{1,64}$`).

use std::sync::Arc;

use rmcp::model::{CallToolResult, ContentBlock, JsonObject, MetaObject, Tool};
use serde_json::{Value, json};
use warrant_core::authority::Principal;
use warrant_core::contract::Effect;
use warrant_core::records::WorkflowRecord;
use warrant_core::store::StoreError;

use super::raw::RawCall;
use super::tools::{annotations, refusal, store_failed};
use crate::runs::StartRefusal;
use crate::state::AppState;

/// The prefix of a workflow's tool name.
pub(crate) const PREFIX: &str = "workflow-";

/// The newest version of each workflow of the caller's tenant that it may start.
async fn startable(state: &AppState, principal: &Principal) -> Result<Vec<WorkflowRecord>, StoreError> {
    let mut newest: std::collections::BTreeMap<String, WorkflowRecord> = std::collections::BTreeMap::new();
    for record in state.store.list_workflows(principal.tenant()).await? {
        if newest
            .get(&record.name)
            .is_none_or(|n| n.version < record.version)
        {
            newest.insert(record.name.clone(), record);
        }
    }
    let mut out = Vec::with_capacity(newest.len());
    for record in newest.into_values() {
        if may_start(state, principal, &record).await? {
            out.push(record);
        }
    }
    Ok(out)
}

/// Whether `principal`'s grants cover the scopes of every contract `record` pinned (and all of
/// them are still readable).
async fn may_start(
    state: &AppState,
    principal: &Principal,
    record: &WorkflowRecord,
) -> Result<bool, StoreError> {
    let now = state.env.now();
    for id in record.pinned.values() {
        match state.registry.by_id(&record.tenant, id, now).await? {
            Some(contract) if contract.scopes().is_subset(principal.grants()) => {}
            _ => return Ok(false),
        }
    }
    Ok(true)
}

/// The workflows `principal` may start, as tools.
///
/// # Errors
/// The store's.
pub(crate) async fn visible(state: &AppState, principal: &Principal) -> Result<Vec<Tool>, StoreError> {
    Ok(startable(state, principal).await?.iter().map(tool).collect())
}

fn tool(record: &WorkflowRecord) -> Tool {
    let schema = match record.document.get("input") {
        Some(Value::Object(map)) => map.clone(),
        _ => {
            let mut map = JsonObject::new();
            map.insert("type".into(), json!("object"));
            map
        }
    };
    let described = record
        .document
        .get("description")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let description = format!(
        "{described} Starts a run of the workflow `{}` version {} with these arguments as its \
         input and answers the run's id and status at once; the run goes on in Warrant (its tool \
         steps are governed calls, its reviews wait for a person).",
        record.name, record.version
    );
    let mut tool = Tool::new_with_raw(
        format!("{PREFIX}{}", record.name),
        Some(description.trim_start().to_owned().into()),
        Arc::new(schema),
    );
    tool.annotations = Some(annotations(Effect::Async, false));
    let mut meta = JsonObject::new();
    meta.insert("io.warrant/workflow".into(), json!(record.name));
    meta.insert("io.warrant/version".into(), json!(record.version));
    meta.insert("io.warrant/digest".into(), json!(record.digest));
    meta.insert("io.warrant/effect".into(), json!(Effect::Async.as_str()));
    tool.meta = Some(MetaObject(meta));
    tool
}

/// `tools/call` of `workflow-<name>`: starts a run.
pub(crate) async fn call(
    state: &Arc<AppState>,
    principal: Principal,
    trace: String,
    name: &str,
    raw: &RawCall,
) -> CallToolResult {
    let base = json!({"trace_id": trace});
    let workflow = name.strip_prefix(PREFIX).unwrap_or(name);
    // The newest version of that one workflow, if this caller may start it.
    let newest = match state.store.list_workflows(principal.tenant()).await {
        Ok(all) => all
            .into_iter()
            .filter(|r| r.name == workflow)
            .max_by_key(|r| r.version),
        Err(e) => return store_failed(&e, &trace),
    };
    let record = match newest {
        Some(record) => match may_start(state, &principal, &record).await {
            Ok(true) => Some(record),
            Ok(false) => None,
            Err(e) => return store_failed(&e, &trace),
        },
        None => None,
    };
    let Some(record) = record else {
        return refusal(
            "workflow",
            "WORKFLOW_NOT_FOUND",
            &format!("no workflow `{workflow}` this caller may start"),
            None,
            base,
        );
    };
    match crate::runs::start(state, &principal, &record, raw.arguments()).await {
        Ok(run) => {
            let structured = json!({
                "run_id": run.id,
                "workflow": run.workflow,
                "version": run.version,
                "status": run.status.as_str(),
                "next_step": run.next_step,
                "run_url": format!("{}/v1/runs/{}", state.public_url.trim_end_matches('/'), run.id),
                "trace_id": trace,
            });
            let text = format!(
                "started run {} of workflow `{}` version {}: {}. Follow it with GET /v1/runs/{}.",
                run.id,
                run.workflow,
                run.version,
                run.status.as_str(),
                run.id
            );
            let mut answer = CallToolResult::success(vec![ContentBlock::text(text)]);
            answer.structured_content = Some(structured);
            answer
        }
        Err(StartRefusal::NotRunnable(code, why)) => refusal("workflow", code, &why, None, base),
        Err(StartRefusal::Input(why)) => refusal("parse", "INVALID_JSON", &why, Some("/arguments"), base),
        Err(StartRefusal::Schema(rejection)) => refusal(
            rejection.stage().as_str(),
            rejection.code().as_str(),
            rejection.detail(),
            rejection.pointer(),
            base,
        ),
        Err(StartRefusal::Store(e)) => store_failed(&e, &trace),
    }
}
