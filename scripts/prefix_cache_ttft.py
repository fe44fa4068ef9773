#!/usr/bin/env python3
"""Time to first token of chats that share a long system prompt, against a running server.

Sends one chat per question, in order, each streamed, all with the same system prompt (the
first `--system-chars` characters of `--system-file`; with `--conversation`, one chat whose
every turn carries the earlier answers), and prints per request: time to first token,
prompt tokens, cached prompt tokens (`usage.prompt_tokens_details.cached_tokens`) and the
answer. Run it against `grove serve` and against `grove serve --disable-radix-cache` to
compare: with the cache, every request after the first prefills only its own question.

    python3 scripts/prefix_cache_ttft.py --url http://127.0.0.1:30000 --json out.json

Standard library only.
"""

import argparse
import json

from openai_stream import first_model, stream_chat

QUESTIONS = [
    "Summarise what this module is for in two sentences.",
    "Which function in it would you test first, and why?",
    "Write a one-line docstring for the first class it defines.",
    "Name one edge case the code handles.",
]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:30000")
    parser.add_argument("--model", help="default: the first of GET /v1/models")
    parser.add_argument("--system-file", default="/usr/lib/python3.11/textwrap.py")
    parser.add_argument("--system-chars", type=int, default=5200)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--requests", type=int, default=len(QUESTIONS))
    parser.add_argument(
        "--conversation",
        action="store_true",
        help="one chat: each request carries the earlier questions and answers",
    )
    parser.add_argument("--json", help="write the per-request results here")
    args = parser.parse_args()
    if args.model is None:
        args.model = first_model(args.url)
    with open(args.system_file, encoding="utf-8") as source:
        code = source.read()[: args.system_chars]
    system = "You answer questions about this Python module.\n\n" + code
    results = []
    history = [{"role": "system", "content": system}]
    for index in range(args.requests):
        question = QUESTIONS[index % len(QUESTIONS)]
        messages = history + [{"role": "user", "content": question}]
        body = {
            "model": args.model,
            "messages": messages,
            "max_tokens": args.max_tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        reply = stream_chat(args.url, body)
        ttft, answer, usage = reply["ttft"], reply["text"], reply["usage"]
        if args.conversation:
            history = messages + [{"role": "assistant", "content": answer}]
        cached = usage["prompt_tokens_details"]["cached_tokens"]
        results.append(
            {
                "question": question,
                "ttft_s": ttft,
                "prompt_tokens": usage["prompt_tokens"],
                "cached_tokens": cached,
                "answer": answer,
            }
        )
        ratio = ttft / results[0]["ttft_s"]
        print(
            f"request {index}: TTFT {ttft:.3f} s ({ratio:.3f} of the first), "
            f"prompt {usage['prompt_tokens']} tokens, cached {cached} "
            f"({cached / usage['prompt_tokens']:.1%}): {answer[:60]!r}"
        )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(results, out, indent=2)


if __name__ == "__main__":
    main()
