#!/usr/bin/env python3
"""Lookup drafts (`--speculative-algorithm ngram`) against plain decoding on tasks that repeat
their input and on tasks that do not, in one sitting (docs/benchmarks.md, "Lookup drafts").

    python3 scripts/bench_lookup.py MODEL.gguf [REPETITIONS] [--drafter DIR] [-- EXTRA FLAGS]

Each task runs greedy through `grove generate --chat` with every method, the runs of one
repetition alternating: plain decoding, ngram with its automatic budget, and with `--drafter`
DDTree with its automatic budget, with lookup drafts in its trees (`ddtree`, the default) and
without (`ddtree-alone`, `--speculative-ddtree-lookup false`). Prints each cell's median decode tokens/s, its ratio over
plain decoding's median, and tau (tokens a round); checks that every method's text equals
plain decoding's.
"""

import json
import os
import statistics
import subprocess
import sys

GROVE = os.path.join(os.path.dirname(__file__), "..", "target", "release", "grove")

CODE = '''def compute_total(items):
    total = 0
    for item in items:
        if item.price > 0:
            total += item.price * item.quantity
    return total


def report(orders):
    lines = []
    for order in orders:
        value = compute_total(order.items)
        lines.append(f"{order.id}: {value:.2f}")
    return "\\n".join(lines)
'''

CLASS = '''class Inventory:
    def __init__(self):
        self.items = {}

    def add(self, name, count):
        self.items[name] = self.items.get(name, 0) + count

    def remove(self, name, count):
        if self.items.get(name, 0) < count:
            raise ValueError("not enough " + name)
        self.items[name] -= count

    def total(self):
        return sum(self.items.values())
'''

NOTES = (
    "Release notes, version 2.4. The scheduler now admits requests in arrival order. "
    "Prefix caching keeps the pages of finished requests until memory is needed. "
    "The tokenizer endpoint returns the same counts as the completion endpoints. "
    "Logging moved to structured JSON lines. The metrics endpoint adds a histogram of "
    "time to first token. Configuration files may now set the default sampling temperature."
)

TASKS = {
    "rename": "Rename the function `compute_total` to `sum_prices` everywhere in this code "
              "and return the whole code.\n\n```python\n" + CODE + "```",
    "docstrings": "Add a one-line docstring to every method of this class and return the "
                  "whole class.\n\n```python\n" + CLASS + "```",
    "quote": "Copy, word for word, the sentences of these notes that mention requests or "
             "tokens, one per line.\n\n" + NOTES,
    "palindrome": "Write a Python function that checks whether a string is a palindrome, "
                  "ignoring case and punctuation. Explain it briefly.",
    "explain": "Explain what a hash map is and when to use one, in two short paragraphs.",
}


def run(model, method_args, prompt, extra):
    command = [GROVE, "generate", "--model-path", model, "--chat", "--threads", "2",
               "--max-new-tokens", "256", "--format", "json", "--prompt", prompt,
               *method_args, *extra]
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def parse_args(args):
    """MODEL [REPETITIONS] [--drafter DIR] [-- EXTRA FLAGS]: returns the model, the
    repetitions (3 unless given), the drafter (or None) and the extra flags."""
    extra = []
    if "--" in args:
        extra = args[args.index("--") + 1:]
        args = args[:args.index("--")]
    drafter = None
    if "--drafter" in args:
        i = args.index("--drafter")
        drafter = args[i + 1]
        del args[i:i + 2]
    repetitions = int(args[1]) if len(args) > 1 else 3
    return args[0], repetitions, drafter, extra


def report(results, tasks, methods):
    """Prints per task and method the median tokens/s, its ratio over plain decoding's
    median (method `none`) and the median tau, from `results[(task, method)]`: a list of
    (tokens/s, tau)."""
    width = max(len(task) for task in tasks) + 1
    print(f"{'task':<{width}} {'method':<14} {'tok/s':>7} {'x plain':>8} {'tau':>5}")
    for task in tasks:
        plain = statistics.median(s for s, _ in results[(task, "none")])
        for method in methods:
            runs = results[(task, method)]
            speed = statistics.median(s for s, _ in runs)
            tau = statistics.median(t for _, t in runs)
            print(f"{task:<{width}} {method:<14} {speed:7.1f} {speed / plain:8.2f} {tau:5.2f}")
    print("texts equal to plain decoding's: yes")


def main():
    model, repetitions, drafter, extra = parse_args(sys.argv[1:])
    methods = {"none": [], "ngram": ["--speculative-algorithm", "ngram"]}
    if drafter:
        ddtree = ["--speculative-algorithm", "ddtree", "--speculative-draft-model-path", drafter]
        methods["ddtree"] = ddtree
        methods["ddtree-alone"] = [*ddtree, "--speculative-ddtree-lookup", "false"]
    results = {}
    for _ in range(repetitions):
        for task, prompt in TASKS.items():
            texts = {}
            for method, method_args in methods.items():
                answer = run(model, method_args, prompt, extra)
                texts[method] = answer["text"]
                stats = answer["stats"]
                results.setdefault((task, method), []).append(
                    (stats["decode_tokens_per_s"], stats["mean_accept_length"]))
            for method, text in texts.items():
                if text != texts["none"]:
                    sys.exit(f"{task}: {method}'s text differs from plain decoding's")
    report(results, TASKS, methods)


if __name__ == "__main__":
    main()
