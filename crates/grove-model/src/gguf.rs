//! GGUF files (llama.cpp's format): metadata -> the same `DecoderConfig` as HF checkpoints,
//! tensors under llama.cpp's names served under HF names, and the tokenizer rebuilt from
//! `tokenizer.ggml.*` metadata. The file (each shard of a split model: `gguf_shards`) is
//! memory-mapped and its header read by `gguf_header`: matrices in a format with a kernel
//! (`quant`, the IQ4 and IQ3 types too) stay quantized (copied into the kernels' column
//! layout, their mapped pages released), F16 and BF16 matrices stay half-width
//! (`tensor_as_stored`); everything else (norms, biases, other formats) is dequantized to f32.
//! The decoder, the forward contract and speculation run on GGUF targets unchanged.
//!
//! Architectures: `qwen2`, `llama` (whose Q/K rows llama.cpp's converter permutes for its
//! interleaved RoPE; they are permuted back to HF's rotate-half order here) and `gemma3`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::quantized::ggml_file::qtensor_from_ggml;
use candle_core::quantized::gguf_file::Value;
use candle_core::quantized::GgmlDType;
use candle_core::{DType, Device, Tensor};
use serde_json::json;

use crate::config::{DecoderConfig, RopeScaling};
use crate::gguf_header::{TensorInfo, TensorType};
use crate::gguf_shards::{self, Shard};
use crate::tokenizer::TextTokenizer;
use crate::ModelError;
use grove_kernels::quant::{Bytes, Layout, MatrixUse, QMatrix, QuantFormat};

/// An opened GGUF model, whole or split into shards: its metadata and tensor index (tensors
/// are read on demand).
pub struct GgufFile {
    /// The file, or the first shard.
    path: PathBuf,
    metadata: HashMap<String, Value>,
    tensors: HashMap<String, Placed>,
    /// The mapped files, first shard first (their headers' metadata and tensors moved here).
    shards: Vec<Shard>,
    architecture: String,
}

/// A tensor and the shard that holds it.
struct Placed {
    info: TensorInfo,
    shard: usize,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("shards", &self.shards.len())
            .finish()
    }
}

/// Whether `path` names a GGUF file (by extension).
pub fn is_gguf(path: &Path) -> bool {
    path.is_file()
        && path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
}

impl GgufFile {
    /// Opens a GGUF file, or, given any shard of a model `gguf-split` cut up, all its shards.
    pub fn open(path: &Path) -> Result<Self, ModelError> {
        let mut shards = gguf_shards::open(path)?;
        let first = shards[0].path.clone();
        let metadata = std::mem::take(&mut shards[0].header.metadata);
        let mut tensors = HashMap::new();
        for (i, shard) in shards.iter_mut().enumerate() {
            let placed = shard.header.tensors.drain();
            tensors.extend(placed.map(|(name, info)| (name, Placed { info, shard: i })));
        }
        let architecture = match metadata.get("general.architecture") {
            Some(Value::String(a)) => a.clone(),
            _ => {
                return Err(ModelError::Weights {
                    path: first,
                    message: "missing metadata key `general.architecture`".into(),
                })
            }
        };
        Ok(Self {
            path: first,
            metadata,
            tensors,
            shards,
            architecture,
        })
    }

    pub fn architecture(&self) -> &str {
        &self.architecture
    }

    /// The model's name as the file states it (`general.name`), if it does.
    pub fn name(&self) -> Option<&str> {
        match self.metadata.get("general.name") {
            Some(Value::String(name)) if !name.trim().is_empty() => Some(name.trim()),
            _ => None,
        }
    }

    fn config_error(&self, message: String) -> ModelError {
        ModelError::Config {
            path: self.path.clone(),
            message,
        }
    }

    fn meta(&self, key: &str) -> Option<&Value> {
        self.metadata.get(key)
    }

    fn meta_u64(&self, key: &str) -> Result<u64, ModelError> {
        self.meta(key)
            .ok_or_else(|| self.config_error(format!("missing metadata key `{key}`")))?
            .to_u64()
            .or_else(|_| self.meta(key).expect("present").to_u32().map(u64::from))
            .map_err(|e| self.config_error(format!("metadata `{key}`: {e}")))
    }

    fn meta_f32(&self, key: &str) -> Result<Option<f32>, ModelError> {
        self.meta(key)
            .map(|v| {
                v.to_f32()
                    .map_err(|e| self.config_error(format!("metadata `{key}`: {e}")))
            })
            .transpose()
    }

    /// The runtime config, through the same validation as an HF `config.json`.
    pub fn config(&self) -> Result<DecoderConfig, ModelError> {
        let arch = self.architecture.as_str();
        if !matches!(arch, "qwen2" | "qwen3" | "llama" | "gemma3") {
            return Err(self.config_error(format!(
                "`general.architecture` is `{arch}`; supported GGUF architectures: qwen2, qwen3, \
                 llama, gemma3"
            )));
        }
        let key = |k: &str| format!("{arch}.{k}");
        let hidden = self.meta_u64(&key("embedding_length"))?;
        let heads = self.meta_u64(&key("attention.head_count"))?;
        let head_dim = self
            .meta_u64(&key("attention.key_length"))
            .unwrap_or(hidden / heads.max(1));
        if let Ok(values) = self.meta_u64(&key("attention.value_length")) {
            if values != head_dim {
                return Err(self.config_error(format!(
                    "`{}` is {values} but the key length is {head_dim}: heads whose values \
                     differ in size from their keys are not supported",
                    key("attention.value_length")
                )));
            }
        }
        let vocab = self
            .tensors
            .get("token_embd.weight")
            .ok_or_else(|| self.config_error("missing tensor `token_embd.weight`".into()))?
            .info
            .dims[0];
        let mut config = json!({
            "model_type": if arch == "gemma3" { "gemma3_text" } else { arch },
            "vocab_size": vocab,
            "hidden_size": hidden,
            "intermediate_size": self.meta_u64(&key("feed_forward_length"))?,
            "num_hidden_layers": self.meta_u64(&key("block_count"))?,
            "num_attention_heads": heads,
            "num_key_value_heads": self.meta_u64(&key("attention.head_count_kv")).unwrap_or(heads),
            "head_dim": head_dim,
            "rms_norm_eps": self.meta_f32(&key("attention.layer_norm_rms_epsilon"))?.unwrap_or(1e-6),
            "rope_theta": self.meta_f32(&key("rope.freq_base"))?.unwrap_or(10000.0),
            "max_position_embeddings": self.meta_u64(&key("context_length"))?,
            "tie_word_embeddings": !self.tensors.contains_key("output.weight"),
        });
        if arch == "llama" {
            config["attention_bias"] = json!(self.tensors.contains_key("blk.0.attn_q.bias"));
        }
        if arch == "gemma3" {
            // What llama.cpp assumes for Gemma 3 files, which do not record it: every 6th
            // layer global, sliding layers with RoPE base 10000, attention scaled by
            // 1/sqrt(head_dim) (all sizes but 27B, whose scalar is hidden / heads).
            config["sliding_window"] = json!(self.meta_u64(&key("attention.sliding_window"))?);
            config["sliding_window_pattern"] = json!(6);
            config["rope_local_base_freq"] = json!(10000.0);
            let layers = self.meta_u64(&key("block_count"))?;
            config["query_pre_attn_scalar"] = if layers == 62 {
                json!(hidden / heads)
            } else {
                json!(head_dim)
            };
            if let Some(scale) = self.meta_f32(&key("rope.scaling.factor"))? {
                config["rope_scaling"] = json!({"rope_type": "linear", "factor": scale});
            }
        }
        if let Ok(eos) = self.meta_u64("tokenizer.ggml.eos_token_id") {
            config["eos_token_id"] = json!(eos);
        }
        if let Ok(bos) = self.meta_u64("tokenizer.ggml.bos_token_id") {
            config["bos_token_id"] = json!(bos);
        }
        let mut config =
            DecoderConfig::from_json(&config).map_err(|message| self.config_error(message))?;
        if let Some(factors) = self.rope_factors(config.head_dim)? {
            config.rope_scaling = RopeScaling::FrequencyFactors(factors);
        }
        Ok(config)
    }

    /// `rope_freqs.weight`: one divisor per RoPE frequency, where llama.cpp's converter put
    /// Llama 3.1's scaling (Llama 3.1 and 3.2 files carry it).
    fn rope_factors(&self, head_dim: usize) -> Result<Option<Vec<f64>>, ModelError> {
        const NAME: &str = "rope_freqs.weight";
        let Some(placed) = self.tensors.get(NAME) else {
            return Ok(None);
        };
        let info = &placed.info;
        let wanted = head_dim / 2;
        if info.dims != [wanted] {
            return Err(self.config_error(format!(
                "tensor `{NAME}` has shape {:?}; the heads' {head_dim} dimensions need [{wanted}]",
                info.dims
            )));
        }
        let factors = self.dequantized(NAME, placed, &Device::Cpu).and_then(|t| {
            t.to_vec1::<f32>()
                .map_err(|e| self.tensor_error(NAME, placed, e.to_string()))
        })?;
        if let Some(bad) = factors.iter().find(|f| !(f.is_finite() && **f > 0.0)) {
            return Err(self.config_error(format!(
                "tensor `{NAME}` holds {bad}: every factor must be positive and finite"
            )));
        }
        Ok(Some(factors.into_iter().map(f64::from).collect()))
    }

    /// Bytes of weights one decode step reads: every tensor but the token embeddings (of which
    /// a step reads one row), plus the embeddings again when they double as the LM head.
    pub fn weight_bytes_per_token(&self) -> u64 {
        let tied = !self.tensors.contains_key("output.weight");
        self.tensors
            .iter()
            .filter(|(name, _)| tied || name.as_str() != "token_embd.weight")
            .map(|(_, placed)| placed.info.bytes as u64)
            .sum()
    }

    /// The size of the file, or of all its shards together.
    pub fn file_bytes(&self) -> u64 {
        self.shards.iter().map(|shard| shard.map.len() as u64).sum()
    }

    /// The llama.cpp name of an HF tensor name.
    pub fn gguf_name(hf: &str) -> Option<String> {
        let fixed = match hf {
            "model.embed_tokens.weight" => Some("token_embd.weight"),
            "model.norm.weight" => Some("output_norm.weight"),
            "lm_head.weight" => Some("output.weight"),
            _ => None,
        };
        if let Some(name) = fixed {
            return Some(name.to_owned());
        }
        let rest = hf.strip_prefix("model.layers.")?;
        let (layer, rest) = rest.split_once('.')?;
        let (module, kind) = rest.rsplit_once('.')?;
        let short = match module {
            "input_layernorm" => "attn_norm",
            "post_attention_layernorm" => "ffn_norm",
            "self_attn.q_proj" => "attn_q",
            "self_attn.k_proj" => "attn_k",
            "self_attn.v_proj" => "attn_v",
            "self_attn.o_proj" => "attn_output",
            "self_attn.q_norm" => "attn_q_norm",
            "self_attn.k_norm" => "attn_k_norm",
            "mlp.gate_proj" => "ffn_gate",
            "mlp.up_proj" => "ffn_up",
            "mlp.down_proj" => "ffn_down",
            _ => return None,
        };
        Some(format!("blk.{layer}.{short}.{kind}"))
    }

    /// The llama.cpp name of an HF tensor name in this file's architecture: Gemma 3 files name
    /// its four per-layer norms differently (its `post_attention_layernorm` norms the attention
    /// output; `ffn_norm` is its `pre_feedforward_layernorm`).
    fn name_in_file(&self, hf: &str) -> Option<String> {
        let layer_norm = hf
            .strip_prefix("model.layers.")
            .and_then(|rest| rest.split_once('.'));
        if let (true, Some((layer, rest))) = (self.architecture == "gemma3", layer_norm) {
            let short = match rest {
                "post_attention_layernorm.weight" => Some("post_attention_norm"),
                "pre_feedforward_layernorm.weight" => Some("ffn_norm"),
                "post_feedforward_layernorm.weight" => Some("post_ffw_norm"),
                _ => None,
            };
            if let Some(short) = short {
                return Some(format!("blk.{layer}.{short}.weight"));
            }
        }
        Self::gguf_name(hf)
    }

    pub fn contains(&self, hf_name: &str) -> bool {
        self.name_in_file(hf_name)
            .is_some_and(|n| self.tensors.contains_key(&n))
    }

    /// The matrix `hf_name` kept in its block format, when that format has a kernel and its
    /// rows are whole chunks; `None` means: load it as f32 with [`GgufFile::tensor`].
    pub fn quantized(
        &self,
        hf_name: &str,
        purpose: MatrixUse,
    ) -> Result<Option<QMatrix>, ModelError> {
        let Some(name) = self.name_in_file(hf_name) else {
            return Ok(None);
        };
        let Some(placed) = self.tensors.get(&name) else {
            return Ok(None);
        };
        let info = &placed.info;
        let &[n, k] = info.dims.as_slice() else {
            return Ok(None);
        };
        let Some((format, mut bytes)) = self.kernel_blocks(placed) else {
            return Ok(None);
        };
        let Some(row_bytes) = format.row_bytes(k) else {
            return Ok(None);
        };
        // `n` rows of `row_bytes`: the header sized the tensor from its dims.
        if let Some(heads) = self.permuted_heads(&name)? {
            // Whole rows move, so the quantized bytes can be reordered like f32 rows.
            let old = bytes.as_slice();
            let half = n / heads / 2;
            let mut reordered = Vec::with_capacity(old.len());
            for new_row in 0..n {
                let (head, rest) = (new_row / (2 * half), new_row % (2 * half));
                let old_row = head * 2 * half + (rest % half) * 2 + rest / half;
                reordered.extend_from_slice(&old[old_row * row_bytes..(old_row + 1) * row_bytes]);
            }
            bytes = Bytes::Owned(Arc::new(reordered));
        }
        QMatrix::for_use(format, n, k, bytes, purpose)
            .map(Some)
            .map_err(|message| self.tensor_error(&name, placed, message))
    }

    /// Tensor `placed`'s blocks in a format the kernels multiply, if it has one: its own, or
    /// for a ternary type the Q2_K blocks of its values (a copy).
    fn kernel_blocks(&self, placed: &Placed) -> Option<(QuantFormat, Bytes)> {
        match placed.info.kind {
            TensorType::Ternary(ternary) => {
                let blocks = ternary.as_q2k(self.data(placed));
                // The file's pages need not stay resident beside the copy.
                self.mapped(placed).release_all();
                Some((QuantFormat::Q2K, Bytes::Owned(Arc::new(blocks))))
            }
            _ => Some((QuantFormat::from_ggml(placed.info.id)?, self.mapped(placed))),
        }
    }

    /// For llama's Q/K projections, the head count whose row permutation to undo.
    fn permuted_heads(&self, gguf_name: &str) -> Result<Option<usize>, ModelError> {
        if self.architecture != "llama" {
            return Ok(None);
        }
        Ok(if gguf_name.ends_with("attn_q.weight") {
            Some(self.config()?.num_heads)
        } else if gguf_name.ends_with("attn_k.weight") {
            Some(self.config()?.num_kv_heads)
        } else {
            None
        })
    }

    /// Tells the kernel this process is done with tensor `hf_name`'s bytes in the file for
    /// now (their whole pages leave the resident set; a later read faults them in again):
    /// for a tensor copied into a form of its own, so the file and its copy are not both
    /// resident.
    pub fn release(&self, hf_name: &str) {
        if let Some(placed) = (self.name_in_file(hf_name)).and_then(|n| self.tensors.get(&n)) {
            self.mapped(placed).release_all();
        }
    }

    /// The tensor `hf_name`, dequantized to f32 in HF layout.
    pub fn tensor(&self, hf_name: &str, device: &Device) -> Result<Tensor, ModelError> {
        self.tensor_in(hf_name, device, false)
    }

    /// [`GgufFile::tensor`], but an F16 or BF16 tensor in its own type (its values exactly,
    /// from half the bytes: the dense products multiply it as it is stored).
    pub fn tensor_as_stored(&self, hf_name: &str, device: &Device) -> Result<Tensor, ModelError> {
        self.tensor_in(hf_name, device, true)
    }

    fn tensor_in(
        &self,
        hf_name: &str,
        device: &Device,
        halves_stay: bool,
    ) -> Result<Tensor, ModelError> {
        let error = |message: String| ModelError::Weights {
            path: self.path.clone(),
            message,
        };
        let name = self
            .name_in_file(hf_name)
            .ok_or_else(|| error(format!("no GGUF name for `{hf_name}`")))?;
        let placed = self
            .tensors
            .get(&name)
            .ok_or_else(|| error(format!("missing tensor `{name}`")))?;
        let info = &placed.info;
        let half = match info.kind {
            TensorType::Candle(GgmlDType::F16) => Some(DType::F16),
            TensorType::Candle(GgmlDType::BF16) => Some(DType::BF16),
            _ => None,
        };
        let tensor = match half.filter(|_| halves_stay) {
            Some(dtype) => Tensor::from_raw_buffer(self.data(placed), dtype, &info.dims, device)
                .map_err(|e| self.tensor_error(&name, placed, e.to_string()))?,
            None => self.dequantized(&name, placed, device)?,
        };
        if self.architecture == "gemma3" && name.ends_with("norm.weight") {
            // llama.cpp's converter folds Gemma's `1 + w` into its norm weights; served under
            // HF names they are given back in HF's form (the decoder adds the 1).
            return (tensor - 1.0).map_err(|e| error(format!("tensor `{name}`: {e}")));
        }
        match self.permuted_heads(&name)? {
            Some(heads) => {
                unpermute(&tensor, heads).map_err(|e| error(format!("tensor `{name}`: {e}")))
            }
            None => Ok(tensor),
        }
    }

    /// Tensor `name` (`placed`) as f32, in the file's layout.
    fn dequantized(
        &self,
        name: &str,
        placed: &Placed,
        device: &Device,
    ) -> Result<Tensor, ModelError> {
        let error = |message: String| self.tensor_error(name, placed, message);
        let info = &placed.info;
        match info.kind {
            TensorType::Candle(dtype) => {
                qtensor_from_ggml(dtype, self.data(placed), info.dims.clone(), device)
                    .and_then(|q| q.dequantize(device))
                    .and_then(|t| t.to_dtype(DType::F32))
                    .map_err(|e| error(e.to_string()))
            }
            // A type only grove's kernels read: their decoder, on the mapped blocks (a ternary
            // type's as Q2_K).
            TensorType::Grove(_) | TensorType::Ternary(_) => {
                let &[n, k] = info.dims.as_slice() else {
                    let dims = &info.dims;
                    return Err(error(format!(
                        "{} of shape {dims:?}, not a matrix",
                        info.kind.name()
                    )));
                };
                let (format, bytes) = self.kernel_blocks(placed).expect("a kernel's type");
                let matrix =
                    QMatrix::with_layout(format, n, k, bytes, Layout::Gguf).map_err(error)?;
                Tensor::from_vec(matrix.dequantize(), (n, k), device)
                    .map_err(|e| error(e.to_string()))
            }
        }
    }

    /// Tensor `placed`'s data where its shard is mapped.
    fn mapped(&self, placed: &Placed) -> Bytes {
        let shard = &self.shards[placed.shard];
        Bytes::Mapped {
            map: shard.map.clone(),
            // Inside the file: `Header::read` checked it.
            start: shard.header.data_offset + placed.info.offset,
            len: placed.info.bytes,
        }
    }

    fn data(&self, placed: &Placed) -> &[u8] {
        let shard = &self.shards[placed.shard];
        let start = shard.header.data_offset + placed.info.offset;
        &shard.map[start..start + placed.info.bytes]
    }

    /// An error in tensor `name`, naming the file (the shard) that holds it.
    fn tensor_error(&self, name: &str, placed: &Placed, message: String) -> ModelError {
        ModelError::Weights {
            path: self.shards[placed.shard].path.clone(),
            message: format!("tensor `{name}`: {message}"),
        }
    }

    /// The file without its tokenizer's arrays (pieces, scores, types, merges) for loading
    /// weights: a 262k-entry vocabulary is tens of MB of parsed strings, which would otherwise
    /// stay on the heap beside the weights copied into the kernels' layout while they load,
    /// and count in the peak resident memory (Gemma 3 270M in `grove bench`: 303 MB).
    pub fn without_tokenizer(mut self) -> Self {
        self.metadata.retain(|key, value| {
            !(key.starts_with("tokenizer.") && matches!(value, Value::Array(_)))
        });
        self.metadata.shrink_to_fit();
        grove_kernels::memory::release_freed_memory();
        self
    }

    /// The tokenizer described by `tokenizer.ggml.*` (a `gpt2` byte-level BPE) and the chat
    /// template in `tokenizer.chat_template`.
    pub fn tokenizer(&self) -> Result<TextTokenizer, ModelError> {
        crate::gguf_tokenizer::build(&self.metadata, &self.path)
    }
}

/// Undoes llama.cpp's Q/K row permutation (`[heads, 2, d/2] -> [heads, d/2, 2]` on rows), back
/// to HF's rotate-half layout.
fn unpermute(weight: &Tensor, heads: usize) -> candle_core::Result<Tensor> {
    let (rows, cols) = weight.dims2()?;
    let half = rows / heads / 2;
    weight
        .reshape((heads, half, 2, cols))?
        .transpose(1, 2)?
        .reshape((rows, cols))
}

/// llama.cpp's converter permutation of HF Q/K rows (the inverse of [`unpermute`]).
pub fn permute(weight: &Tensor, heads: usize) -> candle_core::Result<Tensor> {
    let (rows, cols) = weight.dims2()?;
    let half = rows / heads / 2;
    weight
        .reshape((heads, 2, half, cols))?
        .transpose(1, 2)?
        .reshape((rows, cols))
}
