//! What a JSON Schema says about the value at a path: which JSON types it may have, whether it
//! is always present, or that no such field can exist. Used to check a binding's source
//! against its target at compile time. Where the schema does not say plainly (combinators,
//! references outside the document), the answer is "unknown" and the check is left to the
//! pipeline's own validation when the step runs: the compiler refuses only what it can prove.

use serde_json::Value;

/// A set of JSON types.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Types(u8);

impl Types {
    /// `null`
    pub const NULL: Types = Types(1);
    /// `boolean`
    pub const BOOLEAN: Types = Types(2);
    /// `integer`
    pub const INTEGER: Types = Types(4);
    /// `number` (non-integer numbers; a schema's `number` admits integers too)
    pub const NUMBER: Types = Types(8);
    /// `string`
    pub const STRING: Types = Types(16);
    /// `array`
    pub const ARRAY: Types = Types(32);
    /// `object`
    pub const OBJECT: Types = Types(64);
    /// Every type.
    pub const ANY: Types = Types(127);
    /// The scalars a text binding may interpolate.
    pub const SCALAR: Types = Types(2 | 4 | 8 | 16);

    /// The union.
    pub fn or(self, other: Types) -> Types {
        Types(self.0 | other.0)
    }

    /// Whether every type of `self` is in `other`.
    pub fn within(self, other: Types) -> bool {
        self.0 & !other.0 == 0
    }

    fn named(name: &str) -> Types {
        match name {
            "null" => Types::NULL,
            "boolean" => Types::BOOLEAN,
            "integer" => Types::INTEGER,
            // A schema's `number` admits integers.
            "number" => Types::INTEGER.or(Types::NUMBER),
            "string" => Types::STRING,
            "array" => Types::ARRAY,
            "object" => Types::OBJECT,
            _ => Types::ANY,
        }
    }

    /// The type of one value.
    pub fn of(value: &Value) -> Types {
        match value {
            Value::Null => Types::NULL,
            Value::Bool(_) => Types::BOOLEAN,
            Value::Number(n) if n.is_i64() || n.is_u64() => Types::INTEGER,
            Value::Number(n) if n.as_f64().is_some_and(|f| f.fract() == 0.0) => Types::INTEGER,
            Value::Number(_) => Types::NUMBER,
            Value::String(_) => Types::STRING,
            Value::Array(_) => Types::ARRAY,
            Value::Object(_) => Types::OBJECT,
        }
    }
}

impl std::fmt::Display for Types {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names = [
            (Types::NULL, "null"),
            (Types::BOOLEAN, "boolean"),
            (Types::INTEGER, "integer"),
            (Types::NUMBER, "number"),
            (Types::STRING, "string"),
            (Types::ARRAY, "array"),
            (Types::OBJECT, "object"),
        ];
        let listed: Vec<&str> = names
            .iter()
            .filter(|(t, _)| t.within(*self))
            .map(|(_, n)| *n)
            .collect();
        f.write_str(&listed.join(" or "))
    }
}

/// What a schema says about one path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    /// No value can be there: a closed object has no such property.
    Missing,
    /// The types a value there may have, and whether it is always there.
    Known {
        /// Its possible types.
        types: Types,
        /// Whether every valid document has it (required all the way down).
        required: bool,
    },
    /// The schema does not say plainly.
    Unknown,
}

/// The field at `path` in `schema` (whose `$ref`s to `#/…` resolve within `schema` itself).
pub fn field(schema: &Value, path: &[String]) -> Field {
    let mut node = resolve(schema, schema, 0);
    let mut required = true;
    for segment in path {
        let Some(map) = node.and_then(Value::as_object) else {
            return Field::Unknown;
        };
        if ["anyOf", "oneOf", "allOf", "if", "$dynamicRef"]
            .iter()
            .any(|k| map.contains_key(*k))
        {
            return Field::Unknown;
        }
        let declared = map.get("properties").and_then(|p| p.get(segment));
        node = match declared {
            Some(child) => {
                required &= map
                    .get("required")
                    .and_then(Value::as_array)
                    .is_some_and(|r| r.iter().any(|n| n.as_str() == Some(segment.as_str())));
                resolve(schema, child, 0)
            }
            None => match map.get("additionalProperties") {
                Some(Value::Bool(false)) => return Field::Missing,
                Some(extra @ Value::Object(_)) => {
                    required = false;
                    resolve(schema, extra, 0)
                }
                _ => return Field::Unknown,
            },
        };
    }
    match node.map(types_of) {
        Some(Some(types)) => Field::Known { types, required },
        _ => Field::Unknown,
    }
}

/// The types of the items of the array at `path` in `schema` (`items`, when it says so plainly).
pub fn items(schema: &Value, path: &[String]) -> Option<Types> {
    let mut node = resolve(schema, schema, 0)?;
    for segment in path {
        node = resolve(schema, node.get("properties")?.get(segment)?, 0)?;
    }
    types_of(resolve(schema, node.get("items")?, 0)?)
}

/// The node a local `$ref` names (`#/$defs/x`, `#/definitions/x`, `#` …), following a few.
fn resolve<'s>(root: &'s Value, node: &'s Value, depth: u8) -> Option<&'s Value> {
    match node.get("$ref").and_then(Value::as_str) {
        None => Some(node),
        Some(_) if depth > 8 => None,
        Some(reference) => {
            let pointer = reference.strip_prefix('#')?;
            resolve(root, root.pointer(pointer)?, depth + 1)
        }
    }
}

/// The types a schema node allows, when it says so plainly.
fn types_of(node: &Value) -> Option<Types> {
    if let Value::Bool(true) = node {
        return Some(Types::ANY);
    }
    let map = node.as_object()?;
    if ["anyOf", "oneOf", "allOf", "not", "if", "$ref"]
        .iter()
        .any(|k| map.contains_key(*k))
    {
        return None;
    }
    if let Some(value) = map.get("const") {
        return Some(Types::of(value));
    }
    if let Some(values) = map.get("enum").and_then(Value::as_array) {
        return Some(values.iter().map(Types::of).fold(Types::default(), Types::or));
    }
    match map.get("type") {
        Some(Value::String(name)) => Some(Types::named(name)),
        Some(Value::Array(names)) => Some(
            names
                .iter()
                .filter_map(Value::as_str)
                .map(Types::named)
                .fold(Types::default(), Types::or),
        ),
        _ => Some(Types::ANY),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn path(p: &[&str]) -> Vec<String> {
        p.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn fields_are_typed_required_missing_or_unknown() {
        let schema = json!({
            "type": "object", "additionalProperties": false, "required": ["a", "o"],
            "properties": {
                "a": {"type": "integer"},
                "b": {"type": ["string", "null"]},
                "o": {"$ref": "#/$defs/o"},
                "e": {"enum": ["x", 1]},
                "u": {"anyOf": [{"type": "string"}, {"type": "integer"}]}
            },
            "$defs": {"o": {"type": "object", "additionalProperties": false, "required": ["n"], "properties": {"n": {"type": "number"}}}}
        });
        assert_eq!(
            field(&schema, &path(&["a"])),
            Field::Known {
                types: Types::INTEGER,
                required: true
            }
        );
        assert_eq!(
            field(&schema, &path(&["b"])),
            Field::Known {
                types: Types::STRING.or(Types::NULL),
                required: false
            }
        );
        assert_eq!(
            field(&schema, &path(&["o", "n"])),
            Field::Known {
                types: Types::INTEGER.or(Types::NUMBER),
                required: true
            }
        );
        assert_eq!(
            field(&schema, &path(&["e"])),
            Field::Known {
                types: Types::STRING.or(Types::INTEGER),
                required: false
            }
        );
        assert_eq!(field(&schema, &path(&["u"])), Field::Unknown);
        assert_eq!(field(&schema, &path(&["zz"])), Field::Missing);
        assert_eq!(field(&schema, &path(&["o", "zz"])), Field::Missing);
        assert_eq!(field(&json!({"type": "object"}), &path(&["zz"])), Field::Unknown);
        assert!(Types::INTEGER.within(Types::named("number")));
        assert!(!Types::named("number").within(Types::INTEGER));
    }
}
