//! /metrics reports what happened, value by value: one request's outcome, token counts,
//! acceptance and latencies, and the pool back to full afterwards. A test binary of its own:
//! the Prometheus recorder is global to the process, and other servers' requests would add to
//! the counts.

mod common;

use std::time::Duration;

use common::*;

/// The sum of every sample of `name` whose labels contain `labels` (`""`: all).
fn value(page: &str, name: &str, labels: &str) -> f64 {
    page.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (metric, rest) = match series.split_once('{') {
                Some((metric, rest)) => (metric, rest),
                None => (series, ""),
            };
            (metric == name && rest.contains(labels)).then(|| value.parse::<f64>().ok())?
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_report_one_request_value_by_value() {
    let mut config = config("golden", 8, 4096, 8, 64);
    config.engine.limits.ngram_corpus = Some(1000);
    let server = TestServer::start(golden_served(), config);
    let (status, body) = server
        .post("/v1/completions", &greedy_body(&[1, 2, 3], 24, "ddtree"))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["usage"]["completion_tokens"], 24, "{body}");
    // The engine's gauges are written after the step that finished the request: wait for them.
    let mut page = String::new();
    for _ in 0..200 {
        page = server.get("/metrics").await.1;
        let total = value(&page, "grove_kv_total_pages", "");
        let unheld =
            value(&page, "grove_kv_free_pages", "") + value(&page, "grove_prefix_cache_pages", "");
        if total > 0.0 && unheld == total {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let metric = |name: &str, labels: &str| value(&page, name, labels);
    // Every page back in the pool or in the prefix cache; nothing running or waiting.
    assert!(metric("grove_kv_total_pages", "") > 0.0, "{page}");
    assert!(metric("grove_prefix_cache_pages", "") > 0.0, "{page}");
    assert_eq!(
        metric("grove_kv_free_pages", "") + metric("grove_prefix_cache_pages", ""),
        metric("grove_kv_total_pages", ""),
        "{page}"
    );
    assert_eq!(
        metric("grove_prefix_cache_lookups_total", ""),
        1.0,
        "{page}"
    );
    assert_eq!(
        metric("grove_prefix_cache_hit_tokens_total", ""),
        0.0,
        "{page}"
    );
    // The lookup corpus keeps the finished text: its prompt, its output and their end.
    assert_eq!(metric("grove_ngram_corpus_tokens", ""), 28.0, "{page}");
    assert_eq!(metric("grove_running_requests", ""), 0.0, "{page}");
    assert_eq!(metric("grove_waiting_requests", ""), 0.0, "{page}");
    // One request that ran to its length, its tokens counted once.
    assert_eq!(
        metric("grove_requests_total", "outcome=\"length\""),
        1.0,
        "{page}"
    );
    assert_eq!(metric("grove_requests_total", ""), 1.0, "{page}");
    assert_eq!(metric("grove_prompt_tokens_total", ""), 3.0, "{page}");
    assert_eq!(metric("grove_generation_tokens_total", ""), 24.0, "{page}");
    // The prefill chose the first token; every round emitted tau more: the taus sum to the
    // other 23, one per round, and each accepted draft is counted at its depth.
    let rounds = metric("grove_rounds_total", "algorithm=\"ddtree\"");
    assert!((1.0..=23.0).contains(&rounds), "{page}");
    assert_eq!(
        metric("grove_accept_length_count", "algorithm=\"ddtree\""),
        rounds,
        "{page}"
    );
    assert_eq!(
        metric("grove_accept_length_sum", "algorithm=\"ddtree\""),
        23.0,
        "{page}"
    );
    assert_eq!(
        metric("grove_accepted_per_depth_total", ""),
        23.0 - rounds,
        "{page}"
    );
    // Every round's chosen budget; the rounds that drafted (all but a last one too short to
    // draft), and their predicted and observed accepted drafts.
    assert_eq!(
        metric("grove_speculative_budget_count", ""),
        rounds,
        "{page}"
    );
    let drafted = metric("grove_speculative_rounds_total", "drafted=\"true\"");
    assert_eq!(
        drafted + metric("grove_speculative_rounds_total", "drafted=\"false\""),
        rounds,
        "{page}"
    );
    assert!(drafted >= rounds - 1.0, "{page}");
    assert_eq!(
        metric("grove_speculative_predicted_accepted_count", ""),
        drafted,
        "{page}"
    );
    assert!(
        metric("grove_speculative_predicted_accepted_sum", "") > 0.0,
        "{page}"
    );
    assert_eq!(
        metric("grove_speculative_observed_accepted_sum", ""),
        23.0 - rounds,
        "{page}"
    );
    // One first token, 23 gaps between streamed chunks at most, one end-to-end latency.
    assert_eq!(
        metric("grove_time_to_first_token_seconds_count", ""),
        1.0,
        "{page}"
    );
    assert_eq!(
        metric("grove_e2e_request_latency_seconds_count", ""),
        1.0,
        "{page}"
    );
    assert_eq!(metric("grove_queue_time_seconds_count", ""), 1.0, "{page}");
    let gaps = metric("grove_inter_token_latency_seconds_count", "");
    assert!((1.0..=23.0).contains(&gaps), "{page}");
    // Each step ran one sequence; each round verified its nodes in a step.
    let steps = metric("grove_step_batch_size_count", "");
    assert!(steps >= rounds, "{page}");
    assert_eq!(metric("grove_step_batch_size_sum", ""), steps, "{page}");
    for phase in ["draft", "verify", "commit"] {
        let label = format!("phase=\"{phase}\"");
        assert!(
            metric("grove_phase_microseconds_total", &label) > 0.0,
            "{phase}: {page}"
        );
    }
    assert!(metric("grove_resident_memory_bytes", "") > 1e6, "{page}");

    // The same prompt again: all but its last token come from the cache.
    let (status, body) = server
        .post("/v1/completions", &greedy_body(&[1, 2, 3], 4, "ddtree"))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["usage"]["prompt_tokens_details"]["cached_tokens"], 2,
        "{body}"
    );
    for _ in 0..200 {
        page = server.get("/metrics").await.1;
        if value(&page, "grove_prefix_cache_lookups_total", "") == 2.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        value(&page, "grove_prefix_cache_hit_tokens_total", ""),
        2.0,
        "{page}"
    );
    assert_eq!(
        value(&page, "grove_cached_prompt_tokens_total", ""),
        2.0,
        "{page}"
    );
}
