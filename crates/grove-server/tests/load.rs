//! Load: 32 concurrent streaming clients for a bounded time (`GROVE_LOAD_SECONDS`, default
//! 60) with a mix of methods, lengths and sampling; none may fail, and afterwards every KV page
//! is back in the pool.

mod common;

use std::time::{Duration, Instant};

use common::*;
use futures_util::StreamExt;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

const CLIENTS: usize = 32;

/// One client's loop: streaming requests until `deadline`; returns (completed, failures).
async fn client(server: &TestServer, seed: u64, deadline: Instant) -> (usize, Vec<String>) {
    let mut rng = rand_chacha::ChaCha12Rng::seed_from_u64(seed);
    let mut completed = 0;
    let mut failures = Vec::new();
    while Instant::now() < deadline {
        let prompt: Vec<u32> = (0..rng.random_range(1..64))
            .map(|_| rng.random_range(0..1021))
            .collect();
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
            .map(|e| e["usage"]["completion_tokens"].clone());
        if !text.ends_with("data: [DONE]\n\n") || usage != Some(json!(streamed)) {
            failures.push(format!(
                "incomplete stream ({streamed} tokens, usage {usage:?})"
            ));
            continue;
        }
        completed += 1;
    }
    (completed, failures)
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
    let completed: usize = results.iter().map(|(c, _)| c).sum();
    let failures: Vec<&String> = results.iter().flat_map(|(_, f)| f).collect();
    let health = server.health().await;
    println!(
        "{CLIENTS} clients, {:.0} s: {completed} requests completed, {} failed, preemptions {}",
        start.elapsed().as_secs_f64(),
        failures.len(),
        health["preemptions"]
    );
    assert!(failures.is_empty(), "{failures:?}");
    assert!(completed >= CLIENTS, "only {completed} requests completed");
    assert_eq!(server.idle_free_pages().await, initial_pages);
}
