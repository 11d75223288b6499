"""Serving benchmark (bench/serve.sh runs it): dsc serve against Hugging Face
transformers' generate on the same weights, machine and threads.

  serve_bench.py --dsc DSC --checkpoint DIR --hf DIR --threads N --prompt P --new N
                 --conc 1,8,32 --mem-bw PATH/TO/bench/mem_bw [--json FILE]

For each concurrency C:
  dsc       `dsc serve DIR --slots C`, C requests sent at once (greedy,
            P-token prompts of token ids, N new tokens each, streamed): the
            wall time of all of them, and the mean time to first token that
            the server's /metrics reports (arrival to first token drawn);
  hf        model.generate on a static batch of the same C prompts (greedy,
            exactly N new tokens), timed whole, and with one new token for
            the time to first token.
Decode tokens/s = C * (N - 1) / (wall - time to first token): the steps
after the first token. The bandwidth limit at batch 1 is the memory
bandwidth over the weight bytes a decode step reads (each weight once): the
best of bench/mem_bw's read and copy streams, run before and after.
"""
import argparse
import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time


def prompts(c, p, vocab, seed=1):
    import random
    r = random.Random(seed)
    return [[r.randrange(256, vocab) for _ in range(p)] for _ in range(c)]


def dsc_run(args, c, ps):
    log = open(os.path.join(args.work, "serve-%d.log" % c), "w")
    srv = subprocess.Popen([args.dsc, "serve", args.checkpoint, "--port", "0", "--slots", str(c),
                            "--chunk", str(args.prompt), "--context", str(args.prompt + args.new),
                            "--threads", str(args.threads), "--name", "gpt2"],
                           stderr=subprocess.PIPE, text=True)
    port = None
    for line in srv.stderr:
        log.write(line)
        if "listening on http://127.0.0.1:" in line:
            port = int(line.split("127.0.0.1:")[1].split()[0])
            break
    if port is None:
        sys.exit("dsc serve did not start (see %s)" % log.name)
    threading.Thread(target=lambda: [log.write(l) for l in srv.stderr], daemon=True).start()

    def post(body):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=3600)
        conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        r = conn.getresponse()
        data = r.read()
        conn.close()
        return r.status, data

    # warm-up: one request through both graphs (first runs touch the arenas)
    post({"prompt": ps[0][: max(2, args.prompt // 2)], "max_tokens": 2, "temperature": 0})

    def metrics():
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
        conn.close()
        return {l.rsplit(" ", 1)[0]: float(l.rsplit(" ", 1)[1]) for l in text.splitlines()
                if l and not l.startswith("#")}

    m0 = metrics()
    results = [None] * c
    barrier = threading.Barrier(c + 1)

    def one(i):
        barrier.wait()
        results[i] = post({"prompt": ps[i], "max_tokens": args.new, "temperature": 0})

    threads = [threading.Thread(target=one, args=(i,)) for i in range(c)]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    m1 = metrics()
    srv.send_signal(signal.SIGTERM)
    srv.wait(timeout=60)
    tokens = 0
    for st, data in results:
        if st != 200:
            sys.exit("dsc serve answered %d: %s" % (st, data[:300]))
        tokens += json.loads(data)["usage"]["completion_tokens"]
    key = "dsc_time_to_first_token_seconds_"
    ttft = (m1[key + "sum"] - m0[key + "sum"]) / max(1, m1[key + "count"] - m0[key + "count"])
    return {"wall_s": wall, "ttft_s": ttft, "tokens": tokens}


def hf_load(args):
    import torch
    from transformers import AutoModelForCausalLM
    torch.set_num_threads(args.threads)
    model = AutoModelForCausalLM.from_pretrained(args.hf, dtype=torch.float32)
    model.eval()
    return torch, model


def hf_run(torch, model, args, ps):
    ids = torch.tensor(ps, dtype=torch.long)
    mask = torch.ones_like(ids)
    kw = dict(attention_mask=mask, do_sample=False, pad_token_id=0)
    with torch.inference_mode():
        model.generate(ids[:, : max(2, args.prompt // 2)], attention_mask=mask[:, : max(2, args.prompt // 2)],
                       max_new_tokens=2, min_new_tokens=2, do_sample=False, pad_token_id=0)  # warm-up
        t0 = time.perf_counter()
        model.generate(ids, max_new_tokens=1, min_new_tokens=1, **kw)
        ttft = time.perf_counter() - t0
        t0 = time.perf_counter()
        out = model.generate(ids, max_new_tokens=args.new, min_new_tokens=args.new, **kw)
        wall = time.perf_counter() - t0
    return {"wall_s": wall, "ttft_s": ttft, "tokens": int((out.shape[1] - ids.shape[1]) * ids.shape[0])}


def mem_bw(args):
    """bench/mem_bw's read and copy GB/s on the bench's threads."""
    out = subprocess.run([args.mem_bw, "--threads", str(args.threads), "--mib", "1024"],
                         check=True, capture_output=True, text=True).stdout
    rows = [json.loads(line) for line in out.splitlines() if line.strip()]
    return {r["kernel"]: r["gbps"] for r in rows if r["kernel"] in ("read", "copy")}


def main():
    ap = argparse.ArgumentParser()
    for a in ("--dsc", "--checkpoint", "--hf", "--work"):
        ap.add_argument(a, required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--conc", default="1,8,32")
    ap.add_argument("--mem-bw", required=True, help="bench/mem_bw, run before and after")
    ap.add_argument("--json")
    args = ap.parse_args()
    bw = [mem_bw(args)]
    torch, model = hf_load(args)
    vocab = model.config.vocab_size
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())  # tied: once
    rows = []
    for c in [int(x) for x in args.conc.split(",")]:
        ps = prompts(c, args.prompt, min(vocab, 50257))
        d = dsc_run(args, c, ps)
        h = hf_run(torch, model, args, ps)
        for impl, r in (("dsc", d), ("hf", h)):
            r.update(impl=impl, concurrency=c, prompt=args.prompt, new=args.new, threads=args.threads)
            r["decode_tok_s"] = c * (args.new - 1) / max(1e-9, r["wall_s"] - r["ttft_s"])
            r["total_tok_s"] = r["tokens"] / r["wall_s"]
            rows.append(r)
        print("C=%-3d dsc: %7.1f decode tok/s, TTFT %6.3f s | transformers: %7.1f decode tok/s, "
              "TTFT %6.3f s | dsc/hf decode %.2fx, TTFT %.2fx"
              % (c, d["decode_tok_s"], d["ttft_s"], h["decode_tok_s"], h["ttft_s"],
                 d["decode_tok_s"] / h["decode_tok_s"], h["ttft_s"] / d["ttft_s"]), flush=True)
    bw.append(mem_bw(args))
    # the machine's bandwidth: the best stream of either run (a shared host's
    # varies from minute to minute)
    gbps = max(v for b in bw for v in b.values())
    limit = gbps * 1e9 / weight_bytes
    off = {r["impl"]: limit / r["decode_tok_s"] for r in rows if r["concurrency"] == 1}
    print("bench/mem_bw, %d threads, GB/s: before %s, after %s"
          % (args.threads, " ".join("%s %.1f" % kv for kv in bw[0].items()),
             " ".join("%s %.1f" % kv for kv in bw[1].items())))
    print("bandwidth limit at batch 1: %.1f tok/s (%.1f GB/s over %.1f MB of weights); "
          "dsc's decode %.2fx below it, transformers' %.2fx"
          % (limit, gbps, weight_bytes / 1e6, off.get("dsc", float("nan")),
             off.get("hf", float("nan"))))
    if args.json:
        with open(args.json, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
            f.write(json.dumps({"impl": "limit", "weight_bytes": weight_bytes, "mem_bw_gbps": gbps,
                                "mem_bw_before": bw[0], "mem_bw_after": bw[1],
                                "tok_s": limit}) + "\n")


if __name__ == "__main__":
    main()
