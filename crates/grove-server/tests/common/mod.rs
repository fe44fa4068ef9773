//! Starting real servers on 127.0.0.1 for the tests: the engine thread and axum on a free port,
//! over the golden pair (token-id prompts, a trained drafter) or the embedded default model
//! (a tokenizer and a chat template) with a seeded random drafter.
#![allow(dead_code)] // each test binary uses a different subset

use std::borrow::Borrow;
use std::path::PathBuf;
use std::sync::Arc;

use candle_core::Device;
use grove_engine::{
    Budget, Drafter, EngineLimits, GeneratorOptions, SpecAlgorithm, SpeculationSettings,
};
use grove_model::{DFlashDrafter, Decoder, Model, TextTokenizer};
use grove_server::{ConnectionLimits, EngineSettings, EngineStatus, ServedModel, ServerConfig};
use grove_testkit::random_checkpoint::{RandomCheckpoint, RandomDrafter};
use serde_json::{json, Value};

pub fn repo_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The golden reference set: `$GROVE_GOLDEN_DIR`, else `../shared/golden` beside the repo.
pub fn golden_dir() -> PathBuf {
    std::env::var_os("GROVE_GOLDEN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_dir().join("../shared/golden"))
}

/// The golden target with its DFlash drafter (no tokenizer: prompts are token ids).
pub fn golden_served() -> ServedModel {
    let target = Decoder::load(&golden_dir().join("target"), &Device::Cpu).unwrap();
    let drafter = DFlashDrafter::load(
        &golden_dir().join("drafter"),
        &target,
        |_| None,
        &Device::Cpu,
    )
    .unwrap();
    ServedModel {
        model: Box::new(target) as Box<dyn Model>,
        drafter: Some(Box::new(drafter) as Box<dyn Drafter>),
        tokenizer: None,
    }
}

/// The embedded default model (byte-level tokenizer, ChatML) with a seeded random drafter.
pub fn default_served() -> ServedModel {
    let dir = repo_dir().join("assets/tiny-qwen3");
    let target = Decoder::load(&dir, &Device::Cpu).unwrap();
    let drafter_dir = tempfile::tempdir().unwrap();
    RandomDrafter::tiny(3)
        .write(&RandomCheckpoint::tiny_qwen3(0), drafter_dir.path())
        .unwrap();
    let drafter = DFlashDrafter::load(drafter_dir.path(), &target, |_| None, &Device::Cpu).unwrap();
    ServedModel {
        model: Box::new(target) as Box<dyn Model>,
        drafter: Some(Box::new(drafter) as Box<dyn Drafter>),
        tokenizer: Some(Arc::new(TextTokenizer::load(&dir).unwrap())),
    }
}

/// Server settings: DDTree with `budget` (a request may lower it or pick another method).
pub fn config(
    model_name: &str,
    budget: usize,
    max_total_tokens: usize,
    max_running: usize,
    max_queued: usize,
) -> ServerConfig {
    ServerConfig {
        model_path: format!("{model_name} (test)"),
        drafter_path: None,
        model_name: model_name.into(),
        api_key: None,
        stop_token_ids: vec![],
        context_length: None,
        sampling_defaults: Default::default(),
        reasoning_parser: None,
        chat_template_kwargs: Default::default(),
        engine: EngineSettings {
            options: GeneratorOptions::default(),
            speculation: SpeculationSettings {
                algorithm: SpecAlgorithm::DDTree,
                budget: Some(Budget::Fixed(budget)),
                ..Default::default()
            },
            limits: EngineLimits {
                max_total_tokens,
                max_running,
                prefix_cache: true,
                prefill_step: None,
                ngram_corpus: None,
                external_corpus: None,
            },
            max_queued,
            threads: 1,
        },
    }
}

/// A server listening on 127.0.0.1 at a free port, on its own runtime thread.
pub struct TestServer {
    pub base: String,
    pub status: Arc<EngineStatus>,
    pub client: reqwest::Client,
}

impl TestServer {
    pub fn start(served: ServedModel, config: ServerConfig) -> Self {
        let limits = ConnectionLimits {
            keep_alive: std::time::Duration::from_secs(10),
            max_connections: ConnectionLimits::default_max_connections(),
        };
        Self::start_with(served, config, limits)
    }

    /// A server whose listener has `limits`.
    pub fn start_with(served: ServedModel, config: ServerConfig, limits: ConnectionLimits) -> Self {
        let server = grove_server::start(served, config).unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let router = server.router;
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                grove_server::serve(listener, router, limits, std::future::pending())
                    .await
                    .unwrap();
            });
        });
        Self {
            base,
            status: server.status,
            // No pooled connections: tests share a server but each runs its own runtime, and a
            // pooled connection dies with the runtime that opened it.
            client: reqwest::Client::builder()
                .pool_max_idle_per_host(0)
                .build()
                .unwrap(),
        }
    }

    /// The response to posting `body` as JSON to `path`, unread (a stream's, for one).
    pub async fn send(&self, path: &str, body: impl Borrow<Value>) -> reqwest::Response {
        self.client
            .post(format!("{}{path}", self.base))
            .json(body.borrow())
            .send()
            .await
            .unwrap()
    }

    /// Posts `body` and gives up after 50 ms, as an impatient client does: the request's
    /// sequences must be cancelled.
    pub async fn give_up_on(&self, path: &str, body: impl Borrow<Value>) {
        let error = self
            .client
            .post(format!("{}{path}", self.base))
            .json(body.borrow())
            .timeout(std::time::Duration::from_millis(50))
            .send()
            .await
            .unwrap_err();
        assert!(error.is_timeout(), "{error}");
    }

    pub async fn post(&self, path: &str, body: impl Borrow<Value>) -> (u16, Value) {
        let response = self.send(path, body).await;
        let status = response.status().as_u16();
        (status, response.json().await.unwrap())
    }

    pub async fn get(&self, path: &str) -> (u16, String) {
        let response = self
            .client
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .unwrap();
        (response.status().as_u16(), response.text().await.unwrap())
    }

    /// `GET /health` as JSON.
    pub async fn health(&self) -> Value {
        serde_json::from_str(&self.get("/health").await.1).unwrap()
    }

    /// Waits until the engine has no request left, then returns the pages nothing running holds:
    /// free, or kept by the prefix cache alone (which hands them out when the pool needs room).
    pub async fn idle_free_pages(&self) -> u64 {
        for _ in 0..500 {
            let health = self.health().await;
            if health["running"] == 0 && health["waiting"] == 0 {
                let free = health["kv_free_pages"].as_u64().unwrap();
                let cached = health["kv_cached_pages"].as_u64().unwrap();
                assert_eq!(
                    free + cached,
                    health["kv_total_pages"].as_u64().unwrap(),
                    "{health}"
                );
                return free + cached;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        panic!("the engine never went idle: {}", self.health().await);
    }
}

/// The generated token ids of a non-streaming completion asked with `return_token_ids`.
pub fn token_ids(response: &Value) -> Vec<u64> {
    response["choices"][0]["token_ids"]
        .as_array()
        .unwrap_or_else(|| panic!("no token_ids in {response}"))
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect()
}

/// A greedy completion of `prompt` on the golden pair with `algorithm`, token ids returned.
pub fn greedy_body(prompt: &[u32], max_tokens: usize, algorithm: &str) -> Value {
    json!({
        "model": "golden", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
        "return_token_ids": true, "speculative": {"algorithm": algorithm},
    })
}

/// Reads an SSE response to its end: the JSON payloads, and whether `[DONE]` closed it.
pub async fn read_stream(response: reqwest::Response) -> (Vec<Value>, bool) {
    let text = response.text().await.unwrap();
    let mut events = Vec::new();
    let mut done = false;
    for block in text.split("\n\n").filter(|b| !b.trim().is_empty()) {
        let data = block
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .collect::<String>();
        if data == "[DONE]" {
            done = true;
        } else if !data.is_empty() {
            events.push(serde_json::from_str(&data).unwrap());
        }
    }
    (events, done)
}
