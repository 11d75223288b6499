#!/usr/bin/env python3
"""The bf16 GEMM ceiling of this GPU: the denominator of MFU in tests/gpu/run.sh.

Times torch.matmul (cuBLAS) of N x N x N bf16 matrices on random data, the
mean of --reps products after --warmup, timed with CUDA events, and prints
one JSON line {"impl":"gemm-ceiling","tflops":..}. The figure of the largest
size is the ceiling (the H200's is about 790 TFLOP/s here, KINDS.md)."""
import argparse
import json

import torch


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="4096,8192")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("gpu_gemm_ceiling: torch sees no GPU")
    out = {"impl": "gemm-ceiling", "device": torch.cuda.get_device_name(), "dtype": "bf16",
           "sizes": {}}
    for n in (int(x) for x in args.sizes.split(",")):
        a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        for _ in range(args.warmup):
            a @ b
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(args.reps):
            a @ b
        end.record()
        torch.cuda.synchronize()
        s = start.elapsed_time(end) / 1e3 / args.reps
        out["sizes"][str(n)] = round(2 * n ** 3 / s / 1e12, 1)
    out["tflops"] = max(out["sizes"].values())
    print(json.dumps(out))


if __name__ == "__main__":
    main()
