//! Workflows (PRODUCT §8): publish (a tenant admin, in its own tenant), list and show. A
//! definition is published only if the compiler accepts it against the contracts the
//! tenant's calls resolve to (its own namespace, then the platform's): a refusal is a 422
//! listing every violation with its rule and the path that proves it. A published version
//! pins the content id of every contract it calls and never changes.

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::{Value, json};
use warrant_core::records::{Publication, WorkflowRecord};
use warrant_core::store::StoreError;
use warrant_workflow::compile::Violation;

use crate::auth::Caller;
use crate::authoring::{Refusal, coverage, violations};
use crate::error::ApiError;
use crate::routes::rfc3339;
use crate::state::AppState;

/// The routes.
pub fn router() -> Router<Arc<AppState>> {
    Router::new()
        .route("/v1/workflows", get(list).post(publish))
        .route("/v1/workflows/{name}/{version}", get(show))
        .route(
            "/v1/workflows/{name}/{version}/runs",
            axum::routing::post(start_run),
        )
        .route("/v1/runs", get(list_runs))
        .route("/v1/runs/{id}", get(show_run))
        .route("/v1/runs/{id}/cancel", axum::routing::post(cancel_run))
}

fn refused(code: &str, list: &[Violation]) -> ApiError {
    ApiError::new(
        StatusCode::UNPROCESSABLE_ENTITY,
        "workflow",
        code,
        format!("the workflow is refused: {} violation(s)", list.len()),
    )
    .with("violations", violations(list))
}

/// Publish a workflow (admin of the tenant): compiled against the tenant's contracts; refused
/// with every violation, or stored with its pins.
#[utoipa::path(post, path = "/v1/workflows", tag = "workflows",
    request_body(content = String, description = "the workflow definition", content_type = "application/yaml"),
    responses(
        (status = 201, description = "published", body = crate::openapi::PublishedWorkflow),
        (status = 200, description = "already published with this definition", body = crate::openapi::PublishedWorkflow),
        (status = 400, description = "malformed request", body = crate::openapi::ErrorBody),
        (status = 401, description = "no valid key", body = crate::openapi::ErrorBody),
        (status = 403, description = "not an admin", body = crate::openapi::ErrorBody),
        (status = 409, description = "this name@version is published with another definition", body = crate::openapi::ErrorBody),
        (status = 415, description = "wrong content type", body = crate::openapi::ErrorBody),
        (status = 422, description = "refused by the compiler, with every violation", body = crate::openapi::ErrorBody)))]
pub(crate) async fn publish(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    caller.require_admin()?;
    let tenant = caller.principal.tenant().to_owned();
    let format = crate::routes::document_format(&headers, "a workflow")?;
    let text = std::str::from_utf8(&body).map_err(|_| ApiError::bad_request("the workflow is not UTF-8"))?;
    let now = state.env.now();
    let (document, compiled) = crate::authoring::compile_text(&state.registry, &tenant, text, format, now)
        .await
        .map_err(|refusal| match refusal {
            Refusal::Syntax(message) => ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "workflow",
                "WORKFLOW_SYNTAX",
                message,
            ),
            Refusal::Invalid(list) => refused("WORKFLOW_INVALID", &list),
            Refusal::Refused(list) => refused("WORKFLOW_REFUSED", &list),
            Refusal::Store(e) => store_error(e),
        })?;
    let record = WorkflowRecord {
        tenant,
        name: compiled.definition.name.clone(),
        version: compiled.definition.version,
        digest: warrant_core::canon::digest(&document).to_string(),
        document,
        pinned: compiled
            .pinned()
            .into_iter()
            .map(|(step, id)| (step, id.to_string()))
            .collect(),
        published_by: caller.principal.id().to_owned(),
        published_at: now,
    };
    let status = match state.store.publish_workflow(&record).await {
        Ok(Publication::Published) => StatusCode::CREATED,
        Ok(Publication::Unchanged) => StatusCode::OK,
        Err(StoreError::Conflict(message)) => {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "workflow",
                "WORKFLOW_VERSION_EXISTS",
                message,
            ));
        }
        Err(e) => return Err(store_error(e)),
    };
    let mut body = summary(&record);
    if let Value::Object(map) = &mut body {
        map.insert("coverage".into(), coverage(&compiled));
    }
    Ok((status, axum::Json(body)).into_response())
}

fn store_error(e: StoreError) -> ApiError {
    ApiError::from(e)
}

fn summary(w: &WorkflowRecord) -> Value {
    json!({
        "name": w.name,
        "version": w.version,
        "digest": w.digest,
        "description": w.document.get("description"),
        "pinned": w.pinned,
        "published_by": w.published_by,
        "published_at": rfc3339(w.published_at),
    })
}

/// The tenant's published workflows.
#[utoipa::path(get, path = "/v1/workflows", tag = "workflows",
    responses((status = 200, description = "the tenant's workflows", body = crate::openapi::WorkflowList),
        (status = 401, description = "no valid key", body = crate::openapi::ErrorBody)))]
pub(crate) async fn list(State(state): State<Arc<AppState>>, caller: Caller) -> Result<Response, ApiError> {
    let workflows = state
        .store
        .list_workflows(caller.principal.tenant())
        .await
        .map_err(store_error)?;
    let items: Vec<Value> = workflows.iter().map(summary).collect();
    Ok(axum::Json(json!({ "workflows": items })).into_response())
}

/// One published workflow, with its definition.
#[utoipa::path(get, path = "/v1/workflows/{name}/{version}", tag = "workflows",
    params(("name" = String, Path, description = "the workflow's name"), ("version" = u32, Path, description = "its version")),
    responses((status = 200, description = "the workflow", body = crate::openapi::PublishedWorkflow),
        (status = 401, description = "no valid key", body = crate::openapi::ErrorBody),
        (status = 404, description = "no such workflow in this tenant", body = crate::openapi::ErrorBody)))]
pub(crate) async fn show(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path((name, version)): Path<(String, u32)>,
) -> Result<Response, ApiError> {
    let workflow = state
        .store
        .get_workflow(caller.principal.tenant(), &name, version)
        .await
        .map_err(store_error)?
        .ok_or_else(|| ApiError::not_found("workflow"))?;
    let mut body = summary(&workflow);
    if let Value::Object(map) = &mut body {
        map.insert("definition".into(), workflow.document.clone());
    }
    Ok(axum::Json(body).into_response())
}

/// Start a run of a published workflow with an input (any key of the tenant; every tool step
/// is then a call as this principal, through the same pipeline as its own calls).
#[utoipa::path(post, path = "/v1/workflows/{name}/{version}/runs", tag = "workflows",
    params(("name" = String, Path, description = "the workflow's name"), ("version" = u32, Path, description = "its version")),
    request_body(content = Object, description = "the run's input (validated against the workflow's input schema)", content_type = "application/json"),
    responses((status = 201, description = "started", body = crate::openapi::RunView),
        (status = 400, description = "malformed input", body = crate::openapi::ErrorBody),
        (status = 401, description = "no valid key", body = crate::openapi::ErrorBody),
        (status = 404, description = "no such workflow in this tenant", body = crate::openapi::ErrorBody),
        (status = 409, description = "the workflow cannot run here (`MODEL_NOT_CONFIGURED`: it has model steps and the server no model endpoint)", body = crate::openapi::ErrorBody),
        (status = 422, description = "the input fails the workflow's input schema", body = crate::openapi::ErrorBody)))]
pub(crate) async fn start_run(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path((name, version)): Path<(String, u32)>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let tenant = caller.principal.tenant().to_owned();
    let workflow = state
        .store
        .get_workflow(&tenant, &name, version)
        .await
        .map_err(store_error)?
        .ok_or_else(|| ApiError::not_found("workflow"))?;
    let run = crate::runs::start(&state, &caller.principal, &workflow, &body)
        .await
        .map_err(|refusal| match refusal {
            crate::runs::StartRefusal::NotRunnable(code, why) => {
                ApiError::new(StatusCode::CONFLICT, "workflow", code, why)
            }
            crate::runs::StartRefusal::Input(why) => ApiError::bad_request(why),
            crate::runs::StartRefusal::Schema(rejection) => ApiError::rejection(&rejection),
            crate::runs::StartRefusal::Store(e) => store_error(e),
        })?;
    Ok((StatusCode::CREATED, axum::Json(run_view(&run, &[]))).into_response())
}

fn run_view(run: &warrant_core::records::RunRecord, steps: &[warrant_core::records::RunStep]) -> Value {
    json!({
        "id": run.id,
        "workflow": run.workflow,
        "version": run.version,
        "status": run.status.as_str(),
        "next_step": run.next_step,
        "cost": run.cost,
        "error": run.error,
        "started_by": run.principal.get("id"),
        "created_at": rfc3339(run.created_at),
        "updated_at": rfc3339(run.updated_at),
        "steps": steps.iter().map(|s| json!({
            "seq": s.seq,
            "step": s.step_id,
            "kind": s.kind,
            "status": s.status,
            "output": s.output,
            "ledger_id": s.ledger_id,
            "cost": s.cost,
            "detail": s.detail,
            "finished_at": rfc3339(s.finished_at),
        })).collect::<Vec<_>>(),
    })
}

/// The tenant's newest runs.
#[utoipa::path(get, path = "/v1/runs", tag = "workflows",
    responses((status = 200, description = "the newest runs", body = crate::openapi::RunList),
        (status = 401, description = "no valid key", body = crate::openapi::ErrorBody)))]
pub(crate) async fn list_runs(
    State(state): State<Arc<AppState>>,
    caller: Caller,
) -> Result<Response, ApiError> {
    let runs = state
        .store
        .list_runs(caller.principal.tenant(), 100)
        .await
        .map_err(store_error)?;
    let items: Vec<Value> = runs.iter().map(|r| run_view(r, &[])).collect();
    Ok(axum::Json(json!({ "runs": items })).into_response())
}

/// Cancel a run that has not ended (the principal that started it, or an admin of the tenant).
/// A step already calling its tool finishes that call, recorded on the ledger, not on the run.
#[utoipa::path(post, path = "/v1/runs/{id}/cancel", tag = "workflows",
    params(("id" = String, Path, description = "the run id")),
    responses((status = 200, description = "cancelled", body = crate::openapi::RunView),
        (status = 401, description = "no valid key", body = crate::openapi::ErrorBody),
        (status = 403, description = "neither the run's principal nor an admin", body = crate::openapi::ErrorBody),
        (status = 404, description = "no such run in this tenant", body = crate::openapi::ErrorBody),
        (status = 409, description = "the run has ended", body = crate::openapi::ErrorBody)))]
pub(crate) async fn cancel_run(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let tenant = caller.principal.tenant();
    let run = state
        .store
        .get_run(tenant, &id)
        .await
        .map_err(store_error)?
        .ok_or_else(|| ApiError::not_found("run"))?;
    let starter = run.principal.get("id").and_then(Value::as_str) == Some(caller.principal.id());
    if !starter {
        caller.require_admin()?;
    }
    if !state
        .store
        .cancel_run(tenant, &id, state.env.now())
        .await
        .map_err(store_error)?
    {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "workflow",
            "RUN_ENDED",
            format!("run {id} has ended ({})", run.status.as_str()),
        ));
    }
    metrics::counter!(crate::runs::metric::RUNS, "event" => "cancelled").increment(1);
    Ok(axum::Json(run_answer(&state, tenant, &id).await?).into_response())
}

/// One run: its state, each executed step with its ledger row, and its cost.
#[utoipa::path(get, path = "/v1/runs/{id}", tag = "workflows",
    params(("id" = String, Path, description = "the run id")),
    responses((status = 200, description = "the run", body = crate::openapi::RunView),
        (status = 401, description = "no valid key", body = crate::openapi::ErrorBody),
        (status = 404, description = "no such run in this tenant", body = crate::openapi::ErrorBody)))]
pub(crate) async fn show_run(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    Ok(axum::Json(run_answer(&state, caller.principal.tenant(), &id).await?).into_response())
}

/// A run of `tenant` with its steps, as the run routes answer it.
async fn run_answer(state: &AppState, tenant: &str, id: &str) -> Result<Value, ApiError> {
    let run = state
        .store
        .get_run(tenant, id)
        .await
        .map_err(store_error)?
        .ok_or_else(|| ApiError::not_found("run"))?;
    let steps = state.store.run_steps(tenant, id).await.map_err(store_error)?;
    Ok(run_view(&run, &steps))
}
