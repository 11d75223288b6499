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
