//! Generation of one sequence. Prefill runs in chunks; then each round runs the target on the
//! anchor (the last chosen token, not yet in KV), commits it and chooses the next one. A round
//! emits the tokens it accepted; plain decoding accepts exactly one per round, speculative
//! methods more.

use std::time::Instant;

use grove_core::{FinishReason, SamplingParams, StopCondition, TokenId, ValidationError};
use grove_kv::{KvStore, PagePool, PageTable};
use grove_model::{ForwardBatch, LogitRows, Model, Segment, TextTokenizer};

use crate::detokenizer::Detokenizer;
use crate::sampler::Sampler;
use crate::stop_strings::{StopScan, StopStrings};
use crate::EngineError;

/// Prompt rows per prefill forward: bounds activation memory on long prompts.
pub const DEFAULT_PREFILL_CHUNK: usize = 512;

/// Settings of the engine, as opposed to those of a request.
#[derive(Debug, Clone)]
pub struct GeneratorOptions {
    pub page_size: usize,
    pub prefill_chunk: usize,
}

impl Default for GeneratorOptions {
    fn default() -> Self {
        Self {
            page_size: 1,
            prefill_chunk: DEFAULT_PREFILL_CHUNK,
        }
    }
}

#[derive(Debug, Clone)]
pub struct GenerateRequest {
    pub prompt: Vec<TokenId>,
    pub sampling: SamplingParams,
    pub stop: StopCondition,
}

/// Per-request statistics, in the JSON shape `grove generate --format json` prints.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct GenerateStats {
    pub prompt_tokens: usize,
    pub new_tokens: usize,
    /// Rounds after prefill (the prefill chooses the first token).
    pub rounds: usize,
    /// Tokens each round emitted: accepted drafts + the bonus token (1 without speculation).
    pub accept_lengths: Vec<usize>,
    pub mean_accept_length: f64,
    pub prefill_tokens_per_s: f64,
    pub decode_tokens_per_s: f64,
    pub t_prefill_us: u64,
    pub t_decode_us: u64,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct GenerateOutput {
    /// New tokens only; a stop token that ended generation is included, never rendered.
    pub token_ids: Vec<TokenId>,
    pub text: String,
    pub finish_reason: FinishReason,
    pub stats: GenerateStats,
}

/// Runs requests against one model. The KV pool is sized per request and freed with it.
pub struct Generator<'a> {
    model: &'a dyn Model,
    tokenizer: Option<&'a TextTokenizer>,
    options: GeneratorOptions,
}

impl<'a> Generator<'a> {
    pub fn new(
        model: &'a dyn Model,
        tokenizer: Option<&'a TextTokenizer>,
        options: GeneratorOptions,
    ) -> Self {
        Self {
            model,
            tokenizer,
            options,
        }
    }

    fn validate(&self, request: &GenerateRequest) -> Result<(), ValidationError> {
        let config = self.model.config();
        if request.prompt.is_empty() {
            return Err(ValidationError::Empty { field: "prompt" });
        }
        if let Some(&id) = request
            .prompt
            .iter()
            .find(|&&id| id as usize >= config.vocab_size)
        {
            return Err(ValidationError::TokenOutOfVocab {
                field: "prompt",
                id: id.into(),
                vocab_size: config.vocab_size,
            });
        }
        if request.stop.max_new_tokens == 0 {
            return Err(ValidationError::OutOfRange {
                field: "max_new_tokens",
                limit: "at least 1",
                value: "0".into(),
            });
        }
        if request.prompt.len() + request.stop.max_new_tokens > config.max_position_embeddings {
            return Err(ValidationError::ContextOverflow {
                prompt_tokens: request.prompt.len(),
                max_new_tokens: request.stop.max_new_tokens,
                context: config.max_position_embeddings,
            });
        }
        if self.options.page_size == 0 {
            return Err(ValidationError::OutOfRange {
                field: "page_size",
                limit: "at least 1",
                value: "0".into(),
            });
        }
        request.sampling.validate()
    }

    /// Generates until a stop token, a stop string or `max_new_tokens`. `on_text` receives
    /// each piece of text as soon as it is final.
    pub fn generate(
        &self,
        request: &GenerateRequest,
        mut on_text: impl FnMut(&str),
    ) -> Result<GenerateOutput, EngineError> {
        self.validate(request)?;
        let prompt_len = request.prompt.len();
        let max_len = prompt_len + request.stop.max_new_tokens;
        let pool = PagePool::new(
            max_len.div_ceil(self.options.page_size),
            self.options.page_size,
        )?;
        let mut kv = self.model.new_kv_store(pool.num_slots());
        let mut table = pool.new_table();
        let mut sampler = Sampler::new(request.sampling.clone());
        let mut emitter = Emitter::new(self.tokenizer, &request.stop);

        let prefill_start = Instant::now();
        let last_logits = self.prefill(&request.prompt, &mut table, &mut kv)?;
        let mut anchor = sampler.sample(&last_logits);
        let t_prefill = prefill_start.elapsed();

        let decode_start = Instant::now();
        let mut accept_lengths = Vec::new();
        let mut finish = emitter.emit(anchor, &mut on_text)?;
        while finish.is_none() {
            // One round: the anchor enters KV and the target chooses the next token.
            table.reserve(1)?;
            let tokens = [anchor];
            let positions = [table.len()];
            let segment = Segment::causal(&table, &tokens, &positions, LogitRows::Last);
            let output = self.model.forward(
                &ForwardBatch {
                    segments: vec![segment],
                    taps: &[],
                },
                &mut kv,
            )?;
            table.append(1);
            anchor = sampler.sample(
                &output
                    .logits_row(0)
                    .map_err(grove_model::ModelError::from)?,
            );
            accept_lengths.push(1);
            finish = emitter.emit(anchor, &mut on_text)?;
        }
        let t_decode = decode_start.elapsed();
        let finish_reason = finish.expect("loop ends with a reason");
        let (token_ids, text) = emitter.finish(&mut on_text)?;

        let seconds = |d: std::time::Duration| d.as_secs_f64().max(1e-9);
        let emitted_in_rounds: usize = accept_lengths.iter().sum();
        let stats = GenerateStats {
            prompt_tokens: prompt_len,
            new_tokens: token_ids.len(),
            rounds: accept_lengths.len(),
            mean_accept_length: if accept_lengths.is_empty() {
                0.0
            } else {
                emitted_in_rounds as f64 / accept_lengths.len() as f64
            },
            accept_lengths,
            prefill_tokens_per_s: prompt_len as f64 / seconds(t_prefill),
            decode_tokens_per_s: if emitted_in_rounds == 0 {
                0.0
            } else {
                emitted_in_rounds as f64 / seconds(t_decode)
            },
            t_prefill_us: t_prefill.as_micros() as u64,
            t_decode_us: t_decode.as_micros() as u64,
        };
        Ok(GenerateOutput {
            token_ids,
            text,
            finish_reason,
            stats,
        })
    }

    /// Runs the prompt through the model in chunks; returns the last row's logits.
    fn prefill(
        &self,
        prompt: &[TokenId],
        table: &mut PageTable,
        kv: &mut KvStore,
    ) -> Result<Vec<f32>, EngineError> {
        let mut last_logits = Vec::new();
        for chunk in prompt.chunks(self.options.prefill_chunk.max(1)) {
            table.reserve(chunk.len())?;
            let positions: Vec<usize> = (table.len()..table.len() + chunk.len()).collect();
            let segment = Segment::causal(table, chunk, &positions, LogitRows::Last);
            let output = self.model.forward(
                &ForwardBatch {
                    segments: vec![segment],
                    taps: &[],
                },
                kv,
            )?;
            table.append(chunk.len());
            last_logits = output
                .logits_row(0)
                .map_err(grove_model::ModelError::from)?;
        }
        Ok(last_logits)
    }
}

/// Turns chosen tokens into output: the stop checks, incremental text and stop strings.
struct Emitter<'a> {
    tokenizer: Option<&'a TextTokenizer>,
    stop: &'a StopCondition,
    detokenizer: Detokenizer,
    stop_strings: StopStrings,
    token_ids: Vec<TokenId>,
    text: String,
    /// A stop string matched: nothing after it is ever released.
    stopped_by_string: bool,
}

impl<'a> Emitter<'a> {
    fn new(tokenizer: Option<&'a TextTokenizer>, stop: &'a StopCondition) -> Self {
        Self {
            tokenizer,
            stop,
            detokenizer: Detokenizer::new(),
            stop_strings: StopStrings::new(stop.stop_strings.clone()),
            token_ids: Vec::new(),
            text: String::new(),
            stopped_by_string: false,
        }
    }

    /// Records one token; returns why generation ends, if it does.
    fn emit(
        &mut self,
        token: TokenId,
        on_text: &mut impl FnMut(&str),
    ) -> Result<Option<FinishReason>, EngineError> {
        self.token_ids.push(token);
        if self.stop.is_stop_token(token) {
            return Ok(Some(FinishReason::Stop));
        }
        if let Some(tokenizer) = self.tokenizer {
            let piece = self.detokenizer.push(tokenizer, token)?;
            match self.stop_strings.push(&piece) {
                StopScan::Continue(text) => self.release(&text, on_text),
                StopScan::Stopped(text) => {
                    self.release(&text, on_text);
                    self.stopped_by_string = true;
                    return Ok(Some(FinishReason::Stop));
                }
            }
        }
        Ok((self.token_ids.len() >= self.stop.max_new_tokens).then_some(FinishReason::Length))
    }

    fn release(&mut self, text: &str, on_text: &mut impl FnMut(&str)) {
        if !text.is_empty() {
            self.text.push_str(text);
            on_text(text);
        }
    }

    /// Releases held-back text (unless a stop string ended generation) and returns the output.
    fn finish(
        mut self,
        on_text: &mut impl FnMut(&str),
    ) -> Result<(Vec<TokenId>, String), EngineError> {
        if let Some(tokenizer) = self.tokenizer.filter(|_| !self.stopped_by_string) {
            let tail = self.detokenizer.flush(tokenizer)?;
            let text = match self.stop_strings.push(&tail) {
                StopScan::Continue(text) => text + &self.stop_strings.flush(),
                StopScan::Stopped(text) => text,
            };
            self.release(&text, on_text);
        }
        Ok((self.token_ids, self.text))
    }
}
