//! Admission: which requests the queue refuses (429, with `Retry-After`) and which it never
//! sees (a request that can never run is a 400 even while the queue is full), and that a burst
//! of exactly the running plus queued capacity into an idle server is taken whole.

mod common;

use std::time::Duration;

use common::*;
use serde_json::{json, Value};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_burst_of_running_plus_queued_requests_is_never_refused() {
    // 2 running + 2 queued: four requests at once, three bursts, each into an idle server.
    let server = TestServer::start(default_served(), config("tiny", 6, 4096, 2, 2));
    let body = json!({"model": "tiny", "prompt": "def f(x):", "max_tokens": 24,
                      "temperature": 0});
    for burst in 0..3 {
        let answers =
            futures_util::future::join_all((0..4).map(|_| server.post("/v1/completions", &body)))
                .await;
        for (status, answer) in &answers {
            assert_eq!(*status, 200, "burst {burst}: {answer}");
        }
        server.idle_free_pages().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_full_queue_refuses_with_retry_after_and_invalid_requests_still_get_400() {
    // One running, none queued: while a long stream runs, the queue is full.
    let server = TestServer::start(default_served(), config("tiny", 6, 4096, 1, 0));
    let long = json!({"model": "tiny", "prompt": "x", "max_tokens": 4000, "ignore_eos": true,
                      "stream": true});
    let stream = server
        .client
        .post(format!("{}/v1/completions", server.base))
        .json(&long)
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status().as_u16(), 200);
    for _ in 0..500 {
        if server.health().await["running"] == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let valid = json!({"model": "tiny", "prompt": "x", "max_tokens": 2});
    let refused = server
        .client
        .post(format!("{}/v1/completions", server.base))
        .json(&valid)
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status().as_u16(), 429);
    assert_eq!(refused.headers()["retry-after"], "1");
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["error"]["type"], "rate_limit_error", "{body}");
    // Requests that could never run: refused as invalid, not "retry later".
    for (request, param) in [
        (
            json!({"model": "tiny", "prompt": "x".repeat(5000), "max_tokens": 2}),
            "prompt",
        ),
        (
            json!({"model": "tiny", "prompt": "x", "speculative": {"budget": 100}}),
            "speculative.budget",
        ),
    ] {
        let (status, body) = server.post("/v1/completions", &request).await;
        assert_eq!(status, 400, "{body}");
        assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");
        assert_eq!(body["error"]["param"], param, "{body}");
    }
    assert_eq!(
        server.health().await["running"],
        1,
        "the stream ran throughout"
    );
    drop(stream);
    server.idle_free_pages().await;
}

/// A draining server (SIGTERM received) fails its health check first, so a gateway stops
/// sending it work, and refuses new requests with 503 while running ones carry on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draining_server_fails_health_and_refuses_new_requests() {
    let server = TestServer::start(default_served(), config("tiny", 6, 4096, 2, 4));
    assert_eq!(server.health().await["status"], "ok");
    server.status.begin_draining();
    let response = server
        .client
        .get(format!("{}/health", server.base))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 503);
    let health: serde_json::Value = response.json().await.unwrap();
    assert_eq!(health["status"], "draining", "{health}");
    let (status, body) = server
        .post(
            "/v1/completions",
            &json!({"model": "tiny", "prompt": "x", "max_tokens": 2}),
        )
        .await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "server_shutting_down", "{body}");
}
