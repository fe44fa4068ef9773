//! What a caller hands the engine and gets back: requests, engine options, outputs and their
//! statistics.

use grove_core::{FinishReason, SamplingParams, StopCondition, TokenId};

use crate::logprobs::TokenLogprob;
use crate::penalties::LogitAdjustments;
use crate::speculation::{SpecAlgorithm, SpeculationOverride};
use crate::structured::Grammar;

/// Prompt rows per prefill forward: bounds activation memory on long prompts.
pub const DEFAULT_PREFILL_CHUNK: usize = 512;

/// Settings of the engine, as opposed to those of a request.
#[derive(Debug, Clone)]
pub struct GeneratorOptions {
    pub page_size: usize,
    pub prefill_chunk: usize,
    /// Vocabulary shards for the per-depth top-K of draft logits (identical results for any
    /// count; the seam a tensor-parallel LM head will use).
    pub vocab_shards: usize,
}

impl Default for GeneratorOptions {
    fn default() -> Self {
        Self {
            page_size: 1,
            prefill_chunk: DEFAULT_PREFILL_CHUNK,
            vocab_shards: 1,
        }
    }
}

#[derive(Debug, Clone)]
pub struct GenerateRequest {
    pub prompt: Vec<TokenId>,
    pub sampling: SamplingParams,
    pub stop: StopCondition,
    /// The request's own speculation, within the generator's (default: the generator's).
    pub speculation: SpeculationOverride,
    /// Each chosen token's log-probability, with this many alternatives (at most
    /// [`crate::MAX_TOP_LOGPROBS`]); `None`: none.
    pub logprobs: Option<usize>,
    /// The prompt's tokens' log-probabilities too (each after the tokens before it; the first
    /// has none), with `logprobs`' alternatives: what a prompt scores under the model. The
    /// prompt is then prefilled whole, not taken from the prefix cache.
    pub prompt_logprobs: bool,
    /// Presence and frequency penalties and `logit_bias` (none by default).
    pub adjustments: LogitAdjustments,
    /// The schema the text is held to (`response_format`); `None`: free text.
    pub grammar: Option<Grammar>,
}

impl GenerateRequest {
    /// Greedy decoding of `max_new_tokens` tokens with no stop token, following the
    /// generator's speculation.
    pub fn greedy(prompt: &[TokenId], max_new_tokens: usize) -> Self {
        Self {
            prompt: prompt.to_vec(),
            sampling: SamplingParams::greedy(),
            stop: StopCondition {
                max_new_tokens,
                ..Default::default()
            },
            speculation: SpeculationOverride::default(),
            logprobs: None,
            prompt_logprobs: false,
            adjustments: LogitAdjustments::default(),
            grammar: None,
        }
    }
}

/// Per-request statistics, in the JSON shape `grove generate --format json` prints.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct GenerateStats {
    /// The method this request ran with and its draft nodes per round (0 without speculation;
    /// the ceiling when the budget was chosen each round).
    pub algorithm: SpecAlgorithm,
    pub budget: usize,
    /// The budget was chosen each round from measured costs (`auto`).
    pub auto_budget: bool,
    /// Draft nodes verified per round, on average (the chosen budget).
    pub mean_budget: f64,
    /// Rounds that did not draft (the automatic budget found drafting would not pay).
    pub rounds_without_drafts: usize,
    pub prompt_tokens: usize,
    /// Prompt tokens whose K/V came from the prefix cache instead of a prefill.
    pub cached_tokens: usize,
    pub new_tokens: usize,
    /// Rounds after prefill (the prefill chooses the first token).
    pub rounds: usize,
    /// Tau per round: accepted drafts + 1 (the target's own token), cut at a stop; 1 without
    /// speculation.
    pub accept_lengths: Vec<usize>,
    pub mean_accept_length: f64,
    /// `accepted_per_position[j]`: rounds whose draft at position `j` (0-based) was accepted.
    pub accepted_per_position: Vec<usize>,
    pub prefill_tokens_per_s: f64,
    /// Tokens emitted by rounds per second of the rounds' wall time.
    pub decode_tokens_per_s: f64,
    pub t_prefill_us: u64,
    pub t_decode_us: u64,
    /// Non-root draft nodes verified, over all rounds.
    pub tree_nodes: usize,
    /// `accepted_depth_histogram[d]`: rounds whose accepted path reached depth `d`.
    pub accepted_depth_histogram: Vec<usize>,
    pub t_draft_us: u64,
    pub t_tree_build_us: u64,
    pub t_verify_us: u64,
    pub t_commit_us: u64,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct GenerateOutput {
    /// New tokens only; a stop token that ended generation is included, never rendered.
    pub token_ids: Vec<TokenId>,
    pub text: String,
    pub finish_reason: FinishReason,
    /// One per token of `token_ids` when the request asked for log-probabilities.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub logprobs: Vec<TokenLogprob>,
    /// One per prompt token after the first, when the request asked for the prompt's.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub prompt_logprobs: Vec<TokenLogprob>,
    pub stats: GenerateStats,
}
