"""Trains a DFlash drafter for a GGUF target on one GPU, inside a fixed time budget, in the
z-lab format grove loads (config.json, safetensors, a reduced draft vocabulary as `d2t`).

The DFlash recipe (arXiv 2602.06036): the target's own greedy continuations of prompts are
the data; for an anchor token at position a, the drafter sees the target's tapped hidden
states of positions < a as keys/values, embeds the block [token a, MASK x (S-1)], and learns
to predict the target's tokens a+1..a+S-1 in one bidirectional pass. Every stage is bounded
by wall-clock time so the whole run fits a lease; the drafter is saved after every evaluation.

    python3 train.py --model target.gguf --prompts prompts.json --out DIR --seconds 420
"""

import argparse
import gzip
import json
import math
import os
import random
import time

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from target import Target, rotate


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--prompts", required=True, help='{"train": [[ids]], "eval": [[ids]]}')
    p.add_argument("--out", required=True)
    p.add_argument("--seconds", type=float, default=420, help="whole run, loading included")
    p.add_argument("--gen-seconds", type=float, default=100)
    p.add_argument("--device", default="cuda")
    p.add_argument("--taps", default="1,9,17,25")
    p.add_argument("--block", type=int, default=16)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--intermediate", type=int, default=1280)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--draft-vocab", type=int, default=32768)
    p.add_argument("--mask-id", type=int, default=151665)
    p.add_argument("--stop-ids", default="151643,151645")
    p.add_argument("--prompt-cap", type=int, default=192)
    p.add_argument("--new-tokens", type=int, default=160)
    p.add_argument("--gen-batch", type=int, default=512)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--anchors", type=int, default=24)
    p.add_argument("--lr", type=float, default=6e-4)
    p.add_argument("--gamma", type=float, default=5.0, help="slot j's loss weight exp(-(j-1)/gamma)")
    p.add_argument("--eval-every", type=float, default=30, help="seconds")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


class RmsNorm(torch.nn.Module):
    def __init__(self, size, eps=1e-6):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x):
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight).to(x.dtype)


class Layer(torch.nn.Module):
    """A Qwen3 decoder layer whose keys/values also come from the fused context."""

    def __init__(self, a):
        super().__init__()
        h, d = a.hidden, a.head_dim
        self.heads, self.kv_heads, self.d = a.heads, a.kv_heads, d
        lin = lambda i, o: torch.nn.Linear(i, o, bias=False)
        self.q_proj, self.k_proj = lin(h, a.heads * d), lin(h, a.kv_heads * d)
        self.v_proj, self.o_proj = lin(h, a.kv_heads * d), lin(a.heads * d, h)
        self.q_norm, self.k_norm = RmsNorm(d), RmsNorm(d)
        self.input_layernorm, self.post_attention_layernorm = RmsNorm(h), RmsNorm(h)
        self.gate_proj, self.up_proj = lin(h, a.intermediate), lin(h, a.intermediate)
        self.down_proj = lin(a.intermediate, h)

    def kv(self, x, positions, inv_freq):
        B, T, _ = x.shape
        k = self.k_norm(self.k_proj(x).view(B, T, self.kv_heads, self.d)).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.kv_heads, self.d).transpose(1, 2)
        return rotate(k, positions, inv_freq), v

    def forward(self, x, ctx, positions, ctx_positions, mask, inv_freq):
        B, T, _ = x.shape
        h = self.input_layernorm(x)
        q = self.q_norm(self.q_proj(h).view(B, T, self.heads, self.d)).transpose(1, 2)
        q = rotate(q, positions, inv_freq)
        k_blk, v_blk = self.kv(h, positions, inv_freq)
        k_ctx, v_ctx = self.kv(ctx, ctx_positions, inv_freq)
        keys, values = torch.cat([k_ctx, k_blk], 2), torch.cat([v_ctx, v_blk], 2)
        a = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=True)
        x = x + self.o_proj(a.transpose(1, 2).reshape(B, T, -1))
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class Drafter(torch.nn.Module):
    def __init__(self, a, taps, theta=1e6):
        super().__init__()
        self.fc = torch.nn.Linear(len(taps) * a.hidden, a.hidden, bias=False)
        self.hidden_norm = RmsNorm(a.hidden)
        self.layers = torch.nn.ModuleList(Layer(a) for _ in range(a.layers))
        self.norm = RmsNorm(a.hidden)
        self.register_buffer("inv_freq", 1.0 / theta ** (torch.arange(0, a.head_dim, 2).float() / a.head_dim), persistent=False)

    def forward(self, x, features, positions, ctx_positions, mask):
        ctx = self.hidden_norm(self.fc(features.flatten(2)))
        for layer in self.layers:
            x = layer(x, ctx, positions, ctx_positions, mask, self.inv_freq)
        return self.norm(x)


class Data:
    """Generated batches: tokens, taps, each row's first and end slot, on the GPU."""

    def __init__(self, target, prompts, a, taps, seconds, label):
        self.batches, t0 = [], time.time()
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        chunks = [order[i : i + a.gen_batch] for i in range(0, len(order), a.gen_batch)]
        random.Random(a.seed).shuffle(chunks)
        stops = [int(s) for s in a.stop_ids.split(",")]
        for chunk in chunks:
            if time.time() - t0 > seconds or memory_full(target.device):
                break
            rows = [prompts[i][-a.prompt_cap :] for i in chunk]
            ids, feats, first, end = target.generate(rows, a.new_tokens, taps, stops, a.prompt_cap)
            keep = end - a.prompt_cap >= 3
            self.batches.append((ids[keep], feats[keep], first[keep], end[keep]))
            log(f"{label}: batch of {len(rows)}, {int((end - a.prompt_cap).sum())} new tokens, {time.time() - t0:.1f} s")
        self.tokens = sum(int((b[3] - a.prompt_cap).sum()) for b in self.batches)
        self.cap = a.prompt_cap


def memory_full(device, limit=0.6):
    """Whether the data already holds `limit` of the GPU's memory (training needs the rest)."""
    if torch.device(device).type != "cuda":
        return False
    return torch.cuda.memory_allocated(device) > limit * torch.cuda.get_device_properties(device).total_memory


def sample_blocks(ids, first, end, anchors, a, generator=None):
    """Anchor slots [B, N] among each row's generated tokens, the blocks' token ids and
    positions [B, N*S], labels [B, N, S-1] (-1: past the row's end), and the attention mask
    [B, 1, N*S, T + N*S] over context slots `0..T` and the blocks."""
    B, S, device = ids.shape[0], a.block, ids.device
    if anchors is None:
        span = (end - 2 - a.prompt_cap + 1).clamp(min=1)
        r = torch.rand(B, a.anchors, device=device, generator=generator)
        anchors = a.prompt_cap + (r * span[:, None]).long()
    N = anchors.shape[1]
    offsets = torch.arange(S, device=device)
    slots = anchors[:, :, None] + offsets  # [B, N, S]
    labels = torch.gather(ids, 1, slots.clamp(max=ids.shape[1] - 1).flatten(1)).view(B, N, S)
    labels = torch.where(slots < end[:, None, None], labels, -1)[:, :, 1:]
    block = torch.full((B, N, S), a.mask_id, device=device)
    block[:, :, 0] = torch.gather(ids, 1, anchors)
    positions = (slots - first[:, None, None]).flatten(1)
    T = int(anchors.max())
    ctx = torch.arange(T, device=device)
    sees_ctx = (ctx[None, None, :] >= first[:, None, None]) & (ctx[None, None, :] < anchors[:, :, None])  # [B, N, T]
    same = torch.eye(N, dtype=torch.bool, device=device)[:, None, :, None].expand(N, S, N, S).reshape(N * S, N * S)
    mask = torch.cat([sees_ctx[:, :, None, :].expand(B, N, S, T).reshape(B, N * S, T), same[None].expand(B, -1, -1)], 2)
    ctx_positions = (ctx[None, :] - first[:, None]).clamp(min=0)
    return block.flatten(1), positions, labels, mask[:, None], T, ctx_positions


def run_drafter(drafter, target, head, ids, feats, first, end, a, anchors=None, generator=None):
    block, positions, labels, mask, T, ctx_positions = sample_blocks(ids, first, end, anchors, a, generator)
    with torch.autocast("cuda" if ids.is_cuda else "cpu", dtype=torch.bfloat16):
        hidden = drafter(target.embed(block).to(torch.bfloat16), feats[:, :T], positions, ctx_positions, mask)
        B, N = labels.shape[:2]
        hidden = hidden.view(B, N, a.block, -1)[:, :, 1:]
        logits = hidden @ head.T  # [B, N, S-1, draft vocab]
    return logits.float(), labels


def evaluate(drafter, target, head, d2t, data, a):
    """Teacher-forced acceptance on held-out generations: for anchors every 3rd slot, how
    many of the drafter's argmax tokens match the target's before the first miss (a chain's
    accepted drafts); tau = 1 + that mean. Also each slot's accuracy."""
    drafter.eval()
    accepted, per_slot, count = 0.0, torch.zeros(a.block - 1), 0
    with torch.no_grad():
        for ids, feats, first, end in data.batches:
            for lo in range(0, ids.shape[0], 16):
                sl = slice(lo, lo + 16)
                grid = torch.arange(a.prompt_cap, a.prompt_cap + a.new_tokens - 2, 3, device=ids.device)
                anchors = grid[None].expand(ids[sl].shape[0], -1)
                anchors = torch.minimum(anchors, (end[sl] - 2)[:, None].clamp(min=a.prompt_cap))
                logits, labels = run_drafter(drafter, target, head, ids[sl], feats[sl], first[sl], end[sl], a, anchors)
                guess = d2t[logits.argmax(-1)]
                hit = (guess == labels) & (labels >= 0)
                valid = anchors < (end[sl] - 2)[:, None]
                run = torch.cumprod(hit.long(), -1)
                accepted += float(run.sum(-1)[valid].sum())
                per_slot += hit[valid].float().sum(0).cpu()
                count += int(valid.sum())
    drafter.train()
    return 1 + accepted / max(count, 1), (per_slot / max(count, 1)).tolist()


def export(drafter, a, taps, d2t, target, out, note):
    os.makedirs(out, exist_ok=True)
    tensors = {rename(k): v.detach().to(torch.bfloat16).cpu().contiguous() for k, v in drafter.state_dict().items()}
    tensors["d2t"] = d2t.long().cpu()
    # One file, as grove ships drafters; a lease hands back files of at most 16 MiB, so the
    # lease command splits the directory's tar (README.md), never a tensor.
    save_file(tensors, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    config = {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "block_size": a.block,
        "dflash_config": {"mask_token_id": a.mask_id, "target_layer_ids": taps, "draft_vocab_size": int(d2t.numel())},
        "num_target_layers": target.layers,
        "hidden_size": a.hidden,
        "intermediate_size": a.intermediate,
        "num_hidden_layers": a.layers,
        "num_attention_heads": a.heads,
        "num_key_value_heads": a.kv_heads,
        "head_dim": a.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "rope_theta": 1e6,
        "max_position_embeddings": 32768,
        "attention_bias": False,
        "tie_word_embeddings": False,
        "vocab_size": target.vocab,
        "torch_dtype": "bfloat16",
    }
    json.dump(config, open(os.path.join(out, "config.json"), "w"), indent=2)
    json.dump(note, open(os.path.join(out, "training.json"), "w"), indent=1)


def rename(key):
    """z-lab's names: the MLP's projections under `mlp.`, attention's under `self_attn.`."""
    for part in ("gate_proj", "up_proj", "down_proj"):
        key = key.replace(f".{part}", f".mlp.{part}")
    for part in ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm"):
        key = key.replace(f".{part}", f".self_attn.{part}")
    return key


def log(message):
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def main():
    a = parse()
    start = time.time()
    torch.manual_seed(a.seed)
    random.seed(a.seed)
    taps = [int(t) for t in a.taps.split(",")]
    target = Target(a.model, a.device)
    a.hidden = target.hidden
    log(f"target: {target.layers} layers, hidden {target.hidden}, loaded in {time.time() - start:.1f} s")
    prompts = json.load((gzip.open if a.prompts.endswith(".gz") else open)(a.prompts, "rt"))
    evaluation = Data(target, prompts["eval"], a, taps, 1e9, "eval")
    train = Data(target, prompts["train"], a, taps, a.gen_seconds, "train")
    log(f"data: {train.tokens} training tokens, {evaluation.tokens} held-out, {time.time() - start:.1f} s")

    counts = torch.zeros(target.vocab, dtype=torch.long, device=a.device)
    for ids, _, _, end in train.batches:
        slots = torch.arange(ids.shape[1], device=a.device)
        gen = (slots[None] >= a.prompt_cap) & (slots[None] < end[:, None])
        counts += torch.bincount(ids[gen], minlength=target.vocab)
    d2t = torch.sort(torch.topk(counts, a.draft_vocab).indices).values
    covered = float(counts[d2t].sum()) / float(counts.sum())
    log(f"draft vocabulary {a.draft_vocab}: covers {covered:.4%} of generated tokens")
    t2d = torch.full((target.vocab,), -1, dtype=torch.long, device=a.device)
    t2d[d2t] = torch.arange(d2t.numel(), device=a.device)
    head = target.w["output.weight"][d2t].contiguous()

    drafter = Drafter(a, taps).to(a.device)
    for name, p in drafter.named_parameters():
        if p.dim() == 2:
            torch.nn.init.normal_(p, std=0.02)
    params = sum(p.numel() for p in drafter.parameters())
    log(f"drafter: {params / 1e6:.1f} M parameters")
    decay = [p for p in drafter.parameters() if p.dim() == 2]
    rest = [p for p in drafter.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": rest, "weight_decay": 0.0}], lr=a.lr, betas=(0.9, 0.95))
    weights = torch.exp(-torch.arange(a.block - 1, device=a.device).float() / a.gamma)

    train_start = time.time()
    train_seconds = a.seconds - (train_start - start) - 25
    history, step, last_eval, losses = [], 0, train_start, []
    while True:
        elapsed = time.time() - train_start
        done = elapsed >= train_seconds
        if done or time.time() - last_eval >= a.eval_every:
            tau, slots = evaluate(drafter, target, head, d2t, evaluation, a)
            loss = sum(losses) / max(len(losses), 1)
            history.append({"seconds": round(elapsed, 1), "step": step, "loss": loss, "tau": tau, "slot_accuracy": slots})
            log(f"step {step}: loss {loss:.4f}, held-out tau {tau:.3f}, slot accuracy {[round(s, 3) for s in slots[:6]]}")
            losses, last_eval = [], time.time()
            note = {"history": history, "args": vars(a), "tokens": train.tokens, "held_out_tokens": evaluation.tokens, "draft_vocab_coverage": covered, "parameters": params}
            export(drafter, a, taps, d2t, target, a.out, note)
            if done:
                break
        fraction = elapsed / train_seconds
        lr = a.lr * min(1.0, fraction / 0.03) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(fraction, 1.0))))
        for group in opt.param_groups:
            group["lr"] = lr
        ids, feats, first, end = random.choice(train.batches)
        rows = torch.randint(0, ids.shape[0], (a.batch,), device=a.device)
        logits, labels = run_drafter(drafter, target, head, ids[rows], feats[rows], first[rows], end[rows], a)
        target_ids = torch.where(labels >= 0, t2d[labels.clamp(min=0)], -1)
        ce = F.cross_entropy(logits.flatten(0, 2), target_ids.flatten(), ignore_index=-1, reduction="none").view(target_ids.shape)
        w = weights * (target_ids >= 0)
        loss = (ce * w).sum() / w.sum().clamp(min=1)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        step += 1
    log(f"done in {time.time() - start:.1f} s")


if __name__ == "__main__":
    main()
