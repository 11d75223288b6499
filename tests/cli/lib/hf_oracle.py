"""transformers as the oracle of an imported model (tests/cli/hf_oracle.sh).

    hf_oracle.py make ARCH WORK    a random-init model saved with save_pretrained
                                   in WORK/model, a token shard of exactly B
                                   windows (WORK/data_train.bin), two
                                   ds_configs, and transformers' loss, every
                                   gradient and the weights after one AdamW
                                   step (WORK/ref.safetensors, WORK/ref.json)
    hf_oracle.py check ARCH WORK   compares dsc's run (WORK/sgd, WORK/adamw)
                                   with them; exit 1 on a difference

ARCH: llama (rotary embeddings, 4 query heads on 2 key/value heads, SwiGLU,
RMSNorm, untied head: examples/llama-tiny.dsm) or gpt2 (examples/gpt-tiny.dsm,
a Conv1D model with a tied head). The shard holds B x T + 1 tokens, so the
first step's batch is every window (in an order that neither the mean loss
nor the gradients depend on).

The gradients come from a step of plain SGD at lr 1e4: the params after it
are p - 1e4 g, so g = (p - p') / 1e4 to about 1e-7 of |g| in f32 (an f32
param of 0.02 loses 2e-9 / 1e4 of absolute precision). The AdamW step uses
torch.optim.AdamW with dsc's rule of no weight decay on 1-D params and clips
the gradient norm to 1.0 first, as the ds_config asks.
"""
import glob
import json
import os
import struct
import sys

import numpy as np

B, T = 4, 32
LR_SGD, LR_ADAMW = 1e4, 1e-3
# Adam divides by sqrt(v) + eps = |g| + eps on the first step, so an element
# whose gradient is near eps moves by a fraction of lr that f32 rounding of
# g changes (with eps 1e-8: 1.2e-5 where |g| = 9e-9); with 1e-6, 2.8e-6 at
# most on this model
ADAM_EPS = 1e-6
# tolerances (issue: loss 1e-5 relative in f32, gradients 1e-4, one AdamW step
# 1e-5): the gradients normwise per param, the weights absolute (they are of
# order 0.01 to 1; an element whose gradient cancels to near zero has a
# relative rounding error of 1e-2 in both f32 implementations, and Adam turns
# that into a visible share of lr)
TOL_LOSS, TOL_GRAD, TOL_STEP = 1e-5, 1e-4, 1e-5


def shard(path, tokens):
    header = [20240520, 1, len(tokens)] + [0] * 253
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(np.asarray(tokens, dtype="<u2").tobytes())


def make(arch, work):
    import torch
    from safetensors.torch import save_file

    torch.manual_seed(1234)
    if arch.startswith("llama"):
        from transformers import LlamaConfig, LlamaForCausalLM

        # llama3: Llama 3.1's rope scaling over an original context of 64,
        # so that the frequencies of a head of 16 fall in all three bands
        # (kept, interpolated, divided by the factor)
        scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                   "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
        cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=176,
                          num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                          rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=False,
                          max_position_embeddings=256, attn_implementation="eager",
                          rope_scaling=scaling if arch == "llama3" else None)
        model = LlamaForCausalLM(cfg)
    elif arch == "mistral":
        from transformers import MistralConfig, MistralForCausalLM

        # a sliding window of 8 over sequences of 32: most keys are outside it
        cfg = MistralConfig(vocab_size=256, hidden_size=64, intermediate_size=176,
                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                            rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=False,
                            max_position_embeddings=256, sliding_window=8,
                            attn_implementation="eager")
        model = MistralForCausalLM(cfg)
    else:
        from transformers import GPT2Config, GPT2LMHeadModel

        cfg = GPT2Config(vocab_size=256, n_positions=64, n_embd=64, n_layer=2, n_head=4,
                         activation_function="gelu_new", layer_norm_epsilon=1e-5,
                         resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                         attn_implementation="eager")
        model = GPT2LMHeadModel(cfg)
    # random weights everywhere, norms included (an all-ones norm would hide
    # a weight read in the wrong place)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(0.0, 0.3 if p.dim() == 1 else 0.05)
            if p.dim() == 1 and "norm" in name or name.endswith("ln_1.weight") or \
                    name.endswith("ln_2.weight") or name.endswith("ln_f.weight"):
                p.add_(1.0)
    model.eval()  # no dropout
    model.save_pretrained(os.path.join(work, "model"))

    g = torch.Generator().manual_seed(99)
    tokens = torch.randint(0, 256, (B * T + 1,), generator=g)
    shard(os.path.join(work, "data_train.bin"), tokens.tolist())
    x = torch.stack([tokens[w * T: w * T + T] for w in range(B)])
    y = torch.stack([tokens[w * T + 1: w * T + T + 1] for w in range(B)])

    def loss_of():
        logits = model(input_ids=x).logits
        return torch.nn.functional.cross_entropy(logits.reshape(-1, 256), y.reshape(-1))

    loss = loss_of()
    loss.backward()
    names = [n for n, _ in model.named_parameters()]
    ref = {}
    for n, p in model.named_parameters():
        ref["grad." + n] = p.grad.detach().clone().contiguous()
    norm = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in model.parameters())).item()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=LR_ADAMW, betas=(0.9, 0.95), eps=ADAM_EPS)
    opt.step()
    for n, p in model.named_parameters():
        ref["adamw." + n] = p.detach().clone().contiguous()
    save_file(ref, os.path.join(work, "ref.safetensors"))
    json.dump({"loss": loss.item(), "grad_norm": norm, "names": names},
              open(os.path.join(work, "ref.json"), "w"))
    constant = lambda lr: {"type": "WarmupLR", "params": {
        "warmup_min_lr": lr, "warmup_max_lr": lr, "warmup_num_steps": 1}}
    json.dump({"optimizer": {"type": "SGD", "params": {"lr": LR_SGD, "momentum": 0.0,
                                                       "weight_decay": 0.0}},
               "scheduler": constant(LR_SGD), "gradient_clipping": 0.0},
              open(os.path.join(work, "sgd.json"), "w"))
    json.dump({"optimizer": {"type": "AdamW", "params": {"lr": LR_ADAMW, "betas": [0.9, 0.95],
                                                         "eps": ADAM_EPS, "weight_decay": 0.1}},
               "scheduler": constant(LR_ADAMW), "gradient_clipping": 1.0},
              open(os.path.join(work, "adamw.json"), "w"))
    print("%s: transformers loss %.6f, grad norm %.6f" % (arch, loss.item(), norm))


def dsc_name(arch, hf):
    """transformers' name -> (dsc's param, transposed) as runtime/hf.c maps it"""
    if arch.startswith("llama") or arch == "mistral":
        n = hf[len("model."):] if hf.startswith("model.") else hf
        n = n.replace("self_attn.", "").replace("mlp.", "")
        n = n[: -len(".weight")] if n.endswith(".weight") else n
        transposed = hf.endswith("_proj.weight") or hf == "lm_head.weight"
        return n, transposed
    n = hf[len("transformer."):] if hf.startswith("transformer.") else hf
    table = {"ln_1.weight": "ln1_w", "ln_1.bias": "ln1_b", "attn.c_attn.weight": "attn_w",
             "attn.c_attn.bias": "attn_b", "attn.c_proj.weight": "attn_proj_w",
             "attn.c_proj.bias": "attn_proj_b", "ln_2.weight": "ln2_w", "ln_2.bias": "ln2_b",
             "mlp.c_fc.weight": "fc_w", "mlp.c_fc.bias": "fc_b", "mlp.c_proj.weight": "fc_proj_w",
             "mlp.c_proj.bias": "fc_proj_b"}
    if n.startswith("h."):
        layer, rest = n[2:].split(".", 1)
        return "h.%s.%s" % (layer, table[rest]), False
    return {"wte.weight": "wte", "wpe.weight": "wpe", "ln_f.weight": "lnf_w",
            "ln_f.bias": "lnf_b", "lm_head.weight": None}[n], False


def last_checkpoint(out):
    steps = sorted(glob.glob(os.path.join(out, "step-*")))
    assert steps, "no checkpoint in " + out
    from safetensors.numpy import load_file
    return load_file(os.path.join(steps[-1], "model.safetensors"))


def first_log(path):
    return [json.loads(l) for l in open(path) if '"loss"' in l][0]


def check(arch, work):
    from safetensors.numpy import load_file

    ref = load_file(os.path.join(work, "ref.safetensors"))
    meta = json.load(open(os.path.join(work, "ref.json")))
    init = load_file(os.path.join(work, "model", "model.safetensors"))
    bad = 0
    for run in ("sgd", "adamw"):
        log = first_log(os.path.join(work, run + ".jsonl"))
        r = abs(log["loss"] - meta["loss"]) / abs(meta["loss"])
        ok = r <= TOL_LOSS
        bad += not ok
        print("%s %s: loss dsc %.7f transformers %.7f relative %.2g %s"
              % (arch, run, log["loss"], meta["loss"], r, "ok" if ok else "FAIL"))
    log = first_log(os.path.join(work, "sgd.jsonl"))
    r = abs(log["grad_norm"] - meta["grad_norm"]) / meta["grad_norm"]
    bad += r > TOL_GRAD
    print("%s: gradient norm dsc %.7f transformers %.7f relative %.2g"
          % (arch, log["grad_norm"], meta["grad_norm"], r))
    sgd, adamw = last_checkpoint(os.path.join(work, "sgd")), last_checkpoint(os.path.join(work, "adamw"))
    worst_g = worst_w = 0.0
    for hf in meta["names"]:
        name, transposed = dsc_name(arch, hf)
        if name is None:  # GPT-2's head: the tied wte
            continue
        fix = (lambda a: a.T) if transposed else (lambda a: a)
        p0 = fix(init[hf].astype(np.float64))
        g = (p0 - sgd[name].astype(np.float64)) / LR_SGD
        gr = fix(ref["grad." + hf].astype(np.float64))
        eg = np.linalg.norm(g - gr) / max(np.linalg.norm(gr), 1e-30)
        w, wr = adamw[name].astype(np.float64), fix(ref["adamw." + hf].astype(np.float64))
        ew = np.max(np.abs(w - wr))  # weights of 0.01 to 1: absolute
        worst_g, worst_w = max(worst_g, eg), max(worst_w, ew)
        if eg > TOL_GRAD or ew > TOL_STEP:
            bad += 1
            print("FAIL %s (%s): gradient %.2g, AdamW step %.2g" % (hf, name, eg, ew))
    print("%s: %d params; worst gradient difference %.2g (normwise, bound %g), worst weight "
          "after one AdamW step %.2g (absolute, bound %g)"
          % (arch, len(meta["names"]), worst_g, TOL_GRAD, worst_w, TOL_STEP))
    sys.exit(1 if bad else 0)


def reload(arch, work):
    """`dsc export --format hf` of the AdamW run, loaded by from_pretrained:
    no missing or unexpected weight, every weight the checkpoint's, and its
    loss on the batch what dsc computes from the exported directory."""
    import torch
    from transformers import AutoModelForCausalLM

    model, info = AutoModelForCausalLM.from_pretrained(os.path.join(work, "export"),
                                                       output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    model.eval()
    ck = last_checkpoint(os.path.join(work, "adamw"))
    worst = 0.0
    for hf, p in model.named_parameters():
        name, transposed = dsc_name(arch, hf)
        if name is None:
            continue
        want = ck[name].T if transposed else ck[name]
        worst = max(worst, float(np.max(np.abs(p.detach().numpy() - want))))
    raw = np.fromfile(os.path.join(work, "data_train.bin"), dtype="<u2", offset=1024)
    tokens = torch.tensor(raw.astype(np.int64))
    x = torch.stack([tokens[w * T: w * T + T] for w in range(B)])
    y = torch.stack([tokens[w * T + 1: w * T + T + 1] for w in range(B)])
    with torch.no_grad():
        loss = torch.nn.functional.cross_entropy(model(input_ids=x).logits.reshape(-1, 256),
                                                 y.reshape(-1)).item()
    dsc = first_log(os.path.join(work, "reimport.jsonl"))["loss"]
    r = abs(dsc - loss) / abs(loss)
    print("%s export: from_pretrained loaded every weight (largest difference from the "
          "checkpoint %.2g); loss transformers %.7f, dsc from the export %.7f, relative %.2g"
          % (arch, worst, loss, dsc, r))
    sys.exit(0 if worst == 0.0 and r <= TOL_LOSS else 1)


if __name__ == "__main__":
    cmd, arch, work = sys.argv[1:4]
    {"make": make, "check": check, "reload": reload}[cmd](arch, work)
