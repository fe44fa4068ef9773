//! `grove train-drafter`: a DFlash drafter for a frozen target (the DFlash recipe,
//! `dflash-ddtree.md` section 8).
//!
//! Training data is the target's own greedy output: prompts cut from the corpus are continued
//! greedily by the target (with grove's engine), so the sequence after any anchor at or past
//! the prompt's end *is* what the target would generate, which is exactly what the drafter must
//! predict at inference. Each step samples sequences and anchors; a block is the anchor token
//! plus `S - 1` masks, sees the target's tapped features of the tokens before the anchor and
//! itself, and is scored on its masked slots with position-decayed weights.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use grove_engine::{DFlashSpec, GenerateRequest, Generator, GeneratorOptions};
use grove_model::{DFlashDrafter, Decoder, Model, TextTokenizer};
use rand::seq::index::sample;
use rand::Rng;

use crate::checkpoint::write_drafter;
use crate::data::{self, TokenStream};
use crate::drafter_net::{
    drafter_loss, drafter_params, target_features, DraftBatch, DrafterShape, FrozenTarget,
};
use crate::params::Params;
use crate::trainer::{self, LoopOptions, Task, TrainState};
use crate::TrainError;

/// The run's data and sampling settings.
#[derive(Debug, Clone)]
pub struct DrafterData {
    /// Greedy continuations to generate for training.
    pub sequences: usize,
    pub prompt_len: usize,
    pub generated_len: usize,
    /// Sequences per micro-batch and blocks per sequence.
    pub batch_size: usize,
    pub blocks_per_sequence: usize,
    /// Slot `j`'s loss weight is `decay^(j-1)`.
    pub decay: f64,
    /// Held-out prompts for the tau estimate at checkpoints.
    pub eval_prompts: usize,
    pub seed: u64,
}

pub struct DrafterTask<'a> {
    pub shape: DrafterShape,
    pub params: Params,
    pub target: FrozenTarget,
    pub decoder: &'a Decoder,
    /// `[count, prompt_len + generated_len]` training sequences.
    pub sequences: Vec<Vec<u32>>,
    pub eval_prompts: Vec<Vec<u32>>,
    pub data: DrafterData,
    pub eval_dir: PathBuf,
}

impl Task for DrafterTask<'_> {
    fn params(&self) -> &Params {
        &self.params
    }

    fn loss(&self, step: u64, micro: u64) -> Result<Tensor, TrainError> {
        let d = &self.data;
        let mut rng = data::step_rng(d.seed, step, micro);
        let len = self.sequences[0].len();
        let s = self.shape.block_size;
        // Anchors from the prompt's last token on: everything after them is greedy output.
        let (low, high) = (d.prompt_len - 1, len - s);
        let mut tokens = Vec::with_capacity(d.batch_size * len);
        let mut anchors = Vec::with_capacity(d.batch_size);
        for _ in 0..d.batch_size {
            tokens.extend_from_slice(&self.sequences[rng.random_range(0..self.sequences.len())]);
            let mut picked: Vec<usize> = sample(&mut rng, high - low + 1, d.blocks_per_sequence)
                .into_iter()
                .map(|i| low + i)
                .collect();
            picked.sort_unstable();
            anchors.push(picked);
        }
        let tokens = Tensor::from_vec(tokens, (d.batch_size, len), &Device::Cpu)?;
        let features = target_features(&self.target, &tokens, &self.shape.target_layer_ids)?;
        let batch = DraftBatch {
            tokens: &tokens,
            features: &features,
            anchors: &anchors,
        };
        Ok(drafter_loss(
            &self.params,
            &self.target,
            &self.shape,
            batch,
            d.decay,
        )?)
    }

    fn tokens_per_micro(&self) -> usize {
        self.data.batch_size * self.data.blocks_per_sequence * (self.shape.block_size - 1)
    }

    /// Mean tau of greedy DFlash with the current weights on held-out prompts.
    fn evaluate(&self) -> Result<Vec<(String, f64)>, TrainError> {
        held_out_tau(
            self.decoder,
            &self.shape,
            &self.params,
            &self.eval_prompts,
            self.data.generated_len,
            &self.eval_dir,
        )
    }
}

/// Mean tau of greedy DFlash on `prompts` (`tokens` new tokens each) with the drafter `params`
/// written to `eval_dir` and loaded as `generate` loads it, as a named metric.
pub(crate) fn held_out_tau(
    target: &dyn Model,
    shape: &DrafterShape,
    params: &Params,
    prompts: &[Vec<u32>],
    tokens: usize,
    eval_dir: &Path,
) -> Result<Vec<(String, f64)>, TrainError> {
    if prompts.is_empty() {
        return Ok(Vec::new());
    }
    write_drafter(eval_dir, shape, target.config(), params, DType::F32)?;
    let drafter = DFlashDrafter::load(eval_dir, target, |_| None, &Device::Cpu)?;
    let generator = Generator::new(target, None, GeneratorOptions::default())
        .with_dflash(DFlashSpec {
            drafter: &drafter,
            num_draft_tokens: shape.block_size,
        })
        .map_err(|e| TrainError::Data(e.to_string()))?;
    let requests: Vec<GenerateRequest> = prompts
        .iter()
        .map(|prompt| GenerateRequest::greedy(prompt, tokens))
        .collect();
    let outputs = generator
        .generate_batch(&requests)
        .map_err(|e| TrainError::Data(e.to_string()))?;
    let (sum, rounds) = outputs.iter().fold((0usize, 0usize), |(s, r), o| {
        (
            s + o.stats.accept_lengths.iter().sum::<usize>(),
            r + o.stats.rounds,
        )
    });
    Ok(vec![(
        "held-out DFlash tau".into(),
        sum as f64 / rounds.max(1) as f64,
    )])
}

/// Prompts of `len` tokens cut from `part`, reproducibly.
fn prompts(part: &[u32], count: usize, len: usize, seed: u64) -> Vec<Vec<u32>> {
    TokenStream::windows(part, count, len, seed, 0, 0)
}

/// Greedy continuations of training prompts, generated once and cached in `work`.
fn training_sequences(
    decoder: &Decoder,
    stream: &TokenStream,
    d: &DrafterData,
    work: &Path,
) -> Result<Vec<Vec<u32>>, TrainError> {
    let len = d.prompt_len + d.generated_len;
    let cache = work.join(format!("sequences-{}x{len}.u16", d.sequences));
    if cache.is_file() {
        let flat = data::load_tokens(&cache)?;
        return Ok(flat.chunks(len).map(<[u32]>::to_vec).collect());
    }
    let generator = Generator::new(decoder, None, GeneratorOptions::default());
    let prompts = prompts(&stream.train, d.sequences, d.prompt_len, d.seed);
    let mut sequences = Vec::with_capacity(d.sequences);
    let started = std::time::Instant::now();
    for chunk in prompts.chunks(32) {
        let requests: Vec<GenerateRequest> = chunk
            .iter()
            .map(|p| GenerateRequest::greedy(p, d.generated_len))
            .collect();
        let outputs = generator
            .generate_batch(&requests)
            .map_err(|e| TrainError::Data(e.to_string()))?;
        for (prompt, output) in chunk.iter().zip(outputs) {
            let mut sequence = prompt.clone();
            sequence.extend(output.token_ids);
            sequences.push(sequence);
        }
        eprintln!(
            "generated {}/{} greedy continuations ({:.0} s)",
            sequences.len(),
            d.sequences,
            started.elapsed().as_secs_f64()
        );
    }
    let flat: Vec<u32> = sequences.iter().flatten().copied().collect();
    data::save_tokens(&cache, &flat)?;
    Ok(sequences)
}

/// The target's weights as frozen f32 tensors, by their checkpoint names.
fn frozen_target(dir: &Path) -> Result<HashMap<String, Tensor>, TrainError> {
    let tensors = candle_core::safetensors::load(dir.join("model.safetensors"), &Device::Cpu)?;
    tensors
        .into_iter()
        .map(|(name, t)| Ok((name, t.to_dtype(DType::F32)?)))
        .collect()
}

/// Trains (or resumes) a drafter for the target in `target_dir` and writes it to `out`
/// (z-lab format, f16) when done.
pub fn train_drafter(
    target_dir: &Path,
    shape: &DrafterShape,
    d: &DrafterData,
    corpus: &[PathBuf],
    extensions: &[&str],
    out: &Path,
    options: &LoopOptions,
) -> Result<TrainState, TrainError> {
    let decoder = Decoder::load(target_dir, &Device::Cpu)?;
    let target_config = decoder.config().clone();
    if target_config.gemma.is_some() {
        // The training graph (net.rs) has Qwen3 / Qwen2 layers only.
        return Err(TrainError::Data(
            "training a drafter for a Gemma 3 target is not implemented (its sandwich norms, \
             GELU and sliding windows are not in the training graph)"
                .into(),
        ));
    }
    let tokenizer = TextTokenizer::load(target_dir)?;
    std::fs::create_dir_all(&options.dir).map_err(|source| TrainError::Io {
        path: options.dir.clone(),
        source,
    })?;
    let tokens_path = options.dir.join("corpus.u16");
    let tokens = if tokens_path.is_file() {
        data::load_tokens(&tokens_path)?
    } else {
        let files = data::gather_files(corpus, extensions)?;
        let tokens = data::tokenize_files(
            &files,
            |token| tokenizer.token_to_id(token),
            |text| tokenizer.encode(text, false),
        )?;
        data::save_tokens(&tokens_path, &tokens)?;
        tokens
    };
    let stream = TokenStream::split(tokens, 0.01, d.prompt_len + d.generated_len)?;
    let sequences = training_sequences(&decoder, &stream, d, &options.dir)?;
    let params = drafter_params(shape, d.seed)?;
    eprintln!(
        "drafter: {} layers, block {}, taps {:?}, mask {}, {:.2} M parameters; {} sequences",
        shape.layers.num_layers,
        shape.block_size,
        shape.target_layer_ids,
        shape.mask_token_id,
        params.num_scalars() as f64 / 1e6,
        sequences.len()
    );
    let task = DrafterTask {
        shape: shape.clone(),
        params,
        target: FrozenTarget {
            weights: frozen_target(target_dir)?,
            config: target_config,
        },
        decoder: &decoder,
        sequences,
        eval_prompts: prompts(&stream.held_out, d.eval_prompts, d.prompt_len, d.seed ^ 1),
        data: d.clone(),
        eval_dir: options.dir.join("eval-drafter"),
    };
    let state = trainer::train(&task, options)?;
    if state.step >= options.adamw.total_steps {
        write_drafter(out, shape, &task.target.config, &task.params, DType::F16)?;
        eprintln!("wrote {}", out.display());
    }
    Ok(state)
}
