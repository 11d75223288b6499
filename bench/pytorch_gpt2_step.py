#!/usr/bin/env python3
"""PyTorch eager f32 GPT-2 124M training step: the baseline of bench/codegen.sh.

The model is examples/gpt2.dsm exactly: vocab 50304 (padded), context 1024,
d 768, 12 heads, 12 layers, pre-LayerNorm blocks (eps 1e-5) with biases, tanh
GELU MLP of width 4d, token embedding tied with the output layer, mean
cross-entropy. Init as the model file says: normal(0.02) for wte and the
qkv/fc weights, normal(0.01) for wpe, normal(0.02 / sqrt(2 * layers)) for the
two residual projections, zeros for biases, ones/zeros for the norms. The
train section: AdamW (torch.optim.AdamW, its default implementation) with
lr 6e-4, betas (0.9, 0.95), eps 1e-8, weight decay 0.1 on params of rank >= 2
only (dsc's decay_1d = false), global-norm clipping 1.0. The schedule is
irrelevant to speed: the lr stays 6e-4. f32 throughout (the train section's
bf16 is overridden, as bench/train_step.c does).

--model gpt-tiny is examples/gpt-tiny.dsm instead (the same architecture:
vocab 256, context 64, d 64, 4 heads, 2 layers), for quick runs of
bench/codegen.sh; its tokens are drawn below 256.

One timed step = zero_grad + forward + backward + clip_grad_norm_ + optimizer
step (+ loss.item()). Prints one JSON line.

--dtype bf16 is what a PyTorch user writes for dsc's bf16 mixed precision:
f32 master weights and AdamW states, the forward and backward under
torch.autocast(bfloat16) (on the CPU too: bench/codegen.sh's bf16 row). On a
GPU (--device cuda, tests/gpu/run.sh) AdamW is the fused CUDA implementation, attention SDPA (flash) by default. The step
ends with torch.cuda.synchronize() (loss.item() does it too), and the JSON
adds the peak device memory (torch.cuda.max_memory_allocated).
"""
import argparse
import json
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

# vocab, ctx, d, heads, layers of the model files
MODELS = {"gpt2": (50304, 1024, 768, 12, 12), "gpt-tiny": (256, 64, 64, 4, 2)}
VOCAB, CTX, D, HEADS, LAYERS = MODELS["gpt2"]


class Block(nn.Module):
    def __init__(self, attn_impl):
        super().__init__()
        self.attn_impl = attn_impl
        self.ln1 = nn.LayerNorm(D, eps=1e-5)
        self.attn = nn.Linear(D, 3 * D)
        self.attn_proj = nn.Linear(D, D)
        self.ln2 = nn.LayerNorm(D, eps=1e-5)
        self.fc = nn.Linear(D, 4 * D)
        self.fc_proj = nn.Linear(4 * D, D)

    def attention(self, x):
        B, T, C = x.shape
        q, k, v = self.attn(x).split(C, dim=2)
        # [B, T, C] -> [B, heads, T, C / heads]: head h holds channels h*hd..(h+1)*hd
        q, k, v = (t.view(B, T, HEADS, C // HEADS).transpose(1, 2) for t in (q, k, v))
        if self.attn_impl == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # the math the model does: masked softmax(q k^T / sqrt(hd)) v
            s = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // HEADS))
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
            y = torch.softmax(s.masked_fill(mask, float("-inf")), dim=-1) @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.attn_proj(y)

    def forward(self, x):
        x = x + self.attention(self.ln1(x))
        return x + self.fc_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT2(nn.Module):
    def __init__(self, attn_impl):
        super().__init__()
        self.wte = nn.Embedding(VOCAB, D)
        self.wpe = nn.Embedding(CTX, D)
        self.h = nn.ModuleList(Block(attn_impl) for _ in range(LAYERS))
        self.lnf = nn.LayerNorm(D, eps=1e-5)
        proj_std = 0.02 / math.sqrt(2 * LAYERS)
        with torch.no_grad():
            nn.init.normal_(self.wte.weight, std=0.02)
            nn.init.normal_(self.wpe.weight, std=0.01)
            for b in self.h:
                for lin, std in ((b.attn, 0.02), (b.attn_proj, proj_std), (b.fc, 0.02),
                                 (b.fc_proj, proj_std)):
                    nn.init.normal_(lin.weight, std=std)
                    nn.init.zeros_(lin.bias)

    def forward(self, tokens, targets):
        T = tokens.shape[1]
        x = self.wte(tokens) + self.wpe(torch.arange(T, device=tokens.device))
        for b in self.h:
            x = b(x)
        logits = self.lnf(x) @ self.wte.weight.t()  # tied output layer
        return F.cross_entropy(logits.view(-1, VOCAB), targets.reshape(-1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", choices=tuple(MODELS), default="gpt2")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--dtype", choices=("f32", "bf16"), default="f32",
                    help="bf16: autocast mixed precision (f32 master weights)")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model")
    ap.add_argument("--attn", choices=("sdpa", "math"), default="sdpa",
                    help="sdpa: F.scaled_dot_product_attention(is_causal=True) (default); "
                         "math: masked softmax as the model's attention op")
    args = ap.parse_args()
    global VOCAB, CTX, D, HEADS, LAYERS
    VOCAB, CTX, D, HEADS, LAYERS = MODELS[args.model]
    if args.steps < 1 or args.warmup < 0 or not 1 <= args.seq <= CTX or args.batch < 1:
        ap.error(f"need steps >= 1, warmup >= 0, batch >= 1, 1 <= seq <= {CTX}")

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    dev = torch.device(args.device)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("pytorch_gpt2_step: --device cuda but torch sees no GPU")
    model = GPT2(args.attn).to(dev)
    run_model = torch.compile(model) if args.compile else model
    n_params = sum(p.numel() for p in model.parameters())
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=6e-4, betas=(0.9, 0.95), eps=1e-8,
                            **({"fused": True} if args.device == "cuda" else {}))
    autocast = torch.autocast(args.device, dtype=torch.bfloat16, enabled=args.dtype == "bf16")
    gen = torch.Generator().manual_seed(args.seed + 1)

    draw = min(VOCAB, 50257)

    def batch():
        # tokens below GPT-2's real vocabulary (50257), as data would be
        return (torch.randint(0, draw, (args.batch, args.seq), generator=gen).to(dev),
                torch.randint(0, draw, (args.batch, args.seq), generator=gen).to(dev))

    times, losses = [], []
    for s in range(args.warmup + args.steps):
        tokens, targets = batch()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with autocast:
            loss = run_model(tokens, targets)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        lv = loss.item()
        if args.device == "cuda":
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        losses.append(lv)
        if s == 0:
            norm0 = float(norm)
        if s >= args.warmup:
            times.append(dt)
        if not math.isfinite(lv):
            raise SystemExit(f"pytorch_gpt2_step: step {s} gave a non-finite loss")

    # Estimated work: 3x the forward matmuls (forward, input and weight
    # gradients) incl. the tied output layer, and 3x the attention products
    # (q k^T and p v over the full T x T square); elementwise work not counted.
    bt = args.batch * args.seq
    fwd = 2 * bt * (LAYERS * D * (3 * D + D + 4 * D + 4 * D) + D * VOCAB)
    fwd += LAYERS * 4 * args.batch * args.seq * args.seq * D
    extra = {}
    if args.device == "cuda":
        extra = {"device": torch.cuda.get_device_name(),
                 "peak_mem_bytes": torch.cuda.max_memory_allocated()}
    print(json.dumps({
        "impl": "pytorch" if args.device == "cpu" else "pytorch-cuda",
        "step_s_median": round(statistics.median(times), 6),
        "step_s_mean": round(statistics.fmean(times), 6),
        "step_s_min": round(min(times), 6),
        "steps": args.steps, "warmup": args.warmup,
        "batch": args.batch, "seq": args.seq, "threads": torch.get_num_threads(),
        "attention": "F.scaled_dot_product_attention(is_causal=True)" if args.attn == "sdpa"
                     else "masked softmax (math)",
        "optimizer": "torch.optim.AdamW " + ("fused" if args.device == "cuda"
                                              else "default implementation (foreach=None)"),
        "model": args.model, "dtype": args.dtype, "compiled": args.compile,
        "params": n_params, "gflop_est": round(3 * fwd * 1e-9, 3), "loss_first": round(losses[0], 5),
        "grad_norm_first": round(norm0, 5), "loss_last": round(losses[-1], 5),
        "torch": torch.__version__, **extra,
    }))


if __name__ == "__main__":
    main()
