//! GGUF files of seeded random checkpoints, written the way llama.cpp's converter lays them out
//! (llama.cpp tensor names, the llama Q/K permutation, Llama 3.1's RoPE scaling as
//! `rope_freqs.weight`, norms and biases in F32, gpt2 tokenizer metadata whose first 256 tokens
//! are GPT-2's byte characters and the rest placeholders), for tests of every GGUF path; files
//! llama.cpp itself loads.

use std::path::Path;

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device};
use grove_model::config::Family;
use grove_model::gguf::{permute, GgufFile};

use crate::random_checkpoint::{byte_to_char, RandomCheckpoint};

/// Writes `dir`'s safetensors checkpoint (made from `spec`) as the GGUF file `out`, matrices as
/// `dtype`. Panics on failure (test support; [`try_write_gguf`] returns the error).
pub fn write_gguf(dir: &Path, spec: &RandomCheckpoint, arch: &str, dtype: GgmlDType, out: &Path) {
    try_write_gguf(dir, spec, arch, dtype, out)
        .unwrap_or_else(|e| panic!("writing {}: {e}", out.display()));
}

/// The GGUF architecture name of a checkpoint family.
pub fn architecture(family: Family) -> &'static str {
    match family {
        Family::Qwen3 => "qwen3",
        Family::Qwen2 => "qwen2",
        Family::Llama => "llama",
        Family::Gemma3 => "gemma3",
    }
}

/// [`write_gguf`], returning what failed (`grove tiny-model --gguf`).
pub fn try_write_gguf(
    dir: &Path,
    spec: &RandomCheckpoint,
    arch: &str,
    dtype: GgmlDType,
    out: &Path,
) -> candle_core::Result<()> {
    let tensors = candle_core::safetensors::load(dir.join("model.safetensors"), &Device::Cpu)?;
    let mut quantized: Vec<(String, QTensor)> = Vec::new();
    for (name, tensor) in &tensors {
        let gguf = GgufFile::gguf_name(name)
            .ok_or_else(|| candle_core::Error::Msg(format!("no GGUF name for {name}")))?;
        let mut tensor = tensor.to_dtype(DType::F32)?;
        if arch == "llama" && (gguf.ends_with("attn_q.weight") || gguf.ends_with("attn_k.weight")) {
            let heads = if gguf.ends_with("attn_q.weight") {
                spec.num_heads
            } else {
                spec.num_kv_heads
            };
            tensor = permute(&tensor, heads)?;
        }
        // Norms and biases stay F32, as llama.cpp keeps them.
        let kind = if tensor.rank() == 1 {
            GgmlDType::F32
        } else {
            dtype
        };
        quantized.push((gguf, QTensor::quantize(&tensor, kind)?));
    }
    if let Some(factors) = rope_factors(spec) {
        let factors = candle_core::Tensor::new(factors, &Device::Cpu)?;
        quantized.push((
            "rope_freqs.weight".into(),
            QTensor::quantize(&factors, GgmlDType::F32)?,
        ));
    }
    // Byte tokens let llama.cpp find its newline token; gpt2's default BOS and EOS (11) are
    // among them. Token 256 is two spaces, so that there is a merge to write (llama.cpp
    // refuses an empty list, whose element type a GGUF file cannot say).
    let space = byte_to_char(b' ');
    let tokens: Vec<Value> = (0..spec.vocab_size)
        .map(|i| match (u8::try_from(i), i) {
            (Ok(byte), _) => Value::String(byte_to_char(byte).to_string()),
            (_, 256) => Value::String(format!("{space}{space}")),
            _ => Value::String(format!("t{i}")),
        })
        .collect();
    let merges = if spec.vocab_size > 256 {
        vec![Value::String(format!("{space} {space}"))]
    } else {
        Vec::new()
    };
    let pre = match arch {
        "qwen2" | "qwen3" => "qwen2",
        "llama" => "llama-bpe",
        _ => "default",
    };
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
            format!("{arch}.attention.key_length"),
            Value::U32(spec.head_dim as u32),
        ),
        (
            format!("{arch}.attention.value_length"),
            Value::U32(spec.head_dim as u32),
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
        ("tokenizer.ggml.pre".into(), Value::String(pre.into())),
        ("tokenizer.ggml.tokens".into(), Value::Array(tokens)),
        ("tokenizer.ggml.merges".into(), Value::Array(merges)),
    ];
    let metadata_refs: Vec<(&str, &Value)> =
        metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let tensor_refs: Vec<(&str, &QTensor)> =
        quantized.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let mut file = std::io::BufWriter::new(std::fs::File::create(out)?);
    gguf_file::write(&mut file, &metadata_refs, &tensor_refs)
}

/// Llama 3.1's RoPE scaling (the checkpoint's `rope_scaling`, type `llama3`) as the divisor of
/// each frequency, as llama.cpp's converter computes them for `rope_freqs.weight`.
fn rope_factors(spec: &RandomCheckpoint) -> Option<Vec<f32>> {
    let config = spec.config_json();
    let scaling = config.get("rope_scaling")?;
    assert_eq!(
        scaling["rope_type"], "llama3",
        "only llama3 scaling is written"
    );
    let number = |key: &str| scaling[key].as_f64().expect("a number");
    let (factor, low, high) = (
        number("factor"),
        number("low_freq_factor"),
        number("high_freq_factor"),
    );
    let old_context = number("original_max_position_embeddings");
    let theta = config["rope_theta"].as_f64().expect("rope_theta");
    let factors = (0..spec.head_dim / 2).map(|i| {
        let freq = 1.0 / theta.powf((2 * i) as f64 / spec.head_dim as f64);
        let wavelen = 2.0 * std::f64::consts::PI / freq;
        if wavelen < old_context / high {
            1.0
        } else if wavelen > old_context / low {
            factor
        } else {
            let smooth = (old_context / wavelen - low) / (high - low);
            1.0 / ((1.0 - smooth) / factor + smooth)
        }
    });
    Some(factors.map(|f| f as f32).collect())
}
