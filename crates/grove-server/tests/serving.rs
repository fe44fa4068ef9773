//! The server end to end on 127.0.0.1: batching is lossless for every method, streams carry
//! what the JSON answer carries, a small pool preempts instead of failing, a full queue
//! answers 429, dropped streams free their pages (/metrics has a test binary of its own:
//! `metrics.rs`).

mod common;

use common::*;
use futures_util::StreamExt;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

fn prompts(count: usize, seed: u64) -> Vec<(Vec<u32>, usize)> {
    let mut rng = rand_chacha::ChaCha12Rng::seed_from_u64(seed);
    (0..count)
        .map(|_| {
            let length = rng.random_range(1..40);
            let prompt = (0..length).map(|_| rng.random_range(0..1021)).collect();
            (prompt, rng.random_range(1..48))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_requests_get_exactly_their_solo_outputs_for_every_method() {
    let server = TestServer::start(golden_served(), config("golden", 12, 4096, 16, 64));
    let initial_pages = server.idle_free_pages().await;
    let requests = prompts(16, 7);
    let mut plain = Vec::new();
    for algorithm in ["none", "dflash", "ddtree"] {
        let mut solo = Vec::new();
        for (prompt, max_tokens) in &requests {
            let (status, body) = server
                .post(
                    "/v1/completions",
                    &greedy_body(prompt, *max_tokens, algorithm),
                )
                .await;
            assert_eq!(status, 200, "{body}");
            assert_eq!(body["usage"]["speculative"]["algorithm"], algorithm);
            solo.push(token_ids(&body));
        }
        let together =
            futures_util::future::join_all(requests.iter().map(|(prompt, max_tokens)| {
                server.post(
                    "/v1/completions",
                    greedy_body(prompt, *max_tokens, algorithm),
                )
            }))
            .await;
        for (i, ((status, body), alone)) in together.iter().zip(&solo).enumerate() {
            assert_eq!(*status, 200, "{body}");
            assert_eq!(&token_ids(body), alone, "{algorithm} request {i}");
        }
        // Lossless: speculation changes nothing but speed.
        if algorithm == "none" {
            plain = solo;
        } else {
            assert_eq!(solo, plain, "{algorithm} vs plain greedy");
        }
    }
    assert_eq!(server.idle_free_pages().await, initial_pages);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pool_too_small_for_all_requests_preempts_and_completes_them_all() {
    // Room for about two sequences while eight may run.
    let server = TestServer::start(golden_served(), config("golden", 8, 160, 8, 64));
    let initial_pages = server.idle_free_pages().await;
    let requests: Vec<(Vec<u32>, usize)> = prompts(8, 3)
        .into_iter()
        .map(|(prompt, _)| (prompt, 40))
        .collect();
    let mut solo = Vec::new();
    for (prompt, max_tokens) in &requests {
        let (status, body) = server
            .post(
                "/v1/completions",
                &greedy_body(prompt, *max_tokens, "ddtree"),
            )
            .await;
        assert_eq!(status, 200, "{body}");
        solo.push(token_ids(&body));
    }
    let together = futures_util::future::join_all(requests.iter().map(|(prompt, max_tokens)| {
        server.post(
            "/v1/completions",
            greedy_body(prompt, *max_tokens, "ddtree"),
        )
    }))
    .await;
    for ((status, body), alone) in together.iter().zip(&solo) {
        assert_eq!(*status, 200, "{body}");
        assert_eq!(&token_ids(body), alone);
    }
    let health = server.health().await;
    assert!(health["preemptions"].as_u64().unwrap() > 0, "{health}");
    assert_eq!(server.idle_free_pages().await, initial_pages);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_full_queue_answers_429_and_the_rest_complete() {
    let server = TestServer::start(golden_served(), config("golden", 8, 4096, 1, 1));
    let body = json!({"model": "golden", "prompt": [5, 6, 7], "max_tokens": 200,
                      "temperature": 0, "ignore_eos": true});
    let answers =
        futures_util::future::join_all((0..8).map(|_| server.post("/v1/completions", &body))).await;
    let refused: Vec<&Value> = answers
        .iter()
        .filter(|(status, _)| *status == 429)
        .map(|(_, body)| body)
        .collect();
    assert!(!refused.is_empty(), "nothing was refused: {answers:?}");
    for body in &refused {
        assert_eq!(body["error"]["type"], "rate_limit_error");
        assert!(body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("--max-queued-requests"));
    }
    assert!(answers
        .iter()
        .all(|(status, _)| *status == 200 || *status == 429));
    assert!(answers.iter().any(|(status, _)| *status == 200));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn streams_carry_the_same_text_and_usage_as_json_answers() {
    let server = TestServer::start(default_served(), config("tiny", 6, 4096, 8, 64));
    for (path, request) in [
        (
            "/v1/completions",
            json!({"model": "tiny", "prompt": "def add(a, b):", "max_tokens": 40, "temperature": 0}),
        ),
        (
            "/v1/chat/completions",
            json!({"model": "tiny", "messages": [{"role": "user", "content": "Write a loop."}],
                   "max_tokens": 40, "temperature": 0}),
        ),
    ] {
        let (status, whole) = server.post(path, &request).await;
        assert_eq!(status, 200, "{whole}");
        let mut streaming = request.clone();
        streaming["stream"] = json!(true);
        streaming["stream_options"] = json!({"include_usage": true});
        let response = server.send(path, &streaming).await;
        assert_eq!(response.status().as_u16(), 200);
        assert!(response.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream"));
        let (events, done) = read_stream(response).await;
        assert!(done, "no [DONE]");
        let chat = path.contains("chat");
        let text: String = events
            .iter()
            .filter_map(|e| {
                let choice = e["choices"].get(0)?;
                if chat {
                    choice["delta"]["content"].as_str().map(str::to_owned)
                } else {
                    choice["text"].as_str().map(str::to_owned)
                }
            })
            .collect();
        let expected = if chat {
            whole["choices"][0]["message"]["content"].as_str().unwrap()
        } else {
            whole["choices"][0]["text"].as_str().unwrap()
        };
        assert_eq!(text, expected, "{path}");
        let finish = events
            .iter()
            .filter_map(|e| e["choices"].get(0)?["finish_reason"].as_str())
            .collect::<Vec<_>>();
        assert_eq!(
            finish,
            [whole["choices"][0]["finish_reason"].as_str().unwrap()]
        );
        let usage = &events.last().unwrap()["usage"];
        assert_eq!(
            usage["completion_tokens"],
            whole["usage"]["completion_tokens"]
        );
        assert_eq!(usage["prompt_tokens"], whole["usage"]["prompt_tokens"]);
        if chat {
            assert_eq!(events[0]["choices"][0]["delta"]["role"], "assistant");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn clients_that_hang_up_free_their_pages_and_others_carry_on() {
    let server = TestServer::start(golden_served(), config("golden", 8, 4096, 16, 64));
    let initial_pages = server.idle_free_pages().await;
    let long = json!({"model": "golden", "prompt": [3, 4, 5, 6], "max_tokens": 900,
                      "temperature": 0, "ignore_eos": true, "stream": true,
                      "return_token_ids": true});
    let (_, reference) = server
        .post("/v1/completions", &greedy_body(&[9, 8, 7], 30, "ddtree"))
        .await;
    let droppers = (0..8).map(|_| async {
        let response = server
            .client
            .post(format!("{}/v1/completions", server.base))
            .json(&long)
            .send()
            .await
            .unwrap();
        let mut chunks = response.bytes_stream();
        // Read one event, then hang up.
        let first = chunks.next().await.unwrap().unwrap();
        assert!(!first.is_empty());
    });
    // Non-streaming clients that give up (a timeout) are cancelled the same way.
    let mut unstreamed = long.clone();
    unstreamed["stream"] = json!(false);
    let impatient = (0..4).map(|_| server.give_up_on("/v1/completions", &unstreamed));
    let survivors =
        (0..4).map(|_| server.post("/v1/completions", greedy_body(&[9, 8, 7], 30, "ddtree")));
    let (_, _, answers) = tokio::join!(
        futures_util::future::join_all(droppers),
        futures_util::future::join_all(impatient),
        futures_util::future::join_all(survivors)
    );
    for (status, body) in &answers {
        assert_eq!(*status, 200, "{body}");
        assert_eq!(token_ids(body), token_ids(&reference));
    }
    assert_eq!(server.idle_free_pages().await, initial_pages);
    let (status, metrics) = server.get("/metrics").await;
    assert_eq!(status, 200);
    assert!(
        metrics.contains("grove_requests_total{outcome=\"cancelled\"}"),
        "{metrics}"
    );
}

/// Sampling fields a request leaves out come from the checkpoint's `generation_config.json`
/// (here: greedy, as `do_sample: false` says), not OpenAI's T = 1.0; fields it sets win.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sampling_defaults_fill_the_fields_a_request_leaves_out() {
    let mut settings = config("golden", 4, 2048, 4, 8);
    settings.sampling_defaults = grove_core::SamplingDefaults {
        temperature: Some(0.0),
        top_p: None,
        top_k: None,
    };
    let server = TestServer::start(golden_served(), settings);
    let prompt = [970, 881, 849, 832, 613];
    let body = |extra: Value| {
        let mut body = json!({"model": "golden", "prompt": prompt, "max_tokens": 24,
                              "return_token_ids": true});
        for (key, value) in extra.as_object().unwrap() {
            body[key] = value.clone();
        }
        body
    };
    let (_, greedy) = server
        .post("/v1/completions", body(json!({"temperature": 0})))
        .await;
    // Left out: greedy, twice the same, and the explicit greedy answer.
    for _ in 0..2 {
        let (status, answer) = server.post("/v1/completions", body(json!({}))).await;
        assert_eq!(status, 200, "{answer}");
        assert_eq!(token_ids(&answer), token_ids(&greedy));
    }
    // Set by the request: sampled (two seeds, two different answers at T = 1.5).
    let sampled: Vec<Vec<u64>> = futures_util::future::join_all((1..=2).map(|seed| {
        server.post(
            "/v1/completions",
            body(json!({"temperature": 1.5, "seed": seed})),
        )
    }))
    .await
    .iter()
    .map(|(_, answer)| token_ids(answer))
    .collect();
    assert_ne!(sampled[0], sampled[1]);
}

/// What sglang-router reads when a worker registers: `/server_info` and `/model_info` (and the
/// older `/get_*` names it falls back to) carry the served name, the model and its limits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_metadata_answers_what_the_gateway_asks() {
    let server = TestServer::start(golden_served(), config("golden", 4, 2048, 3, 8));
    for path in ["/server_info", "/get_server_info"] {
        let (status, body) = server.get(path).await;
        assert_eq!(status, 200, "{path}: {body}");
        let info: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(info["served_model_name"], "golden");
        assert_eq!(info["model_path"], "golden (test)");
        assert_eq!(info["tp_size"], 1);
        assert_eq!(info["max_running_requests"], 3);
        assert_eq!(info["max_total_tokens"], 2048);
        assert_eq!(info["speculative_algorithm"], "ddtree");
        assert_eq!(info["speculative_budget"], 4, "a fixed budget: the ceiling");
        assert_eq!(
            info["speculative_ngram_capacity"], 0,
            "fixed DDTree: no corpus"
        );
        assert!(info["version"].as_str().unwrap().starts_with("grove "));
    }
    for path in ["/model_info", "/get_model_info"] {
        let (status, body) = server.get(path).await;
        assert_eq!(status, 200, "{path}: {body}");
        let info: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(info["is_generation"], true);
        assert_eq!(info["model_type"], "qwen3");
        assert_eq!(info["architectures"], json!(["Qwen3ForCausalLM"]));
    }
}

/// A request may have its budget chosen each round (`"budget": "auto"`) on a server with a
/// fixed one: its tokens are plain decoding's, and `usage` says what was chosen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_automatic_budget_is_lossless_and_reports_its_choice() {
    let server = TestServer::start(golden_served(), config("golden", 12, 4096, 4, 16));
    for (prompt, max_tokens) in prompts(4, 11) {
        let (status, plain) = server
            .post("/v1/completions", &greedy_body(&prompt, max_tokens, "none"))
            .await;
        assert_eq!(status, 200, "{plain}");
        let mut body = greedy_body(&prompt, max_tokens, "ddtree");
        body["speculative"]["budget"] = json!("auto");
        let (status, auto) = server.post("/v1/completions", &body).await;
        assert_eq!(status, 200, "{auto}");
        assert_eq!(token_ids(&auto), token_ids(&plain));
        let usage = &auto["usage"]["speculative"];
        assert_eq!(usage["auto_budget"], true, "{usage}");
        assert_eq!(usage["budget"], 12, "{usage}");
        let mean = usage["mean_budget"].as_f64().unwrap();
        assert!((0.0..=12.0).contains(&mean), "{usage}");
        let rounds = usage["rounds"].as_u64().unwrap();
        assert!(
            usage["rounds_without_drafts"].as_u64().unwrap() <= rounds,
            "{usage}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn penalties_and_biases_apply_alike_for_every_method() {
    let server = TestServer::start(default_served(), config("tiny", 6, 4096, 8, 64));
    let base = json!({"model": "tiny", "prompt": "def add(a, b):", "max_tokens": 32,
                      "temperature": 0, "return_token_ids": true});
    let (_, plain) = server.post("/v1/completions", &base).await;
    let first = plain["choices"][0]["token_ids"][0].as_u64().unwrap();
    let mut adjusted = base.clone();
    adjusted["presence_penalty"] = json!(1.0);
    adjusted["frequency_penalty"] = json!(0.5);
    adjusted["logit_bias"] = json!({ first.to_string(): -100 });
    let mut answers = Vec::new();
    for algorithm in ["none", "dflash", "ddtree"] {
        let mut request = adjusted.clone();
        request["speculative"] = json!({"algorithm": algorithm});
        let (status, answer) = server.post("/v1/completions", &request).await;
        assert_eq!(status, 200, "{answer}");
        let ids = answer["choices"][0]["token_ids"]
            .as_array()
            .unwrap()
            .clone();
        assert!(
            !ids.contains(&json!(first)),
            "{algorithm}: the banned token came"
        );
        answers.push(ids);
    }
    assert_eq!(answers[1], answers[0], "dflash");
    assert_eq!(answers[2], answers[0], "ddtree");
}
