#!/usr/bin/env python3
"""Load test with shared system prompts, against a running server.

`--streams` clients send streamed chats for `--seconds`; a share `--shared` of them start with
one of `--systems` system prompts (slices of Python standard-library files), the rest with a
prompt of their own. Every stream must end with a finish reason, usage and `[DONE]`. Prints
failures, requests, TTFT percentiles, and the prefix cache's hit rate (cached prompt tokens /
prompt tokens) beside the workload's: what a cache that never evicted would serve, every
shared-prompt request after the first of its system prompt hitting that prompt's shared
tokens (the longest hit seen for it).

    python3 scripts/load_shared_prefix.py --url http://127.0.0.1:30000 --seconds 300

Standard library only. Exits 1 if any request failed.
"""

import argparse
import http.client
import random
import sys
import threading
import time

from openai_stream import first_model, stream_chat

SOURCES = ["textwrap.py", "shlex.py", "bisect.py", "fnmatch.py", "glob.py", "heapq.py"]
QUESTIONS = [
    "What does the first function do?",
    "List two functions it defines.",
    "Is there any global state?",
    "Explain one loop in it.",
    "What would you rename, and why?",
]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:30000")
    parser.add_argument("--streams", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=300)
    parser.add_argument("--systems", type=int, default=4)
    parser.add_argument("--shared", type=float, default=0.75)
    parser.add_argument("--system-chars", type=int, default=2400)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--stdlib", default="/usr/lib/python3.11")
    args = parser.parse_args()
    model = first_model(args.url)
    texts = []
    for name in SOURCES:
        with open(f"{args.stdlib}/{name}", encoding="utf-8") as source:
            texts.append(source.read())
    systems = [texts[i % len(texts)][: args.system_chars] for i in range(args.systems)]
    deadline = time.monotonic() + args.seconds
    lock = threading.Lock()
    records, failures = [], []

    def client(seed):
        rng = random.Random(seed)
        while time.monotonic() < deadline:
            shared = rng.random() < args.shared
            system_id = rng.randrange(args.systems) if shared else None
            if shared:
                system = systems[system_id]
            else:
                text = rng.choice(texts)
                start = rng.randrange(max(1, len(text) - 800))
                system = text[start : start + 800]
            body = {
                "model": model,
                "messages": [
                    {"role": "system", "content": "Answer about this code.\n\n" + system},
                    {"role": "user", "content": rng.choice(QUESTIONS)},
                ],
                "max_tokens": args.max_tokens,
                "temperature": rng.choice([0, 0.7]),
                "seed": seed,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            record, error = None, None
            try:
                record = stream_chat(args.url, body)
                if not (record["done"] and record["usage"] and record["finish"]):
                    error = f"incomplete stream: {record}"
            except (OSError, http.client.HTTPException, RuntimeError) as error_:
                error = f"{type(error_).__name__}: {error_}"
            with lock:
                if error:
                    failures.append(error)
                else:
                    record["system"] = system_id
                    records.append(record)

    threads = [threading.Thread(target=client, args=(seed,)) for seed in range(args.streams)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    prompt = sum(r["usage"]["prompt_tokens"] for r in records)
    cached = sum(r["usage"]["prompt_tokens_details"]["cached_tokens"] for r in records)
    shared_len, seen, repeatable = {}, set(), 0
    for r in records:
        if r["system"] is not None:
            hit = r["usage"]["prompt_tokens_details"]["cached_tokens"]
            shared_len[r["system"]] = max(shared_len.get(r["system"], 0), hit)
    for r in records:
        if r["system"] is not None:
            if r["system"] in seen:
                repeatable += shared_len[r["system"]]
            seen.add(r["system"])
    ttfts = sorted(r["ttft"] for r in records)

    def pct(q):
        return ttfts[min(len(ttfts) - 1, int(q * len(ttfts)))] if ttfts else float("nan")

    print(
        f"{args.streams} streams, {args.seconds:.0f} s: {len(records)} requests, "
        f"{len(failures)} failed; TTFT p50 {pct(0.5):.2f} s, p90 {pct(0.9):.2f} s; "
        f"prefix-cache hit rate {cached / max(prompt, 1):.3f} of {prompt} prompt tokens "
        f"(the workload repeats {repeatable / max(prompt, 1):.3f})"
    )
    for failure in failures[:10]:
        print("failure:", failure)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
