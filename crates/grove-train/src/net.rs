//! The networks as differentiable candle graphs: the Qwen3 target (for `train-target`, and
//! frozen for drafter training) and the DFlash drafter (for `train-drafter`). Same math and
//! parameter names as the inference code in `grove-model` (checked by tests): pre-norm layers,
//! q/k RMSNorm per head, rotate-half RoPE, GQA, SwiGLU, tied or untied head.
//!
//! Shapes: `B` sequences of `T` tokens; hidden `H`; `nh` query heads, `nkv` key/value heads of
//! `hd` dims. Attention is dense with an additive mask: training sequences are short.

use std::collections::HashMap;

use candle_core::{DType, Device, Tensor, D};
use grove_model::DecoderConfig;

use crate::params::{Init, Params};
use crate::TrainError;

/// A large negative added to masked attention scores (not -inf: a fully masked row never occurs,
/// and finite values keep gradients finite).
const MASKED: f32 = -1e9;

/// Parameter lookup for a forward pass: trainable (`Params`, gradients recorded) or frozen.
pub trait Weights {
    fn w(&self, name: &str) -> Tensor;
}

impl Weights for Params {
    fn w(&self, name: &str) -> Tensor {
        self.t(name)
    }
}

impl Weights for HashMap<String, Tensor> {
    fn w(&self, name: &str) -> Tensor {
        self.get(name)
            .unwrap_or_else(|| panic!("no weight `{name}`"))
            .clone()
    }
}

/// `x / sqrt(mean(x^2) + eps) * w` over the last dimension.
pub fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64) -> candle_core::Result<Tensor> {
    let scale = (x.sqr()?.mean_keepdim(D::Minus1)? + eps)?.sqrt()?.recip()?;
    x.broadcast_mul(&scale)?.broadcast_mul(weight)
}

/// `x W^T` for `x` of any leading shape.
fn linear(x: &Tensor, weight: &Tensor) -> candle_core::Result<Tensor> {
    x.broadcast_matmul(&weight.t()?)
}

/// RoPE tables for `positions` (`[B, T]`), shaped `[B, T, 1, hd/2]` to broadcast over heads.
pub fn rope_tables(
    positions: &[Vec<usize>],
    config: &DecoderConfig,
) -> candle_core::Result<(Tensor, Tensor)> {
    let rope = grove_model::Rope::new(config);
    let half = config.head_dim / 2;
    let (b, t) = (positions.len(), positions[0].len());
    let flat: Vec<usize> = positions.iter().flatten().copied().collect();
    let (cos, sin) = rope.tables(&flat);
    let cos = Tensor::from_vec(cos, (b, t, 1, half), &Device::Cpu)?;
    let sin = Tensor::from_vec(sin, (b, t, 1, half), &Device::Cpu)?;
    Ok((cos, sin))
}

/// Rotate-half RoPE on `x` `[B, T, heads, hd]`.
fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> candle_core::Result<Tensor> {
    let half = x.dim(D::Minus1)? / 2;
    let x1 = x.narrow(D::Minus1, 0, half)?;
    let x2 = x.narrow(D::Minus1, half, half)?;
    let first = (x1.broadcast_mul(cos)? - x2.broadcast_mul(sin)?)?;
    let second = (x2.broadcast_mul(cos)? + x1.broadcast_mul(sin)?)?;
    Tensor::cat(&[first, second], D::Minus1)
}

/// `softmax(q k^T / sqrt(hd) + mask) v`: `q` `[B, T, nh, hd]`, `k`/`v` `[B, S, nkv, hd]`,
/// `mask` broadcastable to `[B, 1, T, S]`; returns `[B, T, nh * hd]`.
fn attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: &Tensor,
    c: &DecoderConfig,
) -> candle_core::Result<Tensor> {
    let (b, t, nh, hd) = q.dims4()?;
    let s = k.dim(1)?;
    let group = nh / c.num_kv_heads;
    let expand = |x: &Tensor| -> candle_core::Result<Tensor> {
        let x = x.transpose(1, 2)?; // [B, nkv, S, hd]
        let x = if group == 1 {
            x
        } else {
            x.unsqueeze(2)?
                .expand((b, c.num_kv_heads, group, s, hd))?
                .reshape((b, nh, s, hd))?
        };
        x.contiguous()
    };
    let q = q.transpose(1, 2)?.contiguous()?;
    let (k, v) = (expand(k)?, expand(v)?);
    let scores = (q.matmul(&k.t()?)? * (1.0 / (hd as f64).sqrt()))?.broadcast_add(mask)?;
    let probs = candle_nn::ops::softmax(&scores, D::Minus1)?;
    probs.matmul(&v)?.transpose(1, 2)?.reshape((b, t, nh * hd))
}

/// The causal mask `[1, 1, T, T]`.
pub fn causal_mask(t: usize) -> candle_core::Result<Tensor> {
    let values: Vec<f32> = (0..t)
        .flat_map(|i| (0..t).map(move |j| if j <= i { 0.0 } else { MASKED }))
        .collect();
    Tensor::from_vec(values, (1, 1, t, t), &Device::Cpu)
}

/// Registers a Qwen3 layer stack's parameters under `{prefix}.{i}`.
pub fn add_layers(
    params: &mut Params,
    prefix: &str,
    c: &DecoderConfig,
    seed: u64,
) -> Result<(), TrainError> {
    if c.o_bias || c.mlp_bias {
        return Err(TrainError::Data(
            "the training graph has no o_proj or MLP biases (Qwen3 and Qwen2 shapes only)".into(),
        ));
    }
    let std = 0.02;
    // Residual-branch outputs start smaller so deep stacks begin near the identity (GPT-2).
    let out_std = std / (2.0 * c.num_layers as f64).sqrt();
    let (h, hd) = (c.hidden_size, c.head_dim);
    for i in 0..c.num_layers {
        let p = format!("{prefix}.{i}");
        params.add(
            &format!("{p}.input_layernorm.weight"),
            &[h],
            Init::Ones,
            seed,
        )?;
        params.add(
            &format!("{p}.post_attention_layernorm.weight"),
            &[h],
            Init::Ones,
            seed,
        )?;
        let a = format!("{p}.self_attn");
        params.add(
            &format!("{a}.q_proj.weight"),
            &[c.num_heads * hd, h],
            Init::Normal(std),
            seed,
        )?;
        params.add(
            &format!("{a}.k_proj.weight"),
            &[c.kv_width(), h],
            Init::Normal(std),
            seed,
        )?;
        params.add(
            &format!("{a}.v_proj.weight"),
            &[c.kv_width(), h],
            Init::Normal(std),
            seed,
        )?;
        params.add(
            &format!("{a}.o_proj.weight"),
            &[h, c.num_heads * hd],
            Init::Normal(out_std),
            seed,
        )?;
        if c.qk_norm {
            params.add(&format!("{a}.q_norm.weight"), &[hd], Init::Ones, seed)?;
            params.add(&format!("{a}.k_norm.weight"), &[hd], Init::Ones, seed)?;
        }
        if c.qkv_bias {
            for (name, width) in [
                ("q", c.num_heads * hd),
                ("k", c.kv_width()),
                ("v", c.kv_width()),
            ] {
                params.add(
                    &format!("{a}.{name}_proj.bias"),
                    &[width],
                    Init::Zeros,
                    seed,
                )?;
            }
        }
        let m = format!("{p}.mlp");
        let inter = c.intermediate_size;
        params.add(
            &format!("{m}.gate_proj.weight"),
            &[inter, h],
            Init::Normal(std),
            seed,
        )?;
        params.add(
            &format!("{m}.up_proj.weight"),
            &[inter, h],
            Init::Normal(std),
            seed,
        )?;
        params.add(
            &format!("{m}.down_proj.weight"),
            &[h, inter],
            Init::Normal(out_std),
            seed,
        )?;
    }
    Ok(())
}

/// A new Qwen3 target's parameters.
pub fn target_params(c: &DecoderConfig, seed: u64) -> Result<Params, TrainError> {
    let mut params = Params::default();
    params.add(
        "model.embed_tokens.weight",
        &[c.vocab_size, c.hidden_size],
        Init::Normal(0.02),
        seed,
    )?;
    params.add("model.norm.weight", &[c.hidden_size], Init::Ones, seed)?;
    if !c.tie_word_embeddings {
        params.add(
            "lm_head.weight",
            &[c.vocab_size, c.hidden_size],
            Init::Normal(0.02),
            seed,
        )?;
    }
    add_layers(&mut params, "model.layers", c, seed)?;
    Ok(params)
}

/// `{a}.{name}_proj(x)` (+ bias for Qwen2), split into heads, RMS-normed per head for Qwen3.
fn project(
    w: &impl Weights,
    a: &str,
    name: &str,
    x: &Tensor,
    heads: usize,
    c: &DecoderConfig,
) -> candle_core::Result<Tensor> {
    let (b, t, _) = x.dims3()?;
    let mut y = linear(x, &w.w(&format!("{a}.{name}_proj.weight")))?;
    if c.qkv_bias {
        y = y.broadcast_add(&w.w(&format!("{a}.{name}_proj.bias")))?;
    }
    let y = y.reshape((b, t, heads, c.head_dim))?;
    if c.qk_norm && name != "v" {
        rms_norm(&y, &w.w(&format!("{a}.{name}_norm.weight")), c.rms_norm_eps)
    } else {
        Ok(y)
    }
}

/// Keys, values (RoPE'd keys) of one layer from its normed input `x` `[B, T, H]`.
fn layer_kv(
    w: &impl Weights,
    a: &str,
    x: &Tensor,
    cos: &Tensor,
    sin: &Tensor,
    c: &DecoderConfig,
) -> candle_core::Result<(Tensor, Tensor)> {
    let k = project(w, a, "k", x, c.num_kv_heads, c)?;
    let v = project(w, a, "v", x, c.num_kv_heads, c)?;
    Ok((rope(&k, cos, sin)?, v))
}

/// One pre-norm layer over `h` `[B, T, H]`. `extra_kv` (keys and values `[B, S, nkv, hd]`) are
/// placed before the layer's own keys; `mask` covers `[extra, own]` keys.
#[allow(clippy::too_many_arguments)]
fn layer(
    w: &impl Weights,
    p: &str,
    h: &Tensor,
    cos: &Tensor,
    sin: &Tensor,
    mask: &Tensor,
    extra_kv: Option<(&Tensor, &Tensor)>,
    c: &DecoderConfig,
) -> candle_core::Result<Tensor> {
    let a = format!("{p}.self_attn");
    let x = rms_norm(
        h,
        &w.w(&format!("{p}.input_layernorm.weight")),
        c.rms_norm_eps,
    )?;
    let q = rope(&project(w, &a, "q", &x, c.num_heads, c)?, cos, sin)?;
    let (mut k, mut v) = layer_kv(w, &a, &x, cos, sin, c)?;
    if let Some((extra_k, extra_v)) = extra_kv {
        k = Tensor::cat(&[extra_k, &k], 1)?;
        v = Tensor::cat(&[extra_v, &v], 1)?;
    }
    let attended = attention(&q, &k, &v, mask, c)?;
    let h = (h + linear(&attended, &w.w(&format!("{a}.o_proj.weight")))?)?;
    let x = rms_norm(
        &h,
        &w.w(&format!("{p}.post_attention_layernorm.weight")),
        c.rms_norm_eps,
    )?;
    let m = format!("{p}.mlp");
    let gate = candle_nn::ops::silu(&linear(&x, &w.w(&format!("{m}.gate_proj.weight")))?)?;
    let up = linear(&x, &w.w(&format!("{m}.up_proj.weight")))?;
    h + linear(&(gate * up)?, &w.w(&format!("{m}.down_proj.weight")))?
}

/// A drafter layer: its block rows `h` attend to the context (keys and values computed from
/// the fused features `context` with no input norm, as `write_context_kv` does) and to the
/// block itself, under `mask`.
#[allow(clippy::too_many_arguments)]
pub fn layer_with_context(
    w: &impl Weights,
    p: &str,
    h: &Tensor,
    context: &Tensor,
    (cos, sin): (&Tensor, &Tensor),
    (ctx_cos, ctx_sin): (&Tensor, &Tensor),
    mask: &Tensor,
    c: &DecoderConfig,
) -> candle_core::Result<Tensor> {
    let (k, v) = layer_kv(w, &format!("{p}.self_attn"), context, ctx_cos, ctx_sin, c)?;
    layer(w, p, h, cos, sin, mask, Some((&k, &v)), c)
}

/// The target's embeddings of `tokens` `[B, T]`.
pub fn embed(w: &impl Weights, tokens: &Tensor) -> candle_core::Result<Tensor> {
    let (b, t) = tokens.dims2()?;
    let table = w.w("model.embed_tokens.weight");
    table
        .index_select(&tokens.flatten_all()?, 0)?
        .reshape((b, t, table.dim(1)?))
}

/// The target's LM head over final hidden states (before `model.norm`).
pub fn head(w: &impl Weights, hidden: &Tensor, c: &DecoderConfig) -> candle_core::Result<Tensor> {
    let normed = rms_norm(hidden, &w.w("model.norm.weight"), c.rms_norm_eps)?;
    let head = if c.tie_word_embeddings {
        w.w("model.embed_tokens.weight")
    } else {
        w.w("lm_head.weight")
    };
    linear(&normed, &head)
}

/// Causal forward of the target over `tokens` `[B, T]` at positions `0..T`: logits
/// `[B, T, V]` and the outputs of layers `taps` (before the final norm), each `[B, T, H]`.
pub fn target_forward(
    w: &impl Weights,
    tokens: &Tensor,
    taps: &[usize],
    c: &DecoderConfig,
) -> candle_core::Result<(Tensor, Vec<Tensor>)> {
    let (b, t) = tokens.dims2()?;
    let positions = vec![(0..t).collect::<Vec<_>>(); b];
    let (cos, sin) = rope_tables(&positions, c)?;
    let mask = causal_mask(t)?;
    let mut h = embed(w, tokens)?;
    let mut tapped = Vec::new();
    for i in 0..c.num_layers {
        h = layer(
            w,
            &format!("model.layers.{i}"),
            &h,
            &cos,
            &sin,
            &mask,
            None,
            c,
        )?;
        if taps.contains(&i) {
            tapped.push(h.clone());
        }
    }
    Ok((head(w, &h, c)?, tapped))
}

/// Mean cross-entropy of `logits` `[N, V]` against `labels` `[N]`, weighted by `weights` `[N]`
/// (normalised by their sum).
pub fn weighted_cross_entropy(
    logits: &Tensor,
    labels: &Tensor,
    weights: &Tensor,
) -> candle_core::Result<Tensor> {
    let log_probs = candle_nn::ops::log_softmax(logits, D::Minus1)?;
    let picked = log_probs.gather(&labels.unsqueeze(1)?, 1)?.squeeze(1)?;
    let total = weights.sum_all()?;
    (picked * weights)?.sum_all()?.neg()?.broadcast_div(&total)
}

/// Plain next-token loss of the target over `tokens` `[B, T]` (every position predicts the next).
pub fn target_loss(
    w: &impl Weights,
    tokens: &Tensor,
    c: &DecoderConfig,
) -> candle_core::Result<Tensor> {
    let (b, t) = tokens.dims2()?;
    let (logits, _) = target_forward(w, &tokens.narrow(1, 0, t - 1)?, &[], c)?;
    let logits = logits.reshape((b * (t - 1), c.vocab_size))?;
    let labels = tokens.narrow(1, 1, t - 1)?.flatten_all()?;
    let weights = Tensor::ones(b * (t - 1), DType::F32, &Device::Cpu)?;
    weighted_cross_entropy(&logits, &labels, &weights)
}
