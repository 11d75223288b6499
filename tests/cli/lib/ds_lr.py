#!/usr/bin/env python3
"""The lr of each optimizer step under DeepSpeed's WarmupLR, WarmupDecayLR,
WarmupCosineLR, OneCycle and LRRangeTest, from the formulas DeepSpeed
documents (its lr_schedules.py docstrings and code, 0.19.8), written out here
on their own so that a test can hold dsc's schedule against them:

  W = max(2, warmup_num_steps); the scheduler sets the lr when it is made
  (iteration -1: warmup_min_lr, WarmupCosineLR 0) and steps after every
  optimizer step, so step k (1-based) runs at iteration k - 2;
  warmup (it < W): log: log(it + 1) / log(W), linear: it / W;
  WarmupLR: min + (max - min) * gamma, gamma = warmup, then 1;
  WarmupDecayLR: then gamma = max(0, (T - it) / max(1, T - W));
  WarmupCosineLR: lr x ratio, ratio = min_ratio + warmup x (1 - min_ratio),
  then cos_min + (1 - cos_min) (1 + cos(pi min(1, (it - W + 1) / max(1, T - W)))) / 2.

  OneCycle (made: cycle_min_lr): total = first + second (second None:
  first); it < total: scale from b = it + 1: cycle = floor(1 + b / total),
  x = 1 + b / total - cycle, x <= first / total: x / ratio (first stairs),
  else (x - 1) / (ratio - 1) (second stairs, None: first's); stairs n > 0:
  c = b % total, floor(c n / first or (total - c) n / second) / n;
  lr = min + (max - min) scale; after: min / (1 + rate (it - total + 1) /
  decay_step_size), or min when decay_step_size or decay_lr_rate is 0.
  LRRangeTest (made: min_lr): min_lr (1 + rate q), q = (it + 1) / step_size,
  floored with staircase.

"auto" is what Hugging Face's Trainer writes there: warmup_max_lr the
optimizer's lr, total_num_steps the run's steps.

usage: ds_lr.py CONFIG.json OPTIMIZER_LR STEPS  -> one lr per line
"""
import json
import math
import sys


def one_cycle(p, steps):
    lo, hi = p["cycle_min_lr"], p["cycle_max_lr"]
    first = float(p.get("cycle_first_step_size", 2000))
    second = p.get("cycle_second_step_size")
    second = first if second is None else float(second)
    total = first + second
    ratio = first / total
    st1 = p.get("cycle_first_stair_count", 0)
    st2 = p.get("cycle_second_stair_count")
    st2 = st1 if st2 is None else st2
    dsize, drate = p.get("decay_step_size", 0), p.get("decay_lr_rate", 0.0)
    out = []
    for k in range(1, steps + 1):
        it = k - 2
        if it < 0:
            out.append(lo)
        elif it < total:
            b = it + 1
            cycle = math.floor(1 + b / total)
            x = 1.0 + b / total - cycle
            if x <= ratio:
                scale, n = x / ratio, st1
            else:
                scale, n = (x - 1) / (ratio - 1), st2
            if n > 0:
                c = b % total
                pos = c * n / first if c <= first else (total - c) * n / second
                scale = math.floor(pos) / n
            out.append(lo + (hi - lo) * scale)
        elif dsize == 0 or drate == 0:
            out.append(lo)
        else:
            out.append(lo / (1 + drate * ((it - total + 1) / dsize)))
    return out


def lr_range_test(p, steps):
    lo = p.get("lr_range_test_min_lr", 0.001)
    size, rate = p.get("lr_range_test_step_size", 2000), p.get("lr_range_test_step_rate", 1.0)
    stairs = p.get("lr_range_test_staircase", False)
    out = []
    for k in range(1, steps + 1):
        q = float(k - 1) / size
        out.append(lo * (1 + rate * (math.floor(q) if stairs else q)))
    return out


def lrs(sched, opt_lr, steps):
    t, p = sched["type"], dict(sched.get("params", {}))
    # "auto": the optimizer's lr (the model has no OneCycle or LRRangeTest here)
    for key in ("cycle_max_lr", "lr_range_test_min_lr"):
        if p.get(key) == "auto":
            p[key] = opt_lr
    if t == "OneCycle":
        return one_cycle(p, steps)
    if t == "LRRangeTest":
        return lr_range_test(p, steps)
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
