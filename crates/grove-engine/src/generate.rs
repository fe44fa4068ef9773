//! Generation of one sequence: the single decode loop.
//!
//! Prefill runs in chunks and chooses the first token (the anchor). Every round then builds a
//! draft tree rooted at the anchor (root only without speculation, a chain of argmax drafts for
//! DFlash, the best-first DDTree for DDTree), verifies all its rows in one target forward
//! (ancestor-only visibility, position = base + depth), walks the target's own choices from the
//! root (argmax, or a fresh sample per visited node at T > 0), commits the accepted path's KV to
//! contiguous positions and emits the accepted drafts plus the target's next token, which
//! becomes the new anchor. Drafts come from one drafter pass over `[anchor, MASK x (S-1)]`; the
//! committed rows' taps extend the drafter's context.

use std::time::{Duration, Instant};

use candle_core::Tensor;
use grove_core::{FinishReason, SamplingParams, StopCondition, TokenId, ValidationError};
use grove_kv::{KvStore, PagePool, PageTable};
use grove_model::{ForwardBatch, LogitRows, Model, ModelError, Segment, TextTokenizer, Visibility};
use grove_spec::{top_k_candidates, DepthCandidates, DraftTree};

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
enum Method {
    /// A chain of `num_draft_tokens - 1` argmax drafts.
    Chain { num_draft_tokens: usize },
    /// A best-first tree of `budget` nodes over the top-`top_k` tokens per depth.
    Tree { budget: usize, top_k: usize },
}

#[derive(Clone, Copy)]
struct Speculation<'a> {
    drafter: &'a dyn Drafter,
    method: Method,
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
    model: &'a dyn Model,
    tokenizer: Option<&'a TextTokenizer>,
    options: GeneratorOptions,
    speculation: Option<Speculation<'a>>,
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
    tree_nodes: usize,
    draft: Duration,
    tree_build: Duration,
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
        let max_depth = self.speculation.map_or(0, |s| s.drafter.block_size() - 1);
        let mut stats = GenerateStats {
            accepted_per_position: vec![0; max_depth],
            accepted_depth_histogram: vec![0; max_depth + 1],
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
            stats.accepted_depth_histogram[round_emitted - 1] += 1;
            stats.tree_nodes += round.tree_nodes;
            stats.t_draft_us += round.draft.as_micros() as u64;
            stats.t_tree_build_us += round.tree_build.as_micros() as u64;
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
        // Verify rows may run up to a tree past the committed length.
        let verify_block = match self.speculation.map(|s| s.method) {
            None => 1,
            Some(Method::Chain { num_draft_tokens }) => num_draft_tokens,
            Some(Method::Tree { budget, .. }) => budget + 1,
        };
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
            .speculation
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
        self.speculation.map_or(&[], |s| s.drafter.target_taps())
    }

    /// Candidates per depth for this round's tree, or none (a root-only tree).
    fn draft(
        &self,
        sequence: &mut Sequence,
        remaining: usize,
    ) -> Result<Vec<DepthCandidates>, EngineError> {
        let (Some(spec), Some(context)) = (self.speculation, sequence.draft.as_mut()) else {
            return Ok(Vec::new());
        };
        // A round emits at most depth + 1 tokens: near the length limit shallower trees suffice,
        // and with one token left there is nothing to draft.
        let depth_cap = remaining - 1;
        let (depths, k) = match spec.method {
            Method::Chain { num_draft_tokens } => ((num_draft_tokens - 1).min(depth_cap), 1),
            Method::Tree { budget, top_k } => (
                (spec.drafter.block_size() - 1).min(depth_cap),
                top_k.min(budget),
            ),
        };
        if depths == 0 {
            return Ok(Vec::new());
        }
        if let Some(features) = sequence.pending_features.take() {
            spec.drafter.extend(context, &features)?;
        }
        let logits =
            spec.drafter
                .draft(self.model, context, sequence.anchor, sequence.table.len())?;
        let rows: Vec<Vec<f32>> = logits
            .narrow(0, 0, depths)
            .and_then(|l| l.to_vec2())
            .map_err(ModelError::from)?;
        // The reference drafts from raw logits at every temperature (exact: see sampler.rs).
        Ok(rows
            .iter()
            .map(|row| top_k_candidates(row, k, self.options.vocab_shards))
            .collect())
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
        let candidates = self.draft(sequence, remaining)?;
        let draft_time = draft_start.elapsed();

        let build_start = Instant::now();
        let budget = match self.speculation.map(|s| s.method) {
            Some(Method::Tree { budget, .. }) => budget,
            _ => candidates.len(),
        };
        let tree = DraftTree::build(sequence.anchor, &candidates, budget);
        let tree_build = build_start.elapsed();

        let verify_start = Instant::now();
        let table = &mut sequence.table;
        let base = table.len();
        table.reserve(tree.tokens.len())?;
        let positions: Vec<usize> = tree.depths.iter().map(|d| base + d).collect();
        let segment = Segment {
            table,
            context_len: base,
            tokens: &tree.tokens,
            positions: &positions,
            visibility: Visibility::Tree {
                parents: tree.row_parents(),
            },
            logits: LogitRows::All,
        };
        let output = self.model.forward(
            &ForwardBatch {
                segments: vec![segment],
                taps: self.taps(),
            },
            &mut sequence.kv,
        )?;
        let rows: Vec<Vec<f32>> = output.logits.to_vec2().map_err(ModelError::from)?;
        let verify_time = verify_start.elapsed();

        // Walk: the target's choice at each visited node, drawn once per node in path order;
        // nodes off the path are never sampled.
        let commit_start = Instant::now();
        let (path, bonus) = tree.walk(|node| sampler.sample(&rows[node]));
        // The path's K/V move to contiguous positions base.. (no re-rotation: a node's position
        // already is base + depth); rows off the path are freed.
        table.commit_path(&mut sequence.kv, base, &path);
        if !output.taps.is_empty() {
            let rows = Tensor::from_vec(
                path.iter().map(|&n| n as u32).collect::<Vec<_>>(),
                path.len(),
                &candle_core::Device::Cpu,
            )
            .map_err(ModelError::from)?;
            let mut features = Tensor::cat(&output.taps, 1)
                .and_then(|f| f.index_select(&rows, 0))
                .map_err(ModelError::from)?;
            // A round that drafted nothing left earlier features pending: keep them in order.
            if let Some(earlier) = sequence.pending_features.take() {
                features = Tensor::cat(&[earlier, features], 0).map_err(ModelError::from)?;
            }
            sequence.pending_features = Some(features);
        }
        sequence.anchor = bonus;
        let mut tokens: Vec<TokenId> = path[1..].iter().map(|&n| tree.tokens[n]).collect();
        tokens.push(bonus);
        Ok(Round {
            tokens,
            tree_nodes: tree.len(),
            draft: draft_time,
            tree_build,
            verify: verify_time,
            commit: commit_start.elapsed(),
        })
    }
}
