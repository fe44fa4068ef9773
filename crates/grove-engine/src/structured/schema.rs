//! JSON Schema compiled to the nodes the matcher walks: objects with their properties in the
//! schema's order, arrays with their item schema and counts, strings with their lengths,
//! numbers, literal values (`enum`, `const`, booleans, null) and unions (`anyOf`, `oneOf`, a
//! list of types). What it cannot enforce while the text is written (`pattern`, `format`,
//! numeric bounds, ...) is refused by name, never ignored.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::{Map, Value};

use super::pattern::{format_pattern, Pattern};

pub(crate) type NodeId = u32;

/// One value's schema.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Node {
    /// `{...}`: the listed properties in order, then (with no list) any keys whose values match
    /// `other_values`.
    Object {
        properties: Vec<Property>,
        other_values: Option<NodeId>,
    },
    Array {
        items: NodeId,
        min: u32,
        max: u32,
    },
    /// A string of `min..=max` characters (an escape is one), matching `pattern` if any.
    String {
        min: u32,
        max: u32,
        pattern: Option<Arc<Pattern>>,
    },
    /// A number; an integer may be held to `bounds` (least and greatest, both included).
    Number {
        integer: bool,
        bounds: Option<(i64, i64)>,
    },
    /// One of these values, each as compact JSON text.
    Literals(Vec<Box<[u8]>>),
    /// Any of these schemas.
    Union(Vec<NodeId>),
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Property {
    /// The key as JSON text, quotes included.
    pub key: Box<[u8]>,
    pub value: NodeId,
    pub required: bool,
}

/// Nodes every schema holds at fixed ids: any value, and the parts it is made of.
pub(crate) const ANY: NodeId = 0;
const ANY_OBJECT: NodeId = 1;
const ANY_ARRAY: NodeId = 2;
pub(crate) const ANY_STRING: NodeId = 3;
const ANY_NUMBER: NodeId = 4;
const ANY_LITERAL: NodeId = 5;

/// The most nodes a schema compiles to (a bound on the work one request can ask for).
const MAX_NODES: usize = 4096;

/// Keywords that describe a value without constraining it.
const ANNOTATIONS: &[&str] = &[
    "title",
    "description",
    "default",
    "examples",
    "$schema",
    "$id",
    "$comment",
    "deprecated",
    "readOnly",
    "writeOnly",
    "$defs",
    "definitions",
];

/// The keywords grove enforces, named in refusals.
pub const SUPPORTED_KEYWORDS: &str = "type, properties, required, additionalProperties, items, \
     minItems, maxItems, minLength, maxLength, pattern, format, minimum, maximum, \
     exclusiveMinimum, exclusiveMaximum (on integers), enum, const, anyOf, oneOf, \
     allOf (one schema), $ref (within the schema)";

/// The string formats grove enforces, named in refusals.
pub const SUPPORTED_FORMATS: &str = "date, time, date-time, uuid, ipv4, email";

/// A schema grove cannot enforce, with where in it and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("at `{at}`: {reason}")]
pub struct SchemaError {
    /// A JSON pointer into the schema (`#` is its root).
    pub at: String,
    pub reason: String,
}

/// A compiled schema: what text the matcher accepts.
#[derive(Debug, Clone, PartialEq)]
pub struct Schema {
    pub(crate) nodes: Vec<Node>,
    pub(crate) root: NodeId,
}

impl Schema {
    fn base() -> Vec<Node> {
        let literal = |text: &str| text.as_bytes().into();
        vec![
            Node::Union(vec![
                ANY_OBJECT,
                ANY_ARRAY,
                ANY_STRING,
                ANY_NUMBER,
                ANY_LITERAL,
            ]),
            Node::Object {
                properties: Vec::new(),
                other_values: Some(ANY),
            },
            Node::Array {
                items: ANY,
                min: 0,
                max: u32::MAX,
            },
            Node::String {
                min: 0,
                max: u32::MAX,
                pattern: None,
            },
            Node::Number {
                integer: false,
                bounds: None,
            },
            Node::Literals(vec![literal("true"), literal("false"), literal("null")]),
        ]
    }

    /// Any JSON value.
    pub fn any_value() -> Self {
        Self {
            nodes: Self::base(),
            root: ANY,
        }
    }

    /// Any JSON object (`response_format: {"type": "json_object"}`).
    pub fn any_object() -> Self {
        Self {
            nodes: Self::base(),
            root: ANY_OBJECT,
        }
    }

    /// Compiles `schema` (a JSON Schema; `$ref`s resolve within it).
    pub fn compile(schema: &Value) -> Result<Self, SchemaError> {
        let mut compiler = Compiler {
            root: schema,
            nodes: Self::base(),
            refs: HashMap::new(),
        };
        let root = compiler.node(schema, "#")?;
        let mut nodes = compiler.nodes;
        flatten_unions(&mut nodes)?;
        Ok(Self { nodes, root })
    }

    pub(crate) fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id as usize]
    }
}

struct Compiler<'s> {
    root: &'s Value,
    nodes: Vec<Node>,
    refs: HashMap<String, NodeId>,
}

fn error(at: &str, reason: impl Into<String>) -> SchemaError {
    SchemaError {
        at: at.to_owned(),
        reason: reason.into(),
    }
}

impl<'s> Compiler<'s> {
    fn push(&mut self, node: Node, at: &str) -> Result<NodeId, SchemaError> {
        if self.nodes.len() >= MAX_NODES {
            return Err(error(
                at,
                format!("the schema needs more than {MAX_NODES} nodes"),
            ));
        }
        self.nodes.push(node);
        Ok(self.nodes.len() as NodeId - 1)
    }

    fn node(&mut self, schema: &'s Value, at: &str) -> Result<NodeId, SchemaError> {
        let map = match schema {
            Value::Bool(true) => return Ok(ANY),
            Value::Object(map) => map,
            _ => return Err(error(at, "a schema must be an object or `true`")),
        };
        if let Some(keyword) = map.keys().find(|k| !known(k)) {
            return Err(error(
                at,
                format!("keyword `{keyword}` is not supported (supported: {SUPPORTED_KEYWORDS})"),
            ));
        }
        let constraints = || map.keys().filter(|k| !ANNOTATIONS.contains(&k.as_str()));
        let only = |keyword: &str| -> Result<(), SchemaError> {
            match constraints().find(|k| k.as_str() != keyword) {
                Some(other) => Err(error(
                    at,
                    format!("`{other}` beside `{keyword}` is not supported"),
                )),
                None => Ok(()),
            }
        };
        if let Some(reference) = map.get("$ref") {
            only("$ref")?;
            return self.reference(reference, at);
        }
        for keyword in ["anyOf", "oneOf"] {
            if let Some(alternatives) = map.get(keyword) {
                only(keyword)?;
                return self.union(alternatives, &format!("{at}/{keyword}"));
            }
        }
        if let Some(all) = map.get("allOf") {
            only("allOf")?;
            return match all.as_array().map(Vec::as_slice) {
                Some([one]) => self.node(one, &format!("{at}/allOf/0")),
                _ => Err(error(at, "`allOf` is supported with one schema only")),
            };
        }
        if let Some(value) = map.get("const") {
            return self.push(Node::Literals(vec![compact(value)]), at);
        }
        if let Some(values) = map.get("enum") {
            let values = values
                .as_array()
                .filter(|v| !v.is_empty())
                .ok_or_else(|| error(at, "`enum` must be a non-empty array"))?;
            return self.push(Node::Literals(values.iter().map(compact).collect()), at);
        }
        let types: Vec<&str> = match map.get("type") {
            None if map.contains_key("properties") => vec!["object"],
            None if map.contains_key("items") => vec!["array"],
            None => {
                // Without a type these would hold only for some values: say which.
                let typed = [
                    "pattern",
                    "format",
                    "minLength",
                    "maxLength",
                    "minItems",
                    "maxItems",
                ];
                if let Some(keyword) = typed.iter().find(|k| map.contains_key(**k)) {
                    return Err(error(at, format!("`{keyword}` needs a `type`")));
                }
                return Ok(ANY);
            }
            Some(Value::String(kind)) => vec![kind.as_str()],
            Some(Value::Array(kinds)) if !kinds.is_empty() => kinds
                .iter()
                .map(|k| k.as_str().ok_or_else(|| error(at, "`type` lists strings")))
                .collect::<Result<_, _>>()?,
            Some(_) => return Err(error(at, "`type` must be a string or a list of them")),
        };
        let typed = types
            .iter()
            .map(|kind| self.typed(kind, map, at))
            .collect::<Result<Vec<_>, _>>()?;
        match typed.as_slice() {
            [one] => Ok(*one),
            _ => self.push(Node::Union(typed), at),
        }
    }

    fn typed(
        &mut self,
        kind: &str,
        map: &'s Map<String, Value>,
        at: &str,
    ) -> Result<NodeId, SchemaError> {
        let count = |keyword: &str, default: u32| -> Result<u32, SchemaError> {
            match map.get(keyword) {
                None => Ok(default),
                Some(value) => value
                    .as_u64()
                    .map(|v| v.min(u64::from(u32::MAX)) as u32)
                    .ok_or_else(|| {
                        error(at, format!("`{keyword}` must be a non-negative integer"))
                    }),
            }
        };
        match kind {
            "object" => self.object(map, at),
            "array" => {
                let items = match map.get("items") {
                    None => ANY,
                    Some(items) => self.node(items, &format!("{at}/items"))?,
                };
                let (min, max) = (count("minItems", 0)?, count("maxItems", u32::MAX)?);
                self.bounded(Node::Array { items, min, max }, (min, max), at)
            }
            "string" => {
                let (min, max) = (count("minLength", 0)?, count("maxLength", u32::MAX)?);
                let pattern = string_pattern(map, at)?;
                self.bounded(Node::String { min, max, pattern }, (min, max), at)
            }
            "number" => match BOUNDS.iter().find(|k| map.contains_key(**k)) {
                Some(keyword) => Err(error(
                    at,
                    format!("`{keyword}` is supported on an `integer`, not a `number`"),
                )),
                None => Ok(ANY_NUMBER),
            },
            "integer" => {
                let bounds = integer_bounds(map, at)?;
                self.push(
                    Node::Number {
                        integer: true,
                        bounds,
                    },
                    at,
                )
            }
            "boolean" => {
                let literals = vec![b"true"[..].into(), b"false"[..].into()];
                self.push(Node::Literals(literals), at)
            }
            "null" => self.push(Node::Literals(vec![b"null"[..].into()]), at),
            other => Err(error(at, format!("unknown type `{other}`"))),
        }
    }

    fn bounded(
        &mut self,
        node: Node,
        (min, max): (u32, u32),
        at: &str,
    ) -> Result<NodeId, SchemaError> {
        if min > max {
            return Err(error(
                at,
                format!("the minimum {min} exceeds the maximum {max}"),
            ));
        }
        self.push(node, at)
    }

    fn object(&mut self, map: &'s Map<String, Value>, at: &str) -> Result<NodeId, SchemaError> {
        let required: Vec<&str> = match map.get("required") {
            None => Vec::new(),
            Some(Value::Array(names)) => names
                .iter()
                .map(|n| {
                    n.as_str()
                        .ok_or_else(|| error(at, "`required` lists strings"))
                })
                .collect::<Result<_, _>>()?,
            Some(_) => return Err(error(at, "`required` must be a list of strings")),
        };
        let listed = match map.get("properties") {
            None => None,
            Some(Value::Object(properties)) => Some(properties),
            Some(_) => return Err(error(at, "`properties` must be an object")),
        };
        let additional = map.get("additionalProperties");
        let Some(listed) = listed.filter(|p| !p.is_empty()) else {
            if let Some(name) = required.first() {
                return Err(error(
                    at,
                    format!("`{name}` is required but no property is listed"),
                ));
            }
            let other_values = match additional {
                None | Some(Value::Bool(true)) => Some(ANY),
                Some(Value::Bool(false)) => None,
                Some(schema) => Some(self.node(schema, &format!("{at}/additionalProperties"))?),
            };
            return self.push(
                Node::Object {
                    properties: Vec::new(),
                    other_values,
                },
                at,
            );
        };
        if !matches!(additional, None | Some(Value::Bool(false))) {
            return Err(error(
                at,
                "`additionalProperties` beside `properties` must be false or absent (only the \
                 listed properties are written)",
            ));
        }
        if let Some(name) = required.iter().find(|n| !listed.contains_key(**n)) {
            return Err(error(
                at,
                format!("`{name}` is required but not listed in `properties`"),
            ));
        }
        let mut properties = Vec::with_capacity(listed.len());
        for (name, schema) in listed {
            let value = self.node(schema, &format!("{at}/properties/{}", escape_pointer(name)))?;
            properties.push(Property {
                key: compact(&Value::String(name.clone())),
                value,
                required: required.contains(&name.as_str()),
            });
        }
        self.push(
            Node::Object {
                properties,
                other_values: None,
            },
            at,
        )
    }

    fn union(&mut self, alternatives: &'s Value, at: &str) -> Result<NodeId, SchemaError> {
        let alternatives = alternatives
            .as_array()
            .filter(|a| !a.is_empty())
            .ok_or_else(|| error(at, "must be a non-empty list of schemas"))?;
        let ids = alternatives
            .iter()
            .enumerate()
            .map(|(i, schema)| self.node(schema, &format!("{at}/{i}")))
            .collect::<Result<Vec<_>, _>>()?;
        self.push(Node::Union(ids), at)
    }

    /// A `$ref` within the schema (a JSON pointer from its root): compiled once, so a schema
    /// may refer to itself (a tree of nodes).
    fn reference(&mut self, reference: &Value, at: &str) -> Result<NodeId, SchemaError> {
        let Some(pointer) = reference.as_str().and_then(|r| r.strip_prefix('#')) else {
            return Err(error(
                at,
                "`$ref` must point within the schema (`#/$defs/...`)",
            ));
        };
        if let Some(&id) = self.refs.get(pointer) {
            return Ok(id);
        }
        let target = self
            .root
            .pointer(pointer)
            .ok_or_else(|| error(at, format!("`$ref` `#{pointer}` points at nothing")))?;
        // A placeholder first, so that the target's own references back to it resolve.
        let id = self.push(Node::Union(Vec::new()), at)?;
        self.refs.insert(pointer.to_owned(), id);
        let body = self.node(target, &format!("#{pointer}"))?;
        self.nodes[id as usize] = Node::Union(vec![body]);
        Ok(id)
    }
}

/// Makes every union list the non-union schemas it stands for, each once, so that reading a
/// first byte tries each once however unions nest; a union that reaches itself through
/// unions alone (`{"anyOf": [{"$ref": "#"}]}`) would never read a byte and is refused.
fn flatten_unions(nodes: &mut [Node]) -> Result<(), SchemaError> {
    fn leaves(
        nodes: &[Node],
        id: NodeId,
        open: &mut Vec<NodeId>,
        out: &mut Vec<NodeId>,
    ) -> Result<(), SchemaError> {
        let Node::Union(alternatives) = &nodes[id as usize] else {
            if !out.contains(&id) {
                out.push(id);
            }
            return Ok(());
        };
        if open.contains(&id) {
            return Err(error(
                "#",
                "a union (anyOf, oneOf, $ref) contains itself before any value",
            ));
        }
        open.push(id);
        for &alternative in alternatives {
            leaves(nodes, alternative, open, out)?;
        }
        open.pop();
        Ok(())
    }
    for id in 0..nodes.len() {
        if matches!(nodes[id], Node::Union(_)) {
            let mut flat = Vec::new();
            leaves(nodes, id as NodeId, &mut Vec::new(), &mut flat)?;
            nodes[id] = Node::Union(flat);
        }
    }
    Ok(())
}

/// The keywords that bound an integer.
const BOUNDS: [&str; 4] = ["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"];

/// An integer schema's least and greatest values (none without bounds).
fn integer_bounds(map: &Map<String, Value>, at: &str) -> Result<Option<(i64, i64)>, SchemaError> {
    if !BOUNDS.iter().any(|k| map.contains_key(*k)) {
        return Ok(None);
    }
    // Integers from -2^53 to 2^53, where a JSON number is still exact.
    const LIMIT: f64 = 9_007_199_254_740_992.0;
    let bound = |keyword: &str| -> Result<Option<f64>, SchemaError> {
        match map.get(keyword) {
            None => Ok(None),
            Some(value) => value
                .as_f64()
                .filter(|v| v.is_finite())
                .map(Some)
                .ok_or_else(|| error(at, format!("`{keyword}` must be a number"))),
        }
    };
    let mut low = -LIMIT;
    let mut high = LIMIT;
    if let Some(v) = bound("minimum")? {
        low = low.max(v.ceil());
    }
    if let Some(v) = bound("exclusiveMinimum")? {
        low = low.max(v.floor() + 1.0);
    }
    if let Some(v) = bound("maximum")? {
        high = high.min(v.floor());
    }
    if let Some(v) = bound("exclusiveMaximum")? {
        high = high.min(v.ceil() - 1.0);
    }
    let (low, high) = (low.max(-LIMIT), high.min(LIMIT));
    if low > high {
        return Err(error(at, format!("no integer lies in [{low}, {high}]")));
    }
    Ok(Some((low as i64, high as i64)))
}

/// A string schema's `pattern` or `format`, compiled.
fn string_pattern(map: &Map<String, Value>, at: &str) -> Result<Option<Arc<Pattern>>, SchemaError> {
    let source = match (map.get("pattern"), map.get("format")) {
        (None, None) => return Ok(None),
        (Some(_), Some(_)) => return Err(error(at, "`pattern` beside `format` is not supported")),
        (Some(Value::String(pattern)), None) => pattern.clone(),
        (Some(_), None) => return Err(error(at, "`pattern` must be a string")),
        (None, Some(format)) => format.as_str().and_then(format_pattern).ok_or_else(|| {
            error(
                at,
                format!("format {format} is not supported (supported: {SUPPORTED_FORMATS})"),
            )
        })?,
    };
    Pattern::new(&source)
        .map(|p| Some(Arc::new(p)))
        .map_err(|reason| error(at, reason))
}

fn known(keyword: &str) -> bool {
    ANNOTATIONS.contains(&keyword)
        || matches!(
            keyword,
            "type"
                | "properties"
                | "required"
                | "additionalProperties"
                | "items"
                | "minItems"
                | "maxItems"
                | "minLength"
                | "maxLength"
                | "pattern"
                | "format"
                | "minimum"
                | "maximum"
                | "exclusiveMinimum"
                | "exclusiveMaximum"
                | "enum"
                | "const"
                | "anyOf"
                | "oneOf"
                | "allOf"
                | "$ref"
        )
}

/// A value as compact JSON text (what the matcher accepts for a literal).
fn compact(value: &Value) -> Box<[u8]> {
    serde_json::to_vec(value)
        .expect("a JSON value serializes")
        .into()
}

fn escape_pointer(name: &str) -> String {
    name.replace('~', "~0").replace('/', "~1")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn refused(schema: Value) -> SchemaError {
        Schema::compile(&schema).unwrap_err()
    }

    #[test]
    fn what_cannot_be_enforced_is_refused_by_keyword_and_place() {
        let e = refused(
            json!({"type": "object", "properties": {"zip": {"type": "string", "pattern": "([0-9]+"}}}),
        );
        assert_eq!(e.at, "#/properties/zip");
        assert!(e.reason.contains("pattern `([0-9]+`"), "{e}");
        let e = refused(json!({"type": "string", "format": "hostname"}));
        assert!(e.reason.contains("format \"hostname\""), "{e}");
        let e = refused(json!({"pattern": "^a"}));
        assert!(e.reason.contains("`pattern` needs a `type`"), "{e}");
        let e = refused(json!({"type": "number", "minimum": 0}));
        assert!(e.reason.contains("`minimum`") && e.at == "#", "{e}");
        let e = refused(json!({"type": "integer", "minimum": 3, "exclusiveMaximum": 3}));
        assert!(e.reason.contains("no integer"), "{e}");
        let e = refused(json!({"type": "integer", "multipleOf": 3}));
        assert!(e.reason.contains("`multipleOf`"), "{e}");
        let e = refused(json!({"type": "object", "properties": {"a": {}}, "required": ["b"]}));
        assert!(e.reason.contains("`b` is required"), "{e}");
        let e = refused(json!({"$ref": "https://example.com/s.json"}));
        assert!(e.reason.contains("within the schema"), "{e}");
        let e = refused(json!({"type": "string", "minLength": 5, "maxLength": 2}));
        assert!(e.reason.contains("exceeds"), "{e}");
        let e = refused(
            json!({"type": "object", "properties": {"a": {}}, "additionalProperties": true}),
        );
        assert!(e.reason.contains("additionalProperties"), "{e}");
    }

    #[test]
    fn references_resolve_once_and_may_recurse() {
        let schema = json!({
            "$defs": {"tree": {"type": "object", "properties": {
                "name": {"type": "string"},
                "children": {"type": "array", "items": {"$ref": "#/$defs/tree"}}
            }, "required": ["name"]}},
            "$ref": "#/$defs/tree"
        });
        let compiled = Schema::compile(&schema).unwrap();
        let unions = compiled
            .nodes
            .iter()
            .filter(|n| matches!(n, Node::Union(v) if v.len() == 1))
            .count();
        assert_eq!(unions, 1, "{:?}", compiled.nodes);
    }
}
