#!/usr/bin/env python3
"""Lookup drafts from earlier requests' texts (`--speculative-ngram-capacity`) against lookup
drafts from the request's own text and against plain decoding, through `grove serve`
(docs/benchmarks.md, "Lookup drafts from earlier requests").

    python3 scripts/bench_corpus.py MODEL.gguf [REPETITIONS] [--drafter DIR] [-- EXTRA FLAGS]

Each task is a pair of chats sent one after the other: a first request, then the measured
one, which writes much of what the first wrote (the same question again, the question with a
change, a sibling task) or nothing of it (an unrelated question, the control). Every
repetition starts one server per method, fresh, and sends every pair in order, greedy, 256
tokens at most, streamed. Methods: plain decoding (`none`), ngram with its automatic budget
and no corpus (`ngram`, `--speculative-ngram-capacity 0`), ngram with the default corpus
(`ngram+corpus`), and with `--drafter` DDTree with lookup in its trees without and with the
corpus. Prints per task and method the measured request's median decode tokens/s (streamed:
tokens after the first over the time from the first to the last), its ratio over plain
decoding's median, and tau; checks that every method's text equals plain decoding's.
"""

import os
import subprocess
import sys
import threading

from bench_lookup import parse_args, report
from openai_stream import stream_chat

GROVE = os.path.join(os.path.dirname(__file__), "..", "target", "release", "grove")

PALINDROME = ("Write a Python function that checks whether a string is a palindrome, "
              "ignoring case and punctuation.")
HASH_MAP = "Explain what a hash map is and how it handles collisions."

TASKS = {
    "again": (PALINDROME, PALINDROME),
    "with a change": (PALINDROME, PALINDROME + " Add type hints and a docstring."),
    "longer answer": (HASH_MAP, HASH_MAP + " Then say when to use one."),
    "sibling": ("Write a Python class for a stack with push, pop, peek and is_empty methods.",
                "Write a Python class for a queue with enqueue, dequeue, peek and is_empty "
                "methods."),
    "unrelated": ("Write a haiku about autumn.",
                  "Write a SQL query that lists the ten customers with the most orders."),
}


def start_server(model, flags, extra):
    command = [GROVE, "serve", "--model-path", model, "--threads", "2", "--port", "0",
               "--max-total-tokens", "4096", "--served-model-name", "m", *flags, *extra]
    server = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    for line in server.stderr:
        if "listening on " in line:
            # Keep reading its log, or a full pipe would stop the server.
            threading.Thread(target=server.stderr.read, daemon=True).start()
            return server, line.rsplit("listening on ", 1)[1].strip()
    sys.exit(f"`{' '.join(command)}` did not start")


def ask(url, prompt):
    body = {"model": "m", "messages": [{"role": "user", "content": prompt}],
            "max_tokens": 256, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    answer = stream_chat(url, body)
    usage = answer["usage"]
    tokens = usage["completion_tokens"]
    speed = (tokens - 1) / max(answer["last"] - answer["ttft"], 1e-9)
    return answer["text"], speed, usage["speculative"]["mean_accept_length"]


def sitting(model, methods, extra, repetitions, tasks):
    """Per repetition, a fresh server per method (`methods`: name -> flags) for
    `tasks(url)`, which yields (task, text, tokens/s, tau) per measured chat. Returns
    `results[(task, method)]`, a list of (tokens/s, tau); exits if a text differs from plain
    decoding's (method `none`)."""
    results = {}
    texts = {}
    for _ in range(repetitions):
        for method, flags in methods.items():
            server, url = start_server(model, flags, extra)
            try:
                for task, text, speed, tau in tasks(url):
                    texts.setdefault(task, {})[method] = text
                    results.setdefault((task, method), []).append((speed, tau))
            finally:
                server.terminate()
                server.wait()
        for task, by_method in texts.items():
            for method, text in by_method.items():
                if text != by_method["none"]:
                    sys.exit(f"{task}: {method}'s text differs from plain decoding's")
    return results


def main():
    model, repetitions, drafter, extra = parse_args(sys.argv[1:])
    ngram = ["--speculative-algorithm", "ngram"]
    methods = {
        "none": [],
        "ngram": [*ngram, "--speculative-ngram-capacity", "0"],
        "ngram+corpus": ngram,
    }
    if drafter:
        ddtree = ["--speculative-algorithm", "ddtree", "--speculative-draft-model-path", drafter]
        methods["ddtree"] = [*ddtree, "--speculative-ngram-capacity", "0"]
        methods["ddtree+corpus"] = ddtree

    def pairs(url):
        for task, (first, measured) in TASKS.items():
            ask(url, first)
            yield (task, *ask(url, measured))

    report(sitting(model, methods, extra, repetitions, pairs), TASKS, methods)


if __name__ == "__main__":
    main()
