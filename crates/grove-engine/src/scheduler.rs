//! The engine: one owner for the KV pools, the waiting queue and the running sequences, driven
//! one step at a time (continuous batching).
//!
//! Each step: admit waiting sequences in order while the pool has room for their prefill and
//! first verify (`max_running` at most; their pages are reserved at once); run one chunk of the
//! admitted prompts (chunked prefill, interleaved: with sequences decoding, the chunk is sized
//! by the measured prefill rate so that their next tokens wait about `prefill_step`, not for
//! the whole prompt); reserve every running sequence's next round, oldest first, preempting
//! the newest when the pool runs out (its pages return; it waits at the front of the queue and
//! is prefilled again with everything it committed, so its output is unchanged); run one
//! batched round; report text and finished requests. Finished or cancelled sequences free their
//! pages at once.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use grove_core::{TokenId, ValidationError};
use grove_kv::{PrefixCache, PrefixCacheStats};
use grove_spec::{NgramCorpus, MAX_CORPUS_CAPACITY};

use crate::budget::{measure_costs, AutoBudget};
use crate::logprobs::TokenLogprob;
use crate::request::{GenerateOutput, GenerateRequest};
use crate::runner::{RoundRunner, StepTimings};
use crate::sequence::{Pools, Sequence};
use crate::speculation;
use crate::EngineError;

/// Identifies a request inside one [`Engine`].
pub type RequestId = u64;

/// What a step produced.
#[derive(Debug)]
pub enum EngineEvent {
    /// A request left the queue: its first prefill began (not sent again after a preemption).
    Started { id: RequestId },
    /// Tokens a step chose for a request (several per round when drafts are accepted); a stop
    /// token that ends the request is included.
    Tokens {
        id: RequestId,
        tokens: Vec<TokenId>,
        /// Their log-probabilities, when the request asked (else empty).
        logprobs: Vec<TokenLogprob>,
    },
    /// Text that became final for a request.
    Text { id: RequestId, text: String },
    /// A request ended; its pages are back in the pool.
    Finished {
        id: RequestId,
        output: Box<GenerateOutput>,
    },
}

/// Limits of one engine.
#[derive(Debug, Clone)]
pub struct EngineLimits {
    /// KV capacity in tokens (rounded up to whole pages).
    pub max_total_tokens: usize,
    /// Sequences decoding at once.
    pub max_running: usize,
    /// Keep committed pages for later requests that start with the same tokens (SGLang's radix
    /// cache; `--disable-radix-cache` turns it off).
    pub prefix_cache: bool,
    /// With sequences decoding, how long one step's prefill may hold them up: prompts are
    /// cut into chunks sized by the measured prefill rate (`None`: whole `prefill_chunk`s,
    /// one per step).
    pub prefill_step: Option<Duration>,
    /// Tokens of finished requests' texts kept for lookup drafts to draw on (SGLang's
    /// `--speculative-ngram-capacity`; 0: lookups read only the request's own text). `None`:
    /// [`DEFAULT_NGRAM_CORPUS`] when requests that do not choose draft by lookup, else 0.
    pub ngram_corpus: Option<usize>,
    /// Texts the server was given to draft from (SGLang's
    /// `--speculative-ngram-external-corpus-path`), never dropped; it must match as the
    /// engine's lookups do.
    pub external_corpus: Option<Arc<NgramCorpus>>,
}

/// The corpus a server keeps when it drafts by lookup and its flags do not say: a million
/// tokens (12 MB of tokens and links, two 8 MB tables), hundreds of earlier answers.
pub const DEFAULT_NGRAM_CORPUS: usize = 1 << 20;

/// The shortest prefill chunk a step runs (and the multiple longer time-sized chunks round to).
pub const MIN_PREFILL_CHUNK: usize = 16;

/// Owns the round runner, the KV pools and every sequence; `Generator::engine` makes one.
pub struct Engine<'a> {
    runner: RoundRunner<'a>,
    limits: EngineLimits,
    pools: Pools,
    waiting: VecDeque<Sequence<'a>>,
    /// Admitted sequences whose prompt is still being prefilled, a chunk per step.
    prefilling: VecDeque<Sequence<'a>>,
    running: Vec<Sequence<'a>>,
    /// Measured prefill cost, seconds per token (`None` until a chunk ran).
    prefill_seconds_per_token: Option<f64>,
    next_id: RequestId,
    preemptions: u64,
    last_step: StepTimings,
}

impl<'a> Engine<'a> {
    pub(crate) fn new(runner: RoundRunner<'a>, limits: EngineLimits) -> Result<Self, EngineError> {
        let pages = limits
            .max_total_tokens
            .div_ceil(runner.options.page_size.max(1));
        let corpus = limits.ngram_corpus.unwrap_or(if runner.drafts_by_lookup() {
            DEFAULT_NGRAM_CORPUS
        } else {
            0
        });
        if corpus > MAX_CORPUS_CAPACITY {
            return Err(ValidationError::OutOfRange {
                field: "speculative_ngram_capacity",
                limit: "at most 2^31 tokens",
                value: corpus.to_string(),
            }
            .into());
        }
        let lookup = runner.lookup_config();
        if let Some(external) = &limits.external_corpus {
            if external.config() != lookup {
                return Err(ValidationError::OutOfRange {
                    field: "speculative_ngram_external_corpus_path",
                    limit: "a corpus indexed for the engine's ngram match lengths",
                    value: format!("{:?} against {lookup:?}", external.config()),
                }
                .into());
            }
        }
        let mut pools = runner.pools(pages, limits.max_running.max(1), limits.prefix_cache)?;
        if corpus > 0 {
            pools.corpus = Some(NgramCorpus::new(corpus, lookup));
        }
        pools.external_corpus = limits.external_corpus.clone();
        Ok(Self {
            runner,
            limits,
            pools,
            waiting: VecDeque::new(),
            prefilling: VecDeque::new(),
            running: Vec::new(),
            prefill_seconds_per_token: None,
            next_id: 0,
            preemptions: 0,
            last_step: StepTimings::default(),
        })
    }

    /// Every check `submit` makes before queueing `request`: a server refuses a request that
    /// can never run as invalid, before it looks at its queue.
    pub fn check(&self, request: &GenerateRequest) -> Result<(), EngineError> {
        self.method_for(request).map(drop)
    }

    /// The checks of [`Engine::check`], and the method the request runs.
    fn method_for(
        &self,
        request: &GenerateRequest,
    ) -> Result<(speculation::Method, bool), EngineError> {
        let (method, auto) = self.runner.validate(request)?;
        let needed =
            speculation::kv_need(request.prompt.len() + request.stop.max_new_tokens, method);
        let capacity = self.pools.pool.num_slots();
        if needed > capacity {
            return Err(ValidationError::KvOverflow {
                prompt_tokens: request.prompt.len(),
                max_new_tokens: request.stop.max_new_tokens,
                needed,
                capacity,
            }
            .into());
        }
        Ok((method, auto))
    }

    /// Sequences the next step can start beside those running (`max_running` minus running).
    pub fn free_running_slots(&self) -> usize {
        self.limits.max_running.saturating_sub(self.running())
    }

    /// Validates and queues a request.
    pub fn submit(&mut self, request: GenerateRequest) -> Result<RequestId, EngineError> {
        let method = self.method_for(&request)?;
        let id = self.next_id;
        self.next_id += 1;
        let sequence = self
            .runner
            .sequence(id, Arc::new(request), method, &self.pools);
        self.waiting.push_back(sequence);
        Ok(id)
    }

    /// Drops a request wherever it is; its pages return at once (those of its committed
    /// tokens to the prefix cache). False if it is unknown.
    pub fn cancel(&mut self, id: RequestId) -> bool {
        let before = self.waiting.len() + self.running();
        self.waiting.retain(|s| s.id != id);
        // A prompt cut off mid-prefill offers the whole pages it ran.
        let pools = &mut self.pools;
        self.prefilling.retain(|s| {
            if s.id == id {
                s.cache_prefix(pools);
            }
            s.id != id
        });
        self.running.retain(|s| {
            if s.id == id {
                s.cache_prefix(pools);
            }
            s.id != id
        });
        before != self.waiting.len() + self.running()
    }

    pub fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.running.is_empty() && self.prefilling.is_empty()
    }

    pub fn free_pages(&self) -> usize {
        self.pools.pool.free_pages()
    }

    pub fn total_pages(&self) -> usize {
        self.pools.pool.total_pages()
    }

    /// Target pages the prefix cache holds (some may be shared by running requests too).
    pub fn cached_pages(&self) -> usize {
        self.pools
            .prefix
            .as_ref()
            .map_or(0, PrefixCache::cached_pages)
    }

    /// The prefix cache's counters (`None`: the cache is off).
    pub fn prefix_stats(&self) -> Option<PrefixCacheStats> {
        self.pools.prefix.as_ref().map(PrefixCache::stats)
    }

    /// Tokens the lookup corpus holds (0 without one).
    pub fn corpus_tokens(&self) -> usize {
        self.pools.corpus.as_ref().map_or(0, NgramCorpus::len)
    }

    /// Tokens the lookup corpus may hold (0 without one).
    pub fn corpus_capacity(&self) -> usize {
        self.pools.corpus.as_ref().map_or(0, NgramCorpus::capacity)
    }

    /// Drops every cached page no request holds (they return to the free list).
    pub fn clear_prefix_cache(&mut self) -> usize {
        self.pools.prefix.as_mut().map_or(0, PrefixCache::clear)
    }

    /// Sequences preempted so far.
    pub fn preemptions(&self) -> u64 {
        self.preemptions
    }

    /// Sequences admitted: decoding, or with their prompt still prefilling.
    pub fn running(&self) -> usize {
        self.running.len() + self.prefilling.len()
    }

    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// What the last step's batched round did (empty if it ran none).
    pub fn last_step(&self) -> &StepTimings {
        &self.last_step
    }

    /// Admits, reserves (preempting when needed), runs one batched round and reports.
    pub fn step(&mut self) -> Result<Vec<EngineEvent>, EngineError> {
        let mut events = Vec::new();
        // Before admission (the pool is emptiest) and the prefill: the wait counts toward the
        // first token, not the decoding speed.
        self.measure_costs()?;
        self.admit(&mut events)?;
        self.prefill_step(&mut events)?;
        // A prefill can end a request at once (its first token stops it).
        self.collect_finished(&mut events)?;
        self.reserve_rounds();
        self.last_step = StepTimings::default();
        if !self.running.is_empty() {
            let mut batch: Vec<&mut Sequence<'a>> = self.running.iter_mut().collect();
            let mut on_text = |id: RequestId, text: &str| {
                events.push(EngineEvent::Text {
                    id,
                    text: text.to_owned(),
                })
            };
            let result = self
                .runner
                .step(&mut batch, &mut self.pools, &mut on_text)?;
            for (sequence, tokens) in self.running.iter().zip(result.emitted) {
                events.push(EngineEvent::Tokens {
                    id: sequence.id,
                    logprobs: sequence.last_logprobs(tokens.len()),
                    tokens,
                });
            }
            self.last_step = result.timings;
        }
        self.collect_finished(&mut events)?;
        Ok(events)
    }

    /// Measures the cost table before the first round that chooses its budget (once per
    /// generator: its engines share the table).
    fn measure_costs(&mut self) -> Result<(), EngineError> {
        let mut sequences = self.running.iter().chain(&self.prefilling);
        if !sequences.any(|s| s.auto) && !self.waiting.iter().any(|s| s.auto) {
            return Ok(());
        }
        let mut auto = AutoBudget::lock(&self.runner.auto);
        if !auto.costs.is_empty() {
            return Ok(());
        }
        // A request may ask for more rows than the server's default (lookup on a plain server).
        let queued = self
            .running
            .iter()
            .chain(&self.prefilling)
            .chain(&self.waiting);
        let max_rows = queued
            .map(|s| s.method.verify_rows())
            .chain([self.runner.default_method().verify_rows()])
            .max()
            .unwrap_or(1);
        measure_costs(&self.runner, &mut self.pools, max_rows, &mut auto.costs)
    }

    /// Admits waiting sequences, in order, while they fit: a cached prefix of a sequence's
    /// tokens is shared, not prefilled, and the pages it still needs (beside those the running
    /// sequences' next rounds take) must be free or evictable. An admitted sequence holds the
    /// pages of its whole prefill and first round, and waits in `prefilling`.
    fn admit(&mut self, events: &mut Vec<EngineEvent>) -> Result<(), EngineError> {
        let rounds: usize = self
            .running
            .iter()
            .map(|s| self.runner.round_pages(s).0)
            .sum();
        while self.running() < self.limits.max_running.max(1) {
            let Some(front) = self.waiting.front_mut() else {
                break;
            };
            let hit = front.share_cached_prefix(&mut self.pools);
            let (target, draft) = self.runner.prefill_pages(front);
            // Counting the evictable pages walks the whole cache: only when the free ones fall
            // short (and so that nothing is evicted for a request that cannot start anyway).
            let free = self.pools.pool.free_pages();
            let need = target + rounds;
            if (need > free && need > free + self.pools.evictable_pages())
                || !self.pools.make_room(need, draft)
                || self.runner.reserve_prefill(front).is_err()
            {
                front.release(&self.pools);
                break;
            }
            let mut sequence = self.waiting.pop_front().expect("front exists");
            if let Some(cache) = self.pools.prefix.as_mut() {
                cache.record_lookup(sequence.prefill_need() - sequence.method.verify_rows(), hit);
            }
            if !sequence.started {
                sequence.started = true;
                events.push(EngineEvent::Started { id: sequence.id });
            }
            self.prefilling.push_back(sequence);
        }
        Ok(())
    }

    /// Prompt tokens this step may prefill: a whole chunk when nothing else runs; with
    /// sequences decoding beside it, as many as take about `limits.prefill_step` at the rate
    /// measured so far, so that their next tokens are not held up for a long prompt.
    fn prefill_budget(&self) -> usize {
        let chunk = self.runner.options.prefill_chunk.max(1);
        match (self.limits.prefill_step, self.running.is_empty()) {
            (Some(step), false) => {
                let tokens = match self.prefill_seconds_per_token {
                    Some(rate) => (step.as_secs_f64() / rate) as usize,
                    None => MIN_PREFILL_CHUNK,
                };
                // Whole multiples of a kernel tile, never past the configured chunk (which
                // may be shorter than a tile).
                let tokens = tokens.max(MIN_PREFILL_CHUNK);
                (tokens - tokens % MIN_PREFILL_CHUNK).min(chunk)
            }
            _ => chunk,
        }
    }

    /// Runs one step's share of the admitted prompts, oldest first; a sequence whose prefill
    /// ends emits its first token and runs from this step's round on.
    fn prefill_step(&mut self, events: &mut Vec<EngineEvent>) -> Result<(), EngineError> {
        let mut budget = self.prefill_budget();
        while budget > 0 {
            let Some(sequence) = self.prefilling.front_mut() else {
                break;
            };
            let id = sequence.id;
            let start = Instant::now();
            let progress = self.runner.prefill_chunk(
                sequence,
                &mut self.pools,
                budget,
                &mut |text: &str| {
                    events.push(EngineEvent::Text {
                        id,
                        text: text.to_owned(),
                    })
                },
            )?;
            let first_logprobs = sequence.last_logprobs(1);
            self.measure_prefill(progress.tokens, start.elapsed());
            budget = budget.saturating_sub(progress.tokens);
            if let Some(token) = progress.first {
                events.push(EngineEvent::Tokens {
                    id,
                    tokens: vec![token],
                    logprobs: first_logprobs,
                });
            }
            if progress.done {
                let sequence = self.prefilling.pop_front().expect("front exists");
                // Requests that arrive while this one runs share its prompt already.
                sequence.cache_prefix(&mut self.pools);
                self.running.push(sequence);
            }
        }
        Ok(())
    }

    /// Folds a chunk's time into the prefill rate (seconds per token, recent chunks weighing
    /// most: the rate falls as chunks grow and rises with the context they attend to).
    fn measure_prefill(&mut self, tokens: usize, elapsed: Duration) {
        let rate = elapsed.as_secs_f64() / tokens.max(1) as f64;
        self.prefill_seconds_per_token = Some(match self.prefill_seconds_per_token {
            Some(old) => 0.5 * old + 0.5 * rate,
            None => rate,
        });
    }

    /// Reserves every running sequence's next round, oldest first; when the pool is short,
    /// cached prefixes nothing holds are evicted first, then the newest running sequence is
    /// preempted (its committed pages go to the cache) and waits at the front of the queue.
    fn reserve_rounds(&mut self) {
        let mut index = 0;
        while index < self.running.len() {
            if self.runner.reserve_round(&mut self.running[index]).is_ok() {
                index += 1;
                continue;
            }
            let (target, draft) = self.runner.round_pages(&self.running[index]);
            if self.pools.evictable_pages() > 0 && self.pools.make_room(target, draft) {
                continue;
            }
            // The newest first: a prompt still prefilling, then the newest running sequence.
            let mut newest = match self.prefilling.pop_back() {
                Some(sequence) => sequence,
                None => self
                    .running
                    .pop()
                    .expect("the sequence being reserved is running"),
            };
            newest.cache_prefix(&mut self.pools);
            newest.release(&self.pools);
            self.preemptions += 1;
            self.waiting.push_front(newest);
        }
    }

    /// Reports the sequences that finished and drops them (their pages return).
    fn collect_finished(&mut self, events: &mut Vec<EngineEvent>) -> Result<(), EngineError> {
        let (finished, running): (Vec<_>, Vec<_>) = std::mem::take(&mut self.running)
            .into_iter()
            .partition(|s| s.finish.is_some());
        self.running = running;
        for sequence in finished {
            sequence.cache_prefix(&mut self.pools);
            if let Some(corpus) = self.pools.corpus.as_mut() {
                corpus.insert(&sequence.corpus_text(corpus.config().max_match));
            }
            let id = sequence.id;
            let output = sequence.into_output(&mut |text: &str| {
                events.push(EngineEvent::Text {
                    id,
                    text: text.to_owned(),
                })
            })?;
            events.push(EngineEvent::Finished {
                id,
                output: Box::new(output),
            });
        }
        Ok(())
    }
}
