//! The engine thread: the one owner of the model, the KV pools and the scheduler. HTTP handlers
//! hand it requests over a channel and get their events back on a per-request channel; between
//! two steps it takes new requests (continuous batching), drops those whose client went away
//! (their pages return at once) and publishes gauges.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender, TryRecvError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use grove_core::TokenId;
use grove_engine::{
    Drafter, Engine, EngineEvent, EngineLimits, GenerateOutput, GenerateRequest, Generator,
    GeneratorOptions, RequestId, SpecAlgorithm, SpeculationSettings, TokenLogprob,
};
use grove_model::{Model, TextTokenizer};
use tokio::sync::mpsc::UnboundedSender;

use crate::error::ApiError;
use crate::metrics;

/// What the engine thread owns.
pub struct ServedModel {
    pub model: Box<dyn Model>,
    pub drafter: Option<Box<dyn Drafter>>,
    pub tokenizer: Option<Arc<TextTokenizer>>,
}

/// The engine's settings (the server's flags).
#[derive(Debug, Clone)]
pub struct EngineSettings {
    pub options: GeneratorOptions,
    pub speculation: SpeculationSettings,
    pub limits: EngineLimits,
    /// Requests waiting beyond this many are refused with 429.
    pub max_queued: usize,
    /// Compute threads of the engine's rayon pool.
    pub threads: usize,
}

/// A request handed to the engine thread.
pub(crate) struct Submission {
    pub request: GenerateRequest,
    pub events: UnboundedSender<WorkerEvent>,
    pub received: Instant,
}

/// What a handler hears about its request, in order: `Accepted` or `Rejected` first, then
/// text, then `Finished` (or `Failed`).
#[derive(Debug)]
pub(crate) enum WorkerEvent {
    Accepted,
    Rejected(ApiError),
    /// A step's tokens for the request, with their log-probabilities if it asked.
    Tokens(Vec<TokenId>, Vec<TokenLogprob>),
    Text(String),
    Finished(Box<GenerateOutput>),
    Failed(ApiError),
}

/// The engine's counts after a step, published whole: read field by field, a reader could
/// see one step's request counts beside the step before's page counts (a request done but
/// its pages still held).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct EngineCounts {
    pub running: usize,
    pub waiting: usize,
    pub free_pages: usize,
    pub total_pages: usize,
    /// Pages the prefix cache holds (some may be shared by running requests).
    pub cached_pages: usize,
    pub preemptions: u64,
}

/// Engine state the edge reads without asking the engine thread.
#[derive(Debug, Default)]
pub struct EngineStatus {
    counts: Mutex<EngineCounts>,
    /// Cleared when the engine thread exits (a model error it could not recover from).
    pub alive: AtomicBool,
    /// Set when the server is stopping: no new requests, `/health` answers 503.
    pub draining: AtomicBool,
    /// Set when the grace period is over: the engine ends every request still running.
    pub abort: AtomicBool,
}

impl EngineStatus {
    /// Stop taking requests; running ones carry on (a SIGTERM's first step).
    pub fn begin_draining(&self) {
        self.draining.store(true, Ordering::Relaxed);
    }

    /// End every request still running with an error (the grace period is over).
    pub fn abort_running(&self) {
        self.begin_draining();
        self.abort.store(true, Ordering::Relaxed);
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    /// The counts the engine published after its last step.
    pub fn counts(&self) -> EngineCounts {
        *self
            .counts
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl EngineStatus {
    fn publish(&self, engine: &Engine<'_>) {
        let counts = EngineCounts {
            running: engine.running(),
            waiting: engine.waiting(),
            free_pages: engine.free_pages(),
            total_pages: engine.total_pages(),
            cached_pages: engine.cached_pages(),
            preemptions: engine.preemptions(),
        };
        self.set_counts(counts);
        metrics::engine_gauges(engine);
    }

    fn set_counts(&self, counts: EngineCounts) {
        *self
            .counts
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = counts;
    }
}

/// One client's request in flight.
struct Client {
    events: UnboundedSender<WorkerEvent>,
    received: Instant,
    prompt_tokens: usize,
    /// When the last step that chose tokens for it ended.
    last_tokens: Option<Instant>,
}

/// What the edge needs to know once the engine is built.
pub(crate) struct Ready {
    /// Tokens the KV pool holds.
    pub kv_tokens: usize,
    /// The most rows one verify may add (the speculation ceiling + 1).
    pub verify_rows: usize,
    pub default_algorithm: SpecAlgorithm,
    /// Requests that do not choose get a budget chosen each round.
    pub auto_budget: bool,
    /// Tokens the lookup corpus of finished requests' texts may hold (0: none).
    pub corpus_capacity: usize,
}

/// Builds the generator and engine over `served`, reports `Ready`, and runs the step loop
/// until every sender of `commands` is gone.
pub(crate) fn run(
    served: ServedModel,
    settings: EngineSettings,
    commands: Receiver<Submission>,
    status: Arc<EngineStatus>,
    ready: Sender<Ready>,
) -> Result<(), String> {
    let generator = Generator::new(
        served.model.as_ref(),
        served.tokenizer.as_deref(),
        settings.options.clone(),
    )
    .with_speculation(settings.speculation, served.drafter.as_deref())
    .map_err(|e| e.to_string())?;
    let mut engine = generator
        .engine(settings.limits.clone())
        .map_err(|e| e.to_string())?;
    let _alive = Alive::set(&status);
    status.publish(&engine);
    if engine.corpus_capacity() > 0 {
        tracing::info!(
            tokens = engine.corpus_capacity(),
            "lookup drafts also draw on finished requests' texts"
        );
    }
    let _ = ready.send(Ready {
        kv_tokens: engine.total_pages() * settings.options.page_size.max(1),
        verify_rows: generator.max_budget() + 1,
        default_algorithm: generator.default_algorithm(),
        auto_budget: generator.auto_budget(),
        corpus_capacity: engine.corpus_capacity(),
    });
    drop(ready);
    let mut clients: HashMap<RequestId, Client> = HashMap::new();
    let mut throughput = Throughput::new();
    loop {
        // Idle: sleep until a request arrives. Busy: take whatever arrived since the last step.
        if engine.is_idle() {
            match commands.recv() {
                Ok(submission) => submit(&mut engine, &mut clients, submission, &settings),
                Err(_) => break,
            }
        }
        loop {
            match commands.try_recv() {
                Ok(submission) => submit(&mut engine, &mut clients, submission, &settings),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) if engine.is_idle() => return Ok(()),
                Err(TryRecvError::Disconnected) => break,
            }
        }
        if status.abort.load(Ordering::Relaxed) {
            fail_all(&mut engine, &mut clients, ApiError::ShuttingDown);
        }
        // Clients that went away (a dropped stream, a closed connection) stop here.
        clients.retain(|&id, client| {
            if client.events.is_closed() {
                engine.cancel(id);
                metrics::request_outcome("cancelled");
                false
            } else {
                true
            }
        });
        if !engine.is_idle() {
            let step_start = Instant::now();
            match engine.step() {
                Ok(events) => {
                    metrics::step(engine.last_step(), step_start.elapsed());
                    dispatch(events, &mut clients, &mut throughput);
                }
                Err(error) => {
                    // The batch is in an unknown state: fail every request, keep serving.
                    tracing::error!(%error, "engine step failed");
                    fail_all(
                        &mut engine,
                        &mut clients,
                        ApiError::Internal(error.to_string()),
                    );
                }
            }
        }
        status.publish(&engine);
        throughput.report(&engine);
    }
    Ok(())
}

/// One line per finished request: how it ended, its tokens and its time.
fn log_finished(id: RequestId, output: &GenerateOutput, latency: Duration) {
    let stats = &output.stats;
    tracing::info!(
        "request {id}: finish={}, {} prompt tokens ({} cached) + {} generated in {:.2} s, \
         {} rounds, tau {:.2}",
        match output.finish_reason {
            grove_core::FinishReason::Stop => "stop",
            grove_core::FinishReason::Length => "length",
        },
        stats.prompt_tokens,
        stats.cached_tokens,
        stats.new_tokens,
        latency.as_secs_f64(),
        stats.rounds,
        stats.mean_accept_length
    );
}

/// Ends every request with `error` (their pages return).
fn fail_all(engine: &mut Engine<'_>, clients: &mut HashMap<RequestId, Client>, error: ApiError) {
    for (id, client) in clients.drain() {
        engine.cancel(id);
        metrics::request_outcome(error.outcome());
        let _ = client.events.send(WorkerEvent::Failed(error.clone()));
    }
}

/// Marks the engine alive while the loop runs; cleared however it ends (a panic included), so
/// `/health` turns 503 and new requests get a 500 instead of waiting forever.
struct Alive<'s>(&'s EngineStatus);

impl<'s> Alive<'s> {
    fn set(status: &'s EngineStatus) -> Self {
        status.alive.store(true, Ordering::Relaxed);
        Self(status)
    }
}

impl Drop for Alive<'_> {
    fn drop(&mut self) {
        self.0.alive.store(false, Ordering::Relaxed);
    }
}

fn submit(
    engine: &mut Engine<'_>,
    clients: &mut HashMap<RequestId, Client>,
    submission: Submission,
    settings: &EngineSettings,
) {
    let reject = |error: ApiError| {
        metrics::request_outcome(error.outcome());
        let _ = submission.events.send(WorkerEvent::Rejected(error));
    };
    // A request that can never run is refused as invalid (400), whatever the queue holds:
    // a 429 would have the client retry it forever.
    if let Err(error) = engine.check(&submission.request) {
        return reject(error.into());
    }
    // Arrivals wait until the next step admits them: those that step will start (free
    // running slots) do not count against the queue's limit.
    if engine.waiting() >= settings.max_queued + engine.free_running_slots() {
        return reject(ApiError::QueueFull {
            limit: settings.max_queued,
        });
    }
    let prompt_tokens = submission.request.prompt.len();
    match engine.submit(submission.request) {
        Ok(id) => {
            let _ = submission.events.send(WorkerEvent::Accepted);
            clients.insert(
                id,
                Client {
                    events: submission.events,
                    received: submission.received,
                    prompt_tokens,
                    last_tokens: None,
                },
            );
        }
        Err(error) => reject(error.into()),
    }
}

/// The periodic throughput line, as vLLM and llama-server print one: tokens prefilled and
/// generated since the last line, and the engine's state.
struct Throughput {
    since: Instant,
    prompt: usize,
    generated: usize,
}

impl Throughput {
    const INTERVAL: Duration = Duration::from_secs(10);

    fn new() -> Self {
        Self {
            since: Instant::now(),
            prompt: 0,
            generated: 0,
        }
    }

    /// Logs the line when the interval has passed and anything ran since the last.
    fn report(&mut self, engine: &Engine<'_>) {
        let elapsed = self.since.elapsed();
        if elapsed < Self::INTERVAL {
            return;
        }
        if self.prompt + self.generated > 0 || !engine.is_idle() {
            let seconds = elapsed.as_secs_f64();
            let total = engine.total_pages().max(1);
            tracing::info!(
                "throughput: prompt {:.1} tok/s, generation {:.1} tok/s, running {}, waiting {}, \
                 KV {:.1}% used ({} cached pages)",
                self.prompt as f64 / seconds,
                self.generated as f64 / seconds,
                engine.running(),
                engine.waiting(),
                100.0 * (total - engine.free_pages().min(total)) as f64 / total as f64,
                engine.cached_pages()
            );
        }
        *self = Self::new();
    }
}

fn dispatch(
    events: Vec<EngineEvent>,
    clients: &mut HashMap<RequestId, Client>,
    throughput: &mut Throughput,
) {
    let now = Instant::now();
    for event in events {
        match event {
            EngineEvent::Started { id } => {
                if let Some(client) = clients.get(&id) {
                    metrics::queue_time(now - client.received);
                    throughput.prompt += client.prompt_tokens;
                }
            }
            EngineEvent::Tokens {
                id,
                tokens,
                logprobs,
            } => {
                let Some(client) = clients.get_mut(&id) else {
                    continue;
                };
                // Latencies as a streaming client sees them: a round's accepted tokens arrive
                // together, so the inter-token gap is per step, not per token.
                match client.last_tokens {
                    None => metrics::time_to_first_token(now - client.received),
                    Some(last) => metrics::inter_token_latency(now - last),
                }
                client.last_tokens = Some(now);
                throughput.generated += tokens.len();
                // A send fails only when the client is gone; it is cancelled before the next step.
                let _ = client.events.send(WorkerEvent::Tokens(tokens, logprobs));
            }
            EngineEvent::Text { id, text } => {
                if let Some(client) = clients.get(&id) {
                    let _ = client.events.send(WorkerEvent::Text(text));
                }
            }
            EngineEvent::Finished { id, output } => {
                let Some(client) = clients.remove(&id) else {
                    continue;
                };
                metrics::finished(&output, now - client.received);
                log_finished(id, &output, now - client.received);
                let _ = client.events.send(WorkerEvent::Finished(output));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reader never sees a step's request counts beside another step's page counts: the
    /// engine thread alternates a busy step (a request holding 6 of 10 pages) with an idle
    /// one (all 10 back), and every idle snapshot read has all its pages.
    #[test]
    fn counts_are_read_as_one_step_published_them() {
        let status = Arc::new(EngineStatus::default());
        let busy = EngineCounts {
            running: 1,
            free_pages: 4,
            total_pages: 10,
            ..EngineCounts::default()
        };
        let idle = EngineCounts {
            free_pages: 7,
            cached_pages: 3,
            total_pages: 10,
            ..EngineCounts::default()
        };
        let writer = {
            let status = Arc::clone(&status);
            std::thread::spawn(move || {
                for i in 0..200_000 {
                    status.set_counts(if i % 2 == 0 { busy } else { idle });
                }
            })
        };
        while !writer.is_finished() {
            let counts = status.counts();
            if counts.running == 0 && counts.total_pages > 0 {
                assert_eq!(counts, idle);
            }
        }
        writer.join().unwrap();
        assert_eq!(status.counts(), idle, "the last snapshot published");
    }
}
