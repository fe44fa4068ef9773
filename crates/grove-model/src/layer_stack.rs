//! A stack of pre-norm decoder layers over the paged KV pool: the part of the network the
//! target decoder and the DFlash drafter share.
//!
//! Per layer, for all rows of a batch at once:
//! `x = norm(h); q,k,v = proj(x); [q/k norm]; RoPE; write k,v to their slots;`
//! `h += o(attend(q, visible keys)); h += mlp(post_norm(h))`.
//! Gemma 3 adds a norm on each branch's output (`h += norm(o(..))`, `h += norm(mlp(..))`),
//! and its sliding layers see only the last `window` positions, rotated with their own base.
//! Everything runs on host f32 rows (candle's gemm only for dense weights with many rows): a
//! decode step is hundreds of short operations, and a candle op's allocation and dispatch
//! cost about as much as the work of one.

use candle_core::{Device, Tensor};
use grove_kv::KvStore;

use crate::attention::{attend, HeadLayout, KeyPlan};
use crate::config::DecoderConfig;
use crate::forward::ForwardBatch;
use crate::layers::{host_values, Activation, Linear, Mlp, RmsNorm};
use crate::rope::Rope;
use crate::weights::Weights;
use crate::ModelError;

#[derive(Debug)]
struct Attention {
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
    q_norm: Option<RmsNorm>, // [head_dim], Qwen3 only
    k_norm: Option<RmsNorm>,
}

#[derive(Debug)]
struct DecoderLayer {
    input_norm: RmsNorm,
    attention: Attention,
    /// Norm of the attention branch's output (Gemma 3).
    attention_out_norm: Option<RmsNorm>,
    /// Norm before the MLP.
    pre_mlp_norm: RmsNorm,
    mlp: Mlp,
    /// Norm of the MLP's output (Gemma 3).
    mlp_out_norm: Option<RmsNorm>,
}

impl DecoderLayer {
    fn load(weights: &Weights, prefix: &str, c: &DecoderConfig) -> Result<Self, ModelError> {
        let (hidden, head_dim, eps) = (c.hidden_size, c.head_dim, c.rms_norm_eps);
        let offset = c.norm_offset();
        let norm = |name: &str, dim| {
            RmsNorm::load_with_offset(weights, &format!("{prefix}.{name}"), dim, eps, offset)
        };
        let a = format!("{prefix}.self_attn");
        let linear = |name: &str, in_dim, out_dim, bias| {
            Linear::load(weights, &format!("{a}.{name}"), in_dim, out_dim, bias)
        };
        let qk_norm = |name: &str| {
            c.qk_norm
                .then(|| norm(&format!("self_attn.{name}"), head_dim))
                .transpose()
        };
        let gemma = c.gemma.is_some();
        // HF names: Gemma's `post_attention_layernorm` norms the attention output and
        // `pre_feedforward_layernorm` the MLP input; elsewhere `post_attention_layernorm` is
        // the MLP's input norm.
        let (attention_out_norm, pre_mlp_norm, mlp_out_norm) = if gemma {
            (
                Some(norm("post_attention_layernorm", hidden)?),
                norm("pre_feedforward_layernorm", hidden)?,
                Some(norm("post_feedforward_layernorm", hidden)?),
            )
        } else {
            (None, norm("post_attention_layernorm", hidden)?, None)
        };
        let activation = if gemma {
            Activation::GeluTanh
        } else {
            Activation::Silu
        };
        Ok(Self {
            input_norm: norm("input_layernorm", hidden)?,
            attention: Attention {
                q_proj: linear("q_proj", hidden, c.num_heads * head_dim, c.qkv_bias)?,
                k_proj: linear("k_proj", hidden, c.kv_width(), c.qkv_bias)?,
                v_proj: linear("v_proj", hidden, c.kv_width(), c.qkv_bias)?,
                o_proj: linear("o_proj", c.num_heads * head_dim, hidden, c.o_bias)?,
                q_norm: qk_norm("q_norm")?,
                k_norm: qk_norm("k_norm")?,
            },
            attention_out_norm,
            pre_mlp_norm,
            mlp: Mlp::load_with_activation(
                weights,
                &format!("{prefix}.mlp"),
                hidden,
                c.intermediate_size,
                c.mlp_bias,
                activation,
            )?,
            mlp_out_norm,
        })
    }
}

/// A projection's output `[rows, heads * head_dim]`, normed per head where the model has
/// q/k norms.
fn norm_heads(mut y: Vec<f32>, norm: Option<&RmsNorm>) -> candle_core::Result<Vec<f32>> {
    if let Some(norm) = norm {
        norm.forward_host(&mut y)?;
    }
    Ok(y)
}

/// `hidden += branch`, element by element.
fn add_into(hidden: &mut [f32], branch: &[f32]) {
    for (h, b) in hidden.iter_mut().zip(branch) {
        *h += b;
    }
}

/// Writes row `i` of `keys`/`values` (`[rows, kv_width]`) into `slots[i]` of `layer`.
fn write_rows(kv: &mut KvStore, layer: usize, slots: &[usize], keys: &[f32], values: &[f32]) {
    let width = kv.kv_width();
    for (row, &slot) in slots.iter().enumerate() {
        let range = row * width..(row + 1) * width;
        kv.write(layer, slot, &keys[range.clone()], &values[range]);
    }
}

/// The layers of one network with their RoPE. Holds weights only.
#[derive(Debug)]
pub struct LayerStack {
    config: DecoderConfig,
    layers: Vec<DecoderLayer>,
    rope: Rope,
    /// The sliding layers' RoPE (Gemma 3: `rope_local_base_freq`, no scaling).
    local_rope: Option<Rope>,
    device: Device,
}

impl LayerStack {
    /// Loads layers `{prefix}.{i}` for `i < config.num_layers`.
    pub fn load(
        weights: &Weights,
        prefix: &str,
        config: &DecoderConfig,
        device: &Device,
    ) -> Result<Self, ModelError> {
        let layers = (0..config.num_layers)
            .map(|i| DecoderLayer::load(weights, &format!("{prefix}.{i}"), config))
            .collect::<Result<Vec<_>, _>>()?;
        let local_rope = config.gemma.as_ref().map(|g| {
            Rope::with_params(
                config.head_dim,
                g.local_rope_theta,
                &crate::config::RopeScaling::None,
            )
        });
        Ok(Self {
            config: config.clone(),
            layers,
            rope: Rope::new(config),
            local_rope,
            device: device.clone(),
        })
    }

    pub fn config(&self) -> &DecoderConfig {
        &self.config
    }

    /// Runs every layer over `hidden` (`[rows, hidden]`, the rows of `batch` in order) and
    /// returns the final hidden state (before any final norm) and the requested taps, in the
    /// order of `batch.taps`.
    pub fn forward(
        &self,
        hidden: Tensor,
        batch: &ForwardBatch,
        kv: &mut KvStore,
    ) -> Result<(Tensor, Vec<Tensor>), ModelError> {
        let c = &self.config;
        let num_rows = batch.num_rows();
        let positions: Vec<usize> = batch
            .segments
            .iter()
            .flat_map(|s| s.positions.iter().copied())
            .collect();
        let slots: Vec<usize> = batch
            .segments
            .iter()
            .flat_map(|s| (0..s.tokens.len()).map(|j| s.table.slot(s.context_len + j)))
            .collect();
        let plan = KeyPlan::new(batch);
        let global_tables = self.rope.tables(&positions);
        let local_tables = self.local_rope.as_ref().map(|r| r.tables(&positions));
        let scale = c.attention_scale();
        let layout = HeadLayout {
            num_heads: c.num_heads,
            num_kv_heads: c.num_kv_heads,
            head_dim: c.head_dim,
        };
        let width = c.hidden_size;
        let mut taps: Vec<Option<Tensor>> = vec![None; batch.taps.len()];
        let mut h = host_values(&hidden)?;
        // A layer's MLP output, added into `h` by the next layer's input norm in the same
        // pass over the rows (where no tap needs `h` in between).
        let mut pending: Option<Vec<f32>> = None;
        for (layer_index, layer) in self.layers.iter().enumerate() {
            let window = c.sliding_window(layer_index);
            let (cos, sin) = match (&local_tables, window) {
                (Some(local), Some(_)) => (&local.0, &local.1),
                _ => (&global_tables.0, &global_tables.1),
            };
            let x = layer
                .input_norm
                .add_and_norm(&mut h, pending.take().as_deref())?;
            let attention = &layer.attention;
            let projections = [&attention.q_proj, &attention.k_proj, &attention.v_proj];
            let [q, k, v] =
                <[Vec<f32>; 3]>::try_from(Linear::forward_many_host(&projections, &x, num_rows)?)
                    .expect("three linears, three outputs");
            let mut queries = norm_heads(q, attention.q_norm.as_ref())?;
            let mut keys = norm_heads(k, attention.k_norm.as_ref())?;
            self.rope.rotate(&mut queries, c.num_heads, cos, sin);
            self.rope.rotate(&mut keys, c.num_kv_heads, cos, sin);
            write_rows(kv, layer_index, &slots, &keys, &v);
            let (layer_keys, layer_values) = kv.layer(layer_index);
            let attended = attend(
                &plan,
                layout,
                scale,
                window,
                &queries,
                layer_keys,
                layer_values,
            );
            let mut attention_out = attention.o_proj.forward_host(&attended, num_rows)?;
            if let Some(norm) = &layer.attention_out_norm {
                norm.forward_host(&mut attention_out)?;
            }
            let x = layer
                .pre_mlp_norm
                .add_and_norm(&mut h, Some(&attention_out))?;
            let mut mlp_out = layer.mlp.forward_host(&x, num_rows)?;
            if let Some(norm) = &layer.mlp_out_norm {
                norm.forward_host(&mut mlp_out)?;
            }
            if !batch.taps.contains(&layer_index) {
                pending = Some(mlp_out);
                continue;
            }
            add_into(&mut h, &mlp_out);
            for (tap, _) in batch
                .taps
                .iter()
                .enumerate()
                .filter(|(_, &l)| l == layer_index)
            {
                taps[tap] = Some(Tensor::from_slice(&h, (num_rows, width), &self.device)?);
            }
        }
        if let Some(mlp_out) = pending {
            add_into(&mut h, &mlp_out);
        }
        let hidden = Tensor::from_vec(h, (num_rows, width), &self.device)?;
        let taps = taps
            .into_iter()
            .map(|t| t.expect("tap layers are checked against the depth"))
            .collect();
        Ok((hidden, taps))
    }

    /// Writes keys and values computed from `features` (`[rows, hidden]`) into `slots` of every
    /// layer, without queries: the DFlash drafter's context enters its attention this way
    /// (`K = RoPE(k_norm(k_proj(c)))`, `V = v_proj(c)`; no input norm, no layer update).
    pub fn write_context_kv(
        &self,
        features: &Tensor,
        positions: &[usize],
        slots: &[usize],
        kv: &mut KvStore,
    ) -> Result<(), ModelError> {
        let c = &self.config;
        let (cos, sin) = self.rope.tables(positions);
        let rows = positions.len();
        let features = host_values(features)?;
        for (layer_index, layer) in self.layers.iter().enumerate() {
            let attention = &layer.attention;
            let projections = [&attention.k_proj, &attention.v_proj];
            let [k, values] = <[Vec<f32>; 2]>::try_from(Linear::forward_many_host(
                &projections,
                &features,
                rows,
            )?)
            .expect("two linears, two outputs");
            let mut keys = norm_heads(k, attention.k_norm.as_ref())?;
            self.rope.rotate(&mut keys, c.num_kv_heads, &cos, &sin);
            write_rows(kv, layer_index, slots, &keys, &values);
        }
        Ok(())
    }
}
