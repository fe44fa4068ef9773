//! The HTTP routes: OpenAI completions and chat (JSON or SSE), models, health, metrics.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, HeaderMap, Method, StatusCode, Uri};
use axum::response::sse::{KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures_util::stream::StreamExt;
use grove_core::ValidationError;
use grove_engine::{GenerateRequest, SpecAlgorithm};
use serde_json::json;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use crate::error::ApiError;
use crate::metrics;
use crate::protocol::{ChatRequest, CommonFields, CompletionRequest, ModelCard};
use crate::reply::{collect_all, sse_stream, Endpoint, Reply};
use crate::validate::{
    parse_body, parse_json, DetokenizeRequest, ModelLimits, TokenizeRequest, ValidRequest,
};
use crate::worker::{EngineStatus, Submission, WorkerEvent};

/// What a gateway asks a worker about (SGLang's `/server_info` and `/model_info`).
pub(crate) struct WorkerFacts {
    pub model_path: String,
    pub drafter_path: Option<String>,
    pub model_type: &'static str,
    pub architecture: &'static str,
    pub max_running_requests: usize,
    pub page_size: usize,
    pub chunked_prefill_size: usize,
    pub prefix_cache: bool,
    /// Tokens of finished requests' texts kept for lookup drafts (0: none).
    pub ngram_capacity: usize,
}

/// What every handler shares.
pub(crate) struct Shared {
    pub worker: WorkerFacts,
    pub limits: ModelLimits,
    pub api_key: Option<String>,
    pub commands: Sender<Submission>,
    pub status: Arc<EngineStatus>,
    pub default_algorithm: SpecAlgorithm,
    /// Requests that do not choose get a budget chosen each round (`"auto"`).
    pub auto_budget: bool,
    pub created: u64,
    pub next_id: AtomicU64,
    /// Permits for requests being parsed and tokenized at once ([`VALIDATION_TASKS`]).
    pub validation: Arc<tokio::sync::Semaphore>,
}

/// Requests parsed, templated and tokenized at once (on the blocking pool).
pub(crate) const VALIDATION_TASKS: usize = 2;

pub(crate) type AppState = Arc<Shared>;

pub(crate) fn router(state: AppState) -> Router {
    Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/models", get(models))
        // vLLM's, for clients that count or inspect tokens before they send a request.
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .route("/health", get(health))
        // SGLang's worker metadata, which sglang-router reads when a worker registers (and
        // the older names it falls back to).
        .route("/server_info", get(server_info))
        .route("/get_server_info", get(server_info))
        .route("/model_info", get(model_info))
        .route("/get_model_info", get(model_info))
        .route("/metrics", get(metrics_page))
        .fallback(fallback)
        // Also answers OPTIONS: grove sends no CORS headers (browsers go through a proxy).
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(axum::middleware::from_fn(refuse_declared_oversize))
        .layer(axum::middleware::from_fn(access_log))
        .with_state(state)
}

/// The access line of every request: method, path, status and the time to the response's
/// head (a stream's tokens and total time are in the engine's line when it finishes).
/// Health checks and scrapes are logged at debug level: they come every few seconds.
async fn access_log(request: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let (method, path) = (request.method().clone(), request.uri().path().to_owned());
    let start = Instant::now();
    let response = next.run(request).await;
    let (status, seconds) = (response.status().as_u16(), start.elapsed().as_secs_f64());
    if matches!(path.as_str(), "/health" | "/metrics") {
        tracing::debug!("{method} {path} {status} {seconds:.3} s");
    } else {
        tracing::info!("{method} {path} {status} {seconds:.3} s");
    }
    response
}

/// A request whose `content-length` is over [`MAX_BODY_BYTES`] is answered 413 after its
/// body is read and dropped (up to [`MAX_DRAINED_BYTES`]). Refused unread, hyper closed the
/// connection while the client was still sending, and the client saw a broken pipe instead
/// of the 413 naming the limit (seen with a 5 MiB prompt on a fast machine).
async fn refuse_declared_oversize(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok()?.parse::<u64>().ok());
    if declared.is_none_or(|bytes| bytes <= MAX_BODY_BYTES as u64) {
        return next.run(request).await;
    }
    let mut chunks = request.into_body().into_data_stream();
    let mut drained = 0;
    while drained <= MAX_DRAINED_BYTES {
        match chunks.next().await {
            Some(Ok(chunk)) => drained += chunk.len(),
            _ => break,
        }
    }
    ApiError::BodyTooLarge {
        limit: MAX_BODY_BYTES,
    }
    .into_response()
}

/// Request bodies above this are refused with 413 (a 32k-token prompt is ~128 KiB of text).
pub(crate) const MAX_BODY_BYTES: usize = 4 << 20;
/// The most of an oversized body read (and dropped) before the 413: past it the connection
/// is closed, so a client cannot keep a worker reading forever.
const MAX_DRAINED_BYTES: usize = 64 << 20;

/// The body, or why it could not be read: too large (413), or cut short, badly chunked or
/// its connection broken (400: nothing says it was large).
fn body_bytes(body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    body.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::BodyTooLarge {
                limit: MAX_BODY_BYTES,
            }
        } else {
            ApiError::BodyUnreadable {
                reason: rejection.body_text(),
            }
        }
    })
}

async fn completions(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let valid =
        validate::<CompletionRequest>(&state, &headers, body, ModelLimits::completion).await;
    run(state, valid, Endpoint::Completions).await
}

/// The token ids a prompt (or a chat's messages) runs as: `{"count", "max_model_len",
/// "tokens"}`.
async fn tokenize(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let model = |request: &TokenizeRequest| request.model.clone();
    tokenizer_endpoint(state, headers, body, model, |limits, request| {
        let tokens = limits.tokenize(request)?;
        Ok(
            json!({"count": tokens.len(), "max_model_len": limits.max_model_len(),
                  "tokens": tokens}),
        )
    })
    .await
}

/// Token ids as text: `{"prompt"}`.
async fn detokenize(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let model = |request: &DetokenizeRequest| request.model.clone();
    tokenizer_endpoint(state, headers, body, model, |limits, request| {
        Ok(json!({"prompt": limits.detokenize(&request.tokens)?}))
    })
    .await
}

/// An endpoint that only tokenizes: the body read as `T`, the `model` it names (if any)
/// checked, and `answer` run on the validation pool.
async fn tokenizer_endpoint<T: serde::de::DeserializeOwned + Send + 'static>(
    state: AppState,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
    model: fn(&T) -> Option<String>,
    answer: fn(&ModelLimits, T) -> Result<serde_json::Value, ValidationError>,
) -> Response {
    let answer = on_validation_pool(&state, &headers, body, move |state, body| {
        let request: T = parse_body(&body)?;
        if let Some(model) = model(&request) {
            check_model(state, &model)?;
        }
        answer(&state.limits, request).map_err(ApiError::from)
    })
    .await;
    answer.map_or_else(IntoResponse::into_response, |a| Json(a).into_response())
}

async fn chat_completions(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let valid = validate::<ChatRequest>(&state, &headers, body, ModelLimits::chat).await;
    run(state, valid, Endpoint::Chat).await
}

/// The edge checks every endpoint shares (key, body, JSON, model), then the endpoint's own.
async fn validate<T: serde::de::DeserializeOwned + Send + 'static>(
    state: &AppState,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
    endpoint: fn(&ModelLimits, (T, CommonFields)) -> Result<ValidRequest, ValidationError>,
) -> Result<ValidRequest, ApiError> {
    on_validation_pool(state, headers, body, move |state, body| {
        let request = parse_json::<T>(&body)?;
        check_model(state, &request.1.model)?;
        endpoint(&state.limits, request).map_err(ApiError::from)
    })
    .await
}

/// `work` on a request's body after the key is checked and the body read, on the blocking
/// pool with the other validations.
async fn on_validation_pool<R: Send + 'static>(
    state: &AppState,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
    work: impl FnOnce(&Shared, Bytes) -> Result<R, ApiError> + Send + 'static,
) -> Result<R, ApiError> {
    authorize(state, headers)?;
    let body = body_bytes(body)?;
    // Parsing a large body, rendering a chat template and tokenizing a long prompt are
    // milliseconds to seconds of CPU: they run on the blocking pool, never on the async
    // workers that answer every other connection (`/health` included), and at most
    // `VALIDATION_TASKS` at a time, so a burst of huge prompts queues instead of taking every
    // core from the engine.
    let permit = state
        .validation
        .clone()
        .acquire_owned()
        .await
        .map_err(|_| ApiError::Internal("the validation pool is closed".into()))?;
    let state = Arc::clone(state);
    tokio::task::spawn_blocking(move || {
        let _permit = permit;
        work(&state, body)
    })
    .await
    .map_err(|error| ApiError::Internal(format!("validation task failed: {error}")))?
}

fn authorize(state: &Shared, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(key) = &state.api_key else {
        return Ok(());
    };
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    if given == Some(key.as_str()) {
        Ok(())
    } else {
        Err(ApiError::Unauthorized)
    }
}

fn check_model(state: &Shared, model: &str) -> Result<(), ApiError> {
    if model == state.limits.name {
        Ok(())
    } else {
        Err(ApiError::ModelNotFound {
            requested: model.to_owned(),
            served: state.limits.name.clone(),
        })
    }
}

/// Submits a validated request and answers it as JSON or as an SSE stream.
async fn run(
    state: AppState,
    valid: Result<ValidRequest, ApiError>,
    endpoint: Endpoint,
) -> Response {
    let valid = match valid {
        Ok(_) if state.status.is_draining() => Err(ApiError::ShuttingDown),
        other => other,
    };
    let valid = match valid {
        Ok(valid) => valid,
        Err(error) => {
            metrics::request_outcome(error.outcome());
            return error.into_response();
        }
    };
    // The choices: engine requests of their own, each prompt's in turn, a seed given moved on
    // by the choice's index within its prompt's.
    let prompts = std::iter::once(None).chain(valid.more_prompts.iter().map(Some));
    let mut choices = Vec::with_capacity(valid.choices * (1 + valid.more_prompts.len()));
    for prompt in prompts {
        for index in 0..valid.choices {
            let mut request = valid.generate.clone();
            if let Some(prompt) = prompt {
                request.prompt.clone_from(prompt);
            }
            let seed = &mut request.sampling.seed;
            *seed = seed.map(|seed| seed.wrapping_add(index as u64));
            match submit(&state, request).await {
                Ok(events) => choices.push(events),
                Err(error) => return error.into_response(),
            }
        }
    }
    let reply = Reply {
        id: format!(
            "{}-{}",
            match endpoint {
                Endpoint::Completions => "cmpl",
                Endpoint::Chat => "chatcmpl",
            },
            state.next_id.fetch_add(1, Ordering::Relaxed)
        ),
        created: unix_now(),
        model: state.limits.name.clone(),
        endpoint,
        tokenizer: state.limits.tokenizer.clone(),
        logprobs: valid.generate.logprobs.is_some(),
        token_ids: valid.return_token_ids,
        echo: valid.echo,
        per_prompt: valid.choices,
        tools: valid.tools,
        reasoning: state
            .limits
            .reasoning
            .filter(|_| endpoint == Endpoint::Chat),
    };
    if valid.stream {
        Sse::new(sse_stream(reply, choices, valid.include_usage))
            .keep_alive(KeepAlive::default())
            .into_response()
    } else {
        match collect_all(choices).await {
            Ok(outputs) => Json(reply.complete(&outputs)).into_response(),
            Err(error) => error.into_response(),
        }
    }
}

/// Hands the request to the engine thread and waits for its verdict (queue room, the checks
/// only the engine can make).
async fn submit(
    state: &Shared,
    request: GenerateRequest,
) -> Result<UnboundedReceiver<WorkerEvent>, ApiError> {
    let (sender, mut events) = unbounded_channel();
    let stopped = || ApiError::Internal("the engine thread has stopped".into());
    state
        .commands
        .send(Submission {
            request,
            events: sender,
            received: Instant::now(),
        })
        .map_err(|_| stopped())?;
    match events.recv().await {
        Some(WorkerEvent::Accepted) => Ok(events),
        Some(WorkerEvent::Rejected(error)) => Err(error),
        _ => Err(stopped()),
    }
}

async fn models(State(state): State<AppState>, headers: HeaderMap) -> Response {
    if let Err(error) = authorize(&state, &headers) {
        return error.into_response();
    }
    let card = ModelCard {
        id: state.limits.name.clone(),
        object: "model",
        created: state.created,
        owned_by: "grove",
        max_model_len: state.limits.max_model_len(),
    };
    Json(json!({"object": "list", "data": [card]})).into_response()
}

/// The server's configuration in SGLang's `/server_info` names where they exist, grove's own
/// beside them.
async fn server_info(State(state): State<AppState>, headers: HeaderMap) -> Response {
    if let Err(error) = authorize(&state, &headers) {
        return error.into_response();
    }
    let (worker, limits) = (&state.worker, &state.limits);
    Json(json!({
        "version": concat!("grove ", env!("CARGO_PKG_VERSION")),
        "model_path": worker.model_path,
        "served_model_name": limits.name,
        "tokenizer_path": limits.tokenizer.as_ref().map(|_| &worker.model_path),
        "tp_size": 1,
        "dp_size": 1,
        "context_length": limits.context,
        "max_model_len": limits.max_model_len(),
        "max_total_tokens": limits.kv_tokens,
        "max_running_requests": worker.max_running_requests,
        "page_size": worker.page_size,
        "chunked_prefill_size": worker.chunked_prefill_size,
        "disable_radix_cache": !worker.prefix_cache,
        "speculative_ngram_capacity": worker.ngram_capacity,
        "speculative_algorithm": state.default_algorithm,
        "speculative_draft_model_path": worker.drafter_path,
        // The default budget: chosen each round, or the ceiling (draft nodes per round).
        "speculative_budget": if state.auto_budget {
            json!("auto")
        } else {
            json!(limits.verify_rows - 1)
        },
        "max_verify_rows": limits.verify_rows,
    }))
    .into_response()
}

/// What model this worker runs, in SGLang's `/model_info` names.
async fn model_info(State(state): State<AppState>, headers: HeaderMap) -> Response {
    if let Err(error) = authorize(&state, &headers) {
        return error.into_response();
    }
    let worker = &state.worker;
    Json(json!({
        "model_path": worker.model_path,
        "tokenizer_path": state.limits.tokenizer.as_ref().map(|_| &worker.model_path),
        "is_generation": true,
        "model_type": worker.model_type,
        "architectures": [worker.architecture],
    }))
    .into_response()
}

async fn health(State(state): State<AppState>) -> Response {
    let status = &state.status;
    let alive = status.alive.load(Ordering::Relaxed);
    let draining = status.is_draining();
    let counts = status.counts();
    // A draining replica fails its health check first, so a gateway stops sending it work.
    let body = json!({
        "status": match (alive, draining) {
            (false, _) => "unavailable",
            (true, true) => "draining",
            (true, false) => "ok",
        },
        "model": state.limits.name,
        "speculative_algorithm": state.default_algorithm,
        "running": counts.running,
        "waiting": counts.waiting,
        "kv_free_pages": counts.free_pages,
        "kv_total_pages": counts.total_pages,
        "kv_cached_pages": counts.cached_pages,
        "preemptions": counts.preemptions,
    });
    let code = if alive && !draining {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, Json(body)).into_response()
}

async fn metrics_page() -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        metrics::render(),
    )
        .into_response()
}

async fn fallback(method: Method, uri: Uri) -> Response {
    ApiError::RouteNotFound {
        method: method.to_string(),
        path: uri.path().to_owned(),
    }
    .into_response()
}

/// A known path asked with another method: OpenAI's error shape (axum adds `Allow`).
async fn method_not_allowed(method: Method, uri: Uri) -> Response {
    ApiError::MethodNotAllowed {
        method: method.to_string(),
        path: uri.path().to_owned(),
    }
    .into_response()
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
