//! Wire config (what a checkpoint's `config.json` says) turned into the runtime
//! [`DecoderConfig`]. Unsupported features are rejected here, once, naming the key.
//!
//! Qwen3, Qwen2/Qwen2.5 and Llama 3 are one network, a dense pre-norm decoder, with three
//! switches: per-head q/k RMSNorm (Qwen3), q/k/v biases (Qwen2), and RoPE frequency scaling
//! (Llama 3). So they share `decoder.rs` and differ only in how their wire config maps onto
//! these switches; a family whose network differs (Gemma 3) gets a file of its own.

use std::path::Path;

use serde_json::Value;

use crate::ModelError;

/// The decoder families read from `config.json`'s `model_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    Qwen3,
    Qwen2,
    Llama,
}

impl Family {
    const SUPPORTED: &'static str = "qwen3, qwen2, llama";

    fn from_model_type(model_type: &str) -> Option<Self> {
        match model_type {
            "qwen3" => Some(Self::Qwen3),
            "qwen2" => Some(Self::Qwen2),
            "llama" => Some(Self::Llama),
            _ => None,
        }
    }
}

/// How RoPE frequencies are scaled for long contexts.
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    None,
    /// Positions divided by `factor` (HF `linear`).
    Linear {
        factor: f64,
    },
    /// Llama 3.1's band-wise scaling (HF `llama3`).
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max_position_embeddings: f64,
    },
}

/// Everything the decoder network needs, resolved and validated.
#[derive(Debug, Clone, PartialEq)]
pub struct DecoderConfig {
    pub family: Family,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub rope_scaling: RopeScaling,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    /// q/k/v projections carry a bias.
    pub qkv_bias: bool,
    /// o projection carries a bias.
    pub o_bias: bool,
    pub mlp_bias: bool,
    /// Per-head RMSNorm on queries and keys before RoPE (Qwen3).
    pub qk_norm: bool,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
}

impl DecoderConfig {
    pub fn kv_width(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }

    pub fn from_file(path: &Path) -> Result<Self, ModelError> {
        let text = std::fs::read_to_string(path).map_err(|source| ModelError::Io {
            path: path.to_owned(),
            source,
        })?;
        let value: Value = serde_json::from_str(&text).map_err(|error| ModelError::Config {
            path: path.to_owned(),
            message: error.to_string(),
        })?;
        Self::from_json(&value).map_err(|message| ModelError::Config {
            path: path.to_owned(),
            message,
        })
    }

    /// Parses a `config.json` value; the error names the offending key.
    pub fn from_json(config: &Value) -> Result<Self, String> {
        let wire = Wire(config);
        let model_type = wire.str("model_type")?.ok_or("missing key `model_type`")?;
        let family = Family::from_model_type(model_type).ok_or_else(|| {
            format!(
                "unsupported architecture: `model_type` = {model_type:?} (supported: {})",
                Family::SUPPORTED
            )
        })?;
        wire.reject_unsupported()?;

        let hidden_size = wire.required_usize("hidden_size")?;
        let num_heads = wire.required_usize("num_attention_heads")?;
        let num_kv_heads = wire.usize("num_key_value_heads")?.unwrap_or(num_heads);
        let head_dim = wire
            .usize("head_dim")?
            .unwrap_or(hidden_size / num_heads.max(1));
        if num_heads == 0 || num_kv_heads == 0 || num_heads % num_kv_heads != 0 {
            return Err(format!(
                "`num_attention_heads` ({num_heads}) must be a positive multiple of `num_key_value_heads` ({num_kv_heads})"
            ));
        }
        if head_dim == 0 || head_dim % 2 != 0 {
            return Err(format!(
                "`head_dim` must be even and positive, got {head_dim}"
            ));
        }
        let attention_bias = wire.bool("attention_bias")?.unwrap_or(false);
        let (qkv_bias, o_bias) = match family {
            // Qwen2 hard-codes biases on q/k/v and none on o, whatever the config says.
            Family::Qwen2 => (true, false),
            Family::Qwen3 | Family::Llama => (attention_bias, attention_bias),
        };
        let rope_theta = wire
            .f64("rope_theta")?
            .or(wire.nested_f64("rope_parameters", "rope_theta")?)
            .unwrap_or(10_000.0);
        Ok(Self {
            family,
            vocab_size: wire.required_usize("vocab_size")?,
            hidden_size,
            intermediate_size: wire.required_usize("intermediate_size")?,
            num_layers: wire.required_usize("num_hidden_layers")?,
            num_heads,
            num_kv_heads,
            head_dim,
            rms_norm_eps: wire.f64("rms_norm_eps")?.unwrap_or(1e-6),
            rope_theta,
            rope_scaling: wire.rope_scaling(family)?,
            max_position_embeddings: wire.usize("max_position_embeddings")?.unwrap_or(4096),
            tie_word_embeddings: wire.bool("tie_word_embeddings")?.unwrap_or(false),
            qkv_bias,
            o_bias,
            mlp_bias: wire.bool("mlp_bias")?.unwrap_or(false),
            qk_norm: family == Family::Qwen3,
            bos_token_id: wire.usize("bos_token_id")?.map(|id| id as u32),
            eos_token_ids: token_ids(config.get("eos_token_id"))
                .ok_or("`eos_token_id` must be an integer or a list of integers")?,
        })
    }
}

/// Reads `eos_token_id`-style fields: absent, null, one integer, or a list of integers.
/// `None` when the value is none of these.
pub fn token_ids(value: Option<&Value>) -> Option<Vec<u32>> {
    match value {
        None | Some(Value::Null) => Some(Vec::new()),
        Some(Value::Number(n)) => n.as_u64().map(|id| vec![id as u32]),
        Some(Value::Array(items)) => items
            .iter()
            .map(|item| item.as_u64().map(|id| id as u32))
            .collect(),
        Some(_) => None,
    }
}

/// Typed accessors over the raw JSON whose errors name the key.
struct Wire<'a>(&'a Value);

impl Wire<'_> {
    fn get(&self, key: &str) -> Option<&Value> {
        self.0.get(key).filter(|value| !value.is_null())
    }

    fn str(&self, key: &str) -> Result<Option<&str>, String> {
        self.get(key)
            .map(|v| v.as_str().ok_or(format!("`{key}` must be a string")))
            .transpose()
    }

    fn usize(&self, key: &str) -> Result<Option<usize>, String> {
        self.get(key)
            .map(|v| {
                v.as_u64()
                    .map(|n| n as usize)
                    .ok_or(format!("`{key}` must be a non-negative integer, got {v}"))
            })
            .transpose()
    }

    fn required_usize(&self, key: &str) -> Result<usize, String> {
        match self.usize(key)? {
            Some(0) => Err(format!("`{key}` must be positive, got 0")),
            Some(n) => Ok(n),
            None => Err(format!("missing key `{key}`")),
        }
    }

    fn f64(&self, key: &str) -> Result<Option<f64>, String> {
        self.get(key)
            .map(|v| {
                v.as_f64()
                    .ok_or(format!("`{key}` must be a number, got {v}"))
            })
            .transpose()
    }

    fn nested_f64(&self, outer: &str, key: &str) -> Result<Option<f64>, String> {
        match self.get(outer) {
            Some(inner) => Wire(inner).f64(key).map_err(|e| format!("{outer}.{e}")),
            None => Ok(None),
        }
    }

    fn bool(&self, key: &str) -> Result<Option<bool>, String> {
        self.get(key)
            .map(|v| {
                v.as_bool()
                    .ok_or(format!("`{key}` must be true or false, got {v}"))
            })
            .transpose()
    }

    /// Keys whose presence means a feature this network does not implement.
    fn reject_unsupported(&self) -> Result<(), String> {
        let unsupported = |key: &str, value: &Value, why: &str| {
            Err(format!("unsupported config key `{key}` = {value}: {why}"))
        };
        if let Some(act) = self.get("hidden_act") {
            if act.as_str() != Some("silu") {
                return unsupported("hidden_act", act, "only silu is implemented");
            }
        }
        if let Some(value) = self.get("use_sliding_window") {
            if value.as_bool() == Some(true) {
                return unsupported(
                    "use_sliding_window",
                    value,
                    "sliding-window attention is not implemented for this family",
                );
            }
        }
        if let Some(Value::Array(types)) = self.get("layer_types") {
            if let Some(other) = types.iter().find(|t| t.as_str() != Some("full_attention")) {
                return unsupported(
                    "layer_types",
                    other,
                    "only full_attention layers are implemented",
                );
            }
        }
        for key in ["num_experts", "num_local_experts"] {
            if let Some(value) = self.get(key) {
                if value.as_u64().unwrap_or(1) > 0 {
                    return unsupported(
                        key,
                        value,
                        "mixture-of-experts layers are not implemented",
                    );
                }
            }
        }
        if let Some(value) = self.get("quantization_config") {
            return unsupported(
                "quantization_config",
                value,
                "pre-quantized HF checkpoints are not supported; use GGUF or float weights",
            );
        }
        Ok(())
    }

    fn rope_scaling(&self, family: Family) -> Result<RopeScaling, String> {
        let Some(scaling) = self.get("rope_scaling") else {
            return Ok(RopeScaling::None);
        };
        let field = |key: &str| {
            scaling
                .get(key)
                .and_then(Value::as_f64)
                .ok_or(format!("`rope_scaling.{key}` must be a number"))
        };
        let kind = scaling
            .get("rope_type")
            .or(scaling.get("type"))
            .and_then(Value::as_str)
            .unwrap_or("default");
        match (kind, family) {
            ("default", _) => Ok(RopeScaling::None),
            ("linear", _) => Ok(RopeScaling::Linear { factor: field("factor")? }),
            ("llama3", Family::Llama) => Ok(RopeScaling::Llama3 {
                factor: field("factor")?,
                low_freq_factor: field("low_freq_factor")?,
                high_freq_factor: field("high_freq_factor")?,
                original_max_position_embeddings: field("original_max_position_embeddings")?,
            }),
            _ => Err(format!(
                "unsupported config key `rope_scaling.rope_type` = {kind:?} for this family (supported: default, linear, llama3 for llama)"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn base() -> Value {
        json!({"model_type": "qwen3", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64,
               "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
               "head_dim": 8, "eos_token_id": [5, 6]})
    }

    #[test]
    fn qwen3_config_resolves_switches_and_eos_list() {
        let config = DecoderConfig::from_json(&base()).unwrap();
        assert!(config.qk_norm && !config.qkv_bias);
        assert_eq!(config.eos_token_ids, vec![5, 6]);
        assert_eq!(config.kv_width(), 16);
    }

    #[test]
    fn unsupported_keys_are_named() {
        let cases = [
            ("model_type", json!("mamba"), "model_type"),
            ("hidden_act", json!("gelu"), "hidden_act"),
            ("use_sliding_window", json!(true), "use_sliding_window"),
            ("num_experts", json!(8), "num_experts"),
            (
                "rope_scaling",
                json!({"rope_type": "yarn", "factor": 4.0}),
                "rope_scaling.rope_type",
            ),
            ("num_hidden_layers", json!("two"), "num_hidden_layers"),
        ];
        for (key, value, named) in cases {
            let mut config = base();
            config[key] = value;
            let error = DecoderConfig::from_json(&config).unwrap_err();
            assert!(error.contains(named), "{key}: {error}");
        }
        let mut config = base();
        config.as_object_mut().unwrap().remove("vocab_size");
        assert!(DecoderConfig::from_json(&config)
            .unwrap_err()
            .contains("vocab_size"));
    }

    #[test]
    fn qwen2_always_has_qkv_bias_and_llama3_scaling_parses() {
        let mut config = base();
        config["model_type"] = json!("qwen2");
        let qwen2 = DecoderConfig::from_json(&config).unwrap();
        assert!(qwen2.qkv_bias && !qwen2.o_bias && !qwen2.qk_norm);
        config["model_type"] = json!("llama");
        config["rope_scaling"] = json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192});
        let llama = DecoderConfig::from_json(&config).unwrap();
        assert!(matches!(llama.rope_scaling, RopeScaling::Llama3 { factor, .. } if factor == 8.0));
    }
}
