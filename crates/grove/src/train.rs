//! `grove train-target` and `grove train-drafter`: the command-line side of `grove-train`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use grove_model::dflash::default_target_layer_ids;
use grove_model::drafter_manifest::{DrafterManifest, TargetFingerprint};
use grove_model::{Decoder, Model, TextTokenizer};
use grove_train::drafter_net::DrafterShape;
use grove_train::drafter_task::{train_drafter, DrafterData};
use grove_train::feature_task::{train_drafter_cached, CachedRun};
use grove_train::optim::AdamWConfig;
use grove_train::target_task::{train_target, TargetSpec};
use grove_train::trainer::{LoopOptions, TrainState};

use crate::loading;

/// Optimizer, checkpointing and session flags shared by both trainers.
#[derive(Debug, Clone, Args)]
pub struct LoopArgs {
    /// Optimizer steps in the whole run.
    #[arg(long)]
    pub steps: usize,
    /// Micro-batches per optimizer step.
    #[arg(long, default_value_t = 2)]
    pub grad_accum: usize,
    /// Peak learning rate (AdamW, warmup then cosine decay to 10%).
    #[arg(long)]
    pub lr: f64,
    #[arg(long, default_value_t = 50)]
    pub warmup_steps: usize,
    #[arg(long, default_value_t = 0.1)]
    pub weight_decay: f64,
    /// Where checkpoints and cached data go (default: `<out>.work`).
    #[arg(long)]
    pub work_dir: Option<PathBuf>,
    /// Minutes between checkpoints.
    #[arg(long, default_value_t = 5.0)]
    pub checkpoint_minutes: f64,
    /// Continue from the checkpoint in the work directory.
    #[arg(long)]
    pub resume: bool,
    /// Stop (with a checkpoint) after this many minutes; `--resume` continues.
    #[arg(long)]
    pub time_limit_minutes: Option<f64>,
    /// Compute threads (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

impl LoopArgs {
    pub fn options(&self, out: &std::path::Path) -> LoopOptions {
        LoopOptions {
            adamw: AdamWConfig {
                lr: self.lr,
                beta1: 0.9,
                beta2: 0.95,
                eps: 1e-8,
                weight_decay: self.weight_decay,
                warmup_steps: self.warmup_steps,
                total_steps: self.steps,
                min_lr_ratio: 0.1,
            },
            grad_accum: self.grad_accum.max(1),
            clip_norm: 1.0,
            dir: self
                .work_dir
                .clone()
                .unwrap_or_else(|| PathBuf::from(format!("{}.work", out.display()))),
            checkpoint_every: Duration::from_secs_f64(self.checkpoint_minutes * 60.0),
            resume: self.resume,
            stop_after_steps: None,
            time_limit: self
                .time_limit_minutes
                .map(|m| Duration::from_secs_f64(m * 60.0)),
            show_progress: true,
        }
    }
}

/// Where the training text comes from.
#[derive(Debug, Clone, Args)]
pub struct DataArgs {
    /// Source directories or files (default: the installed CPython's standard library, tests
    /// and site-packages excluded).
    #[arg(long, num_args = 1..)]
    pub data: Vec<PathBuf>,
    /// File extensions to read.
    #[arg(long, value_delimiter = ',', default_value = "py")]
    pub extensions: Vec<String>,
}

impl DataArgs {
    pub fn roots(&self) -> Result<Vec<PathBuf>> {
        if self.data.is_empty() {
            Ok(vec![python_stdlib()?])
        } else {
            Ok(self.data.clone())
        }
    }

    pub fn extensions(&self) -> Vec<&str> {
        self.extensions.iter().map(String::as_str).collect()
    }
}

/// The last line of a training run.
fn report(state: &TrainState, total: usize) {
    eprintln!(
        "step {}/{total}: loss {:.4}, {:.1} min of training, {} tokens{}",
        state.step,
        state.recent_loss(50),
        state.train_seconds / 60.0,
        state.tokens,
        if state.step < total {
            " (stopped early: rerun with --resume)"
        } else {
            ""
        }
    );
}

#[derive(Debug, Args)]
pub struct TrainTargetArgs {
    #[command(flatten)]
    pub data: DataArgs,
    /// Output directory (an HF Qwen3 checkpoint with tokenizer and chat template).
    #[arg(long)]
    pub out: PathBuf,
    #[arg(long, default_value_t = 4096)]
    pub vocab_size: usize,
    #[arg(long, default_value_t = 256)]
    pub hidden_size: usize,
    #[arg(long, default_value_t = 4)]
    pub layers: usize,
    #[arg(long, default_value_t = 4)]
    pub heads: usize,
    #[arg(long, default_value_t = 2)]
    pub kv_heads: usize,
    #[arg(long, default_value_t = 64)]
    pub head_dim: usize,
    #[arg(long, default_value_t = 768)]
    pub intermediate_size: usize,
    /// `max_position_embeddings` written to the config.
    #[arg(long, default_value_t = 1024)]
    pub context: usize,
    /// Tokens per training window.
    #[arg(long, default_value_t = 256)]
    pub seq_len: usize,
    /// Windows per micro-batch.
    #[arg(long, default_value_t = 4)]
    pub batch_size: usize,
    #[command(flatten)]
    pub train: LoopArgs,
}

/// The standard library of the `python3` on PATH.
fn python_stdlib() -> Result<PathBuf> {
    let output = std::process::Command::new("python3")
        .args([
            "-c",
            "import sysconfig; print(sysconfig.get_paths()['stdlib'])",
        ])
        .output()
        .context("running python3 to find its standard library; pass --data DIR instead")?;
    anyhow::ensure!(output.status.success(), "python3 failed; pass --data DIR");
    Ok(PathBuf::from(String::from_utf8(output.stdout)?.trim()))
}

pub fn run_target(args: TrainTargetArgs) -> Result<()> {
    loading::with_threads(args.train.threads, |_| {
        let data = args.data.roots()?;
        let spec = TargetSpec {
            vocab_size: args.vocab_size,
            hidden_size: args.hidden_size,
            num_layers: args.layers,
            num_heads: args.heads,
            num_kv_heads: args.kv_heads,
            head_dim: args.head_dim,
            intermediate_size: args.intermediate_size,
            max_position_embeddings: args.context,
            seq_len: args.seq_len,
            batch_size: args.batch_size,
            seed: args.train.seed,
        };
        let options = args.train.options(&args.out);
        let state = train_target(&spec, &data, &args.data.extensions(), &args.out, &options)?;
        report(&state, options.adamw.total_steps);
        Ok(())
    })
}

#[derive(Debug, Args)]
pub struct TrainDrafterArgs {
    /// The frozen target: an HF checkpoint directory with its tokenizer, or a GGUF file (which
    /// takes the cached-features route).
    #[arg(long)]
    pub target_path: PathBuf,
    /// Prompts come from this text; the target continues them greedily to make the data.
    #[command(flatten)]
    pub data: DataArgs,
    /// Output directory (z-lab DFlash format).
    #[arg(long)]
    pub out: PathBuf,
    /// Slots per draft block (anchor + block_size - 1 drafts).
    #[arg(long, default_value_t = 8)]
    pub block_size: usize,
    /// The drafter's own layers.
    #[arg(long, default_value_t = 1)]
    pub drafter_layers: usize,
    /// Target layers to tap (default: the reference's evenly spaced rule).
    #[arg(long, value_delimiter = ',')]
    pub target_layer_ids: Vec<usize>,
    /// The mask token: a token string in the target's tokenizer or an id (default:
    /// `<|mask|>`, which grove's trained tokenizers reserve and the target never sees).
    #[arg(long, default_value = "<|mask|>")]
    pub mask_token: String,
    /// Greedy continuations generated for training.
    #[arg(long, default_value_t = 4096)]
    pub sequences: usize,
    #[arg(long, default_value_t = 32)]
    pub prompt_len: usize,
    #[arg(long, default_value_t = 96)]
    pub generated_len: usize,
    /// Sequences per micro-batch.
    #[arg(long, default_value_t = 8)]
    pub batch_size: usize,
    /// Anchors (blocks) sampled per sequence.
    #[arg(long, default_value_t = 8)]
    pub blocks_per_sequence: usize,
    /// Loss weight decay over block slots: slot j weighs decay^(j-1).
    #[arg(long, default_value_t = 0.8)]
    pub decay: f64,
    /// Held-out prompts for the tau estimate at each checkpoint.
    #[arg(long, default_value_t = 16)]
    pub eval_prompts: usize,
    #[command(flatten)]
    pub cached: CachedArgs,
    #[command(flatten)]
    pub train: LoopArgs,
}

/// The cached-features route (always taken for a GGUF target): the target runs once over
/// corpus windows through the inference kernels, and training reads the cache.
#[derive(Debug, Clone, Args)]
pub struct CachedArgs {
    /// Take the cached route for a safetensors target too.
    #[arg(long)]
    pub cached_features: bool,
    /// Tokens per cached window.
    #[arg(long, default_value_t = 512)]
    pub feature_window: usize,
    /// Windows in the cache.
    #[arg(long, default_value_t = 512)]
    pub feature_windows: usize,
    /// Windows per cache shard (the unit extraction resumes at).
    #[arg(long, default_value_t = 8)]
    pub windows_per_shard: usize,
    /// Rows per target forward while extracting.
    #[arg(long, default_value_t = 128)]
    pub feature_chunk: usize,
    /// Draft vocabulary: the N most frequent greedy tokens of the cache (0: the target's whole
    /// vocabulary).
    #[arg(long, default_value_t = 32768)]
    pub draft_vocab_size: usize,
    /// The drafter layers' MLP width (default: the target's).
    #[arg(long)]
    pub drafter_intermediate_size: Option<usize>,
    /// Tokens generated per held-out prompt for the tau estimate.
    #[arg(long, default_value_t = 64)]
    pub eval_tokens: usize,
}

/// The target's tokenizer: a GGUF file's own, or the checkpoint directory's.
fn target_tokenizer(path: &std::path::Path) -> Result<TextTokenizer> {
    if grove_model::gguf::is_gguf(path) {
        Ok(grove_model::gguf::GgufFile::open(path)?.tokenizer()?)
    } else {
        Ok(TextTokenizer::load(path)?)
    }
}

/// The corpus tokenized by the target's tokenizer, cached as `corpus.u32` in the work dir.
fn target_corpus(
    args: &TrainDrafterArgs,
    tokenizer: &TextTokenizer,
    work: &std::path::Path,
) -> Result<Vec<u32>> {
    let path = work.join("corpus.u32");
    if path.is_file() {
        return Ok(grove_train::data::load_tokens_u32(&path)?);
    }
    std::fs::create_dir_all(work)?;
    let files = grove_train::data::gather_files(&args.data.roots()?, &args.data.extensions())?;
    // Documents are separated by the tokenizer's end of text.
    let separator = tokenizer.eos_token_id();
    let tokens = grove_train::data::tokenize_files(
        &files,
        |token| tokenizer.token_to_id(token).or(separator),
        |text| tokenizer.encode(text, false),
    )?;
    grove_train::data::save_tokens_u32(&path, &tokens)?;
    eprintln!(
        "corpus: {} files, {} target tokens",
        files.len(),
        tokens.len()
    );
    Ok(tokens)
}

fn run_cached(
    args: &TrainDrafterArgs,
    target: &Decoder,
    tokenizer: &TextTokenizer,
    shape: DrafterShape,
) -> Result<()> {
    let options = args.train.options(&args.out);
    let corpus = target_corpus(args, tokenizer, &options.dir)?;
    let c = &args.cached;
    let run = CachedRun {
        taps_window: c.feature_window,
        windows: c.feature_windows,
        windows_per_shard: c.windows_per_shard,
        chunk: c.feature_chunk,
        draft_vocab: (c.draft_vocab_size > 0).then_some(c.draft_vocab_size),
        batch_size: args.batch_size,
        blocks_per_sequence: args.blocks_per_sequence,
        decay: args.decay,
        eval_prompts: args.eval_prompts,
        eval_prompt_len: args.prompt_len,
        eval_tokens: c.eval_tokens,
        seed: args.train.seed,
    };
    if let Some(state) = train_drafter_cached(target, corpus, &shape, &run, &args.out, &options)? {
        report(&state, options.adamw.total_steps);
        if state.step >= options.adamw.total_steps {
            // The manifest lets generate/serve/bench pick this drafter for this target alone.
            DrafterManifest {
                target: TargetFingerprint::of(target, Some(tokenizer)),
                target_name: args
                    .target_path
                    .file_name()
                    .map_or_else(String::new, |n| n.to_string_lossy().into_owned()),
                command: std::env::args().collect::<Vec<_>>().join(" "),
                products: None,
            }
            .write(&args.out)?;
            crate::training_chart::write(&state, &args.out.join("training.png"))?;
        }
    }
    Ok(())
}

pub fn run_drafter(args: TrainDrafterArgs) -> Result<()> {
    loading::with_threads(args.train.threads, |_| {
        let data = args.data.roots()?;
        let target = Decoder::load(&args.target_path, &candle_core::Device::Cpu)
            .with_context(|| format!("loading the target from {}", args.target_path.display()))?;
        let tokenizer = target_tokenizer(&args.target_path)?;
        let mask_token_id = match args.mask_token.parse::<u32>() {
            Ok(id) => id,
            Err(_) => tokenizer.token_to_id(&args.mask_token).with_context(|| {
                format!(
                    "--mask-token {:?} is not in the target's tokenizer; pass an unused id",
                    args.mask_token
                )
            })?,
        };
        let mut layers = target.config().clone();
        layers.num_layers = args.drafter_layers;
        if let Some(width) = args.cached.drafter_intermediate_size {
            layers.intermediate_size = width;
        }
        let target_layer_ids = if args.target_layer_ids.is_empty() {
            default_target_layer_ids(target.config().num_layers, args.drafter_layers)
        } else {
            args.target_layer_ids.clone()
        };
        let shape = DrafterShape {
            layers,
            target_layer_ids,
            block_size: args.block_size,
            mask_token_id,
            d2t: None,
        };
        if args.cached.cached_features || grove_model::gguf::is_gguf(&args.target_path) {
            return run_cached(&args, &target, &tokenizer, shape);
        }
        let drafter_data = DrafterData {
            sequences: args.sequences,
            prompt_len: args.prompt_len,
            generated_len: args.generated_len,
            batch_size: args.batch_size,
            blocks_per_sequence: args.blocks_per_sequence,
            decay: args.decay,
            eval_prompts: args.eval_prompts,
            seed: args.train.seed,
        };
        let options = args.train.options(&args.out);
        drop(target);
        let state = train_drafter(
            &args.target_path,
            &shape,
            &drafter_data,
            &data,
            &args.data.extensions(),
            &args.out,
            &options,
        )?;
        report(&state, options.adamw.total_steps);
        Ok(())
    })
}
