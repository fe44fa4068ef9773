#!/usr/bin/env python3
"""Lookup drafts from texts a server is given (`--speculative-ngram-external-corpus-path`)
against lookup drafts from the request's own text and against plain decoding, through `grove
serve` (docs/benchmarks.md, "Lookup drafts from earlier requests").

    python3 scripts/bench_external_corpus.py MODEL.gguf CORPUS.jsonl [REPETITIONS] [-- FLAGS]

CORPUS.jsonl: one JSON string per line (the texts). Each task is one chat, greedy, 256 tokens
at most, streamed, to a fresh server per method and repetition: plain decoding (`none`),
ngram with no corpus (`ngram`) and ngram with the given texts (`ngram+given`), both with
`--speculative-ngram-capacity 0` so that only the given texts differ. Prints the median
decode tokens/s, its ratio over plain decoding's and tau per task and method; checks that
every text equals plain decoding's.
"""

import sys

from bench_corpus import ask, sitting
from bench_lookup import parse_args, report

TASKS = {
    "MIT license": "Print the full text of the MIT License, with [year] and [fullname] as "
                   "placeholders, and nothing else.",
    "textwrap.dedent": "Show the source code of the function `dedent` from Python's "
                       "`textwrap` module, as it is in the standard library.",
    "unrelated": "Write a SQL query that lists the ten customers with the most orders.",
}


def main():
    args = sys.argv[1:]
    corpus = args.pop(1)
    model, repetitions, _, extra = parse_args(args)
    ngram = ["--speculative-algorithm", "ngram", "--speculative-ngram-capacity", "0"]
    methods = {
        "none": [],
        "ngram": ngram,
        "ngram+given": [*ngram, "--speculative-ngram-external-corpus-path", corpus],
    }

    def chats(url):
        for task, prompt in TASKS.items():
            yield (task, *ask(url, prompt))

    report(sitting(model, methods, extra, repetitions, chats), TASKS, methods)


if __name__ == "__main__":
    main()
