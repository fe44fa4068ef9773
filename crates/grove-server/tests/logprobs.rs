//! `logprobs` through the server: chat's `logprobs` + `top_logprobs` and completions'
//! `logprobs` count, in JSON answers and in streams, one entry per completion token, the same
//! values whichever way they travel and whatever the request's speculation.

mod common;

use common::*;
use serde_json::{json, Value};

/// The `logprobs` objects of a stream's chunks, laid end to end (chat: `content`;
/// completions: each list of the legacy shape).
fn streamed(events: &[Value], chat: bool) -> Value {
    let pieces = events
        .iter()
        .filter_map(|e| e["choices"].get(0)?.get("logprobs"))
        .filter(|l| !l.is_null());
    if chat {
        let content: Vec<Value> = pieces
            .flat_map(|l| l["content"].as_array().unwrap().clone())
            .collect();
        return json!({"content": content, "refusal": null});
    }
    let mut joined =
        json!({"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []});
    for piece in pieces {
        for key in ["tokens", "token_logprobs", "top_logprobs", "text_offset"] {
            let list = joined[key].as_array_mut().unwrap();
            list.extend(piece[key].as_array().unwrap().iter().cloned());
        }
    }
    joined
}

async fn stream(server: &TestServer, path: &str, request: &Value) -> Vec<Value> {
    let mut streaming = request.clone();
    streaming["stream"] = json!(true);
    let response = server.send(path, &streaming).await;
    assert_eq!(response.status().as_u16(), 200);
    let (events, done) = read_stream(response).await;
    assert!(done, "no [DONE]");
    events
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn answers_and_streams_carry_each_tokens_log_probability_for_every_method() {
    let server = TestServer::start(default_served(), config("tiny", 6, 4096, 8, 64));
    let chat = json!({"model": "tiny", "messages": [{"role": "user", "content": "Write a loop."}],
                      "max_tokens": 24, "temperature": 0, "logprobs": true, "top_logprobs": 3});
    let completion = json!({"model": "tiny", "prompt": "def add(a, b):", "max_tokens": 24,
                            "temperature": 0, "logprobs": 2});
    for (path, request) in [
        ("/v1/chat/completions", chat),
        ("/v1/completions", completion),
    ] {
        let is_chat = path.contains("chat");
        let mut answers = Vec::new();
        for algorithm in ["none", "dflash", "ddtree", "ngram"] {
            let mut request = request.clone();
            request["speculative"] = json!({"algorithm": algorithm});
            let (status, whole) = server.post(path, &request).await;
            assert_eq!(status, 200, "{whole}");
            let logprobs = whole["choices"][0]["logprobs"].clone();
            let tokens = whole["usage"]["completion_tokens"].as_u64().unwrap() as usize;
            if is_chat {
                let content = logprobs["content"].as_array().unwrap();
                assert_eq!(content.len(), tokens, "{whole}");
                for entry in content {
                    let top = entry["top_logprobs"].as_array().unwrap();
                    assert_eq!(top.len(), 3);
                    // Greedy: the chosen token is the most likely one.
                    assert_eq!(top[0]["logprob"], entry["logprob"], "{entry}");
                    assert!(entry["logprob"].as_f64().unwrap() <= 0.0);
                    let text = entry["token"].as_str().unwrap();
                    assert_eq!(entry["bytes"], json!(text.as_bytes()));
                }
            } else {
                assert_eq!(logprobs["tokens"].as_array().unwrap().len(), tokens);
                assert_eq!(logprobs["token_logprobs"].as_array().unwrap().len(), tokens);
                let offsets: Vec<u64> = logprobs["text_offset"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|o| o.as_u64().unwrap())
                    .collect();
                assert_eq!(offsets.first(), Some(&0));
                assert!(offsets.windows(2).all(|w| w[0] <= w[1]));
                for top in logprobs["top_logprobs"].as_array().unwrap() {
                    let n = top.as_object().unwrap().len();
                    assert!((1..=3).contains(&n), "2 alternatives and the chosen: {top}");
                }
            }
            let events = stream(&server, path, &request).await;
            assert_eq!(streamed(&events, is_chat), logprobs, "{path} {algorithm}");
            let text: String = events
                .iter()
                .filter_map(|e| {
                    let choice = e["choices"].get(0)?;
                    let text = if is_chat {
                        &choice["delta"]["content"]
                    } else {
                        &choice["text"]
                    };
                    text.as_str().map(str::to_owned)
                })
                .collect();
            let whole_text = if is_chat {
                &whole["choices"][0]["message"]["content"]
            } else {
                &whole["choices"][0]["text"]
            };
            assert_eq!(text, whole_text.as_str().unwrap(), "{path} {algorithm}");
            // A step's text and its tokens' entries travel in the same chunk.
            let chunks_with_text = events.iter().filter(|e| {
                let choice = &e["choices"][0];
                let text = if is_chat {
                    choice["delta"]["content"].as_str()
                } else {
                    choice["text"].as_str()
                };
                text.is_some_and(|t| !t.is_empty()) && choice["finish_reason"].is_null()
            });
            assert!(chunks_with_text.clone().count() > 0);
            for chunk in chunks_with_text.take(1) {
                assert!(!chunk["choices"][0]["logprobs"].is_null(), "{chunk}");
            }
            answers.push((whole["choices"][0].clone(), logprobs));
        }
        for (answer, logprobs) in &answers[1..] {
            assert_eq!(answer, &answers[0].0, "{path}: speculation is lossless");
            assert_eq!(logprobs, &answers[0].1);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn requests_without_logprobs_get_null() {
    let server = TestServer::start(default_served(), config("tiny", 6, 1024, 4, 16));
    let request = json!({"model": "tiny", "prompt": "x", "max_tokens": 3, "temperature": 0,
                         "logprobs": null});
    let (status, whole) = server.post("/v1/completions", &request).await;
    assert_eq!(status, 200, "{whole}");
    assert!(whole["choices"][0]["logprobs"].is_null());
    let events = stream(&server, "/v1/completions", &request).await;
    assert!(events
        .iter()
        .all(|e| e["choices"].get(0).is_none_or(|c| c["logprobs"].is_null())));
}

/// `echo`: the prompt comes back before the completion, and with `logprobs` it is scored
/// (`max_tokens: 0` scores it alone, the way evaluation harnesses ask), the same on a second
/// request that the prefix cache could have served.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_echoed_prompt_comes_back_scored() {
    let server = TestServer::start(default_served(), config("tiny", 6, 4096, 8, 64));
    let prompt = "def add(a, b):\n    return a + b\n";
    let score = json!({"model": "tiny", "prompt": prompt, "max_tokens": 0, "echo": true,
                       "logprobs": 1, "temperature": 0});
    let (status, scored) = server.post("/v1/completions", &score).await;
    assert_eq!(status, 200, "{scored}");
    let choice = &scored["choices"][0];
    assert_eq!(choice["text"], prompt);
    assert_eq!(scored["usage"]["completion_tokens"], 0);
    let prompt_tokens = scored["usage"]["prompt_tokens"].as_u64().unwrap() as usize;
    let logprobs = &choice["logprobs"];
    let values = logprobs["token_logprobs"].as_array().unwrap();
    assert_eq!(values.len(), prompt_tokens, "{logprobs}");
    assert!(values[0].is_null() && logprobs["top_logprobs"][0].is_null());
    assert!(values[1..].iter().all(|v| v.as_f64().unwrap() <= 0.0));
    assert_eq!(logprobs["text_offset"][0], 0);
    let tokens = logprobs["tokens"].as_array().unwrap().iter();
    let texts: String = tokens.map(|t| t.as_str().unwrap()).collect();
    assert_eq!(texts, prompt, "the tokens' texts lay end to end");
    let (_, again) = server.post("/v1/completions", &score).await;
    assert_eq!(
        again["choices"][0]["logprobs"], *logprobs,
        "a cached prompt scores alike"
    );

    // With a completion: the prompt's entries, then the completion's as a plain request has them.
    let mut both = score.clone();
    both["max_tokens"] = json!(6);
    let (_, echoed) = server.post("/v1/completions", &both).await;
    let mut plain = both.clone();
    plain["echo"] = json!(false);
    let (_, alone) = server.post("/v1/completions", &plain).await;
    let (echoed, alone) = (&echoed["choices"][0], &alone["choices"][0]);
    assert_eq!(
        echoed["text"].as_str().unwrap(),
        format!("{prompt}{}", alone["text"].as_str().unwrap())
    );
    let echoed_values = echoed["logprobs"]["token_logprobs"].as_array().unwrap();
    assert_eq!(&echoed_values[..prompt_tokens], &values[..]);
    assert_eq!(
        &echoed_values[prompt_tokens..],
        alone["logprobs"]["token_logprobs"].as_array().unwrap()
    );

    // Without logprobs, only the text.
    let mut text_only = both.clone();
    text_only["logprobs"] = json!(null);
    let (_, answer) = server.post("/v1/completions", &text_only).await;
    assert!(answer["choices"][0]["text"]
        .as_str()
        .unwrap()
        .starts_with(prompt));
    assert!(answer["choices"][0]["logprobs"].is_null());
}
