"""Training curves of runs under one directory (OUT/metrics.jsonl), for the
CLI tests: `metrics` reads one run's lines, `assert_same` checks that other
runs trained the same curve as a base run (loss, grad_norm and lr within a
relative 1e-5 at every step) and that each has `steps` lines."""
import json


def metrics(root, name):
    return [json.loads(line) for line in open(f"{root}/{name}/metrics.jsonl")]


def assert_same(root, base, runs, steps, rel=1e-5):
    ref = metrics(root, base)
    assert len(ref) == steps, (base, len(ref))
    for r in runs:
        m = metrics(root, r)
        assert len(m) == steps, (r, len(m))
        for a, b in zip(m, ref):
            for k in ("loss", "grad_norm", "lr"):
                assert abs(a[k] - b[k]) <= rel * abs(b[k]), (r, k, a, b)
    return ref


def log_lines(path):
    """The step lines of a --log file (JSON lines with a "loss")."""
    return [json.loads(line) for line in open(path) if '"loss"' in line]


def same_losses(path_a, path_b, rel=1e-5):
    """Two --log files: the same number of steps, and loss and val_loss
    (where either has one) within rel of each other at every step. Returns
    both runs' lines and the worst relative difference."""
    a, b = log_lines(path_a), log_lines(path_b)
    assert len(a) == len(b) and a, (len(a), len(b))
    worst = 0.0
    for x, y in zip(a, b):
        for key in ("loss", "val_loss"):
            if key in x or key in y:
                r = abs(x[key] - y[key]) / abs(x[key])
                worst = max(worst, r)
                assert r <= rel, (x["step"], key, x[key], y[key])
    return a, b, worst
