//! `grove serve`: an OpenAI-compatible HTTP server over the continuous-batching engine.
//!
//! Two halves joined by channels: the engine thread ([`worker`]) owns the model, the KV pools
//! and the scheduler and runs one batched speculative round per step; the HTTP side (axum on
//! tokio) validates requests at the edge into typed requests, hands them over, and turns the
//! events it gets back into JSON or SSE. Errors have one type and one mapping to HTTP
//! ([`ApiError`]).
// `unsafe` lives in grove-kernels only.
#![forbid(unsafe_code)]

mod error;
mod listener;
mod logprobs;
pub mod metrics;
mod protocol;
mod reasoning;
mod reply;
mod response_format;
mod routes;
mod tools;
mod validate;
mod worker;

use std::sync::atomic::AtomicU64;
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;

use grove_core::TokenId;
use grove_engine::structured::TokenBytes;

pub use error::ApiError;
pub use listener::{serve, ConnectionLimits};
pub use reasoning::ReasoningParser;
pub use validate::{MAX_STOP_BYTES, MAX_STOP_SEQUENCES};
pub use worker::{EngineCounts, EngineSettings, EngineStatus, ServedModel};

/// Server settings beyond the engine's.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Where the model was loaded from (a directory or a GGUF file), and the drafter: what
    /// `/server_info` and `/model_info` report to a gateway.
    pub model_path: String,
    pub drafter_path: Option<String>,
    /// The name clients pass as `model` and `GET /v1/models` lists.
    pub model_name: String,
    /// When set, `/v1/*` requires `Authorization: Bearer <key>`.
    pub api_key: Option<String>,
    /// Tokens that end generation unless a request sets `ignore_eos`.
    pub stop_token_ids: Vec<TokenId>,
    /// The longest prompt + completion accepted (`--context-length`; default and at most the
    /// model's `max_position_embeddings`).
    pub context_length: Option<usize>,
    /// Sampling for fields a request leaves out (the checkpoint's `generation_config.json`).
    pub sampling_defaults: grove_core::SamplingDefaults,
    /// Where a thinking model's reasoning is in its text: chat answers carry it as
    /// `reasoning_content` (`--reasoning-parser`; none: all of the text is `content`).
    pub reasoning_parser: Option<ReasoningParser>,
    /// Chat template variables for every chat request (`--chat-template-kwargs`); a request's
    /// own `chat_template_kwargs` override them name by name.
    pub chat_template_kwargs: serde_json::Map<String, serde_json::Value>,
    pub engine: EngineSettings,
}

/// A started engine with the routes that feed it. Dropping the router (and so every sender
/// into the engine) lets the engine thread finish its requests and exit.
pub struct Server {
    pub router: axum::Router,
    pub status: Arc<EngineStatus>,
    pub engine_thread: JoinHandle<Result<(), String>>,
}

/// Starts the engine thread over `served` and builds the routes; fails if the engine cannot
/// be built (bad speculation settings, a pool too small to allocate).
pub fn start(served: ServedModel, config: ServerConfig) -> Result<Server, String> {
    let model_config = served.model.config().clone();
    let trained = model_config.max_position_embeddings;
    let context = match config.context_length {
        None => trained,
        Some(length) if (1..=trained).contains(&length) => length,
        Some(length) => {
            return Err(format!(
                "--context-length must be between 1 and the model's max_position_embeddings \
                 ({trained}), got {length}"
            ))
        }
    };
    let tokenizer = served.tokenizer.clone();
    let (commands, receiver) = mpsc::channel();
    let (ready_sender, ready) = mpsc::channel();
    let status = Arc::new(EngineStatus::default());
    let engine_status = status.clone();
    let settings = config.engine.clone();
    let engine_thread = std::thread::Builder::new()
        .name("grove-engine".into())
        .spawn(move || {
            // The step loop runs *inside* its compute pool so that every parallel section
            // starts from a pool thread (see `with_threads` in the CLI).
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(settings.threads.max(1))
                .thread_name(|i| format!("grove-compute-{i}"))
                .build()
                .map_err(|e| e.to_string())?;
            pool.install(|| worker::run(served, settings, receiver, engine_status, ready_sender))
        })
        .map_err(|e| e.to_string())?;
    let engine = match ready.recv() {
        Ok(ready) => ready,
        Err(_) => {
            return Err(match engine_thread.join() {
                Ok(Err(error)) => error,
                _ => "the engine thread stopped while starting".into(),
            })
        }
    };
    let worker = routes::WorkerFacts {
        model_path: config.model_path,
        drafter_path: config.drafter_path,
        model_type: model_config.family.model_type(),
        architecture: model_config.family.architecture(),
        max_running_requests: config.engine.limits.max_running,
        page_size: config.engine.options.page_size,
        chunked_prefill_size: config.engine.options.prefill_chunk,
        prefix_cache: config.engine.limits.prefix_cache,
        ngram_capacity: engine.corpus_capacity,
    };
    let state = Arc::new(routes::Shared {
        worker,
        limits: validate::ModelLimits {
            name: config.model_name,
            context,
            vocab_size: model_config.vocab_size,
            kv_tokens: engine.kv_tokens,
            verify_rows: engine.verify_rows,
            stop_token_ids: config.stop_token_ids,
            token_bytes: tokenizer
                .as_deref()
                .map(|t| Arc::new(TokenBytes::new(t.token_bytes()))),
            tokenizer,
            sampling_defaults: config.sampling_defaults,
            reasoning: config.reasoning_parser,
            template_kwargs: config.chat_template_kwargs,
        },
        api_key: config.api_key,
        commands,
        status: status.clone(),
        default_algorithm: engine.default_algorithm,
        auto_budget: engine.auto_budget,
        created: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        next_id: AtomicU64::new(0),
        validation: Arc::new(tokio::sync::Semaphore::new(routes::VALIDATION_TASKS)),
    });
    // Install the recorder before the first request records anything.
    metrics::handle();
    Ok(Server {
        router: routes::router(state),
        status,
        engine_thread,
    })
}
