#!/usr/bin/env python3
"""dsc's DeepSpeed schedulers against DeepSpeed's own code (not CI: it
downloads the deepspeed source package from PyPI).

    python3 bench/deepspeed_schedules.py --dsc build/dsc [--version 0.19.8]

Fetches the deepspeed sdist (pip download, cached under build/deepspeed-sdist),
loads its deepspeed/runtime/lr_schedules.py with stand-ins for the three names
it imports from torch and deepspeed.utils (Optimizer, is_tensor, logger: the
schedulers only read and write param_groups[i]['lr'], and OneCycle
param_groups[i]['betas'] where optimizer.defaults has betas), and drives each
scheduler as DeepSpeed's engine does: made once, then step() after every
optimizer step. dsc trains the tiny GPT with the same ds_config and logs the
lr of each step; the script prints both and the largest difference (dsc logs
f32), and exits 1 if any step differs by more than f32 rounding.
Python 3 standard library (and pip) only.
"""
import argparse
import glob
import importlib.util
import json
import os
import struct
import subprocess
import sys
import tarfile
import tempfile
import types

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

CASES = [
    ("WarmupLR log", {"type": "WarmupLR", "params": {"warmup_min_lr": 0.0005, "warmup_max_lr": 0.003, "warmup_num_steps": 5}}),
    ("WarmupLR linear", {"type": "WarmupLR", "params": {"warmup_max_lr": 0.002, "warmup_num_steps": 6, "warmup_type": "linear"}}),
    ("WarmupDecayLR linear", {"type": "WarmupDecayLR", "params": {"warmup_min_lr": 0.0001, "warmup_max_lr": 0.003, "warmup_num_steps": 4, "total_num_steps": 10, "warmup_type": "linear"}}),
    ("WarmupDecayLR log", {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 1, "total_num_steps": 12}}),
    ("WarmupCosineLR log", {"type": "WarmupCosineLR", "params": {"total_num_steps": 11, "warmup_num_steps": 3, "warmup_min_ratio": 0.1, "cos_min_ratio": 0.05}}),
    ("WarmupCosineLR linear", {"type": "WarmupCosineLR", "params": {"total_num_steps": 9, "warmup_num_steps": 4, "warmup_type": "linear"}}),
    ("OneCycle", {"type": "OneCycle", "params": {"cycle_min_lr": 0.0005, "cycle_max_lr": 0.003, "cycle_first_step_size": 4}}),
    ("OneCycle stairs", {"type": "OneCycle", "params": {"cycle_min_lr": 0.0001, "cycle_max_lr": 0.002, "cycle_first_step_size": 6, "cycle_second_step_size": 3, "cycle_first_stair_count": 3, "cycle_second_stair_count": 2}}),
    ("OneCycle decay", {"type": "OneCycle", "params": {"cycle_min_lr": 0.0002, "cycle_max_lr": 0.004, "cycle_first_step_size": 2, "cycle_second_step_size": 5, "cycle_first_stair_count": 2, "decay_step_size": 3, "decay_lr_rate": 0.25}}),
    ("OneCycle 7/4 stairs", {"type": "OneCycle", "params": {"cycle_min_lr": 0.0003, "cycle_max_lr": 0.0031, "cycle_first_step_size": 7, "cycle_second_step_size": 4, "cycle_first_stair_count": 3, "cycle_second_stair_count": 3, "decay_step_size": 1, "decay_lr_rate": 0.1}}),
    ("LRRangeTest", {"type": "LRRangeTest", "params": {"lr_range_test_min_lr": 0.0002, "lr_range_test_step_size": 3, "lr_range_test_step_rate": 0.5}}),
    ("LRRangeTest staircase", {"type": "LRRangeTest", "params": {"lr_range_test_step_size": 4, "lr_range_test_step_rate": 2, "lr_range_test_staircase": True}}),
]
OPT_LR, STEPS = 0.004, 14


def deepspeed_module(version, cache):
    os.makedirs(cache, exist_ok=True)
    found = glob.glob(os.path.join(cache, "deepspeed-%s.tar.gz" % version))
    if not found:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                        "-q", "-d", cache, "deepspeed==%s" % version], check=True)
        found = glob.glob(os.path.join(cache, "deepspeed-%s.tar.gz" % version))
    with tarfile.open(found[0]) as tf:
        member = "deepspeed-%s/deepspeed/runtime/lr_schedules.py" % version
        src = tf.extractfile(member).read()
    path = os.path.join(cache, "lr_schedules-%s.py" % version)
    with open(path, "wb") as f:
        f.write(src)
    # the three imported names, as the schedulers use them
    torch = types.ModuleType("torch")
    torch.is_tensor = lambda x: False
    optim = types.ModuleType("torch.optim")
    optim.Optimizer = type("Optimizer", (), {})
    torch.optim = optim
    ds, ds_utils = types.ModuleType("deepspeed"), types.ModuleType("deepspeed.utils")
    ds_utils.logger = types.SimpleNamespace(warning=lambda *a, **k: None, info=lambda *a, **k: None)
    ds.utils = ds_utils
    sys.modules.update({"torch": torch, "torch.optim": optim, "deepspeed": ds, "deepspeed.utils": ds_utils})
    spec = importlib.util.spec_from_file_location("ds_lr_schedules", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod, optim.Optimizer


def deepspeed_lrs(mod, Optimizer, sched):
    opt = Optimizer()
    opt.param_groups = [{"lr": OPT_LR, "betas": (0.9, 0.999)}]
    # an Adam's defaults: OneCycle cycles the betas too (which dsc does not:
    # it warns), and the lr is the same either way
    opt.defaults = {"lr": OPT_LR, "betas": (0.9, 0.999)}
    s = getattr(mod, sched["type"])(opt, **sched["params"])
    out = []
    for _ in range(STEPS):
        out.append(opt.param_groups[0]["lr"])  # what this optimizer step uses
        s.step()                                # the engine, after the step
    return out


def dsc_lrs(dsc, sched, tmp):
    cfg = {"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "AdamW", "params": {"lr": OPT_LR}},
           "scheduler": sched}
    path, log = os.path.join(tmp, "ds.json"), os.path.join(tmp, "lr.jsonl")
    with open(path, "w") as f:
        json.dump(cfg, f)
    if os.path.exists(log):
        os.remove(log)
    subprocess.run([dsc, "train", os.path.join(ROOT, "examples/gpt-tiny.dsm"), "--data", os.path.join(tmp, "c"),
                    "--seq", "16", "--steps", str(STEPS), "--eval-every", "0", "--quiet", "--deepspeed", path,
                    "--log", log], check=True, stderr=subprocess.DEVNULL)
    return [json.loads(l)["lr"] for l in open(log)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dsc", default=os.path.join(ROOT, "build/dsc"))
    ap.add_argument("--version", default="0.19.8")
    a = ap.parse_args()
    mod, Optimizer = deepspeed_module(a.version, os.path.join(ROOT, "build/deepspeed-sdist"))
    f32 = lambda x: struct.unpack("f", struct.pack("f", x))[0]
    worst, bad = 0.0, False
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([a.dsc, "data", "/usr/share/common-licenses/GPL-3", "-o", os.path.join(tmp, "c")],
                       check=True, stdout=subprocess.DEVNULL)
        print("DeepSpeed %s lr_schedules.py vs dsc (optimizer lr %g, %d steps)\n" % (a.version, OPT_LR, STEPS))
        print("| scheduler | step: DeepSpeed / dsc | max rel. diff |")
        print("|---|---|---:|")
        for name, sched in CASES:
            want, got = deepspeed_lrs(mod, Optimizer, sched), dsc_lrs(a.dsc, sched, tmp)
            diff = max(abs(g - f32(w)) / max(abs(w), 1e-30) for g, w in zip(got, want))
            bad |= len(got) != len(want) or diff > 1e-7
            worst = max(worst, diff)
            pairs = " ".join("%.4g/%.4g" % (w, g) for w, g in zip(want[:6], got[:6]))
            print("| %s | %s ... | %.1e |" % (name, pairs, diff))
    print("\nlargest relative difference %.1e (dsc logs the lr in f32)" % worst)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
