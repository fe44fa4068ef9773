//! `grove train-target`: a small Qwen3 code model trained from scratch with plain next-token
//! loss on source files, with a byte-level BPE tokenizer trained on the same files.

use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use grove_model::DecoderConfig;
use serde_json::json;

use crate::checkpoint::{write_target, TextFiles};
use crate::data::{self, TokenStream, CHATML_TEMPLATE, SPECIAL_TOKENS};
use crate::net;
use crate::params::Params;
use crate::trainer::{self, LoopOptions, Task, TrainState};
use crate::TrainError;

/// The target's shape and the run's data settings.
#[derive(Debug, Clone)]
pub struct TargetSpec {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub intermediate_size: usize,
    pub max_position_embeddings: usize,
    /// Tokens per training window.
    pub seq_len: usize,
    /// Windows per micro-batch.
    pub batch_size: usize,
    pub seed: u64,
}

impl TargetSpec {
    pub fn decoder_config(&self) -> Result<DecoderConfig, TrainError> {
        DecoderConfig::from_json(&json!({
            "model_type": "qwen3",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "rms_norm_eps": 1e-6,
            "rope_theta": 10000.0,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": true,
        }))
        .map_err(TrainError::Data)
    }
}

pub struct TargetTask {
    pub config: DecoderConfig,
    pub params: Params,
    pub stream: TokenStream,
    pub spec: TargetSpec,
}

impl TargetTask {
    fn batch(&self, part: &[u32], step: u64, micro: u64) -> Result<Tensor, TrainError> {
        let len = self.spec.seq_len + 1;
        let windows =
            TokenStream::windows(part, self.spec.batch_size, len, self.spec.seed, step, micro);
        let flat: Vec<u32> = windows.into_iter().flatten().collect();
        Ok(Tensor::from_vec(
            flat,
            (self.spec.batch_size, len),
            &Device::Cpu,
        )?)
    }
}

impl Task for TargetTask {
    fn params(&self) -> &Params {
        &self.params
    }

    fn loss(&self, step: u64, micro: u64) -> Result<Tensor, TrainError> {
        let batch = self.batch(&self.stream.train, step, micro)?;
        Ok(net::target_loss(&self.params, &batch, &self.config)?)
    }

    fn tokens_per_micro(&self) -> usize {
        self.spec.batch_size * self.spec.seq_len
    }

    /// Held-out loss over four fixed batches (no gradient recorded).
    fn evaluate(&self) -> Result<Vec<(String, f64)>, TrainError> {
        let frozen = self.params.frozen();
        let mut total = 0.0;
        for i in 0..4 {
            let batch = self.batch(&self.stream.held_out, u64::MAX - i, 0)?;
            total += net::target_loss(&frozen, &batch, &self.config)?.to_scalar::<f32>()? as f64;
        }
        Ok(vec![("held-out loss".into(), total / 4.0)])
    }
}

/// The tokenizer and token stream for `data`, cached in `work` so that a resumed run (and the
/// drafter's training) sees exactly the same ones.
pub fn prepare_corpus(
    data: &[PathBuf],
    extensions: &[&str],
    vocab_size: usize,
    work: &Path,
) -> Result<(tokenizers::Tokenizer, Vec<u32>), TrainError> {
    std::fs::create_dir_all(work).map_err(|source| TrainError::Io {
        path: work.to_owned(),
        source,
    })?;
    let tokenizer_path = work.join("tokenizer.json");
    let tokens_path = work.join("tokens.u16");
    if tokenizer_path.is_file() && tokens_path.is_file() {
        let tokenizer = tokenizers::Tokenizer::from_file(&tokenizer_path)
            .map_err(|e| TrainError::Data(format!("{}: {e}", tokenizer_path.display())))?;
        return Ok((tokenizer, data::load_tokens(&tokens_path)?));
    }
    let files = data::gather_files(data, extensions)?;
    eprintln!(
        "training a {vocab_size}-token BPE tokenizer on {} files",
        files.len()
    );
    let tokenizer = data::train_tokenizer(&files, vocab_size)?;
    let tokens = data::tokenize_files(
        &files,
        |token| tokenizer.token_to_id(token),
        |text| {
            tokenizer
                .encode(text, false)
                .map(|encoding| encoding.get_ids().to_vec())
        },
    )?;
    eprintln!("corpus: {} tokens", tokens.len());
    data::save_tokens(&tokens_path, &tokens)?;
    tokenizer
        .save(&tokenizer_path, false)
        .map_err(|e| TrainError::Data(format!("saving the tokenizer: {e}")))?;
    Ok((tokenizer, tokens))
}

/// The text files a trained target ships with.
pub fn text_files(tokenizer: &tokenizers::Tokenizer) -> Result<TextFiles, TrainError> {
    let id = |token: &str| {
        tokenizer
            .token_to_id(token)
            .ok_or_else(|| TrainError::Data(format!("the tokenizer lacks {token}")))
    };
    Ok(TextFiles {
        tokenizer_json: tokenizer
            .to_string(true)
            .map_err(|e| TrainError::Data(e.to_string()))?,
        chat_template: Some(CHATML_TEMPLATE.into()),
        eos_token: SPECIAL_TOKENS[2].into(),
        eos_token_ids: vec![id(SPECIAL_TOKENS[0])?, id(SPECIAL_TOKENS[2])?],
    })
}

/// Trains (or resumes) a target and writes it to `out` as an f16 HF checkpoint when done.
pub fn train_target(
    spec: &TargetSpec,
    data: &[PathBuf],
    extensions: &[&str],
    out: &Path,
    options: &LoopOptions,
) -> Result<TrainState, TrainError> {
    let (tokenizer, tokens) = prepare_corpus(data, extensions, spec.vocab_size, &options.dir)?;
    let config = spec.decoder_config()?;
    let stream = TokenStream::split(tokens, 0.01, spec.seq_len + 1)?;
    let params = net::target_params(&config, spec.seed)?;
    eprintln!(
        "target: {} layers, hidden {}, {:.2} M parameters; {} training tokens",
        config.num_layers,
        config.hidden_size,
        params.num_scalars() as f64 / 1e6,
        stream.train.len()
    );
    let task = TargetTask {
        config,
        params,
        stream,
        spec: spec.clone(),
    };
    let state = trainer::train(&task, options)?;
    if state.step >= options.adamw.total_steps {
        write_target(
            out,
            &task.config,
            &task.params,
            DType::F16,
            Some(&text_files(&tokenizer)?),
        )?;
        eprintln!("wrote {}", out.display());
    }
    Ok(state)
}
