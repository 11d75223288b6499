#!/usr/bin/env python3
"""Per-rank memory tables for docs/memory.md, from `dsc plan --json`.

    python3 bench/plan_table.py --dsc build/dsc [--batch 1] [--seq 1024] > tables.md

For GPT-2 124M, GPT-2 1.5B and the LLaMA-style 7B (examples/), one table per
world size (1, 8, 64) with ZeRO stages 0-3 side by side; then the 78B
(llama-70b.dsm, full multi-head attention) at worlds 64 and 512, stage 3.
Every figure is rank 0's (every rank runs the same program). Each plan is one
`dsc plan MODEL --world N --zero-stage S --batch B --seq T --grad-accum 1
--json`; the script also checks the model states against the ZeRO formulas
(f32 master params and grads, AdamW: 4 + 4 + 8 bytes per param, each divided
by N where the stage shards it) within the shard padding, and exits 1 if one
differs. Python 3 standard library only.
"""
import argparse
import json
import subprocess
import sys
import time

MODELS = [
    ("GPT-2 124M", "examples/gpt2.dsm"),
    ("GPT-2 1.5B", "examples/gpt2-xl.dsm"),
    ("LLaMA-style 7B", "examples/llama-7b.dsm"),
]
BIG = ("LLaMA-2-70B shapes, full MHA (78B)", "examples/llama-70b.dsm")


def human(b):
    """cmd_plan.c's human(): KiB/MiB/GiB/TiB with two decimals."""
    if b < 1024:
        return "%d B" % b
    v, units = b / 1024.0, ["KiB", "MiB", "GiB", "TiB"]
    u = 0
    while v >= 1024 and u < 3:
        v /= 1024
        u += 1
    return "%.2f %s" % (v, units[u])


def formula(stage, psi, n):
    """ZeRO paper, f32 AdamW: params 4, grads 4, optimizer 8 bytes per param."""
    p = 4 * psi / (n if stage >= 3 else 1)
    g = 4 * psi / (n if stage >= 2 else 1)
    o = 8 * psi / (n if stage >= 1 else 1)
    return p + g + o


def plan(dsc, model, world, stage, batch, seq):
    cmd = [dsc, "plan", model, "--world", str(world), "--zero-stage", str(stage),
           "--batch", str(batch), "--seq", str(seq), "--grad-accum", "1", "--json"]
    t0 = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True)
    dt = time.monotonic() - t0
    if r.returncode != 0:
        sys.exit("plan_table: %s failed (%d):\n%s" % (" ".join(cmd), r.returncode, r.stderr))
    obj = json.loads(r.stdout)
    rank = obj["ranks"][0]
    rank["param_count"] = obj["param_count"]
    rank["precision"] = obj["precision"]
    rank["seconds"] = dt
    # shards pad each tensor to a multiple of N: at most 4 bytes per tensor,
    # value kind (params, grads, m, v) and rank; 1% covers it for these models
    want = formula(stage, obj["param_count"], world) + 4  # + opt.step
    if abs(rank["model_states"] - want) > 0.01 * want:
        sys.exit("plan_table: %s world %d stage %d: model states %d, formula %d"
                 % (model, world, stage, rank["model_states"], want))
    return rank


ROWS = [("params", "params"), ("grads held", "grads_held"), ("optimizer", "optimizer"),
        ("**model states** (= formula)", "model_states"), ("activations", "activations"),
        ("workspace", "workspace"), ("comm", "comm"), ("**peak**", "peak")]


def table(cols, headers):
    out = ["| per rank | " + " | ".join(headers) + " |",
           "|---|" + "---|" * len(headers)]
    for name, key in ROWS:
        out.append("| %s | %s |" % (name, " | ".join(human(c[key]) for c in cols)))
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dsc", default="build/dsc")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--no-70b", action="store_true", help="skip the 78B model")
    a = ap.parse_args()
    slowest = 0.0
    for title, model in MODELS:
        first = None
        for world in (1, 8, 64):
            stages = (0,) if world == 1 else (0, 1, 2, 3)
            cols = [plan(a.dsc, model, world, s, a.batch, a.seq) for s in stages]
            slowest = max([slowest] + [c["seconds"] for c in cols])
            if first is None:
                first = cols[0]
                print("### %s (`%s`): Psi = %s params, %s\n"
                      % (title, model, format(first["param_count"], ","), first["precision"]))
            heads = ["stage 0 (every stage)"] if world == 1 else ["stage %d" % s for s in stages]
            print("World %d:\n" % world)
            print(table(cols, heads))
            print()
    if not a.no_70b:
        title, model = BIG
        cols = [plan(a.dsc, model, w, 3, a.batch, a.seq) for w in (64, 512)]
        slowest = max([slowest] + [c["seconds"] for c in cols])
        print("### %s (`%s`): Psi = %s params, %s, stage 3\n"
              % (title, model, format(cols[0]["param_count"], ","), cols[0]["precision"]))
        print(table(cols, ["world 64", "world 512"]))
        print()
    print("(batch %d x seq %d x grad_accum 1 per rank; slowest single plan %.1f s)"
          % (a.batch, a.seq, slowest))


if __name__ == "__main__":
    main()
