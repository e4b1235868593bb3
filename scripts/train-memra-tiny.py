#!/usr/bin/env python3
"""Trains memra-tiny, a small Qwen3-architecture model, on a uint16 token file
and writes its weights as float16 shards plus an index that
build/bin/memra-pack-tiny turns into a GGUF.

    train-memra-tiny.py --data tokens.u16 --out DIR [--minutes 4] [--device cuda]

The model is written out here in plain PyTorch so that nothing but torch (and
numpy) is needed; its maths is the Qwen3 decoder as the project's CPU and CUDA
backends compute it (worker/arch/qwen3.c):

    h   = x + Wo . attn(rope(rmsnorm_q(Wq . n1)), rope(rmsnorm_k(Wk . n1)), Wv . n1)
    out = h + Wdown . (silu(Wgate . n2) * (Wup . n2))

with n1 = rmsnorm(x) * attn_norm, n2 = rmsnorm(h) * ffn_norm, per-head q/k
RMS norms, NeoX-style (rotate-half) RoPE over the whole head, grouped-query
attention, a final RMS norm and an untied output projection.

Training runs for a fixed wall-clock budget (--minutes): the learning rate
warms up, then follows a cosine over the elapsed fraction of the budget, so
the schedule ends where the time does on any machine.

Outputs in --out: shard-00.bin ... (the float16 tensors back to back, each
shard at most --shard-mib MiB), index.json (shapes in PyTorch order
[out, in], byte offsets into the concatenation, the hyper-parameters, the
final loss), and samples on stdout (greedy continuations of --prompts, a JSON
list of token-id lists, decoded with --vocab, the tokenizer.json).
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * self.weight.float()).to(x.dtype)


def rope_tables(n_ctx, head_dim, theta, device):
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device).float() / head_dim))
    ang = torch.outer(torch.arange(n_ctx, device=device).float(), inv)  # [T, d/2]
    ang = torch.cat([ang, ang], dim=-1)                                  # [T, d]
    return ang.cos(), ang.sin()


def rope(x, cos, sin):
    # x: [B, H, T, D]; NeoX: rotate the two halves of each head
    d = x.shape[-1] // 2
    x1, x2 = x[..., :d], x[..., d:]
    rot = torch.cat([-x2, x1], dim=-1)
    return (x.float() * cos + rot.float() * sin).to(x.dtype)


def attention(q, k, v, dropout):
    k, v = expand_kv(k, q), expand_kv(v, q)
    if hasattr(F, "scaled_dot_product_attention"):  # torch >= 2.0: fused kernels
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout)
    t = q.shape[2]
    s = (q.float() @ k.float().transpose(-1, -2)) / math.sqrt(q.shape[-1])
    mask = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
    s = F.dropout(s.masked_fill(~mask, float("-inf")).softmax(-1), dropout)
    return (s @ v.float()).to(q.dtype)


def expand_kv(k, q):
    rep = q.shape[1] // k.shape[1]
    return k if rep == 1 else k.repeat_interleave(rep, dim=1)


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        hd = c["head_dim"]
        self.attn_norm = RMSNorm(c["n_embd"], c["rms_eps"])
        self.q = nn.Linear(c["n_embd"], c["n_head"] * hd, bias=False)
        self.k = nn.Linear(c["n_embd"], c["n_head_kv"] * hd, bias=False)
        self.v = nn.Linear(c["n_embd"], c["n_head_kv"] * hd, bias=False)
        self.o = nn.Linear(c["n_head"] * hd, c["n_embd"], bias=False)
        self.q_norm = RMSNorm(hd, c["rms_eps"])
        self.k_norm = RMSNorm(hd, c["rms_eps"])
        self.ffn_norm = RMSNorm(c["n_embd"], c["rms_eps"])
        self.gate = nn.Linear(c["n_embd"], c["n_ff"], bias=False)
        self.up = nn.Linear(c["n_embd"], c["n_ff"], bias=False)
        self.down = nn.Linear(c["n_ff"], c["n_embd"], bias=False)

    def forward(self, x, cos, sin, dropout):
        b, t, _ = x.shape
        hd = self.c["head_dim"]
        n = self.attn_norm(x)
        q = self.q_norm(self.q(n).view(b, t, -1, hd)).transpose(1, 2)
        k = self.k_norm(self.k(n).view(b, t, -1, hd)).transpose(1, 2)
        v = self.v(n).view(b, t, -1, hd).transpose(1, 2)
        q, k = rope(q, cos[:t], sin[:t]), rope(k, cos[:t], sin[:t])
        a = attention(q, k, v, dropout).transpose(1, 2).reshape(b, t, -1)
        x = x + F.dropout(self.o(a), dropout, self.training)
        n = self.ffn_norm(x)
        return x + F.dropout(self.down(F.silu(self.gate(n)) * self.up(n)), dropout, self.training)


class Model(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.embd = nn.Embedding(c["n_vocab"], c["n_embd"])
        self.blocks = nn.ModuleList(Block(c) for _ in range(c["n_layer"]))
        self.norm = RMSNorm(c["n_embd"], c["rms_eps"])
        self.out = nn.Linear(c["n_embd"], c["n_vocab"], bias=False)
        cos, sin = rope_tables(c["n_ctx"], c["head_dim"], c["rope_theta"], "cpu")
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)
        for blk in self.blocks:  # residual projections scaled down with depth
            nn.init.normal_(blk.o.weight, std=0.02 / math.sqrt(2 * c["n_layer"]))
            nn.init.normal_(blk.down.weight, std=0.02 / math.sqrt(2 * c["n_layer"]))

    def forward(self, ids, dropout=0.0):
        x = self.embd(ids)
        for blk in self.blocks:
            x = blk(x, self.cos, self.sin, dropout if self.training else 0.0)
        return self.out(self.norm(x))

    def gguf_tensors(self):
        """(GGUF name, tensor) in the order the index lists them."""
        yield "token_embd.weight", self.embd.weight
        for i, b in enumerate(self.blocks):
            p = "blk.%d." % i
            yield p + "attn_norm.weight", b.attn_norm.weight
            yield p + "attn_q.weight", b.q.weight
            yield p + "attn_k.weight", b.k.weight
            yield p + "attn_v.weight", b.v.weight
            yield p + "attn_output.weight", b.o.weight
            yield p + "attn_q_norm.weight", b.q_norm.weight
            yield p + "attn_k_norm.weight", b.k_norm.weight
            yield p + "ffn_norm.weight", b.ffn_norm.weight
            yield p + "ffn_gate.weight", b.gate.weight
            yield p + "ffn_up.weight", b.up.weight
            yield p + "ffn_down.weight", b.down.weight
        yield "output_norm.weight", self.norm.weight
        yield "output.weight", self.out.weight


def byte_decoder():
    """GPT-2 byte-level alphabet: the printable stand-in character of each byte."""
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def load_vocab(path):
    with open(path, encoding="utf-8") as f:
        tj = json.load(f)
    bd = byte_decoder()
    pieces = {}
    for tok, i in tj["model"]["vocab"].items():
        pieces[i] = bytes(bd.get(ch, 63) for ch in tok)
    for a in tj.get("added_tokens", []):
        pieces[a["id"]] = a["content"].encode()
    return pieces


def export(model, out_dir, shard_mib, meta):
    os.makedirs(out_dir, exist_ok=True)
    limit = shard_mib * 1024 * 1024
    blob, entries, off = [], [], 0
    for name, t in model.gguf_tensors():
        a = t.detach().float().cpu().numpy().astype("<f2")
        entries.append({"name": name, "shape": list(a.shape), "offset": off, "nbytes": a.nbytes})
        blob.append(a.tobytes())
        off += a.nbytes
    data = b"".join(blob)
    shards = []
    for i in range(0, len(data), limit):
        nm = "shard-%02d.bin" % len(shards)
        with open(os.path.join(out_dir, nm), "wb") as f:
            f.write(data[i:i + limit])
        shards.append(nm)
    index = dict(meta, dtype="f16", total_bytes=len(data), shards=shards, tensors=entries)
    with open(os.path.join(out_dir, "index.json"), "w") as f:
        json.dump(index, f, indent=1)
    return len(data), len(shards)


@torch.no_grad()
def greedy(model, ids, n, device):
    model.eval()
    x = torch.tensor([ids], device=device)
    out = []
    for _ in range(n):
        nxt = int(model(x[:, -model.c["n_ctx"]:])[0, -1].float().argmax())
        out.append(nxt)
        if nxt == model.c["eos_id"]:
            break
        x = torch.cat([x, torch.tensor([[nxt]], device=device)], dim=1)
    model.train()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True, help="uint16 little-endian token ids")
    ap.add_argument("--out", required=True)
    ap.add_argument("--vocab", help="tokenizer.json, to decode the samples")
    ap.add_argument("--prompts", help="JSON list of token-id lists to continue greedily")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--minutes", type=float, default=4.0)
    ap.add_argument("--max-steps", type=int, default=0, help="stop after this many steps too")
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--embd", type=int, default=512)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--ff", type=int, default=1536)
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=1.5e-3)
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--shard-mib", type=int, default=15)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()

    torch.manual_seed(a.seed)
    rng = np.random.default_rng(a.seed)
    data = np.fromfile(a.data, dtype="<u2").astype(np.int64)
    n_vocab = 1024
    if data.max() >= n_vocab:
        sys.exit("token id %d out of the 1024-id vocabulary" % data.max())
    held = max(len(data) // 50, a.ctx + 1)  # the last 2% is held out for a validation loss
    train, val = torch.from_numpy(data[:-held]), torch.from_numpy(data[-held:])
    c = dict(n_vocab=n_vocab, n_embd=a.embd, n_layer=a.layers, n_head=a.heads,
             n_head_kv=a.kv_heads, head_dim=a.head_dim, n_ff=a.ff, n_ctx=a.ctx,
             rope_theta=1000000.0, rms_eps=1e-6, eos_id=2)  # <|im_end|>
    dev = torch.device(a.device)
    model = Model(c).to(dev)
    n_par = sum(p.numel() for p in model.parameters())
    print("params %.2fM, %d training tokens, %d held out, device %s" %
          (n_par / 1e6, len(train), len(val), dev), flush=True)
    decay = [p for n, p in model.named_parameters() if p.dim() == 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    fused = {"fused": True} if dev.type == "cuda" else {}
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), **fused)
    fwd = torch.compile(model) if a.compile and hasattr(torch, "compile") else model
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if dev.type == "cuda" else \
        torch.autocast("cpu", enabled=False)

    def batch(src, n):
        starts = rng.integers(0, len(src) - a.ctx - 1, n)
        x = torch.stack([src[s:s + a.ctx] for s in starts])
        y = torch.stack([src[s + 1:s + a.ctx + 1] for s in starts])
        return x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)

    budget = a.minutes * 60.0
    warm = 100
    t0 = time.time()
    step, loss_avg = 0, None
    while True:
        frac = (time.time() - t0) / budget
        if frac >= 1.0 or (a.max_steps and step >= a.max_steps):
            break
        lr = a.lr * min(1.0, (step + 1) / warm) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = lr
        x, y = batch(train, a.batch)
        with amp:
            logits = fwd(x, a.dropout)
        loss = F.cross_entropy(logits.float().view(-1, n_vocab), y.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % 100 == 0 or step == 1:
            lv = float(loss)
            loss_avg = lv if loss_avg is None else 0.9 * loss_avg + 0.1 * lv
            print("step %d  loss %.4f  lr %.2e  %.0f s" % (step, lv, lr, time.time() - t0),
                  flush=True)

    model.eval()
    with torch.no_grad(), amp:
        vs = []
        for _ in range(8):
            x, y = batch(val, 8)
            vs.append(float(F.cross_entropy(model(x).float().view(-1, n_vocab), y.view(-1))))
        val_loss = sum(vs) / len(vs)
        x, y = batch(train, 64)
        train_loss = float(F.cross_entropy(model(x).float().view(-1, n_vocab), y.view(-1)))
    secs = time.time() - t0
    print("done: %d steps in %.0f s, train loss %.4f, held-out loss %.4f" %
          (step, secs, train_loss, val_loss), flush=True)

    meta = dict(config=c, steps=step, seconds=round(secs, 1), batch=a.batch, lr=a.lr,
                train_loss=round(train_loss, 4), val_loss=round(val_loss, 4),
                train_tokens=len(train), params=n_par,
                device=torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu",
                torch=torch.__version__)
    nbytes, nshards = export(model, a.out, a.shard_mib, meta)
    print("wrote %d bytes in %d shards to %s" % (nbytes, nshards, a.out), flush=True)

    if a.prompts:
        pieces = load_vocab(a.vocab) if a.vocab else None
        with open(a.prompts) as f:
            prompts = json.load(f)
        samples = []
        for p in prompts:
            ids = greedy(model.float(), p, 60, dev)
            samples.append({"prompt": p, "greedy": ids})
            text = b"".join(pieces.get(i, b"?") for i in ids).decode("utf-8", "replace") \
                if pieces else str(ids)
            print("sample: %r" % text, flush=True)
        with open(os.path.join(a.out, "samples.json"), "w") as f:
            json.dump(samples, f)


if __name__ == "__main__":
    main()
