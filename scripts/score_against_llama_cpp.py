#!/usr/bin/env python3
"""Scores one text with llama.cpp and with a running `grove serve` and compares the tokens'
log-probabilities (docs/benchmarks.md, "Log-probabilities").

    python3 scripts/score_against_llama_cpp.py MODEL.gguf http://127.0.0.1:30000 TEXT_FILE [CHARS]

llama.cpp (the `llama_cpp` wheel `.ci/run` installs) tokenizes the first CHARS characters
(default 600) and evaluates them with every row's logits; each token's log-probability is the
log-softmax of the row before it. The same token ids go to grove as the prompt of
`/v1/completions` with `echo: true, max_tokens: 0, logprobs: 1`.
"""

import json
import math
import sys
import urllib.request

import numpy as np
from llama_cpp import Llama


def main():
    model, base, text_file = sys.argv[1:4]
    chars = int(sys.argv[4]) if len(sys.argv) > 4 else 600
    text = open(text_file).read()[:chars]
    llm = Llama(model_path=model, logits_all=True, n_ctx=4096, verbose=False, n_threads=2)
    ids = llm.tokenize(text.encode(), add_bos=False)
    llm.reset()
    llm.eval(ids)
    logits = np.array(llm.scores[: len(ids)], dtype=np.float64)
    reference = []
    for p in range(len(ids) - 1):
        row = logits[p]
        largest = row.max()
        reference.append(row[ids[p + 1]] - (largest + math.log(np.exp(row - largest).sum())))
    served = json.loads(urllib.request.urlopen(f"{base}/v1/models").read())["data"][0]["id"]
    body = {"model": served, "prompt": ids, "max_tokens": 0, "echo": True, "logprobs": 1}
    request = urllib.request.Request(
        f"{base}/v1/completions", data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    answer = json.loads(urllib.request.urlopen(request).read())
    ours = answer["choices"][0]["logprobs"]["token_logprobs"][1:]
    differences = sorted(abs(a - b) for a, b in zip(ours, reference))
    print(f"{len(ids)} tokens: mean log-probability grove {sum(ours) / len(ours):.4f}, "
          f"llama.cpp {sum(reference) / len(reference):.4f}; per-token |difference| median "
          f"{differences[len(differences) // 2]:.3f}, largest {differences[-1]:.3f}")


if __name__ == "__main__":
    main()
