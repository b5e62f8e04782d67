//! The schema walk against `jsonschema`'s own evaluation: for random lint-clean schemas and
//! random valid instances, the (instance location, schema node) pairs the walk reports for
//! annotated nodes are exactly the annotations `jsonschema` collects.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic,
    reason = "tests"
)]

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use serde_json::{Map, Value, json};
use warrant_core::Contract;

const KEYS: [&str; 3] = ["a", "b", "c"];

/// Subschemas in constraint positions (`if`, `not`, `contains`, `propertyNames`): never tagged.
fn constraint() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(json!({"type": "string"})),
        Just(json!({"type": "integer"})),
        Just(json!({"required": ["a"]})),
        Just(json!({"properties": {"a": {"type": "string"}}})),
        Just(json!({"properties": {"b": {"const": 1}}})),
        Just(json!({"minItems": 1})),
        Just(json!({"maxLength": 1})),
        Just(json!({"const": 1})),
    ]
}

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        (1u64..=3).prop_map(|n| json!({"type": "string", "maxLength": n})),
        Just(json!({"type": "integer", "minimum": 0, "maximum": 2})),
        Just(json!({"type": "number", "minimum": 0, "maximum": 2})),
        Just(json!({"type": "null"})),
        Just(json!({"type": "boolean"})),
        Just(json!({"enum": ["x", 1, null]})),
        (0usize..3).prop_map(|d| json!({"$ref": format!("#/$defs/d{d}")})),
        Just(json!({"$ref": "#"})),
        Just(json!(false)),
    ]
}

fn object(inner: BoxedStrategy<Value>) -> impl Strategy<Value = Value> {
    (
        prop::collection::btree_map(prop::sample::select(&KEYS[..]), inner.clone(), 0..=3),
        prop::collection::btree_set(prop::sample::select(&KEYS[..]), 0..=1),
        prop::option::weighted(0.3, (prop::sample::select(&KEYS[..]), inner.clone())),
        prop::option::weighted(
            0.3,
            (
                constraint(),
                prop::option::of(inner.clone()),
                prop::option::of(inner),
            ),
        ),
        prop::option::weighted(0.15, constraint()),
    )
        .prop_map(|(properties, required, dependent, condition, not)| {
            let mut node = json!({"type": "object", "additionalProperties": false});
            let required: Vec<&str> = required
                .into_iter()
                .filter(|k| properties.contains_key(k))
                .collect();
            node["properties"] =
                Value::Object(properties.into_iter().map(|(k, v)| (k.to_owned(), v)).collect());
            if !required.is_empty() {
                node["required"] = json!(required);
            }
            if let Some((key, schema)) = dependent {
                node["dependentSchemas"] = json!({key: schema});
            }
            if let Some((test, then, otherwise)) = condition {
                node["if"] = test;
                if let Some(t) = then {
                    node["then"] = t;
                }
                if let Some(e) = otherwise {
                    node["else"] = e;
                }
            }
            if let Some(n) = not {
                node["not"] = n;
            }
            node
        })
}

fn schema_node() -> BoxedStrategy<Value> {
    leaf()
        .prop_recursive(4, 40, 3, |inner| {
            prop_oneof![
                2 => object(inner.clone()),
                1 => (inner.clone(), prop::collection::vec(inner.clone(), 0..=2), prop::option::weighted(0.2, constraint()))
                    .prop_map(|(items, prefix, contains)| {
                        let mut node = json!({"type": "array", "maxItems": 3, "items": items});
                        if !prefix.is_empty() {
                            node["prefixItems"] = Value::Array(prefix);
                        }
                        if let Some(c) = contains {
                            node["contains"] = c;
                        }
                        node
                    }),
                1 => (prop::sample::select(&["allOf", "anyOf", "oneOf"][..]), prop::collection::vec(inner.clone(), 1..=3))
                    .prop_map(|(key, branches)| json!({key: branches})),
                // A composed node that also applies `properties` and `additionalProperties`.
                1 => (prop::collection::vec(inner.clone(), 1..=2), prop::sample::select(&KEYS[..]), inner.clone(), inner)
                    .prop_map(|(branches, key, property, additional)| {
                        json!({"anyOf": branches, "properties": {key: property}, "additionalProperties": additional})
                    }),
            ]
        })
        .boxed()
}

fn document() -> impl Strategy<Value = Value> {
    (
        object(schema_node()),
        prop::collection::vec(leaf().prop_recursive(2, 8, 2, |inner| object(inner.boxed())), 3),
    )
        .prop_map(|(mut root, defs)| {
            // Keep the definitions a `$ref` reaches from the root (an unreferenced one would
            // carry annotations the lint refuses).
            let mut texts = vec![root.to_string()];
            let mut kept = vec![false; defs.len()];
            while let Some(i) = (0..defs.len())
                .find(|&i| !kept[i] && texts.iter().any(|t| t.contains(&format!("#/$defs/d{i}\""))))
            {
                kept[i] = true;
                texts.push(defs[i].to_string());
            }
            let defs: Map<String, Value> = defs
                .into_iter()
                .enumerate()
                .filter(|(i, _)| kept[*i])
                .map(|(i, d)| (format!("d{i}"), d))
                .collect();
            if !defs.is_empty() {
                root["$defs"] = Value::Object(defs);
            }
            let mut next = 0;
            tag(&mut root, &mut next);
            root
        })
}

/// Tags every object node in a position the walk follows (`x-id`, and `x-warrant-sensitive`
/// so it counts as annotated), leaving one in four untagged.
fn tag(node: &mut Value, next: &mut u64) {
    let Value::Object(map) = node else { return };
    *next += 1;
    if !(*next).is_multiple_of(4) {
        map.insert("x-id".into(), json!(*next));
        map.insert("x-warrant-sensitive".into(), json!((*next).is_multiple_of(3)));
    }
    for (key, sub) in map.iter_mut() {
        match key.as_str() {
            "items" | "then" | "else" | "additionalProperties" => tag(sub, next),
            "prefixItems" | "allOf" | "anyOf" | "oneOf" => {
                sub.as_array_mut().unwrap().iter_mut().for_each(|s| tag(s, next));
            }
            "properties" | "dependentSchemas" | "$defs" => {
                sub.as_object_mut()
                    .unwrap()
                    .values_mut()
                    .for_each(|s| tag(s, next));
            }
            _ => {}
        }
    }
}

/// A value shaped after `schema` (often, not always, valid), from a small deterministic PRNG.
fn roll(rng: &mut u64, n: u64) -> u64 {
    *rng ^= *rng << 13;
    *rng ^= *rng >> 7;
    *rng ^= *rng << 17;
    *rng % n
}

fn instance(root: &Value, schema: &Value, rng: &mut u64, depth: usize) -> Value {
    if depth > 5 {
        return json!(null);
    }
    let Value::Object(map) = schema else {
        return json!("x");
    };
    if let Some(r) = map.get("$ref").and_then(Value::as_str) {
        let target = root.pointer(&r[1..]).unwrap();
        return instance(root, target, rng, depth + 1);
    }
    if let Some(Value::Array(options)) = map.get("enum") {
        return options[roll(rng, options.len() as u64) as usize].clone();
    }
    for key in ["allOf", "anyOf", "oneOf"] {
        if let Some(Value::Array(branches)) = map.get(key) {
            let pick = &branches[roll(rng, branches.len() as u64) as usize];
            let mut v = instance(root, pick, rng, depth + 1);
            if let (Some(Value::Object(properties)), Value::Object(members)) = (map.get("properties"), &mut v)
            {
                for (k, s) in properties {
                    if roll(rng, 2) == 0 {
                        members.insert(k.clone(), instance(root, s, rng, depth + 1));
                    }
                }
            }
            return v;
        }
    }
    match map.get("type").and_then(Value::as_str) {
        Some("string") => json!(["", "x", "yy", "zzzz"][roll(rng, 4) as usize]),
        Some("integer") => [json!(0), json!(1), json!(2), json!(1.0)][roll(rng, 4) as usize].clone(),
        Some("number") => [json!(0.5), json!(1), json!(3)][roll(rng, 3) as usize].clone(),
        Some("null") => json!(null),
        Some("boolean") => json!(roll(rng, 2) == 0),
        Some("array") => {
            let n = roll(rng, 4) as usize;
            let prefix = map.get("prefixItems").and_then(Value::as_array);
            (0..n)
                .map(|i| {
                    let s = prefix
                        .and_then(|p| p.get(i))
                        .or_else(|| map.get("items"))
                        .unwrap();
                    instance(root, s, rng, depth + 1)
                })
                .collect()
        }
        Some("object") => {
            let mut out = Map::new();
            if let Some(Value::Object(properties)) = map.get("properties") {
                for (k, s) in properties {
                    if roll(rng, 3) != 0 {
                        out.insert(k.clone(), instance(root, s, rng, depth + 1));
                    }
                }
            }
            Value::Object(out)
        }
        _ => json!(1),
    }
}

fn contract(input: &Value) -> Contract {
    registered(input).unwrap_or_else(|p| panic!("{input}: {p:?}"))
}

fn registered(input: &Value) -> Result<Contract, Vec<warrant_core::contract::LintProblem>> {
    Contract::from_document(json!({
        "name": "walked", "version": 1, "description": "d", "owner": "o", "effect": "read",
        "scopes": ["s"], "input": input,
        "output": {"type": "object", "additionalProperties": false},
    }))
}

/// `(instance location, x-id)` of every tagged node `jsonschema` collects annotations from.
fn oracle(contract: &Contract, value: &Value) -> BTreeSet<(String, u64)> {
    contract
        .input_schema()
        .evaluate(value)
        .iter_annotations()
        .filter_map(|a| {
            let id = a.annotations.value().get("x-id")?.as_u64()?;
            Some((a.instance_location.as_str().to_owned(), id))
        })
        .collect()
}

fn walked(contract: &Contract, input: &Value, value: &Value) -> BTreeSet<(String, u64)> {
    let annotations = contract.input_schema().walker().annotations_of(value).unwrap();
    let by_value: BTreeSet<_> = annotations
        .hits()
        .iter()
        .map(|h| {
            let node = input.pointer(h.node().pointer()).unwrap();
            (h.pointer().to_owned(), node["x-id"].as_u64().unwrap())
        })
        .collect();
    // The arguments-object entry point walks the same.
    let map = value.as_object().unwrap();
    let by_map: BTreeSet<_> = contract
        .input_schema()
        .annotations(map)
        .unwrap()
        .hits()
        .iter()
        .map(|h| (h.pointer().to_owned(), h.node().pointer().to_owned()))
        .collect();
    let from_value: BTreeSet<_> = annotations
        .hits()
        .iter()
        .map(|h| (h.pointer().to_owned(), h.node().pointer().to_owned()))
        .collect();
    assert_eq!(by_map, from_value);
    by_value
}

#[test]
fn the_walk_reports_exactly_the_annotations_jsonschema_collects() {
    // Proptest builds the value trees of this recursive strategy (nested unions, tuples and
    // options) on the stack, and a debug build's frames for them are large: about one run in
    // twenty drew a document deep enough to overflow a test thread's 2 MiB while generating it,
    // before any Warrant code ran (the backtrace is all `new_tree`). The property runs on a
    // thread with room for that.
    std::thread::Builder::new()
        .stack_size(64 << 20)
        .spawn(walk_property)
        .unwrap()
        .join()
        .unwrap();
}

fn walk_property() {
    let compared = AtomicUsize::new(0);
    let refused = AtomicUsize::new(0);
    let pairs = AtomicUsize::new(0);
    let mut runner = TestRunner::new(Config {
        // `PROPTEST_CASES` draws more for a longer search.
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|c| c.parse().ok())
            .unwrap_or(400),
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(
            &(document(), prop::collection::vec(any::<u64>(), 12)),
            |(input, seeds)| {
                // A drawn `$ref` may apply a schema to itself in place, which registration
                // refuses (`a_schema_that_applies_itself_in_place_is_refused`): for nothing else.
                let contract = match registered(&input) {
                    Ok(c) => c,
                    Err(problems) => {
                        prop_assert!(
                            problems.iter().all(|p| p.message().contains("in place")),
                            "schema {} refused: {:?}",
                            input,
                            problems
                        );
                        refused.fetch_add(1, Ordering::Relaxed);
                        return Ok(());
                    }
                };
                for seed in seeds {
                    let mut rng = seed | 1;
                    let value = instance(&input, &input, &mut rng, 0);
                    if !contract.input_schema().is_valid(&value) {
                        continue;
                    }
                    let expected = oracle(&contract, &value);
                    let got = walked(&contract, &input, &value);
                    prop_assert_eq!(&got, &expected, "schema {} instance {}", input, value);
                    compared.fetch_add(1, Ordering::Relaxed);
                    pairs.fetch_add(expected.len(), Ordering::Relaxed);
                }
                Ok(())
            },
        )
        .unwrap();
    let (compared, pairs) = (compared.into_inner(), pairs.into_inner());
    eprintln!(
        "compared {compared} valid instances, {pairs} annotated applications; {} schemas refused \
         as in-place cycles",
        refused.into_inner()
    );
    assert!(
        compared > 1000 && pairs > 2000,
        "too few valid instances: {compared}, {pairs}"
    );
}

/// A reference that re-applies a schema to the very value it is applied to (an in-place
/// cycle) has no defined meaning in JSON Schema 2020-12 (core §9.4.1): `jsonschema` resolves
/// the re-entry one way, the walk another, and the property above once found them reporting
/// different annotations for the same valid call. Such a schema is refused at registration,
/// with the `$ref` that closes the cycle; recursion that descends into the value is kept.
#[test]
fn a_schema_that_applies_itself_in_place_is_refused() {
    let object = |extra: Value| {
        let mut node = json!({
            "type": "object", "additionalProperties": false,
            "properties": {"a": {"type": "object", "additionalProperties": false,
                "properties": {"c": {"type": "object", "additionalProperties": false,
                    "x-warrant-sensitive": true}}}},
        });
        node.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        node
    };
    let refused = [
        // The case the property drew: `then` → `oneOf` → `allOf` → back to the root.
        (
            object(json!({"if": {"required": ["a"]}, "then": {"oneOf": [
                {"type": "object", "additionalProperties": false, "properties": {"b": {"const": 1}}},
                {"allOf": [{"$ref": "#"}]},
            ]}})),
            "/input/then/oneOf/1/allOf/0/$ref",
        ),
        (object(json!({"not": {"$ref": "#"}})), "/input/not/$ref"),
        (object(json!({"$ref": "#"})), "/input/$ref"),
        (
            object(json!({
                "$defs": {
                    "x": {"anyOf": [{"$ref": "#/$defs/y"}]},
                    "y": {"allOf": [{"$ref": "#/$defs/x"}]},
                },
                "allOf": [{"$ref": "#/$defs/x"}],
            })),
            "/input/$defs/y/allOf/0/$ref",
        ),
        (
            object(json!({"dependentSchemas": {"a": {"if": {"$ref": "#"}}}})),
            "/input/dependentSchemas/a/if/$ref",
        ),
    ];
    for (schema, at) in refused {
        let problems = registered(&schema)
            .err()
            .unwrap_or_else(|| panic!("{schema} was accepted"));
        assert!(
            problems
                .iter()
                .any(|p| p.pointer() == at && p.message().contains("in place")),
            "{schema}: {problems:?}"
        );
    }
    // The output schema is held to the same rule.
    let problems = Contract::from_document(json!({
        "name": "cyclic", "version": 1, "description": "d", "owner": "o", "effect": "read",
        "scopes": ["s"], "input": object(json!({})),
        "output": {"type": "object", "anyOf": [{"$ref": "#"}]},
    }))
    .expect_err("an output schema that applies itself in place was accepted");
    assert!(
        problems
            .iter()
            .any(|p| p.pointer() == "/output/anyOf/0/$ref" && p.message().contains("in place")),
        "{problems:?}"
    );
    // Recursion through `properties`, `items` and `additionalProperties` descends into the
    // value, and an acyclic chain of references is a plain alias: both stay allowed.
    for schema in [
        object(json!({"properties": {"a": {"$ref": "#"}}})),
        json!({"type": "object", "additionalProperties": false,
            "properties": {"kids": {"type": "array", "maxItems": 3, "items": {"$ref": "#"}}}}),
        object(
            json!({"$defs": {"x": {"$ref": "#/$defs/y"}, "y": {"type": "object",
            "additionalProperties": false}}, "allOf": [{"$ref": "#/$defs/x"}]}),
        ),
    ] {
        contract(&schema);
    }
}

/// The rule is one of registration: a contract an earlier version stored with such a schema
/// still loads from the store, as it behaved before (a server must not fail to start over it),
/// while registering it again is refused.
#[test]
fn a_stored_contract_that_applies_itself_in_place_still_loads() {
    let body = json!({
        "name": "cyclic", "version": 1, "description": "d", "owner": "o", "effect": "read",
        "scopes": ["s"],
        "input": {"type": "object", "additionalProperties": false,
            "properties": {"a": {"type": "string", "maxLength": 3}},
            "anyOf": [{"$ref": "#"}]},
        "output": {"type": "object", "additionalProperties": false},
    });
    assert!(Contract::from_document(body.clone()).is_err());
    let stored = warrant_core::records::StoredContract {
        namespace: warrant_core::contract::Namespace::Platform,
        name: "cyclic".into(),
        version: 1,
        content_id: format!("tool-contract@{}", warrant_core::canon::digest(&body)),
        body,
        binding: None,
        binding_digest: None,
        registered_at: time::OffsetDateTime::UNIX_EPOCH,
        retired_at: None,
    };
    let contract = Contract::from_stored(&stored).unwrap_or_else(|p| panic!("{p:?}"));
    assert!(contract.input_schema().is_valid(&json!({"a": "x"})));
    assert!(!contract.input_schema().is_valid(&json!({"a": "long"})));
}
