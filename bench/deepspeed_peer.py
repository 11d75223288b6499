#!/usr/bin/env python3
"""One rank of DeepSpeed training the model of bench/pytorch_gpt2_step.py
(examples/gpt-tiny.dsm, or the ~30M model of bench/deepspeed_peer.sh) with a
ds_config, on the CPU (DeepSpeed's CPU accelerator, gloo). Started by
torch.distributed.run (bench/deepspeed_peer.sh); rank 0 prints one JSON line:
median step time over the timed steps, tokens/s, each rank's peak RSS, the
first and last loss.

    python -m torch.distributed.run --nproc_per_node 2 bench/deepspeed_peer.py \
        --model gpt-tiny --config ds.json --seq 64 --steps 10
"""
import argparse
import json
import os
import resource
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pytorch_gpt2_step as ref  # noqa: E402  the same model as the PyTorch baseline

import deepspeed  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

MODELS = dict(ref.MODELS)
MODELS["gpt-30m"] = (50304, 1024, 384, 6, 6)  # bench/deepspeed_peer.sh writes the same .dsm


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=tuple(MODELS), default="gpt-tiny")
    ap.add_argument("--config", required=True)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--local_rank", type=int, default=-1)
    a = ap.parse_args()
    ref.VOCAB, ref.CTX, ref.D, ref.HEADS, ref.LAYERS = MODELS[a.model]
    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    cfg = json.load(open(a.config))
    model = ref.GPT2("sdpa")
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    micro = engine.train_micro_batch_size_per_gpu()
    accum = engine.gradient_accumulation_steps()
    gen = torch.Generator().manual_seed(100 + rank)
    draw = min(ref.VOCAB, 50257)
    times, losses = [], []
    for s in range(a.warmup + a.steps):
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(accum):
            tok = torch.randint(0, draw, (micro, a.seq), generator=gen)
            tgt = torch.randint(0, draw, (micro, a.seq), generator=gen)
            loss = engine(tok, tgt)
            engine.backward(loss)
            engine.step()
        lv = loss.item()
        dist.barrier()
        dt = time.perf_counter() - t0
        losses.append(lv)
        if s >= a.warmup:
            times.append(dt)
    rss = torch.tensor([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024], dtype=torch.float64)
    all_rss = [torch.zeros_like(rss) for _ in range(world)]
    dist.all_gather(all_rss, rss)
    if rank == 0:
        step = statistics.median(times)
        print(json.dumps({
            "impl": "deepspeed", "deepspeed": deepspeed.__version__, "torch": torch.__version__,
            "model": a.model, "params": sum(p.numel() for p in model.parameters()),
            "world": world, "micro": micro, "accum": accum, "seq": a.seq,
            "zero_stage": engine.zero_optimization_stage(),
            "step_s_median": round(step, 6), "tokens_per_s": round(micro * accum * world * a.seq / step, 1),
            "peak_rss_bytes": [int(r.item()) for r in all_rss],
            "loss_first": round(losses[0], 5), "loss_last": round(losses[-1], 5),
        }), flush=True)


if __name__ == "__main__":
    main()
