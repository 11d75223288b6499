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


def safetensors(path):
    """The f32 tensors of a .safetensors file, by name (numpy)."""
    import struct
    import numpy as np
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    return {k: np.frombuffer(data[v["data_offsets"][0]:v["data_offsets"][1]], np.float32)
            for k, v in head.items() if k != "__metadata__"}


def assert_same_run(root, a, b, rel=1e-5):
    """Runs OUT=root/a and root/b: the same number of steps, loss and
    grad_norm within rel at every step, and the final
    weights (root/X/export.safetensors when a ZeRO run wrote one, else
    latest/model.safetensors) within rel of each tensor's norm. attn_b is
    compared elementwise to 2e-6: its key part has a gradient that is zero
    in exact arithmetic (softmax ignores a shift of all scores), so rounding
    noise there becomes lr-sized Adam steps whatever the order (cli.ranks).
    Returns the largest loss difference and weight difference (relative)."""
    import os
    import numpy as np
    ma, mb = metrics(root, a), metrics(root, b)
    assert len(ma) == len(mb) > 0, (a, b, len(ma), len(mb))
    for x, y in zip(ma, mb):
        for k in ("loss", "grad_norm"):
            assert abs(x[k] - y[k]) <= rel * abs(y[k]), (a, b, k, x, y)

    def weights(d):
        path = f"{root}/{d}/export.safetensors"
        return safetensors(path if os.path.exists(path) else f"{root}/{d}/latest/model.safetensors")

    ta, tb = weights(a), weights(b)
    assert ta.keys() == tb.keys(), (a, b)
    worst = 0.0
    for k in tb:
        if k.endswith("attn_b"):
            assert np.allclose(ta[k], tb[k], rtol=rel, atol=2e-6), (a, b, k)
            continue
        # relative to the tensor: the gradients' sums run in another order,
        # and Adam turns the rounding of an element whose gradient is near
        # zero into a step of lr's size
        r = float(np.linalg.norm(ta[k] - tb[k]) / max(np.linalg.norm(tb[k]), 1e-30))
        worst = max(worst, r)
        assert r <= rel, (a, b, k, r, float(np.abs(ta[k] - tb[k]).max()))
    return max(abs(x["loss"] - y["loss"]) for x, y in zip(ma, mb)), worst
