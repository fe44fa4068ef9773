//! Prometheus metrics, all prefixed `grove_`. Recorded with the `metrics` facade from the
//! engine thread and the handlers; rendered by `GET /metrics`. One recorder per process (the
//! facade's global), installed on first use.

use std::sync::OnceLock;
use std::time::Duration;

use grove_engine::{Engine, GenerateOutput, StepTimings};
use metrics::{counter, gauge, histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];
const ACCEPT_BUCKETS: &[f64] = &[
    1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 10.0, 12.0, 16.0, 24.0, 32.0,
];
const BATCH_BUCKETS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0];

static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// The process's Prometheus handle (`None` if another recorder was installed first).
pub fn handle() -> Option<&'static PrometheusHandle> {
    HANDLE
        .get_or_init(|| {
            let builder = [
                ("grove_time_to_first_token_seconds", LATENCY_BUCKETS),
                ("grove_inter_token_latency_seconds", LATENCY_BUCKETS),
                ("grove_queue_time_seconds", LATENCY_BUCKETS),
                ("grove_e2e_request_latency_seconds", LATENCY_BUCKETS),
                ("grove_step_seconds", LATENCY_BUCKETS),
                ("grove_accept_length", ACCEPT_BUCKETS),
                ("grove_step_batch_size", BATCH_BUCKETS),
            ]
            .into_iter()
            .try_fold(PrometheusBuilder::new(), |builder, (name, buckets)| {
                builder.set_buckets_for_metric(Matcher::Full(name.into()), buckets)
            });
            match builder.and_then(|b| b.install_recorder()) {
                Ok(handle) => Some(handle),
                Err(error) => {
                    tracing::warn!(%error, "metrics recorder not installed");
                    None
                }
            }
        })
        .as_ref()
}

/// The Prometheus text page, with the process's resident memory refreshed.
pub fn render() -> String {
    if let Some(bytes) = resident_memory_bytes() {
        gauge!("grove_resident_memory_bytes").set(bytes as f64);
    }
    match handle() {
        Some(handle) => {
            handle.run_upkeep();
            handle.render()
        }
        None => String::new(),
    }
}

/// `VmRSS` of this process (Linux); `None` elsewhere.
pub fn resident_memory_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

pub(crate) fn request_outcome(outcome: &'static str) {
    counter!("grove_requests_total", "outcome" => outcome).increment(1);
}

pub(crate) fn queue_time(waited: Duration) {
    histogram!("grove_queue_time_seconds").record(waited.as_secs_f64());
}

pub(crate) fn time_to_first_token(elapsed: Duration) {
    histogram!("grove_time_to_first_token_seconds").record(elapsed.as_secs_f64());
}

pub(crate) fn inter_token_latency(gap: Duration) {
    histogram!("grove_inter_token_latency_seconds").record(gap.as_secs_f64());
}

pub(crate) fn engine_gauges(engine: &Engine<'_>) {
    gauge!("grove_running_requests").set(engine.running() as f64);
    gauge!("grove_waiting_requests").set(engine.waiting() as f64);
    gauge!("grove_kv_free_pages").set(engine.free_pages() as f64);
    gauge!("grove_kv_total_pages").set(engine.total_pages() as f64);
    gauge!("grove_preemptions").set(engine.preemptions() as f64);
    gauge!("grove_prefix_cache_pages").set(engine.cached_pages() as f64);
    gauge!("grove_ngram_corpus_tokens").set(engine.corpus_tokens() as f64);
    if let Some(stats) = engine.prefix_stats() {
        counter!("grove_prefix_cache_lookups_total").absolute(stats.lookups);
        counter!("grove_prefix_cache_hit_tokens_total").absolute(stats.hit_tokens);
        counter!("grove_prefix_cache_queried_tokens_total").absolute(stats.queried_tokens);
        counter!("grove_prefix_cache_inserted_pages_total").absolute(stats.inserted_pages);
        counter!("grove_prefix_cache_evicted_pages_total").absolute(stats.evicted_pages);
    }
}

/// One batched step: its wall time, batch size, verified rows and per-phase time (counters
/// hold integers, hence microseconds).
pub(crate) fn step(timings: &StepTimings, wall: Duration) {
    histogram!("grove_step_seconds").record(wall.as_secs_f64());
    if timings.sequences == 0 {
        return;
    }
    histogram!("grove_step_batch_size").record(timings.sequences as f64);
    counter!("grove_verified_rows_total").increment(timings.verified_rows as u64);
    for (phase, time) in [
        ("draft", timings.draft),
        ("tree_build", timings.tree_build),
        ("verify", timings.verify),
        ("commit", timings.commit),
    ] {
        counter!("grove_phase_microseconds_total", "phase" => phase)
            .increment(time.as_micros() as u64);
    }
    speculation(timings);
}

/// What the step's speculating sequences chose (with an automatic budget, the choice is the
/// engine's): nodes verified per sequence, rounds that drafted nothing, and the acceptance the
/// calibrated drafter predicted against the acceptance observed.
fn speculation(timings: &StepTimings) {
    if timings.budgets.is_empty() {
        return;
    }
    for &nodes in &timings.budgets {
        histogram!("grove_speculative_budget").record(nodes as f64);
    }
    let without = timings.budgets.len() - timings.drafted.min(timings.budgets.len());
    counter!("grove_speculative_rounds_total", "drafted" => "true")
        .increment(timings.drafted as u64);
    counter!("grove_speculative_rounds_total", "drafted" => "false").increment(without as u64);
    if timings.drafted > 0 {
        histogram!("grove_speculative_predicted_accepted").record(timings.predicted_accepted);
        histogram!("grove_speculative_observed_accepted").record(timings.accepted as f64);
    }
}

/// A request that ran to its end: outcome, token counts, acceptance.
pub(crate) fn finished(output: &GenerateOutput, latency: Duration) {
    request_outcome(match output.finish_reason {
        grove_core::FinishReason::Stop => "stop",
        grove_core::FinishReason::Length => "length",
    });
    let stats = &output.stats;
    counter!("grove_prompt_tokens_total").increment(stats.prompt_tokens as u64);
    counter!("grove_cached_prompt_tokens_total").increment(stats.cached_tokens as u64);
    counter!("grove_generation_tokens_total").increment(stats.new_tokens as u64);
    histogram!("grove_e2e_request_latency_seconds").record(latency.as_secs_f64());
    let algorithm = stats.algorithm.name();
    for &length in &stats.accept_lengths {
        histogram!("grove_accept_length", "algorithm" => algorithm).record(length as f64);
    }
    counter!("grove_rounds_total", "algorithm" => algorithm).increment(stats.rounds as u64);
    for (depth, &accepted) in stats.accepted_per_position.iter().enumerate() {
        if accepted > 0 {
            counter!("grove_accepted_per_depth_total", "depth" => (depth + 1).to_string())
                .increment(accepted as u64);
        }
    }
}

pub(crate) fn connection_opened() {
    gauge!("grove_open_connections").increment(1.0);
}

pub(crate) fn connection_closed() {
    gauge!("grove_open_connections").decrement(1.0);
}

/// A connection closed at once because the cap was reached.
pub(crate) fn connection_shed() {
    counter!("grove_connections_shed_total").increment(1);
}
