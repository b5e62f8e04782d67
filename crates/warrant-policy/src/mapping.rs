//! The JSON Schema → Cedar type mapping of a contract's input, and the conversion of validated
//! arguments into a Cedar context that follows exactly the same mapping.
//!
//! Both directions are driven by one [`CedarType`] tree computed once per contract, so the
//! context type in the Cedar schema and the context value of a request cannot disagree: a
//! field the mapping leaves out of the type is also left out of the value.

use std::collections::BTreeMap;
use std::sync::Arc;

use cedar_policy::Context;
use cedar_policy_core::ast;
use serde_json::{Map, Value, json};
use smol_str::SmolStr;

/// How deep a schema (nested objects, arrays and `$ref` chains together) may go before the
/// node is treated as unmappable; the contract lint bounds documents already, this only keeps
/// the recursion bounded on its own.
const MAX_DEPTH: usize = 32;

/// A Cedar type that a JSON Schema node maps onto.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CedarType {
    /// `String`.
    String,
    /// `Long` (a JSON Schema `integer`).
    Long,
    /// `Boolean`.
    Boolean,
    /// `Set<T>` (a JSON Schema `array`).
    Set(Box<CedarType>),
    /// A record (a JSON Schema `object` with `properties`); attributes sorted by name.
    Record(Vec<Attribute>),
}

/// One attribute of a record type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Attribute {
    /// The property name (the context record's key, kept in Cedar's string type so a call
    /// copies it rather than converting it).
    pub(crate) name: SmolStr,
    /// Its type.
    pub(crate) ty: CedarType,
    /// Required in Cedar: listed in `required` and not nullable.
    pub(crate) required: bool,
}

impl CedarType {
    /// The type in Cedar's JSON schema format.
    pub(crate) fn to_schema_json(&self) -> Value {
        match self {
            CedarType::String => json!({ "type": "String" }),
            CedarType::Long => json!({ "type": "Long" }),
            CedarType::Boolean => json!({ "type": "Boolean" }),
            CedarType::Set(item) => json!({ "type": "Set", "element": item.to_schema_json() }),
            CedarType::Record(attributes) => record_schema_json(attributes),
        }
    }
}

/// A record type in Cedar's JSON schema format.
pub(crate) fn record_schema_json(attributes: &[Attribute]) -> Value {
    let mut out = Map::new();
    for attribute in attributes {
        let mut ty = attribute.ty.to_schema_json();
        if let Value::Object(map) = &mut ty {
            map.insert("required".into(), Value::Bool(attribute.required));
        }
        out.insert(attribute.name.to_string(), ty);
    }
    json!({ "type": "Record", "attributes": out })
}

/// Which argument values a context carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Values {
    /// Every mappable value: an invoke decides on the call's own arguments.
    All,
    /// Only values that are not under an `x-warrant-sensitive` node: a review decides on the
    /// approval's stored arguments, which hold sensitive values only as their keyed hashes
    /// (as the ledger does), so such a field is not in the review's context type at all and a
    /// review policy that names one is refused at load rather than comparing a hash.
    NotSensitive,
}

/// The context attributes of a contract: its input schema's properties, each mapped, the
/// unmappable ones (and, for [`Values::NotSensitive`], the sensitive ones) left out; sorted by
/// name.
pub(crate) fn context_attributes(input: Option<&Value>, values: Values) -> Vec<Attribute> {
    let Some(root) = input else {
        return Vec::new();
    };
    let mapper = Mapper { root, values };
    match mapper.node(root, 0, &mut Vec::new()) {
        Some(Shape::Typed(CedarType::Record(attributes), _)) => attributes,
        _ => Vec::new(),
    }
}

/// What a schema node admits, as far as Cedar is concerned.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Shape {
    /// Only `null`.
    Null,
    /// Values of one Cedar type; `true` when `null` is admitted too.
    Typed(CedarType, bool),
}

struct Mapper<'a> {
    root: &'a Value,
    values: Values,
}

impl<'a> Mapper<'a> {
    /// Maps one schema node; `None` when it is not representable in Cedar. `refs` holds the
    /// references being expanded, so a recursive schema is unmappable rather than endless.
    fn node(&self, node: &'a Value, depth: usize, refs: &mut Vec<&'a str>) -> Option<Shape> {
        if depth > MAX_DEPTH {
            return None;
        }
        let map = node.as_object()?;
        // A sensitive node anywhere in the walk (through `$ref`, a branch, an item or a
        // property) leaves the whole node out, as an unmappable one is: the redaction walk
        // follows the same applicators and redacts a value sensitive in any of them.
        if self.values == Values::NotSensitive && map.get("x-warrant-sensitive") == Some(&Value::Bool(true)) {
            return None;
        }
        let mut shapes = Vec::new();
        if let Some(reference) = map.get("$ref") {
            let reference = reference.as_str()?;
            if refs.contains(&reference) {
                return None;
            }
            let target = resolve(self.root, reference)?;
            refs.push(reference);
            let shape = self.node(target, depth + 1, refs);
            refs.pop();
            shapes.push(shape?);
        }
        if let Some(own) = self.own(map, depth, refs)? {
            shapes.push(own);
        }
        if let Some(all) = map.get("allOf") {
            for member in all.as_array()? {
                shapes.push(self.node(member, depth + 1, refs)?);
            }
        }
        for key in ["anyOf", "oneOf"] {
            if let Some(members) = map.get(key) {
                let mut union: Option<Shape> = None;
                for member in members.as_array()? {
                    let shape = self.node(member, depth + 1, refs)?;
                    union = Some(match union {
                        None => shape,
                        Some(acc) => either(acc, shape)?,
                    });
                }
                shapes.push(union?);
            }
        }
        let mut shapes = shapes.into_iter();
        let first = shapes.next()?;
        shapes.try_fold(first, both)
    }

    /// What the node's own `type`, `enum` and `const` admit: `Some(None)` when it declares none
    /// of them, `None` when they are not representable.
    fn own(
        &self,
        map: &'a Map<String, Value>,
        depth: usize,
        refs: &mut Vec<&'a str>,
    ) -> Option<Option<Shape>> {
        let mut shapes = Vec::new();
        if let Some(value) = map.get("const") {
            shapes.push(literals(std::slice::from_ref(value))?);
        }
        if let Some(values) = map.get("enum") {
            shapes.push(literals(values.as_array()?)?);
        }
        if let Some(declared) = map.get("type") {
            let names: Vec<&str> = match declared {
                Value::String(name) => vec![name.as_str()],
                Value::Array(names) => names.iter().map(Value::as_str).collect::<Option<_>>()?,
                _ => return None,
            };
            let nullable = names.contains(&"null");
            let mut others = names.iter().filter(|n| **n != "null");
            let shape = match (others.next(), others.next()) {
                (None, _) => Shape::Null,
                (Some(name), None) => Shape::Typed(self.typed(name, map, depth, refs)?, nullable),
                (Some(_), Some(_)) => return None,
            };
            shapes.push(shape);
        }
        let mut shapes = shapes.into_iter();
        let Some(first) = shapes.next() else {
            return Some(None);
        };
        Some(Some(shapes.try_fold(first, both)?))
    }

    /// The Cedar type of one JSON Schema type name on this node.
    fn typed(
        &self,
        name: &str,
        map: &'a Map<String, Value>,
        depth: usize,
        refs: &mut Vec<&'a str>,
    ) -> Option<CedarType> {
        match name {
            "string" => Some(CedarType::String),
            "integer" => Some(CedarType::Long),
            "boolean" => Some(CedarType::Boolean),
            "array" => {
                if map.contains_key("prefixItems") {
                    return None;
                }
                match self.node(map.get("items")?, depth + 1, refs)? {
                    Shape::Typed(item, false) => Some(CedarType::Set(Box::new(item))),
                    _ => None,
                }
            }
            "object" => {
                let required: Vec<&str> = map
                    .get("required")
                    .and_then(Value::as_array)
                    .map(|names| names.iter().filter_map(Value::as_str).collect())
                    .unwrap_or_default();
                let mut attributes = Vec::new();
                if let Some(properties) = map.get("properties").and_then(Value::as_object) {
                    for (property, schema) in properties {
                        if let Some(Shape::Typed(ty, nullable)) = self.node(schema, depth + 1, refs) {
                            attributes.push(Attribute {
                                name: SmolStr::from(property.as_str()),
                                ty,
                                required: !nullable && required.contains(&property.as_str()),
                            });
                        }
                    }
                }
                // Sorted, so the schema and the documentation do not depend on key order.
                attributes.sort_by(|a, b| a.name.cmp(&b.name));
                Some(CedarType::Record(attributes))
            }
            // `number` (floats have no Cedar type), `null` is handled by the caller, and any
            // other name is not a JSON Schema type.
            _ => None,
        }
    }
}

/// The shape of an `enum`/`const` list: all strings, all integers or all booleans, possibly
/// with `null`.
fn literals(values: &[Value]) -> Option<Shape> {
    let mut nullable = false;
    let mut ty: Option<CedarType> = None;
    for value in values {
        let this = match value {
            Value::Null => {
                nullable = true;
                continue;
            }
            Value::String(_) => CedarType::String,
            Value::Bool(_) => CedarType::Boolean,
            Value::Number(n) if n.as_i64().is_some() => CedarType::Long,
            _ => return None,
        };
        match &ty {
            None => ty = Some(this),
            Some(seen) if *seen == this => {}
            Some(_) => return None,
        }
    }
    match ty {
        Some(ty) => Some(Shape::Typed(ty, nullable)),
        None if nullable => Some(Shape::Null),
        None => None,
    }
}

/// Both shapes hold (`allOf`, `$ref` beside `type`): the types must agree; `null` only when
/// both admit it.
fn both(a: Shape, b: Shape) -> Option<Shape> {
    match (a, b) {
        (Shape::Null, Shape::Null)
        | (Shape::Null, Shape::Typed(_, true))
        | (Shape::Typed(_, true), Shape::Null) => Some(Shape::Null),
        (Shape::Typed(x, nx), Shape::Typed(y, ny)) if x == y => Some(Shape::Typed(x, nx && ny)),
        _ => None,
    }
}

/// Either shape holds (`anyOf`, `oneOf`): the types must agree; `null` when either admits it.
fn either(a: Shape, b: Shape) -> Option<Shape> {
    match (a, b) {
        (Shape::Null, Shape::Null) => Some(Shape::Null),
        (Shape::Null, Shape::Typed(t, _)) | (Shape::Typed(t, _), Shape::Null) => Some(Shape::Typed(t, true)),
        (Shape::Typed(x, nx), Shape::Typed(y, ny)) if x == y => Some(Shape::Typed(x, nx || ny)),
        _ => None,
    }
}

/// Resolves a local reference (`#`, `#/$defs/name`, any RFC 6901 pointer into the schema).
fn resolve<'a>(root: &'a Value, reference: &str) -> Option<&'a Value> {
    let fragment = reference.strip_prefix('#')?;
    let pointer = percent_decode(fragment)?;
    root.pointer(&pointer)
}

/// Decodes the `%XX` escapes a URI fragment may carry (a pointer segment with a space or `%`).
fn percent_decode(text: &str) -> Option<String> {
    if !text.contains('%') {
        return Some(text.to_owned());
    }
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        if b == b'%' {
            let hex = text.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Why the arguments could not be turned into a context. Never carries argument values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ConversionError(pub(crate) String);

/// Where a value sits in the arguments (`items.sku`), as a chain of borrowed names: it is
/// only turned into text when a conversion fails, so a call that converts allocates none.
#[derive(Clone, Copy)]
struct Path<'a> {
    parent: Option<&'a Path<'a>>,
    name: &'a str,
}

impl std::fmt::Display for Path<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some(parent) = self.parent {
            write!(f, "{parent}.")?;
        }
        f.write_str(self.name)
    }
}

/// Builds the Cedar context of a call from its validated arguments, following the mapping:
/// unmapped fields and `null`s are left out, arrays become sets, integers `Long`s.
///
/// The result is valid for the context type by construction — every attribute the type
/// requires is present (else an error), every value has its attribute's type (else an
/// error), and no attribute outside the type is emitted — so the engine does not ask Cedar
/// to validate it again on each call (tested against Cedar's validation in the engine).
///
/// The context is built directly as Cedar values (`cedar_policy_core::ast`), not as
/// restricted expressions that Cedar would then evaluate into those same values: the
/// arguments are already typed by the mapping, so there is nothing to evaluate, and the
/// evaluation cost more than the authorization's own policy evaluation. The result is equal
/// to what `Context::from_pairs` builds from the same arguments (tested below).
pub(crate) fn context(
    attributes: &[Attribute],
    arguments: &Map<String, Value>,
) -> Result<Context, ConversionError> {
    let attrs = record(attributes, arguments, None)?;
    Ok(Context::from(ast::Context::Value(Arc::new(attrs))))
}

fn record(
    attributes: &[Attribute],
    object: &Map<String, Value>,
    parent: Option<&Path<'_>>,
) -> Result<BTreeMap<SmolStr, ast::Value>, ConversionError> {
    let mut out = BTreeMap::new();
    let mut required = 0_usize;
    // Walk the arguments and find each one's attribute in the (sorted) list: comparing a few
    // names is cheaper than hashing every attribute name into the arguments' map.
    for (name, value) in object {
        let Ok(at) = attributes.binary_search_by(|a| a.name.as_str().cmp(name.as_str())) else {
            continue;
        };
        let Some(attribute) = attributes.get(at) else {
            continue;
        };
        let here = Path { parent, name };
        if let Some(value) = cedar_value(&attribute.ty, value, &here)? {
            required += usize::from(attribute.required);
            out.insert(attribute.name.clone(), value);
        }
    }
    // Argument names are unique (the strict parser refuses duplicates, and a map holds each
    // once), so counting the required attributes found is enough to know none is missing.
    if required < attributes.iter().filter(|a| a.required).count() {
        let missing = attributes
            .iter()
            .find(|a| a.required && !out.contains_key(&a.name))
            .map_or("?", |a| a.name.as_str());
        let here = Path {
            parent,
            name: missing,
        };
        return Err(ConversionError(format!(
            "required argument `{here}` is missing from the policy context"
        )));
    }
    Ok(out)
}

/// One value as a Cedar value; `None` for `null` (the attribute is then absent).
fn cedar_value(
    ty: &CedarType,
    value: &Value,
    path: &Path<'_>,
) -> Result<Option<ast::Value>, ConversionError> {
    let mismatch = || ConversionError(format!("argument `{path}` does not fit its policy type"));
    let kind = match (ty, value) {
        (_, Value::Null) => return Ok(None),
        (CedarType::String, Value::String(s)) => ast::ValueKind::Lit(ast::Literal::from(s.as_str())),
        (CedarType::Boolean, Value::Bool(b)) => ast::ValueKind::Lit(ast::Literal::from(*b)),
        (CedarType::Long, Value::Number(n)) => {
            let n = n.as_i64().ok_or_else(|| {
                ConversionError(format!("argument `{path}` is outside Cedar's 64-bit range"))
            })?;
            ast::ValueKind::Lit(ast::Literal::from(n))
        }
        (CedarType::Set(item), Value::Array(values)) => {
            let mut elements = Vec::with_capacity(values.len());
            for element in values {
                elements.push(cedar_value(item, element, path)?.ok_or_else(mismatch)?);
            }
            ast::ValueKind::set(elements)
        }
        (CedarType::Record(attributes), Value::Object(object)) => {
            ast::ValueKind::record_arc(Arc::new(record(attributes, object, Some(path))?))
        }
        _ => return Err(mismatch()),
    };
    Ok(Some(ast::Value::new(kind, None)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs(schema: Value) -> Vec<Attribute> {
        context_attributes(Some(&schema), Values::All)
    }

    fn attr(name: &str, ty: CedarType, required: bool) -> Attribute {
        Attribute {
            name: name.into(),
            ty,
            required,
        }
    }

    #[test]
    fn primitives_and_required() {
        let got = attrs(json!({
            "type": "object", "additionalProperties": false, "required": ["a", "b"],
            "properties": {
                "a": { "type": "string", "maxLength": 3 },
                "b": { "type": "integer", "minimum": 0, "maximum": 9 },
                "c": { "type": "boolean" },
                "d": { "type": "number", "minimum": 0, "maximum": 1 },
            }
        }));
        assert_eq!(
            got,
            vec![
                attr("a", CedarType::String, true),
                attr("b", CedarType::Long, true),
                attr("c", CedarType::Boolean, false),
            ]
        );
    }

    #[test]
    fn enums_consts_and_nullables() {
        let got = attrs(json!({
            "type": "object", "additionalProperties": false, "required": ["e", "n", "k"],
            "properties": {
                "e": { "enum": ["x", "y"] },
                "n": { "type": ["string", "null"], "maxLength": 3 },
                "k": { "const": 3 },
                "mixed": { "enum": ["x", 1] },
                "float": { "enum": [1.5] },
                "en": { "enum": [true, null] },
                "two": { "type": ["string", "integer"] },
                "onlynull": { "type": "null" },
            }
        }));
        assert_eq!(
            got,
            vec![
                attr("e", CedarType::String, true),
                attr("en", CedarType::Boolean, false),
                attr("k", CedarType::Long, true),
                attr("n", CedarType::String, false),
            ]
        );
    }

    #[test]
    fn arrays_objects_and_refs() {
        let got = attrs(json!({
            "type": "object", "additionalProperties": false,
            "$defs": { "item": { "type": "object", "additionalProperties": false, "required": ["sku"],
                                 "properties": { "sku": { "type": "string", "maxLength": 9 } } } },
            "required": ["items"],
            "properties": {
                "items": { "type": "array", "maxItems": 3, "items": { "$ref": "#/$defs/item" } },
                "tags": { "type": "array", "maxItems": 3, "items": { "type": "string", "maxLength": 3 } },
                "nullable_items": { "type": "array", "maxItems": 3, "items": { "type": ["string", "null"] } },
                "tuple": { "type": "array", "maxItems": 3, "prefixItems": [{ "type": "string" }],
                           "items": { "type": "string" } },
                "one": { "oneOf": [{ "type": "string", "maxLength": 1 }, { "type": "null" }] },
                "any": { "anyOf": [{ "type": "string", "maxLength": 1 }, { "type": "integer" }] },
                "all": { "allOf": [{ "$ref": "#/$defs/item" }, { "type": "object" }] },
            }
        }));
        let item = CedarType::Record(vec![attr("sku", CedarType::String, true)]);
        assert_eq!(
            got,
            vec![
                attr("items", CedarType::Set(Box::new(item)), true),
                attr("one", CedarType::String, false),
                attr("tags", CedarType::Set(Box::new(CedarType::String)), false),
            ]
        );
    }

    #[test]
    fn recursive_refs_are_unmappable() {
        let got = attrs(json!({
            "type": "object", "additionalProperties": false,
            "$defs": { "node": { "type": "object", "additionalProperties": false,
                                 "properties": { "next": { "$ref": "#/$defs/node" },
                                                 "v": { "type": "integer" } } } },
            "properties": { "head": { "$ref": "#/$defs/node" } }
        }));
        // The recursive `next` is left out of the record; the rest maps.
        assert_eq!(
            got,
            vec![attr(
                "head",
                CedarType::Record(vec![attr("v", CedarType::Long, false)]),
                false
            )]
        );
    }

    #[test]
    fn percent_decoding() {
        assert_eq!(percent_decode("/$defs/a%20b").as_deref(), Some("/$defs/a b"));
        assert_eq!(percent_decode("/x%2"), None);
    }

    #[test]
    fn conversion_follows_the_mapping() {
        let attributes = vec![
            attr("opt", CedarType::Boolean, false),
            attr("s", CedarType::String, true),
            attr("set", CedarType::Set(Box::new(CedarType::Long)), false),
        ];
        let args = json!({ "s": "x", "set": [1, 2], "opt": null, "unmapped": 1.5 });
        let ctx = context(&attributes, args.as_object().unwrap()).unwrap();
        assert_eq!(ctx.to_json_value().unwrap(), json!({ "s": "x", "set": [1, 2] }));
        let wrong = json!({ "s": 1 });
        let err = context(&attributes, wrong.as_object().unwrap()).unwrap_err();
        assert_eq!(err.0, "argument `s` does not fit its policy type");
        let big = json!({ "set": [u64::MAX] });
        assert!(context(&attributes, big.as_object().unwrap()).is_err());
        let nested = vec![attr(
            "r",
            CedarType::Record(vec![attr(
                "inner",
                CedarType::Set(Box::new(CedarType::String)),
                true,
            )]),
            true,
        )];
        let err = context(&nested, json!({ "r": { "inner": [1] } }).as_object().unwrap()).unwrap_err();
        assert_eq!(err.0, "argument `r.inner` does not fit its policy type");
    }

    /// The context as Cedar's public API builds it: restricted expressions, evaluated.
    fn reference_context(attributes: &[Attribute], arguments: &Map<String, Value>) -> Context {
        use cedar_policy::RestrictedExpression;
        fn expression(ty: &CedarType, value: &Value) -> Option<RestrictedExpression> {
            Some(match (ty, value) {
                (CedarType::String, Value::String(s)) => RestrictedExpression::new_string(s.clone()),
                (CedarType::Boolean, Value::Bool(b)) => RestrictedExpression::new_bool(*b),
                (CedarType::Long, Value::Number(n)) => RestrictedExpression::new_long(n.as_i64().unwrap()),
                (CedarType::Set(item), Value::Array(values)) => {
                    RestrictedExpression::new_set(values.iter().map(|v| expression(item, v).unwrap()))
                }
                (CedarType::Record(attributes), Value::Object(object)) => {
                    RestrictedExpression::new_record(pairs(attributes, object)).unwrap()
                }
                (_, Value::Null) => return None,
                _ => panic!("mismatch"),
            })
        }
        fn pairs(
            attributes: &[Attribute],
            object: &Map<String, Value>,
        ) -> Vec<(String, RestrictedExpression)> {
            attributes
                .iter()
                .filter_map(|a| {
                    Some((
                        a.name.to_string(),
                        expression(&a.ty, object.get(a.name.as_str())?)?,
                    ))
                })
                .collect()
        }
        Context::from_pairs(pairs(attributes, arguments)).unwrap()
    }

    #[test]
    fn direct_values_equal_evaluated_expressions() {
        let attributes = attrs(json!({
            "type": "object", "additionalProperties": false,
            "properties": {
                "s": { "type": "string", "maxLength": 99 },
                "n": { "type": "integer", "minimum": -9, "maximum": 9 },
                "b": { "type": ["boolean", "null"] },
                "tags": { "type": "array", "maxItems": 9, "items": { "type": "string", "maxLength": 9 } },
                "rows": { "type": "array", "maxItems": 9, "items": {
                    "type": "object", "additionalProperties": false,
                    "properties": { "id": { "type": "integer" }, "on": { "type": "boolean" } } } },
                "empty": { "type": "array", "maxItems": 9, "items": { "type": "integer" } },
                "nested": { "type": "object", "additionalProperties": false, "properties": {
                    "deep": { "type": "object", "additionalProperties": false,
                              "properties": { "x": { "type": "string" } } } } },
                "f": { "type": "number" }
            }
        }));
        let cases = [
            json!({}),
            json!({ "s": "a string longer than twenty-three bytes, stored out of line", "n": -3, "b": null }),
            json!({ "s": "", "b": true, "tags": ["b", "a", "b"], "empty": [], "f": 1.5 }),
            json!({ "rows": [{ "id": 2, "on": true }, { "id": 1 }], "nested": { "deep": { "x": "é" } } }),
            json!({ "nested": {}, "n": 9_007_199_254_740_991_i64 }),
        ];
        for args in cases {
            let args = args.as_object().unwrap();
            let direct = context(&attributes, args).unwrap();
            assert_eq!(direct, reference_context(&attributes, args), "{args:?}");
        }
    }
}
