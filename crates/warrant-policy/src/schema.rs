//! The Cedar schema generated from the registered contracts: the `Warrant` namespace with its
//! principal, role and tool entity types, and three actions per contract with the contract's
//! input as their context type (a review's and a reveal's without the sensitive fields).

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{Map, Value, json};
use warrant_core::Contract;

use crate::mapping::{self, Attribute, Values};

/// The namespace of every generated type and action.
pub(crate) const NAMESPACE: &str = "Warrant";
/// The action group every invoke action belongs to.
pub(crate) const INVOKE_GROUP: &str = "invoke";
/// The action group every review action belongs to.
pub(crate) const REVIEW_GROUP: &str = "review";
/// The action group every reveal action belongs to (seeing a held call's sensitive values).
pub(crate) const REVEAL_GROUP: &str = "reveal";

/// One contract as the schema sees it.
pub(crate) struct ToolShape {
    /// The contract.
    pub(crate) contract: Arc<Contract>,
    /// Its invoke actions' context attributes (the mapped input schema).
    pub(crate) context: Vec<Attribute>,
    /// Its review actions' context attributes: the same without the sensitive fields (a
    /// review sees the arguments as the approval stores them).
    pub(crate) review_context: Vec<Attribute>,
}

/// `N@V` of a contract, `N` qualified by its namespace (`tenant/N@V` for a tenant's own
/// contract), so two tenants' contracts of one name never share an action or a resource.
pub(crate) fn label(contract: &Contract) -> String {
    format!("{}@{}", contract.qualified_name(), contract.version())
}

/// The invoke action ids from the most to the least specific: `N@V`, `N`, `invoke` (`N`
/// qualified as in [`label`]).
pub(crate) fn invoke_chain(contract: &Contract) -> [String; 3] {
    [
        label(contract),
        contract.qualified_name(),
        INVOKE_GROUP.to_owned(),
    ]
}

/// The review action ids from the most to the least specific: `review:N@V`, `review:N`,
/// `review`.
pub(crate) fn review_chain(contract: &Contract) -> [String; 3] {
    [
        format!("{REVIEW_GROUP}:{}", label(contract)),
        format!("{REVIEW_GROUP}:{}", contract.qualified_name()),
        REVIEW_GROUP.to_owned(),
    ]
}

/// The reveal action ids from the most to the least specific: `reveal:N@V`, `reveal:N`,
/// `reveal`. A reveal is asked with a review's context (the stored arguments, no sensitive
/// field): whether a reviewer may see the sensitive values of a held call.
pub(crate) fn reveal_chain(contract: &Contract) -> [String; 3] {
    [
        format!("{REVEAL_GROUP}:{}", label(contract)),
        format!("{REVEAL_GROUP}:{}", contract.qualified_name()),
        REVEAL_GROUP.to_owned(),
    ]
}

/// The contracts to put in the schema, one per `name@version`, sorted, and the problems that
/// keep a set of contracts out of Cedar (a name taken by an action group, two different
/// contracts under one `name@version`).
pub(crate) fn collect(contracts: &[Arc<Contract>]) -> (Vec<ToolShape>, Vec<String>) {
    let mut problems = Vec::new();
    let mut unique: BTreeMap<(String, u32), &Arc<Contract>> = BTreeMap::new();
    for contract in contracts {
        let key = (contract.qualified_name(), contract.version());
        if let Some(seen) = unique.get(&key) {
            if seen.id() != contract.id() {
                problems.push(format!(
                    "two different contracts are named {} ({} and {})",
                    label(contract),
                    seen.id(),
                    contract.id()
                ));
            }
            continue;
        }
        if [INVOKE_GROUP, REVIEW_GROUP, REVEAL_GROUP].contains(&contract.name()) {
            problems.push(format!(
                "contract {} cannot be named in policies: `{}` is the name of an action group",
                label(contract),
                contract.name()
            ));
        }
        unique.insert(key, contract);
    }
    let tools = unique
        .into_values()
        .map(|contract| ToolShape {
            contract: Arc::clone(contract),
            context: mapping::context_attributes(contract.input_document(), Values::All),
            review_context: mapping::context_attributes(contract.input_document(), Values::NotSensitive),
        })
        .collect();
    (tools, problems)
}

/// The Cedar schema, in Cedar's JSON schema format.
pub(crate) fn schema_json(tools: &[ToolShape]) -> Value {
    let string = json!({ "type": "String", "required": true });
    let principal = json!({
        "memberOfTypes": ["Role"],
        "shape": {
            "type": "Record",
            "attributes": {
                "id": string,
                "tenant": string,
                "roles": { "type": "Set", "element": { "type": "String" }, "required": true },
            },
        },
    });
    let tool = json!({
        "shape": {
            "type": "Record",
            "attributes": {
                "name": string,
                "version": { "type": "Long", "required": true },
                "effect": string,
                "owner": string,
                "tenant": string,
                "platform": { "type": "Boolean", "required": true },
            },
        },
    });
    let mut actions = Map::new();
    actions.insert(INVOKE_GROUP.into(), json!({}));
    actions.insert(REVIEW_GROUP.into(), json!({}));
    actions.insert(REVEAL_GROUP.into(), json!({}));
    for shape in tools {
        let invoke = mapping::record_schema_json(&shape.context);
        let review = mapping::record_schema_json(&shape.review_context);
        for (chain, context) in [
            (invoke_chain(&shape.contract), &invoke),
            (review_chain(&shape.contract), &review),
            (reveal_chain(&shape.contract), &review),
        ] {
            let [action, group, root] = chain;
            let applies_to = json!({
                "principalTypes": ["Principal"],
                "resourceTypes": ["Tool"],
                "context": context,
            });
            actions.insert(
                action,
                json!({
                    "memberOf": [{ "id": group }, { "id": root }],
                    "appliesTo": applies_to,
                }),
            );
            actions.insert(group, json!({ "memberOf": [{ "id": root }] }));
        }
    }
    json!({
        NAMESPACE: {
            "entityTypes": { "Principal": principal, "Role": {}, "Tool": tool },
            "actions": actions,
        }
    })
}
