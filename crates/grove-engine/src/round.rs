//! The batched step: every active sequence's round is drafted in one drafter pass and verified
//! in one target forward (ragged trees, per-sequence visibility and positions); the walk and
//! the commit are per sequence. Sequences share one target KV store and one drafter store, each
//! owning page tables in them, so a finished or preempted sequence returns its pages at once.

use std::sync::Arc;
use std::time::{Duration, Instant};

use candle_core::Tensor;
use grove_core::{FinishReason, TokenId};
use grove_kv::{KvStore, PagePool, PageTable};
use grove_model::layers::with_host_values;
use grove_model::{ForwardBatch, LogitRows, ModelError, Segment, Visibility};
use grove_spec::{top_k_candidates, DepthCandidates, DraftTree};

use crate::drafter::DraftBlock;
use crate::emitter::Emitter;
use crate::generate::{GenerateRequest, GenerateStats, Generator, Method};
use crate::sampler::Sampler;
use crate::speculation::{self, SpecAlgorithm};
use crate::EngineError;

/// KV memory shared by the sequences of one run.
pub(crate) struct Pools {
    pub pool: PagePool,
    pub kv: KvStore,
    pub draft_pool: PagePool,
    pub draft_kv: KvStore,
}

/// One request in flight. Its KV may be dropped (preemption) and rebuilt by a new prefill
/// of everything it committed; the sampler and the emitted text carry on untouched.
pub(crate) struct Sequence<'r> {
    pub id: u64,
    pub request: Arc<GenerateRequest>,
    /// What its rounds draft (resolved from the request within the generator's ceiling).
    pub method: Option<Method>,
    pub table: PageTable,
    /// The drafter's context for this sequence (speculation only).
    pub draft_table: Option<PageTable>,
    /// Taps of committed tokens not yet in the drafter's context, `[rows, taps * hidden]`.
    pub pending_features: Option<Tensor>,
    /// The last chosen token; not yet in KV.
    pub anchor: TokenId,
    pub sampler: Sampler,
    pub emitter: Emitter<'r>,
    pub stats: GenerateStats,
    pub emitted: usize,
    pub finish: Option<FinishReason>,
    /// Its KV is empty: it waits for a (re)prefill.
    pub needs_prefill: bool,
    pub t_prefill: Duration,
    pub decode_start: Instant,
}

impl Sequence<'_> {
    fn remaining(&self) -> usize {
        self.request.stop.max_new_tokens - self.emitted
    }

    /// Rows its next verify may add past its committed length.
    pub fn verify_rows(&self) -> usize {
        speculation::verify_rows(self.method)
    }

    /// Tokens whose K/V the sequence holds once prefilled: the prompt and every emitted token
    /// but the last (the anchor).
    pub fn committed_tokens(&self) -> Vec<TokenId> {
        let emitted = self.emitter.token_ids();
        let mut tokens = self.request.prompt.clone();
        tokens.extend_from_slice(&emitted[..emitted.len().saturating_sub(1)]);
        tokens
    }

    /// Drops the sequence's KV (its pages return to the pools) until the next prefill.
    pub fn release(&mut self, pools: &Pools) {
        self.table = pools.pool.new_table();
        self.draft_table = self
            .draft_table
            .as_ref()
            .map(|_| pools.draft_pool.new_table());
        self.pending_features = None;
        self.needs_prefill = true;
    }
}

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
}

impl<'a> Generator<'a> {
    /// Pools of `target_pages` pages for the target and enough for the drafter's context.
    pub(crate) fn pools(
        &self,
        target_pages: usize,
        max_running: usize,
    ) -> Result<Pools, EngineError> {
        let page_size = self.options.page_size;
        let pool = PagePool::new(target_pages, page_size)?;
        // The drafter holds the committed context plus one block per running sequence.
        let draft_block = self.speculation.map_or(0, |s| s.drafter.block_size());
        let draft_pages = if draft_block == 0 {
            0
        } else {
            target_pages + max_running * draft_block.div_ceil(page_size)
        };
        let draft_pool = PagePool::new(draft_pages, page_size)?;
        Ok(Pools {
            kv: self.model.new_kv_store(pool.num_slots()),
            draft_kv: match self.speculation {
                Some(spec) => spec.drafter.new_kv_store(draft_pool.num_slots()),
                None => KvStore::new(0, 0, 0),
            },
            pool,
            draft_pool,
        })
    }

    /// A new sequence for `request`, holding no KV yet.
    pub(crate) fn admit(
        &self,
        id: u64,
        request: Arc<GenerateRequest>,
        method: Option<Method>,
        pools: &Pools,
    ) -> Sequence<'a> {
        let max_depth = self.speculation.map_or(0, |s| s.drafter.block_size() - 1);
        let (algorithm, budget) = match method {
            None => (SpecAlgorithm::None, 0),
            Some(Method::Chain { num_draft_tokens }) => {
                (SpecAlgorithm::DFlash, num_draft_tokens - 1)
            }
            Some(Method::Tree { budget, .. }) => (SpecAlgorithm::DDTree, budget),
        };
        Sequence {
            id,
            method,
            table: pools.pool.new_table(),
            draft_table: method.map(|_| pools.draft_pool.new_table()),
            pending_features: None,
            anchor: 0,
            sampler: Sampler::new(request.sampling.clone()),
            emitter: Emitter::new(self.tokenizer, &request.stop),
            stats: GenerateStats {
                algorithm,
                budget,
                accepted_per_position: vec![0; max_depth],
                accepted_depth_histogram: vec![0; max_depth + 1],
                ..GenerateStats::default()
            },
            request,
            emitted: 0,
            finish: None,
            needs_prefill: true,
            t_prefill: Duration::ZERO,
            decode_start: Instant::now(),
        }
    }

    /// Pages a prefill of `sequence` takes, plus its first verify.
    pub(crate) fn prefill_pages(&self, sequence: &Sequence<'_>, pools: &Pools) -> usize {
        pools
            .pool
            .pages_for(sequence.committed_tokens().len() + sequence.verify_rows())
    }

    /// Runs the committed tokens through the target in chunks (capturing the drafter's taps).
    /// A fresh sequence then chooses and emits its first token; a preempted one resumes with
    /// the anchor it had.
    pub(crate) fn prefill(
        &self,
        sequence: &mut Sequence<'_>,
        pools: &mut Pools,
        on_text: &mut impl FnMut(&str),
    ) -> Result<(), EngineError> {
        let prefill_start = Instant::now();
        let tokens = sequence.committed_tokens();
        let table = &mut sequence.table;
        // Only sequences that draft keep the drafter's features.
        let taps = if sequence.method.is_some() {
            self.taps()
        } else {
            &[]
        };
        let mut last_logits = Vec::new();
        let mut features = Vec::new();
        for chunk in tokens.chunks(self.options.prefill_chunk.max(1)) {
            table.reserve(chunk.len())?;
            let positions: Vec<usize> = (table.len()..table.len() + chunk.len()).collect();
            let segment = Segment::causal(table, chunk, &positions, LogitRows::Last);
            let output = self.model.forward(
                &ForwardBatch {
                    segments: vec![segment],
                    taps,
                },
                &mut pools.kv,
            )?;
            table.append(chunk.len());
            last_logits = output.logits_row(0).map_err(ModelError::from)?;
            if !taps.is_empty() {
                features.push(Tensor::cat(&output.taps, 1).map_err(ModelError::from)?);
            }
        }
        sequence.pending_features = if features.is_empty() {
            None
        } else {
            Some(Tensor::cat(&features, 0).map_err(ModelError::from)?)
        };
        sequence.needs_prefill = false;
        if sequence.emitted == 0 {
            sequence.anchor = sequence.sampler.sample(&last_logits);
            sequence.emitted = 1;
            sequence.t_prefill += prefill_start.elapsed();
            sequence.decode_start = Instant::now();
            sequence.finish = sequence.emitter.emit(sequence.anchor, on_text)?;
        } else {
            sequence.t_prefill += prefill_start.elapsed();
        }
        Ok(())
    }

    /// Reserves what the next round of `sequence` needs in both pools (all or nothing).
    pub(crate) fn reserve_round(
        &self,
        sequence: &mut Sequence<'_>,
    ) -> Result<(), grove_kv::KvError> {
        sequence.table.reserve(sequence.verify_rows())?;
        if let (Some(table), Some(spec)) = (sequence.draft_table.as_mut(), self.speculation) {
            let pending = sequence
                .pending_features
                .as_ref()
                .map_or(0, |f| f.dim(0).unwrap_or(0));
            if let Err(error) = table.reserve(pending + spec.drafter.block_size()) {
                let committed = sequence.table.len();
                sequence.table.truncate(committed);
                return Err(error);
            }
        }
        Ok(())
    }

    /// One round for every sequence in `batch` (none of them finished).
    pub(crate) fn step(
        &self,
        batch: &mut [&mut Sequence<'_>],
        pools: &mut Pools,
        on_text: &mut impl FnMut(u64, &str),
    ) -> Result<StepTimings, EngineError> {
        let mut times = StepTimings {
            sequences: batch.len(),
            ..StepTimings::default()
        };
        let draft_start = Instant::now();
        let candidates = self.draft(batch, pools)?;
        times.draft = draft_start.elapsed();

        let build_start = Instant::now();
        let trees: Vec<DraftTree> = batch
            .iter()
            .zip(&candidates)
            .map(|(sequence, candidates)| {
                let budget = match sequence.method {
                    Some(Method::Tree { budget, .. }) => budget,
                    _ => candidates.len(),
                };
                DraftTree::build(sequence.anchor, candidates, budget)
            })
            .collect();
        times.tree_build = build_start.elapsed();
        times.verified_rows = trees.iter().map(|t| t.tokens.len()).sum();

        let verify_start = Instant::now();
        let bases: Vec<usize> = batch.iter().map(|s| s.table.len()).collect();
        for (sequence, tree) in batch.iter_mut().zip(&trees) {
            sequence.table.reserve(tree.tokens.len())?;
        }
        let positions: Vec<Vec<usize>> = trees
            .iter()
            .zip(&bases)
            .map(|(tree, base)| tree.depths.iter().map(|d| base + d).collect())
            .collect();
        let segments = batch
            .iter()
            .zip(&trees)
            .zip(&positions)
            .map(|((sequence, tree), positions)| Segment {
                table: &sequence.table,
                context_len: sequence.table.len(),
                tokens: &tree.tokens,
                positions,
                visibility: Visibility::Tree {
                    parents: tree.row_parents(),
                },
                logits: LogitRows::All,
            })
            .collect();
        let output = self.model.forward(
            &ForwardBatch {
                segments,
                taps: self.taps(),
            },
            &mut pools.kv,
        )?;
        let taps = if output.taps.is_empty() {
            None
        } else {
            Some(Tensor::cat(&output.taps, 1).map_err(ModelError::from)?)
        };
        times.verify = verify_start.elapsed();

        // The rows are read where the model wrote them (a copy of Qwen2.5's 151936 logits took
        // 110-150 us of every decoding step).
        let vocab = output.logits.dim(1).map_err(ModelError::from)?;
        let walk_and_emit = |logits: &[f32]| -> Result<(), EngineError> {
            let mut offset = 0;
            for ((sequence, tree), base) in batch.iter_mut().zip(&trees).zip(bases) {
                let id = sequence.id;
                let commit_start = Instant::now();
                let node_row = |node: usize| &logits[(offset + node) * vocab..][..vocab];
                // Walk: the target's choice at each visited node, drawn once per node in path
                // order; nodes off the path are never sampled.
                let (path, bonus) = tree.walk(|node| sequence.sampler.sample(node_row(node)));
                // The path's K/V move to positions base.. (no re-rotation: a node's position
                // already is base + depth); rows off the path are freed.
                sequence.table.commit_path(&mut pools.kv, base, &path);
                if let (Some(taps), Some(_)) = (&taps, sequence.method) {
                    let picked: Vec<u32> = path.iter().map(|&n| (offset + n) as u32).collect();
                    let picked = Tensor::from_vec(picked, path.len(), &candle_core::Device::Cpu)
                        .map_err(ModelError::from)?;
                    let mut features = taps.index_select(&picked, 0).map_err(ModelError::from)?;
                    // A round that drafted nothing left earlier features pending: keep them in
                    // order.
                    if let Some(earlier) = sequence.pending_features.take() {
                        features =
                            Tensor::cat(&[earlier, features], 0).map_err(ModelError::from)?;
                    }
                    sequence.pending_features = Some(features);
                }
                sequence.anchor = bonus;
                offset += tree.tokens.len();
                let commit = commit_start.elapsed();
                times.commit += commit;

                let tokens = path[1..].iter().map(|&n| tree.tokens[n]).chain([bonus]);
                // A stop inside the round cuts it: tau counts only the tokens emitted.
                let mut round_emitted = 0;
                for token in tokens {
                    round_emitted += 1;
                    sequence.finish = sequence
                        .emitter
                        .emit(token, &mut |text: &str| on_text(id, text))?;
                    if sequence.finish.is_some() {
                        break;
                    }
                }
                sequence.emitted += round_emitted;
                let stats = &mut sequence.stats;
                for position in stats
                    .accepted_per_position
                    .iter_mut()
                    .take(round_emitted - 1)
                {
                    *position += 1;
                }
                stats.accept_lengths.push(round_emitted);
                stats.accepted_depth_histogram[round_emitted - 1] += 1;
                stats.tree_nodes += tree.len();
                stats.t_draft_us += times.draft.as_micros() as u64;
                stats.t_tree_build_us += times.tree_build.as_micros() as u64;
                stats.t_verify_us += times.verify.as_micros() as u64;
                stats.t_commit_us += commit.as_micros() as u64;
            }
            Ok(())
        };
        with_host_values(&output.logits, walk_and_emit).map_err(ModelError::from)??;
        Ok(times)
    }

    /// Per-depth candidates for each sequence's tree (empty: a root-only tree), from one
    /// batched drafter pass over the sequences that draft.
    fn draft(
        &self,
        batch: &mut [&mut Sequence<'_>],
        pools: &mut Pools,
    ) -> Result<Vec<Vec<DepthCandidates>>, EngineError> {
        let mut candidates = vec![Vec::new(); batch.len()];
        let Some(spec) = self.speculation else {
            return Ok(candidates);
        };
        // A round emits at most depth + 1 tokens: near the length limit shallower trees
        // suffice, and with one token left there is nothing to draft.
        let plan: Vec<(usize, usize)> = batch
            .iter()
            .map(|sequence| {
                let depth_cap = sequence.remaining() - 1;
                match sequence.method {
                    None => (0, 0),
                    Some(Method::Chain { num_draft_tokens }) => {
                        ((num_draft_tokens - 1).min(depth_cap), 1)
                    }
                    Some(Method::Tree { budget, top_k }) => (
                        (spec.drafter.block_size() - 1).min(depth_cap),
                        top_k.min(budget),
                    ),
                }
            })
            .collect();
        let mut blocks = Vec::new();
        let mut drafting = Vec::new();
        for (index, (sequence, &(depths, _))) in batch.iter_mut().zip(&plan).enumerate() {
            if depths == 0 {
                continue;
            }
            let position = sequence.table.len();
            let draft_table = sequence
                .draft_table
                .as_mut()
                .expect("speculating sequences have a drafter table");
            if let Some(features) = sequence.pending_features.take() {
                spec.drafter
                    .extend(&mut pools.draft_kv, draft_table, &features)?;
            }
            blocks.push(DraftBlock {
                table: draft_table,
                anchor: sequence.anchor,
                position,
            });
            drafting.push(index);
        }
        if blocks.is_empty() {
            return Ok(candidates);
        }
        let logits = spec
            .drafter
            .draft(self.model, &mut pools.draft_kv, &mut blocks)?;
        for (index, logits) in drafting.into_iter().zip(logits) {
            let (depths, k) = plan[index];
            let rows: Vec<Vec<f32>> = logits
                .narrow(0, 0, depths)
                .and_then(|l| l.to_vec2())
                .map_err(ModelError::from)?;
            // The reference drafts from raw logits at every temperature (exact: see sampler.rs).
            candidates[index] = rows
                .iter()
                .map(|row| top_k_candidates(row, k, self.options.vocab_shards))
                .collect();
        }
        Ok(candidates)
    }
}
