//! Contracts: list and read (any caller: the platform's and the caller's tenant's), register
//! and retire (a tenant admin in its own tenant; the platform operator for the platform, or for
//! a tenant named with `?tenant=`). Only the operator's registrations may carry an adapter
//! binding: bindings choose hosts and credentials, which are the operator's.

use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::{Value, json};
use warrant_core::Contract;
use warrant_core::contract::ContractError;
use warrant_core::contract::Namespace;
use warrant_core::records::{Registration, StoredContract};
use warrant_core::store::StoreError;

use crate::auth::Caller;
use crate::error::ApiError;
use crate::routes::rfc3339;
use crate::state::AppState;

/// The routes.
pub fn router() -> Router<Arc<AppState>> {
    Router::new()
        .route("/v1/contracts", get(list).post(register))
        .route("/v1/contracts/{name}/{version}", get(show))
        .route("/v1/contracts/{id}/retire", post(retire))
}

/// `?tenant=` on the contract routes: the platform operator addressing a tenant's contracts.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct NamespaceQuery {
    tenant: Option<String>,
}

impl NamespaceQuery {
    /// The namespace a change by `caller` addresses: a tenant admin's own tenant; the operator's
    /// platform, or the tenant it names.
    fn target(&self, caller: &Caller) -> Result<Namespace, ApiError> {
        if caller.is_operator() {
            return Ok(match &self.tenant {
                Some(t) => {
                    check_tenant_id(t)?;
                    Namespace::Tenant(t.clone())
                }
                None => Namespace::Platform,
            });
        }
        caller.require_admin()?;
        match &self.tenant {
            Some(t) if t != caller.principal.tenant() => Err(ApiError::forbidden(
                "another tenant's contracts are not yours to change",
            )),
            _ => Ok(Namespace::Tenant(caller.principal.tenant().to_owned())),
        }
    }
}

/// Refuses a tenant id that could not own keys, and the operator's reserved one.
pub(crate) fn check_tenant_id(tenant: &str) -> Result<(), ApiError> {
    warrant_core::authority::Principal::new("check", tenant, [])
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    if tenant == crate::auth::PLATFORM_TENANT {
        return Err(ApiError::bad_request(
            "`platform` is the operator's reserved tenant; platform contracts need no tenant",
        ));
    }
    Ok(())
}

/// Whether `caller` may see contracts of `namespace` (its own tenant's and the platform's; the
/// operator sees every namespace).
fn visible(caller: &Caller, namespace: &Namespace) -> bool {
    caller.is_operator() || namespace.visible_to(caller.principal.tenant())
}

fn summary(c: &StoredContract) -> Value {
    json!({
        "id": c.content_id,
        "tenant": c.namespace.tenant(),
        "name": c.name,
        "version": c.version,
        "description": c.body.get("description"),
        "effect": c.body.get("effect"),
        "scopes": c.body.get("scopes"),
        "approval": c.body.get("approval"),
        "binding_digest": c.binding_digest,
        "registered_at": rfc3339(c.registered_at),
        "retired_at": c.retired_at.map(rfc3339),
    })
}

/// Registered contracts.
#[utoipa::path(get, path = "/v1/contracts", tag = "contracts",
    responses((status = 200, description = "every registered contract", body = crate::openapi::ContractList), (status = 401, description = "no valid key", body = crate::openapi::ErrorBody)))]
pub(crate) async fn list(
    State(state): State<Arc<AppState>>,
    caller: Caller,
) -> Result<Json<Value>, ApiError> {
    let contracts = state.store.list_contracts().await?;
    let visible: Vec<Value> = contracts
        .iter()
        .filter(|c| visible(&caller, &c.namespace))
        .map(summary)
        .collect();
    Ok(Json(json!({"contracts": visible})))
}

/// One contract, with the document its id covers.
#[utoipa::path(get, path = "/v1/contracts/{name}/{version}", tag = "contracts",
    params(("name" = String, Path, description = "contract name"), ("version" = u32, Path, description = "version")),
    responses((status = 200, description = "the contract", body = crate::openapi::ContractSummary), (status = 401, description = "no valid key", body = crate::openapi::ErrorBody),
        (status = 404, description = "not found", body = crate::openapi::ErrorBody)))]
pub(crate) async fn show(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path((name, version)): Path<(String, String)>,
    Query(query): Query<NamespaceQuery>,
) -> Result<Json<Value>, ApiError> {
    let version: u32 = version.parse().map_err(|_| ApiError::not_found("contract"))?;
    // The caller's own tenant first, then the platform (as a call resolves it); the operator
    // may name a tenant.
    let own = match (&query.tenant, caller.is_operator()) {
        (Some(t), true) => Namespace::Tenant(t.clone()),
        (Some(t), false) if t != caller.principal.tenant() => return Err(ApiError::not_found("contract")),
        _ => Namespace::Tenant(caller.principal.tenant().to_owned()),
    };
    let mut stored = None;
    for namespace in [own, Namespace::Platform] {
        stored = state.store.get_contract(&namespace, &name, version).await?;
        if stored.is_some() {
            break;
        }
    }
    let stored = stored.ok_or_else(|| ApiError::not_found("contract"))?;
    let mut body = summary(&stored);
    if let Value::Object(map) = &mut body {
        // The document the id covers; the binding (endpoints, credential names) stays inside.
        map.insert("document".into(), stored.body.clone());
    }
    Ok(Json(body))
}

/// Register a contract (admin).
#[utoipa::path(post, path = "/v1/contracts", tag = "contracts",
    request_body(content = String, description = "the contract document", content_type = "application/yaml"),
    responses(
        (status = 201, description = "registered", body = crate::openapi::Registered),
        (status = 200, description = "already registered with this body", body = crate::openapi::Registered),
        (status = 400, description = "malformed request", body = crate::openapi::ErrorBody),
        (status = 401, description = "no valid key", body = crate::openapi::ErrorBody),
        (status = 403, description = "not allowed", body = crate::openapi::ErrorBody),
        (status = 409, description = "conflict", body = crate::openapi::ErrorBody),
        (status = 415, description = "wrong content type", body = crate::openapi::ErrorBody),
        (status = 422, description = "invalid", body = crate::openapi::ErrorBody)))]
pub(crate) async fn register(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Query(query): Query<NamespaceQuery>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let namespace = query.target(&caller)?;
    let format = crate::routes::document_format(&headers, "a contract")?;
    let text = std::str::from_utf8(&body).map_err(|_| ApiError::bad_request("the contract is not UTF-8"))?;
    let contract = match Contract::from_text(text, format) {
        Ok(c) => c,
        Err(ContractError::Syntax(message)) => {
            return Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "contract",
                "CONTRACT_SYNTAX",
                message,
            ));
        }
        Err(ContractError::Lint(problems)) => {
            let list: Vec<Value> = problems
                .iter()
                .map(|p| json!({"pointer": p.pointer(), "message": p.message()}))
                .collect();
            return Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "contract",
                "CONTRACT_INVALID",
                format!("{} problem(s) in the contract", list.len()),
            )
            .with("problems", Value::Array(list)));
        }
    };
    if contract.adapter().is_some() && !caller.is_operator() {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "contract",
            "BINDING_OPERATOR_ONLY",
            "adapter bindings are the platform operator's: register the contract without `adapter`",
        ));
    }
    if let (Some(tenant), true) = (namespace.tenant(), caller.is_operator())
        && !state.store.list_tenants().await?.iter().any(|t| t.id == tenant)
    {
        return Err(ApiError::not_found("tenant"));
    }
    let contract = contract.in_namespace(namespace.clone());
    if namespace.tenant().is_some() && platform_uses(&state, contract.name()).await? {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "contract",
            "CONTRACT_NAME_TAKEN",
            format!(
                "`{}` is a platform contract's name; a tenant's contract needs another",
                contract.name()
            ),
        ));
    }
    if contract.adapter().is_some()
        && let Err(e) = state.adapters.validate(&contract)
    {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "contract",
            "ADAPTER_BINDING_INVALID",
            e.to_string(),
        ));
    }
    let now = state.env.now();
    let id = contract.id_str().to_owned();
    let (name, version) = (contract.name().to_owned(), contract.version());
    let outcome = match state.registry.register(contract, now).await {
        Ok(o) => o,
        Err(StoreError::Conflict(_)) => {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "contract",
                "CONTRACT_VERSION_TAKEN",
                format!(
                    "{name}@{version} is registered with another body or binding; register a new version"
                ),
            ));
        }
        Err(e) => return Err(e.into()),
    };
    state.sync_contracts().await?;
    let status = match outcome {
        Registration::Registered => StatusCode::CREATED,
        _ => StatusCode::OK,
    };
    Ok((
        status,
        Json(json!({"id": id, "tenant": namespace.tenant(), "name": name, "version": version})),
    )
        .into_response())
}

/// Whether a platform contract has the name `name`.
async fn platform_uses(state: &AppState, name: &str) -> Result<bool, ApiError> {
    Ok(state
        .store
        .list_contracts()
        .await?
        .iter()
        .any(|c| c.namespace == Namespace::Platform && c.name == name))
}

/// Retire a contract (admin): new calls are refused.
#[utoipa::path(post, path = "/v1/contracts/{id}/retire", tag = "contracts",
    params(("id" = String, Path, description = "content id")),
    responses((status = 200, description = "retired", body = crate::openapi::Retired), (status = 401, description = "no valid key", body = crate::openapi::ErrorBody),
        (status = 403, description = "not allowed", body = crate::openapi::ErrorBody),
        (status = 404, description = "not found", body = crate::openapi::ErrorBody)))]
pub(crate) async fn retire(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(id): Path<String>,
    Query(query): Query<NamespaceQuery>,
) -> Result<Json<Value>, ApiError> {
    // A tenant admin retires only its own tenant's contracts: a platform contract, or another
    // tenant's, is not found in its namespace.
    let namespace = query.target(&caller)?;
    if !state.registry.retire(&namespace, &id, state.env.now()).await? {
        return Err(ApiError::not_found("contract"));
    }
    state.sync_contracts().await?;
    Ok(Json(json!({"id": id, "retired": true})))
}
