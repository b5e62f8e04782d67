//! Input schemas: the closure lint of PRODUCT §2, compilation with the strict integer rule,
//! and the mapping of schema violations onto the closed rejection codes.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use jsonschema::error::ValidationErrorKind;
use jsonschema::{Draft, Keyword, PatternOptions, Registry, ValidationError, ValidationOptions};
use serde_json::{Map, Value, json};

use super::Problems;
use super::walk::{self, Annotations, Walker};
use crate::decision::{RejectCode, Rejection};
use crate::json::push_pointer_segment;

/// The internal keyword carrying the strict integer rule; injected at compile time into a copy
/// of the schema, never part of the authored document.
const STRICT_INTEGER: &str = "x-warrant-integer";

/// The only `$schema` an input schema may declare.
pub const DRAFT_2020_12: &str = "https://json-schema.org/draft/2020-12/schema";

/// Keywords an authored schema may use. Anything else (a typo such as `maxLenght` would
/// silently open the schema) is refused; `x-` annotations are allowed.
const KNOWN_KEYWORDS: &[&str] = &[
    "$schema",
    "$ref",
    "$defs",
    "$comment",
    "definitions",
    "type",
    "enum",
    "const",
    "multipleOf",
    "maximum",
    "exclusiveMaximum",
    "minimum",
    "exclusiveMinimum",
    "maxLength",
    "minLength",
    "pattern",
    "format",
    "maxItems",
    "minItems",
    "uniqueItems",
    "maxContains",
    "minContains",
    "items",
    "prefixItems",
    "contains",
    "maxProperties",
    "minProperties",
    "required",
    "dependentRequired",
    "properties",
    "additionalProperties",
    "propertyNames",
    "dependentSchemas",
    "allOf",
    "anyOf",
    "oneOf",
    "not",
    "if",
    "then",
    "else",
    "unevaluatedItems",
    "unevaluatedProperties",
    "title",
    "description",
    "default",
    "examples",
    "deprecated",
    "readOnly",
    "writeOnly",
    "contentEncoding",
    "contentMediaType",
    "contentSchema",
];

/// Keywords refused because they change how references resolve (and could point outside
/// the document) or let a schema accept keys nobody declared.
const REFUSED_KEYWORDS: &[(&str, &str)] = &[
    ("$id", "`$id` is not allowed: input schemas are self-contained"),
    (
        "$anchor",
        "`$anchor` is not allowed: use `$defs` and `#/$defs/...` references",
    ),
    ("$dynamicRef", "`$dynamicRef` is not allowed in input schemas"),
    (
        "$dynamicAnchor",
        "`$dynamicAnchor` is not allowed in input schemas",
    ),
    ("$vocabulary", "`$vocabulary` is not allowed in input schemas"),
    (
        "patternProperties",
        "`patternProperties` opens the object to undeclared keys; declare each property",
    ),
];

/// Subschemas in positions that define which values are accepted; each must be closed.
const VALUE_SCHEMA: &[&str] = &["items", "then", "else"];
const VALUE_SCHEMA_LISTS: &[&str] = &["prefixItems", "allOf", "anyOf", "oneOf"];
const VALUE_SCHEMA_MAPS: &[&str] = &["properties", "$defs", "definitions"];
/// Subschemas that only constrain (a closed form is not required there).
const CONSTRAINT_SCHEMA: &[&str] = &[
    "not",
    "if",
    "contains",
    "propertyNames",
    "unevaluatedItems",
    "unevaluatedProperties",
    "contentSchema",
    "additionalProperties",
];
const CONSTRAINT_SCHEMA_MAPS: &[&str] = &["dependentSchemas"];

/// Lints an input schema rooted at `pointer` (normally `/input`): every problem is recorded
/// with the JSON pointer of the offending schema node.
pub(super) fn lint_input(schema: &Value, pointer: &str, problems: &mut Problems) {
    match schema {
        Value::Object(map) => {
            if map.get("type").and_then(Value::as_str) != Some("object") {
                problems.push(pointer, "the input schema must be `type: object`");
            }
            if let Some(declared) = map.get("$schema")
                && declared.as_str() != Some(DRAFT_2020_12)
            {
                problems.push(
                    &format!("{pointer}/$schema"),
                    &format!("only JSON Schema draft 2020-12 is supported ({DRAFT_2020_12})"),
                );
            }
        }
        _ => problems.push(pointer, "the input schema must be an object schema"),
    }
    lint_node(schema, pointer, true, problems);
    lint_placement(schema, pointer, problems);
}

/// An in-place edge: its target and, for a `$ref`, where the `$ref` is written.
type Edge = (String, Option<String>);

/// A node on the path of [`lint_in_place_cycles`]'s search: the `$ref` that entered it (if
/// any), its edges and the next one to follow.
struct Frame {
    node: String,
    entered_by: Option<String>,
    edges: Vec<Edge>,
    next: usize,
}

/// Subschemas applied to the very value their parent applies to.
const IN_PLACE: &[&str] = &["not", "if", "then", "else"];
const IN_PLACE_LISTS: &[&str] = &["allOf", "anyOf", "oneOf"];
const IN_PLACE_MAPS: &[&str] = &["dependentSchemas"];

/// Refuses every `$ref` that closes a cycle of in-place applicators: a schema that, through
/// `$ref`, `allOf`, `anyOf`, `oneOf`, `not`, `if`, `then`, `else` or `dependentSchemas`, applies
/// itself again to the same value. JSON Schema leaves the meaning of such a schema undefined
/// (2020-12 core §9.4.1, "Guarding Against Infinite Recursion"), and validators resolve the
/// re-entry each their own way (`jsonschema` takes it as passing), so whether a call is valid,
/// and which annotations guard it, would depend on an accident of the implementation. Recursion
/// that descends into the value (`properties`, `items`, ...) terminates and stays allowed.
///
/// One depth-first pass over the in-place graph (iterative: reference chains may be long);
/// each cycle is reported once, at the last `$ref` on the path that closes it.
pub(super) fn lint_in_place_cycles(schema: &Value, base: &str, problems: &mut Problems) {
    let mut positions = Vec::new();
    schema_positions(schema, String::new(), &mut positions);
    let nodes: HashMap<&str, &Value> = positions.iter().map(|(p, n)| (p.as_str(), *n)).collect();
    let edges = |pointer: &str| -> Vec<Edge> {
        let Some(Value::Object(map)) = nodes.get(pointer) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        if let Some((target, _)) = map
            .get("$ref")
            .and_then(Value::as_str)
            .and_then(|r| walk::resolve_local(schema, r))
        {
            out.push((target, Some(child(pointer, "$ref"))));
        }
        for key in IN_PLACE {
            if map.contains_key(*key) {
                out.push((child(pointer, key), None));
            }
        }
        for key in IN_PLACE_LISTS {
            if let Some(Value::Array(items)) = map.get(*key) {
                let list = child(pointer, key);
                out.extend((0..items.len()).map(|i| (child(&list, &i.to_string()), None)));
            }
        }
        for key in IN_PLACE_MAPS {
            if let Some(Value::Object(entries)) = map.get(*key) {
                let at = child(pointer, key);
                out.extend(entries.keys().map(|name| (child(&at, name), None)));
            }
        }
        out
    };
    // Nodes finished, and the path being explored.
    let mut done: HashSet<String> = HashSet::new();
    let mut on_path: HashMap<String, usize> = HashMap::new();
    let mut reported: HashSet<String> = HashSet::new();
    for (root, _) in &positions {
        if done.contains(root) {
            continue;
        }
        let mut path = vec![Frame {
            node: root.clone(),
            entered_by: None,
            edges: edges(root),
            next: 0,
        }];
        on_path.insert(root.clone(), 0);
        while let Some(frame) = path.last_mut() {
            let Some((target, via)) = frame.edges.get(frame.next).cloned() else {
                done.insert(frame.node.clone());
                on_path.remove(frame.node.as_str());
                path.pop();
                continue;
            };
            frame.next += 1;
            if let Some(&depth) = on_path.get(&target) {
                // A cycle: the edge just taken, or the last `$ref` on the path back to `target`
                // (every cycle has one: without references the schema is a tree).
                let closing = via.or_else(|| {
                    path.iter()
                        .skip(depth.saturating_add(1))
                        .rev()
                        .find_map(|f| f.entered_by.clone())
                });
                if let Some(at) = closing
                    && reported.insert(at.clone())
                {
                    problems.push(
                        &format!("{base}{at}"),
                        "this `$ref` applies a schema in place to the value it is already applied \
                         to (a cycle through $ref, allOf, anyOf, oneOf, not, if, then, else or \
                         dependentSchemas): JSON Schema leaves its meaning undefined; recurse \
                         through properties or items instead",
                    );
                }
            } else if !done.contains(&target) {
                on_path.insert(target.clone(), path.len());
                let edges = edges(&target);
                path.push(Frame {
                    node: target,
                    entered_by: via,
                    edges,
                    next: 0,
                });
            }
        }
    }
}

/// Annotations only where the walk ([`walk`]) applies them, and `$ref`s only to schemas: an
/// `x-warrant-*` annotation the walk never reaches would look like a guard or a redaction and
/// be neither.
fn lint_placement(schema: &Value, base: &str, problems: &mut Problems) {
    let walker = match Walker::plan(schema) {
        Ok(w) => w,
        Err(found) => {
            for problem in found {
                problems.push(&format!("{base}{}", problem.pointer), &problem.message);
            }
            return;
        }
    };
    let reached: HashSet<&str> = walker.nodes().map(walk::SchemaNode::pointer).collect();
    let mut positions = Vec::new();
    schema_positions(schema, String::new(), &mut positions);
    for (pointer, node) in &positions {
        if reached.contains(pointer.as_str()) {
            continue;
        }
        for key in [walk::ALLOWLIST, walk::SENSITIVE] {
            if node.as_object().is_some_and(|m| m.contains_key(key)) {
                problems.push(
                    &format!("{base}{pointer}/{key}"),
                    &format!(
                        "`{key}` never applies here: annotations apply only through properties, \
                         additionalProperties, items, prefixItems, $ref, allOf, anyOf, oneOf, then, \
                         else and dependentSchemas (not under not, if, contains, propertyNames, \
                         unevaluatedItems, unevaluatedProperties, contentSchema or an unreferenced \
                         $defs entry)"
                    ),
                );
            }
        }
    }
    let known: HashSet<&str> = positions.iter().map(|(p, _)| p.as_str()).collect();
    for reference in walker.references() {
        if !known.contains(reference.target.as_str()) {
            problems.push(
                &format!("{base}{}", reference.at),
                "`$ref` must point to a schema (`#`, or a node under properties, items, $defs, ...)",
            );
        }
    }
}

/// Every node in a schema position (value or constraint), with its pointer within `node`'s
/// document: the nodes [`lint_node`] visits.
fn schema_positions<'a>(node: &'a Value, pointer: String, out: &mut Vec<(String, &'a Value)>) {
    let Value::Object(map) = node else {
        if node.is_boolean() {
            out.push((pointer, node));
        }
        return;
    };
    for (key, sub) in map {
        let key = key.as_str();
        if VALUE_SCHEMA.contains(&key) || CONSTRAINT_SCHEMA.contains(&key) {
            schema_positions(sub, child(&pointer, key), out);
        } else if VALUE_SCHEMA_LISTS.contains(&key) {
            if let Value::Array(items) = sub {
                for (i, item) in items.iter().enumerate() {
                    schema_positions(item, child(&child(&pointer, key), &i.to_string()), out);
                }
            }
        } else if (VALUE_SCHEMA_MAPS.contains(&key) || CONSTRAINT_SCHEMA_MAPS.contains(&key))
            && let Value::Object(entries) = sub
        {
            for (name, item) in entries {
                schema_positions(item, child(&child(&pointer, key), name), out);
            }
        }
    }
    out.push((pointer, node));
}

fn lint_node(node: &Value, pointer: &str, must_be_closed: bool, problems: &mut Problems) {
    let map = match node {
        Value::Bool(false) => return,
        Value::Bool(true) => {
            if must_be_closed {
                problems.push(pointer, "schema `true` accepts any value");
            }
            return;
        }
        Value::Object(map) => map,
        _ => {
            problems.push(pointer, "a schema must be an object or a boolean");
            return;
        }
    };
    for key in map.keys() {
        if let Some((_, why)) = REFUSED_KEYWORDS.iter().find(|(k, _)| k == key) {
            problems.push(&child(pointer, key), why);
        } else if key == STRICT_INTEGER {
            problems.push(&child(pointer, key), "this keyword is reserved by Warrant");
        } else if !KNOWN_KEYWORDS.contains(&key.as_str()) && !key.starts_with("x-") {
            problems.push(
                &child(pointer, key),
                &format!("unknown schema keyword `{key}` (annotations must start with `x-`)"),
            );
        }
    }
    if let Some(reference) = map.get("$ref") {
        match reference.as_str() {
            Some(r) if r.starts_with('#') => {}
            _ => problems.push(
                &child(pointer, "$ref"),
                "only local references (`#/...`) are allowed",
            ),
        }
    }
    lint_annotations(map, pointer, problems);
    if must_be_closed {
        lint_closure(map, pointer, problems);
    }
    for key in VALUE_SCHEMA {
        if let Some(sub) = map.get(*key) {
            lint_node(sub, &child(pointer, key), must_be_closed, problems);
        }
    }
    for key in VALUE_SCHEMA_LISTS {
        if let Some(Value::Array(items)) = map.get(*key) {
            for (i, sub) in items.iter().enumerate() {
                lint_node(
                    sub,
                    &child(&child(pointer, key), &i.to_string()),
                    must_be_closed,
                    problems,
                );
            }
        }
    }
    for key in VALUE_SCHEMA_MAPS {
        if let Some(Value::Object(entries)) = map.get(*key) {
            for (name, sub) in entries {
                lint_node(sub, &child(&child(pointer, key), name), must_be_closed, problems);
            }
        }
    }
    for key in CONSTRAINT_SCHEMA {
        if let Some(sub) = map.get(*key) {
            lint_node(sub, &child(pointer, key), false, problems);
        }
    }
    for key in CONSTRAINT_SCHEMA_MAPS {
        if let Some(Value::Object(entries)) = map.get(*key) {
            for (name, sub) in entries {
                lint_node(sub, &child(&child(pointer, key), name), false, problems);
            }
        }
    }
}

fn lint_annotations(map: &Map<String, Value>, pointer: &str, problems: &mut Problems) {
    if let Some(v) = map.get("x-warrant-sensitive")
        && !v.is_boolean()
    {
        problems.push(&child(pointer, "x-warrant-sensitive"), "must be true or false");
    }
    if let Some(v) = map.get("x-warrant-allowlist")
        && !v.as_str().is_some_and(|s| super::is_identifier(s, 64))
    {
        problems.push(
            &child(pointer, "x-warrant-allowlist"),
            "must name an allow-list (lowercase letters, digits and `_`)",
        );
    }
}

/// The closure rules of PRODUCT §2 for one node in a value position.
fn lint_closure(map: &Map<String, Value>, pointer: &str, problems: &mut Problems) {
    let bounded_by_value = map.contains_key("enum") || map.contains_key("const");
    let types: Vec<&str> = match map.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
        Some(_) => {
            problems.push(
                &child(pointer, "type"),
                "`type` must be a type name or a list of them",
            );
            return;
        }
        None => Vec::new(),
    };
    let composed = ["$ref", "allOf", "anyOf", "oneOf"]
        .iter()
        .any(|k| map.contains_key(*k));
    if types.is_empty() && !bounded_by_value && !composed {
        problems.push(
            pointer,
            "schema accepts any value: declare `type`, `enum` or `const`",
        );
        return;
    }
    if bounded_by_value {
        return;
    }
    for ty in types {
        match ty {
            "object" => {
                if map.get("additionalProperties") != Some(&Value::Bool(false)) {
                    problems.push(pointer, "object schema must set `additionalProperties: false`");
                }
                if let Some(Value::Array(required)) = map.get("required") {
                    let declared = map.get("properties").and_then(Value::as_object);
                    for name in required.iter().filter_map(Value::as_str) {
                        if !declared.is_some_and(|d| d.contains_key(name)) {
                            problems.push(
                                &child(pointer, "required"),
                                &format!("required property `{name}` is not declared in `properties`"),
                            );
                        }
                    }
                }
            }
            "string" => {
                if !map.contains_key("maxLength") {
                    problems.push(pointer, "string schema must set `maxLength`");
                }
            }
            "array" => {
                if !map.contains_key("maxItems") {
                    problems.push(pointer, "array schema must set `maxItems`");
                }
                if !map.contains_key("items") {
                    problems.push(pointer, "array schema must declare `items`");
                }
            }
            "number" | "integer" => {
                if !(map.contains_key("minimum") || map.contains_key("exclusiveMinimum")) {
                    problems.push(
                        pointer,
                        &format!("{ty} schema must set `minimum` or `exclusiveMinimum`"),
                    );
                }
                if !(map.contains_key("maximum") || map.contains_key("exclusiveMaximum")) {
                    problems.push(
                        pointer,
                        &format!("{ty} schema must set `maximum` or `exclusiveMaximum`"),
                    );
                }
            }
            "boolean" | "null" => {}
            other => problems.push(&child(pointer, "type"), &format!("unknown type `{other}`")),
        }
    }
}

fn child(pointer: &str, segment: &str) -> String {
    let mut out = String::with_capacity(pointer.len() + segment.len() + 1);
    out.push_str(pointer);
    out.push('/');
    push_pointer_segment(&mut out, segment);
    out
}

/// A compiled schema validator with the strict integer rule, and the walk of its annotations.
#[derive(Clone)]
pub struct CompiledSchema {
    validator: Arc<jsonschema::Validator>,
    walker: Arc<Walker>,
}

/// The base URI the input schema is registered under while the walk's branch tests compile.
const INPUT_URI: &str = "urn:warrant:input";

/// The options of every validator of a contract schema: draft 2020-12, linear-time regexes,
/// formats asserted, no remote references, the strict integer rule.
fn options<'i>() -> ValidationOptions<'i> {
    jsonschema::options()
        .with_draft(Draft::Draft202012)
        .with_pattern_options(PatternOptions::regex())
        .should_validate_formats(true)
        .with_keyword(STRICT_INTEGER, |_, _, _| Ok(Box::new(StrictInteger)))
}

impl std::fmt::Debug for CompiledSchema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CompiledSchema")
    }
}

impl CompiledSchema {
    /// Compiles `schema` (draft 2020-12, linear-time regexes, formats asserted, no remote
    /// references) after injecting the strict integer rule into a copy of it.
    ///
    /// The walk of its annotations decides `anyOf`/`oneOf` branches and `if` with validators of
    /// the same options, compiled for those subschemas of the same (strict) copy: a branch
    /// applies exactly when the contract's own validator would say it validates.
    pub fn compile(schema: &Value) -> Result<Self, String> {
        let mut copy = schema.clone();
        inject_strict_integer(&mut copy);
        let describe = |e: ValidationError<'_>| {
            let at = e.schema_path().as_str().to_owned();
            if at.is_empty() {
                e.to_string()
            } else {
                format!("{e} (at {at})")
            }
        };
        let validator = options().build(&copy).map_err(describe)?;
        let mut walker = Walker::plan(schema).map_err(|problems| {
            problems
                .first()
                .map(|p| format!("{} (at {})", p.message, p.pointer))
                .unwrap_or_default()
        })?;
        if walker.needs_tests() {
            let registry = Registry::new()
                .draft(Draft::Draft202012)
                .add(INPUT_URI, &copy)
                .and_then(|r| r.prepare())
                .map_err(|e| e.to_string())?;
            let options = options().with_registry(&registry);
            walker.compile_tests(&mut |at| {
                let wrapper = json!({"$ref": format!("{INPUT_URI}#{}", Walker::fragment(at))});
                options.build(&wrapper).map(Arc::new).map_err(describe)
            })?;
        }
        Ok(CompiledSchema {
            validator: Arc::new(validator),
            walker: Arc::new(walker),
        })
    }

    /// Whether redaction can change a value this schema accepts (a node the walk reaches is
    /// marked sensitive); when not, the ledger copy of the arguments is taken as is.
    pub fn may_redact(&self) -> bool {
        self.walker.has_sensitive()
    }

    /// The walk of this schema's annotations.
    pub fn walker(&self) -> &Walker {
        &self.walker
    }

    /// Every annotated node applying to `arguments` (valid for this schema).
    ///
    /// # Errors
    /// `reject(schema, ARGUMENTS_TOO_COMPLEX)` when the walk overflows its bounds.
    pub fn annotations<'w, 'v>(
        &'w self,
        arguments: &'v Map<String, Value>,
    ) -> Result<Annotations<'w, 'v>, Rejection> {
        self.walker.annotations(arguments).map_err(|o| o.rejection())
    }

    /// `jsonschema`'s full evaluation of `instance` (annotations included): what the walk is
    /// held to in the property tests.
    pub fn evaluate(&self, instance: &Value) -> jsonschema::Evaluation {
        self.validator.evaluate(instance)
    }

    /// Whether `instance` is valid (no error details).
    pub fn is_valid(&self, instance: &Value) -> bool {
        self.validator.is_valid(instance)
    }

    /// Validates `instance`, mapping the first violation onto a schema-stage rejection whose
    /// detail names the rule but never echoes the value.
    pub fn check(&self, instance: &Value) -> Result<(), Rejection> {
        match self.validator.validate(instance) {
            Ok(()) => Ok(()),
            Err(error) => Err(map_error(&error)),
        }
    }
}

/// The strict integer rule: a number written with a fraction or exponent is not an integer,
/// even when its value is integral (`5.0`). The strict parser keeps that distinction by
/// producing float numbers for such literals.
struct StrictInteger;

impl<'i> Keyword<'i> for StrictInteger {
    fn validate(&self, instance: &'i Value) -> Result<(), ValidationError<'i>> {
        if Keyword::is_valid(self, instance) {
            Ok(())
        } else {
            Err(ValidationError::custom(
                "number with a fraction or exponent where an integer is required",
            ))
        }
    }

    fn is_valid(&self, instance: &'i Value) -> bool {
        !matches!(instance, Value::Number(n) if n.is_f64())
    }
}

/// Adds the strict integer keyword to every schema node whose `type` admits integers but not
/// all numbers. Walks schema positions only, never `enum`/`const`/`default` values.
fn inject_strict_integer(node: &mut Value) {
    let Value::Object(map) = node else { return };
    let integer_only = match map.get("type") {
        Some(Value::String(t)) => t == "integer",
        Some(Value::Array(ts)) => ts.iter().any(|t| t == "integer") && !ts.iter().any(|t| t == "number"),
        _ => false,
    };
    if integer_only {
        map.insert(STRICT_INTEGER.to_owned(), Value::Bool(true));
    }
    for (key, sub) in map.iter_mut() {
        let key = key.as_str();
        if VALUE_SCHEMA.contains(&key) || CONSTRAINT_SCHEMA.contains(&key) {
            inject_strict_integer(sub);
        } else if VALUE_SCHEMA_LISTS.contains(&key) {
            if let Value::Array(items) = sub {
                items.iter_mut().for_each(inject_strict_integer);
            }
        } else if (VALUE_SCHEMA_MAPS.contains(&key) || CONSTRAINT_SCHEMA_MAPS.contains(&key))
            && let Value::Object(entries) = sub
        {
            entries.values_mut().for_each(inject_strict_integer);
        }
    }
}

fn map_error(error: &ValidationError<'_>) -> Rejection {
    let path = error.instance_path().as_str().to_owned();
    let (code, detail, pointer) = match error.kind() {
        ValidationErrorKind::AdditionalProperties { unexpected } => {
            let name = unexpected.first().map(String::as_str).unwrap_or_default();
            (
                RejectCode::SchemaUnknownField,
                format!("unknown field `{}`", truncate(name)),
                child(&path, name),
            )
        }
        ValidationErrorKind::Required { property } => {
            let name = property.as_str().unwrap_or_default();
            (
                RejectCode::SchemaRequiredMissing,
                format!("missing required field `{name}`"),
                child(&path, name),
            )
        }
        ValidationErrorKind::Type { kind } => (
            RejectCode::SchemaTypeMismatch,
            format!(
                "expected {}, found {}",
                describe_type(kind),
                json_type(error.instance())
            ),
            path,
        ),
        ValidationErrorKind::Custom { keyword, .. } if keyword == STRICT_INTEGER => (
            RejectCode::SchemaNotInteger,
            "expected an integer, found a number written with a fraction or exponent".to_owned(),
            path,
        ),
        ValidationErrorKind::MaxLength { limit } => (
            RejectCode::SchemaStringTooLong,
            format!("string is longer than {limit} characters"),
            path,
        ),
        ValidationErrorKind::MinLength { limit } => (
            RejectCode::SchemaStringTooShort,
            format!("string is shorter than {limit} characters"),
            path,
        ),
        ValidationErrorKind::Maximum { limit } => (
            RejectCode::SchemaOutOfRange,
            format!("number is greater than {limit}"),
            path,
        ),
        ValidationErrorKind::ExclusiveMaximum { limit } => (
            RejectCode::SchemaOutOfRange,
            format!("number is not less than {limit}"),
            path,
        ),
        ValidationErrorKind::Minimum { limit } => (
            RejectCode::SchemaOutOfRange,
            format!("number is less than {limit}"),
            path,
        ),
        ValidationErrorKind::ExclusiveMinimum { limit } => (
            RejectCode::SchemaOutOfRange,
            format!("number is not greater than {limit}"),
            path,
        ),
        ValidationErrorKind::MultipleOf { .. } => (
            RejectCode::SchemaOutOfRange,
            "number is not a permitted multiple".to_owned(),
            path,
        ),
        ValidationErrorKind::Pattern { pattern } => (
            RejectCode::SchemaPatternMismatch,
            format!("string does not match the pattern `{}`", truncate(pattern)),
            path,
        ),
        ValidationErrorKind::Format { format } => (
            RejectCode::SchemaFormatMismatch,
            format!("string is not a valid `{format}`"),
            path,
        ),
        ValidationErrorKind::Enum { .. } | ValidationErrorKind::Constant { .. } => (
            RejectCode::SchemaEnumMismatch,
            "value is not one of the allowed values".to_owned(),
            path,
        ),
        ValidationErrorKind::MaxItems { limit } => (
            RejectCode::SchemaArrayLength,
            format!("array has more than {limit} items"),
            path,
        ),
        ValidationErrorKind::MinItems { limit } => (
            RejectCode::SchemaArrayLength,
            format!("array has fewer than {limit} items"),
            path,
        ),
        ValidationErrorKind::FalseSchema => (
            RejectCode::SchemaUnknownField,
            "no value is allowed here".to_owned(),
            path,
        ),
        ValidationErrorKind::UnevaluatedProperties { unexpected } => {
            let name = unexpected.first().map(String::as_str).unwrap_or_default();
            (
                RejectCode::SchemaUnknownField,
                format!("unknown field `{}`", truncate(name)),
                child(&path, name),
            )
        }
        _ => (
            RejectCode::SchemaViolation,
            "value violates the input schema".to_owned(),
            path,
        ),
    };
    Rejection::new(code, detail).at(pointer)
}

fn describe_type(kind: &jsonschema::error::TypeKind) -> String {
    match kind {
        jsonschema::error::TypeKind::Single(t) => t.to_string(),
        jsonschema::error::TypeKind::Multiple(set) => {
            let names: Vec<String> = set.iter().map(|t| t.to_string()).collect();
            names.join(" or ")
        }
    }
}

fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_f64() => "number",
        Value::Number(_) => "integer",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Field names in details come from untrusted input; keep them short.
fn truncate(text: &str) -> String {
    const MAX: usize = 64;
    if text.chars().count() <= MAX {
        text.to_owned()
    } else {
        let mut out: String = text.chars().take(MAX).collect();
        out.push('…');
        out
    }
}
