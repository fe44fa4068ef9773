//! The answer to one request, from the engine's events for each of its `n` choices (each an
//! engine request of its own): the JSON response once every choice finished, or the SSE
//! stream, the choices' chunks interleaved as their steps come, each tagged with its index.

use std::convert::Infallible;
use std::sync::Arc;

use axum::response::sse::Event;
use futures_util::stream::{self, BoxStream, Stream, StreamExt};
use grove_engine::{GenerateOutput, TokenLogprob};
use grove_model::TextTokenizer;
use serde_json::{json, Value};
use tokio::sync::mpsc::UnboundedReceiver;

use crate::error::ApiError;
use crate::logprobs::TokenTexts;
use crate::protocol::{CompletionTokensDetails, PromptTokensDetails, SpeculativeUsage, Usage};
use crate::reasoning::{ReasoningParser, Split, Splitter};
use crate::tools::{ToolCall, ToolChoice, Tools};
use crate::validate::Echo;
use crate::worker::WorkerEvent;

/// Which OpenAI endpoint a response is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Endpoint {
    Completions,
    Chat,
}

/// The fields every response object of one request shares, and what it asked to see.
pub(crate) struct Reply {
    pub id: String,
    pub created: u64,
    pub model: String,
    pub endpoint: Endpoint,
    /// For the tokens' texts in `logprobs`.
    pub tokenizer: Option<Arc<TextTokenizer>>,
    /// The request asked for log-probabilities.
    pub logprobs: bool,
    /// The request asked for the token ids (vLLM's `return_token_ids`).
    pub token_ids: bool,
    /// Completions' `echo`, one per prompt (never with a stream).
    pub echo: Vec<Echo>,
    /// Choices of each prompt (`n`): output `i` is prompt `i / per_prompt`'s.
    pub per_prompt: usize,
    /// Chat's tools: calls are read from the text.
    pub tools: Option<Tools>,
    /// Chat with `--reasoning-parser`: the reasoning is answered apart from the content.
    pub reasoning: Option<ReasoningParser>,
}

impl Reply {
    fn object(&self, chunk: bool) -> &'static str {
        match (self.endpoint, chunk) {
            (Endpoint::Completions, _) => "text_completion",
            (Endpoint::Chat, false) => "chat.completion",
            (Endpoint::Chat, true) => "chat.completion.chunk",
        }
    }

    fn envelope(&self, chunk: bool, choices: Value, usage: Option<Usage>) -> Value {
        json!({
            "id": self.id,
            "object": self.object(chunk),
            "created": self.created,
            "model": self.model,
            "choices": choices,
            "usage": usage,
        })
    }

    /// The non-streaming response: one choice per output, in order.
    pub fn complete(&self, outputs: &[GenerateOutput]) -> Value {
        let choices: Vec<Value> = outputs
            .iter()
            .enumerate()
            .map(|(index, output)| self.choice(index, output))
            .collect();
        let mut usage = self.usage(outputs);
        if self.echo.first().is_some_and(|e| e.without_completion) {
            // Only the prompt was asked for: the token generated alongside is not answered.
            usage.completion_tokens = 0;
            usage.total_tokens = usage.prompt_tokens;
        }
        self.envelope(false, json!(choices), Some(usage))
    }

    fn choice(&self, index: usize, output: &GenerateOutput) -> Value {
        if let Some(echo) = self.echo.get(index / self.per_prompt) {
            return self.echoed(index, echo, output);
        }
        let mut choice = match self.endpoint {
            Endpoint::Completions => json!({
                "index": index, "text": output.text, "logprobs": null,
                "finish_reason": output.finish_reason,
            }),
            Endpoint::Chat => {
                let split = self.split(&output.text);
                let calls = self.tools.as_ref().and_then(|t| t.parse(&split.content));
                let (mut message, finish_reason) = match calls {
                    Some((content, calls)) => (
                        json!({"role": "assistant", "content": content,
                               "tool_calls": self.tool_calls(index, &calls)}),
                        self.finish_reason(output, true),
                    ),
                    None => (
                        json!({"role": "assistant", "content": split.content}),
                        self.finish_reason(output, false),
                    ),
                };
                if self.reasoning.is_some() {
                    let reasoning = Some(split.reasoning).filter(|r| !r.is_empty());
                    message["reasoning_content"] = json!(reasoning);
                    if message["content"] == "" {
                        message["content"] = json!(null);
                    }
                }
                json!({"index": index, "message": message, "logprobs": null,
                       "finish_reason": finish_reason})
            }
        };
        if self.token_ids {
            choice["token_ids"] = json!(output.token_ids);
        }
        if self.logprobs {
            choice["logprobs"] = self.logprobs(&output.logprobs, 0).0;
        }
        choice
    }

    /// `usage` over the outputs, with the reasoning's tokens where a parser reads them.
    fn usage(&self, outputs: &[GenerateOutput]) -> Usage {
        let mut usage = usage(outputs, self.per_prompt);
        let close = self
            .tokenizer
            .as_deref()
            .and_then(|t| t.token_to_id(crate::reasoning::CLOSE));
        if let (Some(parser), Some(close)) = (self.reasoning, close) {
            let reasoning_tokens = outputs
                .iter()
                .map(|o| parser.reasoning_tokens(&o.token_ids, &o.text, close))
                .sum();
            usage.completion_tokens_details = Some(CompletionTokensDetails { reasoning_tokens });
        }
        usage
    }

    /// A chat answer's reasoning and content (all content without a reasoning parser).
    fn split(&self, text: &str) -> Split {
        match self.reasoning {
            Some(parser) => Splitter::split(parser, text),
            None => Split {
                reasoning: String::new(),
                content: text.to_owned(),
            },
        }
    }

    /// OpenAI's `tool_calls` for choice `index`'s calls (`index` within the stream's delta).
    fn tool_calls(&self, choice: usize, calls: &[ToolCall]) -> Value {
        let calls: Vec<Value> = calls
            .iter()
            .enumerate()
            .map(|(at, call)| {
                json!({"index": at, "id": format!("call_{}_{choice}_{at}", self.id),
                       "type": "function",
                       "function": {"name": call.name, "arguments": call.arguments}})
            })
            .collect();
        json!(calls)
    }

    /// A choice's finish reason: `tool_calls` when it ended by itself after calling tools.
    fn finish_reason(&self, output: &GenerateOutput, called: bool) -> Value {
        match (called, output.finish_reason) {
            (true, grove_core::FinishReason::Stop) => json!("tool_calls"),
            (_, reason) => json!(reason),
        }
    }

    /// A completion's choice with its prompt before it (`echo`), the completion left out
    /// where the request only scores the prompt.
    fn echoed(&self, index: usize, echo: &Echo, output: &GenerateOutput) -> Value {
        let kept = if echo.without_completion {
            0
        } else {
            output.token_ids.len()
        };
        let completion = if echo.without_completion {
            ""
        } else {
            &output.text
        };
        let mut choice = json!({
            "index": index, "text": format!("{}{completion}", echo.text), "logprobs": null,
            "finish_reason": output.finish_reason,
        });
        if self.token_ids {
            choice["token_ids"] = json!(output.token_ids[..kept]);
        }
        if self.logprobs {
            let texts = TokenTexts::new(self.tokenizer.as_deref());
            let generated = &output.logprobs[..kept.min(output.logprobs.len())];
            choice["logprobs"] =
                texts.completion_echo(echo.first_token, &output.prompt_logprobs, generated);
        }
        choice
    }

    /// The endpoint's `logprobs` object for these tokens, the first at character `offset` of
    /// the completion (completions' `text_offset`); and the offset after them.
    fn logprobs(&self, logprobs: &[TokenLogprob], offset: usize) -> (Value, usize) {
        let texts = TokenTexts::new(self.tokenizer.as_deref());
        match self.endpoint {
            Endpoint::Chat => (texts.chat(logprobs), offset),
            Endpoint::Completions => texts.completion(logprobs, offset),
        }
    }

    /// With tools, the text a stream may send now: what comes before a call (or could not
    /// begin one); the rest waits for the end, where the calls are read from the whole text.
    fn release(&self, choice: &mut Choice, text: &str) -> Option<String> {
        choice.calls.push_str(text);
        let auto = self.tools.as_ref().map(|t| &t.choice) == Some(&ToolChoice::Auto);
        if choice.calling || !auto {
            return None;
        }
        if !choice.sent {
            // An answer opening with JSON or a code fence may be a call written bare: it
            // waits for the end, where it is read as calls or sent as text.
            let start = choice.calls.trim_start();
            if start.is_empty() {
                return None;
            }
            if start.starts_with(['{', '[', '`']) {
                choice.calling = true;
                return None;
            }
        }
        let (free, call) = crate::tools::releasable(&choice.calls);
        choice.calling = call;
        let released: String = choice.calls.drain(..free).collect();
        choice.sent |= !released.is_empty();
        (!released.is_empty()).then_some(released)
    }

    /// The chunks for a piece of choice `index`'s text: its reasoning at once, its content as
    /// tools and log-probabilities allow (with log-probabilities both wait for their tokens).
    fn text(
        &self,
        index: usize,
        choice: &mut Choice,
        split: Split,
    ) -> Vec<Result<Event, Infallible>> {
        let mut batch = Vec::new();
        if self.logprobs {
            choice.held_reasoning.push_str(&split.reasoning);
        } else if !split.reasoning.is_empty() {
            batch.push(data(&self.reasoning_chunk(index, &split.reasoning)));
        }
        if split.content.is_empty() {
            return batch;
        }
        if self.tools.is_some() {
            if let Some(released) = self.release(choice, &split.content) {
                batch.push(data(&self.chunk(index, Some(&released), None)));
            }
        } else if self.logprobs {
            // A step's text waits for its tokens to ride one chunk.
            choice.held.push_str(&split.content);
        } else {
            batch.push(data(&self.chunk(index, Some(&split.content), None)));
        }
        batch
    }

    /// A streamed piece of choice `index`'s reasoning.
    fn reasoning_chunk(&self, index: usize, reasoning: &str) -> Value {
        let mut chunk = self.chunk(index, None, None);
        chunk["choices"][0]["delta"] = json!({"reasoning_content": reasoning});
        chunk
    }

    /// One streamed piece of choice `index`: text (a delta for chat), or its end with its
    /// finish reason.
    fn chunk(&self, index: usize, text: Option<&str>, output: Option<&GenerateOutput>) -> Value {
        let finish_reason = output.map(|o| o.finish_reason);
        let choice = match self.endpoint {
            Endpoint::Completions => json!({
                "index": index, "text": text.unwrap_or(""), "logprobs": null,
                "finish_reason": finish_reason,
            }),
            Endpoint::Chat => json!({
                "index": index,
                "delta": text.map_or(json!({}), |t| json!({"content": t})),
                "logprobs": null,
                "finish_reason": finish_reason,
            }),
        };
        self.envelope(true, json!([choice]), None)
    }
}

/// `usage` over a request's choices (`per_prompt` of each prompt, in order): each prompt once
/// (its K/V is shared: the choices after the first find it in the prefix cache), the
/// completions' tokens summed, and the speculation's rounds pooled.
pub(crate) fn usage(outputs: &[GenerateOutput], per_prompt: usize) -> Usage {
    let first = &outputs[0].stats;
    let sum = |f: fn(&GenerateOutput) -> usize| outputs.iter().map(f).sum::<usize>();
    let prompts = || outputs.iter().step_by(per_prompt.max(1)).map(|o| &o.stats);
    let prompt_tokens = prompts().map(|s| s.prompt_tokens).sum::<usize>();
    let cached_tokens = prompts().map(|s| s.cached_tokens).sum::<usize>();
    let completion_tokens = sum(|o| o.stats.new_tokens);
    let rounds = sum(|o| o.stats.rounds);
    let per_round = |f: fn(&GenerateOutput) -> f64| {
        let total: f64 = outputs.iter().map(|o| f(o) * o.stats.rounds as f64).sum();
        if rounds == 0 {
            f(&outputs[0])
        } else {
            total / rounds as f64
        }
    };
    Usage {
        prompt_tokens,
        completion_tokens,
        total_tokens: prompt_tokens + completion_tokens,
        prompt_tokens_details: PromptTokensDetails { cached_tokens },
        completion_tokens_details: None,
        speculative: SpeculativeUsage {
            algorithm: first.algorithm,
            budget: first.budget,
            auto_budget: first.auto_budget,
            mean_budget: per_round(|o| o.stats.mean_budget),
            rounds_without_drafts: sum(|o| o.stats.rounds_without_drafts),
            rounds,
            mean_accept_length: per_round(|o| o.stats.mean_accept_length),
        },
    }
}

/// Waits for every choice's output; the first failure drops the rest (their sequences are
/// cancelled before the engine's next step).
pub(crate) async fn collect_all(
    choices: Vec<UnboundedReceiver<WorkerEvent>>,
) -> Result<Vec<GenerateOutput>, ApiError> {
    futures_util::future::try_join_all(choices.into_iter().map(collect)).await
}

async fn collect(mut events: UnboundedReceiver<WorkerEvent>) -> Result<GenerateOutput, ApiError> {
    while let Some(event) = events.recv().await {
        match event {
            WorkerEvent::Finished(output) => return Ok(*output),
            WorkerEvent::Failed(error) | WorkerEvent::Rejected(error) => return Err(error),
            WorkerEvent::Text(_) | WorkerEvent::Tokens(..) | WorkerEvent::Accepted => {}
        }
    }
    Err(ApiError::Internal("the engine dropped the request".into()))
}

fn data(value: &Value) -> Result<Event, Infallible> {
    Ok(Event::default().data(value.to_string()))
}

/// A choice's stream state: completions' character offset of its next token, the text a
/// request with log-probabilities holds until its step's tokens arrive, and its output once
/// finished.
#[derive(Default)]
struct Choice {
    offset: usize,
    held: String,
    /// Reasoning held as `held` is (with log-probabilities).
    held_reasoning: String,
    /// With a reasoning parser: where the text stands (reasoning or content).
    splitter: Option<Splitter>,
    /// With tools: text not sent yet, as it may be (or is) a call.
    calls: String,
    /// With tools: a call began (everything from it on waits for the end).
    calling: bool,
    /// With tools: text was sent (so the answer does not open with a bare call).
    sent: bool,
    output: Option<GenerateOutput>,
}

/// The stream's state between events. An event is `(choice, None)` when that choice's channel
/// closed before it finished.
struct Streaming {
    reply: Reply,
    events: BoxStream<'static, (usize, Option<WorkerEvent>)>,
    choices: Vec<Choice>,
    include_usage: bool,
}

impl Streaming {
    /// The chunks for one event, and whether the stream goes on.
    fn on(
        &mut self,
        index: usize,
        event: Option<WorkerEvent>,
    ) -> (Vec<Result<Event, Infallible>>, bool) {
        let reply = &self.reply;
        let choice = &mut self.choices[index];
        match event {
            Some(WorkerEvent::Text(text)) => {
                let split = match choice.splitter.as_mut() {
                    Some(splitter) => splitter.push(&text),
                    None => Split {
                        reasoning: String::new(),
                        content: text,
                    },
                };
                (reply.text(index, choice, split), true)
            }
            Some(WorkerEvent::Tokens(tokens, logprobs)) => {
                if !(reply.token_ids || reply.logprobs) {
                    return (Vec::new(), true);
                }
                let text = std::mem::take(&mut choice.held);
                let mut chunk =
                    reply.chunk(index, Some(text.as_str()).filter(|t| !t.is_empty()), None);
                let reasoning = std::mem::take(&mut choice.held_reasoning);
                if !reasoning.is_empty() {
                    chunk["choices"][0]["delta"]["reasoning_content"] = json!(reasoning);
                }
                if reply.logprobs {
                    let (value, next) = reply.logprobs(&logprobs, choice.offset);
                    chunk["choices"][0]["logprobs"] = value;
                    choice.offset = next;
                }
                if reply.token_ids {
                    chunk["choices"][0]["token_ids"] = json!(tokens);
                }
                (vec![data(&chunk)], true)
            }
            Some(WorkerEvent::Finished(output)) => {
                // Text released at the end (held back until then, or after the last tokens).
                let mut batch = match choice.splitter.as_mut().map(Splitter::finish) {
                    Some(rest) => reply.text(index, choice, rest),
                    None => Vec::new(),
                };
                if !choice.held_reasoning.is_empty() {
                    batch.push(data(&reply.reasoning_chunk(index, &choice.held_reasoning)));
                }
                if !choice.held.is_empty() {
                    batch.push(data(&reply.chunk(index, Some(&choice.held), None)));
                }
                let content = reply.split(&output.text).content;
                let calls = reply.tools.as_ref().and_then(|t| t.parse(&content));
                match &calls {
                    Some((_, calls)) => {
                        let mut chunk = reply.chunk(index, None, None);
                        chunk["choices"][0]["delta"] =
                            json!({"tool_calls": reply.tool_calls(index, calls)});
                        batch.push(data(&chunk));
                    }
                    // What was held as a possible call was text after all.
                    None if !choice.calls.is_empty() => {
                        batch.push(data(&reply.chunk(index, Some(&choice.calls), None)));
                    }
                    None => {}
                }
                let mut end = reply.chunk(index, None, Some(&output));
                end["choices"][0]["finish_reason"] = reply.finish_reason(&output, calls.is_some());
                batch.push(data(&end));
                choice.output = Some(*output);
                if self.choices.iter().any(|c| c.output.is_none()) {
                    return (batch, true);
                }
                if self.include_usage {
                    let outputs: Vec<GenerateOutput> = self
                        .choices
                        .iter_mut()
                        .filter_map(|c| c.output.take())
                        .collect();
                    let usage = self.reply.usage(&outputs);
                    batch.push(data(&self.reply.envelope(true, json!([]), Some(usage))));
                }
                batch.push(Ok(Event::default().data("[DONE]")));
                (batch, false)
            }
            // A stream that fails still ends as streams do, so clients stop reading.
            Some(WorkerEvent::Failed(error)) | Some(WorkerEvent::Rejected(error)) => {
                let error = data(&error.body());
                (vec![error, Ok(Event::default().data("[DONE]"))], false)
            }
            Some(WorkerEvent::Accepted) => (Vec::new(), true),
            None => {
                let error = ApiError::Internal("the engine dropped the request".into());
                (vec![data(&error.body())], false)
            }
        }
    }
}

/// SSE events for one request: chat's role chunk for each choice, text chunks as the engine
/// finalizes text (and each step's token ids when asked; with log-probabilities, one chunk a
/// step, its text and its tokens' entries), each choice's finish chunk, then the usage chunk
/// if asked and `[DONE]`. Dropping the stream (the client went away) closes the channels, and
/// the engine cancels the sequences before its next step.
pub(crate) fn sse_stream(
    reply: Reply,
    choices: Vec<UnboundedReceiver<WorkerEvent>>,
    include_usage: bool,
) -> impl Stream<Item = Result<Event, Infallible>> {
    let opening: Vec<_> = match reply.endpoint {
        Endpoint::Chat => (0..choices.len())
            .map(|index| {
                data(&reply.envelope(
                    true,
                    json!([{"index": index, "delta": {"role": "assistant", "content": ""},
                            "logprobs": null, "finish_reason": null}]),
                    None,
                ))
            })
            .collect(),
        Endpoint::Completions => Vec::new(),
    };
    let count = choices.len();
    let events = stream::select_all(choices.into_iter().enumerate().map(|(index, events)| {
        stream::unfold(Some(events), move |events| async move {
            let mut events = events?;
            match events.recv().await {
                // A choice's stream ends with its last event: its channel closes after it.
                Some(event @ (WorkerEvent::Finished(_) | WorkerEvent::Failed(_))) => {
                    Some(((index, Some(event)), None))
                }
                Some(event) => Some(((index, Some(event)), Some(events))),
                None => Some(((index, None), None)),
            }
        })
        .boxed()
    }))
    .boxed();
    let choices = (0..count)
        .map(|_| Choice {
            splitter: reply.reasoning.map(Splitter::new),
            ..Choice::default()
        })
        .collect();
    let state = Streaming {
        reply,
        events,
        choices,
        include_usage,
    };
    let body = stream::unfold(Some(state), |state| async move {
        let mut state = state?;
        let (index, event) = state.events.next().await?;
        let (batch, more) = state.on(index, event);
        Some((batch, more.then_some(state)))
    });
    stream::iter(opening).chain(body.flat_map(stream::iter))
}
