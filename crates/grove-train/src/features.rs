//! The frozen target's side of drafter training, computed once with grove's inference kernels
//! (GGUF or safetensors, no autograd) and cached on disk: for corpus windows, every token's
//! tapped hidden states (f16) and the target's own greedy choice after it.
//!
//! Training then never runs the target: a 1.5B target prefills a few dozen tokens a second on
//! two cores, while a drafter step consumes thousands. The cache is a directory of shards
//! (`shard-00000.safetensors`, ...) and a `manifest.json` naming what made them; a rerun skips
//! the shards already written (each is written whole, then renamed), so extraction resumes
//! after an interruption, and a cache made for another target or other taps is refused.

use std::collections::HashMap;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Instant;

use candle_core::{DType, Device, Tensor, D};
use grove_kv::PagePool;
use grove_model::drafter_manifest::TargetFingerprint;
use grove_model::{ForwardBatch, LogitRows, Model, Segment};
use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};

use crate::data::TokenStream;
use crate::TrainError;

/// What a feature cache holds; `manifest.json`. Two runs with equal manifests make equal shards.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FeatureManifest {
    /// The target's identity (`target_identity`): shape and vocabulary.
    pub target: String,
    pub hidden_size: usize,
    /// Target layers tapped, in feature order.
    pub taps: Vec<usize>,
    /// Tokens per window.
    pub window: usize,
    pub windows: usize,
    pub windows_per_shard: usize,
    /// Windows are drawn from the corpus's training part with this seed.
    pub seed: u64,
}

impl FeatureManifest {
    pub fn shards(&self) -> usize {
        self.windows.div_ceil(self.windows_per_shard)
    }

    fn shard_windows(&self, shard: usize) -> usize {
        (self.windows - shard * self.windows_per_shard).min(self.windows_per_shard)
    }
}

/// A one-line identity of a target (family, shape and vocabulary size): features are only
/// meaningful for the target that made them.
pub fn target_identity(model: &dyn Model) -> String {
    TargetFingerprint::of(model, None).shape
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> TrainError + '_ {
    move |source| TrainError::Io {
        path: path.to_owned(),
        source,
    }
}

fn shard_path(dir: &Path, shard: usize) -> PathBuf {
    dir.join(format!("shard-{shard:05}.safetensors"))
}

/// The manifest of the cache in `dir`, if there is one.
fn read_manifest(dir: &Path) -> Result<Option<FeatureManifest>, TrainError> {
    let path = dir.join("manifest.json");
    if !path.is_file() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(&path).map_err(io(&path))?;
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| TrainError::Data(format!("{}: {e}", path.display())))
}

/// Refuses a cache in `dir` made for anything but `manifest`.
fn check_manifest(
    dir: &Path,
    existing: &FeatureManifest,
    manifest: &FeatureManifest,
) -> Result<(), TrainError> {
    if existing == manifest {
        return Ok(());
    }
    Err(TrainError::Data(format!(
        "{} was made for {existing:?}, not {manifest:?}: use another --work-dir or delete it",
        dir.join("manifest.json").display()
    )))
}

/// Opens or starts the cache in `dir` for `manifest`, refusing one made differently.
fn prepare(dir: &Path, manifest: &FeatureManifest) -> Result<(), TrainError> {
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    if let Some(existing) = read_manifest(dir)? {
        return check_manifest(dir, &existing, manifest);
    }
    let path = dir.join("manifest.json");
    std::fs::write(&path, serde_json::to_string_pretty(manifest).expect("json")).map_err(io(&path))
}

/// One window through the target in chunks of `chunk` rows: `(features [T, taps*H] f16,
/// greedy labels [T])`, label `t` being the target's argmax after tokens `0..=t`.
fn window_features(
    model: &dyn Model,
    tokens: &[u32],
    taps: &[usize],
    chunk: usize,
) -> Result<(Tensor, Vec<u32>), TrainError> {
    let kv_error = |e: grove_kv::KvError| TrainError::Data(e.to_string());
    let pool = PagePool::new(tokens.len(), 1).map_err(kv_error)?;
    let mut kv = model.new_kv_store(pool.num_slots());
    let mut table = pool.new_table();
    table.reserve(tokens.len()).map_err(kv_error)?;
    let mut features = Vec::new();
    let mut labels = Vec::with_capacity(tokens.len());
    for start in (0..tokens.len()).step_by(chunk) {
        let rows = &tokens[start..(start + chunk).min(tokens.len())];
        let positions: Vec<usize> = (start..start + rows.len()).collect();
        let batch = ForwardBatch {
            segments: vec![Segment::causal(&table, rows, &positions, LogitRows::All)],
            taps,
        };
        let output = model.forward(&batch, &mut kv)?;
        table.append(rows.len());
        labels.extend(output.logits.argmax(D::Minus1)?.to_vec1::<u32>()?);
        features.push(Tensor::cat(&output.taps, D::Minus1)?.to_dtype(DType::F16)?);
    }
    Ok((Tensor::cat(&features, 0)?, labels))
}

/// Fills the cache in `dir` with `manifest.windows` windows of `train` (skipping shards already
/// there) until done or `deadline`; returns whether every shard is written.
pub fn extract(
    model: &dyn Model,
    train: &[u32],
    manifest: &FeatureManifest,
    dir: &Path,
    chunk: usize,
    deadline: Option<Instant>,
) -> Result<bool, TrainError> {
    prepare(dir, manifest)?;
    let todo: Vec<usize> = (0..manifest.shards())
        .filter(|&s| !shard_path(dir, s).is_file())
        .collect();
    let remaining: usize = todo.iter().map(|&s| manifest.shard_windows(s)).sum();
    let bar = ProgressBar::new((remaining * manifest.window) as u64);
    bar.set_style(
        ProgressStyle::with_template(
            "features {elapsed_precise} [{wide_bar}] {pos}/{len} tokens {per_sec} ETA {eta}",
        )
        .expect("valid template"),
    );
    for shard in todo {
        if deadline.is_some_and(|d| Instant::now() >= d) {
            bar.abandon();
            return Ok(false);
        }
        let count = manifest.shard_windows(shard);
        let windows = TokenStream::windows(
            train,
            count,
            manifest.window,
            manifest.seed,
            shard as u64,
            0,
        );
        let mut features = Vec::with_capacity(count);
        let mut labels = Vec::with_capacity(count * manifest.window);
        for window in &windows {
            let (f, l) = window_features(model, window, &manifest.taps, chunk)?;
            features.push(f);
            labels.extend(l);
            bar.inc(manifest.window as u64);
        }
        let tokens: Vec<u32> = windows.concat();
        let shape = (count, manifest.window);
        let tensors = HashMap::from([
            (
                "tokens".to_owned(),
                Tensor::from_vec(tokens, shape, &Device::Cpu)?,
            ),
            (
                "labels".to_owned(),
                Tensor::from_vec(labels, shape, &Device::Cpu)?,
            ),
            ("features".to_owned(), Tensor::stack(&features, 0)?),
        ]);
        let path = shard_path(dir, shard);
        let tmp = path.with_extension("tmp");
        candle_core::safetensors::save(&tensors, &tmp)?;
        std::fs::rename(&tmp, &path).map_err(io(&path))?;
        if !std::io::stderr().is_terminal() {
            // Logs get a line per shard instead of the bar.
            eprintln!(
                "features: shard {}/{} written ({} of {} tokens this run, {:.0} tok/s)",
                shard + 1,
                manifest.shards(),
                bar.position(),
                remaining * manifest.window,
                bar.per_sec()
            );
        }
    }
    bar.finish();
    Ok(true)
}

/// A loaded cache: every window's tokens and greedy labels on the host, and the features.
#[derive(Debug)]
pub struct FeatureCache {
    pub manifest: FeatureManifest,
    /// `[windows][window]`.
    pub tokens: Vec<Vec<u32>>,
    pub labels: Vec<Vec<u32>>,
    /// One `[windows_in_shard, window, taps*H]` f16 tensor per shard.
    features: Vec<Tensor>,
}

impl FeatureCache {
    /// Loads a complete cache made for `manifest`.
    pub fn load(dir: &Path, manifest: &FeatureManifest) -> Result<Self, TrainError> {
        let existing = read_manifest(dir)?
            .ok_or_else(|| TrainError::Data(format!("{}: no feature cache here", dir.display())))?;
        check_manifest(dir, &existing, manifest)?;
        let mut cache = Self {
            manifest: manifest.clone(),
            tokens: Vec::new(),
            labels: Vec::new(),
            features: Vec::new(),
        };
        for shard in 0..manifest.shards() {
            let path = shard_path(dir, shard);
            if !path.is_file() {
                return Err(TrainError::Data(format!(
                    "{} is missing: the feature cache is incomplete (rerun to finish it)",
                    path.display()
                )));
            }
            let mut tensors = candle_core::safetensors::load(&path, &Device::Cpu)?;
            let mut take = |name: &str| {
                tensors.remove(name).ok_or_else(|| {
                    TrainError::Data(format!("{}: no tensor `{name}`", path.display()))
                })
            };
            cache.tokens.extend(take("tokens")?.to_vec2::<u32>()?);
            cache.labels.extend(take("labels")?.to_vec2::<u32>()?);
            cache.features.push(take("features")?);
        }
        Ok(cache)
    }

    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// The f32 features `[windows.len(), window, taps*H]` of windows `windows`.
    pub fn features(&self, windows: &[usize]) -> Result<Tensor, TrainError> {
        let per = self.manifest.windows_per_shard;
        let rows = windows
            .iter()
            .map(|&w| self.features[w / per].get(w % per))
            .collect::<candle_core::Result<Vec<_>>>()?;
        Ok(Tensor::stack(&rows, 0)?.to_dtype(DType::F32)?)
    }

    /// How often each target token is the greedy label, over the whole cache.
    pub fn label_counts(&self, vocab_size: usize) -> Vec<u64> {
        let mut counts = vec![0u64; vocab_size];
        for &label in self.labels.iter().flatten() {
            counts[label as usize] += 1;
        }
        counts
    }
}
