//! GGUF files of seeded random checkpoints, written the way llama.cpp's converter lays them out
//! (llama.cpp tensor names, the llama Q/K permutation, norms and biases in F32, gpt2 tokenizer
//! metadata with placeholder tokens), for tests of every GGUF path.

use std::path::Path;

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device};
use grove_model::gguf::{permute, GgufFile};

use crate::random_checkpoint::RandomCheckpoint;

/// Writes `dir`'s safetensors checkpoint (made from `spec`) as the GGUF file `out`, matrices as
/// `dtype`. Panics on failure (test support).
pub fn write_gguf(dir: &Path, spec: &RandomCheckpoint, arch: &str, dtype: GgmlDType, out: &Path) {
    let tensors =
        candle_core::safetensors::load(dir.join("model.safetensors"), &Device::Cpu).unwrap();
    let mut quantized: Vec<(String, QTensor)> = Vec::new();
    for (name, tensor) in &tensors {
        let gguf = GgufFile::gguf_name(name).unwrap_or_else(|| panic!("no GGUF name for {name}"));
        let mut tensor = tensor.to_dtype(DType::F32).unwrap();
        if arch == "llama" && (gguf.ends_with("attn_q.weight") || gguf.ends_with("attn_k.weight")) {
            let heads = if gguf.ends_with("attn_q.weight") {
                spec.num_heads
            } else {
                spec.num_kv_heads
            };
            tensor = permute(&tensor, heads).unwrap();
        }
        // Norms and biases stay F32, as llama.cpp keeps them.
        let kind = if tensor.rank() == 1 {
            GgmlDType::F32
        } else {
            dtype
        };
        quantized.push((gguf, QTensor::quantize(&tensor, kind).unwrap()));
    }
    let tokens: Vec<Value> = (0..spec.vocab_size)
        .map(|i| Value::String(format!("t{i}")))
        .collect();
    let metadata: Vec<(String, Value)> = vec![
        ("general.architecture".into(), Value::String(arch.into())),
        (
            format!("{arch}.embedding_length"),
            Value::U32(spec.hidden_size as u32),
        ),
        (
            format!("{arch}.feed_forward_length"),
            Value::U32(spec.intermediate_size as u32),
        ),
        (
            format!("{arch}.block_count"),
            Value::U32(spec.num_layers as u32),
        ),
        (
            format!("{arch}.attention.head_count"),
            Value::U32(spec.num_heads as u32),
        ),
        (
            format!("{arch}.attention.head_count_kv"),
            Value::U32(spec.num_kv_heads as u32),
        ),
        (
            format!("{arch}.attention.layer_norm_rms_epsilon"),
            Value::F32(1e-6),
        ),
        (format!("{arch}.rope.freq_base"), Value::F32(10000.0)),
        (
            format!("{arch}.context_length"),
            Value::U32(spec.max_position_embeddings as u32),
        ),
        ("tokenizer.ggml.model".into(), Value::String("gpt2".into())),
        ("tokenizer.ggml.tokens".into(), Value::Array(tokens)),
        ("tokenizer.ggml.merges".into(), Value::Array(vec![])),
    ];
    let metadata_refs: Vec<(&str, &Value)> =
        metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let tensor_refs: Vec<(&str, &QTensor)> =
        quantized.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let mut file = std::fs::File::create(out).unwrap();
    gguf_file::write(&mut file, &metadata_refs, &tensor_refs).unwrap();
}
