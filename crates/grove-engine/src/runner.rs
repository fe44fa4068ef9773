//! The round runner: one model, its tokenizer and drafter, and the stages of a batched step.
//! Every active sequence's round is drafted in one drafter pass and verified in one target
//! forward (ragged trees, per-sequence visibility and positions); the walk and the commit are
//! per sequence. Sequences share one target KV store and one drafter store, each owning page
//! tables in them, so a finished or preempted sequence returns its pages at once.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use candle_core::Tensor;
use grove_core::{TokenId, ValidationError};
use grove_kv::{KvStore, PagePool, PrefixCache};
use grove_model::layers::with_host_values;
use grove_model::{ForwardBatch, LogitRows, Model, ModelError, Segment, TextTokenizer, Visibility};
use grove_spec::{
    map_to_target_ids, top_k_candidates, AcceptResult, DepthCandidates, DraftTree, LookupConfig,
    SegmentPlan, VerifyPlan,
};

use crate::budget::AutoBudget;
use crate::drafter::{DraftBlock, Drafter};
use crate::emitter::Emitter;
use crate::logprobs::{TokenLogprob, MAX_TOP_LOGPROBS};
use crate::request::{GenerateRequest, GeneratorOptions};
use crate::sequence::{Pools, Sequence};
use crate::speculation::{self, Method, Speculation, SpeculationOverride};
use crate::EngineError;

/// What one batched step did and how long each phase took (draft, tree build and verify are
/// charged to every sequence in the step; commit is summed over them).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepTimings {
    pub sequences: usize,
    /// Rows the target verified (tree nodes including roots).
    pub verified_rows: usize,
    pub draft: Duration,
    pub tree_build: Duration,
    pub verify: Duration,
    pub commit: Duration,
    /// Draft nodes verified by each sequence that speculates (its method drafts), in batch
    /// order: the budget chosen this round.
    pub budgets: Vec<usize>,
    /// Sequences that drafted.
    pub drafted: usize,
    /// Accepted drafts the calibrated drafter predicted, and those the walk accepted.
    pub predicted_accepted: f64,
    pub accepted: usize,
}

/// A step's results: the tokens each sequence of the batch emitted, in batch order.
pub(crate) struct StepResult {
    pub timings: StepTimings,
    pub emitted: Vec<Vec<TokenId>>,
}

/// What one [`RoundRunner::prefill_chunk`] did.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PrefillProgress {
    /// Tokens it ran.
    pub tokens: usize,
    /// The sequence's KV now holds everything it committed.
    pub done: bool,
    /// The first token a fresh sequence chose (`None` until done, or when it resumed).
    pub first: Option<TokenId>,
}

/// Runs prefills and rounds against one model; holds settings, never sequences.
#[derive(Clone)]
pub(crate) struct RoundRunner<'a> {
    pub model: &'a dyn Model,
    pub tokenizer: Option<&'a TextTokenizer>,
    pub options: GeneratorOptions,
    pub speculation: Option<Speculation<'a>>,
    /// Measured costs and calibration for automatic budgets, shared by the generator's engines.
    pub auto: Arc<Mutex<AutoBudget>>,
}

/// Draft rows a sequence that does not draft may leave pending before they are added to the
/// drafter's context anyway (bounds their memory and the next draft's extend).
const MAX_PENDING_ROWS: usize = 64;

impl<'a> RoundRunner<'a> {
    /// Checks `request` against the model and the engine's speculation; returns the method its
    /// rounds use.
    pub fn validate(&self, request: &GenerateRequest) -> Result<(Method, bool), ValidationError> {
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
        request.adjustments.validate(config.vocab_size)?;
        if request.grammar.is_some() && request.stop.stop_token_ids.is_empty() {
            // A schema's value ends with a stop token; without one nothing may follow it.
            return Err(ValidationError::Unsupported {
                field: "response_format",
                allowed: "only with an end-of-sequence token (not with ignore_eos)",
            });
        }
        if let Some(top) = request.logprobs.filter(|&top| top > MAX_TOP_LOGPROBS) {
            return Err(ValidationError::OutOfRange {
                field: "logprobs",
                limit: "at most 20 alternatives",
                value: top.to_string(),
            });
        }
        self.resolve(request.speculation)
    }

    /// What a request with `choice` drafts each round, and whether its budget is automatic.
    pub fn resolve(&self, choice: SpeculationOverride) -> Result<(Method, bool), ValidationError> {
        speculation::resolve(self.speculation, choice)
    }

    /// The method requests get when they do not choose (and the most rows they may verify).
    pub fn default_method(&self) -> Method {
        speculation::default_method(self.speculation)
    }

    /// The engine's drafter (none without speculation, or when it drafts by lookup alone).
    pub fn drafter(&self) -> Option<&'a dyn Drafter> {
        self.speculation.and_then(|s| s.drafter)
    }

    /// Whether rounds of `method` (with an automatic budget when `auto`) merge a lookup tree
    /// into the drafter's: DDTree with an automatic budget, where the engine says so.
    fn merges_lookup(&self, method: Method, auto: bool) -> bool {
        auto && matches!(method, Method::Tree { .. })
            && self.speculation.is_some_and(|s| s.lookup_in_trees)
    }

    /// Whether requests that do not choose draft by lookup (alone, or merged into DDTree's
    /// trees): then an engine keeps a lookup corpus unless told not to.
    pub fn drafts_by_lookup(&self) -> bool {
        self.speculation.is_some_and(|s| {
            matches!(s.method, Method::Lookup { .. }) || self.merges_lookup(s.method, s.auto)
        })
    }

    /// How lookup trees match the text (the defaults without speculation).
    pub fn lookup_config(&self) -> LookupConfig {
        self.speculation.map_or(LookupConfig::DEFAULT, |s| s.lookup)
    }

    fn taps(&self) -> &'a [usize] {
        self.drafter().map_or(&[], |d| d.target_taps())
    }

    /// Pools of `target_pages` pages for the target and enough for the drafter's context, with
    /// a prefix cache over them when `prefix_cache`.
    pub fn pools(
        &self,
        target_pages: usize,
        max_running: usize,
        prefix_cache: bool,
    ) -> Result<Pools, EngineError> {
        let page_size = self.options.page_size;
        let pool = PagePool::new(target_pages, page_size)?;
        // The drafter holds the committed context plus one block per running sequence.
        let draft_pages = self.drafter().map_or(0, |d| {
            target_pages + max_running * d.block_size().div_ceil(page_size)
        });
        let draft_pool = PagePool::new(draft_pages, page_size)?;
        let prefix = prefix_cache.then(|| {
            let draft = self.drafter().map(|_| draft_pool.clone());
            PrefixCache::new(pool.clone(), draft)
        });
        Ok(Pools {
            kv: self.model.new_kv_store(pool.num_slots()),
            draft_kv: match self.drafter() {
                Some(drafter) => drafter.new_kv_store(draft_pool.num_slots()),
                None => KvStore::new(0, 0, 0, 0),
            },
            prefix,
            pool,
            draft_pool,
            corpus: None,
            external_corpus: None,
        })
    }

    /// A new sequence for `request`, holding no KV yet.
    pub fn sequence(
        &self,
        id: u64,
        request: Arc<GenerateRequest>,
        method: (Method, bool),
        pools: &Pools,
    ) -> Sequence<'a> {
        let drafted_depth = self.drafter().map_or(0, |d| d.block_size() - 1);
        let max_depth = match method.0 {
            Method::Lookup { budget } => budget,
            // Lookup drafts in its trees may go deeper than the drafter's block.
            Method::Tree { budget, .. } if self.merges_lookup(method.0, method.1) => {
                drafted_depth.max(budget)
            }
            _ => drafted_depth,
        };
        let emitter = Emitter::new(self.tokenizer, &request.stop);
        let budget = AutoBudget::lock(&self.auto).new_sequence();
        let mut sequence = Sequence::new(id, request, method, emitter, pools, (max_depth, budget));
        if sequence.auto && budget.dormant() {
            // Drafting has not paid lately and it is not this one's turn to look: its prefill
            // need not feed the drafter either.
            sequence.drop_draft_context();
        }
        sequence
    }

    /// Pages of each pool `sequence` still needs for its prefill and first round, past what
    /// its tables already hold (a shared cached prefix): `(target, drafter)`.
    pub fn prefill_pages(&self, sequence: &Sequence<'_>) -> (usize, usize) {
        let shared = sequence.table.len();
        let target = sequence
            .table
            .pages_missing(sequence.prefill_need() - shared);
        let committed = sequence.prefill_need() - sequence.method.verify_rows();
        let draft = sequence.draft_table.as_ref().map_or(0, |table| {
            table.pages_missing(committed - table.len() + self.round_block(sequence))
        });
        (target, draft)
    }

    /// Drafter slots a round of `sequence` writes past its context (0: it does not draft).
    fn round_block(&self, sequence: &Sequence<'_>) -> usize {
        match self.drafter() {
            Some(drafter) if sequence.method.uses_drafter() => drafter.block_size(),
            _ => 0,
        }
    }

    /// Reserves, at admission, every page `sequence`'s prefill and first round take in both
    /// pools (what [`RoundRunner::prefill_pages`] counted), so that rounds of the sequences
    /// running beside a prefill spread over several steps cannot take them. All or nothing.
    pub fn reserve_prefill(&self, sequence: &mut Sequence<'_>) -> Result<(), grove_kv::KvError> {
        let need = sequence.prefill_need() - sequence.table.len();
        let committed = sequence.prefill_need() - sequence.method.verify_rows();
        let block = self.round_block(sequence);
        sequence.table.reserve(need)?;
        if let Some(table) = sequence.draft_table.as_mut() {
            if let Err(error) = table.reserve(committed - table.len() + block) {
                let shared = sequence.table.len();
                sequence.table.truncate(shared);
                return Err(error);
            }
        }
        Ok(())
    }

    /// Runs the next `max_tokens` (at most) of the committed tokens not yet in KV through the
    /// target in one forward, keeping their taps for the drafter. The chunk that ends the
    /// prefill adds every chunk's taps to the drafter's context at once (so the sequence's
    /// pages can be cached with the drafter's); a fresh sequence then chooses and emits its
    /// first token, a preempted one resumes with the anchor it had.
    pub fn prefill_chunk(
        &self,
        sequence: &mut Sequence<'_>,
        pools: &mut Pools,
        max_tokens: usize,
        on_text: &mut impl FnMut(&str),
    ) -> Result<PrefillProgress, EngineError> {
        let prefill_start = Instant::now();
        let tokens = sequence.committed_tokens();
        // Only sequences that keep a drafter context capture the drafter's features.
        let taps = if sequence.draft_table.is_some() {
            self.taps()
        } else {
            &[]
        };
        // Scoring the prompt: every row's logits, in chunks small enough for them.
        let scoring = sequence.scores_prompt();
        let table = &mut sequence.table;
        let start = table.len();
        let len = max_tokens
            .min(self.options.prefill_chunk)
            .min(tokens.len() - start)
            .max(1);
        let len = if scoring { len.min(SCORING_CHUNK) } else { len };
        let chunk = &tokens[start..start + len];
        table.reserve(len)?;
        let positions: Vec<usize> = (start..start + len).collect();
        let rows = if scoring {
            LogitRows::All
        } else {
            LogitRows::Last
        };
        let segment = Segment::causal(table, chunk, &positions, rows);
        let batch = ForwardBatch {
            segments: vec![segment],
            taps,
        };
        let output = self.model.forward(&batch, &mut pools.kv)?;
        table.append(len);
        if !taps.is_empty() {
            let features = Tensor::cat(&output.taps, 1).map_err(ModelError::from)?;
            sequence.prefill_features.push(features);
        }
        if scoring {
            score_prompt(sequence, &output, start, len)?;
        }
        let done = start + len == tokens.len();
        let mut progress = PrefillProgress {
            tokens: len,
            done,
            first: None,
        };
        if done {
            self.end_prefill(sequence, pools)?;
            if sequence.emitted == 0 {
                let last = if scoring { len - 1 } else { 0 };
                let logits = output.logits_row(last).map_err(ModelError::from)?;
                sequence.anchor = sequence.choose(&logits, Vec::new);
                sequence.count(sequence.anchor);
                if let Some(top) = sequence.request.logprobs {
                    let chosen = TokenLogprob::of(&logits, sequence.anchor, top);
                    sequence.logprobs.push(chosen);
                }
                sequence.emitted = 1;
                sequence.decode_start = Instant::now();
                sequence.finish = sequence.emitter.emit(sequence.anchor, on_text)?;
                progress.first = Some(sequence.anchor);
            }
        }
        sequence.t_prefill += prefill_start.elapsed();
        Ok(progress)
    }

    /// Adds the prefill's taps to the drafter's context in one extend.
    fn end_prefill(
        &self,
        sequence: &mut Sequence<'_>,
        pools: &mut Pools,
    ) -> Result<(), EngineError> {
        sequence.pending_features = None;
        let features = std::mem::take(&mut sequence.prefill_features);
        if let (false, Some(drafter), Some(draft_table)) = (
            features.is_empty(),
            self.drafter(),
            sequence.draft_table.as_mut(),
        ) {
            let features = Tensor::cat(&features, 0).map_err(ModelError::from)?;
            debug_assert_eq!(
                draft_table.len() + features.dim(0).unwrap_or(0),
                sequence.table.len(),
                "drafter context out of step"
            );
            drafter.extend(&mut pools.draft_kv, draft_table, &features)?;
        }
        Ok(())
    }

    /// Pages of each pool [`RoundRunner::reserve_round`] takes for `sequence`:
    /// `(target, drafter)`.
    pub fn round_pages(&self, sequence: &Sequence<'_>) -> (usize, usize) {
        let target = sequence.table.pages_missing(sequence.method.verify_rows());
        let block = self.round_block(sequence);
        let draft = match &sequence.draft_table {
            Some(table) if block > 0 => table.pages_missing(Self::pending_rows(sequence) + block),
            _ => 0,
        };
        (target, draft)
    }

    fn pending_rows(sequence: &Sequence<'_>) -> usize {
        sequence
            .pending_features
            .as_ref()
            .map_or(0, |f| f.dim(0).unwrap_or(0))
    }

    /// Reserves what the next round of `sequence` needs in both pools (all or nothing).
    pub fn reserve_round(&self, sequence: &mut Sequence<'_>) -> Result<(), grove_kv::KvError> {
        sequence.table.reserve(sequence.method.verify_rows())?;
        let pending = Self::pending_rows(sequence);
        let block = self.round_block(sequence);
        if let (Some(table), true) = (sequence.draft_table.as_mut(), block > 0) {
            if let Err(error) = table.reserve(pending + block) {
                let committed = sequence.table.len();
                sequence.table.truncate(committed);
                return Err(error);
            }
        }
        Ok(())
    }

    /// One round for every sequence in `batch` (none of them finished): draft, build,
    /// compile, verify, then accept, commit and emit per sequence.
    pub fn step(
        &self,
        batch: &mut [&mut Sequence<'_>],
        pools: &mut Pools,
        on_text: &mut impl FnMut(u64, &str),
    ) -> Result<StepResult, EngineError> {
        let mut timings = StepTimings {
            sequences: batch.len(),
            ..StepTimings::default()
        };
        let context = batch.iter().map(|s| s.table.len()).sum::<usize>() / batch.len().max(1);
        self.plan_drafting(batch, context);
        let start = Instant::now();
        let candidates = self.draft(batch, pools)?;
        timings.draft = start.elapsed();
        timings.drafted = batch
            .iter()
            .filter(|s| s.draft_now && s.method.uses_drafter())
            .count();

        let start = Instant::now();
        let lookup = self.lookup_config();
        let corpora = pools.corpora();
        let mut trees: Vec<DraftTree> = batch
            .iter()
            .zip(&candidates)
            .map(|(sequence, candidates)| match sequence.method {
                Method::Lookup { budget } => sequence.lookup_tree(lookup, budget, &corpora),
                _ => sequence.draft_tree(candidates),
            })
            .collect();
        // Automatic DDTree budgets choose among lookup drafts too (even in a round the
        // drafter sits out).
        let lookups: Vec<Option<DraftTree>> = batch
            .iter()
            .map(|s| {
                self.merges_lookup(s.method, s.auto)
                    .then(|| s.lookup_tree(lookup, s.method.budget(), &corpora))
            })
            .collect();
        let (gains, sources) =
            self.choose_budgets(batch, &mut trees, lookups, context, timings.draft);
        timings.predicted_accepted = gains.iter().flatten().sum();
        timings.budgets = batch
            .iter()
            .zip(&trees)
            .filter(|(s, _)| s.method.drafts())
            .map(|(_, t)| t.len())
            .collect();
        let bases: Vec<usize> = batch.iter().map(|s| s.table.len()).collect();
        let plan = VerifyPlan::new(&trees.iter().collect::<Vec<_>>(), &bases);
        timings.tree_build = start.elapsed();
        timings.verified_rows = plan.rows();

        let start = Instant::now();
        let (logits, taps) = self.verify(batch, &plan, pools)?;
        timings.verify = start.elapsed();

        // The rows are read where the model wrote them (a copy of Qwen2.5's 151936 logits took
        // 110-150 us of every decoding step).
        let vocab = logits.dim(1).map_err(ModelError::from)?;
        let accept_all = |logits: &[f32]| -> Result<Vec<Vec<TokenId>>, EngineError> {
            let mut emitted = Vec::with_capacity(batch.len());
            let rounds = batch.iter_mut().zip(&trees).zip(&plan.segments);
            let rounds = rounds.zip(&candidates).zip(&sources);
            for ((((sequence, tree), segment), drafted), sources) in rounds {
                let rows =
                    &logits[segment.logits_rows.start * vocab..][..tree.tokens.len() * vocab];
                let id = sequence.id;
                let commit_start = Instant::now();
                let result =
                    self.accept_and_commit(sequence, tree, segment, rows, taps.as_ref(), pools)?;
                timings.accepted += result.path.len() - 1;
                // What the drafter's own nodes gave, for its calibration and its plan.
                let (accepted, nodes, depth) =
                    observe(&self.auto, sequence.method, tree, sources, &result);
                if sequence.auto && sequence.draft_now && sequence.method.uses_drafter() {
                    sequence.budget.drafted(accepted as f64, nodes);
                    sequence.budget.reached(depth, drafted.len());
                }
                let commit = commit_start.elapsed();
                timings.commit += commit;
                let phases = &mut sequence.phases;
                phases.draft += timings.draft.as_micros() as u64;
                phases.tree_build += timings.tree_build.as_micros() as u64;
                phases.verify += timings.verify.as_micros() as u64;
                phases.commit += commit.as_micros() as u64;
                let mut on_text = |text: &str| on_text(id, text);
                emitted.push(sequence.emit_round(result, tree.len(), &mut on_text)?);
            }
            Ok(emitted)
        };
        let emitted = with_host_values(&logits, accept_all).map_err(ModelError::from)??;
        self.observe_costs(&timings, context);
        Ok(StepResult { timings, emitted })
    }

    /// The target's forward over `plan`'s rows; returns its logits and, when speculating, the
    /// taps of every row (`[rows, taps * hidden]`).
    fn verify(
        &self,
        batch: &mut [&mut Sequence<'_>],
        plan: &VerifyPlan,
        pools: &mut Pools,
    ) -> Result<(Tensor, Option<Tensor>), EngineError> {
        for (sequence, segment) in batch.iter_mut().zip(&plan.segments) {
            sequence.table.reserve(segment.tokens.len())?;
        }
        let segments = batch
            .iter()
            .zip(&plan.segments)
            .map(|(sequence, segment)| Segment {
                table: &sequence.table,
                context_len: segment.base,
                tokens: &segment.tokens,
                positions: &segment.positions,
                visibility: Visibility::Tree {
                    parents: segment.parents.clone(),
                },
                logits: LogitRows::All,
            })
            .collect();
        // Taps only when a sequence keeps a drafter context to add them to.
        let keeps_context = batch
            .iter()
            .any(|s| s.method.uses_drafter() && s.draft_table.is_some());
        let forward = ForwardBatch {
            segments,
            taps: if keeps_context { self.taps() } else { &[] },
        };
        let output = self.model.forward(&forward, &mut pools.kv)?;
        let taps = if output.taps.is_empty() {
            None
        } else {
            Some(Tensor::cat(&output.taps, 1).map_err(ModelError::from)?)
        };
        Ok((output.logits, taps))
    }

    /// Walks the target's choices through `tree` (`logits`: its rows, `[rows, vocab]`), moves
    /// the accepted path's K/V to contiguous positions (no re-rotation: a node's position
    /// already is base + depth; rows off the path are freed) and queues the path's taps for
    /// the drafter. The anchor becomes the bonus token.
    fn accept_and_commit(
        &self,
        sequence: &mut Sequence<'_>,
        tree: &DraftTree,
        segment: &SegmentPlan,
        logits: &[f32],
        taps: Option<&Tensor>,
        pools: &mut Pools,
    ) -> Result<AcceptResult, EngineError> {
        let vocab = logits.len() / tree.tokens.len();
        // The target's choice at each visited node, drawn once per node in path order; nodes
        // off the path are never sampled. Its log-probability from the same row, if asked.
        let mut choices = std::mem::take(&mut sequence.choice_logprobs);
        let top = sequence.request.logprobs;
        choices.clear();
        let result = AcceptResult::walk(tree, |node| {
            let row = &logits[node * vocab..][..vocab];
            let path = || tree.path(node);
            let token = sequence.choose(row, path);
            if let Some(top) = top {
                choices.push(TokenLogprob::of(row, token, top));
            }
            token
        });
        sequence.choice_logprobs = choices;
        sequence
            .table
            .commit_path(&mut pools.kv, segment.base, &result.path);
        if let (Some(taps), true, true) = (
            taps,
            sequence.method.uses_drafter(),
            sequence.draft_table.is_some(),
        ) {
            let first = segment.logits_rows.start;
            let picked: Vec<u32> = result.path.iter().map(|&n| (first + n) as u32).collect();
            let picked = Tensor::from_vec(picked, result.path.len(), &candle_core::Device::Cpu)
                .map_err(ModelError::from)?;
            let mut features = taps.index_select(&picked, 0).map_err(ModelError::from)?;
            // A round that drafted nothing left earlier features pending: keep them in order.
            if let Some(earlier) = sequence.pending_features.take() {
                features = Tensor::cat(&[earlier, features], 0).map_err(ModelError::from)?;
            }
            sequence.pending_features = Some(features);
        }
        sequence.anchor = result.bonus;
        Ok(result)
    }

    /// Per-depth candidates for each sequence's tree (empty: a root-only tree), from one
    /// batched drafter pass over the sequences that draft this round (whose committed rows
    /// join their drafter contexts first; a sequence that does not draft adds them in batches).
    fn draft(
        &self,
        batch: &mut [&mut Sequence<'_>],
        pools: &mut Pools,
    ) -> Result<Vec<Vec<DepthCandidates>>, EngineError> {
        let mut candidates = vec![Vec::new(); batch.len()];
        let Some(drafter) = self.drafter() else {
            return Ok(candidates);
        };
        let block_size = drafter.block_size();
        let shapes: Vec<(usize, usize)> = batch
            .iter()
            .map(|s| {
                let constrained = s.request.grammar.is_some();
                let (most, k) = s.method.draft_shape(block_size, s.remaining(), constrained);
                // An automatic budget drafts as deep as its trees have lately gone.
                let depths = if s.auto { s.budget.depths(most) } else { most };
                (depths, k)
            })
            .collect();
        let mut blocks = Vec::new();
        let mut drafting = Vec::new();
        for (index, (sequence, &(depths, _))) in batch.iter_mut().zip(&shapes).enumerate() {
            if !sequence.method.uses_drafter() {
                // Lookup drafts need no drafter. One that keeps the drafter's context for the
                // prefix cache keeps its prompt's, as a plain sequence does.
                continue;
            }
            sequence.draft_now &= depths > 0;
            let pending = Self::pending_rows(sequence);
            if !sequence.draft_now && pending < MAX_PENDING_ROWS {
                continue;
            }
            let position = sequence.table.len();
            let draft_table = sequence
                .draft_table
                .as_mut()
                .expect("speculating sequences have a drafter table");
            if let Some(features) = sequence.pending_features.take() {
                drafter.extend(&mut pools.draft_kv, draft_table, &features)?;
            }
            if !sequence.draft_now {
                continue;
            }
            blocks.push(DraftBlock {
                table: draft_table,
                anchor: sequence.anchor,
                position,
                depths,
            });
            drafting.push(index);
        }
        if blocks.is_empty() {
            return Ok(candidates);
        }
        let logits = drafter.draft(self.model, &mut pools.draft_kv, &mut blocks)?;
        for (index, logits) in drafting.into_iter().zip(logits) {
            let k = shapes[index].1;
            // The reference drafts from raw logits at every temperature (exact: see sampler.rs).
            let vocab = logits.dim(1).map_err(ModelError::from)?;
            let top_k = |rows: &[f32]| -> Vec<DepthCandidates> {
                rows.chunks_exact(vocab)
                    .map(|row| top_k_candidates(row, k, self.options.vocab_shards))
                    .collect()
            };
            candidates[index] = with_host_values(&logits, top_k).map_err(ModelError::from)?;
            if let Some(ids) = drafter.vocabulary() {
                map_to_target_ids(&mut candidates[index], ids);
            }
        }
        Ok(candidates)
    }
}

/// Folds a verified tree's outcome into its source's calibration; a merged tree's drafter
/// part and lookup part each into their own (what of each the cut tree verified, and how far
/// the accepted path went in it). Returns what the drafter's part (the whole tree unless
/// merged) gave: its accepted drafts, its nodes and its depth.
fn observe(
    auto: &Mutex<AutoBudget>,
    method: Method,
    tree: &DraftTree,
    sources: &Option<(DraftTree, DraftTree)>,
    result: &AcceptResult,
) -> (usize, usize, usize) {
    let depth = |tree: &DraftTree| tree.depths.iter().copied().max().unwrap_or(0);
    let mut auto = AutoBudget::lock(auto);
    let Some((drafted, looked_up)) = sources else {
        if !tree.is_empty() {
            auto.calibration_mut(method).observe(tree, &result.path);
        }
        return (result.path.len() - 1, tree.len(), depth(tree));
    };
    let tokens = tree.path(*result.path.last().expect("the root"));
    let looked_up = looked_up.restrict(tree);
    if !looked_up.is_empty() {
        let path = looked_up.follow(&tokens);
        auto.lookup_calibration.observe(&looked_up, &path);
    }
    let drafted = drafted.restrict(tree);
    let path = drafted.follow(&tokens);
    if !drafted.is_empty() {
        auto.calibration.observe(&drafted, &path);
    }
    (path.len() - 1, drafted.len(), depth(&drafted))
}

/// Prompt rows per prefill forward when the prompt is scored: each row's logits are kept
/// (Qwen2.5's 151936 a row: 39 MB for 64 rows, where 512 would take 311 MB).
const SCORING_CHUNK: usize = 64;

/// The log-probabilities of the prompt tokens that rows `start..start + len` of a prefill
/// forward predict (row `p` predicts token `p + 1`), each recorded once, in order (a preempted
/// sequence's second prefill finds them recorded).
fn score_prompt(
    sequence: &mut Sequence<'_>,
    output: &grove_model::ForwardOutput,
    start: usize,
    len: usize,
) -> Result<(), EngineError> {
    let top = sequence.request.logprobs.unwrap_or(0);
    let prompt = &sequence.request.prompt;
    for row in 0..len {
        let next = start + row + 1;
        if next < prompt.len() && next == sequence.prompt_logprobs.len() + 1 {
            let logits = output.logits_row(row).map_err(ModelError::from)?;
            let scored = TokenLogprob::of(&logits, prompt[next], top);
            sequence.prompt_logprobs.push(scored);
        }
    }
    Ok(())
}
