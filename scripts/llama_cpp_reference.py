#!/usr/bin/env python3
"""llama.cpp (through llama-cpp-python) as grove's reference on GGUF files.

Reads one JSON request from stdin, writes one JSON answer to stdout:

  {"command": "tokenize", "model": PATH, "texts": [...]}
      -> {"ids": [[...], ...], "decoded": [...], "decoded_without_special": [...]}
     (add_bos = false, special tokens parsed, as grove's `encode(text, false)`)
  {"command": "greedy", "model": PATH, "prompts": [[ids], ...], "max_new_tokens": N, "top": K}
      -> {"outputs": [{"tokens": [...], "top": [[[id, logit], ...] per step]}, ...]}
  {"command": "bench", "model": PATH, "prompt": [ids], "new_tokens": N, "threads": T,
   "repetitions": R}
      -> {"prefill_tokens_per_s": [...], "decode_tokens_per_s": [...],
          "peak_rss_bytes": ..., "rss_before_load_bytes": ...}
  {"command": "verify", "model": PATH, "context": C, "rows": [N, ...], "threads": T,
   "repetitions": R}
      -> {"ms": [[R times], ...]}: one forward of N tokens after C tokens of context, every
     row's logits computed (as a speculative verify needs them), per N

  {"command": "dequantize", "type": "iq3_s", "blocks": HEX, "values": N}
      -> {"values": [...]}: ggml's `dequantize_row_<type>` of N values from the blocks

Install: `pip install llama-cpp-python` builds llama.cpp from source (about 12 minutes on two
cores). `.ci/run` keeps the built wheel in ~/.cache/grove/wheels and installs from there when it
is present (see scripts/install_llama_cpp.sh).
"""

import json
import resource
import sys
import time


def load(path, threads=2, n_ctx=2048, f32_cache=False, logits_all=False):
    """`f32_cache`: keys and values kept in f32 (llama.cpp's default is f16) for the
    correctness reference, so that its logits carry no rounding grove does not do."""
    from llama_cpp import Llama

    import llama_cpp

    cache = {"type_k": llama_cpp.GGML_TYPE_F32, "type_v": llama_cpp.GGML_TYPE_F32}
    return Llama(
        model_path=path,
        n_ctx=n_ctx,
        n_threads=threads,
        n_threads_batch=threads,
        n_batch=512,
        logits_all=logits_all,
        verbose=False,
        **(cache if f32_cache else {}),
    )


def last_logits(llm):
    """The logits of the last evaluated token (llama-cpp-python 0.3 keeps `scores` only with
    logits_all, so read llama.cpp's buffer directly)."""
    import numpy as np

    import llama_cpp

    pointer = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
    return np.ctypeslib.as_array(pointer, shape=(llm.n_vocab(),)).copy()


def detokenize(llm, tokens, special):
    """llama.cpp's pieces joined, as `Llama.detokenize` joins them but without its 32-byte
    buffer, which turns any longer piece (Qwen's runs of 33+ spaces) into nothing."""
    import ctypes

    import llama_cpp

    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    output = b""
    for token in tokens:
        size = 64
        while True:
            buffer = (ctypes.c_char * size)()
            n = llama_cpp.llama_token_to_piece(vocab, token, buffer, size, 0, special)
            if n >= 0:
                output += bytes(buffer[:n])
                break
            size = -n
    return output


def tokenize(request):
    llm = load(request["model"])
    ids = [llm.tokenize(t.encode("utf-8"), add_bos=False, special=True) for t in request["texts"]]
    def text(i, special):
        return detokenize(llm, i, special).decode("utf-8", errors="replace")

    return {
        "ids": ids,
        "decoded": [text(i, True) for i in ids],
        "decoded_without_special": [text(i, False) for i in ids],
    }


def greedy(request):
    import numpy as np

    llm = load(request["model"], f32_cache=True)
    top = request.get("top", 8)
    outputs = []
    for prompt in request["prompts"]:
        llm.reset()
        llm.eval(prompt)
        tokens, tops = [], []
        for _ in range(request["max_new_tokens"]):
            logits = last_logits(llm)
            best = np.argpartition(-logits, top)[:top]
            order = best[np.argsort(-logits[best], kind="stable")]
            tops.append([[int(i), float(logits[i])] for i in order])
            token = int(order[0])
            tokens.append(token)
            llm.eval([token])
        outputs.append({"tokens": tokens, "top": tops})
    return {"outputs": outputs}


def rss_bytes():
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def bench(request):
    before = rss_bytes()
    llm = load(request["model"], threads=request.get("threads", 2))
    prompt = request["prompt"]
    prefill, decode = [], []
    for _ in range(request.get("repetitions", 3)):
        llm.reset()
        start = time.perf_counter()
        llm.eval(prompt)
        prefill.append(len(prompt) / (time.perf_counter() - start))
        start = time.perf_counter()
        for _ in range(request["new_tokens"]):
            token = int(last_logits(llm).argmax())
            llm.eval([token])
        decode.append(request["new_tokens"] / (time.perf_counter() - start))
    return {
        "prefill_tokens_per_s": prefill,
        "decode_tokens_per_s": decode,
        "peak_rss_bytes": rss_bytes(),
        "rss_before_load_bytes": before,
    }


def verify(request):
    import random

    context, counts = request["context"], request["rows"]
    llm = load(
        request["model"],
        threads=request.get("threads", 2),
        n_ctx=context + max(counts) + 16,
        logits_all=True,
    )
    rng = random.Random(0)
    vocab = llm.n_vocab()
    llm.eval([rng.randrange(vocab) for _ in range(context)])
    times = []
    for rows in counts:
        tokens = [rng.randrange(vocab) for _ in range(rows)]
        measured = []
        # One untimed forward first, as grove's curve does.
        for repetition in range(request.get("repetitions", 3) + 1):
            # Back to the context: `eval` drops the cache past `n_tokens` before it runs.
            llm.n_tokens = context
            start = time.perf_counter()
            llm.eval(tokens)
            if repetition > 0:
                measured.append((time.perf_counter() - start) * 1e3)
        times.append(measured)
    return {"ms": times}


def dequantize(request):
    """ggml's own `dequantize_row_<type>` (in llama.cpp's libggml-base) on the blocks."""
    import ctypes
    import os

    import llama_cpp

    llama_cpp.llama_backend_init()
    lib = ctypes.CDLL(os.path.join(os.path.dirname(llama_cpp.__file__), "lib", "libggml-base.so"))
    function = getattr(lib, "dequantize_row_" + request["type"])
    function.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    function.restype = None
    blocks = bytes.fromhex(request["blocks"])
    count = request["values"]
    source = ctypes.create_string_buffer(blocks, len(blocks))
    values = (ctypes.c_float * count)()
    function(source, values, count)
    return {"values": list(values)}


def main():
    request = json.load(sys.stdin)
    commands = {
        "tokenize": tokenize,
        "greedy": greedy,
        "bench": bench,
        "verify": verify,
        "dequantize": dequantize,
    }
    command = commands.get(request.get("command"))
    if command is None:
        sys.exit(f"unknown command {request.get('command')!r}; one of {sorted(commands)}")
    json.dump(command(request), sys.stdout)


if __name__ == "__main__":
    main()
