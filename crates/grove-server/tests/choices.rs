//! `n` choices per request: each an engine request of its own (a seed moved on by the choice's
//! index), answered together in JSON or interleaved in one stream, usage counting the prompt
//! once; several prompts in one completion request, each answered as alone.

mod common;

use common::*;
use futures_util::StreamExt;
use serde_json::{json, Value};

fn texts(answer: &Value) -> Vec<String> {
    answer["choices"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .map(|(i, c)| {
            assert_eq!(c["index"], i, "{answer}");
            c["text"].as_str().unwrap().to_owned()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_choice_is_the_single_request_with_its_seed() {
    let server = TestServer::start(default_served(), config("tiny", 6, 4096, 8, 64));
    let request = json!({"model": "tiny", "prompt": "def add(a, b):", "max_tokens": 20,
                         "temperature": 0.9, "seed": 40, "n": 3});
    let (status, answer) = server.post("/v1/completions", &request).await;
    assert_eq!(status, 200, "{answer}");
    let choices = texts(&answer);
    assert_eq!(choices.len(), 3);
    let mut completion_tokens = 0;
    for (index, text) in choices.iter().enumerate() {
        let mut single = request.clone();
        single["n"] = json!(1);
        single["seed"] = json!(40 + index);
        let (_, alone) = server.post("/v1/completions", &single).await;
        assert_eq!(&texts(&alone)[0], text, "choice {index}");
        completion_tokens += alone["usage"]["completion_tokens"].as_u64().unwrap();
        assert_eq!(
            answer["usage"]["prompt_tokens"],
            alone["usage"]["prompt_tokens"]
        );
    }
    assert_eq!(answer["usage"]["completion_tokens"], completion_tokens);
    assert!(
        choices.iter().any(|t| t != &choices[0]),
        "seeds differ: {choices:?}"
    );

    let greedy = json!({"model": "tiny", "prompt": "def add(a, b):", "max_tokens": 20,
                        "temperature": 0, "n": 2});
    let (_, answer) = server.post("/v1/completions", &greedy).await;
    let choices = texts(&answer);
    assert_eq!(choices[0], choices[1], "greedy choices are one answer");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stream_interleaves_the_choices_and_ends_once() {
    let server = TestServer::start(default_served(), config("tiny", 6, 4096, 8, 64));
    let request = json!({"model": "tiny", "messages": [{"role": "user", "content": "Write a loop."}],
                         "max_tokens": 24, "temperature": 0.8, "seed": 9, "n": 2});
    let (status, whole) = server.post("/v1/chat/completions", &request).await;
    assert_eq!(status, 200, "{whole}");
    let mut streaming = request.clone();
    streaming["stream"] = json!(true);
    streaming["stream_options"] = json!({"include_usage": true});
    let (events, done) = read_stream(server.send("/v1/chat/completions", &streaming).await).await;
    assert!(done, "no [DONE]");
    let (mut text, mut roles, mut finishes) = ([String::new(), String::new()], [0; 2], [0; 2]);
    for event in &events {
        for choice in event["choices"].as_array().unwrap() {
            let index = choice["index"].as_u64().unwrap() as usize;
            if choice["delta"]["role"] == "assistant" {
                roles[index] += 1;
            }
            if let Some(piece) = choice["delta"]["content"].as_str() {
                text[index].push_str(piece);
            }
            if !choice["finish_reason"].is_null() {
                finishes[index] += 1;
            }
        }
    }
    assert_eq!(roles, [1, 1]);
    assert_eq!(finishes, [1, 1]);
    for (index, text) in text.iter().enumerate() {
        assert_eq!(
            text, &whole["choices"][index]["message"]["content"],
            "choice {index}"
        );
    }
    let usage = &events.last().unwrap()["usage"];
    assert_eq!(
        usage["completion_tokens"],
        whole["usage"]["completion_tokens"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_choice_of_a_request_its_client_left_is_cancelled() {
    let server = TestServer::start(golden_served(), config("golden", 8, 4096, 16, 64));
    let initial_pages = server.idle_free_pages().await;
    let long = json!({"model": "golden", "prompt": [3, 4, 5, 6], "max_tokens": 900,
                      "temperature": 0.8, "ignore_eos": true, "stream": true, "n": 3});
    let response = server.send("/v1/completions", &long).await;
    let mut chunks = response.bytes_stream();
    // Read one event, then hang up.
    assert!(!chunks.next().await.unwrap().unwrap().is_empty());
    drop(chunks);
    let mut unstreamed = long.clone();
    unstreamed["stream"] = json!(false);
    server.give_up_on("/v1/completions", &unstreamed).await;
    assert_eq!(server.idle_free_pages().await, initial_pages);
}

/// Several prompts in one completion request (what evaluation harnesses batch): their
/// choices in prompt order, each what the prompt alone answers, the prompts' tokens summed in
/// `usage`; scoring them (`echo`, `logprobs`, `max_tokens: 0`) scores each as alone; a stream
/// tags each prompt's choices by index.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn several_prompts_are_answered_as_each_alone() {
    let server = TestServer::start(default_served(), config("tiny", 6, 4096, 8, 64));
    let prompts = ["def add(a, b):", "import os\n", "class Stack:"];
    let request = json!({"model": "tiny", "prompt": prompts, "max_tokens": 12,
                         "temperature": 0.8, "seed": 5, "n": 2});
    let (status, answer) = server.post("/v1/completions", &request).await;
    assert_eq!(status, 200, "{answer}");
    let choices = texts(&answer);
    assert_eq!(choices.len(), 6);
    let (mut prompt_tokens, mut completion_tokens) = (0, 0);
    for (p, prompt) in prompts.iter().enumerate() {
        let mut alone = request.clone();
        alone["prompt"] = json!(prompt);
        let (_, alone) = server.post("/v1/completions", &alone).await;
        assert_eq!(texts(&alone), choices[2 * p..2 * p + 2], "prompt {p}");
        prompt_tokens += alone["usage"]["prompt_tokens"].as_u64().unwrap();
        completion_tokens += alone["usage"]["completion_tokens"].as_u64().unwrap();
    }
    assert_eq!(answer["usage"]["prompt_tokens"], prompt_tokens);
    assert_eq!(answer["usage"]["completion_tokens"], completion_tokens);

    // Token-id prompts scored as a harness scores them.
    let ids = [vec![100, 101, 102, 103], vec![50, 60], vec![7, 8, 9]];
    let score = json!({"model": "tiny", "prompt": ids, "max_tokens": 0, "echo": true,
                       "logprobs": 1, "temperature": 0});
    let (status, scored) = server.post("/v1/completions", &score).await;
    assert_eq!(status, 200, "{scored}");
    assert_eq!(scored["usage"]["completion_tokens"], 0);
    for (p, prompt) in ids.iter().enumerate() {
        let mut alone = score.clone();
        alone["prompt"] = json!(prompt);
        let (_, alone) = server.post("/v1/completions", &alone).await;
        let choice = &scored["choices"][p];
        assert_eq!(choice["index"], p);
        assert_eq!(choice["text"], alone["choices"][0]["text"], "prompt {p}");
        assert_eq!(
            choice["logprobs"], alone["choices"][0]["logprobs"],
            "prompt {p}"
        );
        let tokens = choice["logprobs"]["token_logprobs"].as_array().unwrap();
        assert_eq!(tokens.len(), prompt.len(), "prompt {p}");
    }

    // Streamed: every choice's text by its index, as in the JSON answer (greedy).
    let mut greedy = request.clone();
    greedy["temperature"] = json!(0);
    let (_, answer) = server.post("/v1/completions", &greedy).await;
    greedy["stream"] = json!(true);
    let (chunks, done) = read_stream(server.send("/v1/completions", &greedy).await).await;
    assert!(done);
    let mut streamed = vec![String::new(); 6];
    for chunk in &chunks {
        let choice = &chunk["choices"][0];
        streamed[choice["index"].as_u64().unwrap() as usize] += choice["text"].as_str().unwrap();
    }
    assert_eq!(streamed, texts(&answer));
}
