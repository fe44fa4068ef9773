//! Writing trained networks in the formats the inference loaders read: an HF Qwen3 checkpoint
//! directory for the target, a z-lab DFlash directory for the drafter.

use std::path::Path;

use candle_core::{DType, Device, Tensor};
use grove_model::{DecoderConfig, Family};
use serde_json::{json, Value};

use crate::drafter_net::DrafterShape;
use crate::params::Params;
use crate::TrainError;

fn write_json(path: &Path, value: &Value) -> Result<(), TrainError> {
    std::fs::write(path, serde_json::to_string_pretty(value).expect("json")).map_err(|source| {
        TrainError::Io {
            path: path.to_owned(),
            source,
        }
    })
}

fn create_dir(dir: &Path) -> Result<(), TrainError> {
    std::fs::create_dir_all(dir).map_err(|source| TrainError::Io {
        path: dir.to_owned(),
        source,
    })
}

fn dtype_name(dtype: DType) -> &'static str {
    match dtype {
        DType::BF16 => "bfloat16",
        DType::F16 => "float16",
        _ => "float32",
    }
}

/// `config.json` of a checkpoint with `c`'s shape and family (Qwen3, Qwen2: q/k/v biases).
pub fn config_json(c: &DecoderConfig, eos_token_ids: &[u32], dtype: DType) -> Value {
    let (architecture, model_type) = match c.family {
        Family::Qwen2 => ("Qwen2ForCausalLM", "qwen2"),
        Family::Llama => ("LlamaForCausalLM", "llama"),
        Family::Qwen3 => ("Qwen3ForCausalLM", "qwen3"),
        Family::Gemma3 => ("Gemma3ForCausalLM", "gemma3_text"),
    };
    json!({
        "architectures": [architecture],
        "model_type": model_type,
        "vocab_size": c.vocab_size,
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_hidden_layers": c.num_layers,
        "num_attention_heads": c.num_heads,
        "num_key_value_heads": c.num_kv_heads,
        "head_dim": c.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": c.rms_norm_eps,
        "rope_theta": c.rope_theta,
        "max_position_embeddings": c.max_position_embeddings,
        "tie_word_embeddings": c.tie_word_embeddings,
        "eos_token_id": eos_token_ids,
        "torch_dtype": dtype_name(dtype),
    })
}

/// The target's text side: `tokenizer.json` contents, the chat template and the EOS token.
#[derive(Debug, Clone)]
pub struct TextFiles {
    pub tokenizer_json: String,
    pub chat_template: Option<String>,
    pub eos_token: String,
    pub eos_token_ids: Vec<u32>,
}

/// Writes a loadable HF checkpoint: config, weights in `dtype`, tokenizer files, generation config.
pub fn write_target(
    dir: &Path,
    c: &DecoderConfig,
    params: &Params,
    dtype: DType,
    text: Option<&TextFiles>,
) -> Result<(), TrainError> {
    create_dir(dir)?;
    let eos: Vec<u32> = text.map_or_else(Vec::new, |t| t.eos_token_ids.clone());
    write_json(&dir.join("config.json"), &config_json(c, &eos, dtype))?;
    params.save(&dir.join("model.safetensors"), dtype)?;
    if let Some(text) = text {
        let path = dir.join("tokenizer.json");
        std::fs::write(&path, &text.tokenizer_json)
            .map_err(|source| TrainError::Io { path, source })?;
        write_json(
            &dir.join("tokenizer_config.json"),
            &json!({"chat_template": text.chat_template, "eos_token": text.eos_token, "bos_token": null}),
        )?;
        write_json(
            &dir.join("generation_config.json"),
            &json!({"eos_token_id": eos}),
        )?;
    }
    Ok(())
}

/// Writes a z-lab DFlash drafter directory for a target of shape `target`.
pub fn write_drafter(
    dir: &Path,
    shape: &DrafterShape,
    target: &DecoderConfig,
    params: &Params,
    dtype: DType,
) -> Result<(), TrainError> {
    create_dir(dir)?;
    let mut config = config_json(&shape.layers, &[], dtype);
    config["architectures"] = json!(["DFlashDraftModel"]);
    config["block_size"] = json!(shape.block_size);
    config["num_target_layers"] = json!(target.num_layers);
    config["dflash_config"] = json!({
        "mask_token_id": shape.mask_token_id,
        "target_layer_ids": shape.target_layer_ids,
    });
    let mut extra = Vec::new();
    if let Some(d2t) = &shape.d2t {
        config["dflash_config"]["draft_vocab_size"] = json!(d2t.len());
        let ids: Vec<i64> = d2t.iter().map(|&id| id as i64).collect();
        extra.push(("d2t".to_owned(), Tensor::new(ids, &Device::Cpu)?));
    }
    write_json(&dir.join("config.json"), &config)?;
    params.save_with(&dir.join("model.safetensors"), dtype, extra)
}
