//! Validation at the edge: raw bytes -> a typed OpenAI request -> a [`ValidRequest`] the engine
//! can run. Every refusal is a [`ValidationError`] variant naming the field (`param`) and the
//! limit, the same vocabulary the engine uses when it re-checks what only it knows (context
//! length, KV capacity, the speculation ceiling).

use std::sync::Arc;

use grove_core::{SamplingDefaults, SamplingParams, StopCondition, TokenId, ValidationError};
use grove_engine::structured::TokenBytes;
use grove_engine::{
    Budget, GenerateRequest, LogitAdjustments, SpeculationOverride, MAX_TOP_LOGPROBS,
};
use grove_model::TextTokenizer;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::protocol::{
    BudgetField, ChatRequest, CommonFields, CompletionRequest, Message, Prompt, SpeculativeField,
    Stop,
};
use crate::reasoning::ReasoningParser;

mod fim;
mod messages;
mod tokenize;

use fim::FimTokens;
use messages::{chat_message, template_kwargs};
pub use tokenize::{DetokenizeRequest, TokenizeRequest};

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
    /// The tokenizer's tokens as bytes, for `response_format`'s masks.
    pub token_bytes: Option<Arc<TokenBytes>>,
    /// What a request that leaves a sampling field out gets.
    pub sampling_defaults: SamplingDefaults,
    /// Where a thinking model's reasoning is in its chat answers (`--reasoning-parser`).
    pub reasoning: Option<ReasoningParser>,
    /// Chat template variables every chat request gets unless it sets them itself.
    pub template_kwargs: Map<String, Value>,
}

impl ModelLimits {
    /// The most tokens one request's prompt and completion can hold together: the context,
    /// or less where the KV pool (less one verify's rows) is smaller.
    pub fn max_model_len(&self) -> usize {
        self.context
            .min(self.kv_tokens.saturating_sub(self.verify_rows))
    }
}

/// A request that passed every edge check.
#[derive(Debug, Clone)]
pub struct ValidRequest {
    /// The request for the first prompt; every other prompt's differs only in its prompt.
    pub generate: GenerateRequest,
    /// Completions' prompts after the first (a list of several prompts).
    pub more_prompts: Vec<Vec<TokenId>>,
    /// Choices to generate for each prompt (`n`), each an engine request of its own.
    pub choices: usize,
    pub stream: bool,
    pub include_usage: bool,
    pub return_token_ids: bool,
    /// Completions' `echo`, one per prompt: the prompt comes back before the completion.
    pub echo: Vec<Echo>,
    /// Chat's tools, whose calls are read from the text.
    pub tools: Option<crate::tools::Tools>,
}

/// What `echo` puts back: the prompt's text, its first token (which no row scores), and
/// whether the completion itself is left out (`max_tokens: 0`: the prompt is only scored; the
/// engine generates one token, which the answer drops).
#[derive(Debug, Clone)]
pub struct Echo {
    pub text: String,
    pub first_token: TokenId,
    pub without_completion: bool,
}

/// Parses a JSON object body into the endpoint's fields `T` and the shared fields, naming the
/// field whose value is missing or has the wrong type.
pub fn parse_json<T: DeserializeOwned>(body: &[u8]) -> Result<(T, CommonFields), ValidationError> {
    let value = json_object(body)?;
    Ok((fields(&value)?, fields(&value)?))
}

/// A body that holds one request object of type `T`.
pub fn parse_body<T: DeserializeOwned>(body: &[u8]) -> Result<T, ValidationError> {
    fields(&json_object(body)?)
}

/// The body as a JSON object.
fn json_object(body: &[u8]) -> Result<Value, ValidationError> {
    let text = std::str::from_utf8(body).map_err(|e| ValidationError::Body {
        reason: format!(
            "is not valid UTF-8 (invalid byte at offset {})",
            e.valid_up_to()
        ),
    })?;
    let value: Value = serde_json::from_str(text).map_err(|e| ValidationError::Body {
        reason: format!("is not valid JSON: {e}"),
    })?;
    if !value.is_object() {
        return Err(ValidationError::Body {
            reason: "must be a JSON object".into(),
        });
    }
    Ok(value)
}

fn fields<T: DeserializeOwned>(value: &Value) -> Result<T, ValidationError> {
    serde_path_to_error::deserialize(value).map_err(|error| {
        let field = error.path().to_string();
        let reason = error.into_inner().to_string();
        match missing_field(&reason) {
            // serde reports it at the parent's path (`.` at the top).
            Some(name) if field == "." => ValidationError::Missing { field: name },
            Some(name) => ValidationError::Missing {
                field: format!("{field}.{name}"),
            },
            None => ValidationError::WrongType { field, reason },
        }
    })
}

/// serde reports a missing field at the parent's path; pull its name out of the message.
fn missing_field(message: &str) -> Option<String> {
    let rest = message.strip_prefix("missing field `")?;
    Some(rest[..rest.find('`')?].to_owned())
}

fn unsupported(field: &'static str, allowed: &'static str) -> ValidationError {
    ValidationError::Unsupported { field, allowed }
}

/// The most choices (`n`) one request may ask for: each is a sequence of its own in the engine.
pub const MAX_CHOICES: usize = 16;

/// A prompt as token ids, and its text where it came as text.
type PromptTokens = (Vec<TokenId>, Option<String>);

/// The most sequences one request may start: its prompts times its choices (`n`).
pub const MAX_SEQUENCES: usize = 64;

/// More than [`MAX_SEQUENCES`] prompts times choices.
fn too_many_sequences(value: String) -> ValidationError {
    ValidationError::OutOfRange {
        field: "prompt",
        limit: "at most 64 sequences a request (prompts times `n`)",
        value,
    }
}

/// A count of alternative tokens per position (`logprobs` of completions, `top_logprobs` of
/// chat): an integer in [0, MAX_TOP_LOGPROBS].
fn top_count(field: &'static str, value: &Value) -> Result<usize, ValidationError> {
    value
        .as_u64()
        .filter(|&n| n <= MAX_TOP_LOGPROBS as u64)
        .map(|n| n as usize)
        .ok_or_else(|| ValidationError::OutOfRange {
            field,
            limit: "an integer in [0, 20]",
            value: value.to_string(),
        })
}

/// `value` must be absent or pass `ok`; else the field is refused as unsupported.
fn only(ok: bool, field: &'static str, allowed: &'static str) -> Result<(), ValidationError> {
    if ok {
        Ok(())
    } else {
        Err(unsupported(field, allowed))
    }
}

impl ModelLimits {
    pub fn completion(
        &self,
        (request, common): (CompletionRequest, CommonFields),
    ) -> Result<ValidRequest, ValidationError> {
        let echo = request.echo == Some(true);
        only(
            !(echo && common.stream),
            "echo",
            "must be false or absent with `stream`",
        )?;
        let mut common = common;
        let without_completion = echo && common.max_tokens == Some(0);
        if without_completion {
            common.max_tokens = Some(1);
        }
        let logprobs = match request.logprobs {
            None | Some(Value::Null) => None,
            Some(value) => Some(top_count("logprobs", &value)?),
        };
        only(
            request.best_of.is_none_or(|b| b == 1),
            "best_of",
            "must be 1 or absent",
        )?;
        let ignore_eos = common.ignore_eos;
        let (fim, prompts) = match request.suffix {
            Some(suffix) => {
                only(!echo, "echo", "must be false or absent with `suffix`")?;
                let Prompt::Text(prefix) = request.prompt else {
                    return Err(unsupported("suffix", "needs a text `prompt` (the prefix)"));
                };
                let fim = self.fim_tokens()?;
                let prompt = fim.prompt(self, &prefix, &suffix)?;
                (Some(fim), vec![(prompt, None)])
            }
            None => (None, self.prompts(request.prompt)?),
        };
        let echoes = match echo {
            true => prompts
                .iter()
                .map(|(prompt, text)| Echo {
                    // A prompt of token ids echoes as their text.
                    text: text.clone().unwrap_or_else(|| {
                        let tokenizer = self.tokenizer.as_deref();
                        tokenizer
                            .and_then(|t| t.decode(prompt).ok())
                            .unwrap_or_default()
                    }),
                    first_token: prompt.first().copied().unwrap_or_default(),
                    without_completion,
                })
                .collect(),
            false => Vec::new(),
        };
        let mut prompts = prompts.into_iter().map(|(prompt, _)| prompt);
        let first = prompts.next().expect("at least one prompt");
        let mut valid = self.finish(first, common, None, DEFAULT_COMPLETION_MAX_TOKENS)?;
        valid.more_prompts = prompts.collect();
        let max_new_tokens = valid.generate.stop.max_new_tokens;
        for prompt in &valid.more_prompts {
            self.fits(prompt.len(), max_new_tokens)?;
        }
        let sequences = valid.choices * (1 + valid.more_prompts.len());
        if sequences > MAX_SEQUENCES {
            let prompts = sequences / valid.choices;
            return Err(too_many_sequences(format!(
                "{prompts} prompts times n = {}",
                valid.choices
            )));
        }
        if let Some(fim) = fim.filter(|_| !ignore_eos) {
            // A middle ends where the model would end a file (`<|endoftext|>`), which a chat
            // model's stop ids may not list.
            valid.generate.stop.stop_token_ids.extend(fim.stops);
        }
        valid.generate.logprobs = logprobs;
        valid.generate.prompt_logprobs = echo && logprobs.is_some();
        valid.echo = echoes;
        Ok(valid)
    }

    pub fn chat(
        &self,
        (request, common): (ChatRequest, CommonFields),
    ) -> Result<ValidRequest, ValidationError> {
        let top = match request.top_logprobs {
            None | Some(Value::Null) => None,
            Some(value) => Some(top_count("top_logprobs", &value)?),
        };
        let logprobs = match (request.logprobs == Some(true), top) {
            (true, top) => Some(top.unwrap_or(0)),
            (false, None) => None,
            (false, Some(top)) => {
                return Err(ValidationError::OutOfRange {
                    field: "top_logprobs",
                    limit: "absent or null unless `logprobs` is true",
                    value: top.to_string(),
                })
            }
        };
        let tools = crate::tools::tools(request.tools, request.tool_choice)?;
        let (tokenizer, prompt) = self.chat_prompt(
            request.messages,
            tools.as_ref().map_or(&[][..], |t| &t.definitions),
            request.chat_template_kwargs,
        )?;
        let default_max = self.max_model_len().saturating_sub(prompt.len()).max(1);
        let ignore_eos = common.ignore_eos;
        let mut valid = self.finish(prompt, common, request.max_completion_tokens, default_max)?;
        valid.generate.logprobs = logprobs;
        if let Some(tools) = &tools {
            only(
                valid.generate.grammar.is_none(),
                "response_format",
                "must be text or absent with `tools`",
            )?;
            valid.generate.grammar = tools.grammar(self.token_bytes.as_ref())?;
            if valid.generate.grammar.is_some() {
                self.schema_can_end(ignore_eos)?;
            }
        }
        valid.tools = tools;
        let grammar = &mut valid.generate.grammar;
        if let (Some(parser), Some(schema)) = (self.reasoning, grammar.as_ref()) {
            let tokens = parser.tokens(tokenizer).ok_or_else(|| {
                unsupported(
                    "response_format",
                    "text or absent (and `tool_choice` not a required call) with \
                     --reasoning-parser on a model without <think> and </think> as tokens",
                )
            })?;
            *grammar = Some(schema.clone().after_reasoning(tokens));
        }
        Ok(valid)
    }

    /// A chat's messages rendered by the model's template (with the tools it may call and the
    /// request's template variables) and encoded: the prompt the model runs.
    pub fn chat_prompt(
        &self,
        messages: Vec<Message>,
        definitions: &[Value],
        kwargs: Option<Value>,
    ) -> Result<(&TextTokenizer, Vec<TokenId>), ValidationError> {
        if messages.is_empty() {
            return Err(ValidationError::Empty { field: "messages" });
        }
        let tokenizer = self.tokenizer("messages")?;
        if !tokenizer.has_chat_template() {
            return Err(ValidationError::NoChatTemplate {
                model: self.name.clone(),
            });
        }
        let messages = messages
            .into_iter()
            .enumerate()
            .map(|(index, message)| chat_message(index, message))
            .collect::<Result<Vec<_>, _>>()?;
        let kwargs = template_kwargs(&self.template_kwargs, kwargs)?;
        let rendered = tokenizer
            .apply_chat_template_with(&messages, definitions, &kwargs)
            .map_err(|e| ValidationError::ChatTemplate {
                reason: e.to_string(),
            })?;
        // Named `prompt`, as every other overflow of a chat is (the rendered messages are the
        // prompt; clients that trim history look at the code).
        self.check_length(tokenizer, &rendered, "prompt")?;
        // Special tokens count only where the template wrote them; the template already holds
        // any BOS (adding the post-processor's would double it).
        let contents: Vec<&str> = messages.iter().map(|m| m.content.as_str()).collect();
        let prompt =
            tokenizer
                .encode_chat(&rendered, &contents)
                .map_err(|e| ValidationError::Tokenize {
                    field: "messages",
                    reason: e.to_string(),
                })?;
        Ok((tokenizer, prompt))
    }

    /// A value of a schema ends with an end-of-sequence token: there must be one, and it must
    /// end the request.
    fn schema_can_end(&self, ignore_eos: bool) -> Result<(), ValidationError> {
        only(
            !ignore_eos,
            "ignore_eos",
            "must be false or absent with `response_format` or a required tool call",
        )?;
        only(
            !self.stop_token_ids.is_empty(),
            "response_format",
            "json_object or json_schema only for a model with an end-of-sequence token",
        )
    }

    fn tokenizer(&self, field: &'static str) -> Result<&TextTokenizer, ValidationError> {
        self.tokenizer
            .as_deref()
            .ok_or_else(|| ValidationError::NoTokenizer {
                field,
                model: self.name.clone(),
            })
    }

    /// A completion's prompts (one, or a list of several) as token ids, each with its text
    /// where it came as text.
    fn prompts(&self, prompt: Prompt) -> Result<Vec<PromptTokens>, ValidationError> {
        let count = match &prompt {
            Prompt::Texts(texts) => texts.len(),
            Prompt::TokenLists(lists) => lists.len(),
            Prompt::Text(_) | Prompt::Tokens(_) => 1,
        };
        // Refused before any is encoded (the product with `n` is checked once `n` is).
        if count > MAX_SEQUENCES {
            return Err(too_many_sequences(format!("{count} prompts")));
        }
        let text = |text: String| Ok((self.encode(&text, "prompt", true)?, Some(text)));
        let ids = |ids: Vec<i64>| Ok((self.token_ids(&ids, "prompt")?, None));
        let prompts: Vec<_> = match prompt {
            Prompt::Text(one) => vec![text(one)?],
            Prompt::Tokens(one) => vec![ids(one)?],
            Prompt::Texts(texts) => texts.into_iter().map(text).collect::<Result<_, _>>()?,
            Prompt::TokenLists(lists) => lists.into_iter().map(ids).collect::<Result<_, _>>()?,
        };
        if prompts.is_empty() {
            return Err(ValidationError::Empty { field: "prompt" });
        }
        Ok(prompts)
    }

    /// The model's fill-in-the-middle tokens, or why `suffix` cannot be served.
    fn fim_tokens(&self) -> Result<FimTokens, ValidationError> {
        let tokenizer = self.tokenizer("suffix")?;
        FimTokens::of(tokenizer).ok_or_else(|| {
            unsupported(
                "suffix",
                "the model has no fill-in-the-middle tokens (<|fim_prefix|>, <|fim_suffix|>, \
                 <|fim_middle|> or <fim_prefix>, <fim_suffix>, <fim_middle>)",
            )
        })
    }

    fn encode(
        &self,
        text: &str,
        field: &'static str,
        special: bool,
    ) -> Result<Vec<TokenId>, ValidationError> {
        if text.is_empty() {
            return Err(ValidationError::Empty { field });
        }
        let tokenizer = self.tokenizer(field)?;
        self.check_length(tokenizer, text, field)?;
        tokenizer
            .encode(text, special)
            .map_err(|e| ValidationError::Tokenize {
                field,
                reason: e.to_string(),
            })
    }

    /// Refuses a text far longer than any prompt may be after encoding only enough of it to
    /// know: a multi-megabyte prompt costs milliseconds, not seconds of a tokenizer thread.
    fn check_length(
        &self,
        tokenizer: &TextTokenizer,
        text: &str,
        field: &'static str,
    ) -> Result<(), ValidationError> {
        // The prompt must leave room for one new token.
        let limit = self.max_model_len().saturating_sub(1);
        // Text of about 4 bytes a token or fewer is encoded whole at once (once, not twice).
        if text.len() <= 4 * limit {
            return Ok(());
        }
        match tokenizer.exceeds(text, limit) {
            Ok(Some(at_least)) => Err(ValidationError::PromptTooLong {
                field,
                at_least,
                limit,
            }),
            Ok(None) => Ok(()),
            Err(e) => Err(ValidationError::Tokenize {
                field,
                reason: e.to_string(),
            }),
        }
    }

    fn token_ids(&self, ids: &[i64], field: &'static str) -> Result<Vec<TokenId>, ValidationError> {
        if ids.is_empty() {
            return Err(ValidationError::Empty { field });
        }
        ids.iter()
            .map(|&id| {
                if (0..self.vocab_size as i64).contains(&id) {
                    Ok(id as TokenId)
                } else {
                    Err(ValidationError::TokenOutOfVocab {
                        field,
                        id,
                        vocab_size: self.vocab_size,
                    })
                }
            })
            .collect()
    }

    /// The checks and defaults both endpoints share.
    /// A prompt of `prompt_tokens` and `max_new_tokens` fit the context. The model's own
    /// context is the engine's to check; `--context-length` may be less.
    fn fits(&self, prompt_tokens: usize, max_new_tokens: usize) -> Result<(), ValidationError> {
        if prompt_tokens + max_new_tokens > self.context {
            return Err(ValidationError::ContextOverflow {
                prompt_tokens,
                max_new_tokens,
                context: self.context,
            });
        }
        Ok(())
    }

    fn finish(
        &self,
        prompt: Vec<TokenId>,
        common: CommonFields,
        max_tokens_alias: Option<i64>,
        default_max_tokens: usize,
    ) -> Result<ValidRequest, ValidationError> {
        let max_new_tokens = match (max_tokens_alias, common.max_tokens) {
            (Some(n), _) => at_least_one("max_completion_tokens", n)?,
            (None, Some(n)) => at_least_one("max_new_tokens", n)?,
            (None, None) => default_max_tokens,
        };
        if !common.stream && common.stream_options.is_some() {
            return Err(ValidationError::StreamOptionsWithoutStream);
        }
        self.fits(prompt.len(), max_new_tokens)?;
        let choices = match common.n {
            None => 1,
            Some(n) if (1..=MAX_CHOICES as i64).contains(&n) => n as usize,
            Some(n) => {
                return Err(ValidationError::OutOfRange {
                    field: "n",
                    limit: "in [1, 16]",
                    value: n.to_string(),
                })
            }
        };
        let adjustments = adjustments(&common, self.vocab_size)?;
        let grammar = crate::response_format::grammar(
            common.response_format.clone(),
            self.token_bytes.as_ref(),
            &self.name,
        )?;
        if grammar.is_some() {
            self.schema_can_end(common.ignore_eos)?;
        }
        Ok(ValidRequest {
            generate: GenerateRequest {
                prompt,
                sampling: sampling(&common, self.sampling_defaults)?,
                stop: StopCondition {
                    max_new_tokens,
                    stop_token_ids: if common.ignore_eos {
                        Vec::new()
                    } else {
                        self.stop_token_ids.clone()
                    },
                    stop_strings: stop_strings(common.stop)?,
                },
                speculation: speculation(common.speculative)?,
                logprobs: None,
                prompt_logprobs: false,
                adjustments,
                grammar,
            },
            choices,
            more_prompts: Vec::new(),
            echo: Vec::new(),
            tools: None,
            stream: common.stream,
            return_token_ids: common.return_token_ids,
            include_usage: common.stream_options.is_some_and(|o| o.include_usage),
        })
    }
}

/// The penalties and `logit_bias` (an object of token ids, as strings, to biases), checked
/// against OpenAI's limits and the vocabulary.
fn adjustments(common: &CommonFields, vocab: usize) -> Result<LogitAdjustments, ValidationError> {
    let malformed = |value: &Value| ValidationError::OutOfRange {
        field: "logit_bias",
        limit: "an object of token ids to numbers",
        value: value.to_string(),
    };
    let mut logit_bias = Vec::new();
    match &common.logit_bias {
        None | Some(Value::Null) => {}
        Some(Value::Object(biases)) => {
            for (id, bias) in biases {
                let id = id
                    .parse::<u32>()
                    .map_err(|_| malformed(&Value::String(id.clone())))?;
                let bias = bias.as_f64().ok_or_else(|| malformed(bias))?;
                logit_bias.push((id, bias as f32));
            }
        }
        Some(other) => return Err(malformed(other)),
    }
    let adjustments = LogitAdjustments {
        presence_penalty: common.presence_penalty.unwrap_or(0.0) as f32,
        frequency_penalty: common.frequency_penalty.unwrap_or(0.0) as f32,
        logit_bias,
    };
    adjustments.validate(vocab)?;
    Ok(adjustments)
}

fn at_least_one(field: &'static str, value: i64) -> Result<usize, ValidationError> {
    if value >= 1 {
        Ok(value as usize)
    } else {
        Err(ValidationError::OutOfRange {
            field,
            limit: "at least 1",
            value: value.to_string(),
        })
    }
}

/// The request's sampling: its own fields, else the checkpoint's defaults, else OpenAI's.
fn sampling(
    common: &CommonFields,
    defaults: SamplingDefaults,
) -> Result<SamplingParams, ValidationError> {
    let temperature = common
        .temperature
        .unwrap_or(defaults.temperature.map_or(1.0, f64::from));
    if !(0.0..=2.0).contains(&temperature) {
        return Err(ValidationError::OutOfRange {
            field: "temperature",
            limit: "in [0, 2]",
            value: temperature.to_string(),
        });
    }
    let top_p = common
        .top_p
        .unwrap_or(defaults.top_p.map_or(1.0, f64::from));
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(ValidationError::OutOfRange {
            field: "top_p",
            limit: "in (0, 1]",
            value: top_p.to_string(),
        });
    }
    let top_k = match common.top_k {
        None => defaults.top_k.unwrap_or(0),
        Some(-1) | Some(0) => 0,
        Some(k) if k > 0 => k as usize,
        Some(k) => {
            return Err(ValidationError::OutOfRange {
                field: "top_k",
                limit: "-1 or 0 (disabled) or positive",
                value: k.to_string(),
            })
        }
    };
    let seed = match common.seed {
        None => None,
        Some(s) if s >= 0 => Some(s as u64),
        Some(s) => {
            return Err(ValidationError::OutOfRange {
                field: "seed",
                limit: "a non-negative integer",
                value: s.to_string(),
            })
        }
    };
    Ok(SamplingParams {
        temperature: temperature as f32,
        top_k,
        top_p: top_p as f32,
        seed,
    })
}

fn stop_strings(stop: Option<Stop>) -> Result<Vec<String>, ValidationError> {
    let strings = match stop {
        None => Vec::new(),
        Some(Stop::One(s)) => vec![s],
        Some(Stop::Many(list)) => list,
    };
    if strings.len() > MAX_STOP_SEQUENCES {
        return Err(ValidationError::TooManyStops {
            count: strings.len(),
            limit: MAX_STOP_SEQUENCES,
        });
    }
    if let Some(bad) = strings
        .iter()
        .find(|s| s.is_empty() || s.len() > MAX_STOP_BYTES)
    {
        return Err(ValidationError::StopLength {
            bytes: bad.len(),
            limit: MAX_STOP_BYTES,
        });
    }
    Ok(strings)
}

fn speculation(field: Option<SpeculativeField>) -> Result<SpeculationOverride, ValidationError> {
    let Some(field) = field else {
        return Ok(SpeculationOverride::default());
    };
    let budget = match field.budget {
        None => None,
        Some(BudgetField::Nodes(nodes)) => {
            Some(Budget::Fixed(at_least_one("speculative.budget", nodes)?))
        }
        Some(BudgetField::Name(name)) if name == "auto" => Some(Budget::Auto),
        Some(BudgetField::Name(name)) => {
            return Err(ValidationError::OutOfRange {
                field: "speculative.budget",
                limit: "a positive number of draft nodes or \"auto\"",
                value: format!("{name:?}"),
            })
        }
    };
    Ok(SpeculationOverride {
        algorithm: field.algorithm,
        budget,
    })
}
