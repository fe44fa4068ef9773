//! The dense pre-norm decoder shared by Qwen3, Qwen2/Qwen2.5 and Llama 3 (see `config.rs` for
//! the switches): embeddings, the layer stack (`layer_stack.rs`), a final norm and the LM head.
//! Weight names follow the HF layout (`model.layers.{i}.self_attn.q_proj`, ...).

use std::path::Path;

use candle_core::{Device, Module, Tensor};
use grove_kv::{KvDtype, KvStore};

use crate::config::DecoderConfig;
use crate::forward::{ForwardBatch, ForwardOutput, Visibility};
use crate::layer_stack::LayerStack;
use crate::layers::{Linear, Matrix, RmsNorm};
use crate::weights::Weights;
use crate::{Model, ModelError};

/// A loaded decoder: weights only; KV lives in the caller's [`KvStore`].
#[derive(Debug)]
pub struct Decoder {
    config: DecoderConfig,
    embed_tokens: Matrix, // [vocab, hidden]
    layers: LayerStack,
    norm: RmsNorm,
    lm_head: Linear,
    device: Device,
    /// How the KV stores it makes keep their rows.
    kv_dtype: KvDtype,
}

impl Decoder {
    /// Loads `config.json` and the safetensors weights of a HF checkpoint directory.
    /// Loads an HF checkpoint directory or a GGUF file.
    pub fn load(directory: &Path, device: &Device) -> Result<Self, ModelError> {
        if crate::gguf::is_gguf(directory) {
            let file = crate::gguf::GgufFile::open(directory)?;
            let config = file.config()?;
            let weights = Weights::gguf(file.without_tokenizer(), directory, device);
            // f16 KV, as llama.cpp keeps for the same files.
            let decoder = Self::from_weights(config, &weights, device)?;
            return Ok(decoder.with_kv_dtype(KvDtype::F16));
        }
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
        // Some tied checkpoints still store `lm_head.weight`; only fall back when it is absent.
        let own_head = weights.contains("lm_head.weight") || !c.tie_word_embeddings;
        let embedding = "model.embed_tokens.weight";
        let shape = [c.vocab_size, c.hidden_size];
        // An embedding that is not also the head is only ever looked up, row by row.
        let embed_tokens = if own_head {
            weights.lookup_matrix(embedding, &shape)?
        } else {
            weights.matrix(embedding, &shape)?
        };
        let lm_head = if own_head {
            Linear::load(weights, "lm_head", c.hidden_size, c.vocab_size, false)?
        } else {
            Linear::from_matrix(embed_tokens.clone(), None)
        };
        Ok(Self {
            layers: LayerStack::load(weights, "model.layers", c, device)?,
            norm: RmsNorm::load_with_offset(
                weights,
                "model.norm",
                c.hidden_size,
                c.rms_norm_eps,
                c.norm_offset(),
            )?,
            embed_tokens,
            lm_head,
            config,
            device: device.clone(),
            kv_dtype: KvDtype::F32,
        })
    }

    /// The same model making KV stores of `dtype` (loaded: f16 for a GGUF file, f32 for a
    /// safetensors checkpoint, whose references were computed in f32).
    pub fn with_kv_dtype(mut self, dtype: KvDtype) -> Self {
        self.kv_dtype = dtype;
        self
    }

    pub fn decoder_config(&self) -> &DecoderConfig {
        &self.config
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
        KvStore::with_dtype(
            self.config.num_layers,
            num_slots,
            self.config.num_kv_heads,
            self.config.head_dim,
            self.kv_dtype,
        )
    }

    fn kv_dtype(&self) -> KvDtype {
        self.kv_dtype
    }

    fn embed(&self, tokens: &[u32]) -> Result<Tensor, ModelError> {
        let rows = self.embed_tokens.rows(tokens)?;
        Ok(match self.config.gemma {
            // Gemma scales its embeddings by sqrt(hidden) (not its tied LM head).
            Some(_) => (rows * (self.config.hidden_size as f64).sqrt())?,
            None => rows,
        })
    }

    fn project_logits(&self, hidden: &Tensor) -> Result<Tensor, ModelError> {
        Ok(self.lm_head.forward(hidden)?)
    }

    fn head_rows(&self, ids: &[u32]) -> Result<Tensor, ModelError> {
        Ok(self.lm_head.weight().rows(ids)?)
    }

    fn quantized_head_rows(
        &self,
        ids: &[u32],
    ) -> Result<Option<grove_kernels::quant::QMatrix>, ModelError> {
        match self.lm_head.weight() {
            Matrix::Quantized(matrix) => matrix
                .gather_rows(ids)
                .map(Some)
                .map_err(|message| ModelError::InvalidBatch(format!("LM head rows: {message}"))),
            Matrix::Dense(_) => Ok(None),
        }
    }

    fn forward(&self, batch: &ForwardBatch, kv: &mut KvStore) -> Result<ForwardOutput, ModelError> {
        self.check_batch(batch)?;
        // A step of a small model is hundreds of short parallel sections: the other compute
        // threads poll between them instead of sleeping (`threads`).
        grove_kernels::threads::with_threads_awake(|| self.forward_awake(batch, kv))
    }
}

impl Decoder {
    fn forward_awake(
        &self,
        batch: &ForwardBatch,
        kv: &mut KvStore,
    ) -> Result<ForwardOutput, ModelError> {
        let tokens: Vec<u32> = batch
            .segments
            .iter()
            .flat_map(|s| s.tokens.iter().copied())
            .collect();
        let (hidden, taps) = self.layers.forward(self.embed(&tokens)?, batch, kv)?;
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
            Tensor::zeros(
                (0, self.config.vocab_size),
                candle_core::DType::F32,
                &self.device,
            )?
        } else {
            let count = logit_rows.len();
            let rows = Tensor::from_vec(logit_rows, count, &self.device)?;
            let selected = hidden.index_select(&rows, 0)?;
            self.project_logits(&self.norm.forward(&selected)?)?
        };
        Ok(ForwardOutput { logits, taps })
    }
}
