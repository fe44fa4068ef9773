//! Seeded random checkpoints in the HF layout: a `config.json`, a `model.safetensors`, and
//! optionally a byte-level tokenizer with a ChatML template. They serve as the embedded default
//! model until a trained pair replaces it, and as fixtures for every architecture switch in tests
//! (Qwen3 q/k norm, Qwen2 biases, Llama 3 rope scaling, tied heads, bf16 storage).

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Device, Tensor};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha12Rng;
use serde_json::{json, Value};

use grove_model::config::{DecoderConfig, Family};
use grove_model::ModelError;

/// Special tokens appended after the 256 byte tokens of [`byte_level_tokenizer_json`].
pub const SPECIAL_TOKENS: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];

/// ChatML, as Qwen models use it.
pub const CHATML_TEMPLATE: &str = "{% for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

/// What to generate.
#[derive(Debug, Clone)]
pub struct RandomCheckpoint {
    pub family: Family,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub tie_word_embeddings: bool,
    /// Store weights as bf16 instead of f32.
    pub bf16: bool,
    /// Also write a byte-level tokenizer (needs `vocab_size >= 259`).
    pub with_tokenizer: bool,
    pub max_position_embeddings: usize,
    pub seed: u64,
}

impl RandomCheckpoint {
    /// A small Qwen3 with a byte-level tokenizer: the default model's shape.
    pub fn tiny_qwen3(seed: u64) -> Self {
        Self {
            family: Family::Qwen3,
            vocab_size: 320,
            hidden_size: 128,
            intermediate_size: 384,
            num_layers: 4,
            num_heads: 4,
            num_kv_heads: 2,
            head_dim: 32,
            tie_word_embeddings: false,
            bf16: true,
            with_tokenizer: true,
            max_position_embeddings: 4096,
            seed,
        }
    }

    /// Llama 3.2 1B's shape (16 layers, hidden 2048, 32 heads of 64 over 8 KV heads, MLP 8192,
    /// vocab 128256, tied head) with random bf16 weights and no tokenizer: for measuring speed.
    pub fn llama3_2_1b_shape(seed: u64) -> Self {
        Self {
            family: Family::Llama,
            vocab_size: 128_256,
            hidden_size: 2048,
            intermediate_size: 8192,
            num_layers: 16,
            num_heads: 32,
            num_kv_heads: 8,
            head_dim: 64,
            tie_word_embeddings: true,
            bf16: true,
            with_tokenizer: false,
            max_position_embeddings: 131_072,
            seed,
        }
    }

    /// Qwen3-0.6B's shape (28 layers, hidden 1024, vocab 151936, tied head) with random bf16
    /// weights and no tokenizer: for measuring speed at a real model's size.
    pub fn qwen3_0_6b_shape(seed: u64) -> Self {
        Self {
            family: Family::Qwen3,
            vocab_size: 151_936,
            hidden_size: 1024,
            intermediate_size: 3072,
            num_layers: 28,
            num_heads: 16,
            num_kv_heads: 8,
            head_dim: 128,
            tie_word_embeddings: true,
            bf16: true,
            with_tokenizer: false,
            max_position_embeddings: 40_960,
            seed,
        }
    }

    fn model_type(&self) -> &'static str {
        match self.family {
            Family::Qwen3 => "qwen3",
            Family::Qwen2 => "qwen2",
            Family::Llama => "llama",
            Family::Gemma3 => "gemma3_text",
        }
    }

    /// The `config.json` this checkpoint is written with.
    pub fn config_json(&self) -> Value {
        let eos = if self.with_tokenizer {
            json!([256, 258])
        } else {
            json!(self.vocab_size - 1)
        };
        let mut config = json!({
            "architectures": [match self.family {
                Family::Qwen3 => "Qwen3ForCausalLM",
                Family::Qwen2 => "Qwen2ForCausalLM",
                Family::Llama => "LlamaForCausalLM",
                Family::Gemma3 => "Gemma3ForCausalLM",
            }],
            "model_type": self.model_type(),
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": 1e-6,
            "rope_theta": 10000.0,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "eos_token_id": eos,
            "torch_dtype": if self.bf16 { "bfloat16" } else { "float32" },
        });
        if self.family == Family::Llama {
            config["rope_scaling"] = json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 64});
        }
        config
    }

    /// Writes the checkpoint into `directory` (created if needed).
    pub fn write(&self, directory: &Path) -> Result<(), ModelError> {
        let io = |path: &Path| {
            let path = path.to_owned();
            move |source| ModelError::Io { path, source }
        };
        std::fs::create_dir_all(directory).map_err(io(directory))?;
        let config_value = self.config_json();
        let config =
            DecoderConfig::from_json(&config_value).map_err(|message| ModelError::Config {
                path: directory.join("config.json"),
                message,
            })?;
        let write_json = |name: &str, value: &Value| {
            let path = directory.join(name);
            std::fs::write(&path, serde_json::to_string_pretty(value).expect("json"))
                .map_err(io(&path))
        };
        write_json("config.json", &config_value)?;
        if self.with_tokenizer {
            assert!(
                self.vocab_size >= 256 + SPECIAL_TOKENS.len(),
                "byte-level tokenizer needs 259 ids"
            );
            write_json("tokenizer.json", &byte_level_tokenizer_json())?;
            write_json(
                "tokenizer_config.json",
                &json!({
                    "chat_template": CHATML_TEMPLATE, "eos_token": "<|im_end|>", "bos_token": null,
                }),
            )?;
            write_json(
                "generation_config.json",
                &json!({"eos_token_id": [258, 256]}),
            )?;
        }
        let tensors = self.random_tensors(&config)?;
        let path = directory.join("model.safetensors");
        candle_core::safetensors::save(&tensors, &path).map_err(ModelError::from)
    }

    fn random_tensors(&self, c: &DecoderConfig) -> Result<HashMap<String, Tensor>, ModelError> {
        let mut rng = ChaCha12Rng::seed_from_u64(self.seed);
        let dtype = if self.bf16 { DType::BF16 } else { DType::F32 };
        let mut tensors = HashMap::new();
        let mut add =
            |name: String, shape: &[usize], mean: f32, std: f32| -> Result<(), ModelError> {
                let count: usize = shape.iter().product();
                let data: Vec<f32> = (0..count)
                    .map(|_| mean + std * gaussian(&mut rng))
                    .collect();
                let tensor = Tensor::from_vec(data, shape, &Device::Cpu)?.to_dtype(dtype)?;
                tensors.insert(name, tensor);
                Ok(())
            };
        let (h, d, q_width, kv_width) = (
            c.hidden_size,
            c.head_dim,
            c.num_heads * c.head_dim,
            c.kv_width(),
        );
        // Unit-variance embeddings and small output projections keep a random model's
        // activations tame; norms around 1 so that a dropped norm weight changes the output.
        add(
            "model.embed_tokens.weight".into(),
            &[c.vocab_size, h],
            0.0,
            1.0,
        )?;
        if !c.tie_word_embeddings {
            add("lm_head.weight".into(), &[c.vocab_size, h], 0.0, 0.3)?;
        }
        add("model.norm.weight".into(), &[h], 1.0, 0.1)?;
        for i in 0..c.num_layers {
            let p = format!("model.layers.{i}");
            add(format!("{p}.input_layernorm.weight"), &[h], 1.0, 0.1)?;
            add(
                format!("{p}.post_attention_layernorm.weight"),
                &[h],
                1.0,
                0.1,
            )?;
            for (name, out_dim, in_dim, std) in [
                ("self_attn.q_proj", q_width, h, 0.1),
                ("self_attn.k_proj", kv_width, h, 0.1),
                ("self_attn.v_proj", kv_width, h, 0.1),
                ("self_attn.o_proj", h, q_width, 0.02),
                ("mlp.gate_proj", c.intermediate_size, h, 0.1),
                ("mlp.up_proj", c.intermediate_size, h, 0.1),
                ("mlp.down_proj", h, c.intermediate_size, 0.05),
            ] {
                add(format!("{p}.{name}.weight"), &[out_dim, in_dim], 0.0, std)?;
            }
            if c.qkv_bias {
                add(format!("{p}.self_attn.q_proj.bias"), &[q_width], 0.0, 0.1)?;
                add(format!("{p}.self_attn.k_proj.bias"), &[kv_width], 0.0, 0.1)?;
                add(format!("{p}.self_attn.v_proj.bias"), &[kv_width], 0.0, 0.1)?;
            }
            if c.qk_norm {
                add(format!("{p}.self_attn.q_norm.weight"), &[d], 1.0, 0.1)?;
                add(format!("{p}.self_attn.k_norm.weight"), &[d], 1.0, 0.1)?;
            }
        }
        Ok(tensors)
    }
}

/// A seeded random DFlash drafter for a [`RandomCheckpoint`] target, in the z-lab layout (no
/// `model.` prefix, `block_size` at the top level, `dflash_config` with mask id and taps).
#[derive(Debug, Clone)]
pub struct RandomDrafter {
    pub num_layers: usize,
    pub block_size: usize,
    pub target_layer_ids: Vec<usize>,
    pub mask_token_id: u32,
    pub seed: u64,
}

impl RandomDrafter {
    /// A one-layer drafter (block 8, taps 1 and 2, mask id 300) for
    /// [`RandomCheckpoint::tiny_qwen3`], the embedded default model's shape.
    pub fn tiny(seed: u64) -> Self {
        Self {
            num_layers: 1,
            block_size: 8,
            target_layer_ids: vec![1, 2],
            mask_token_id: 300,
            seed,
        }
    }

    /// Writes the drafter for `target` into `directory`.
    pub fn write(&self, target: &RandomCheckpoint, directory: &Path) -> Result<(), ModelError> {
        std::fs::create_dir_all(directory).map_err(|source| ModelError::Io {
            path: directory.to_owned(),
            source,
        })?;
        let mut config = target.config_json();
        config["architectures"] = json!(["DFlashDraftModel"]);
        config["num_hidden_layers"] = json!(self.num_layers);
        config["block_size"] = json!(self.block_size);
        config["num_target_layers"] = json!(target.num_layers);
        config["dflash_config"] =
            json!({"mask_token_id": self.mask_token_id, "target_layer_ids": self.target_layer_ids});
        let path = directory.join("config.json");
        std::fs::write(&path, serde_json::to_string_pretty(&config).expect("json")).map_err(
            |source| ModelError::Io {
                path: path.clone(),
                source,
            },
        )?;
        let layers = RandomCheckpoint {
            family: Family::Qwen3,
            num_layers: self.num_layers,
            seed: self.seed,
            ..target.clone()
        };
        let layer_config = DecoderConfig::from_json(&layers.config_json())
            .map_err(|message| ModelError::Config { path, message })?;
        let mut tensors: HashMap<String, Tensor> = layers
            .random_tensors(&layer_config)?
            .into_iter()
            .filter_map(|(name, tensor)| {
                name.strip_prefix("model.layers.")
                    .map(|rest| (format!("layers.{rest}"), tensor))
            })
            .collect();
        let mut rng = ChaCha12Rng::seed_from_u64(self.seed ^ 0x5eed);
        let hidden = target.hidden_size;
        let mut add =
            |name: &str, shape: &[usize], mean: f32, std: f32| -> Result<(), ModelError> {
                let data: Vec<f32> = (0..shape.iter().product())
                    .map(|_| mean + std * gaussian(&mut rng))
                    .collect();
                tensors.insert(name.into(), Tensor::from_vec(data, shape, &Device::Cpu)?);
                Ok(())
            };
        add(
            "fc.weight",
            &[hidden, self.target_layer_ids.len() * hidden],
            0.0,
            0.1,
        )?;
        add("hidden_norm.weight", &[hidden], 1.0, 0.1)?;
        add("norm.weight", &[hidden], 1.0, 0.1)?;
        candle_core::safetensors::save(&tensors, directory.join("model.safetensors"))
            .map_err(ModelError::from)
    }
}

/// A standard normal draw (Box-Muller).
fn gaussian(rng: &mut impl Rng) -> f32 {
    let u1: f64 = rng.random::<f64>().max(f64::MIN_POSITIVE);
    let u2: f64 = rng.random();
    ((-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()) as f32
}

/// GPT-2's byte-to-character map: printable bytes stand for themselves, the others are
/// shifted past 255 so that every byte has a visible character.
pub fn byte_to_char(byte: u8) -> char {
    let printable = |b: u8| (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || b >= 0xAE;
    if printable(byte) {
        return char::from(byte);
    }
    let shifted = (0..byte).filter(|&b| !printable(b)).count() as u32;
    char::from_u32(256 + shifted).expect("valid code point")
}

/// A byte-level BPE tokenizer without merges: token id `b` is byte `b`, followed by
/// [`SPECIAL_TOKENS`] at 256, 257, 258. Any text round-trips, and multi-byte characters span
/// several tokens, which is what incremental detokenization must get right.
pub fn byte_level_tokenizer_json() -> Value {
    let vocab: serde_json::Map<String, Value> = (0..=255u8)
        .map(|b| (byte_to_char(b).to_string(), json!(b)))
        .collect();
    let added: Vec<Value> = SPECIAL_TOKENS
        .iter()
        .enumerate()
        .map(|(i, content)| {
            json!({"id": 256 + i, "content": content, "single_word": false,
            "lstrip": false, "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                  "ignore_merges": false, "vocab": vocab, "merges": []}
    })
}
