#!/usr/bin/env python3
"""The lr of each optimizer step under DeepSpeed's WarmupLR, WarmupDecayLR
and WarmupCosineLR, from the formulas DeepSpeed documents (its
lr_schedules.py docstrings and code, 0.19), written out here on their own so
that a test can hold dsc's schedule against them:

  W = max(2, warmup_num_steps); the scheduler sets the lr when it is made
  (iteration -1: warmup_min_lr, WarmupCosineLR 0) and steps after every
  optimizer step, so step k (1-based) runs at iteration k - 2;
  warmup (it < W): log: log(it + 1) / log(W), linear: it / W;
  WarmupLR: min + (max - min) * gamma, gamma = warmup, then 1;
  WarmupDecayLR: then gamma = max(0, (T - it) / max(1, T - W));
  WarmupCosineLR: lr x ratio, ratio = min_ratio + warmup x (1 - min_ratio),
  then cos_min + (1 - cos_min) (1 + cos(pi min(1, (it - W + 1) / max(1, T - W)))) / 2.

"auto" is what Hugging Face's Trainer writes there: warmup_max_lr the
optimizer's lr, total_num_steps the run's steps.

usage: ds_lr.py CONFIG.json OPTIMIZER_LR STEPS  -> one lr per line
"""
import json
import math
import sys


def lrs(sched, opt_lr, steps):
    t, p = sched["type"], dict(sched.get("params", {}))
    # "auto", as Hugging Face's Trainer fills it: the optimizer's lr, the run's steps
    if p.get("warmup_max_lr") == "auto":
        p["warmup_max_lr"] = opt_lr
    if p.get("total_num_steps") == "auto":
        p["total_num_steps"] = steps
    W = max(2, int(p.get("warmup_num_steps", 1000)))
    log_warm = p.get("warmup_type", "log") == "log"
    out = []
    for k in range(1, steps + 1):
        it = k - 2
        if t == "WarmupCosineLR":
            if it < 0:
                out.append(0.0)
                continue
            T = int(p["total_num_steps"])
            mn, cmin = p.get("warmup_min_ratio", 0.0), p.get("cos_min_ratio", 0.0001)
            if it < W:
                g = math.log(it + 1) / math.log(W) if log_warm else it / W
                ratio = mn + g * (1 - mn)
            else:
                prog = min(1.0, (it - W + 1) / max(1, T - W))
                ratio = max(0.0, cmin + (1 - cmin) * (1 + math.cos(math.pi * prog)) / 2)
            out.append(opt_lr * ratio)
            continue
        lo, hi = p.get("warmup_min_lr", 0.0), p.get("warmup_max_lr", 0.001)
        if it < 0:
            out.append(lo)
            continue
        if it < W:
            g = math.log(it + 1) / math.log(W) if log_warm else it / W
        elif t == "WarmupLR":
            g = 1.0
        else:
            T = int(p["total_num_steps"])
            g = max(0.0, (T - it) / max(1.0, T - W))
        out.append(lo + (hi - lo) * g)
    return out


if __name__ == "__main__":
    cfg = json.load(open(sys.argv[1]))
    for v in lrs(cfg["scheduler"], float(sys.argv[2]), int(sys.argv[3])):
        print(repr(v))
