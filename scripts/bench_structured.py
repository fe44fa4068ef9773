#!/usr/bin/env python3
"""Decode speed under structured output, against free text, in one sitting (docs/benchmarks.md,
"Structured output").

    python3 scripts/bench_structured.py MODEL.gguf DRAFTER_DIR [REPETITIONS]
    python3 scripts/bench_structured.py MODEL.gguf DRAFTER_DIR [REPETITIONS] --against OLD_GROVE
        [--algorithms ddtree,dflash] [-- EXTRA GROVE FLAGS]

For each prompt, each response format (free text, `--json`, a JSON Schema) and each sampling
setting (greedy; temperature 0.8, seed 3), `grove generate` runs plain and with DDTree, the
runs of one repetition alternating. Prints each cell's median decode tokens/s, DDTree's ratio
over plain on the same output, and the formats' ratio over free text; checks that DDTree's
text equals plain decoding's and that every finished JSON text parses.

With `--against`, the JSON and schema cells run each speculative algorithm with the other grove
binary and with this checkout's, alternating, and print both binaries' tokens/s and tau and the
ratio of this one's speed over the other's; the texts must be equal.
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile

GROVE = os.path.join(os.path.dirname(__file__), "..", "target", "release", "grove")
PROMPTS = [
    "Describe three fictional software engineers as a JSON object with a key engineers holding "
    "a list; each has name, age, languages and employed.",
    "Give the configuration of a small web service (name, port, replicas, environment "
    "variables, health check) as JSON.",
]
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "version": {"type": "string"},
        "port": {"type": "integer"},
        "replicas": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 6},
        "public": {"type": "boolean"},
    },
    "required": ["name", "version", "port", "replicas", "tags", "public"],
}
SAMPLINGS = {"greedy": [], "t0.8": ["--temperature", "0.8", "--seed", "3"]}


def run(model, args, grove=GROVE):
    command = [grove, "generate", "--model-path", model, "--chat", "--threads", "2",
               "--max-new-tokens", "200", "--format", "json", *args]
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def schema_file():
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(SCHEMA, f)
        return f.name


def against(model, drafter, repetitions, other, algorithms, extra):
    """This checkout's binary against `other` on the formatted cells, alternating."""
    formats = {"json": ["--json"], "schema": ["--json-schema", schema_file()]}
    binaries = {"other": other, "this": GROVE}
    results = {}
    for _ in range(repetitions):
        for p, prompt in enumerate(PROMPTS):
            for sampling, sampling_args in SAMPLINGS.items():
                for name, format_args in formats.items():
                    for algorithm in algorithms:
                        texts = set()
                        for tag, binary in binaries.items():
                            args = ["--prompt", prompt, *sampling_args, *format_args,
                                    "--speculative-algorithm", algorithm,
                                    "--speculative-draft-model-path", drafter, *extra]
                            answer = run(model, args, binary)
                            texts.add(answer["text"])
                            stats = answer["stats"]
                            results.setdefault((p, sampling, name, algorithm, tag), []).append(
                                (stats["decode_tokens_per_s"], stats["mean_accept_length"]))
                        assert len(texts) == 1, (prompt, sampling, name, algorithm)
    print(f"{'prompt':>6} {'sampling':>8} {'format':>6} {'method':>6} {'other':>7} {'tau':>5} "
          f"{'this':>7} {'tau':>5} {'this x other':>12}")
    for key in sorted({k[:4] for k in results}):
        cells = [results[key + (tag,)] for tag in binaries]
        speed = [statistics.median(s for s, _ in c) for c in cells]
        tau = [statistics.median(t for _, t in c) for c in cells]
        print(f"{key[0]:>6} {key[1]:>8} {key[2]:>6} {key[3]:>6} {speed[0]:7.2f} {tau[0]:5.2f} "
              f"{speed[1]:7.2f} {tau[1]:5.2f} {speed[1] / speed[0]:12.2f}")


def main():
    args = sys.argv[1:]
    extra = args[args.index("--") + 1:] if "--" in args else []
    args = args[:args.index("--")] if "--" in args else args
    options = {}
    for flag in ("--against", "--algorithms"):
        if flag in args:
            at = args.index(flag)
            options[flag] = args[at + 1]
            del args[at:at + 2]
    model, drafter = args[:2]
    repetitions = int(args[2]) if len(args) > 2 else 2
    if "--against" in options:
        algorithms = options.get("--algorithms", "ddtree").split(",")
        against(model, drafter, repetitions, options["--against"], algorithms, extra)
        return
    formats = {"text": [], "json": ["--json"], "schema": ["--json-schema", schema_file()]}
    methods = {"plain": [],
               "ddtree": ["--speculative-algorithm", "ddtree",
                          "--speculative-draft-model-path", drafter]}
    speeds = {}
    for _ in range(repetitions):
        for p, prompt in enumerate(PROMPTS):
            for sampling, sampling_args in SAMPLINGS.items():
                for name, format_args in formats.items():
                    texts = {}
                    for method, method_args in methods.items():
                        answer = run(model, ["--prompt", prompt, *sampling_args, *format_args,
                                             *method_args])
                        texts[method] = answer["text"]
                        if name != "text" and answer["finish_reason"] == "stop":
                            json.loads(answer["text"])
                        stats = answer["stats"]
                        speeds.setdefault((p, sampling, name, method), []).append(
                            (stats["decode_tokens_per_s"], stats["mean_accept_length"]))
                    assert texts["plain"] == texts["ddtree"], (prompt, sampling, name)
    print(f"{'prompt':>6} {'sampling':>8} {'format':>6} {'plain':>7} {'ddtree':>7} "
          f"{'tau':>5} {'x plain':>7} {'plain x text':>12}")
    for p in range(len(PROMPTS)):
        for sampling in SAMPLINGS:
            base = statistics.median(s for s, _ in speeds[(p, sampling, "text", "plain")])
            for name in formats:
                plain = statistics.median(s for s, _ in speeds[(p, sampling, name, "plain")])
                tree = statistics.median(s for s, _ in speeds[(p, sampling, name, "ddtree")])
                tau = statistics.median(t for _, t in speeds[(p, sampling, name, "ddtree")])
                print(f"{p:>6} {sampling:>8} {name:>6} {plain:7.2f} {tree:7.2f} {tau:5.2f} "
                      f"{tree / plain:7.2f} {plain / base:12.2f}")


if __name__ == "__main__":
    main()
