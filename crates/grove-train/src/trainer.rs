//! The training loop shared by target and drafter training: gradient accumulation, AdamW with
//! warmup + cosine decay, clipping, a progress bar with loss, tokens/s and ETA, and checkpoints
//! every few minutes that a later run resumes from exactly (same weights, moments, step and
//! data order: batches are a pure function of the seed and the step).

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use candle_core::{DType, Tensor};
use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};

use crate::optim::{AdamW, AdamWConfig, GradAccumulator};
use crate::params::Params;
use crate::TrainError;

/// What is being trained.
pub trait Task {
    fn params(&self) -> &Params;
    /// The loss of micro-batch `micro` of optimizer step `step`.
    fn loss(&self, step: u64, micro: u64) -> Result<Tensor, TrainError>;
    /// Tokens one micro-batch trains on (for tokens/s).
    fn tokens_per_micro(&self) -> usize;
    /// Held-out metrics, logged at every checkpoint and at the end.
    fn evaluate(&self) -> Result<Vec<(String, f64)>, TrainError>;
}

#[derive(Debug, Clone)]
pub struct LoopOptions {
    pub adamw: AdamWConfig,
    pub grad_accum: usize,
    pub clip_norm: f64,
    /// Checkpoints go to `{dir}/checkpoint`.
    pub dir: PathBuf,
    pub checkpoint_every: Duration,
    pub resume: bool,
    /// Stop (after checkpointing) once this many steps are done, or this much time has passed:
    /// a session-sized slice of a longer run.
    pub stop_after_steps: Option<usize>,
    pub time_limit: Option<Duration>,
    pub show_progress: bool,
}

/// A checkpoint's bookkeeping (`state.json`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct TrainState {
    pub step: usize,
    /// Seconds spent training over all runs so far.
    pub train_seconds: f64,
    pub tokens: u64,
    /// `(step, loss)` of every step.
    pub losses: Vec<(usize, f32)>,
    /// `(step, metric, value)` of every evaluation.
    pub evaluations: Vec<(usize, String, f64)>,
}

impl TrainState {
    /// Mean loss over the last `n` recorded steps.
    pub fn recent_loss(&self, n: usize) -> f64 {
        let tail = &self.losses[self.losses.len().saturating_sub(n)..];
        tail.iter().map(|(_, l)| *l as f64).sum::<f64>() / tail.len().max(1) as f64
    }
}

fn checkpoint_dir(dir: &Path) -> PathBuf {
    dir.join("checkpoint")
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> TrainError + '_ {
    move |source| TrainError::Io {
        path: path.to_owned(),
        source,
    }
}

/// Writes the checkpoint into a fresh directory, then swaps it in, so an interrupted write
/// never leaves a half checkpoint.
fn save_checkpoint(
    dir: &Path,
    params: &Params,
    opt: &AdamW,
    state: &TrainState,
) -> Result<(), TrainError> {
    let final_dir = checkpoint_dir(dir);
    let tmp = dir.join("checkpoint.tmp");
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(io(&tmp))?;
    }
    std::fs::create_dir_all(&tmp).map_err(io(&tmp))?;
    params.save(&tmp.join("params.safetensors"), DType::F32)?;
    opt.save(&tmp.join("adamw.safetensors"))?;
    let state_path = tmp.join("state.json");
    std::fs::write(&state_path, serde_json::to_string(state).expect("json"))
        .map_err(io(&state_path))?;
    if final_dir.exists() {
        std::fs::remove_dir_all(&final_dir).map_err(io(&final_dir))?;
    }
    std::fs::rename(&tmp, &final_dir).map_err(io(&final_dir))?;
    Ok(())
}

/// Loads the checkpoint in `dir` into `params` and `opt`.
pub fn load_checkpoint(
    dir: &Path,
    params: &Params,
    opt: &mut AdamW,
) -> Result<TrainState, TrainError> {
    let ckpt = checkpoint_dir(dir);
    let state_path = ckpt.join("state.json");
    let text = std::fs::read_to_string(&state_path).map_err(io(&state_path))?;
    let state: TrainState = serde_json::from_str(&text)
        .map_err(|e| TrainError::Checkpoint(format!("{}: {e}", state_path.display())))?;
    params.load_values(&ckpt.join("params.safetensors"))?;
    opt.load(&ckpt.join("adamw.safetensors"), state.step)?;
    Ok(state)
}

/// Trains `task` until `adamw.total_steps` (or a stop condition); returns the state, whose
/// `step` says how far it got.
pub fn train(task: &impl Task, options: &LoopOptions) -> Result<TrainState, TrainError> {
    let params = task.params();
    let mut opt = AdamW::new(options.adamw, params)?;
    let mut state = if options.resume && checkpoint_dir(&options.dir).join("state.json").is_file() {
        let state = load_checkpoint(&options.dir, params, &mut opt)?;
        eprintln!(
            "resuming at step {} of {}",
            state.step, options.adamw.total_steps
        );
        state
    } else {
        TrainState::default()
    };
    let total = options.adamw.total_steps;
    let bar = if options.show_progress {
        ProgressBar::new(total as u64)
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{wide_bar}] {pos}/{len} {msg} ETA {eta}")
            .expect("valid template"),
    );
    bar.set_position(state.step as u64);
    let stderr_is_terminal = std::io::stderr().is_terminal();
    let mut last_log = Instant::now();
    let run_start = Instant::now();
    let mut last_checkpoint = Instant::now();
    let start_step = state.step;
    let tokens_per_step = (task.tokens_per_micro() * options.grad_accum) as u64;
    while state.step < total {
        let step_start = Instant::now();
        let mut accumulator = GradAccumulator::default();
        let mut step_loss = 0.0f32;
        for micro in 0..options.grad_accum {
            let loss = task.loss(state.step as u64, micro as u64)?;
            step_loss += loss.to_scalar::<f32>()? / options.grad_accum as f32;
            accumulator.add(params, &loss.backward()?)?;
        }
        let (grads, _norm) = accumulator.finish(options.clip_norm)?;
        opt.apply(params, &grads)?;
        state.losses.push((state.step, step_loss));
        state.step += 1;
        state.tokens += tokens_per_step;
        state.train_seconds += step_start.elapsed().as_secs_f64();
        let tokens_per_s = tokens_per_step as f64 / step_start.elapsed().as_secs_f64().max(1e-9);
        bar.set_position(state.step as u64);
        let status = format!(
            "loss {:.3} lr {:.2e} {tokens_per_s:.0} tok/s",
            state.recent_loss(20),
            options.adamw.lr_at(state.step - 1)
        );
        // Logs (no terminal) get a line a minute instead of the bar.
        if options.show_progress
            && !stderr_is_terminal
            && last_log.elapsed() >= Duration::from_secs(60)
        {
            eprintln!("step {}/{total}: {status}", state.step);
            last_log = Instant::now();
        }
        bar.set_message(status);
        let done = state.step >= total;
        let stopping = options
            .stop_after_steps
            .is_some_and(|n| state.step - start_step >= n)
            || options.time_limit.is_some_and(|t| run_start.elapsed() >= t);
        if done || stopping || last_checkpoint.elapsed() >= options.checkpoint_every {
            for (name, value) in task.evaluate()? {
                bar.suspend(|| eprintln!("step {}: {name} {value:.4}", state.step));
                state.evaluations.push((state.step, name, value));
            }
            save_checkpoint(&options.dir, params, &opt, &state)?;
            bar.suspend(|| {
                eprintln!(
                    "step {}: checkpoint written, loss {:.4}, {:.1} min of training",
                    state.step,
                    state.recent_loss(50),
                    state.train_seconds / 60.0
                )
            });
            last_checkpoint = Instant::now();
        }
        if stopping && !done {
            break;
        }
    }
    bar.finish_and_clear();
    Ok(state)
}
