//! OpenAI wire types: what clients send (deserialized as-is, checked in `validate.rs`) and what
//! the server answers. Fields OpenAI defines that grove does not implement are parsed so that
//! setting them is refused by name instead of silently ignored.

use grove_engine::SpecAlgorithm;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

/// `prompt`: a string, a token array, or a list of one of either.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    Text(String),
    Tokens(Vec<i64>),
    Texts(Vec<String>),
    TokenLists(Vec<Vec<i64>>),
}

/// `stop`: one string or a list.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct StreamOptions {
    #[serde(default, deserialize_with = "null_is_false")]
    pub include_usage: bool,
}

/// A boolean flag that may be sent as `null`, which OpenAI's schema allows and means the
/// default (as an absent field does).
fn null_is_false<'de, D: Deserializer<'de>>(deserializer: D) -> Result<bool, D::Error> {
    Ok(Option::<bool>::deserialize(deserializer)?.unwrap_or(false))
}

/// The `speculative` extension: a request's own speculation, capped by the server's flags.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpeculativeField {
    pub algorithm: Option<SpecAlgorithm>,
    pub budget: Option<BudgetField>,
}

/// `speculative.budget`: draft nodes per round, or `"auto"` (chosen each round from measured
/// costs, up to the server's ceiling).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum BudgetField {
    Nodes(i64),
    Name(String),
}

/// Sampling, stopping and extension fields both endpoints share (read from the same JSON
/// object as the endpoint's own fields; unknown fields are ignored, as OpenAI's are).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct CommonFields {
    pub model: String,
    pub max_tokens: Option<i64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    /// Extension (vLLM, SGLang): 0 or -1 disables.
    pub top_k: Option<i64>,
    pub seed: Option<i64>,
    pub stop: Option<Stop>,
    pub n: Option<i64>,
    #[serde(default, deserialize_with = "null_is_false")]
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
    pub speculative: Option<SpeculativeField>,
    /// Extension (vLLM): keep generating past end-of-sequence tokens.
    #[serde(default, deserialize_with = "null_is_false")]
    pub ignore_eos: bool,
    /// Extension (vLLM): the choice also carries the generated `token_ids` (non-streaming).
    #[serde(default, deserialize_with = "null_is_false")]
    pub return_token_ids: bool,
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    pub logit_bias: Option<Value>,
    /// `text`, `json_object` or `json_schema` (see `response_format.rs`).
    pub response_format: Option<Value>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct CompletionRequest {
    pub prompt: Prompt,
    pub logprobs: Option<Value>,
    pub echo: Option<bool>,
    pub best_of: Option<i64>,
    pub suffix: Option<String>,
}

/// Message content: a string or a list of parts (only text parts are supported).
#[derive(Debug, Clone, Deserialize)]
#[serde(
    untagged,
    expecting = "a string or a list of content parts (objects with `type`)"
)]
pub enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Clone, Deserialize)]
pub struct ContentPart {
    /// Optional here so that a part without it is refused by its path, not by serde's
    /// untagged-enum message.
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub text: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Message {
    pub role: String,
    pub content: Option<Content>,
    /// An assistant turn's calls (see `tools.rs`).
    pub tool_calls: Option<Value>,
    /// A `tool` turn answers this call.
    pub tool_call_id: Option<String>,
    /// An earlier answer's reasoning, as `--reasoning-parser` split it off (Qwen3's template
    /// renders it in the turns after the last user message).
    pub reasoning_content: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ChatRequest {
    pub messages: Vec<Message>,
    /// The newer name of `max_tokens` for chat.
    pub max_completion_tokens: Option<i64>,
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<Value>,
    pub tools: Option<Value>,
    pub tool_choice: Option<Value>,
    /// Extension (vLLM, SGLang): variables for the chat template (Qwen3's `enable_thinking`).
    pub chat_template_kwargs: Option<Value>,
}

/// `usage`, with grove's speculation extension.
#[derive(Debug, Clone, Serialize)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
    pub prompt_tokens_details: PromptTokensDetails,
    /// With a reasoning parser: how many completion tokens were reasoning.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub completion_tokens_details: Option<CompletionTokensDetails>,
    pub speculative: SpeculativeUsage,
}

/// OpenAI's breakdown of the completion.
#[derive(Debug, Clone, Serialize)]
pub struct CompletionTokensDetails {
    /// Tokens of the reasoning block, its tags included.
    pub reasoning_tokens: usize,
}

/// OpenAI's breakdown of the prompt: how much of it came from the prefix cache.
#[derive(Debug, Clone, Serialize)]
pub struct PromptTokensDetails {
    pub cached_tokens: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct SpeculativeUsage {
    pub algorithm: SpecAlgorithm,
    /// Draft nodes verified per round (0 without speculation; the ceiling with `auto`).
    pub budget: usize,
    /// The budget was chosen each round (`"auto"`).
    pub auto_budget: bool,
    /// Draft nodes verified per round, on average: the chosen budget.
    pub mean_budget: f64,
    /// Rounds that drafted nothing (drafting would not have paid).
    pub rounds_without_drafts: usize,
    /// Rounds after prefill.
    pub rounds: usize,
    /// Tokens emitted per round (accepted drafts + the target's own).
    pub mean_accept_length: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct ModelCard {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub owned_by: &'static str,
    pub max_model_len: usize,
}
