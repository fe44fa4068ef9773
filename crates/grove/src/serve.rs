//! `grove serve`: the OpenAI-compatible server (flags named as SGLang's launch flags).

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use grove_engine::{EngineLimits, GeneratorOptions};
use grove_model::Model;
use grove_server::{ConnectionLimits, EngineSettings, EngineStatus, ServerConfig};

use crate::loading::{self, ModelArgs, SpecArgs};

#[derive(Debug, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub spec: SpecArgs,
    /// Address to bind; the default accepts local clients only.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to bind (0: any free port; the chosen one is printed).
    #[arg(long, default_value_t = 30000)]
    pub port: u16,
    /// KV pool capacity in tokens, shared by all running requests.
    #[arg(long, default_value_t = 32768)]
    pub max_total_tokens: usize,
    /// Requests decoding at once (one batched round per step).
    #[arg(long, default_value_t = 16)]
    pub max_running_requests: usize,
    /// Requests waiting beyond this many are answered 429.
    #[arg(long, default_value_t = 256)]
    pub max_queued_requests: usize,
    /// Require `Authorization: Bearer KEY` on /v1/* (`/health` and `/metrics` stay open).
    /// Prefer the environment variable: a command line is visible to every user in `ps`.
    #[arg(long, env = "GROVE_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// The longest prompt + completion a request may ask for (default: the model's
    /// max_position_embeddings, which it may not exceed). `/v1/models` reports the lesser of
    /// this and what the KV pool can hold for one request as `max_model_len`.
    #[arg(long)]
    pub context_length: Option<usize>,
    /// The model name clients send and `/v1/models` lists (default: `grove-default` for the
    /// embedded pair, a GGUF file's `general.name`, a checkpoint directory's name).
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// Prompt tokens per prefill forward.
    #[arg(long, default_value_t = grove_engine::DEFAULT_PREFILL_CHUNK)]
    pub chunked_prefill_size: usize,
    /// While other requests are decoding, a prompt's prefill runs in chunks of about this many
    /// milliseconds (sized by the measured prefill rate, at most --chunked-prefill-size
    /// tokens), one chunk per step between their rounds, so that a long prompt does not stall
    /// running streams. 0: whole --chunked-prefill-size chunks.
    #[arg(long, default_value_t = 400)]
    pub prefill_step_ms: u64,
    /// Prefill every prompt in full: no sharing of a cached prefix between requests (the
    /// radix cache keeps the KV pages of earlier requests' tokens, evicting the least recently
    /// used when the pool needs room).
    #[arg(long)]
    pub disable_radix_cache: bool,
    /// Seconds running requests get to finish after SIGTERM or Ctrl-C (uvicorn's flag): the
    /// server stops accepting at once and `/health` turns 503; what is still running then ends
    /// with an error event and `[DONE]`, and the process exits 0.
    #[arg(long, default_value_t = 25)]
    pub timeout_graceful_shutdown: u64,
    /// Seconds a connection may go without sending a complete request head (uvicorn's flag):
    /// a new connection before its first request, a kept-alive one between requests, a client
    /// sending its headers slowly. Then it is closed. Requests being answered are not cut.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    pub timeout_keep_alive: u64,
    /// Open connections at most; past it new connections are closed at once and a warning is
    /// logged. Default: the descriptor limit (`ulimit -n`) less 64.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_connections: Option<u64>,
    /// Where a thinking model writes its reasoning (vLLM's and SGLang's flag): chat answers
    /// carry it as `reasoning_content` (streams as `delta.reasoning_content`), the rest as
    /// `content`, and `response_format` and required tool calls hold only the text after it.
    /// `qwen3`: a block the text opens with `<think>` (Qwen3's hybrid thinking, on by default
    /// and off with `chat_template_kwargs: {"enable_thinking": false}`); `deepseek-r1` (or
    /// `deepseek_r1`): the text is reasoning from its start up to `</think>` (DeepSeek-R1 and
    /// its distills, QwQ, Qwen3's thinking-only releases, whose templates open the block).
    #[arg(long, value_parser = parse_reasoning_parser)]
    pub reasoning_parser: Option<grove_server::ReasoningParser>,
    /// Tokens of finished requests' texts (prompt and output) kept for lookup drafts to draw
    /// on, the oldest dropped first (SGLang's flag): a request that writes what an earlier one
    /// wrote drafts it. Default: 1048576 (about 29 MB) when requests draft by lookup (`ngram`,
    /// or DDTree with an automatic budget and lookup in its trees), else 0 (off).
    #[arg(long)]
    pub speculative_ngram_capacity: Option<usize>,
    /// Texts lookup drafts also draw on, kept whole (SGLang's flag): a JSON Lines file whose
    /// every line is a JSON string or an object with a `text` string (a code base's files,
    /// documents answers quote). Tokenized once, at start.
    #[arg(long)]
    pub speculative_ngram_external_corpus_path: Option<std::path::PathBuf>,
    /// The most tokens the external corpus may hold; a larger file is refused at start.
    #[arg(long, default_value_t = crate::corpus::DEFAULT_MAX_TOKENS)]
    pub speculative_ngram_external_corpus_max_tokens: usize,
}

fn parse_reasoning_parser(name: &str) -> Result<grove_server::ReasoningParser, String> {
    name.parse()
}

pub fn run(args: ServeArgs) -> Result<()> {
    let threads = loading::resolve_threads(args.model.threads);
    let loaded = loading::load(&args.model)?;
    let drafter_path = args.spec.drafter_path(&loaded)?;
    let drafter = match &drafter_path {
        Some(path) => Some(args.spec.load_drafter_from(&loaded, path)?),
        None => None,
    };
    let external_corpus = match &args.speculative_ngram_external_corpus_path {
        Some(path) => {
            let corpus = crate::corpus::load(
                path,
                args.speculative_ngram_external_corpus_max_tokens,
                loaded.tokenizer.as_ref(),
                args.spec.settings().lookup,
            )?;
            eprintln!(
                "grove serve: ngram corpus {}: {} texts, {} tokens",
                path.display(),
                corpus.texts(),
                corpus.len() - corpus.texts()
            );
            Some(std::sync::Arc::new(corpus))
        }
        None => None,
    };
    let stop_token_ids = loaded.stop_token_ids()?;
    let sampling_defaults = loaded.sampling_defaults()?;
    let model_name = args
        .served_model_name
        .clone()
        .unwrap_or_else(|| default_model_name(&loaded.dir));
    let model_path = loaded.dir.display().to_string();
    let config = loaded.model.config();
    let kv_dtype = grove_model::Model::kv_dtype(&loaded.model);
    let kv_bytes_per_token = config.num_layers * 2 * config.kv_width() * kv_dtype.size();
    eprintln!(
        "grove serve: KV pool: {} tokens of {kv_dtype}, {:.1} MiB",
        args.max_total_tokens,
        (args.max_total_tokens * kv_bytes_per_token) as f64 / (1 << 20) as f64
    );
    let server = grove_server::start(
        loaded.into_served(drafter),
        ServerConfig {
            model_path: model_path.clone(),
            drafter_path: drafter_path.map(|p| p.display().to_string()),
            model_name: model_name.clone(),
            api_key: args.api_key.clone(),
            stop_token_ids,
            context_length: args.context_length,
            sampling_defaults,
            reasoning_parser: args.reasoning_parser,
            chat_template_kwargs: args.model.chat_template_kwargs.clone().unwrap_or_default(),
            engine: EngineSettings {
                options: GeneratorOptions {
                    page_size: args.model.page_size,
                    prefill_chunk: args.chunked_prefill_size,
                    vocab_shards: args.spec.tp_size,
                },
                speculation: args.spec.settings(),
                limits: EngineLimits {
                    max_total_tokens: args.max_total_tokens,
                    max_running: args.max_running_requests,
                    prefix_cache: !args.disable_radix_cache,
                    prefill_step: (args.prefill_step_ms > 0)
                        .then(|| std::time::Duration::from_millis(args.prefill_step_ms)),
                    ngram_corpus: args.speculative_ngram_capacity,
                    external_corpus,
                },
                max_queued: args.max_queued_requests,
                threads,
            },
        },
    )
    .map_err(|e| anyhow::anyhow!("starting the engine: {e}"))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the HTTP runtime")?;
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind((args.host.as_str(), args.port))
            .await
            .with_context(|| format!("binding {}:{}", args.host, args.port))?;
        eprintln!("grove serve: {}", crate::kernels_line());
        if let Some(parser) = args.reasoning_parser {
            eprintln!("grove serve: reasoning parser {}", parser.name());
        }
        // Tests and scripts read this line to find the port.
        eprintln!(
            "grove serve: model `{model_name}` listening on http://{}",
            listener.local_addr()?
        );
        let shutdown = graceful_shutdown(server.status.clone(), args.timeout_graceful_shutdown);
        let limits = ConnectionLimits {
            keep_alive: Duration::from_secs(args.timeout_keep_alive),
            max_connections: args
                .max_connections
                .map_or_else(ConnectionLimits::default_max_connections, |n| n as usize),
        };
        grove_server::serve(listener, server.router, limits, shutdown)
            .await
            .context("serving")?;
        eprintln!("grove serve: stopped");
        Ok(())
    })
}

/// The name clients send when `--served-model-name` is not given: `grove-default` for the
/// embedded default pair, a GGUF file's `general.name` (else its file name without
/// `.gguf`), a checkpoint directory's name.
fn default_model_name(path: &std::path::Path) -> String {
    if path == std::path::Path::new(loading::DEFAULT_MODEL_DIR) {
        return "grove-default".into();
    }
    if grove_model::gguf::is_gguf(path) {
        let stated = grove_model::gguf::GgufFile::open(path)
            .ok()
            .and_then(|file| file.name().map(str::to_owned));
        if let Some(name) = stated {
            return name;
        }
        if let Some(stem) = path.file_stem() {
            return stem.to_string_lossy().into_owned();
        }
    }
    path.file_name()
        .map_or_else(|| "grove".into(), |n| n.to_string_lossy().into_owned())
}

/// Resolves at the first SIGTERM or SIGINT (what Docker, Kubernetes and systemd send, and
/// Ctrl-C), which stops the listener; running requests then have `grace` seconds before the
/// engine ends them, and connections that still hang on (a client holding a half-sent header)
/// a few more before the process exits anyway.
async fn graceful_shutdown(status: Arc<EngineStatus>, grace: u64) {
    wait_for_stop_signal().await;
    status.begin_draining();
    let counts = status.counts();
    eprintln!(
        "grove serve: stopping: no new requests; {} running and {} waiting have {grace} s",
        counts.running, counts.waiting
    );
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(grace)).await;
        let counts = status.counts();
        if counts.running + counts.waiting > 0 {
            eprintln!("grove serve: grace period over: ending the requests still running");
        }
        status.abort_running();
        tokio::time::sleep(Duration::from_secs(3)).await;
        eprintln!("grove serve: connections still open after the grace period; exiting");
        std::process::exit(0);
    });
}

async fn wait_for_stop_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut terminate) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = terminate.recv() => {}
            }
        }
        Err(error) => {
            tracing::warn!(%error, "SIGTERM handler not installed; stopping on Ctrl-C only");
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
