"""Drives a running `grove serve --reasoning-parser deepseek-r1` with the official `openai`
client: reasoning comes back where clients read it, and `chat_template_kwargs` is accepted.

Usage: python3 openai_reasoning.py BASE_URL

The server runs the embedded default pair, whose vocabulary has no `</think>`: with the
`deepseek-r1` parser an answer never closes its block, so all of it is reasoning. Every check
raises on failure; the last line printed says how many passed.
"""

import openai

import checks
from checks import check, client

name = client.models.list().data[0].id


messages = [{"role": "user", "content": "Write a function that adds two numbers."}]
request = dict(model=name, messages=messages, max_tokens=24, temperature=0,
               extra_body={"chat_template_kwargs": {"enable_thinking": True}})

# The reasoning is the message's `reasoning_content`; the content is null.
answer = client.chat.completions.create(**request)
message = answer.choices[0].message
reasoning = message.model_extra.get("reasoning_content")
check(isinstance(reasoning, str) and reasoning, f"reasoning_content {message}")
check(message.content is None, f"content {message.content!r}")

# A stream sends it as `delta.reasoning_content`, adding up to the same text.
chunks = list(client.chat.completions.create(**request, stream=True))
streamed = "".join(c.choices[0].delta.model_extra.get("reasoning_content") or ""
                   for c in chunks if c.choices)
check(streamed == reasoning, f"stream {streamed!r} vs {reasoning!r}")
content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
check(content == "", f"streamed content {content!r}")

# A template variable grove sets itself is refused by name.
try:
    client.chat.completions.create(model=name, messages=messages, max_tokens=4,
                                   extra_body={"chat_template_kwargs": {"messages": []}})
    check(False, "chat_template_kwargs.messages accepted")
except openai.BadRequestError as error:
    check(error.body["param"] == "chat_template_kwargs", f"{error}")

# A schema after a block needs `</think>` as a token: refused by name on this model.
try:
    client.chat.completions.create(model=name, messages=messages, max_tokens=4,
                                   response_format={"type": "json_object"})
    check(False, "response_format accepted without </think>")
except openai.BadRequestError as error:
    check(error.body["param"] == "response_format", f"{error}")

print(f"openai reasoning: {checks.passed} checks passed")
