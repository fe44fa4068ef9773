//! Validation at the edge: raw bytes -> a typed OpenAI request -> a [`ValidRequest`] the engine
//! can run. Every refusal names the field (`param`) and the limit; the engine re-checks what
//! only it knows (context length, KV capacity, the speculation ceiling) and its refusals map to
//! the same error shape.

use std::sync::Arc;

use grove_core::{SamplingParams, StopCondition, TokenId};
use grove_engine::{GenerateRequest, SpeculationOverride};
use grove_model::{ChatMessage, TextTokenizer};
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::error::ApiError;
use crate::protocol::{ChatRequest, CommonFields, CompletionRequest, Content, Prompt, Stop};

/// OpenAI's limit on stop sequences.
pub const MAX_STOP_SEQUENCES: usize = 4;
/// Longest stop sequence accepted, in bytes.
pub const MAX_STOP_BYTES: usize = 256;
/// OpenAI's default `max_tokens` for completions.
pub const DEFAULT_COMPLETION_MAX_TOKENS: usize = 16;

/// What the edge knows about the served model.
#[derive(Debug, Clone)]
pub struct ModelLimits {
    pub name: String,
    pub context: usize,
    pub vocab_size: usize,
    /// Tokens the KV pool holds (`--max-total-tokens`) and the rows one verify may add.
    pub kv_tokens: usize,
    pub verify_rows: usize,
    pub stop_token_ids: Vec<TokenId>,
    pub tokenizer: Option<Arc<TextTokenizer>>,
}

/// A request that passed every edge check.
#[derive(Debug, Clone)]
pub struct ValidRequest {
    pub generate: GenerateRequest,
    pub stream: bool,
    pub include_usage: bool,
    pub return_token_ids: bool,
}

/// Parses a JSON object body into the endpoint's fields `T` and the shared fields, naming the
/// field whose value is missing or has the wrong type.
pub fn parse_json<T: DeserializeOwned>(body: &[u8]) -> Result<(T, CommonFields), ApiError> {
    let text = std::str::from_utf8(body).map_err(|e| {
        ApiError::invalid(
            "body",
            format!(
                "the request body is not valid UTF-8 (invalid byte at offset {})",
                e.valid_up_to()
            ),
        )
    })?;
    let value: Value = serde_json::from_str(text).map_err(|e| {
        ApiError::invalid("body", format!("the request body is not valid JSON: {e}"))
    })?;
    if !value.is_object() {
        return Err(ApiError::invalid(
            "body",
            "the request body must be a JSON object",
        ));
    }
    Ok((fields(&value)?, fields(&value)?))
}

fn fields<T: DeserializeOwned>(value: &Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(value).map_err(|error| {
        let path = error.path().to_string();
        let message = error.into_inner().to_string();
        if let Some(field) = missing_field(&message) {
            return ApiError::invalid(field.clone(), format!("`{field}` is required"));
        }
        ApiError::invalid(path.clone(), format!("invalid `{path}`: {message}"))
    })
}

/// serde reports a missing field at the parent's path; pull its name out of the message.
fn missing_field(message: &str) -> Option<String> {
    let rest = message.strip_prefix("missing field `")?;
    Some(rest[..rest.find('`')?].to_owned())
}

fn unsupported(param: &str, what: &str) -> ApiError {
    ApiError::invalid(param, format!("`{param}` is not supported: {what}"))
}

impl ModelLimits {
    pub fn completion(
        &self,
        (request, common): (CompletionRequest, CommonFields),
    ) -> Result<ValidRequest, ApiError> {
        if request.echo == Some(true) {
            return Err(unsupported("echo", "must be false or absent"));
        }
        if request.logprobs.as_ref().is_some_and(|v| !v.is_null()) {
            return Err(unsupported("logprobs", "must be null or absent"));
        }
        if request.best_of.is_some_and(|b| b != 1) {
            return Err(unsupported("best_of", "must be 1 or absent"));
        }
        if request.suffix.is_some() {
            return Err(unsupported("suffix", "must be absent"));
        }
        let prompt = match request.prompt {
            Prompt::Text(text) => self.encode(&text, "prompt", true)?,
            Prompt::Tokens(ids) => self.token_ids(&ids)?,
            Prompt::Texts(texts) => match <[String; 1]>::try_from(texts) {
                Ok([text]) => self.encode(&text, "prompt", true)?,
                Err(texts) => return Err(one_prompt(texts.len())),
            },
            Prompt::TokenLists(lists) => match <[Vec<i64>; 1]>::try_from(lists) {
                Ok([ids]) => self.token_ids(&ids)?,
                Err(lists) => return Err(one_prompt(lists.len())),
            },
        };
        self.finish(prompt, common, None, DEFAULT_COMPLETION_MAX_TOKENS)
    }

    pub fn chat(
        &self,
        (request, common): (ChatRequest, CommonFields),
    ) -> Result<ValidRequest, ApiError> {
        if request.logprobs == Some(true) || request.top_logprobs.is_some() {
            return Err(unsupported("logprobs", "must be false or absent"));
        }
        if request.tools.as_ref().is_some_and(|v| !v.is_null()) {
            return Err(unsupported("tools", "tool calls are not implemented"));
        }
        if request.tool_choice.as_ref().is_some_and(|v| !v.is_null()) {
            return Err(unsupported("tool_choice", "tool calls are not implemented"));
        }
        if let Some(format) = &request.response_format {
            if format.get("type").and_then(|t| t.as_str()) != Some("text") {
                return Err(unsupported("response_format", "only {\"type\": \"text\"}"));
            }
        }
        if request.messages.is_empty() {
            return Err(ApiError::invalid(
                "messages",
                "`messages` must hold at least one message",
            ));
        }
        let tokenizer = self.tokenizer("messages")?;
        if !tokenizer.has_chat_template() {
            return Err(ApiError::invalid(
                "messages",
                format!(
                    "the model `{}` has no chat template (tokenizer_config.json, or \
                     tokenizer.chat_template in a GGUF file); use /v1/completions, or start \
                     the server with --chat-template FILE",
                    self.name
                ),
            ));
        }
        let mut messages = Vec::with_capacity(request.messages.len());
        for (index, message) in request.messages.into_iter().enumerate() {
            if !matches!(
                message.role.as_str(),
                "system" | "user" | "assistant" | "developer"
            ) {
                return Err(ApiError::invalid(
                    format!("messages[{index}].role"),
                    format!("`messages[{index}].role` must be system, developer, user or assistant, got \"{}\"", message.role),
                ));
            }
            let content = match message.content {
                None => String::new(),
                Some(Content::Text(text)) => text,
                Some(Content::Parts(parts)) => {
                    let mut text = String::new();
                    for (part_index, part) in parts.into_iter().enumerate() {
                        match (part.kind.as_str(), part.text) {
                            ("text", Some(t)) => text.push_str(&t),
                            (kind, _) => {
                                return Err(ApiError::invalid(
                                    format!("messages[{index}].content[{part_index}]"),
                                    format!(
                                    "only text content parts are supported, got type \"{kind}\""
                                ),
                                ))
                            }
                        }
                    }
                    text
                }
            };
            messages.push(ChatMessage {
                role: message.role,
                content,
            });
        }
        let rendered = tokenizer
            .apply_chat_template(&messages)
            .map_err(|e| ApiError::invalid("messages", format!("chat template failed: {e}")))?;
        // The template already holds any BOS; adding special tokens would double it.
        let prompt = self.encode(&rendered, "messages", false)?;
        let default_max = self
            .context
            .min(self.kv_tokens.saturating_sub(self.verify_rows));
        let default_max = default_max.saturating_sub(prompt.len()).max(1);
        self.finish(prompt, common, request.max_completion_tokens, default_max)
    }

    fn tokenizer(&self, param: &str) -> Result<&TextTokenizer, ApiError> {
        self.tokenizer.as_deref().ok_or_else(|| {
            ApiError::invalid(
                param,
                format!(
                    "the model `{}` has no tokenizer.json: send `prompt` as token ids",
                    self.name
                ),
            )
        })
    }

    fn encode(&self, text: &str, param: &str, special: bool) -> Result<Vec<TokenId>, ApiError> {
        if text.is_empty() {
            return Err(ApiError::invalid(
                param,
                format!("`{param}` must not be empty"),
            ));
        }
        self.tokenizer(param)?
            .encode(text, special)
            .map_err(|e| ApiError::invalid(param, format!("`{param}` could not be tokenized: {e}")))
    }

    fn token_ids(&self, ids: &[i64]) -> Result<Vec<TokenId>, ApiError> {
        if ids.is_empty() {
            return Err(ApiError::invalid("prompt", "`prompt` must not be empty"));
        }
        ids.iter()
            .map(|&id| {
                if (0..self.vocab_size as i64).contains(&id) {
                    Ok(id as TokenId)
                } else {
                    Err(ApiError::invalid(
                        "prompt",
                        format!(
                            "token id {id} in `prompt` is outside the vocabulary of {} tokens",
                            self.vocab_size
                        ),
                    ))
                }
            })
            .collect()
    }

    /// The checks and defaults both endpoints share.
    fn finish(
        &self,
        prompt: Vec<TokenId>,
        common: CommonFields,
        max_tokens_alias: Option<i64>,
        default_max_tokens: usize,
    ) -> Result<ValidRequest, ApiError> {
        if common.n.is_some_and(|n| n != 1) {
            return Err(ApiError::invalid(
                "n",
                format!(
                    "`n` must be 1 (one choice per request), got {}",
                    common.n.unwrap_or(1)
                ),
            ));
        }
        for (param, value) in [
            ("presence_penalty", common.presence_penalty),
            ("frequency_penalty", common.frequency_penalty),
        ] {
            if value.is_some_and(|v| v != 0.0) {
                return Err(unsupported(param, "must be 0 or absent"));
            }
        }
        if common
            .logit_bias
            .as_ref()
            .is_some_and(|v| v.as_object().is_some_and(|o| !o.is_empty()))
        {
            return Err(unsupported("logit_bias", "must be empty or absent"));
        }
        let max_tokens = match max_tokens_alias.or(common.max_tokens) {
            None => default_max_tokens,
            Some(n) if n >= 1 => n as usize,
            Some(n) => {
                return Err(ApiError::invalid(
                    "max_tokens",
                    format!("`max_tokens` must be at least 1, got {n}"),
                ))
            }
        };
        let temperature = common.temperature.unwrap_or(1.0);
        if !(0.0..=2.0).contains(&temperature) {
            return Err(ApiError::invalid(
                "temperature",
                format!("`temperature` must be in [0, 2], got {temperature}"),
            ));
        }
        let top_p = common.top_p.unwrap_or(1.0);
        if !(top_p > 0.0 && top_p <= 1.0) {
            return Err(ApiError::invalid(
                "top_p",
                format!("`top_p` must be in (0, 1], got {top_p}"),
            ));
        }
        let top_k = match common.top_k {
            None | Some(-1) | Some(0) => 0,
            Some(k) if k > 0 => k as usize,
            Some(k) => {
                return Err(ApiError::invalid(
                    "top_k",
                    format!("`top_k` must be -1 or 0 (disabled) or positive, got {k}"),
                ))
            }
        };
        let seed = match common.seed {
            None => None,
            Some(s) if s >= 0 => Some(s as u64),
            Some(s) => {
                return Err(ApiError::invalid(
                    "seed",
                    format!("`seed` must be a non-negative integer, got {s}"),
                ))
            }
        };
        let stop_strings = match common.stop {
            None => Vec::new(),
            Some(Stop::One(s)) => vec![s],
            Some(Stop::Many(list)) => list,
        };
        if stop_strings.len() > MAX_STOP_SEQUENCES {
            return Err(ApiError::invalid(
                "stop",
                format!(
                    "`stop` may hold at most {MAX_STOP_SEQUENCES} sequences, got {}",
                    stop_strings.len()
                ),
            ));
        }
        if let Some(bad) = stop_strings
            .iter()
            .find(|s| s.is_empty() || s.len() > MAX_STOP_BYTES)
        {
            return Err(ApiError::invalid(
                "stop",
                format!(
                    "each `stop` sequence must be 1 to {MAX_STOP_BYTES} bytes, got {} bytes",
                    bad.len()
                ),
            ));
        }
        let speculation = match common.speculative {
            None => SpeculationOverride::default(),
            Some(field) => SpeculationOverride {
                algorithm: field.algorithm,
                budget: match field.budget {
                    None => None,
                    Some(b) if b >= 1 => Some(b as usize),
                    Some(b) => {
                        return Err(ApiError::invalid(
                            "speculative.budget",
                            format!("`speculative.budget` must be at least 1, got {b}"),
                        ))
                    }
                },
            },
        };
        if !common.stream && common.stream_options.is_some() {
            return Err(ApiError::invalid(
                "stream_options",
                "`stream_options` is only allowed with `stream: true`",
            ));
        }
        Ok(ValidRequest {
            generate: GenerateRequest {
                prompt,
                sampling: SamplingParams {
                    temperature: temperature as f32,
                    top_k,
                    top_p: top_p as f32,
                    seed,
                },
                stop: StopCondition {
                    max_new_tokens: max_tokens,
                    stop_token_ids: if common.ignore_eos {
                        Vec::new()
                    } else {
                        self.stop_token_ids.clone()
                    },
                    stop_strings,
                },
                speculation,
            },
            stream: common.stream,
            return_token_ids: common.return_token_ids,
            include_usage: common.stream_options.is_some_and(|o| o.include_usage),
        })
    }
}

fn one_prompt(count: usize) -> ApiError {
    ApiError::invalid(
        "prompt",
        format!("`prompt` must be one prompt (a string or a token array), got a list of {count}"),
    )
}
