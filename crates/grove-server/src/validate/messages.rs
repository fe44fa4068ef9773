//! Chat's messages and template variables, checked into what the chat template reads.

use grove_core::ValidationError;
use grove_model::{reserved_template_variable, ChatMessage};
use serde_json::{Map, Value};

use crate::protocol::{Content, Message};

/// One chat message, its content parts joined (text parts only).
pub(super) fn chat_message(index: usize, message: Message) -> Result<ChatMessage, ValidationError> {
    if !matches!(
        message.role.as_str(),
        "system" | "user" | "assistant" | "developer" | "tool"
    ) {
        return Err(ValidationError::Role {
            index,
            role: message.role,
        });
    }
    let content = match message.content {
        None => String::new(),
        Some(Content::Text(text)) => text,
        Some(Content::Parts(parts)) => {
            let mut text = String::new();
            for (part, content) in parts.into_iter().enumerate() {
                let missing = |name: &str| ValidationError::Missing {
                    field: format!("messages[{index}].content[{part}].{name}"),
                };
                match (content.kind.as_deref(), content.text) {
                    (None, _) => return Err(missing("type")),
                    (Some("text"), Some(t)) => text.push_str(&t),
                    (Some("text"), None) => return Err(missing("text")),
                    (Some(kind), _) => {
                        return Err(ValidationError::ContentPart {
                            index,
                            part,
                            kind: kind.to_owned(),
                        })
                    }
                }
            }
            text
        }
    };
    let tool_calls = match message.tool_calls {
        None | Some(Value::Null) => None,
        Some(calls) => Some(crate::tools::message_calls(index, calls)?),
    };
    Ok(ChatMessage {
        role: message.role,
        content,
        tool_calls,
        tool_call_id: message.tool_call_id,
        reasoning_content: message.reasoning_content,
    })
}

/// `chat_template_kwargs` (vLLM, SGLang): variables for the chat template, such as Qwen3's
/// `enable_thinking`, over the server's defaults (`--chat-template-kwargs`) name by name.
pub(super) fn template_kwargs(
    defaults: &Map<String, Value>,
    value: Option<Value>,
) -> Result<Map<String, Value>, ValidationError> {
    let mut merged = defaults.clone();
    let kwargs = match value {
        None | Some(Value::Null) => return Ok(merged),
        Some(Value::Object(kwargs)) => kwargs,
        Some(other) => {
            return Err(ValidationError::WrongType {
                field: "chat_template_kwargs".into(),
                reason: format!("expected an object of template variables, got {other}"),
            })
        }
    };
    if let Some(key) = reserved_template_variable(&kwargs) {
        return Err(ValidationError::OutOfRange {
            field: "chat_template_kwargs",
            limit: "variables other than messages, tools, add_generation_prompt, bos_token and \
                    eos_token (grove sets those)",
            value: format!("`{key}`"),
        });
    }
    merged.extend(kwargs);
    Ok(merged)
}
