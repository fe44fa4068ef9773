//! OpenAI's function calling on chat: `tools` go to the model's chat template (which writes
//! them into the prompt), and the calls come back out of the generated text, where the model
//! writes each as `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (the Hermes form
//! Qwen2.5's and Qwen3's templates ask for, which vLLM's `hermes` parser reads). `tool_choice`:
//! `"auto"` (the default with tools: the model decides), `"none"` (tools not offered),
//! `"required"` or one function by name: then the text is held to a call's JSON
//! (`{"name": ..., "arguments": ...}` with the function's `parameters` as the arguments'
//! schema) by the engine's structured output, so the call is always well formed.

use std::sync::Arc;

use grove_core::ValidationError;
use grove_engine::structured::{Grammar, Schema, TokenBytes};
use serde_json::{json, Map, Value};

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

/// What the model may do with the tools.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ToolChoice {
    /// It may call tools or answer in text.
    Auto,
    /// Its answer is one call of one of the tools.
    Required,
    /// Its answer is one call of this function.
    Named(String),
}

/// A request's tools: their definitions as the template reads them, and the choice.
#[derive(Debug, Clone)]
pub(crate) struct Tools {
    pub definitions: Vec<Value>,
    pub choice: ToolChoice,
}

/// One call the model made: the function and its arguments as JSON text.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ToolCall {
    pub name: String,
    pub arguments: String,
}

fn wrong(field: impl Into<String>, reason: impl Into<String>) -> ValidationError {
    ValidationError::WrongType {
        field: field.into(),
        reason: reason.into(),
    }
}

/// The request's `tools` and `tool_choice`; `None`: no tools offered.
pub(crate) fn tools(
    tools: Option<Value>,
    choice: Option<Value>,
) -> Result<Option<Tools>, ValidationError> {
    let definitions = match tools {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(tools)) => tools,
        Some(_) => return Err(wrong("tools", "must be a list of tools")),
    };
    let mut names = Vec::with_capacity(definitions.len());
    for (index, tool) in definitions.iter().enumerate() {
        names.push(function_name(index, tool)?);
    }
    let choice = match choice {
        None | Some(Value::Null) => None,
        Some(Value::String(choice)) => match choice.as_str() {
            "none" => return Ok(None),
            "auto" => Some(ToolChoice::Auto),
            "required" => Some(ToolChoice::Required),
            _ => return Err(unsupported_choice()),
        },
        Some(Value::Object(choice)) => {
            let name = choice
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .ok_or_else(|| {
                    wrong(
                        "tool_choice",
                        "names a function: {\"type\": \"function\", \"function\": {\"name\": ...}}",
                    )
                })?;
            if !names.contains(&name) {
                return Err(wrong(
                    "tool_choice",
                    format!("`{name}` is not one of the request's tools"),
                ));
            }
            Some(ToolChoice::Named(name.to_owned()))
        }
        Some(_) => return Err(unsupported_choice()),
    };
    if definitions.is_empty() {
        return match choice {
            None => Ok(None),
            Some(_) => Err(wrong("tool_choice", "needs `tools`")),
        };
    }
    Ok(Some(Tools {
        definitions,
        choice: choice.unwrap_or(ToolChoice::Auto),
    }))
}

fn unsupported_choice() -> ValidationError {
    ValidationError::Unsupported {
        field: "tool_choice",
        allowed: "\"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}",
    }
}

/// Tool `index`'s function name, checked as OpenAI checks it.
fn function_name(index: usize, tool: &Value) -> Result<&str, ValidationError> {
    if tool.get("type").and_then(Value::as_str) != Some("function") {
        return Err(ValidationError::Unsupported {
            field: "tools",
            allowed: "tools of type \"function\"",
        });
    }
    let function = tool
        .get("function")
        .filter(|f| f.is_object())
        .ok_or_else(|| ValidationError::Missing {
            field: format!("tools[{index}].function"),
        })?;
    let name = function
        .get("name")
        .and_then(Value::as_str)
        .ok_or_else(|| ValidationError::Missing {
            field: format!("tools[{index}].function.name"),
        })?;
    let valid = (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if !valid {
        return Err(wrong(
            format!("tools[{index}].function.name"),
            "1-64 letters, digits, underscores or dashes",
        ));
    }
    match function.get("parameters") {
        None | Some(Value::Object(_)) => Ok(name),
        Some(_) => Err(wrong(
            format!("tools[{index}].function.parameters"),
            "must be a JSON Schema object",
        )),
    }
}

impl Tools {
    /// The schema a required call's text is held to (`None` where the model chooses).
    pub fn grammar(
        &self,
        vocab: Option<&Arc<TokenBytes>>,
    ) -> Result<Option<Grammar>, ValidationError> {
        let (indices, calls): (Vec<usize>, Vec<Value>) = self
            .definitions
            .iter()
            .enumerate()
            .filter_map(|(index, tool)| {
                let function = &tool["function"];
                let name = function["name"].as_str()?;
                match &self.choice {
                    ToolChoice::Auto => None,
                    ToolChoice::Named(wanted) if wanted != name => None,
                    _ => Some((index, name, function.get("parameters"))),
                }
            })
            .enumerate()
            .map(|(at, (index, name, parameters))| {
                let mut arguments = parameters.cloned().unwrap_or(json!({"type": "object"}));
                // The parameters' own `$ref`s (`#/$defs/...`) point into them where they now sit.
                rebase_refs(
                    &mut arguments,
                    &format!("#/anyOf/{at}/properties/arguments"),
                );
                let call = json!({"type": "object",
                    "properties": {"name": {"const": name}, "arguments": arguments},
                    "required": ["name", "arguments"]});
                (index, call)
            })
            .unzip();
        if calls.is_empty() {
            return Ok(None);
        }
        let schema = Schema::compile(&json!({"anyOf": calls})).map_err(|e| {
            // A refusal names the tool whose parameters it is in.
            let tool = e.at.strip_prefix("#/anyOf/").and_then(|rest| {
                let (at, _) = rest.split_once('/')?;
                indices.get(at.parse::<usize>().ok()?)
            });
            match tool {
                Some(index) => wrong(format!("tools[{index}].function.parameters"), e.to_string()),
                None => wrong("tools", e.to_string()),
            }
        })?;
        let vocab = vocab.ok_or(ValidationError::Unsupported {
            field: "tool_choice",
            allowed: "\"auto\" or \"none\" for a model without a tokenizer",
        })?;
        Ok(Some(Grammar::new(schema, Arc::clone(vocab))))
    }

    /// The calls in the generated `text`, and the text around them (`None` when only calls
    /// were written); `None` when it holds no well-formed call.
    pub fn parse(&self, text: &str) -> Option<(Option<String>, Vec<ToolCall>)> {
        if self.choice != ToolChoice::Auto {
            return Some((None, vec![call(text)?]));
        }
        let mut calls = Vec::new();
        let mut content = String::new();
        let mut rest = text;
        while let Some(start) = rest.find(OPEN) {
            content.push_str(&rest[..start]);
            let body = &rest[start + OPEN.len()..];
            // A last call the token limit cut before its closing tag is read to the end.
            let (inside, after) = match body.find(CLOSE) {
                Some(end) => (&body[..end], &body[end + CLOSE.len()..]),
                None => (body, ""),
            };
            calls.push(call(inside)?);
            rest = after;
        }
        content.push_str(rest);
        if calls.is_empty() {
            return self.bare_calls(text).map(|calls| (None, calls));
        }
        let content = content.trim();
        Some(((!content.is_empty()).then(|| content.to_owned()), calls))
    }
}

/// Puts `prefix` before every local `$ref` in `schema` (values that are data, not schemas,
/// left alone).
fn rebase_refs(schema: &mut Value, prefix: &str) {
    match schema {
        Value::Object(map) => {
            for (key, value) in map.iter_mut() {
                match (key.as_str(), value) {
                    ("$ref", Value::String(target)) if target.starts_with('#') => {
                        *target = format!("{prefix}{}", &target[1..]);
                    }
                    ("const" | "enum" | "default" | "examples", _) => {}
                    (_, value) => rebase_refs(value, prefix),
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|item| rebase_refs(item, prefix)),
        _ => {}
    }
}

impl Tools {
    /// Calls written without the tags: the whole text one call's JSON object (or a list of
    /// them), perhaps in a Markdown code fence, naming one of the tools, its arguments under
    /// `arguments` or `parameters` (Llama 3's form). Small models often write their call so
    /// (Qwen2.5-Coder-1.5B fences it); a text that merely is JSON names no tool.
    fn bare_calls(&self, text: &str) -> Option<Vec<ToolCall>> {
        let mut body = text.trim();
        if let Some(fenced) = body.strip_prefix("```").and_then(|b| b.strip_suffix("```")) {
            // The fence's language tag, if any, ends its first line.
            body = fenced.split_once('\n').map_or(fenced, |(tag, rest)| {
                if tag.trim().chars().all(|c| c.is_ascii_alphanumeric()) {
                    rest
                } else {
                    fenced
                }
            });
        }
        let objects = match serde_json::from_str::<Value>(body.trim()).ok()? {
            Value::Array(items) => items,
            object @ Value::Object(_) => vec![object],
            _ => return None,
        };
        let names: Vec<&str> = self
            .definitions
            .iter()
            .filter_map(|t| t["function"]["name"].as_str())
            .collect();
        objects
            .iter()
            .map(|object| {
                let name = object.get("name")?.as_str()?;
                let arguments = object
                    .get("arguments")
                    .or_else(|| object.get("parameters"))?;
                let arguments = match arguments {
                    Value::Object(_) => arguments.to_string(),
                    Value::String(text) => text.clone(),
                    _ => return None,
                };
                names.contains(&name).then(|| ToolCall {
                    name: name.to_owned(),
                    arguments,
                })
            })
            .collect::<Option<Vec<_>>>()
            .filter(|calls| !calls.is_empty())
    }
}

/// One call's JSON, `{"name": ..., "arguments": {...}}` (arguments as an object, or as the
/// JSON text of one).
fn call(text: &str) -> Option<ToolCall> {
    let value: Map<String, Value> = serde_json::from_str(text.trim()).ok()?;
    let name = value.get("name")?.as_str()?.to_owned();
    let arguments = match value.get("arguments") {
        None => "{}".to_owned(),
        Some(Value::String(text)) => text.clone(),
        Some(arguments) => arguments.to_string(),
    };
    Some(ToolCall { name, arguments })
}

/// An assistant message's `tool_calls` for its template: OpenAI's list, each call's
/// `arguments` (JSON text) parsed, as the templates write them with `tojson`.
pub(crate) fn message_calls(index: usize, calls: Value) -> Result<Value, ValidationError> {
    let Value::Array(mut calls) = calls else {
        return Err(wrong(
            format!("messages[{index}].tool_calls"),
            "must be a list",
        ));
    };
    for (at, call) in calls.iter_mut().enumerate() {
        let field = |name: &str| format!("messages[{index}].tool_calls[{at}].{name}");
        let function = call
            .get_mut("function")
            .filter(|f| f.is_object())
            .ok_or_else(|| ValidationError::Missing {
                field: field("function"),
            })?;
        if !function.get("name").is_some_and(Value::is_string) {
            return Err(ValidationError::Missing {
                field: field("function.name"),
            });
        }
        if let Some(Value::String(text)) = function.get("arguments") {
            // Text that is not JSON goes to the template as it came.
            if let Ok(parsed) = serde_json::from_str::<Value>(text) {
                function["arguments"] = parsed;
            }
        }
    }
    Ok(Value::Array(calls))
}

/// Text a stream may send before a call could begin: all of `pending` but a last part that
/// could be the start of `<tool_call>`, or what comes before the tag once it is there
/// (`true`: the tag came).
pub(crate) fn releasable(pending: &str) -> (usize, bool) {
    if let Some(start) = pending.find(OPEN) {
        return (start, true);
    }
    let held = (1..OPEN.len())
        .rev()
        .find(|&n| pending.len() >= n && pending.ends_with(&OPEN[..n]))
        .unwrap_or(0);
    (pending.len() - held, false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn auto() -> Tools {
        Tools {
            definitions: vec![json!({"type": "function", "function": {"name": "get_weather"}})],
            choice: ToolChoice::Auto,
        }
    }

    #[test]
    fn calls_are_read_from_hermes_blocks_and_the_text_around_them() {
        let text = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>";
        let (content, calls) = auto().parse(text).unwrap();
        assert_eq!(content.as_deref(), Some("Let me check."));
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].name, "get_weather");
        assert_eq!(calls[0].arguments, r#"{"city":"Paris"}"#);
        assert_eq!(calls[1].arguments, "{}");
        // Cut before its closing tag, a call still reads; a broken one leaves plain text.
        let (content, calls) = auto().parse("<tool_call>{\"name\": \"now\"}").unwrap();
        assert_eq!((content, calls.len()), (None, 1));
        assert!(auto().parse("<tool_call>{\"name\": ").is_none());
        assert!(auto().parse("no calls here").is_none());
    }

    #[test]
    fn a_bare_call_naming_a_tool_is_a_call_and_other_json_is_text() {
        let fenced = "```json\n{\n  \"name\": \"get_weather\",\n  \"arguments\": {\"city\": \"Paris\"}\n}\n```";
        let (content, calls) = auto().parse(fenced).unwrap();
        assert_eq!(content, None);
        assert_eq!(calls[0].name, "get_weather");
        assert_eq!(calls[0].arguments, r#"{"city":"Paris"}"#);
        let llama = r#"{"name": "get_weather", "parameters": {"city": "Oslo"}}"#;
        assert_eq!(
            auto().parse(llama).unwrap().1[0].arguments,
            r#"{"city":"Oslo"}"#
        );
        // JSON that names no tool, or has no arguments, stays text.
        assert!(auto()
            .parse(r#"{"name": "Ada", "arguments": {}}"#)
            .is_none());
        assert!(auto().parse(r#"{"name": "get_weather"}"#).is_none());
        assert!(auto()
            .parse("Here: {\"name\": \"get_weather\", \"arguments\": {}}")
            .is_none());
    }

    #[test]
    fn a_stream_holds_back_what_could_begin_a_call() {
        assert_eq!(releasable("Sure"), (4, false));
        assert_eq!(releasable("Sure <tool"), (5, false));
        assert_eq!(releasable("a < b"), (5, false));
        assert_eq!(releasable("x<tool_call>{"), (1, true));
    }

    #[test]
    fn choices_and_definitions_are_checked_by_name() {
        let weather = json!([{"type": "function", "function": {"name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]);
        let field = |error: ValidationError| error.field(grove_core::Naming::OpenAi).into_owned();
        let named = json!({"type": "function", "function": {"name": "get_weather"}});
        let parsed = tools(Some(weather.clone()), Some(named)).unwrap().unwrap();
        assert_eq!(parsed.choice, ToolChoice::Named("get_weather".into()));
        assert!(tools(Some(weather.clone()), Some(json!("none")))
            .unwrap()
            .is_none());
        let other = json!({"type": "function", "function": {"name": "other"}});
        assert_eq!(
            field(tools(Some(weather.clone()), Some(other)).unwrap_err()),
            "tool_choice"
        );
        assert_eq!(
            field(tools(None, Some(json!("required"))).unwrap_err()),
            "tool_choice"
        );
        let unnamed = json!([{"type": "function", "function": {}}]);
        assert_eq!(
            field(tools(Some(unnamed), None).unwrap_err()),
            "tools[0].function.name"
        );
        let bounded = json!([{"type": "function", "function": {"name": "f", "parameters":
            {"type": "object", "properties": {"x": {"type": "integer", "multipleOf": 5}}}}}]);
        let required = tools(Some(bounded), Some(json!("required")))
            .unwrap()
            .unwrap();
        let error = required.grammar(None).unwrap_err();
        assert_eq!(field(error), "tools[0].function.parameters");
    }

    #[test]
    fn a_required_call_keeps_its_parameters_references() {
        use grove_engine::structured::Matcher;
        // Pydantic writes nested models as `$defs` and `$ref`s from the parameters' root.
        let definitions = json!([
            {"type": "function", "function": {"name": "noop", "parameters": {"type": "object"}}},
            {"type": "function", "function": {"name": "move", "parameters": {
                "$defs": {"Point": {"type": "object", "properties": {"x": {"type": "integer"}},
                                    "required": ["x"]}},
                "type": "object", "properties": {"to": {"$ref": "#/$defs/Point"}},
                "required": ["to"]}}}
        ]);
        let required = tools(Some(definitions), Some(json!("required")))
            .unwrap()
            .unwrap();
        let vocab = Arc::new(TokenBytes::new(vec![Some(b"x".to_vec())]));
        let grammar = required.grammar(Some(&vocab)).unwrap().unwrap();
        let mut state = Matcher::new(&grammar.schema);
        let call = br#"{"name": "move", "arguments": {"to": {"x": 3}}}"#;
        assert!(state.feed(&grammar.schema, call) && state.can_end(&grammar.schema));
        let mut wrong = Matcher::new(&grammar.schema);
        assert!(!wrong.feed(
            &grammar.schema,
            br#"{"name": "move", "arguments": {"to": {"y""#
        ));
    }
}
