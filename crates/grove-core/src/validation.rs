//! One vocabulary of refusals for every place that checks input: the HTTP edge, the engine and
//! the command line. Each rule is a variant that names its field and its limit; the message is
//! composed once, in the naming of whoever reads it ([`Naming`]), never rewritten afterwards.

use std::borrow::Cow;
use std::fmt;

/// Whose names the fields go by: the engine's (`max_new_tokens`, as the CLI flags say) or
/// OpenAI's (`max_tokens`, as a client sent it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Naming {
    Engine,
    OpenAi,
}

impl Naming {
    /// `field` (an engine name) as this naming spells it.
    pub fn field(self, field: &str) -> &str {
        match (self, field) {
            (Self::OpenAi, "max_new_tokens") => "max_tokens",
            _ => field,
        }
    }
}

/// Bad input. Every variant names the field and the limit it broke.
#[derive(Debug, Clone, PartialEq)]
pub enum ValidationError {
    /// A value outside its range.
    OutOfRange {
        field: &'static str,
        limit: &'static str,
        value: String,
    },
    Empty {
        field: &'static str,
    },
    /// The prompt and the tokens asked for do not fit the model's context.
    ContextOverflow {
        prompt_tokens: usize,
        max_new_tokens: usize,
        context: usize,
    },
    /// A text longer than the most tokens a prompt may have, found without encoding all of it
    /// (a multi-megabyte prompt is refused in milliseconds).
    PromptTooLong {
        field: &'static str,
        /// Tokens counted before the count passed the limit.
        at_least: usize,
        limit: usize,
    },
    /// The prompt, the tokens asked for and one verify do not fit the KV pool.
    KvOverflow {
        prompt_tokens: usize,
        max_new_tokens: usize,
        needed: usize,
        capacity: usize,
    },
    TokenOutOfVocab {
        field: &'static str,
        id: i64,
        vocab_size: usize,
    },
    /// A field grove does not implement, or only with some values.
    Unsupported {
        field: &'static str,
        allowed: &'static str,
    },
    /// A required field is absent.
    Missing {
        field: String,
    },
    /// A field is present with the wrong type or shape (as the JSON parser reports it).
    WrongType {
        field: String,
        reason: String,
    },
    /// The body itself cannot be read as a JSON object.
    Body {
        reason: String,
    },
    /// A message role outside the chat roles.
    Role {
        index: usize,
        role: String,
    },
    /// A content part that is not text.
    ContentPart {
        index: usize,
        part: usize,
        kind: String,
    },
    /// Text input to a model without a tokenizer.
    NoTokenizer {
        field: &'static str,
        model: String,
    },
    /// Chat messages to a model without a chat template.
    NoChatTemplate {
        model: String,
    },
    /// The chat template failed on these messages.
    ChatTemplate {
        reason: String,
    },
    Tokenize {
        field: &'static str,
        reason: String,
    },
    /// More stop sequences than the limit.
    TooManyStops {
        count: usize,
        limit: usize,
    },
    /// A stop sequence empty or longer than the limit.
    StopLength {
        bytes: usize,
        limit: usize,
    },
    /// `stream_options` without `stream: true`.
    StreamOptionsWithoutStream,
}

impl ValidationError {
    /// The offending field, as `naming` spells it (a path like `messages[2].role` where one
    /// element of a list is at fault).
    pub fn field(&self, naming: Naming) -> Cow<'_, str> {
        let name = match self {
            Self::OutOfRange { field, .. }
            | Self::Empty { field }
            | Self::TokenOutOfVocab { field, .. }
            | Self::Unsupported { field, .. }
            | Self::NoTokenizer { field, .. }
            | Self::Tokenize { field, .. }
            | Self::PromptTooLong { field, .. } => field,
            Self::ContextOverflow { .. } | Self::KvOverflow { .. }
                if self.prompt_alone_overflows() =>
            {
                "prompt"
            }
            Self::ContextOverflow { .. } | Self::KvOverflow { .. } => "max_new_tokens",
            Self::Missing { field } | Self::WrongType { field, .. } => field.as_str(),
            Self::Body { .. } => "body",
            Self::Role { index, .. } => return format!("messages[{index}].role").into(),
            Self::ContentPart { index, part, .. } => {
                return format!("messages[{index}].content[{part}]").into()
            }
            Self::NoChatTemplate { .. } | Self::ChatTemplate { .. } => "messages",
            Self::TooManyStops { .. } | Self::StopLength { .. } => "stop",
            Self::StreamOptionsWithoutStream => "stream_options",
        };
        Cow::Borrowed(naming.field(name))
    }

    /// An overflow that no `max_new_tokens` could avoid: the prompt and one new token do not
    /// fit (clients such as LangChain trim the history on it).
    fn prompt_alone_overflows(&self) -> bool {
        match *self {
            Self::ContextOverflow {
                prompt_tokens,
                context,
                ..
            } => prompt_tokens >= context,
            Self::KvOverflow {
                max_new_tokens,
                needed,
                capacity,
                ..
            } => needed - max_new_tokens + 1 > capacity,
            _ => false,
        }
    }

    /// OpenAI's `error.code` where it has one for the rule.
    pub fn code(&self) -> Option<&'static str> {
        match self {
            Self::ContextOverflow { .. } | Self::KvOverflow { .. } | Self::PromptTooLong { .. } => {
                Some("context_length_exceeded")
            }
            _ => None,
        }
    }

    /// The message, with the fields spelled as `naming` spells them.
    pub fn message(&self, naming: Naming) -> String {
        let field = self.field(naming);
        let max_new_tokens = naming.field("max_new_tokens");
        match self {
            Self::OutOfRange { limit, value, .. } => {
                format!("`{field}` must be {limit}, got {value}")
            }
            Self::Empty { .. } => format!("`{field}` must not be empty"),
            Self::ContextOverflow {
                prompt_tokens,
                context,
                ..
            } if self.prompt_alone_overflows() => format!(
                "prompt of {prompt_tokens} tokens leaves no room for a completion in the \
                 context of {context} tokens: shorten it"
            ),
            Self::KvOverflow {
                prompt_tokens,
                needed,
                max_new_tokens: asked,
                capacity,
            } if self.prompt_alone_overflows() => format!(
                "prompt of {prompt_tokens} tokens leaves no room for a completion in the KV \
                 pool (--max-total-tokens): it holds {capacity} slots, and the prompt with one \
                 verify needs {}: shorten it",
                needed - asked + 1
            ),
            Self::ContextOverflow {
                prompt_tokens,
                max_new_tokens: asked,
                context,
            } => format!(
                "prompt of {prompt_tokens} tokens plus `{max_new_tokens}` {asked} exceeds the \
                 model's context of {context} tokens"
            ),
            Self::KvOverflow {
                prompt_tokens,
                max_new_tokens: asked,
                needed,
                capacity,
            } => format!(
                "`{max_new_tokens}` must be such that prompt + `{max_new_tokens}` + one verify \
                 fits the KV pool (--max-total-tokens), got {prompt_tokens} + {asked}, which \
                 needs {needed} slots of {capacity}"
            ),
            Self::PromptTooLong {
                at_least, limit, ..
            } => format!(
                "`{field}` is longer than {at_least} tokens (counted before reading the rest), \
                 but a prompt may have at most {limit} to leave room for a completion: shorten it"
            ),
            Self::TokenOutOfVocab { id, vocab_size, .. } => format!(
                "token id {id} in `{field}` is outside the vocabulary of {vocab_size} tokens"
            ),
            Self::Unsupported { allowed, .. } => {
                format!("`{field}` is not supported: {allowed}")
            }
            Self::Missing { .. } => format!("`{field}` is required"),
            Self::WrongType { reason, .. } => format!("invalid `{field}`: {reason}"),
            Self::Body { reason } => format!("the request body {reason}"),
            Self::Role { role, .. } => {
                format!("`{field}` must be system, developer, user or assistant, got \"{role}\"")
            }
            Self::ContentPart { kind, .. } => {
                format!("`{field}`: only text content parts are supported, got type \"{kind}\"")
            }
            Self::NoTokenizer { model, .. } => format!(
                "the model `{model}` has no tokenizer.json: send `prompt` as token ids \
                 (`{field}` needs a tokenizer)"
            ),
            Self::NoChatTemplate { model } => format!(
                "the model `{model}` has no chat template (tokenizer_config.json, or \
                 tokenizer.chat_template in a GGUF file) for `messages`; use /v1/completions, \
                 or start the server with --chat-template FILE"
            ),
            Self::ChatTemplate { reason } => {
                format!("the chat template failed on `messages`: {reason}")
            }
            Self::Tokenize { reason, .. } => format!("`{field}` could not be tokenized: {reason}"),
            Self::TooManyStops { count, limit } => {
                format!("`stop` may hold at most {limit} sequences, got {count}")
            }
            Self::StopLength { bytes, limit } => {
                format!("each `stop` sequence must be 1 to {limit} bytes, got {bytes} bytes")
            }
            Self::StreamOptionsWithoutStream => {
                "`stream_options` is only allowed with `stream: true`".into()
            }
        }
    }
}

impl fmt::Display for ValidationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message(Naming::Engine))
    }
}

impl std::error::Error for ValidationError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_naming_spells_the_field_in_the_message_it_composes() {
        let error = ValidationError::OutOfRange {
            field: "max_new_tokens",
            limit: "at least 1",
            value: "0".into(),
        };
        assert_eq!(error.field(Naming::OpenAi), "max_tokens");
        assert_eq!(
            error.message(Naming::OpenAi),
            "`max_tokens` must be at least 1, got 0"
        );
        assert_eq!(
            error.to_string(),
            "`max_new_tokens` must be at least 1, got 0"
        );
        let overflow = ValidationError::ContextOverflow {
            prompt_tokens: 10,
            max_new_tokens: 5000,
            context: 4096,
        };
        assert_eq!(overflow.field(Naming::OpenAi), "max_tokens");
        assert_eq!(overflow.code(), Some("context_length_exceeded"));
        assert!(overflow
            .message(Naming::OpenAi)
            .contains("`max_tokens` 5000"));
        assert!(!overflow.message(Naming::OpenAi).contains("max_new_tokens"));
    }

    #[test]
    fn list_elements_are_named_by_their_path() {
        let role = ValidationError::Role {
            index: 2,
            role: "wizard".into(),
        };
        assert_eq!(role.field(Naming::OpenAi), "messages[2].role");
        assert!(role.message(Naming::OpenAi).contains("\"wizard\""));
        let part = ValidationError::ContentPart {
            index: 0,
            part: 1,
            kind: "image_url".into(),
        };
        assert_eq!(part.field(Naming::OpenAi), "messages[0].content[1]");
    }
}
