"""Writes a seeded random Qwen2 GGUF of Qwen2.5's vocabulary size with tiny layers (F16 and
F32 tensors), so `train.py` can be run end to end in seconds, on a GPU lease before the real
target has arrived, or on a CPU.

    python3 tiny_gguf.py OUT.gguf
"""

import struct
import sys

import numpy as np

VOCAB, HIDDEN, LAYERS, HEADS, KV_HEADS, FFN = 151936, 32, 2, 2, 1, 64


def string(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def main(path):
    rng = np.random.default_rng(0)
    head = HIDDEN // HEADS
    tensors = {"token_embd.weight": (VOCAB, HIDDEN), "output.weight": (VOCAB, HIDDEN), "output_norm.weight": (HIDDEN,)}
    for i in range(LAYERS):
        p = f"blk.{i}."
        tensors.update({
            p + "attn_norm.weight": (HIDDEN,), p + "ffn_norm.weight": (HIDDEN,),
            p + "attn_q.weight": (HIDDEN, HIDDEN), p + "attn_q.bias": (HIDDEN,),
            p + "attn_k.weight": (KV_HEADS * head, HIDDEN), p + "attn_k.bias": (KV_HEADS * head,),
            p + "attn_v.weight": (KV_HEADS * head, HIDDEN), p + "attn_v.bias": (KV_HEADS * head,),
            p + "attn_output.weight": (HIDDEN, HIDDEN),
            p + "ffn_gate.weight": (FFN, HIDDEN), p + "ffn_up.weight": (FFN, HIDDEN), p + "ffn_down.weight": (HIDDEN, FFN),
        })
    meta = [
        ("general.architecture", 8, string("qwen2")),
        ("qwen2.block_count", 4, struct.pack("<I", LAYERS)),
        ("qwen2.embedding_length", 4, struct.pack("<I", HIDDEN)),
        ("qwen2.feed_forward_length", 4, struct.pack("<I", FFN)),
        ("qwen2.attention.head_count", 4, struct.pack("<I", HEADS)),
        ("qwen2.attention.head_count_kv", 4, struct.pack("<I", KV_HEADS)),
        ("qwen2.rope.freq_base", 6, struct.pack("<f", 1e6)),
        ("qwen2.attention.layer_norm_rms_epsilon", 6, struct.pack("<f", 1e-6)),
    ]
    blobs, infos, offset = [], b"", 0
    for name, shape in tensors.items():
        if name.endswith("norm.weight"):
            data, kind = (1 + 0.1 * rng.standard_normal(shape)).astype(np.float32), 0
        elif len(shape) == 1:
            data, kind = (0.1 * rng.standard_normal(shape)).astype(np.float32), 0
        else:
            data, kind = (rng.standard_normal(shape) / np.sqrt(shape[1])).astype(np.float16), 1
        raw = data.tobytes()
        raw += b"\0" * (-len(raw) % 32)
        dims = list(reversed(shape))
        infos += string(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        infos += struct.pack("<IQ", kind, offset)
        blobs.append(raw)
        offset += len(raw)
    header = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(meta))
    header += b"".join(string(k) + struct.pack("<I", t) + v for k, t, v in meta) + infos
    header += b"\0" * (-len(header) % 32)
    with open(path, "wb") as f:
        f.write(header)
        for blob in blobs:
            f.write(blob)


if __name__ == "__main__":
    main(sys.argv[1])
