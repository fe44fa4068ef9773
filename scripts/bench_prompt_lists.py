#!/usr/bin/env python3
"""Several prompts in one completion request against the same prompts one request at a time,
in one sitting (docs/benchmarks.md, "Several prompts in one request").

    python3 scripts/bench_prompt_lists.py MODEL.gguf [REPETITIONS]

Starts `grove serve` on MODEL, then REPETITIONS times (default 3): eight prompts, 32 greedy
tokens each, sent one by one, then as one request's `prompt` list; checks that the texts are
equal and prints the median wall times and their ratio.
"""

import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request

GROVE = os.path.join(os.path.dirname(__file__), "..", "target", "release", "grove")
PROMPTS = [f'def function_{i}(x):\n    """Return x plus {i}."""\n' for i in range(8)]


def start(model):
    """`grove serve` on a free port; the process and its base URL."""
    server = subprocess.Popen([GROVE, "serve", "--model-path", model, "--port", "0",
                               "--threads", "2"], stderr=subprocess.PIPE, text=True)
    for line in server.stderr:
        if "listening on " in line:
            return server, line.split("listening on ")[1].strip()
    raise RuntimeError("grove serve exited before listening")


def main():
    model = sys.argv[1]
    repetitions = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    server, url = start(model)
    try:
        def complete(prompt):
            body = {"model": name, "prompt": prompt, "max_tokens": 32, "temperature": 0,
                    "ignore_eos": True}
            request = urllib.request.Request(f"{url}/v1/completions", json.dumps(body).encode(),
                                             {"Content-Type": "application/json"})
            return [c["text"] for c in json.load(urllib.request.urlopen(request))["choices"]]

        name = json.load(urllib.request.urlopen(f"{url}/v1/models"))["data"][0]["id"]
        complete("warm up")
        times = {"one by one": [], "one request": []}
        for _ in range(repetitions):
            start_time = time.time()
            alone = [complete(prompt)[0] for prompt in PROMPTS]
            times["one by one"].append(time.time() - start_time)
            start_time = time.time()
            together = complete(PROMPTS)
            times["one request"].append(time.time() - start_time)
            assert together == alone, "a prompt's answer changed in the list"
        for how, seconds in times.items():
            print(f"{how}: median {statistics.median(seconds):.2f} s of "
                  f"{', '.join(f'{s:.2f}' for s in seconds)}")
        ratio = statistics.median(times["one by one"]) / statistics.median(times["one request"])
        print(f"one request x one by one: {ratio:.2f}")
    finally:
        server.terminate()


if __name__ == "__main__":
    main()
