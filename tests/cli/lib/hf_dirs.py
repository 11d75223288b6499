"""Hugging Face model directories for tests/cli/hf_import.sh, written byte by
byte (the safetensors format: u64 header length, JSON header, little-endian
data), numpy only.

    hf_dirs.py WORK                      the directories, WORK/data_train.bin, WORK/still.json
    hf_dirs.py --compare DIR OUT         the checkpoint in OUT holds DIR's tensors
"""
import glob
import json
import os
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_oracle import dsc_name, shard  # noqa: E402

LLAMA_CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 256,
                "hidden_size": 64, "intermediate_size": 176, "num_hidden_layers": 2,
                "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5,
                "rope_theta": 10000.0, "tie_word_embeddings": False, "hidden_act": "silu"}
GPT2_CONFIG = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": 250,
               "n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 64,
               "layer_norm_epsilon": 1e-5}


def to_bits(a, dtype):
    a = np.ascontiguousarray(a, dtype=np.float32)
    if dtype == "F32":
        return a.astype("<f4").tobytes()
    if dtype == "F16":
        return a.astype("<f2").tobytes()
    # BF16: the top half of the f32 bits (the values are made exact in bf16)
    return (a.view("<u4") >> 16).astype("<u2").tobytes()


def from_bits(raw, dtype, shape):
    if dtype == "F32":
        return np.frombuffer(raw, "<f4").reshape(shape).astype(np.float64)
    if dtype == "F16":
        return np.frombuffer(raw, "<f2").reshape(shape).astype(np.float64)
    u = np.frombuffer(raw, "<u2").astype("<u4") << 16
    return u.view("<f4").reshape(shape).astype(np.float64)


def write_st(path, tensors, dtype="F32"):
    header, data = {}, b""
    for name, a in tensors.items():
        raw = to_bits(a, dtype)
        header[name] = {"dtype": dtype, "shape": list(a.shape),
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)


def read_st(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        out[name] = from_bits(raw[8 + n + b:8 + n + end], e["dtype"], e["shape"])
    return out


def rounded(a, dtype):
    return from_bits(to_bits(a, dtype), dtype, a.shape).astype(np.float32)


def llama_tensors(rng, dtype="F32"):
    t = {"model.embed_tokens.weight": (256, 64), "model.norm.weight": (64,),
         "lm_head.weight": (256, 64)}
    for l in range(2):
        p = "model.layers.%d." % l
        t.update({p + "input_layernorm.weight": (64,), p + "post_attention_layernorm.weight": (64,),
                  p + "self_attn.q_proj.weight": (64, 64), p + "self_attn.k_proj.weight": (32, 64),
                  p + "self_attn.v_proj.weight": (32, 64), p + "self_attn.o_proj.weight": (64, 64),
                  p + "mlp.gate_proj.weight": (176, 64), p + "mlp.up_proj.weight": (176, 64),
                  p + "mlp.down_proj.weight": (64, 176)})
    return {k: rounded(rng.normal(0, 0.1, s), dtype) for k, s in t.items()}


def gpt2_tensors(rng):
    t = {"transformer.wte.weight": (250, 64), "transformer.wpe.weight": (64, 64),
         "transformer.ln_f.weight": (64,), "transformer.ln_f.bias": (64,)}
    for l in range(2):
        p = "transformer.h.%d." % l
        t.update({p + "ln_1.weight": (64,), p + "ln_1.bias": (64,), p + "ln_2.weight": (64,),
                  p + "ln_2.bias": (64,), p + "attn.c_attn.weight": (64, 192),
                  p + "attn.c_attn.bias": (192,), p + "attn.c_proj.weight": (64, 64),
                  p + "attn.c_proj.bias": (64,), p + "mlp.c_fc.weight": (64, 256),
                  p + "mlp.c_fc.bias": (256,), p + "mlp.c_proj.weight": (256, 64),
                  p + "mlp.c_proj.bias": (64,), p + "attn.bias": (1, 1, 64, 64)})
    return {k: rng.normal(0, 0.1, s).astype(np.float32) for k, s in t.items()}


def make_dir(path, config, tensors, dtype="F32", shards=1):
    os.makedirs(path, exist_ok=True)
    if config is not None:
        json.dump(config, open(os.path.join(path, "config.json"), "w"), indent=2)
    if shards == 1:
        write_st(os.path.join(path, "model.safetensors"), tensors, dtype)
        return
    names = list(tensors)
    parts = [names[: len(names) // 2], names[len(names) // 2:]]
    wm = {}
    for k, part in enumerate(parts):
        fn = "model-%05d-of-%05d.safetensors" % (k + 1, shards)
        write_st(os.path.join(path, fn), {n: tensors[n] for n in part}, dtype)
        wm.update({n: fn for n in part})
    json.dump({"metadata": {}, "weight_map": wm},
              open(os.path.join(path, "model.safetensors.index.json"), "w"), indent=2)


def make(work):
    rng = np.random.default_rng(5)
    base = llama_tensors(rng)
    make_dir(os.path.join(work, "llama"), LLAMA_CONFIG, base)
    sharded = dict(base)
    sharded["model.rotary_emb.inv_freq"] = np.ones(8, np.float32)  # a buffer: ignored
    make_dir(os.path.join(work, "llama_sharded"), LLAMA_CONFIG, sharded, shards=2)
    make_dir(os.path.join(work, "llama_bf16"), LLAMA_CONFIG, llama_tensors(rng, "BF16"), "BF16")
    make_dir(os.path.join(work, "llama_f16"), LLAMA_CONFIG, llama_tensors(rng, "F16"), "F16")
    tied = {k: v for k, v in base.items() if k != "lm_head.weight"}
    make_dir(os.path.join(work, "llama_tied"), dict(LLAMA_CONFIG, tie_word_embeddings=True), tied)
    make_dir(os.path.join(work, "gpt2"), GPT2_CONFIG, gpt2_tensors(rng))
    # bad ones
    bad = dict(base)
    bad["model.layers.0.self_attn.k_proj.weight"] = np.zeros((64, 64), np.float32)
    make_dir(os.path.join(work, "bad_shape"), LLAMA_CONFIG, bad)
    make_dir(os.path.join(work, "missing"), LLAMA_CONFIG, tied)
    extra = dict(base)
    extra["model.layers.0.self_attn.q_norm.weight"] = np.ones(16, np.float32)
    make_dir(os.path.join(work, "extra"), LLAMA_CONFIG, extra)
    make_dir(os.path.join(work, "truncated"), LLAMA_CONFIG, base, shards=2)
    p = os.path.join(work, "truncated", "model-00002-of-00002.safetensors")
    os.truncate(p, os.path.getsize(p) - 100)
    make_dir(os.path.join(work, "bad_type"), dict(LLAMA_CONFIG, model_type="bert"), base)
    make_dir(os.path.join(work, "bad_theta"), dict(LLAMA_CONFIG, rope_theta=500000.0), base)
    make_dir(os.path.join(work, "bad_kv"), dict(LLAMA_CONFIG, num_key_value_heads=4), base)
    make_dir(os.path.join(work, "bad_scaling"), dict(LLAMA_CONFIG, rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192}), base)
    make_dir(os.path.join(work, "bad_yarn"), dict(LLAMA_CONFIG, rope_scaling={
        "rope_type": "yarn", "factor": 4.0}), base)
    make_dir(os.path.join(work, "no_config"), None, base)
    make_dir(os.path.join(work, "bad_json"), None, base)
    open(os.path.join(work, "bad_json", "config.json"), "w").write(
        '{\n  "model_type": "llama",\n  "vocab_size": 256,,\n}\n')
    make_dir(os.path.join(work, "index_missing"), LLAMA_CONFIG, base, shards=2)
    ip = os.path.join(work, "index_missing", "model.safetensors.index.json")
    idx = json.load(open(ip))
    cur = idx["weight_map"]["model.norm.weight"]  # point it at the other shard
    idx["weight_map"]["model.norm.weight"] = ("model-00001-of-00002.safetensors"
                                              if "00002-of" in cur else
                                              "model-00002-of-00002.safetensors")
    json.dump(idx, open(ip, "w"))
    make_dir(os.path.join(work, "index_escape"), LLAMA_CONFIG, base, shards=2)
    ip = os.path.join(work, "index_escape", "model.safetensors.index.json")
    idx = json.load(open(ip))
    idx["weight_map"]["model.norm.weight"] = "../llama/model.safetensors"
    json.dump(idx, open(ip, "w"))
    nan = dict(base)
    nan["model.norm.weight"] = base["model.norm.weight"].copy()
    nan["model.norm.weight"][3] = np.nan
    make_dir(os.path.join(work, "nan"), LLAMA_CONFIG, nan)
    os.makedirs(os.path.join(work, "no_weights"), exist_ok=True)
    json.dump(LLAMA_CONFIG, open(os.path.join(work, "no_weights", "config.json"), "w"))
    shard(os.path.join(work, "data_train.bin"), list(rng.integers(0, 250, 400)))
    lr = 1e-30
    json.dump({"optimizer": {"type": "SGD", "params": {"lr": lr, "momentum": 0.0,
                                                       "weight_decay": 0.0}},
               "scheduler": {"type": "WarmupLR", "params": {
                   "warmup_min_lr": lr, "warmup_max_lr": lr, "warmup_num_steps": 1}},
               "gradient_clipping": 0.0}, open(os.path.join(work, "still.json"), "w"))


def compare(d, out):
    cfg = json.load(open(os.path.join(d, "config.json")))
    arch = "gpt2" if cfg["model_type"] == "gpt2" else "llama"
    src = {}
    for f in glob.glob(os.path.join(d, "*.safetensors")):
        src.update(read_st(f))
    step = sorted(glob.glob(os.path.join(out, "step-*")))[-1]
    ck = read_st(os.path.join(step, "model.safetensors"))
    seen = set()
    for hf, a in src.items():
        if hf.endswith("inv_freq") or hf.split(".")[-2:] == ["attn", "bias"]:  # buffers
            continue
        name, transposed = dsc_name(arch, hf)
        want = a.T if transposed else a
        got = ck[name]
        if name == "wte":  # a padded vocabulary: the rows past the file's start at zero
            # (the step at lr 1e-30 moves them by 1e-30 times their gradient)
            assert np.all(np.abs(got[want.shape[0]:]) < 1e-25), "wte padding rows are not zero"
            got = got[: want.shape[0]]
        assert got.shape == want.shape, (hf, got.shape, want.shape)
        assert np.array_equal(got, want), (hf, name, np.max(np.abs(got - want)))
        seen.add(name)
    if cfg.get("tie_word_embeddings"):
        assert np.array_equal(ck["lm_head"], src["model.embed_tokens.weight"].T), "tied head"
        seen.add("lm_head")
    missing = set(ck) - seen
    assert not missing, "not imported: %s" % sorted(missing)
    print("%s: %d tensors equal the checkpoint's params" % (os.path.basename(d), len(seen)))


if __name__ == "__main__":
    if sys.argv[1] == "--compare":
        compare(sys.argv[2], sys.argv[3])
    else:
        make(sys.argv[1])
