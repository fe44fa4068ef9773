//! Drafter training on a cached target (`features.rs`): any target grove runs (GGUF included),
//! a reduced draft vocabulary, and labels that are exactly the target's greedy continuation.
//!
//! A window's cache holds corpus tokens `x` and the target's greedy choice `g[t]` after
//! `x[..=t]`. A block anchored at `a` must predict the target's greedy continuation of
//! `x[..=a]`: slot 1's label is `g[a]`, and slot `j`'s is `g[a+j-1]` only while the corpus
//! followed that continuation (`x[a+i] == g[a+i-1]` for `i < j`); past the first divergence
//! the corpus no longer says what the target would do, so those slots are not scored. Slots
//! whose label is outside the draft vocabulary cannot be drafted and are not scored either.

use std::path::PathBuf;

use candle_core::{DType, Device, Tensor};
use grove_model::Model;
use rand::seq::index::sample;
use rand::Rng;

use crate::checkpoint::write_drafter;
use crate::data;
use crate::drafter_net::{block_tokens, drafter_hidden, DrafterShape};
use crate::drafter_task::held_out_tau;
use crate::features::FeatureCache;
use crate::net::weighted_cross_entropy;
use crate::params::Params;
use crate::trainer::Task;
use crate::TrainError;

/// The draft vocabulary: the `size` most frequent greedy labels (ties to the lower id), kept
/// in increasing target-id order (`d2t`), with the inverse map.
#[derive(Debug, Clone, PartialEq)]
pub struct DraftVocab {
    pub d2t: Vec<u32>,
    t2d: Vec<Option<u32>>,
}

impl DraftVocab {
    pub fn most_frequent(counts: &[u64], size: usize) -> Self {
        let mut ids: Vec<u32> = (0..counts.len() as u32).collect();
        ids.sort_by_key(|&id| (std::cmp::Reverse(counts[id as usize]), id));
        ids.truncate(size.min(counts.len()));
        ids.sort_unstable();
        Self::from_d2t(ids, counts.len())
    }

    /// Every target token (no reduction).
    pub fn full(vocab_size: usize) -> Self {
        Self::from_d2t((0..vocab_size as u32).collect(), vocab_size)
    }

    pub fn from_d2t(d2t: Vec<u32>, vocab_size: usize) -> Self {
        let mut t2d = vec![None; vocab_size];
        for (draft, &target) in d2t.iter().enumerate() {
            t2d[target as usize] = Some(draft as u32);
        }
        Self { d2t, t2d }
    }

    pub fn len(&self) -> usize {
        self.d2t.len()
    }

    pub fn is_empty(&self) -> bool {
        self.d2t.is_empty()
    }

    pub fn draft_id(&self, target: u32) -> Option<u32> {
        self.t2d.get(target as usize).copied().flatten()
    }

    /// The share of `counts` the vocabulary covers.
    pub fn coverage(&self, counts: &[u64]) -> f64 {
        let covered: u64 = self.d2t.iter().map(|&t| counts[t as usize]).sum();
        covered as f64 / counts.iter().sum::<u64>().max(1) as f64
    }
}

/// Scored slots of the block anchored at `anchor` of a window: `(label, weight)` per draft slot
/// `1..S`, weight 0 where the slot is not scored (see the module note).
pub fn block_labels(
    tokens: &[u32],
    greedy: &[u32],
    anchor: usize,
    block_size: usize,
    decay: f64,
    vocab: &DraftVocab,
) -> Vec<(u32, f32)> {
    let mut on_path = true;
    (1..block_size)
        .map(|j| {
            let at = anchor + j - 1;
            if j > 1 {
                on_path &= at < tokens.len() && tokens[at] == greedy[at - 1];
            }
            match (on_path && at < greedy.len())
                .then(|| vocab.draft_id(greedy[at]))
                .flatten()
            {
                Some(label) => (label, decay.powi(j as i32 - 1) as f32),
                None => (0, 0.0),
            }
        })
        .collect()
}

/// Sampling and loss settings.
#[derive(Debug, Clone)]
pub struct FeatureData {
    /// Windows per micro-batch and blocks per window.
    pub batch_size: usize,
    pub blocks_per_sequence: usize,
    pub decay: f64,
    pub seed: u64,
    /// Held-out prompts for the tau estimate, and tokens generated for each.
    pub eval_prompts: Vec<Vec<u32>>,
    pub eval_tokens: usize,
}

pub struct FeatureTask<'a> {
    pub shape: DrafterShape,
    pub params: Params,
    pub target: &'a dyn Model,
    pub cache: FeatureCache,
    pub vocab: DraftVocab,
    /// The target's head rows for the draft vocabulary, `[draft vocab, hidden]`, frozen.
    pub head: Tensor,
    pub data: FeatureData,
    pub eval_dir: PathBuf,
}

impl Task for FeatureTask<'_> {
    fn params(&self) -> &Params {
        &self.params
    }

    fn loss(&self, step: u64, micro: u64) -> Result<Tensor, TrainError> {
        let d = &self.data;
        let s = self.shape.block_size;
        let window = self.cache.manifest.window;
        let mut rng = data::step_rng(d.seed, step, micro);
        let windows: Vec<usize> = (0..d.batch_size)
            .map(|_| rng.random_range(0..self.cache.len()))
            .collect();
        let mut anchors = Vec::with_capacity(d.batch_size);
        // Only scored slots reach the head (the head is most of a step's arithmetic, and
        // slots past a divergence or outside the vocabulary are not scored): their rows in
        // the flattened `[B * n * S]` block rows, labels and weights.
        let (mut rows, mut labels, mut weights) = (Vec::new(), Vec::new(), Vec::new());
        for &w in &windows {
            // Anchors 1..window-1: some context before, slot 1's label inside the window.
            let mut picked: Vec<usize> = sample(&mut rng, window - 1, d.blocks_per_sequence)
                .into_iter()
                .map(|i| i + 1)
                .collect();
            picked.sort_unstable();
            for (i, &a) in picked.iter().enumerate() {
                let block_row = (anchors.len() * d.blocks_per_sequence + i) * s;
                let slots = block_labels(
                    &self.cache.tokens[w],
                    &self.cache.labels[w],
                    a,
                    s,
                    d.decay,
                    &self.vocab,
                );
                for (j, (label, weight)) in slots.into_iter().enumerate() {
                    if weight > 0.0 {
                        rows.push((block_row + j + 1) as u32);
                        labels.push(label);
                        weights.push(weight);
                    }
                }
            }
            anchors.push(picked);
        }
        let tokens: Vec<Vec<u32>> = windows
            .iter()
            .map(|&w| self.cache.tokens[w].clone())
            .collect();
        let block = block_tokens(&tokens, &anchors, &self.shape);
        let hidden_size = self.shape.layers.hidden_size;
        let embedded = self.target.embed(&block)?.reshape((
            d.batch_size,
            block.len() / d.batch_size,
            hidden_size,
        ))?;
        let features = self.cache.features(&windows)?;
        let hidden = drafter_hidden(&self.params, &self.shape, &embedded, &features, &anchors)?;
        let hidden = hidden.reshape((block.len(), hidden_size))?;
        if rows.is_empty() {
            // Nothing scored (possible on tiny data): a zero loss that still reaches every
            // parameter, so the step is a no-op rather than a division by zero.
            return Ok((hidden.sum_all()? * 0.0)?);
        }
        let count = rows.len();
        let scored = hidden.index_select(&Tensor::from_vec(rows, count, &Device::Cpu)?, 0)?;
        let logits = scored.matmul(&self.head.t()?)?;
        Ok(weighted_cross_entropy(
            &logits,
            &Tensor::from_vec(labels, count, &Device::Cpu)?,
            &Tensor::from_vec(weights, count, &Device::Cpu)?,
        )?)
    }

    fn tokens_per_micro(&self) -> usize {
        self.data.batch_size * self.data.blocks_per_sequence * (self.shape.block_size - 1)
    }

    /// Mean tau of greedy DFlash with the current weights on held-out prompts, through the
    /// inference engine exactly as `generate` runs it.
    fn evaluate(&self) -> Result<Vec<(String, f64)>, TrainError> {
        held_out_tau(
            self.target,
            &self.shape,
            &self.params,
            &self.data.eval_prompts,
            self.data.eval_tokens,
            &self.eval_dir,
        )
    }
}

/// How the cached route runs: the cache's shape, the vocabulary and evaluation.
#[derive(Debug, Clone)]
pub struct CachedRun {
    pub taps_window: usize,
    pub windows: usize,
    pub windows_per_shard: usize,
    /// Rows per target forward while extracting.
    pub chunk: usize,
    /// Draft vocabulary size (`None`: the target's whole vocabulary).
    pub draft_vocab: Option<usize>,
    pub batch_size: usize,
    pub blocks_per_sequence: usize,
    pub decay: f64,
    pub eval_prompts: usize,
    pub eval_prompt_len: usize,
    pub eval_tokens: usize,
    pub seed: u64,
}

/// Trains (or resumes) a drafter for `target` from its cached features: extracts what is
/// missing of the cache in `options.dir/features`, then trains, all within
/// `options.time_limit`; writes the drafter to `out` (f16) when the last step is done.
/// `corpus` is the tokenized text (its last 1% is held out for evaluation prompts).
pub fn train_drafter_cached(
    target: &dyn Model,
    corpus: Vec<u32>,
    shape: &DrafterShape,
    run: &CachedRun,
    out: &std::path::Path,
    options: &crate::trainer::LoopOptions,
) -> Result<Option<crate::trainer::TrainState>, TrainError> {
    let started = std::time::Instant::now();
    let stream = data::TokenStream::split(corpus, 0.01, run.taps_window.max(run.eval_prompt_len))?;
    let manifest = crate::features::FeatureManifest {
        target: crate::features::target_identity(target),
        hidden_size: target.config().hidden_size,
        taps: shape.target_layer_ids.clone(),
        window: run.taps_window,
        windows: run.windows,
        windows_per_shard: run.windows_per_shard,
        seed: run.seed,
    };
    let dir = options.dir.join("features");
    let deadline = options.time_limit.map(|limit| started + limit);
    if !crate::features::extract(target, &stream.train, &manifest, &dir, run.chunk, deadline)? {
        eprintln!("feature extraction stopped at the time limit: rerun with --resume");
        return Ok(None);
    }
    let cache = FeatureCache::load(&dir, &manifest)?;
    let counts = cache.label_counts(target.config().vocab_size);
    let vocab = match run.draft_vocab {
        Some(size) => DraftVocab::most_frequent(&counts, size),
        None => DraftVocab::full(target.config().vocab_size),
    };
    eprintln!(
        "features: {} windows of {} tokens; draft vocabulary {} tokens covers {:.2}% of the \
         target's greedy choices",
        cache.len(),
        manifest.window,
        vocab.len(),
        100.0 * vocab.coverage(&counts)
    );
    let mut shape = shape.clone();
    shape.d2t = run.draft_vocab.map(|_| vocab.d2t.clone());
    let head = target.head_rows(&vocab.d2t)?;
    let params = crate::drafter_net::drafter_params(&shape, run.seed)?;
    eprintln!(
        "drafter: {} layers, intermediate {}, block {}, taps {:?}, {:.2} M parameters",
        shape.layers.num_layers,
        shape.layers.intermediate_size,
        shape.block_size,
        shape.target_layer_ids,
        params.num_scalars() as f64 / 1e6
    );
    let eval_prompts = data::TokenStream::windows(
        &stream.held_out,
        run.eval_prompts,
        run.eval_prompt_len,
        1,
        0,
        0,
    );
    let task = FeatureTask {
        shape: shape.clone(),
        params,
        target,
        cache,
        vocab,
        head,
        data: FeatureData {
            batch_size: run.batch_size,
            blocks_per_sequence: run.blocks_per_sequence,
            decay: run.decay,
            seed: run.seed,
            eval_prompts,
            eval_tokens: run.eval_tokens,
        },
        eval_dir: options.dir.join("eval-drafter"),
    };
    let mut options = options.clone();
    options.time_limit = options
        .time_limit
        .map(|t| t.saturating_sub(started.elapsed()));
    let state = crate::trainer::train(&task, &options)?;
    if state.step >= options.adamw.total_steps {
        write_drafter(out, &shape, target.config(), &task.params, DType::F16)?;
        eprintln!("wrote {}", out.display());
    }
    Ok(Some(state))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_vocabulary_keeps_the_most_frequent_tokens_in_id_order() {
        let counts = [5, 0, 9, 5, 1, 7];
        let vocab = DraftVocab::most_frequent(&counts, 3);
        // 2 (9) and 5 (7), then 0 and 3 tie at 5: the lower id wins.
        assert_eq!(vocab.d2t, vec![0, 2, 5]);
        assert_eq!(vocab.draft_id(5), Some(2));
        assert_eq!(vocab.draft_id(3), None);
        assert_eq!(vocab.draft_id(99), None);
        assert!((vocab.coverage(&counts) - 21.0 / 27.0).abs() < 1e-12);
        assert_eq!(DraftVocab::full(4).draft_id(3), Some(3));
    }

    #[test]
    fn labels_follow_the_greedy_path_and_stop_where_the_corpus_leaves_it() {
        let vocab = DraftVocab::full(100);
        // greedy[t] is the target's choice after tokens[..=t].
        let tokens = [10, 11, 12, 13, 50, 15, 16];
        let greedy = [11, 12, 13, 14, 15, 16, 17];
        // Anchor 1: slots predict greedy[1], greedy[2], greedy[3]; the corpus follows the
        // greedy path through token 3 (13 == greedy[2]) but not token 4 (50 != greedy[3]).
        let slots = block_labels(&tokens, &greedy, 1, 5, 0.5, &vocab);
        assert_eq!(slots, vec![(12, 1.0), (13, 0.5), (14, 0.25), (0, 0.0)]);
        // Near the window's end, slots past it are not scored.
        let slots = block_labels(&tokens, &greedy, 5, 4, 1.0, &vocab);
        assert_eq!(slots, vec![(16, 1.0), (17, 1.0), (0, 0.0)]);
        // A label outside the draft vocabulary is not scored, and the path goes on past it.
        let reduced = DraftVocab::from_d2t(vec![12, 14], 100);
        let slots = block_labels(&tokens, &greedy, 1, 4, 1.0, &reduced);
        assert_eq!(slots, vec![(0, 1.0), (0, 0.0), (1, 1.0)]);
    }
}
