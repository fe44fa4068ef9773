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

/// Writes the GGUF file `source` as `shards` files the way llama.cpp's `gguf-split` cuts a
/// model: `PREFIX-NNNNN-of-MMMMM.gguf` (numbered from 1), the tensors in file order dealt out
/// evenly, the model's metadata in the first shard only, and `split.no` (u16, from 0),
/// `split.count` (u16) and `split.tensors.count` (i32) in every one. With
/// `first_without_tensors` the first holds metadata only (`gguf-split
/// --no-tensor-in-metadata`). Returns the shards' paths, first first. Panics on failure (test
/// support); the tensors must be of types candle reads.
pub fn split_gguf(
    source: &Path,
    prefix: &Path,
    shards: usize,
    first_without_tensors: bool,
) -> Vec<std::path::PathBuf> {
    try_split_gguf(source, prefix, shards, first_without_tensors)
        .unwrap_or_else(|e| panic!("splitting {}: {e}", source.display()))
}

fn try_split_gguf(
    source: &Path,
    prefix: &Path,
    shards: usize,
    first_without_tensors: bool,
) -> candle_core::Result<Vec<std::path::PathBuf>> {
    let mut reader = std::fs::File::open(source)?;
    let content = gguf_file::Content::read(&mut reader)?;
    let mut names: Vec<&String> = content.tensor_infos.keys().collect();
    names.sort_by_key(|name| content.tensor_infos[*name].offset);
    let holding = shards - usize::from(first_without_tensors);
    assert!(holding > 0 && names.len() >= holding, "too few tensors");
    let mut groups: Vec<&[&String]> = names.chunks(names.len().div_ceil(holding)).collect();
    if first_without_tensors {
        groups.insert(0, &[]);
    }
    groups.resize(shards, &[]);
    let total = Value::I32(names.len() as i32);
    let count = Value::U16(shards as u16);
    let mut paths = Vec::new();
    for (no, group) in groups.into_iter().enumerate() {
        let tensors = group
            .iter()
            .map(|name| {
                Ok((
                    name.as_str(),
                    content.tensor(&mut reader, name, &Device::Cpu)?,
                ))
            })
            .collect::<candle_core::Result<Vec<(&str, QTensor)>>>()?;
        let number = Value::U16(no as u16);
        let mut metadata: Vec<(&str, &Value)> = if no == 0 {
            content
                .metadata
                .iter()
                .map(|(k, v)| (k.as_str(), v))
                .collect()
        } else {
            Vec::new()
        };
        metadata.extend([
            ("split.no", &number),
            ("split.count", &count),
            ("split.tensors.count", &total),
        ]);
        let tensor_refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (*k, v)).collect();
        let mut name = prefix
            .file_name()
            .expect("a prefix names a file")
            .to_owned();
        name.push(format!("-{:05}-of-{shards:05}.gguf", no + 1));
        let path = prefix.with_file_name(name);
        let mut file = std::io::BufWriter::new(std::fs::File::create(&path)?);
        gguf_file::write(&mut file, &metadata, &tensor_refs)?;
        paths.push(path);
    }
    Ok(paths)
}
