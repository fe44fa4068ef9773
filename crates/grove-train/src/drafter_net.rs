//! The DFlash drafter as a differentiable graph, for training against a frozen target.
//!
//! For each sequence, `n` anchors are sampled; block `i` is `[x[a_i], MASK x (S-1)]` at
//! positions `a_i..a_i+S`. It attends to the fused target features of the tokens before its
//! anchor (`c = hidden_norm(fc(taps))`, entering each layer as keys and values only, as at
//! inference) and bidirectionally within itself; blocks of one sequence never see each other.
//! The drafter's `norm`, then the target's (frozen) LM head, gives logits for slots `1..S`.

use std::collections::HashMap;

use candle_core::{Device, Tensor, D};
use grove_model::DecoderConfig;

use crate::net::{self, embed, rms_norm, rope_tables, Weights};
use crate::params::{Init, Params};
use crate::TrainError;

/// Shape of a drafter: its own layers (a Qwen3 config sharing the target's width) and taps.
#[derive(Debug, Clone)]
pub struct DrafterShape {
    pub layers: DecoderConfig,
    pub target_layer_ids: Vec<usize>,
    pub block_size: usize,
    pub mask_token_id: u32,
    /// A reduced draft vocabulary: the target ids the head covers (written as `d2t`).
    pub d2t: Option<Vec<u32>>,
}

/// A new drafter's parameters, under z-lab's names (no `model.` prefix).
pub fn drafter_params(shape: &DrafterShape, seed: u64) -> Result<Params, TrainError> {
    let h = shape.layers.hidden_size;
    let mut params = Params::default();
    params.add(
        "fc.weight",
        &[h, shape.target_layer_ids.len() * h],
        Init::Normal(0.02),
        seed,
    )?;
    params.add("hidden_norm.weight", &[h], Init::Ones, seed)?;
    params.add("norm.weight", &[h], Init::Ones, seed)?;
    net::add_layers(&mut params, "layers", &shape.layers, seed)?;
    Ok(params)
}

/// Additive mask `[B, 1, n*S, T + n*S]`: block `i`'s rows see context keys before `a_i` and
/// the keys of block `i`.
fn block_mask(anchors: &[Vec<usize>], t: usize, s: usize) -> candle_core::Result<Tensor> {
    let (b, n) = (anchors.len(), anchors[0].len());
    let width = t + n * s;
    let mut values = vec![-1e9f32; b * n * s * width];
    for (seq, seq_anchors) in anchors.iter().enumerate() {
        for (block, &anchor) in seq_anchors.iter().enumerate() {
            for row in 0..s {
                let base = ((seq * n + block) * s + row) * width;
                values[base..base + anchor].fill(0.0);
                let own = base + t + block * s;
                values[own..own + s].fill(0.0);
            }
        }
    }
    Tensor::from_vec(values, (b, 1, n * s, width), &Device::Cpu)
}

/// The frozen target: its weights (no gradient recorded) and shape.
#[derive(Debug, Clone)]
pub struct FrozenTarget {
    pub weights: HashMap<String, Tensor>,
    pub config: DecoderConfig,
}

/// One training batch: sequences `tokens` `[B, T]`, the target's tapped features
/// `[B, T, taps*H]` of every token, and the anchors of each sequence's blocks (the same
/// count per sequence).
#[derive(Debug, Clone, Copy)]
pub struct DraftBatch<'a> {
    pub tokens: &'a Tensor,
    pub features: &'a Tensor,
    pub anchors: &'a [Vec<usize>],
}

/// Every block's input tokens: `[x[a], MASK x (S-1)]` per anchor `a`, sequences in order.
pub fn block_tokens(tokens: &[Vec<u32>], anchors: &[Vec<usize>], shape: &DrafterShape) -> Vec<u32> {
    let s = shape.block_size;
    anchors
        .iter()
        .zip(tokens)
        .flat_map(|(a, seq)| {
            a.iter().flat_map(move |&a| {
                std::iter::once(seq[a]).chain(std::iter::repeat_n(shape.mask_token_id, s - 1))
            })
        })
        .collect()
}

/// The drafter's normed hidden states `[B, n*S, H]` for blocks whose input embeddings are
/// `embedded` `[B, n*S, H]` (the target's, frozen), over context `features` `[B, T, taps*H]`.
pub fn drafter_hidden(
    drafter: &impl Weights,
    shape: &DrafterShape,
    embedded: &Tensor,
    features: &Tensor,
    anchors: &[Vec<usize>],
) -> candle_core::Result<Tensor> {
    let c = &shape.layers;
    let s = shape.block_size;
    let (b, t, _) = features.dims3()?;
    let fused = rms_norm(
        &features.broadcast_matmul(&drafter.w("fc.weight").t()?)?,
        &drafter.w("hidden_norm.weight"),
        c.rms_norm_eps,
    )?;
    let (ctx_cos, ctx_sin) = rope_tables(&vec![(0..t).collect(); b], c)?;
    let block_positions: Vec<Vec<usize>> = anchors
        .iter()
        .map(|a| a.iter().flat_map(|&a| a..a + s).collect())
        .collect();
    let (cos, sin) = rope_tables(&block_positions, c)?;
    let mask = block_mask(anchors, t, s)?;
    let mut h = embedded.clone();
    for i in 0..c.num_layers {
        let p = format!("layers.{i}");
        h = net::layer_with_context(
            drafter,
            &p,
            &h,
            &fused,
            (&cos, &sin),
            (&ctx_cos, &ctx_sin),
            &mask,
            c,
        )?;
    }
    rms_norm(&h, &drafter.w("norm.weight"), c.rms_norm_eps)
}

/// Drafter logits `[B, n*S, V]` for the blocks of `batch`.
pub fn drafter_logits(
    drafter: &impl Weights,
    target: &FrozenTarget,
    shape: &DrafterShape,
    batch: DraftBatch<'_>,
) -> candle_core::Result<Tensor> {
    let DraftBatch {
        tokens,
        features,
        anchors,
    } = batch;
    let b = tokens.dim(0)?;
    let host_tokens: Vec<Vec<u32>> = tokens.to_vec2()?;
    let block = block_tokens(&host_tokens, anchors, shape);
    let rows = block.len() / b;
    let block = Tensor::from_vec(block, (b, rows), &Device::Cpu)?;
    let embedded = embed(&target.weights, &block)?;
    let normed = drafter_hidden(drafter, shape, &embedded, features, anchors)?;
    let head = if target.config.tie_word_embeddings {
        target.weights.w("model.embed_tokens.weight")
    } else {
        target.weights.w("lm_head.weight")
    };
    normed.broadcast_matmul(&head.t()?)
}

/// The weighted cross-entropy of the draft slots of logits `[B, n*S, V]` (each block's anchor
/// slot dropped) against `labels` and `weights`, one per draft slot in block order.
pub fn slot_loss(
    logits: &Tensor,
    block_size: usize,
    labels: Vec<u32>,
    weights: Vec<f32>,
) -> candle_core::Result<Tensor> {
    let s = block_size;
    let (b, rows, v) = logits.dims3()?;
    let n = rows / s;
    // Drop each block's anchor slot: [B, n, S, V] -> [B, n, S-1, V].
    let logits = logits
        .reshape((b, n, s, v))?
        .narrow(2, 1, s - 1)?
        .reshape((b * n * (s - 1), v))?;
    let count = labels.len();
    let labels = Tensor::from_vec(labels, count, &Device::Cpu)?;
    let weights = Tensor::from_vec(weights, count, &Device::Cpu)?;
    net::weighted_cross_entropy(&logits, &labels, &weights)
}

/// Position-decayed cross-entropy over the masked slots of every block: slot `j` (1-based
/// among the `S - 1` drafts) weighs `decay^(j-1)`, and its label is the sequence's token at
/// `a + j`, which the training data makes the target's own greedy continuation.
pub fn drafter_loss(
    drafter: &impl Weights,
    target: &FrozenTarget,
    shape: &DrafterShape,
    batch: DraftBatch<'_>,
    decay: f64,
) -> candle_core::Result<Tensor> {
    let s = shape.block_size;
    let logits = drafter_logits(drafter, target, shape, batch)?;
    let host_tokens: Vec<Vec<u32>> = batch.tokens.to_vec2()?;
    let mut labels = Vec::new();
    let mut weights = Vec::new();
    for (seq, seq_anchors) in batch.anchors.iter().enumerate() {
        for &anchor in seq_anchors {
            for j in 1..s {
                labels.push(host_tokens[seq][anchor + j]);
                weights.push(decay.powi(j as i32 - 1) as f32);
            }
        }
    }
    slot_loss(&logits, s, labels, weights)
}

/// The target's tapped features `[B, T, taps*H]` for `tokens`, with no gradient.
pub fn target_features(
    target: &FrozenTarget,
    tokens: &Tensor,
    taps: &[usize],
) -> candle_core::Result<Tensor> {
    let (_, tapped) = net::target_forward(&target.weights, tokens, taps, &target.config)?;
    Tensor::cat(&tapped, D::Minus1)
}
