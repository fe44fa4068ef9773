//! Generation of one sequence: the single decode loop.
//!
//! Prefill runs in chunks and chooses the first token (the anchor). Every round then verifies
//! `[anchor, drafts...]` causally in one target forward (no drafts without speculation), walks
//! the target's own choices along the drafts (argmax, or a fresh sample per position at T > 0),
//! commits the anchor and the accepted drafts to KV and emits the accepted drafts plus the
//! target's next token, which becomes the new anchor. DFlash drafts come from one drafter pass
//! over `[anchor, MASK x (S-1)]`; the committed rows' taps extend the drafter's context.

use std::time::{Duration, Instant};

use candle_core::Tensor;
use grove_core::{FinishReason, SamplingParams, StopCondition, TokenId, ValidationError};
use grove_kv::{KvStore, PagePool, PageTable};
use grove_model::{ForwardBatch, LogitRows, Model, ModelError, Segment, TextTokenizer};

use crate::drafter::{DraftContext, Drafter};
use crate::emitter::Emitter;
use crate::sampler::Sampler;
use crate::EngineError;

/// Prompt rows per prefill forward: bounds activation memory on long prompts.
pub const DEFAULT_PREFILL_CHUNK: usize = 512;

/// Settings of the engine, as opposed to those of a request.
#[derive(Debug, Clone)]
pub struct GeneratorOptions {
    pub page_size: usize,
    pub prefill_chunk: usize,
}

impl Default for GeneratorOptions {
    fn default() -> Self {
        Self {
            page_size: 1,
            prefill_chunk: DEFAULT_PREFILL_CHUNK,
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

#[derive(Debug, Clone)]
pub struct GenerateRequest {
    pub prompt: Vec<TokenId>,
    pub sampling: SamplingParams,
    pub stop: StopCondition,
}

/// Per-request statistics, in the JSON shape `grove generate --format json` prints.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct GenerateStats {
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
    pub t_draft_us: u64,
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
    model: &'a dyn Model,
    tokenizer: Option<&'a TextTokenizer>,
    options: GeneratorOptions,
    dflash: Option<DFlashSpec<'a>>,
}

/// The KV state of one sequence: the target's, and the drafter's context if speculating.
struct Sequence {
    table: PageTable,
    kv: KvStore,
    draft: Option<DraftContext>,
    /// Taps of committed tokens not yet in the drafter's context, `[rows, taps * hidden]`.
    pending_features: Option<Tensor>,
    /// The last chosen token; not yet in KV.
    anchor: TokenId,
}

/// What one round produced.
struct Round {
    /// Accepted drafts followed by the target's own next token.
    tokens: Vec<TokenId>,
    draft: Duration,
    verify: Duration,
    commit: Duration,
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
            dflash: None,
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
        self.dflash = Some(spec);
        Ok(self)
    }

    fn validate(&self, request: &GenerateRequest) -> Result<(), ValidationError> {
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
        request.sampling.validate()
    }

    /// Generates until a stop token, a stop string or `max_new_tokens`. `on_text` receives
    /// each piece of text as soon as it is final.
    pub fn generate(
        &self,
        request: &GenerateRequest,
        mut on_text: impl FnMut(&str),
    ) -> Result<GenerateOutput, EngineError> {
        self.validate(request)?;
        let prompt_len = request.prompt.len();
        let max_new = request.stop.max_new_tokens;
        let mut sampler = Sampler::new(request.sampling.clone());
        let mut emitter = Emitter::new(self.tokenizer, &request.stop);

        let prefill_start = Instant::now();
        let mut sequence = self.start(&request.prompt, max_new, &mut sampler)?;
        let t_prefill = prefill_start.elapsed();

        let decode_start = Instant::now();
        let mut stats = GenerateStats {
            accepted_per_position: vec![0; self.dflash.map_or(0, |s| s.num_draft_tokens - 1)],
            ..GenerateStats::default()
        };
        let mut emitted = 1;
        let mut finish = emitter.emit(sequence.anchor, &mut on_text)?;
        while finish.is_none() {
            let round = self.round(&mut sequence, max_new - emitted, &mut sampler)?;
            // A stop inside the round cuts it: tau counts only the tokens emitted.
            let mut round_emitted = 0;
            for &token in &round.tokens {
                round_emitted += 1;
                finish = emitter.emit(token, &mut on_text)?;
                if finish.is_some() {
                    break;
                }
            }
            emitted += round_emitted;
            for position in stats
                .accepted_per_position
                .iter_mut()
                .take(round_emitted - 1)
            {
                *position += 1;
            }
            stats.accept_lengths.push(round_emitted);
            stats.t_draft_us += round.draft.as_micros() as u64;
            stats.t_verify_us += round.verify.as_micros() as u64;
            stats.t_commit_us += round.commit.as_micros() as u64;
        }
        let t_decode = decode_start.elapsed();
        let finish_reason = finish.expect("the loop ends with a reason");
        let (token_ids, text) = emitter.finish(&mut on_text)?;

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

    /// Allocates the KV pools, runs the prompt in chunks (capturing the drafter's taps) and
    /// chooses the first token.
    fn start(
        &self,
        prompt: &[TokenId],
        max_new: usize,
        sampler: &mut Sampler,
    ) -> Result<Sequence, EngineError> {
        let page_size = self.options.page_size;
        // Verify rows may run up to a block past the committed length.
        let verify_block = self.dflash.map_or(1, |s| s.num_draft_tokens);
        let pool = PagePool::new(
            (prompt.len() + max_new + verify_block).div_ceil(page_size),
            page_size,
        )?;
        let mut table = pool.new_table();
        let mut kv = self.model.new_kv_store(pool.num_slots());
        let taps = self.taps();
        let mut last_logits = Vec::new();
        let mut features = Vec::new();
        for chunk in prompt.chunks(self.options.prefill_chunk.max(1)) {
            table.reserve(chunk.len())?;
            let positions: Vec<usize> = (table.len()..table.len() + chunk.len()).collect();
            let segment = Segment::causal(&table, chunk, &positions, LogitRows::Last);
            let output = self.model.forward(
                &ForwardBatch {
                    segments: vec![segment],
                    taps,
                },
                &mut kv,
            )?;
            table.append(chunk.len());
            last_logits = output.logits_row(0).map_err(ModelError::from)?;
            if !taps.is_empty() {
                features.push(Tensor::cat(&output.taps, 1).map_err(ModelError::from)?);
            }
        }
        let draft = self
            .dflash
            .map(|spec| spec.drafter.new_context(prompt.len() + max_new, page_size))
            .transpose()?;
        let pending_features = if features.is_empty() {
            None
        } else {
            Some(Tensor::cat(&features, 0).map_err(ModelError::from)?)
        };
        Ok(Sequence {
            table,
            kv,
            draft,
            pending_features,
            anchor: sampler.sample(&last_logits),
        })
    }

    fn taps(&self) -> &'a [usize] {
        self.dflash.map_or(&[], |s| s.drafter.target_taps())
    }

    /// One round; emits at most `remaining` tokens.
    fn round(
        &self,
        sequence: &mut Sequence,
        remaining: usize,
        sampler: &mut Sampler,
    ) -> Result<Round, EngineError> {
        debug_assert!(remaining >= 1);
        let draft_start = Instant::now();
        let mut drafts = Vec::new();
        if let (Some(spec), Some(context)) = (self.dflash, sequence.draft.as_mut()) {
            // Near the length limit a shorter block suffices; with one token left there is
            // nothing to draft.
            let verify_len = spec.num_draft_tokens.min(remaining);
            if verify_len > 1 {
                if let Some(features) = sequence.pending_features.take() {
                    spec.drafter.extend(context, &features)?;
                }
                let draft = spec.drafter.draft(
                    self.model,
                    context,
                    sequence.anchor,
                    sequence.table.len(),
                )?;
                let logits = draft
                    .narrow(0, 0, verify_len - 1)
                    .map_err(ModelError::from)?;
                // The reference drafts greedily at every temperature (exact: see sampler.rs).
                drafts = logits
                    .argmax(1)
                    .and_then(|t| t.to_vec1::<u32>())
                    .map_err(ModelError::from)?;
            }
        }
        let draft_time = draft_start.elapsed();

        let verify_start = Instant::now();
        let mut tokens = Vec::with_capacity(drafts.len() + 1);
        tokens.push(sequence.anchor);
        tokens.extend_from_slice(&drafts);
        let table = &mut sequence.table;
        table.reserve(tokens.len())?;
        let positions: Vec<usize> = (table.len()..table.len() + tokens.len()).collect();
        let segment = Segment::causal(table, &tokens, &positions, LogitRows::All);
        let output = self.model.forward(
            &ForwardBatch {
                segments: vec![segment],
                taps: self.taps(),
            },
            &mut sequence.kv,
        )?;
        let rows: Vec<Vec<f32>> = output.logits.to_vec2().map_err(ModelError::from)?;
        let verify_time = verify_start.elapsed();

        // Walk: the target's choice after each committed prefix; a draft is accepted while it
        // equals that choice. Rows past the first mismatch are never sampled.
        let commit_start = Instant::now();
        let mut accepted = Vec::with_capacity(tokens.len());
        for (row, logits) in rows.iter().enumerate() {
            let choice = sampler.sample(logits);
            accepted.push(choice);
            if drafts.get(row) != Some(&choice) {
                break;
            }
        }
        let committed = accepted.len(); // anchor + accepted drafts
        table.append(committed);
        table.truncate(table.len()); // frees pages that only held rejected rows
        if !output.taps.is_empty() {
            let mut features = Tensor::cat(&output.taps, 1)
                .and_then(|f| f.narrow(0, 0, committed))
                .map_err(ModelError::from)?;
            // A round that drafted nothing left earlier features pending: keep them in order.
            if let Some(earlier) = sequence.pending_features.take() {
                features = Tensor::cat(&[earlier, features], 0).map_err(ModelError::from)?;
            }
            sequence.pending_features = Some(features);
        }
        sequence.anchor = *accepted
            .last()
            .expect("the walk chooses at least one token");
        Ok(Round {
            tokens: accepted,
            draft: draft_time,
            verify: verify_time,
            commit: commit_start.elapsed(),
        })
    }
}
