//! The prefix cache through the API: chats sharing a long system prompt get the same answers
//! as from a server without the cache, report their cached prompt tokens in OpenAI's
//! `usage.prompt_tokens_details`, and `/health` shows the cached pages.

mod common;

use common::*;
use serde_json::{json, Value};

fn chat(system: &str, question: &str, algorithm: &str) -> Value {
    json!({
        "model": "tiny", "max_tokens": 24, "temperature": 0,
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": question},
        ],
        "speculative": {"algorithm": algorithm},
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chats_sharing_a_system_prompt_hit_the_cache_and_answer_as_without_it() {
    let cached = TestServer::start(default_served(), config("tiny", 6, 8192, 4, 64));
    let mut no_cache = config("tiny", 6, 8192, 4, 64);
    no_cache.engine.limits.prefix_cache = false;
    let uncached = TestServer::start(default_served(), no_cache);
    let system = "You are a careful assistant for a Python code base. ".repeat(12);
    let questions = [
        "How do I sort a list?",
        "What is a dict?",
        "Explain generators.",
    ];
    for algorithm in ["none", "dflash", "ddtree"] {
        for (turn, question) in questions.iter().enumerate() {
            let body = chat(&system, question, algorithm);
            let (status, with_cache) = cached.post("/v1/chat/completions", &body).await;
            assert_eq!(status, 200, "{with_cache}");
            let (status, without) = uncached.post("/v1/chat/completions", &body).await;
            assert_eq!(status, 200, "{without}");
            let text = |v: &Value| v["choices"][0]["message"]["content"].clone();
            assert_eq!(text(&with_cache), text(&without), "{algorithm} turn {turn}");
            let usage = &with_cache["usage"];
            let prompt = usage["prompt_tokens"].as_u64().unwrap();
            let hit = usage["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap();
            assert_eq!(
                without["usage"]["prompt_tokens_details"]["cached_tokens"],
                0
            );
            if algorithm != "none" || turn > 0 {
                // The system prompt (most of the prompt) was prefilled by an earlier request.
                assert!(hit * 10 >= prompt * 8, "{algorithm} turn {turn}: {usage}");
            } else {
                assert_eq!(hit, 0, "{usage}");
            }
        }
    }
    let health = cached.health().await;
    assert!(health["kv_cached_pages"].as_u64().unwrap() > 0, "{health}");
    cached.idle_free_pages().await;
    assert_eq!(uncached.health().await["kv_cached_pages"], 0);
}
