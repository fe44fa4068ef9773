"""Drives a running `grove serve` with the official `openai` client.

Usage: python3 openai_client.py BASE_URL

The server runs the embedded default pair (a small trained Qwen3 code model, ChatML) with
DDTree over its trained drafter. Every check raises on failure; the last line printed says how many passed.
"""

import json
import string

import openai

import checks
from checks import check, client


# Models.
models = client.models.list()
name = models.data[0].id
check(len(models.data) == 1 and models.data[0].object == "model", f"models: {models}")

# Completions: text, finish reason, usage and grove's speculation extension.
completion = client.completions.create(model=name, prompt="def fib(n):", max_tokens=24, temperature=0)
choice = completion.choices[0]
check(choice.finish_reason in ("stop", "length"), f"finish_reason {choice.finish_reason}")
usage = completion.usage
check(usage.prompt_tokens > 0 and usage.completion_tokens >= 1, f"usage {usage}")
check(usage.total_tokens == usage.prompt_tokens + usage.completion_tokens, f"usage {usage}")
speculative = usage.model_extra["speculative"]
check(speculative["algorithm"] == "ddtree" and speculative["mean_accept_length"] >= 1.0, f"{speculative}")
check(speculative["rounds"] >= 1, f"{speculative}")

# Streaming carries the same text, one finish reason, and usage in the last chunk.
chunks = list(
    client.completions.create(
        model=name, prompt="def fib(n):", max_tokens=24, temperature=0, stream=True,
        stream_options={"include_usage": True},
    )
)
streamed = "".join(c.choices[0].text for c in chunks if c.choices)
check(streamed == choice.text, f"stream {streamed!r} vs {choice.text!r}")
finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
check(finishes == [choice.finish_reason], f"finish reasons {finishes}")
check(chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == usage.completion_tokens,
      f"last chunk {chunks[-1]}")

# Speculation is lossless: plain decoding (a per-request override) gives the same text.
plain = client.completions.create(
    model=name, prompt="def fib(n):", max_tokens=24, temperature=0,
    extra_body={"speculative": {"algorithm": "none"}},
)
check(plain.choices[0].text == choice.text, "ddtree and plain greedy differ")
check(plain.usage.model_extra["speculative"]["algorithm"] == "none", f"{plain.usage}")

# Lookup drafts (no drafter needed) on a prompt that repeats itself: the same text again.
repeating = "def area(w, h):\n    return w * h\n\n\ndef area(w, h):\n"
looked_up, unspeculated = [
    client.completions.create(
        model=name, prompt=repeating, max_tokens=24, temperature=0,
        extra_body={"speculative": {"algorithm": algorithm}},
    )
    for algorithm in ("ngram", "none")
]
check(looked_up.choices[0].text == unspeculated.choices[0].text, "ngram and plain greedy differ")
check(looked_up.usage.model_extra["speculative"]["algorithm"] == "ngram", f"{looked_up.usage}")

# Chat, plain and streaming.
messages = [{"role": "system", "content": "You write Python."}, {"role": "user", "content": "Sort a list."}]
chat = client.chat.completions.create(model=name, messages=messages, max_tokens=20, temperature=0)
check(chat.object == "chat.completion" and chat.choices[0].message.role == "assistant", f"{chat}")
chat_chunks = list(
    client.chat.completions.create(model=name, messages=messages, max_tokens=20, temperature=0, stream=True)
)
check(chat_chunks[0].choices[0].delta.role == "assistant", f"{chat_chunks[0]}")
chat_streamed = "".join(c.choices[0].delta.content or "" for c in chat_chunks if c.choices)
check(chat_streamed == chat.choices[0].message.content, "chat stream differs")

# A stop sequence: cut a long greedy output at a two-character string it contains.
long = client.completions.create(
    model=name, prompt="x = [1, 2, 3]\n", max_tokens=48, temperature=0, extra_body={"ignore_eos": True},
).choices[0].text
printable = set(string.ascii_letters + string.digits + string.punctuation + " ")
window = next((long[i:i + 2] for i in range(1, len(long) - 1) if set(long[i:i + 2]) <= printable), None)
if window is None:
    print(f"note: no printable two-character window in {long!r}; stop check uses one character")
    window = next(ch for ch in long if ch in printable)
stopped = client.completions.create(
    model=name, prompt="x = [1, 2, 3]\n", max_tokens=48, temperature=0, stop=[window],
    extra_body={"ignore_eos": True},
).choices[0]
check(stopped.finish_reason == "stop", f"stop finish {stopped.finish_reason}")
check(stopped.text == long[: long.find(window)], f"stop {window!r}: {stopped.text!r} vs {long!r}")

# Seeded sampling is reproducible.
sampled = [
    client.completions.create(model=name, prompt="import os", max_tokens=32, temperature=1.0, seed=1234)
    .choices[0].text
    for _ in range(2)
]
check(sampled[0] == sampled[1], f"seeded sampling differs: {sampled}")

# Log-probabilities parse into the client's types, one per completion token, the same from
# plain decoding and speculation, in a stream and in the whole answer.
def chat_logprobs(**extra):
    answer = client.chat.completions.create(
        model=name, messages=[{"role": "user", "content": "Write a loop."}], max_tokens=16,
        temperature=0, logprobs=True, top_logprobs=2, **extra,
    )
    return answer, [(t.token, t.logprob, [(a.token, a.logprob) for a in t.top_logprobs])
                    for t in answer.choices[0].logprobs.content]
answer, entries = chat_logprobs()
check(len(entries) == answer.usage.completion_tokens, f"{len(entries)} entries: {answer.usage}")
check(all(top[0] == (token, logprob) and len(top) == 2 for token, logprob, top in entries),
      f"greedy takes the most likely: {entries}")
_, plain_entries = chat_logprobs(extra_body={"speculative": {"algorithm": "none"}})
check(plain_entries == entries, f"speculation changed log-probabilities: {plain_entries} vs {entries}")
completion_lp = client.completions.create(model=name, prompt="def fib(n):", max_tokens=12, temperature=0,
                                          logprobs=3)
lp = completion_lp.choices[0].logprobs
check(len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset)
      == completion_lp.usage.completion_tokens, f"{lp}")
streamed_lp = [
    value
    for c in client.completions.create(model=name, prompt="def fib(n):", max_tokens=12, temperature=0,
                                       logprobs=3, stream=True)
    if c.choices and c.choices[0].logprobs
    for value in c.choices[0].logprobs.token_logprobs
]
check(streamed_lp == lp.token_logprobs, f"streamed {streamed_lp} vs {lp.token_logprobs}")

# Penalties and logit_bias: a banned token never comes, and speculation stays lossless.
first_id = client.completions.create(
    model=name, prompt="def fib(n):", max_tokens=1, temperature=0, extra_body={"return_token_ids": True},
).choices[0].model_extra["token_ids"][0]
adjusted = [
    client.completions.create(
        model=name, prompt="def fib(n):", max_tokens=24, temperature=0, presence_penalty=0.8,
        frequency_penalty=0.4, logit_bias={str(first_id): -100},
        extra_body={"return_token_ids": True, "speculative": {"algorithm": algorithm}},
    ).choices[0].model_extra["token_ids"]
    for algorithm in ("none", "ddtree")
]
check(first_id not in adjusted[0], f"banned {first_id} came: {adjusted[0]}")
check(adjusted[0] == adjusted[1], f"penalties under speculation: {adjusted}")

# Scoring a prompt: echo with max_tokens=0 gives the prompt back with its tokens' log-probabilities.
scored = client.completions.create(model=name, prompt="def fib(n):", max_tokens=0, echo=True, logprobs=1)
scored_lp = scored.choices[0].logprobs
check(scored.choices[0].text == "def fib(n):" and scored.usage.completion_tokens == 0, f"{scored}")
check(len(scored_lp.token_logprobs) == scored.usage.prompt_tokens and scored_lp.token_logprobs[0] is None
      and all(v <= 0 for v in scored_lp.token_logprobs[1:]), f"{scored_lp}")

# Several choices: greedy ones are the single answer each; usage counts the prompt once.
several = client.completions.create(model=name, prompt="def fib(n):", max_tokens=24, temperature=0, n=3)
check([c.index for c in several.choices] == [0, 1, 2], f"{several.choices}")
check(all(c.text == choice.text for c in several.choices), f"{several.choices} vs {choice.text!r}")
check(several.usage.prompt_tokens == usage.prompt_tokens
      and several.usage.completion_tokens == 3 * usage.completion_tokens, f"{several.usage}")
streamed_choices = {}
for c in client.chat.completions.create(model=name, messages=[{"role": "user", "content": "Write a loop."}],
                                        max_tokens=16, temperature=0.8, seed=4, n=2, stream=True):
    for part in c.choices:
        streamed_choices[part.index] = streamed_choices.get(part.index, "") + (part.delta.content or "")
check(sorted(streamed_choices) == [0, 1], f"{streamed_choices}")

# Structured output: an answer held to a JSON Schema, and a named tool call in the client's shape.
status_schema = {"type": "object", "properties": {"ok": {"type": "boolean"},
                 "level": {"enum": ["low", "high"]}}, "required": ["ok", "level"]}
formatted = client.chat.completions.create(
    model=name, messages=[{"role": "user", "content": "Status as JSON."}], max_tokens=600, temperature=0,
    response_format={"type": "json_schema", "json_schema": {"name": "status", "schema": status_schema}})
check(formatted.choices[0].finish_reason == "stop", f"{formatted.choices[0]}")
status = json.loads(formatted.choices[0].message.content)
check(list(status) == ["ok", "level"] and status["level"] in ("low", "high"), f"{status}")
weather = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"enum": ["Paris", "Tokyo"]}}, "required": ["city"]}}}]
called = client.chat.completions.create(
    model=name, messages=[{"role": "user", "content": "Weather in Paris?"}], max_tokens=600, temperature=0,
    tools=weather, tool_choice={"type": "function", "function": {"name": "get_weather"}}).choices[0]
calls = called.message.tool_calls or []
check(called.finish_reason == "tool_calls" and len(calls) == 1 and calls[0].function.name == "get_weather"
      and json.loads(calls[0].function.arguments)["city"] in ("Paris", "Tokyo"), f"{called}")

# Errors come back as the client's typed exceptions.
try:
    client.completions.create(model=name, prompt="x", max_tokens=4, n=17)
    check(False, "n=17 accepted")
except openai.BadRequestError as error:
    check(error.status_code == 400 and "`n`" in str(error), f"{error}")
try:
    client.completions.create(model="no-such-model", prompt="x", max_tokens=4)
    check(False, "unknown model accepted")
except openai.NotFoundError as error:
    check(error.status_code == 404, f"{error}")

print(f"openai client: {checks.passed} checks passed")
