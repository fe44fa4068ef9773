//! The DFlash drafter (block diffusion, one denoising step): a few Qwen3 layers with no
//! embedding and no head of their own. Paper: arXiv 2602.06036; reference: z-lab/dflash.
//!
//! 1. Context: for each committed token, the target's hidden states after `target_layer_ids`
//!    are concatenated and fused, `c = hidden_norm(fc(concat))`, once.
//! 2. Every drafter layer turns `c` into keys/values only (`k_norm(k_proj(c))` + RoPE,
//!    `v_proj(c)`); they are written to the drafter's KV pool when the token is committed.
//! 3. A round embeds `[anchor, MASK x (S-1)]` with the target's embeddings and runs the layers
//!    with bidirectional attention over the whole context and the whole block.
//! 4. `norm`, then the target's LM head on slots `1..S` gives one distribution per future slot.

use std::path::Path;

use candle_core::{Device, Module, Tensor};
use grove_core::TokenId;
use grove_kv::{KvStore, PageTable};
use serde_json::Value;

use crate::config::DecoderConfig;
use crate::forward::{ForwardBatch, LogitRows, Segment, Visibility};
use crate::layer_stack::LayerStack;
use crate::layers::{Linear, RmsNorm};
use crate::matrix::Matrix;
use crate::weights::Weights;
use crate::{Model, ModelError};

/// Keys of `dflash_config` this implementation understands; any other names a variant
/// (DFlash2, sliding windows, convolutions, ...) that it does not implement.
const KNOWN_DFLASH_KEYS: [&str; 6] = [
    "mask_token_id",
    "draft_vocab_size",
    "mask_token",
    "target_layer_ids",
    "block_size",
    "num_target_layers",
];

/// Fragments of top-level keys that only drafter variants carry.
const VARIANT_KEY_FRAGMENTS: [&str; 5] = ["conv", "selector", "markov", "sink", "draft_window"];

/// The drafter's settings, resolved from its `config.json`.
#[derive(Debug, Clone, PartialEq)]
pub struct DFlashConfig {
    /// `S`: slots per draft block (anchor + `S - 1` masks).
    pub block_size: usize,
    pub mask_token_id: TokenId,
    /// Target layers whose outputs feed the drafter, in `fc` input order.
    pub target_layer_ids: Vec<usize>,
    /// The target depth the drafter was trained against, if the config says.
    pub num_target_layers: Option<usize>,
    /// The drafter's own layers (a Qwen3 config).
    pub layers: DecoderConfig,
    /// A reduced draft vocabulary (grove's extension): the drafter's head covers this many
    /// target tokens, listed in its `d2t` tensor; `None`, the target's whole head.
    pub draft_vocab_size: Option<usize>,
}

impl DFlashConfig {
    /// Parses a drafter `config.json`. `resolve_token` maps a `mask_token` string to its id.
    pub fn from_json(
        config: &Value,
        resolve_token: impl Fn(&str) -> Option<TokenId>,
    ) -> Result<Self, String> {
        let dflash = config.get("dflash_config").cloned().unwrap_or(Value::Null);
        if let Some(object) = dflash.as_object() {
            if let Some(key) = object
                .keys()
                .find(|k| !KNOWN_DFLASH_KEYS.contains(&k.as_str()))
            {
                return Err(format!(
                    "unknown drafter variant: `dflash_config.{key}` is not implemented"
                ));
            }
        }
        if let Some(object) = config.as_object() {
            if let Some(key) = object
                .keys()
                .find(|k| VARIANT_KEY_FRAGMENTS.iter().any(|f| k.contains(f)))
            {
                return Err(format!(
                    "unknown drafter variant: config key `{key}` is not implemented"
                ));
            }
        }
        let layers = DecoderConfig::from_json(config)?;
        let number = |value: Option<&Value>, key: &str| -> Result<Option<usize>, String> {
            value
                .filter(|v| !v.is_null())
                .map(|v| {
                    v.as_u64()
                        .map(|n| n as usize)
                        .ok_or(format!("`{key}` must be a non-negative integer"))
                })
                .transpose()
        };
        let block_size = number(config.get("block_size"), "block_size")?
            .or(number(
                dflash.get("block_size"),
                "dflash_config.block_size",
            )?)
            .ok_or("missing key `block_size` (top level or in `dflash_config`)")?;
        if block_size < 2 {
            return Err(format!("`block_size` must be at least 2, got {block_size}"));
        }
        let mask_token_id = match (dflash.get("mask_token_id"), dflash.get("mask_token")) {
            (Some(id), _) => id
                .as_u64()
                .ok_or("`dflash_config.mask_token_id` must be an integer")?
                as TokenId,
            (None, Some(Value::String(token))) => resolve_token(token).ok_or(format!(
                "`dflash_config.mask_token` {token:?} is not in the target's tokenizer"
            ))?,
            _ => return Err("missing key `dflash_config.mask_token_id` (or `mask_token`)".into()),
        };
        let num_target_layers =
            number(config.get("num_target_layers"), "num_target_layers")?.or(number(
                dflash.get("num_target_layers"),
                "dflash_config.num_target_layers",
            )?);
        let target_layer_ids = match dflash.get("target_layer_ids") {
            Some(ids) => serde_json::from_value(ids.clone())
                .map_err(|_| "`dflash_config.target_layer_ids` must be a list of layer indices")?,
            None => {
                let target_layers = num_target_layers
                    .ok_or("missing `dflash_config.target_layer_ids` and `num_target_layers` to derive them")?;
                default_target_layer_ids(target_layers, layers.num_layers)
            }
        };
        if target_layer_ids.is_empty() {
            return Err("`dflash_config.target_layer_ids` must not be empty".into());
        }
        let draft_vocab_size = number(
            dflash.get("draft_vocab_size"),
            "dflash_config.draft_vocab_size",
        )?;
        if draft_vocab_size == Some(0) {
            return Err("`dflash_config.draft_vocab_size` must be at least 1".into());
        }
        Ok(Self {
            block_size,
            mask_token_id,
            target_layer_ids,
            num_target_layers,
            layers,
            draft_vocab_size,
        })
    }
}

/// The reference's default taps: the middle layer for a 1-layer drafter, else `num_draft`
/// layers evenly spaced from 1 to `target_layers - 3` (rounded half to even, like Python).
pub fn default_target_layer_ids(target_layers: usize, num_draft: usize) -> Vec<usize> {
    if num_draft <= 1 {
        return vec![target_layers / 2];
    }
    let span = target_layers.saturating_sub(4) as f64;
    (0..num_draft)
        .map(|i| (1.0 + i as f64 * span / (num_draft - 1) as f64).round_ties_even() as usize)
        .collect()
}

/// What one draft pass returns.
#[derive(Debug)]
pub struct DraftOutput {
    /// `[S, hidden]` after the drafter's final norm.
    pub hidden: Tensor,
    /// `[depths, vocab]` (`S - 1` depths from [`DFlashDrafter::draft`]): the LM head on slots
    /// `1..=depths`, over the target's vocabulary, or over
    /// [`DFlashDrafter::draft_vocabulary`] when the drafter has a reduced one (column `i` is
    /// target token `draft_vocabulary[i]`; every other token's logit is `-inf`).
    pub logits: Tensor,
}

/// A loaded drafter: weights only. Its context K/V live in a caller-owned [`KvStore`] whose
/// page table holds exactly the committed positions `0..start`.
#[derive(Debug)]
pub struct DFlashDrafter {
    config: DFlashConfig,
    fc: Linear,           // [hidden, taps * hidden]
    hidden_norm: RmsNorm, // [hidden]
    layers: LayerStack,
    norm: RmsNorm, // [hidden]
    head: Option<DraftHead>,
}

/// A reduced draft vocabulary's head: the target's head rows for `d2t`, gathered at load.
#[derive(Debug)]
struct DraftHead {
    /// Target id of each draft id, increasing.
    d2t: Vec<TokenId>,
    linear: Linear, // [draft vocab, hidden]
}

impl DraftHead {
    /// A dense head's rows `d2t`: drafts only steer what is verified, so they are kept at
    /// Q8_0 (a quarter of f32's reads) wherever the kernels take their width.
    fn dense_rows(target: &dyn Model, d2t: &[TokenId], size: usize) -> Result<Matrix, String> {
        let rows = target.head_rows(d2t).map_err(|e| e.to_string())?;
        let hidden = target.config().hidden_size;
        match rows.flatten_all().and_then(|r| r.to_vec1::<f32>()) {
            Ok(values) if hidden.is_multiple_of(grove_kernels::quant::CHUNK) => {
                let q = grove_kernels::quant::QMatrix::quantize_q8_0(&values, size, hidden)?;
                Ok(Matrix::Quantized(std::sync::Arc::new(q)))
            }
            _ => Matrix::dense(&rows).map_err(|e| e.to_string()),
        }
    }

    fn load(
        weights: &Weights,
        prefix: &str,
        size: usize,
        target: &dyn Model,
    ) -> Result<Self, String> {
        let name = format!("{prefix}d2t");
        let ids = weights
            .get(&name, &[size])
            .map_err(|e| format!("`draft_vocab_size` is {size} but tensor `{name}`: {e}"))?;
        let ids: Vec<f32> = ids.to_vec1().map_err(|e| e.to_string())?;
        let vocab = target.config().vocab_size;
        let mut d2t = Vec::with_capacity(size);
        for (i, &id) in ids.iter().enumerate() {
            if !(id >= 0.0 && id.fract() == 0.0 && (id as usize) < vocab) {
                return Err(format!(
                    "`{name}[{i}]` = {id} is not a token id of the target's vocabulary of {vocab}"
                ));
            }
            if d2t.last().is_some_and(|&last| last >= id as TokenId) {
                return Err(format!("`{name}` must be strictly increasing (at {i})"));
            }
            d2t.push(id as TokenId);
        }
        let matrix = match target
            .quantized_head_rows(&d2t)
            .map_err(|e| e.to_string())?
        {
            // The target's own blocks: the values the drafter was trained against (a Q6_K head
            // reads 0.82 bytes a weight).
            Some(rows) => Matrix::Quantized(std::sync::Arc::new(rows)),
            None => Self::dense_rows(target, &d2t, size)?,
        };
        Ok(Self {
            d2t,
            linear: Linear::from_matrix(matrix, None),
        })
    }
}

impl DFlashDrafter {
    /// Loads a drafter directory (z-lab format) and checks it against `target`.
    /// `resolve_token` maps a `mask_token` string through the target's tokenizer.
    pub fn load(
        directory: &Path,
        target: &dyn Model,
        resolve_token: impl Fn(&str) -> Option<TokenId>,
        device: &Device,
    ) -> Result<Self, ModelError> {
        let config_path = directory.join("config.json");
        if !config_path.is_file() {
            return Err(ModelError::MissingFile {
                path: config_path,
                what: "drafter config",
            });
        }
        let text = std::fs::read_to_string(&config_path).map_err(|source| ModelError::Io {
            path: config_path.clone(),
            source,
        })?;
        let incompatible = |message: String| ModelError::IncompatibleDrafter {
            path: directory.to_owned(),
            message,
        };
        let value: Value = serde_json::from_str(&text).map_err(|e| ModelError::Config {
            path: config_path.clone(),
            message: e.to_string(),
        })?;
        let config = DFlashConfig::from_json(&value, resolve_token).map_err(|message| {
            ModelError::Config {
                path: config_path.clone(),
                message,
            }
        })?;
        let target_config = target.config();
        let hidden = target_config.hidden_size;
        if config.layers.hidden_size != hidden {
            return Err(incompatible(format!(
                "drafter `hidden_size` {} differs from the target's {hidden}",
                config.layers.hidden_size
            )));
        }
        if let Some(&layer) = config
            .target_layer_ids
            .iter()
            .find(|&&l| l >= target_config.num_layers)
        {
            return Err(incompatible(format!(
                "tap layer {layer} in `target_layer_ids` is out of range for a {}-layer target",
                target_config.num_layers
            )));
        }
        if let Some(trained) = config
            .num_target_layers
            .filter(|&n| n != target_config.num_layers)
        {
            return Err(incompatible(format!(
                "`num_target_layers` is {trained} but the target has {} layers",
                target_config.num_layers
            )));
        }
        if config.mask_token_id as usize >= target_config.vocab_size {
            return Err(incompatible(format!(
                "mask token {} is outside the target's vocabulary of {}",
                config.mask_token_id, target_config.vocab_size
            )));
        }
        let mut weights = Weights::open(directory, device)?;
        if crate::drafter_manifest::DrafterManifest::q8_0_products(directory)? {
            weights = weights.with_q8_0_products();
        }
        let prefix = if weights.contains("fc.weight") {
            ""
        } else if weights.contains("model.fc.weight") {
            "model."
        } else {
            return Err(incompatible(
                "missing tensor `fc.weight` (with or without a `model.` prefix)".into(),
            ));
        };
        let fc = Linear::load(&weights, &format!("{prefix}fc"), config.target_layer_ids.len() * hidden, hidden, false).map_err(|error| match error {
            ModelError::Weights { message, .. } if message.contains("shape") => incompatible(format!(
                "{message}: `fc` input width must be len(target_layer_ids) x hidden = {} x {hidden}",
                config.target_layer_ids.len()
            )),
            other => other,
        })?;
        let eps = config.layers.rms_norm_eps;
        let head = config
            .draft_vocab_size
            .map(|size| DraftHead::load(&weights, prefix, size, target))
            .transpose()
            .map_err(incompatible)?;
        Ok(Self {
            head,
            fc,
            hidden_norm: RmsNorm::load(&weights, &format!("{prefix}hidden_norm"), hidden, eps)?,
            layers: LayerStack::load(&weights, &format!("{prefix}layers"), &config.layers, device)?,
            norm: RmsNorm::load(&weights, &format!("{prefix}norm"), hidden, eps)?,
            config,
        })
    }

    pub fn config(&self) -> &DFlashConfig {
        &self.config
    }

    /// The target ids a reduced draft vocabulary covers, increasing (`d2t`); `None`: the
    /// drafter's logits cover the target's whole vocabulary.
    pub fn draft_vocabulary(&self) -> Option<&[TokenId]> {
        self.head.as_ref().map(|head| head.d2t.as_slice())
    }

    pub fn new_kv_store(&self, num_slots: usize) -> KvStore {
        KvStore::new(
            self.config.layers.num_layers,
            num_slots,
            self.config.layers.num_kv_heads,
            self.config.layers.head_dim,
        )
    }

    /// Commits context for the next `features.dim(0)` positions (`table.len()..`): fuses the
    /// target taps `[rows, taps * hidden]` and writes every layer's K/V for them.
    pub fn extend_context(
        &self,
        features: &Tensor,
        table: &mut PageTable,
        kv: &mut KvStore,
    ) -> Result<(), ModelError> {
        grove_kernels::threads::with_threads_awake(|| {
            self.extend_context_awake(features, table, kv)
        })
    }

    fn extend_context_awake(
        &self,
        features: &Tensor,
        table: &mut PageTable,
        kv: &mut KvStore,
    ) -> Result<(), ModelError> {
        let rows = features.dim(0)?;
        if rows == 0 {
            return Ok(());
        }
        table.reserve(rows)?;
        let fused = self.hidden_norm.forward(&self.fc.forward(features)?)?;
        let positions: Vec<usize> = (table.len()..table.len() + rows).collect();
        let slots: Vec<usize> = positions.iter().map(|&i| table.slot(i)).collect();
        self.layers
            .write_context_kv(&fused, &positions, &slots, kv)?;
        table.append(rows);
        Ok(())
    }

    /// One draft pass for the block `[anchor, MASK x (S-1)]` at positions `table.len()..`.
    /// The block's K/V are written past the committed context and never committed.
    pub fn draft(
        &self,
        target: &dyn Model,
        anchor: TokenId,
        table: &mut PageTable,
        kv: &mut KvStore,
    ) -> Result<DraftOutput, ModelError> {
        let depths = self.config.block_size - 1;
        let mut outputs = self.draft_batch(target, &mut [(table, anchor, depths)], kv)?;
        Ok(outputs.pop().expect("one block in, one out"))
    }

    /// One drafter forward over the blocks of several sequences, each `(table, anchor,
    /// depths)` with its block at positions `table.len()..`; returns one [`DraftOutput`] per
    /// block, with logits for the first `depths` slots after the anchor (the LM head is most
    /// of a block's cost: a tree of `b` nodes reads at most `b` depths).
    pub fn draft_batch(
        &self,
        target: &dyn Model,
        blocks: &mut [(&mut PageTable, TokenId, usize)],
        kv: &mut KvStore,
    ) -> Result<Vec<DraftOutput>, ModelError> {
        grove_kernels::threads::with_threads_awake(|| self.draft_batch_awake(target, blocks, kv))
    }

    fn draft_batch_awake(
        &self,
        target: &dyn Model,
        blocks: &mut [(&mut PageTable, TokenId, usize)],
        kv: &mut KvStore,
    ) -> Result<Vec<DraftOutput>, ModelError> {
        let size = self.config.block_size;
        if let Some((_, _, depths)) = blocks.iter().find(|b| !(1..size).contains(&b.2)) {
            return Err(ModelError::InvalidBatch(format!(
                "draft depths {depths} outside 1..={} (block_size - 1)",
                size - 1
            )));
        }
        for (table, _, _) in blocks.iter_mut() {
            table.reserve(size)?;
        }
        let tokens: Vec<Vec<TokenId>> = blocks
            .iter()
            .map(|(_, anchor, _)| {
                std::iter::once(*anchor)
                    .chain(std::iter::repeat_n(self.config.mask_token_id, size - 1))
                    .collect()
            })
            .collect();
        let positions: Vec<Vec<usize>> = blocks
            .iter()
            .map(|(table, _, _)| (table.len()..table.len() + size).collect())
            .collect();
        let segments = blocks
            .iter()
            .zip(tokens.iter().zip(&positions))
            .map(|((table, _, _), (tokens, positions))| Segment {
                table,
                context_len: table.len(),
                tokens,
                positions,
                visibility: Visibility::Bidirectional,
                logits: LogitRows::None,
            })
            .collect();
        let batch = ForwardBatch {
            segments,
            taps: &[],
        };
        let flat: Vec<TokenId> = tokens.concat();
        let (hidden, _) = self.layers.forward(target.embed(&flat)?, &batch, kv)?;
        let hidden = self.norm.forward(&hidden)?;
        blocks
            .iter()
            .enumerate()
            .map(|(i, &(_, _, depths))| {
                let block = hidden.narrow(0, i * size, size)?;
                let drafts = block.narrow(0, 1, depths)?;
                // A reduced vocabulary's logits stay reduced: scattering them into the
                // target's vocabulary would make every candidate search read -inf columns.
                let logits = match &self.head {
                    Some(head) => head.linear.forward(&drafts)?,
                    None => target.project_logits(&drafts)?,
                };
                Ok(DraftOutput {
                    hidden: block,
                    logits,
                })
            })
            .collect()
    }
}
