//! Load: 32 concurrent streaming clients for a bounded time (`GROVE_LOAD_SECONDS`, default
//! 60) with a mix of methods, lengths and sampling, half the prompts starting with one of four
//! shared system prompts; none may fail, the prefix cache serves about the share of prompt
//! tokens the workload repeats, and afterwards every KV page is free or cached.

mod common;

use std::time::{Duration, Instant};

use common::*;
use futures_util::StreamExt;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

const CLIENTS: usize = 32;
const SYSTEM_PROMPTS: u32 = 4;
const SYSTEM_TOKENS: u32 = 48;

/// What one client saw.
#[derive(Default)]
struct ClientLog {
    completed: usize,
    failures: Vec<String>,
    prompt_tokens: u64,
    cached_tokens: u64,
    /// Prompt tokens of its completed requests that were a shared system prompt.
    system_tokens: u64,
}

/// One client's loop: streaming requests until `deadline`.
async fn client(server: &TestServer, seed: u64, deadline: Instant) -> ClientLog {
    let mut rng = rand_chacha::ChaCha12Rng::seed_from_u64(seed);
    let mut log = ClientLog::default();
    let failures = &mut log.failures;
    while Instant::now() < deadline {
        let system = rng
            .random_bool(0.5)
            .then(|| rng.random_range(0..SYSTEM_PROMPTS));
        let mut prompt: Vec<u32> = system.map_or_else(Vec::new, |s| {
            (0..SYSTEM_TOKENS)
                .map(|i| 1 + (s * 97 + i * 13) % 1020)
                .collect()
        });
        prompt.extend((0..rng.random_range(1..64)).map(|_| rng.random_range(0..1021u32)));
        let algorithm = ["none", "dflash", "ddtree"][rng.random_range(0..3)];
        let temperature = if rng.random_bool(0.3) { 0.8 } else { 0.0 };
        let body = json!({
            "model": "golden", "prompt": prompt, "max_tokens": rng.random_range(1..96),
            "temperature": temperature, "seed": seed, "stream": true, "return_token_ids": true,
            "stream_options": {"include_usage": true}, "speculative": {"algorithm": algorithm},
        });
        let response = match server
            .client
            .post(format!("{}/v1/completions", server.base))
            .json(&body)
            .send()
            .await
        {
            Ok(response) => response,
            Err(error) => {
                failures.push(format!("send: {error}"));
                continue;
            }
        };
        if response.status() != 200 {
            failures.push(format!("status {}", response.status()));
            continue;
        }
        let mut text = String::new();
        let mut chunks = response.bytes_stream();
        while let Some(chunk) = chunks.next().await {
            match chunk {
                Ok(bytes) => text.push_str(&String::from_utf8_lossy(&bytes)),
                Err(error) => {
                    failures.push(format!("stream: {error}"));
                    break;
                }
            }
        }
        let events: Vec<Value> = text
            .split("\n\n")
            .filter_map(|b| b.strip_prefix("data: "))
            .filter(|d| *d != "[DONE]")
            .map(|d| serde_json::from_str(d).unwrap())
            .collect();
        let streamed: usize = events
            .iter()
            .filter_map(|e| e["choices"].get(0)?["token_ids"].as_array().map(Vec::len))
            .sum();
        let usage = events
            .last()
            .map(|e| e["usage"].clone())
            .unwrap_or_default();
        if !text.ends_with("data: [DONE]\n\n") || usage["completion_tokens"] != json!(streamed) {
            failures.push(format!(
                "incomplete stream ({streamed} tokens, usage {usage:?})"
            ));
            continue;
        }
        log.completed += 1;
        log.prompt_tokens += prompt.len() as u64;
        log.cached_tokens += usage["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or(0);
        log.system_tokens += system.map_or(0, |_| SYSTEM_TOKENS as u64);
    }
    log
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thirty_two_streaming_clients_for_a_minute_fail_nothing_and_return_every_page() {
    let seconds: u64 = std::env::var("GROVE_LOAD_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    // A pool that cannot hold all 32 at once: admission waits and preemption happen too.
    let server = TestServer::start(golden_served(), config("golden", 8, 3000, 32, 256));
    let initial_pages = server.idle_free_pages().await;
    let start = Instant::now();
    let deadline = start + Duration::from_secs(seconds);
    let results = futures_util::future::join_all(
        (0..CLIENTS as u64).map(|seed| client(&server, seed, deadline)),
    )
    .await;
    let completed: usize = results.iter().map(|log| log.completed).sum();
    let failures: Vec<&String> = results.iter().flat_map(|log| &log.failures).collect();
    let sum = |field: fn(&ClientLog) -> u64| results.iter().map(field).sum::<u64>() as f64;
    let prompt_tokens = sum(|log| log.prompt_tokens);
    // The workload repeats the system prompts: all but each one's first prefill could hit.
    let repeated = sum(|log| log.system_tokens) - (SYSTEM_PROMPTS * SYSTEM_TOKENS) as f64;
    let workload_rate = repeated.max(0.0) / prompt_tokens;
    let hit_rate = sum(|log| log.cached_tokens) / prompt_tokens;
    let health = server.health().await;
    println!(
        "{CLIENTS} clients, {:.0} s: {completed} requests completed, {} failed, preemptions {}, \
         prefix-cache hit rate {hit_rate:.3} of prompt tokens (the workload repeats {workload_rate:.3})",
        start.elapsed().as_secs_f64(),
        failures.len(),
        health["preemptions"]
    );
    assert!(failures.is_empty(), "{failures:?}");
    assert!(completed >= CLIENTS, "only {completed} requests completed");
    // Random suffixes add chance hits of a token or two; evictions under this small pool
    // can cost a few system-prompt prefills.
    assert!(
        hit_rate >= 0.8 * workload_rate && hit_rate <= workload_rate + 0.05,
        "hit rate {hit_rate:.3}, workload {workload_rate:.3}"
    );
    assert_eq!(server.idle_free_pages().await, initial_pages);
}
