//! `grove generate`: one prompt, streamed text or one JSON object.

use std::io::Write;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use grove_core::{FinishReason, SamplingParams, StopCondition, TokenId};
use grove_engine::structured::{Grammar, Schema, TokenBytes};
use grove_engine::{GenerateRequest, Generator, GeneratorOptions, LogitAdjustments};
use grove_model::{ChatMessage, TextTokenizer};

use crate::loading::{self, ModelArgs, SpecArgs};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    Text,
    Json,
}

#[derive(Debug, Args)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub spec: SpecArgs,
    /// Prompt text (needs the model's tokenizer.json).
    #[arg(
        long,
        conflicts_with = "prompt_ids",
        required_unless_present = "prompt_ids"
    )]
    pub prompt: Option<String>,
    /// Prompt as comma-separated token ids, e.g. 1,2,3.
    #[arg(long, value_delimiter = ',')]
    pub prompt_ids: Option<Vec<TokenId>>,
    /// Wrap the prompt as a user turn in the model's chat template.
    #[arg(long)]
    pub chat: bool,
    /// Tokens to generate at most; default: until a stop token, capped by the model's context
    /// (llama.cpp's `-n -1`).
    #[arg(long)]
    pub max_new_tokens: Option<usize>,
    /// 0 means greedy. Default: the checkpoint's `generation_config.json`, else 0.
    #[arg(long)]
    pub temperature: Option<f32>,
    /// Default: the checkpoint's `generation_config.json`, else 1 (off).
    #[arg(long)]
    pub top_p: Option<f32>,
    /// 0 disables top-k. Default: the checkpoint's `generation_config.json`, else 0.
    #[arg(long)]
    pub top_k: Option<usize>,
    #[arg(long)]
    pub seed: Option<u64>,
    /// Stop when this text appears (repeatable); it is not included in the output.
    #[arg(long)]
    pub stop: Vec<String>,
    /// Keep generating past end-of-sequence tokens.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Each generated token's log-probability (the raw logits' log-softmax) with this many
    /// most likely alternatives (0-20), in `--format json`'s `logprobs`.
    #[arg(long, value_parser = clap::value_parser!(u8).range(0..=20))]
    pub logprobs: Option<u8>,
    /// Subtracted from the logit of every token already generated (OpenAI's, in [-2, 2]).
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub presence_penalty: f32,
    /// Subtracted from a token's logit once per time it was generated (OpenAI's, in [-2, 2]).
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub frequency_penalty: f32,
    /// Hold the text to a JSON object (`response_format: {"type": "json_object"}`).
    #[arg(long, conflicts_with = "json_schema")]
    pub json: bool,
    /// Hold the text to the JSON Schema in this file (`response_format`'s `json_schema`).
    #[arg(long, value_name = "FILE")]
    pub json_schema: Option<std::path::PathBuf>,
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    pub format: OutputFormat,
}

/// The schema `--json` or `--json-schema` asks for, over the tokenizer's tokens.
fn grammar(args: &GenerateArgs, tokenizer: Option<&TextTokenizer>) -> Result<Option<Grammar>> {
    let schema = match (&args.json_schema, args.json) {
        (Some(path), _) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading --json-schema {}", path.display()))?;
            let value = serde_json::from_str(&text)
                .with_context(|| format!("--json-schema {} is not JSON", path.display()))?;
            Schema::compile(&value).with_context(|| format!("--json-schema {}", path.display()))?
        }
        (None, true) => Schema::any_object(),
        (None, false) => return Ok(None),
    };
    let tokenizer = tokenizer.context("--json and --json-schema need the model's tokenizer")?;
    let vocab = Arc::new(TokenBytes::new(tokenizer.token_bytes()));
    Ok(Some(Grammar::new(schema, vocab)))
}

pub fn run(args: GenerateArgs) -> Result<()> {
    loading::with_threads(args.model.threads, |_| generate(&args))
}

fn generate(args: &GenerateArgs) -> Result<()> {
    let loaded = loading::load(&args.model)?;
    let drafter = args.spec.load_drafter(&loaded)?;
    let tokenizer = loaded.tokenizer.as_ref();
    let prompt: Vec<TokenId> = match (&args.prompt, &args.prompt_ids) {
        (_, Some(ids)) => {
            if args.chat {
                bail!("--chat needs a text --prompt, not --prompt-ids");
            }
            ids.clone()
        }
        (Some(text), None) => {
            let tokenizer = tokenizer.with_context(|| {
                format!(
                    "--prompt needs {}/tokenizer.json; pass --prompt-ids instead",
                    loaded.dir.display()
                )
            })?;
            if args.chat {
                let kwargs = args.model.chat_template_kwargs.clone().unwrap_or_default();
                let user = ChatMessage::text("user", text);
                let rendered = tokenizer.apply_chat_template_with(&[user], &[], &kwargs)?;
                // The template already holds any BOS; adding special tokens would double it.
                tokenizer.encode(&rendered, false)?
            } else {
                tokenizer.encode(text, true)?
            }
        }
        (None, None) => bail!("pass --prompt or --prompt-ids"),
    };
    let stop_token_ids = if args.ignore_eos {
        Vec::new()
    } else {
        loaded.stop_token_ids()?
    };
    let defaults = loaded.sampling_defaults()?;
    let context = grove_model::Model::config(&loaded.model).max_position_embeddings;
    let max_new_tokens = args
        .max_new_tokens
        .unwrap_or_else(|| context.saturating_sub(prompt.len()).max(1));
    let request = GenerateRequest {
        prompt,
        sampling: SamplingParams {
            temperature: args.temperature.or(defaults.temperature).unwrap_or(0.0),
            top_k: args.top_k.or(defaults.top_k).unwrap_or(0),
            top_p: args.top_p.or(defaults.top_p).unwrap_or(1.0),
            seed: args.seed,
        },
        stop: StopCondition {
            max_new_tokens,
            stop_token_ids,
            stop_strings: args.stop.clone(),
        },
        speculation: Default::default(),
        logprobs: args.logprobs.map(usize::from),
        prompt_logprobs: false,
        adjustments: LogitAdjustments {
            presence_penalty: args.presence_penalty,
            frequency_penalty: args.frequency_penalty,
            logit_bias: Vec::new(),
        },
        grammar: grammar(args, tokenizer)?,
    };
    let options = GeneratorOptions {
        page_size: args.model.page_size,
        vocab_shards: args.spec.tp_size,
        ..GeneratorOptions::default()
    };
    let generator = args.spec.apply(
        Generator::new(&loaded.model, tokenizer, options),
        drafter.as_ref(),
    )?;
    let stream = args.format == OutputFormat::Text && tokenizer.is_some();
    let mut stdout = std::io::stdout();
    let output = generator.generate(&request, |text| {
        if stream {
            let _ = stdout.write_all(text.as_bytes());
            let _ = stdout.flush();
        }
    })?;
    match args.format {
        OutputFormat::Json => {
            let mut json = serde_json::to_value(&output)?;
            json["kernels"] = crate::kernels();
            json["kv_cache_dtype"] = grove_model::Model::kv_dtype(&loaded.model).name().into();
            println!("{json}");
        }
        OutputFormat::Text => {
            if !stream {
                let ids: Vec<String> = output.token_ids.iter().map(|t| t.to_string()).collect();
                println!("{}", ids.join(","));
            } else {
                println!();
            }
            eprintln!("{}", stats_line(&output, args.max_new_tokens.is_some()));
        }
    }
    Ok(())
}

/// The summary `--format text` prints to stderr: why it stopped, the mean tokens a round
/// accepted (tau), the speeds and where a round's time went.
fn stats_line(output: &grove_engine::GenerateOutput, max_given: bool) -> String {
    let s = &output.stats;
    let finish = match (output.finish_reason, max_given) {
        (FinishReason::Stop, _) => "finish=stop",
        (FinishReason::Length, true) => "finish=length (cut at --max-new-tokens)",
        (FinishReason::Length, false) => "finish=length (cut: the context is full)",
    };
    format!(
        "[grove] {} prompt + {} new tokens, {finish}, {} rounds, {:.2} tokens accepted per \
         round (tau), prefill {:.1} tok/s, decode {:.1} tok/s (draft {:.1} ms, verify {:.1} ms, \
         commit {:.1} ms), {}",
        s.prompt_tokens,
        s.new_tokens,
        s.rounds,
        s.mean_accept_length,
        s.prefill_tokens_per_s,
        s.decode_tokens_per_s,
        s.t_draft_us as f64 / 1e3,
        s.t_verify_us as f64 / 1e3,
        s.t_commit_us as f64 / 1e3,
        crate::kernels_line()
    )
}
