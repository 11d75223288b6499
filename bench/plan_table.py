#!/usr/bin/env python3
"""Per-rank memory tables for docs/memory.md, from `dsc plan --json`.

    python3 bench/plan_table.py --dsc build/dsc [--batch 1] [--seq 1024] > tables.md
    python3 bench/plan_table.py --dsc build/dsc --measured     # the "measured here" table

For GPT-2 124M, GPT-2 1.5B and the LLaMA-style 7B (examples/), one table per
world size (1, 8, 64): a row per ZeRO stage and offload choice (none; the
optimizer states on the host at every stage; the optimizer states and the
param shards on the host at stage 3), with the device categories and the
host column; then LLaMA 2 70B (llama-70b.dsm, grouped-query attention) at
worlds 64 and 512, stage 3. Every figure is rank 0's (every rank runs the same
program). Each plan is one `dsc plan MODEL --world N --zero-stage S --batch B
--seq T --grad-accum 1 [--offload-optimizer host] [--offload-param host]
--json`.

The script checks every plan's model states against the ZeRO and
ZeRO-Offload formulas (AdamW; bytes per param as the plan's
bytes_per_param: f32 4 + 4 + 8; bf16 with master weights 2 + 2 + 12, bf16
params and gradients, f32 master weights and moments; each divided by N where
the stage shards it; what is offloaded counted on the host instead of the
device) within the shard padding, and exits 1 if one differs.

--measured trains gpt-tiny (batch 64 x seq 64, 2 steps, cpu backend) at
stage 0 without offload, with the optimizer states on the host, on disk and
under --offload-optimizer auto with a budget half a state set below the
no-offload peak, and prints dsc train's planned memory against the measured
RSS growth, with the commands.

--scale times `dsc plan` of LLaMA-7B and LLaMA 2 70B with their own train
sections (grad_accum 1024, seq 4096) at worlds 8, 64 and 512, wall time and
peak RSS of each, against the issue's bound (5 s, 2 GB on 2 cores); then
GPT-2's plan and `dsc compile` (an empty kernel cache) at its own grad_accum
64 against --grad-accum 1 (bound: within 1.2x). Prints the CPU and the load.
Exit 1 when a bound is missed. Python 3 standard library only.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

MODELS = [
    ("GPT-2 124M", "examples/gpt2.dsm"),
    ("GPT-2 1.5B", "examples/gpt2-xl.dsm"),
    ("LLaMA 7B", "examples/llama-7b.dsm"),
]
BIG = ("LLaMA 2 70B", "examples/llama-70b.dsm")
# (label, offload flags): optimizer host at every stage, param host at stage 3
OFFLOADS = [("none", []),
            ("optimizer host", ["--offload-optimizer", "host"]),
            ("optimizer + param host", ["--offload-optimizer", "host", "--offload-param", "host"])]


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


def formula(stage, psi, n, opt_host, param_host, per_param):
    """ZeRO (stages) and ZeRO-Offload (tiers), AdamW: params P, grads G,
    optimizer K bytes per param (+ the 4-byte step count), divided by N where
    the stage shards them; per_param is the plan's bytes_per_param: f32 4, 4,
    8; bf16 with master weights 2, 2, 12 (the f32 master weights are
    optimizer states). Returns the bytes of params, grads and optimizer on
    the device and of the values on the host tier."""
    P, G, K = per_param["P"], per_param["G"], per_param["K"]
    p = P * psi / (n if stage >= 3 else 1)
    g = G * psi / (n if stage >= 2 else 1)
    o = K * psi / (n if stage >= 1 else 1) + 4
    host = (o if opt_host else 0) + (p if param_host else 0)
    return (0 if param_host else p), g, (0 if opt_host else o), host


def plan(dsc, model, world, stage, batch, seq, flags):
    cmd = [dsc, "plan", model, "--world", str(world), "--zero-stage", str(stage),
           "--batch", str(batch), "--seq", str(seq), "--grad-accum", "1", "--json"] + flags
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
    rank.setdefault("host_work", 0)
    rank.setdefault("host", 0)
    # the host tier's values; host_work: the host optimizer step's gradients
    # and temporaries (passes/offload_host.c)
    rank["host_values"] = rank["host"] - rank["host_work"]
    opt_host = "--offload-optimizer" in flags
    p, g, o, host = formula(stage, obj["param_count"], world, opt_host, "--offload-param" in flags,
                            obj["bytes_per_param"])
    # shards pad each tensor to a multiple of N: at most 4 bytes per tensor,
    # value kind (params, grads, master, m, v) and rank; 1% covers it for
    # these models (tests/cli/plan_formula.sh checks GPT-2 to the byte)
    checks = [("params", rank["params"], p), ("optimizer", rank["optimizer"], o),
              ("host values", rank["host_values"], host)]
    if opt_host:  # ZeRO-Offload: gradients leave the device during the backward
        if rank["grads_held"] > g * 1.01:
            sys.exit("plan_table: %s world %d stage %d %s: grads held %d over %d"
                     % (model, world, stage, " ".join(flags), rank["grads_held"], g))
    else:
        checks.append(("grads held", rank["grads_held"], g))
    for what, got, want in checks:
        if abs(got - want) > 0.01 * want + 8:
            sys.exit("plan_table: %s world %d stage %d %s: %s %d, formula %d"
                     % (model, world, stage, " ".join(flags), what, got, want))
    return rank


COLS = [("params", "params"), ("grads held", "grads_held"), ("optimizer", "optimizer"),
        ("activations", "activations"), ("workspace", "workspace"), ("comm", "comm"),
        ("**device peak**", "peak"), ("host: values", "host_values"),
        ("host: work", "host_work"), ("**host**", "host")]


def config_table(rows):
    """rows: (stage label, offload label, plan)"""
    out = ["| stage | offload | " + " | ".join(c[0] for c in COLS) + " |",
           "|---|---|" + "---:|" * len(COLS)]
    for st, off, r in rows:
        out.append("| %s | %s | %s |" % (st, off, " | ".join(human(r[k]) for _, k in COLS)))
    return "\n".join(out)


BIG_ROWS = [("params", "params"), ("grads held", "grads_held"), ("optimizer", "optimizer"),
            ("**model states** (= formula)", "model_states"), ("activations", "activations"),
            ("workspace", "workspace"), ("comm", "comm"), ("**peak**", "peak")]


def column_table(cols, headers):
    out = ["| per rank | " + " | ".join(headers) + " |", "|---|" + "---|" * len(headers)]
    for name, key in BIG_ROWS:
        out.append("| %s | %s |" % (name, " | ".join(human(c[key]) for c in cols)))
    return "\n".join(out)


def tables(a):
    slowest, n = 0.0, 0
    t0 = time.monotonic()
    for title, model in MODELS:
        first = True
        for world in (1, 8, 64):
            rows = []
            for stage in ((0,) if world == 1 else (0, 1, 2, 3)):
                for label, flags in OFFLOADS:
                    if "--offload-param" in flags and (stage != 3 or world == 1):
                        continue
                    r = plan(a.dsc, model, world, stage, a.batch, a.seq, flags)
                    slowest, n = max(slowest, r["seconds"]), n + 1
                    rows.append(("0 (every stage)" if world == 1 else str(stage), label, r))
            if first:
                first = False
                r0 = rows[0][2]
                print("### %s (`%s`): Psi = %s params, %s\n"
                      % (title, model, format(r0["param_count"], ","), r0["precision"]))
            print("World %d:\n" % world)
            print(config_table(rows))
            print()
    if not a.no_70b:
        title, model = BIG
        cols = [plan(a.dsc, model, w, 3, a.batch, a.seq, []) for w in (64, 512)]
        slowest, n = max([slowest] + [c["seconds"] for c in cols]), n + 2
        print("### %s (`%s`): Psi = %s params, %s, stage 3\n"
              % (title, model, format(cols[0]["param_count"], ","), cols[0]["precision"]))
        print(column_table(cols, ["world 64", "world 512"]))
        print()
    print("(batch %d x seq %d x grad_accum 1 per rank; %d plans in %.0f s, slowest %.1f s)"
          % (a.batch, a.seq, n, time.monotonic() - t0, slowest))


def measured(a):
    """dsc train's planned memory against the measured RSS growth, gpt-tiny."""
    model = "examples/gpt-tiny.dsm"
    shape = ["--batch", "64", "--seq", "64", "--threads", "2"]
    tmp = tempfile.mkdtemp(prefix="dsc-plan-table-")
    words = "the cat sat on a mat and the dog ran to the red ball while a bird sang".split()
    s, text = 1, []
    for i in range(40000):
        s = (s * 75 + 74) % 65537
        text.append(words[(s // 7) % len(words)] + (".\n" if i % 12 == 11 else " "))
    with open(os.path.join(tmp, "corpus.txt"), "w") as f:
        f.write("".join(text))
    subprocess.run([a.dsc, "data", os.path.join(tmp, "corpus.txt"), "-o",
                    os.path.join(tmp, "c")], check=True, capture_output=True)
    none = json.loads(subprocess.run([a.dsc, "plan", model, "--zero-stage", "0", "--json"] +
                                     shape[:4], check=True, capture_output=True,
                                     text=True).stdout)["ranks"][0]
    budget = none["peak"] - none["optimizer"] // 2
    env = dict(os.environ, DSC_CACHE_DIR=os.path.join(tmp, "cache"))
    od = os.path.join(tmp, "od")
    os.mkdir(od)
    configs = [("none", []), ("optimizer host", ["--offload-optimizer", "host"]),
               ("optimizer disk", ["--offload-optimizer", "disk", "--offload-dir", od]),
               ("optimizer auto", ["--offload-optimizer", "auto", "--memory-budget", str(budget)])]
    print("| offload | planned device peak (dsc plan) | host | trainer: planned | measured RSS "
          "growth | offloaded by auto |")
    print("|---|---:|---:|---:|---:|---|")
    cmds = []
    for label, flags in configs:
        p = json.loads(subprocess.run([a.dsc, "plan", model, "--zero-stage", "0", "--json"] +
                                      shape[:4] + flags, check=True, capture_output=True,
                                      text=True).stdout)
        cmd = [a.dsc, "train", model, "--data", os.path.join(tmp, "c"), "--steps", "2",
               "--eval-every", "0", "--backend", "cpu"] + shape + flags
        cmds.append(" ".join(["dsc"] + cmd[1:]).replace(tmp, "$TMP"))
        # a first run fills the kernel cache: the measured run's RSS is then
        # the executor's arenas, not the JIT compiler's (as tests/cli/offload.sh)
        subprocess.run(cmd[:cmd.index("--steps") + 1] + ["1"] + cmd[cmd.index("--steps") + 2:],
                       capture_output=True, env=env)
        r = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if r.returncode != 0:  # say so in the row, measure the others
            err = (r.stderr.strip().splitlines() or ["exit %d" % r.returncode])[0]
            print("| %s | %s | %s | failed: %s | | |" % (label, human(p["ranks"][0]["peak"]),
                                                       human(p["ranks"][0]["host"]), err))
            continue
        m = re.search(r"^memory: planned ([0-9.]+) MiB.*measured ([0-9.]+) MiB", r.stdout, re.M)
        auto = p.get("offload_auto")
        moved = ("%d of %d states, %s" % (auto["moved"], auto["candidates"], human(auto["host"]))
                 if auto else "")
        print("| %s | %s | %s | %s MiB | %s MiB | %s |"
              % (label, human(p["ranks"][0]["peak"]), human(p["ranks"][0]["host"]),
                 m.group(1) if m else "?", m.group(2) if m else "?", moved))
    print("\n(auto budget: %d B, the no-offload peak less half the optimizer states)\n" % budget)
    print("```")
    print("\n".join(cmds))
    print("```")
    shutil.rmtree(tmp, ignore_errors=True)


def timed(cmd, env=None):
    """(wall seconds, peak RSS bytes) of cmd; raises on a non-zero exit."""
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.monotonic() - t0
    err = p.stderr.read().decode(errors="replace")
    p.stderr.close()
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        raise RuntimeError("%s: exit %d: %s" % (" ".join(cmd), p.returncode, err.strip()[:300]))
    return wall, ru.ru_maxrss * 1024


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "?"


def scale(a):
    """Plans at scale and grad_accum's cost: the issue's bounds."""
    print("CPU: %s, %d CPUs, load %.2f %.2f %.2f\n" % ((cpu_model(), os.cpu_count()) + os.getloadavg()))
    ok = True
    print("| model (own train section) | world | dsc plan | peak RSS |")
    print("|---|---:|---:|---:|")
    for title, model in (MODELS[2], BIG):
        for world in (8, 64, 512):
            wall, rss = timed([a.dsc, "plan", model, "--world", str(world)])
            good = wall < 5 and rss < 2e9
            ok &= good
            print("| %s | %d | %.2f s | %s |%s" % (title, world, wall, human(rss),
                                                  "" if good else " over the bound"))
    tmp = tempfile.mkdtemp(prefix="dsc-plan-scale-")
    env = dict(os.environ, DSC_CACHE_DIR="off")
    print("\n| GPT-2, dsc ... examples/gpt2.dsm | grad_accum 64 | grad_accum 1 | ratio |")
    print("|---|---:|---:|---:|")
    for label, cmd in (("plan --world 8", ["plan", "--world", "8"]),
                       ("compile -o X.dsx", ["compile", "-o", os.path.join(tmp, "g.dsx")])):
        k64 = min(timed([a.dsc] + cmd[:1] + ["examples/gpt2.dsm"] + cmd[1:], env)[0]
                  for _ in range(3))
        k1 = min(timed([a.dsc] + cmd[:1] + ["examples/gpt2.dsm"] + cmd[1:] +
                       ["--grad-accum", "1"], env)[0] for _ in range(3))
        good = k64 <= 1.2 * k1
        ok &= good
        print("| %s | %.2f s | %.2f s | %.2fx |%s" % (label, k64, k1, k64 / k1,
                                                    "" if good else " over 1.2x"))
    shutil.rmtree(tmp, ignore_errors=True)
    print("\n(best of 3 for GPT-2; load after: %.2f)" % os.getloadavg()[0])
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dsc", default="build/dsc")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--no-70b", action="store_true", help="skip the 70B model")
    ap.add_argument("--measured", action="store_true",
                    help="instead of the tables: train gpt-tiny, planned vs measured memory")
    ap.add_argument("--scale", action="store_true",
                    help="instead of the tables: plan time and memory at scale, grad_accum's cost")
    a = ap.parse_args()
    if a.scale:
        sys.exit(scale(a))
    if a.measured:
        measured(a)
    else:
        tables(a)


if __name__ == "__main__":
    main()
