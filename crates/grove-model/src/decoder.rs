//! The dense pre-norm decoder shared by Qwen3, Qwen2/Qwen2.5 and Llama 3 (see `config.rs` for
//! the switches). Weight names follow the HF layout (`model.layers.{i}.self_attn.q_proj`, ...).
//!
//! Per layer, for all rows of a batch at once:
//! `x = norm(h); q,k,v = proj(x); [q/k norm]; RoPE; write k,v to their slots;`
//! `h += o(attend(q, visible keys)); h += mlp(post_norm(h))`.
//! Matmuls run on candle tensors; RoPE, the KV writes and attention run on host slices.

use std::path::Path;

use candle_core::{Device, Module, Tensor};
use grove_kv::KvStore;

use crate::attention::{attend, HeadLayout, KeyPlan};
use crate::config::DecoderConfig;
use crate::forward::{ForwardBatch, ForwardOutput, Visibility};
use crate::layers::{Linear, Mlp, RmsNorm};
use crate::rope::Rope;
use crate::weights::Weights;
use crate::{Model, ModelError};

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
    post_attention_norm: RmsNorm,
    mlp: Mlp,
}

/// A loaded decoder: weights only; KV lives in the caller's [`KvStore`].
#[derive(Debug)]
pub struct Decoder {
    config: DecoderConfig,
    embed_tokens: Tensor, // [vocab, hidden]
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
    lm_head: Linear,
    rope: Rope,
    device: Device,
}

impl Decoder {
    /// Loads `config.json` and the safetensors weights of a HF checkpoint directory.
    pub fn load(directory: &Path, device: &Device) -> Result<Self, ModelError> {
        let config_path = directory.join("config.json");
        if !config_path.is_file() {
            return Err(ModelError::MissingFile {
                path: config_path,
                what: "model config",
            });
        }
        let config = DecoderConfig::from_file(&config_path)?;
        let weights = Weights::open(directory, device)?;
        Self::from_weights(config, &weights, device)
    }

    pub fn from_weights(
        config: DecoderConfig,
        weights: &Weights,
        device: &Device,
    ) -> Result<Self, ModelError> {
        let c = &config;
        let (hidden, head_dim) = (c.hidden_size, c.head_dim);
        let embed_tokens = weights.get("model.embed_tokens.weight", &[c.vocab_size, hidden])?;
        let layers = (0..c.num_layers)
            .map(|i| {
                let p = format!("model.layers.{i}");
                let a = format!("{p}.self_attn");
                let qk_norm = |name: &str| {
                    c.qk_norm
                        .then(|| {
                            RmsNorm::load(weights, &format!("{a}.{name}"), head_dim, c.rms_norm_eps)
                        })
                        .transpose()
                };
                Ok(DecoderLayer {
                    input_norm: RmsNorm::load(
                        weights,
                        &format!("{p}.input_layernorm"),
                        hidden,
                        c.rms_norm_eps,
                    )?,
                    attention: Attention {
                        q_proj: Linear::load(
                            weights,
                            &format!("{a}.q_proj"),
                            hidden,
                            c.num_heads * head_dim,
                            c.qkv_bias,
                        )?,
                        k_proj: Linear::load(
                            weights,
                            &format!("{a}.k_proj"),
                            hidden,
                            c.kv_width(),
                            c.qkv_bias,
                        )?,
                        v_proj: Linear::load(
                            weights,
                            &format!("{a}.v_proj"),
                            hidden,
                            c.kv_width(),
                            c.qkv_bias,
                        )?,
                        o_proj: Linear::load(
                            weights,
                            &format!("{a}.o_proj"),
                            c.num_heads * head_dim,
                            hidden,
                            c.o_bias,
                        )?,
                        q_norm: qk_norm("q_norm")?,
                        k_norm: qk_norm("k_norm")?,
                    },
                    post_attention_norm: RmsNorm::load(
                        weights,
                        &format!("{p}.post_attention_layernorm"),
                        hidden,
                        c.rms_norm_eps,
                    )?,
                    mlp: Mlp::load(
                        weights,
                        &format!("{p}.mlp"),
                        hidden,
                        c.intermediate_size,
                        c.mlp_bias,
                    )?,
                })
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        // Some tied checkpoints still store `lm_head.weight`; only fall back when it is absent.
        let lm_head = if weights.contains("lm_head.weight") || !c.tie_word_embeddings {
            Linear::load(weights, "lm_head", hidden, c.vocab_size, false)?
        } else {
            Linear::new(embed_tokens.clone(), None)
        };
        Ok(Self {
            rope: Rope::new(&config),
            norm: RmsNorm::load(weights, "model.norm", hidden, c.rms_norm_eps)?,
            embed_tokens,
            layers,
            lm_head,
            config,
            device: device.clone(),
        })
    }

    pub fn decoder_config(&self) -> &DecoderConfig {
        &self.config
    }

    /// The token embedding table, `[vocab, hidden]` (the DFlash drafter borrows it).
    pub fn embed_tokens(&self) -> &Tensor {
        &self.embed_tokens
    }

    /// The output projection, `[vocab, hidden]` (the DFlash drafter borrows it).
    pub fn lm_head(&self) -> &Linear {
        &self.lm_head
    }

    fn check_batch(&self, batch: &ForwardBatch) -> Result<(), ModelError> {
        let invalid = |message: String| Err(ModelError::InvalidBatch(message));
        for (index, segment) in batch.segments.iter().enumerate() {
            let rows = segment.tokens.len();
            if segment.positions.len() != rows {
                return invalid(format!(
                    "segment {index}: {rows} tokens but {} positions",
                    segment.positions.len()
                ));
            }
            if segment.context_len + rows > segment.table.capacity() {
                return invalid(format!(
                    "segment {index}: {} committed + {rows} new rows exceed the {} reserved slots",
                    segment.context_len,
                    segment.table.capacity()
                ));
            }
            if let Some(&token) = segment
                .tokens
                .iter()
                .find(|&&t| t as usize >= self.config.vocab_size)
            {
                return invalid(format!(
                    "segment {index}: token {token} outside the vocabulary of {}",
                    self.config.vocab_size
                ));
            }
            if let Visibility::Tree { parents } = &segment.visibility {
                let bad = parents.len() != rows
                    || parents
                        .iter()
                        .enumerate()
                        .any(|(j, p)| p.is_some_and(|p| p >= j));
                if bad {
                    return invalid(format!(
                        "segment {index}: tree parents must be one per row with parent < row"
                    ));
                }
            }
            if let Some(&row) = segment.logits.indices(rows).iter().find(|&&r| r >= rows) {
                return invalid(format!(
                    "segment {index}: logits asked for row {row} of {rows}"
                ));
            }
        }
        if let Some(&layer) = batch.taps.iter().find(|&&l| l >= self.config.num_layers) {
            return invalid(format!(
                "tap layer {layer} out of range (model has {} layers)",
                self.config.num_layers
            ));
        }
        Ok(())
    }
}

impl Model for Decoder {
    fn config(&self) -> &DecoderConfig {
        &self.config
    }

    fn new_kv_store(&self, num_slots: usize) -> KvStore {
        KvStore::new(self.config.num_layers, num_slots, self.config.kv_width())
    }

    fn forward(&self, batch: &ForwardBatch, kv: &mut KvStore) -> Result<ForwardOutput, ModelError> {
        self.check_batch(batch)?;
        let c = &self.config;
        let num_rows = batch.num_rows();
        let tokens: Vec<u32> = batch
            .segments
            .iter()
            .flat_map(|s| s.tokens.iter().copied())
            .collect();
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
        let (cos, sin) = self.rope.tables(&positions);
        let layout = HeadLayout {
            num_heads: c.num_heads,
            num_kv_heads: c.num_kv_heads,
            head_dim: c.head_dim,
        };

        let ids = Tensor::from_vec(tokens, num_rows, &self.device)?;
        let mut hidden = self.embed_tokens.index_select(&ids, 0)?; // [rows, hidden]
        let mut taps = Vec::with_capacity(batch.taps.len());
        for (layer_index, layer) in self.layers.iter().enumerate() {
            let x = layer.input_norm.forward(&hidden)?;
            let attention = &layer.attention;
            let project = |proj: &Linear,
                           norm: &Option<RmsNorm>,
                           heads: usize|
             -> candle_core::Result<Vec<f32>> {
                let mut y = proj.forward(&x)?;
                if let Some(norm) = norm {
                    y = norm.forward(&y.reshape((num_rows, heads, c.head_dim))?)?;
                }
                y.flatten_all()?.to_vec1()
            };
            let mut queries = project(&attention.q_proj, &attention.q_norm, c.num_heads)?;
            let mut keys = project(&attention.k_proj, &attention.k_norm, c.num_kv_heads)?;
            let values = project(&attention.v_proj, &None, c.num_kv_heads)?;
            self.rope.rotate(&mut queries, c.num_heads, &cos, &sin);
            self.rope.rotate(&mut keys, c.num_kv_heads, &cos, &sin);
            let width = c.kv_width();
            for (row, &slot) in slots.iter().enumerate() {
                let range = row * width..(row + 1) * width;
                kv.write(layer_index, slot, &keys[range.clone()], &values[range]);
            }
            let (layer_keys, layer_values) = kv.layer(layer_index);
            let attended = attend(&plan, layout, &queries, layer_keys, layer_values);
            let attended =
                Tensor::from_vec(attended, (num_rows, c.num_heads * c.head_dim), &self.device)?;
            hidden = (hidden + attention.o_proj.forward(&attended)?)?;
            let mlp_out = layer
                .mlp
                .forward(&layer.post_attention_norm.forward(&hidden)?)?;
            hidden = (hidden + mlp_out)?;
            if batch.taps.contains(&layer_index) {
                taps.push((layer_index, hidden.clone()));
            }
        }
        // Taps are returned in the order asked for, which may differ from layer order.
        let taps = batch
            .taps
            .iter()
            .map(|l| {
                taps.iter()
                    .find(|(i, _)| i == l)
                    .map(|(_, t)| t.clone())
                    .expect("tap captured")
            })
            .collect();

        let mut logit_rows = Vec::new();
        let mut offset = 0;
        for segment in &batch.segments {
            logit_rows.extend(
                segment
                    .logits
                    .indices(segment.tokens.len())
                    .into_iter()
                    .map(|r| (offset + r) as u32),
            );
            offset += segment.tokens.len();
        }
        let logits = if logit_rows.is_empty() {
            Tensor::zeros((0, c.vocab_size), candle_core::DType::F32, &self.device)?
        } else {
            let count = logit_rows.len();
            let rows = Tensor::from_vec(logit_rows, count, &self.device)?;
            let selected = hidden.index_select(&rows, 0)?;
            self.lm_head.forward(&self.norm.forward(&selected)?)?
        };
        Ok(ForwardOutput { logits, taps })
    }
}
