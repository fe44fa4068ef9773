//! `response_format`: the text held to JSON (`json_object`) or to a JSON Schema
//! (`json_schema`), on both endpoints, by the engine's token masks (`grove_engine::structured`).
//! A schema grove cannot enforce is refused with where in it and why.

use std::sync::Arc;

use grove_core::ValidationError;
use grove_engine::structured::{Grammar, Schema, TokenBytes};
use serde_json::Value;

/// The field refusals name.
const FIELD: &str = "response_format";

/// The grammar `format` asks for (`None`: free text), over the served model's `vocab`.
pub(crate) fn grammar(
    format: Option<Value>,
    vocab: Option<&Arc<TokenBytes>>,
    model: &str,
) -> Result<Option<Grammar>, ValidationError> {
    let format = match format {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(format)) => format,
        Some(_) => {
            return Err(ValidationError::WrongType {
                field: FIELD.into(),
                reason: "must be an object with a `type`".into(),
            })
        }
    };
    let schema = match format.get("type").and_then(Value::as_str) {
        Some("text") => return Ok(None),
        Some("json_object") => Schema::any_object(),
        Some("json_schema") => {
            let field = "response_format.json_schema.schema";
            let schema = format
                .get("json_schema")
                .and_then(|j| j.get("schema"))
                .ok_or_else(|| ValidationError::Missing {
                    field: field.into(),
                })?;
            Schema::compile(schema).map_err(|e| ValidationError::WrongType {
                field: field.into(),
                reason: e.to_string(),
            })?
        }
        _ => {
            return Err(ValidationError::Unsupported {
                field: "response_format.type",
                allowed: "text, json_object or json_schema",
            })
        }
    };
    let vocab = vocab.ok_or_else(|| ValidationError::NoTokenizer {
        field: FIELD,
        model: model.to_owned(),
    })?;
    Ok(Some(Grammar::new(schema, Arc::clone(vocab))))
}
