//! Generation: the single decode loop, over one request or a batch of them.
//!
//! Prefill runs in chunks and chooses the first token (the anchor). Every round then builds a
//! draft tree rooted at the anchor (root only without speculation, a chain of argmax drafts for
//! DFlash, the best-first DDTree for DDTree), verifies all its rows in one target forward
//! (ancestor-only visibility, position = base + depth), walks the target's own choices from the
//! root (argmax, or a fresh sample per visited node at T > 0), commits the accepted path's KV to
//! contiguous positions and emits the accepted drafts plus the target's next token, which
//! becomes the new anchor. Drafts come from one drafter pass over `[anchor, MASK x (S-1)]`; the
//! committed rows' taps extend the drafter's context.

use std::time::Duration;

use grove_core::{FinishReason, SamplingParams, StopCondition, TokenId, ValidationError};
use grove_model::{Model, TextTokenizer};

use crate::drafter::Drafter;
use crate::round::Sequence;
use crate::scheduler::{Engine, EngineEvent, EngineLimits};
use crate::speculation::{self, SpecAlgorithm, SpeculationOverride};
use crate::EngineError;

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

/// Linear speculative decoding with a DFlash-style drafter.
#[derive(Clone, Copy)]
pub struct DFlashSpec<'a> {
    pub drafter: &'a dyn Drafter,
    /// Verify block size (anchor + drafts), `2..=` the drafter's block size. The drafter always
    /// runs its full trained block; only the first `num_draft_tokens - 1` drafts are verified.
    pub num_draft_tokens: usize,
}

/// Speculative decoding with draft trees (DDTree) over a DFlash-style drafter.
#[derive(Clone, Copy)]
pub struct DDTreeSpec<'a> {
    pub drafter: &'a dyn Drafter,
    /// Non-root nodes per tree.
    pub budget: usize,
    /// Candidates per depth; `K = min(top_k, budget, vocab)`.
    pub top_k: usize,
}

/// What a round drafts.
#[derive(Clone, Copy)]
pub(crate) enum Method {
    /// A chain of `num_draft_tokens - 1` argmax drafts.
    Chain { num_draft_tokens: usize },
    /// A best-first tree of `budget` nodes over the top-`top_k` tokens per depth.
    Tree { budget: usize, top_k: usize },
}

#[derive(Clone, Copy)]
pub(crate) struct Speculation<'a> {
    pub drafter: &'a dyn Drafter,
    pub method: Method,
}

#[derive(Debug, Clone)]
pub struct GenerateRequest {
    pub prompt: Vec<TokenId>,
    pub sampling: SamplingParams,
    pub stop: StopCondition,
    /// The request's own speculation, within the generator's (default: the generator's).
    pub speculation: SpeculationOverride,
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
        }
    }
}

/// Per-request statistics, in the JSON shape `grove generate --format json` prints.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct GenerateStats {
    /// The method this request ran with and its draft nodes per round (0 without speculation).
    pub algorithm: SpecAlgorithm,
    pub budget: usize,
    pub prompt_tokens: usize,
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
    pub stats: GenerateStats,
}

/// Runs requests against one model. KV pools are sized per request and freed with it.
pub struct Generator<'a> {
    pub(crate) model: &'a dyn Model,
    pub(crate) tokenizer: Option<&'a TextTokenizer>,
    pub(crate) options: GeneratorOptions,
    pub(crate) speculation: Option<Speculation<'a>>,
}

impl<'a> Generator<'a> {
    pub fn new(
        model: &'a dyn Model,
        tokenizer: Option<&'a TextTokenizer>,
        options: GeneratorOptions,
    ) -> Self {
        Self {
            model,
            tokenizer,
            options,
            speculation: None,
        }
    }

    /// Speculates with `spec` from now on; refuses a block size the drafter cannot fill.
    pub fn with_dflash(mut self, spec: DFlashSpec<'a>) -> Result<Self, ValidationError> {
        let block_size = spec.drafter.block_size();
        if !(2..=block_size).contains(&spec.num_draft_tokens) {
            return Err(ValidationError::OutOfRange {
                field: "speculative_num_draft_tokens",
                limit: "at least 2 and at most the drafter's block_size",
                value: format!("{} (block_size {block_size})", spec.num_draft_tokens),
            });
        }
        self.speculation = Some(Speculation {
            drafter: spec.drafter,
            method: Method::Chain {
                num_draft_tokens: spec.num_draft_tokens,
            },
        });
        Ok(self)
    }

    /// Speculates with draft trees from now on; refuses an empty budget or top-k.
    pub fn with_ddtree(mut self, spec: DDTreeSpec<'a>) -> Result<Self, ValidationError> {
        if spec.budget == 0 {
            return Err(ValidationError::OutOfRange {
                field: "speculative_ddtree_budget",
                limit: "at least 1",
                value: "0".into(),
            });
        }
        if spec.top_k == 0 {
            return Err(ValidationError::OutOfRange {
                field: "speculative_ddtree_topk",
                limit: "at least 1",
                value: "0".into(),
            });
        }
        self.speculation = Some(Speculation {
            drafter: spec.drafter,
            method: Method::Tree {
                budget: spec.budget,
                top_k: spec.top_k,
            },
        });
        Ok(self)
    }

    pub(crate) fn validate(&self, request: &GenerateRequest) -> Result<(), ValidationError> {
        let config = self.model.config();
        if request.prompt.is_empty() {
            return Err(ValidationError::Empty { field: "prompt" });
        }
        if let Some(&id) = request
            .prompt
            .iter()
            .find(|&&id| id as usize >= config.vocab_size)
        {
            return Err(ValidationError::TokenOutOfVocab {
                field: "prompt",
                id: id.into(),
                vocab_size: config.vocab_size,
            });
        }
        if request.stop.max_new_tokens == 0 {
            return Err(ValidationError::OutOfRange {
                field: "max_new_tokens",
                limit: "at least 1",
                value: "0".into(),
            });
        }
        if request.prompt.len() + request.stop.max_new_tokens > config.max_position_embeddings {
            return Err(ValidationError::ContextOverflow {
                prompt_tokens: request.prompt.len(),
                max_new_tokens: request.stop.max_new_tokens,
                context: config.max_position_embeddings,
            });
        }
        if self.options.page_size == 0 {
            return Err(ValidationError::OutOfRange {
                field: "page_size",
                limit: "at least 1",
                value: "0".into(),
            });
        }
        request.sampling.validate()?;
        self.resolve_method(request.speculation).map(|_| ())
    }

    /// Generates until a stop token, a stop string or `max_new_tokens`. `on_text` receives
    /// each piece of text as soon as it is final.
    pub fn generate(
        &self,
        request: &GenerateRequest,
        mut on_text: impl FnMut(&str),
    ) -> Result<GenerateOutput, EngineError> {
        let mut outputs = self.run(std::slice::from_ref(request), &mut |_, text: &str| {
            on_text(text)
        })?;
        Ok(outputs.pop().expect("one request in, one output out"))
    }

    /// Generates for several requests at once: each step drafts all unfinished sequences in one
    /// drafter pass and verifies them in one target forward. Every output is exactly what the
    /// request produces alone (up to float rounding of batched matmuls near ties).
    pub fn generate_batch(
        &self,
        requests: &[GenerateRequest],
    ) -> Result<Vec<GenerateOutput>, EngineError> {
        self.run(requests, &mut |_, _: &str| {})
    }

    /// The decode loop: an engine sized for all `requests` at once, stepped until idle.
    fn run(
        &self,
        requests: &[GenerateRequest],
        on_text: &mut impl FnMut(usize, &str),
    ) -> Result<Vec<GenerateOutput>, EngineError> {
        let page_size = self.options.page_size.max(1);
        let max_total_tokens = requests
            .iter()
            .map(|r| {
                (r.prompt.len() + r.stop.max_new_tokens + self.verify_rows()).div_ceil(page_size)
                    * page_size
            })
            .sum();
        let limits = EngineLimits {
            max_total_tokens,
            max_running: requests.len(),
        };
        let mut engine = Engine::new(self, limits)?;
        for request in requests {
            engine.submit(request.clone())?;
        }
        let mut outputs: Vec<Option<GenerateOutput>> = vec![None; requests.len()];
        while !engine.is_idle() {
            for event in engine.step()? {
                match event {
                    EngineEvent::Text { id, text } => on_text(id as usize, &text),
                    EngineEvent::Finished { id, output } => outputs[id as usize] = Some(*output),
                    EngineEvent::Started { .. } | EngineEvent::Tokens { .. } => {}
                }
            }
        }
        Ok(outputs
            .into_iter()
            .map(|o| o.expect("every request finishes"))
            .collect())
    }

    /// Flushes a finished sequence's text and completes its statistics; its pages return.
    pub(crate) fn finish(
        sequence: Sequence<'_>,
        on_text: &mut impl FnMut(&str),
    ) -> Result<GenerateOutput, EngineError> {
        let t_decode = sequence.decode_start.elapsed();
        let finish_reason = sequence.finish.expect("finished");
        let t_prefill = sequence.t_prefill;
        let prompt_len = sequence.request.prompt.len();
        let mut stats = sequence.stats;
        let (token_ids, text) = sequence.emitter.finish(on_text)?;
        let seconds = |d: Duration| d.as_secs_f64().max(1e-9);
        let emitted_in_rounds = token_ids.len() - 1;
        stats.prompt_tokens = prompt_len;
        stats.new_tokens = token_ids.len();
        stats.rounds = stats.accept_lengths.len();
        stats.mean_accept_length = if stats.rounds == 0 {
            0.0
        } else {
            stats.accept_lengths.iter().sum::<usize>() as f64 / stats.rounds as f64
        };
        stats.prefill_tokens_per_s = prompt_len as f64 / seconds(t_prefill);
        stats.decode_tokens_per_s = if emitted_in_rounds == 0 {
            0.0
        } else {
            emitted_in_rounds as f64 / seconds(t_decode)
        };
        stats.t_prefill_us = t_prefill.as_micros() as u64;
        stats.t_decode_us = t_decode.as_micros() as u64;
        Ok(GenerateOutput {
            token_ids,
            text,
            finish_reason,
            stats,
        })
    }

    /// Rows one verify may add past a sequence's committed length.
    /// Rows one verify may add past a sequence's committed length: the most any request may ask.
    pub(crate) fn verify_rows(&self) -> usize {
        speculation::verify_rows(self.speculation.map(|s| s.method))
    }

    pub(crate) fn taps(&self) -> &'a [usize] {
        self.speculation.map_or(&[], |s| s.drafter.target_taps())
    }
}
