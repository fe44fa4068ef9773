"""Checks `target.py` on a CPU before a lease: every GGML type in a GGUF file decodes to
gguf-py's values exactly, and a padded row of a batch generates what the row alone does.
Needs torch and gguf (`pip install torch gguf`).

    python3 check_target.py MODEL.gguf [PROMPT_IDS, comma-separated]
"""

import sys

import gguf
import numpy as np
import torch

from target import Target, dequantize, read_gguf


def check_types(path):
    meta, tensors, data, start = read_gguf(path)
    seen = set()
    for t in gguf.GGUFReader(path).tensors:
        kind, shape, offset = tensors[t.name]
        if kind in seen:
            continue
        seen.add(kind)
        reference = gguf.quants.dequantize(t.data, t.tensor_type).reshape(-1)
        raw = torch.from_numpy(np.array(data[start + offset : start + offset + t.n_bytes]))
        ours = dequantize(kind, raw, int(np.prod(shape))).numpy()
        difference = float(np.abs(ours - reference).max())
        print(f"{t.name} ({t.tensor_type.name}): largest difference {difference}")
        assert difference == 0.0


def check_padding(path, prompt):
    model = Target(path, "cpu", torch.float32)
    stops = [151643, 151645]
    short = prompt[len(prompt) // 2 :]
    ids, feats, _, _ = model.generate([prompt, short], 24, [1], stops, len(prompt))
    alone, alone_feats, _, _ = model.generate([short], 24, [1], stops, len(short))
    pad = len(prompt) - len(short)
    assert ids[1, len(prompt) :].tolist() == alone[0, len(short) :].tolist()
    difference = float((feats[1, pad:-1] - alone_feats[0, :-1]).abs().max())
    print(f"padded row: same 24 tokens, taps differ by at most {difference}")
    assert difference < 1e-3
    print("greedy continuation:", ids[0, len(prompt) :].tolist())


if __name__ == "__main__":
    check_types(sys.argv[1])
    prompt = [int(i) for i in (sys.argv[2] if len(sys.argv) > 2 else "750,75698,1445,982,262,4210,5598,279,308,7563,79683,1372,14442").split(",")]
    check_padding(sys.argv[1], prompt)
