"""A Qwen2 GGUF target in PyTorch, frozen: the file's tensors dequantized on the device, a
causal forward that returns the tapped layers' outputs, and batched greedy generation.

Used only to make a drafter's training data on a GPU, where grove's CPU kernels would take
days; the drafter it trains runs in grove. The formats are GGML's (llama.cpp `ggml-common.h`):
Q8_0, Q5_0, Q4_K and Q6_K are the ones the Qwen2.5-Coder GGUFs use.
"""

import struct

import numpy as np
import torch
import torch.nn.functional as F

GGUF_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
F32, F16, Q4_0, Q5_0, Q8_0, Q4_K, Q6_K = 0, 1, 2, 6, 8, 12, 14
# Bytes per block and values per block of each quantized type.
BLOCKS = {Q5_0: (22, 32), Q8_0: (34, 32), Q4_K: (144, 256), Q6_K: (210, 256)}


class Reader:
    def __init__(self, data):
        self.data, self.at = data, 0

    def take(self, fmt):
        value = struct.unpack_from(fmt, self.data, self.at)
        self.at += struct.calcsize(fmt)
        return value[0]

    def string(self):
        n = self.take("<Q")
        text = bytes(self.data[self.at : self.at + n]).decode("utf-8", "replace")
        self.at += n
        return text

    def value(self, kind):
        if kind == 8:
            return self.string()
        if kind == 9:
            inner, n = self.take("<I"), self.take("<Q")
            return [self.value(inner) for _ in range(n)]
        return self.take(GGUF_SCALARS[kind])


def read_gguf(path):
    """Metadata, tensor table `{name: (type, shape as [rows, cols...] outer first, offset)}`,
    and the file mapped as bytes."""
    data = np.memmap(path, dtype=np.uint8, mode="r")
    r = Reader(data)
    assert bytes(data[:4]) == b"GGUF", f"{path}: not a GGUF file"
    r.at = 4
    version, n_tensors, n_kv = r.take("<I"), r.take("<Q"), r.take("<Q")
    assert version >= 2, f"GGUF version {version}"
    meta = {}
    for _ in range(n_kv):
        key = r.string()
        meta[key] = r.value(r.take("<I"))
    tensors = {}
    for _ in range(n_tensors):
        name = r.string()
        dims = [r.take("<Q") for _ in range(r.take("<I"))]
        kind, offset = r.take("<I"), r.take("<Q")
        tensors[name] = (kind, list(reversed(dims)), offset)
    align = meta.get("general.alignment", 32)
    start = (r.at + align - 1) // align * align
    return meta, tensors, data, start


def _f16(raw, at):
    """The f16 at byte `at` of every block row of `raw` [blocks, bytes], as f32."""
    return raw[:, at : at + 2].contiguous().view(torch.float16).float()


def _q4k_scales(s):
    """The 8 sub-block scales and mins of Q4_K's 12 packed bytes `s` [blocks, 12]."""
    s = s.long()
    sc = torch.empty(s.shape[0], 8, dtype=torch.long, device=s.device)
    mn = torch.empty_like(sc)
    sc[:, :4], mn[:, :4] = s[:, 0:4] & 63, s[:, 4:8] & 63
    sc[:, 4:] = (s[:, 8:12] & 15) | ((s[:, 0:4] >> 6) << 4)
    mn[:, 4:] = (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)
    return sc.float(), mn.float()


def dequantize(kind, raw, count):
    """`count` values of type `kind` from the bytes `raw` (a uint8 tensor), as f32."""
    if kind == F32:
        return raw.view(torch.float32)[:count].clone()
    if kind == F16:
        return raw.view(torch.float16)[:count].float()
    size, per = BLOCKS[kind]
    b = raw.view(-1, size)
    if kind == Q8_0:
        q = b[:, 2:].contiguous().view(torch.int8).float()
        return (q * _f16(b, 0)).reshape(-1)
    if kind == Q5_0:
        qh = b[:, 2:6].contiguous().view(torch.int32).long()
        ql = b[:, 6:].long()
        bits = torch.arange(32, device=raw.device)
        high = ((qh >> bits) & 1) << 4
        q = torch.cat([ql & 15, ql >> 4], dim=1) | high
        return ((q - 16).float() * _f16(b, 0)).reshape(-1)
    if kind == Q4_K:
        d, dmin = _f16(b, 0), _f16(b, 2)
        sc, mn = _q4k_scales(b[:, 4:16])
        qs = b[:, 16:].long().view(-1, 4, 32)
        q = torch.stack([qs & 15, qs >> 4], dim=2).reshape(-1, 8, 32).float()
        return (d[:, :, None] * sc[:, :, None] * q - dmin[:, :, None] * mn[:, :, None]).reshape(-1)
    if kind == Q6_K:
        ql = b[:, :128].long().view(-1, 2, 64)
        qh = b[:, 128:192].long().view(-1, 2, 32)
        sc = b[:, 192:208].contiguous().view(torch.int8).float().view(-1, 2, 8)
        d = _f16(b, 208)
        # Per half of 128: four quarters of 32, quarter i's low 4 bits from ql (halves of the
        # 64 bytes, low then high nibble) and its top 2 bits from qh's bit pair i.
        low = torch.stack([ql[:, :, :32] & 15, ql[:, :, 32:] & 15, ql[:, :, :32] >> 4, ql[:, :, 32:] >> 4], 2)
        top = torch.stack([(qh >> (2 * i)) & 3 for i in range(4)], 2)
        q = ((low | (top << 4)) - 32).float()  # [blocks, 2, 4, 32]
        scale = sc.view(-1, 2, 4, 2)  # 16 values share a scale: quarter i, its two halves
        q = q.view(-1, 2, 4, 2, 16) * scale[..., None]
        return (d * q.reshape(-1, 256)).reshape(-1)
    raise ValueError(f"GGML type {kind} is not supported here")


class Target:
    """The GGUF target's weights on `device` in `dtype`, and its forward."""

    def __init__(self, path, device, dtype=torch.bfloat16):
        meta, tensors, data, start = read_gguf(path)
        arch = meta["general.architecture"]
        assert arch == "qwen2", f"only qwen2 targets are supported here, not {arch}"
        self.layers = meta[f"{arch}.block_count"]
        self.hidden = meta[f"{arch}.embedding_length"]
        self.heads = meta[f"{arch}.attention.head_count"]
        self.kv_heads = meta[f"{arch}.attention.head_count_kv"]
        self.head_dim = self.hidden // self.heads
        self.eps = meta[f"{arch}.attention.layer_norm_rms_epsilon"]
        self.theta = meta.get(f"{arch}.rope.freq_base", 10000.0)
        self.device, self.dtype = device, dtype
        self.w = {}
        for name, (kind, shape, offset) in tensors.items():
            count = int(np.prod(shape))
            nbytes = count * 4 if kind == F32 else count * 2 if kind == F16 else count // BLOCKS[kind][1] * BLOCKS[kind][0]
            raw = torch.from_numpy(np.asarray(data[start + offset : start + offset + nbytes])).to(device)
            values = dequantize(kind, raw, count).view(shape)
            keep_f32 = name.endswith("norm.weight") or name.endswith(".bias")
            self.w[name] = values if keep_f32 else values.to(dtype)
        if "output.weight" not in self.w:
            self.w["output.weight"] = self.w["token_embd.weight"]
        self.vocab = self.w["token_embd.weight"].shape[0]
        inv = 1.0 / self.theta ** (torch.arange(0, self.head_dim, 2, device=device).float() / self.head_dim)
        self.inv_freq = inv

    def norm(self, x, weight):
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps) * weight).to(x.dtype)

    def rope(self, x, positions):
        """NeoX rotation of `x` [B, heads, T, d] at `positions` [B, T]."""
        return rotate(x, positions, self.inv_freq)

    def embed(self, ids):
        return self.w["token_embd.weight"][ids]

    def forward(self, ids, positions, cache, slot, mask, taps):
        """Runs tokens `ids` [B, T] at `positions` into `cache` slots `slot..slot+T` with
        `mask` [B, 1, T, slots] (True: attend); returns the final-normed last hidden
        [B, T, H] and the outputs of layers `taps` [B, T, len(taps), H]."""
        x = self.embed(ids)
        B, T, _ = x.shape
        tapped = []
        for i in range(self.layers):
            p = f"blk.{i}."
            h = self.norm(x, self.w[p + "attn_norm.weight"])
            q = (h @ self.w[p + "attn_q.weight"].T + self.w[p + "attn_q.bias"].to(h.dtype)).view(B, T, self.heads, -1).transpose(1, 2)
            k = (h @ self.w[p + "attn_k.weight"].T + self.w[p + "attn_k.bias"].to(h.dtype)).view(B, T, self.kv_heads, -1).transpose(1, 2)
            v = (h @ self.w[p + "attn_v.weight"].T + self.w[p + "attn_v.bias"].to(h.dtype)).view(B, T, self.kv_heads, -1).transpose(1, 2)
            q, k = self.rope(q, positions), self.rope(k, positions)
            keys, values = cache[i]
            keys[:, :, slot : slot + T] = k
            values[:, :, slot : slot + T] = v
            a = F.scaled_dot_product_attention(
                q, keys[:, :, : mask.shape[-1]], values[:, :, : mask.shape[-1]], attn_mask=mask, enable_gqa=True
            )
            x = x + a.transpose(1, 2).reshape(B, T, -1) @ self.w[p + "attn_output.weight"].T
            h = self.norm(x, self.w[p + "ffn_norm.weight"])
            gate = F.silu(h @ self.w[p + "ffn_gate.weight"].T) * (h @ self.w[p + "ffn_up.weight"].T)
            x = x + gate @ self.w[p + "ffn_down.weight"].T
            if i in taps:
                tapped.append(x)
        return self.norm(x, self.w["output_norm.weight"]), torch.stack(tapped, 2)

    def new_cache(self, batch, slots):
        shape = (batch, self.kv_heads, slots, self.head_dim)
        return [(torch.zeros(shape, dtype=self.dtype, device=self.device), torch.zeros(shape, dtype=self.dtype, device=self.device)) for _ in range(self.layers)]

    @torch.no_grad()
    def generate(self, prompts, new_tokens, taps, stop_ids, prompt_cap):
        """Greedy continuations of `prompts` (lists of ids, at most `prompt_cap` long),
        left-padded to `prompt_cap`. Returns tokens [B, cap + new] (pad 0), the taps of every
        slot [B, cap + new, len(taps), H], each row's first slot, and each row's end (one past
        its last real token: the first stop token is kept, nothing after it). The last slot has
        no features (its token was never run); a training block's context never reaches it."""
        B, total = len(prompts), prompt_cap + new_tokens
        ids = torch.zeros(B, total, dtype=torch.long, device=self.device)
        first = torch.tensor([prompt_cap - len(p) for p in prompts], device=self.device)
        for row, p in enumerate(prompts):
            ids[row, prompt_cap - len(p) : prompt_cap] = torch.tensor(p, device=self.device)
        slots = torch.arange(total, device=self.device)
        positions = (slots[None, :] - first[:, None]).clamp(min=0)
        key_ok = slots[None, :] >= first[:, None]  # [B, total]
        causal = slots[:, None] >= slots[None, :]
        cache = self.new_cache(B, total)
        features = torch.zeros(B, total, len(taps), self.hidden, dtype=self.dtype, device=self.device)
        # Prefill: pad queries see themselves only, so no row of the mask is empty.
        mask = (causal[None, :prompt_cap, :prompt_cap] & key_ok[:, None, :prompt_cap]) | torch.eye(prompt_cap, dtype=torch.bool, device=self.device)[None]
        last, tapped = self.forward(ids[:, :prompt_cap], positions[:, :prompt_cap], cache, 0, mask[:, None], taps)
        features[:, :prompt_cap] = tapped
        end = torch.full((B,), total, device=self.device)
        stops = torch.tensor(stop_ids, device=self.device)
        for step in range(new_tokens):
            at = prompt_cap + step
            token = (last[:, -1] @ self.w["output.weight"].T).argmax(-1)
            ids[:, at] = token
            stopped = torch.isin(token, stops) & (end == total)
            end = torch.where(stopped, at + 1, end)
            if step == new_tokens - 1 or bool((end < total).all()):
                break
            mask = key_ok[:, None, None, : at + 1]
            last, tapped = self.forward(ids[:, at : at + 1], positions[:, at : at + 1], cache, at, mask, taps)
            features[:, at : at + 1] = tapped
        return ids, features, first, end


def rotate(x, positions, inv_freq):
    """NeoX ("rotate half") RoPE of `x` [B, heads, T, d] at `positions` [B, T]."""
    angles = positions[:, None, :, None].float() * inv_freq
    cos, sin = torch.cos(angles), torch.sin(angles)
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).to(x.dtype)
