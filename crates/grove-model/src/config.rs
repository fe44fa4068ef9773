//! Wire config (what a checkpoint's `config.json` says) turned into the runtime
//! [`DecoderConfig`]. Unsupported features are rejected here, once, naming the key.
//!
//! Qwen3, Qwen2/Qwen2.5 and Llama 3 are one network, a dense pre-norm decoder, with three
//! switches: per-head q/k RMSNorm (Qwen3), q/k/v biases (Qwen2), and RoPE frequency scaling
//! (Llama 3). Gemma 3 is the same network with the differences collected in [`GemmaConfig`]:
//! norms scale by `1 + w`, sandwich norms around attention and MLP, GELU (tanh), embeddings
//! scaled by `sqrt(hidden)`, and sliding-window layers with their own RoPE base.

use std::path::Path;

use serde_json::Value;

use crate::ModelError;

/// The decoder families read from `config.json`'s `model_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    Qwen3,
    Qwen2,
    Llama,
    Gemma3,
}

impl Family {
    const SUPPORTED: &'static str = "qwen3, qwen2, llama, gemma3_text";

    /// HF's `model_type` of the family.
    pub fn model_type(self) -> &'static str {
        match self {
            Self::Qwen3 => "qwen3",
            Self::Qwen2 => "qwen2",
            Self::Llama => "llama",
            Self::Gemma3 => "gemma3_text",
        }
    }

    /// HF's architecture class of the family's causal LMs (`config.json`'s `architectures`).
    pub fn architecture(self) -> &'static str {
        match self {
            Self::Qwen3 => "Qwen3ForCausalLM",
            Self::Qwen2 => "Qwen2ForCausalLM",
            Self::Llama => "LlamaForCausalLM",
            Self::Gemma3 => "Gemma3ForCausalLM",
        }
    }

    fn from_model_type(model_type: &str) -> Option<Self> {
        match model_type {
            "qwen3" => Some(Self::Qwen3),
            "qwen2" => Some(Self::Qwen2),
            "llama" => Some(Self::Llama),
            "gemma3_text" => Some(Self::Gemma3),
            _ => None,
        }
    }
}

/// What makes Gemma 3 differ from the shared decoder.
#[derive(Debug, Clone, PartialEq)]
pub struct GemmaConfig {
    /// Keys a sliding layer sees: positions `p - window + 1 ..= p`.
    pub sliding_window: usize,
    /// Per layer, whether it slides (the others attend to everything).
    pub sliding_layers: Vec<bool>,
    /// RoPE base of the sliding layers (`rope_local_base_freq`); the global layers use
    /// `rope_theta` and `rope_scaling`.
    pub local_rope_theta: f64,
    /// Attention logits are scaled by `query_pre_attn_scalar^-1/2`.
    pub query_pre_attn_scalar: f64,
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
    /// Frequency `i` divided by `factors[i]`: how llama.cpp's converter stores Llama 3.1's
    /// scaling in a GGUF file (the tensor `rope_freqs.weight`, one factor per frequency).
    FrequencyFactors(Vec<f64>),
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
    /// Gemma 3's differences; `None` for the other families.
    pub gemma: Option<GemmaConfig>,
}

impl DecoderConfig {
    pub fn kv_width(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }

    /// The attention logit scale.
    pub fn attention_scale(&self) -> f32 {
        let scalar = self
            .gemma
            .as_ref()
            .map_or(self.head_dim as f64, |g| g.query_pre_attn_scalar);
        (1.0 / scalar.sqrt()) as f32
    }

    /// The window of layer `layer`, if it is a sliding one.
    pub fn sliding_window(&self, layer: usize) -> Option<usize> {
        let gemma = self.gemma.as_ref()?;
        gemma.sliding_layers[layer].then_some(gemma.sliding_window)
    }

    /// What RMSNorm weights are offset by: HF Gemma norms scale by `1 + w`.
    pub fn norm_offset(&self) -> f32 {
        if self.family == Family::Gemma3 {
            1.0
        } else {
            0.0
        }
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
        wire.reject_unsupported(family)?;

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
            Family::Qwen3 | Family::Llama | Family::Gemma3 => (attention_bias, attention_bias),
        };
        let num_layers = wire.required_usize("num_hidden_layers")?;
        let gemma = (family == Family::Gemma3)
            .then(|| wire.gemma(num_layers, head_dim))
            .transpose()?;
        let rope_theta = wire
            .f64("rope_theta")?
            .or(wire.nested_f64("rope_parameters", "rope_theta")?)
            .unwrap_or(10_000.0);
        Ok(Self {
            family,
            vocab_size: wire.required_usize("vocab_size")?,
            hidden_size,
            intermediate_size: wire.required_usize("intermediate_size")?,
            num_layers,
            num_heads,
            num_kv_heads,
            head_dim,
            rms_norm_eps: wire.f64("rms_norm_eps")?.unwrap_or(1e-6),
            rope_theta,
            rope_scaling: wire.rope_scaling(family)?,
            max_position_embeddings: wire.usize("max_position_embeddings")?.unwrap_or(4096),
            // Gemma ties its head to the embeddings unless told otherwise.
            tie_word_embeddings: wire
                .bool("tie_word_embeddings")?
                .unwrap_or(family == Family::Gemma3),
            qkv_bias,
            o_bias,
            mlp_bias: wire.bool("mlp_bias")?.unwrap_or(false),
            qk_norm: matches!(family, Family::Qwen3 | Family::Gemma3),
            bos_token_id: wire.usize("bos_token_id")?.map(|id| id as u32),
            eos_token_ids: token_ids(config.get("eos_token_id"))
                .ok_or("`eos_token_id` must be an integer or a list of integers")?,
            gemma,
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

    /// Gemma 3's keys: the sliding-window layout, the local RoPE base, the attention scale.
    fn gemma(&self, num_layers: usize, head_dim: usize) -> Result<GemmaConfig, String> {
        let sliding_layers = match self.get("layer_types") {
            Some(Value::Array(types)) => {
                if types.len() != num_layers {
                    return Err(format!(
                        "`layer_types` has {} entries for {num_layers} layers",
                        types.len()
                    ));
                }
                types
                    .iter()
                    .map(|t| match t.as_str() {
                        Some("sliding_attention") => Ok(true),
                        Some("full_attention") => Ok(false),
                        _ => Err(format!("unsupported `layer_types` entry {t}")),
                    })
                    .collect::<Result<_, _>>()?
            }
            _ => {
                // Older configs: every `sliding_window_pattern`-th layer is global.
                let pattern = self.usize("sliding_window_pattern")?.unwrap_or(6).max(1);
                (0..num_layers).map(|i| (i + 1) % pattern != 0).collect()
            }
        };
        Ok(GemmaConfig {
            sliding_window: self.usize("sliding_window")?.unwrap_or(4096).max(1),
            sliding_layers,
            local_rope_theta: self.f64("rope_local_base_freq")?.unwrap_or(10_000.0),
            query_pre_attn_scalar: self
                .f64("query_pre_attn_scalar")?
                .unwrap_or(head_dim as f64),
        })
    }

    /// Keys whose presence means a feature this network does not implement.
    fn reject_unsupported(&self, family: Family) -> Result<(), String> {
        let unsupported = |key: &str, value: &Value, why: &str| {
            Err(format!("unsupported config key `{key}` = {value}: {why}"))
        };
        if family == Family::Gemma3 {
            for key in ["hidden_activation", "hidden_act"] {
                if let Some(act) = self.get(key) {
                    if act.as_str() != Some("gelu_pytorch_tanh") {
                        return unsupported(
                            key,
                            act,
                            "Gemma 3 is implemented with gelu_pytorch_tanh",
                        );
                    }
                }
            }
            for key in ["final_logit_softcapping", "attn_logit_softcapping"] {
                if let Some(value) = self.get(key) {
                    return unsupported(key, value, "logit soft-capping is not implemented");
                }
            }
            return self.reject_common();
        }
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
        self.reject_common()
    }

    /// Rejections shared by every family.
    fn reject_common(&self) -> Result<(), String> {
        let unsupported = |key: &str, value: &Value, why: &str| {
            Err(format!("unsupported config key `{key}` = {value}: {why}"))
        };
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

    #[test]
    fn gemma3_resolves_its_switches() {
        let mut config = base();
        config["model_type"] = json!("gemma3_text");
        config["num_hidden_layers"] = json!(6);
        config["sliding_window"] = json!(512);
        config["query_pre_attn_scalar"] = json!(256);
        config["hidden_activation"] = json!("gelu_pytorch_tanh");
        let gemma = DecoderConfig::from_json(&config).unwrap();
        assert!(gemma.qk_norm && gemma.tie_word_embeddings && gemma.norm_offset() == 1.0);
        // Every 6th layer is global by default.
        let windows: Vec<_> = (0..6).map(|l| gemma.sliding_window(l)).collect();
        assert_eq!(
            windows,
            [Some(512), Some(512), Some(512), Some(512), Some(512), None]
        );
        assert_eq!(gemma.attention_scale(), 1.0 / 16.0);
        // An explicit layer list wins.
        config["layer_types"] = json!([
            "full_attention",
            "sliding_attention",
            "full_attention",
            "sliding_attention",
            "full_attention",
            "sliding_attention"
        ]);
        let gemma = DecoderConfig::from_json(&config).unwrap();
        assert_eq!(gemma.sliding_window(0), None);
        assert_eq!(gemma.sliding_window(1), Some(512));
        // What it does not implement is named.
        for (key, value) in [
            ("hidden_activation", json!("silu")),
            ("final_logit_softcapping", json!(30.0)),
        ] {
            let mut bad = config.clone();
            bad[key] = value;
            let error = DecoderConfig::from_json(&bad).unwrap_err();
            assert!(error.contains(key), "{error}");
        }
    }
}
