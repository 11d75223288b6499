#!/usr/bin/env python3
"""Writes the crafted-input corpus of tests/crafted (python3, stdlib only).

Every file is committed (the .dsx ones with git add -f: .gitignore has *.dsx),
so the corpus is stable; run this again only to
change it:  python3 tests/crafted/gen.py
It writes the files under tests/crafted/files/, the controls under
tests/crafted/base/ and the table tests/crafted/EXPECTED, one line a file:
  FILE <TAB> ROLE <TAB> EXIT <TAB> SUBSTRING
ROLE says where tests/cli/crafted.sh puts the file and which dsc command
reads it (see that script); SUBSTRING must appear in the error output (it
names the file and the field).
"""
import json
import math
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
FILES = os.path.join(HERE, "files")
BASE = os.path.join(HERE, "base")

# tests/crafted/tiny.dsm: wte f32[256, 4], lnf_w f32[4]; SGD momentum states
WTE = [((i * 37) % 101 - 50) / 1000.0 for i in range(256 * 4)]
LNF = [1.0, 1.0, 1.0, 1.0]


def f32(vals):
    return b"".join(struct.pack("<f", v) for v in vals)


def st_raw(header, data=b"", pad=True):
    """A safetensors file from a header given as text (may be malformed)."""
    h = header.encode() if isinstance(header, str) else header
    while pad and len(h) % 8:
        h += b" "
    return struct.pack("<Q", len(h)) + h + data


def st(tensors, meta=None):
    """A well-formed file: tensors = [(name, dtype, shape, bytes)]."""
    hdr, data = {}, b""
    if meta:
        hdr["__metadata__"] = meta
    for name, dt, shape, b in tensors:
        hdr[name] = {"dtype": dt, "shape": shape, "data_offsets": [len(data), len(data) + len(b)]}
        data += b
    return st_raw(json.dumps(hdr, separators=(",", ":")), data)


GOOD_MODEL = [("lnf_w", "F32", [4], f32(LNF)), ("wte", "F32", [256, 4], f32(WTE))]
GOOD_OPT = [
    ("opt.momentum.lnf_w", "F32", [4], f32([0.0] * 4)),
    ("opt.momentum.wte", "F32", [256, 4], f32([0.0] * 1024)),
    ("opt.step", "F32", [], f32([3.0])),
]
RNG = ["b6a8a9b313caa00b", "cb7f284b67d605c9", "3440fccf54082b5a", "77026dc1feefc262"]
EXTRA = {
    "model": "@SRC@/tests/crafted/tiny.dsm",  # crafted.sh puts the source directory here
    "model_name": "crafted_tiny",
    "data": "@TMP@/d",
    "batch": "2",
    "seq": "8",
    "grad_accum": "1",
    "vocab": "256",
    "seed": "1337",
    "steps": "4",
    "lr": "0.1",
    "precision": "f32",
    "save_every": "0",
    "eval_every": "0",
    "world": "1",
    "zero_stage": "0",
}


def state(step=3, rng=None, loader=None, extra=None, drop=(), raw_extra=None, **over):
    s = {
        "format": "dsc-checkpoint",
        "version": 1,
        "step": step,
        "rng": RNG if rng is None else rng,
        "loader": {"epoch": 0, "index": 1} if loader is None else loader,
        "extra": dict(EXTRA, **(extra or {})),
    }
    s.update(over)
    if raw_extra is not None:
        s["extra"] = raw_extra
    for k in drop:
        del s[k]
    return (json.dumps(s, indent=1) + "\n").encode()


def shard_file(n_tokens, tokens=None, magic=20240520, version=1, extra=b""):
    h = [0] * 256
    h[0], h[1], h[2] = magic, version, n_tokens
    toks = tokens if tokens is not None else [(i * 7) % 256 for i in range(n_tokens)]
    return struct.pack("<256i", *h) + struct.pack("<%dH" % len(toks), *toks) + extra


def fnv1a64(b):
    h = 0xCBF29CE484222325
    for c in b:
        h = ((h ^ c) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def dsx(sections, version=1, count=None, fix=None):
    """A .dsx container (runtime/dsx.c). fix(i, entry) may change a table
    entry [off, len, sum, name] before it is written."""
    table_len = 16 + sum(32 + len(n) for n, _ in sections)
    off = (table_len + 63) // 64 * 64
    entries, body = [], b""
    for i, (name, data) in enumerate(sections):
        e = [off, len(data), fnv1a64(data), name.encode()]
        if fix:
            fix(i, e)
        entries.append(e)
        body += b"\0" * (off - table_len - len(body)) + data
        off = (off + len(data) + 63) // 64 * 64
    out = b"DSCX" + struct.pack("<III", version, len(sections) if count is None else count, 0)
    for o, n, s, name in entries:
        out += struct.pack("<QQQII", o, n, s, len(name), 0) + name
    return out + body


META = b"format=1\nmodel=tiny.dsm\ntarget=cpu\nB=2\nT=8\n"
MODULE = b"module m\n"

cases = []  # (file, role, bytes, substring)


def case(name, role, data, want):
    cases.append((name, role, data, want))


M = "model.safetensors: error: "
# ---- safetensors (as a checkpoint's model.safetensors, read by dsc export)
good = st(GOOD_MODEL)
case("st_empty.safetensors", "export-model", b"", M + "file too short: 0 bytes")
case("st_short.safetensors", "export-model", b"\x08\0\0", M + "file too short: 3 bytes")
case("st_header_past_file.safetensors", "export-model", struct.pack("<Q", 4096) + b"{}      ",
     M + "header length 4096 is larger than the rest of the file (8 bytes)")
case("st_header_absurd.safetensors", "export-model", struct.pack("<Q", 1 << 40) + b"{}      ",
     M + "header length 1099511627776 is absurd")
case("st_header_max_u64.safetensors", "export-model", b"\xff" * 8 + b"{}      ",
     M + "header length 18446744073709551615 is absurd")
case("st_not_json.safetensors", "export-model", st_raw('{"wte":'), M + "header is not valid JSON")
case("st_json_array.safetensors", "export-model", st_raw("[1,2,3]"),
     M + "header is not a JSON object")
case("st_json_string.safetensors", "export-model", st_raw('"wte"'),
     M + "header is not a JSON object")
case("st_json_trailing.safetensors", "export-model", st_raw("{} {}"),
     M + "header has bytes after its JSON object")
case("st_header_nul.safetensors", "export-model", st_raw(b"{}\0     "),
     M + "header is not valid JSON (it contains a NUL byte)")
case("st_entry_not_object.safetensors", "export-model", st_raw('{"wte":[1,2]}'),
     M + "tensor 'wte': entry is not a JSON object")
case("st_no_dtype.safetensors", "export-model",
     st_raw('{"wte":{"shape":[4],"data_offsets":[0,16]}}', b"\0" * 16),
     M + "tensor 'wte': entry has no \"dtype\"")
case("st_no_offsets.safetensors", "export-model", st_raw('{"wte":{"dtype":"F32","shape":[4]}}'),
     M + "tensor 'wte': entry has no \"data_offsets\"")
case("st_dtype_unknown.safetensors", "export-model",
     st_raw('{"wte":{"dtype":"Q4","shape":[4],"data_offsets":[0,16]}}', b"\0" * 16),
     M + "tensor 'wte': unsupported dtype 'Q4'")
case("st_dtype_not_string.safetensors", "export-model",
     st_raw('{"wte":{"dtype":4,"shape":[4],"data_offsets":[0,16]}}', b"\0" * 16),
     M + "tensor 'wte': \"dtype\" is not a string")
case("st_shape_negative.safetensors", "export-model",
     st_raw('{"wte":{"dtype":"F32","shape":[-4],"data_offsets":[0,16]}}', b"\0" * 16),
     M + "tensor 'wte': shape entry 0 is not a non-negative integer")
case("st_shape_fraction.safetensors", "export-model",
     st_raw('{"wte":{"dtype":"F32","shape":[4,1.5],"data_offsets":[0,16]}}', b"\0" * 16),
     M + "tensor 'wte': shape entry 1 is not a non-negative integer")
case("st_shape_not_array.safetensors", "export-model",
     st_raw('{"wte":{"dtype":"F32","shape":4,"data_offsets":[0,16]}}', b"\0" * 16),
     M + "tensor 'wte': \"shape\" is not an array")
case("st_shape_overflow.safetensors", "export-model",
     st_raw('{"wte":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}}'),
     M + "tensor 'wte': shape f32[4294967296,4294967296] has too many elements")
case("st_shape_zero_overflow.safetensors", "export-model",
     st_raw('{"wte":{"dtype":"F32","shape":[0,4294967296,4294967296],"data_offsets":[0,0]}}'),
     M + "tensor 'wte': shape f32[0,4294967296,4294967296] has too many elements")
case("st_rank_9.safetensors", "export-model",
     st_raw('{"wte":{"dtype":"F32","shape":[1,1,1,1,1,1,1,1,1],"data_offsets":[0,4]}}', b"\0" * 4),
     M + "tensor 'wte': rank 9 exceeds dsc's maximum of 8")
case("st_offsets_reversed.safetensors", "export-model",
     st_raw('{"wte":{"dtype":"F32","shape":[4],"data_offsets":[16,0]}}', b"\0" * 16),
     M + "tensor 'wte': \"data_offsets\" is not [begin, end] with 0 <= begin <= end")
case("st_offsets_huge.safetensors", "export-model",
     st_raw('{"wte":{"dtype":"F32","shape":[4],"data_offsets":[0,18446744073709551616]}}'),
     M + "tensor 'wte': \"data_offsets\" is not [begin, end]")
case("st_offsets_three.safetensors", "export-model",
     st_raw('{"wte":{"dtype":"F32","shape":[4],"data_offsets":[0,8,16]}}', b"\0" * 16),
     M + "tensor 'wte': \"data_offsets\" is not [begin, end]")
case("st_offsets_past_end.safetensors", "export-model",
     st_raw('{"wte":{"dtype":"F32","shape":[8],"data_offsets":[0,32]}}', b"\0" * 16),
     M + "tensor 'wte': data_offsets [0, 32] run past the end of the data (16 bytes)")
case("st_offsets_overlap.safetensors", "export-model",
     st_raw('{"lnf_w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
            '"wte":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}', b"\0" * 12),
     M + "tensors 'lnf_w' and 'wte' overlap (data bytes 4 to 8 are shared)")
case("st_offsets_hole.safetensors", "export-model",
     st_raw('{"lnf_w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
            '"wte":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}}', b"\0" * 16),
     M + "hole between tensors 'lnf_w' and 'wte'")
case("st_size_mismatch.safetensors", "export-model",
     st_raw('{"wte":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}}', b"\0" * 16),
     M + "tensor 'wte': data_offsets [0, 16] hold 16 bytes but F32 f32[3] needs 12")
case("st_trailing_bytes.safetensors", "export-model", good + b"xyz",
     M + "3 trailing bytes after the last tensor's data")
case("st_truncated.safetensors", "export-model", good[:-5],
     M + "tensor 'wte': data_offsets [16, 4112] run past the end of the data (4107 bytes)")
case("st_duplicate.safetensors", "export-model",
     st_raw('{"wte":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
            '"lnf_w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]},'
            '"wte":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}}', b"\0" * 12),
     M + "tensor 'wte' appears twice in the header")
case("st_metadata_not_string.safetensors", "export-model", st_raw('{"__metadata__":{"k":1}}'),
     M + "\"__metadata__\" entry 'k' is not a string")
case("st_metadata_twice.safetensors", "export-model",
     st_raw('{"__metadata__":{},"__metadata__":{}}'), M + "header has \"__metadata__\" twice")
nan_wte = list(WTE)
nan_wte[5] = math.nan
case("st_nan_weights.safetensors", "export-model",
     st([GOOD_MODEL[0], ("wte", "F32", [256, 4], f32(nan_wte))]),
     M + "tensor 'wte': element 5 is NaN (a checkpoint holds finite values only)")
case("st_inf_weights.safetensors", "export-model",
     st([("lnf_w", "F32", [4], f32([1, 1, math.inf, 1])), GOOD_MODEL[1]]),
     M + "tensor 'lnf_w': element 2 is infinite")
case("st_bf16_nan.safetensors", "export-model",
     st([("lnf_w", "BF16", [4], struct.pack("<4H", 0x3F80, 0x7FC1, 0x3F80, 0x3F80)), GOOD_MODEL[1]]),
     M + "tensor 'lnf_w': element 1 is NaN")
case("st_wrong_shape.safetensors", "export-model",
     st([GOOD_MODEL[0], ("wte", "F32", [128, 4], f32(WTE[:512]))]),
     M + "tensor 'wte': expected f32[256,4], found f32[128,4]")
case("st_wrong_dtype.safetensors", "export-model",
     st([("lnf_w", "F16", [4], struct.pack("<4H", *[0x3C00] * 4)), GOOD_MODEL[1]]),
     M + "tensor 'lnf_w': expected f32[4], found f16[4]")
case("st_missing_tensor.safetensors", "export-model", st([GOOD_MODEL[1]]),
     M + "tensor 'lnf_w' is missing (expected f32[4])")
case("st_extra_tensor.safetensors", "export-model",
     st(GOOD_MODEL + [("bogus", "F32", [1], f32([0]))]), M + "unexpected tensor 'bogus'")
case("st_no_tensors.safetensors", "export-model", st([]),
     M + "tensor 'wte' is missing (expected f32[256,4])")
# the same files through resume and sample
case("st_wrong_shape_resume.safetensors", "resume-model",
     st([GOOD_MODEL[0], ("wte", "F32", [128, 4], f32(WTE[:512]))]),
     M + "tensor 'wte': expected f32[256,4], found f32[128,4]")
case("st_nan_weights_sample.safetensors", "sample-model",
     st([GOOD_MODEL[0], ("wte", "F32", [256, 4], f32(nan_wte))]),
     M + "tensor 'wte': element 5 is NaN")
case("st_nan_weights_resume.safetensors", "resume-model",
     st([GOOD_MODEL[0], ("wte", "F32", [256, 4], f32(nan_wte))]),
     M + "tensor 'wte': element 5 is NaN")

# ---- optimizer.safetensors
O = "optimizer.safetensors: error: "
case("opt_nan_momentum.safetensors", "resume-opt",
     st([GOOD_OPT[0], ("opt.momentum.wte", "F32", [256, 4], f32([math.nan] * 1024)), GOOD_OPT[2]]),
     O + "tensor 'opt.momentum.wte': element 0 is NaN")
case("opt_loss_scale_zero.safetensors", "export-opt",
     st(GOOD_OPT + [("opt.loss_scale", "F32", [], f32([0.0]))]),
     O + "tensor 'opt.loss_scale' is 0, not a positive number")
case("opt_loss_scale_negative.safetensors", "resume-opt",
     st(GOOD_OPT + [("opt.loss_scale", "F32", [], f32([-8.0]))]),
     O + "tensor 'opt.loss_scale' is -8, not a positive number")
case("opt_missing_state.safetensors", "resume-opt", st(GOOD_OPT[:2]),
     O + "tensor 'opt.step' is missing")

# ---- state.json
S = "state.json: error: malformed checkpoint state: "
case("state_empty.json", "export-state", b"", S + "not a JSON object")
case("state_not_json.json", "export-state", b'{"format": "dsc-checkpoint", "version": 1, ',
     S + "not a JSON object")
case("state_array.json", "export-state", b"[1, 2, 3]\n", S + "not a JSON object")
case("state_bad_format.json", "export-state", state(format="dsc-ckpt"),
     S + "\"format\" is not \"dsc-checkpoint\"")
case("state_bad_version.json", "export-state", state(version=2),
     S + "unsupported \"version\" (this dsc reads version 1)")
case("state_missing_step.json", "resume-state", state(drop=("step",)),
     S + "\"step\" is not a non-negative integer")
case("state_step_negative.json", "resume-state", state(step=-1),
     S + "\"step\" is not a non-negative integer")
case("state_step_string.json", "export-state", state(step="3"),
     S + "\"step\" is not a non-negative integer")
case("state_step_huge.json", "export-state", state(step=1e300),
     S + "\"step\" is not a non-negative integer")
case("state_step_past_steps.json", "resume-state", state(step=7),
     S + "\"step\" 7 is past \"extra.steps\" 4")
case("state_rng_short.json", "resume-state", state(rng=RNG[:3]),
     S + "\"rng\" is not an array of 4 hex strings")
case("state_rng_not_hex.json", "resume-state", state(rng=RNG[:3] + ["zz026dc1feefc262"]),
     S + "\"rng\" is not an array of 4 hex strings")
case("state_rng_number.json", "export-state", state(rng=[1, 2, 3, 4]),
     S + "\"rng\" is not an array of 4 hex strings")
case("state_rng_zero.json", "resume-state", state(rng=["0" * 16] * 4),
     S + "\"rng\" is all zero")
case("state_loader_missing.json", "resume-state", state(drop=("loader",)),
     S + "\"loader\" is not {\"epoch\": integer, \"index\": integer}")
case("state_loader_negative.json", "resume-state", state(loader={"epoch": 0, "index": -2}),
     S + "\"loader\" is not {\"epoch\": integer, \"index\": integer}")
case("state_extra_not_object.json", "export-state", state(raw_extra=["a"]),
     S + "\"extra\" is not an object")
case("state_extra_number.json", "export-state", state(extra={"batch": 2}),
     S + "\"extra\" values must be strings")
case("state_lr_junk.json", "resume-state", state(extra={"lr": "abc"}),
     S + "\"extra.lr\" is 'abc', not a finite number >= 0")
case("state_lr_negative.json", "sample-state", state(extra={"lr": "-3e-4"}),
     S + "\"extra.lr\" is '-3e-4', not a finite number >= 0")
case("state_lr_inf.json", "resume-state", state(extra={"lr": "inf"}),
     S + "\"extra.lr\" is 'inf', not a finite number >= 0")
case("state_lr_nan.json", "export-state", state(extra={"lr": "nan"}),
     S + "\"extra.lr\" is 'nan', not a finite number >= 0")
case("state_seed_negative.json", "resume-state", state(extra={"seed": "-1"}),
     S + "\"extra.seed\" is '-1', not an integer in [0, 18446744073709551615]")
case("state_seed_fraction.json", "sample-state", state(extra={"seed": "1.5"}),
     S + "\"extra.seed\" is '1.5', not an integer")
case("state_seed_huge.json", "resume-state", state(extra={"seed": "99999999999999999999"}),
     S + "\"extra.seed\" is '99999999999999999999', not an integer")
case("state_batch_zero.json", "resume-state", state(extra={"batch": "0"}),
     S + "\"extra.batch\" is '0', not an integer in [1, 2147483648]")
case("state_seq_junk.json", "sample-state", state(extra={"seq": "8x"}),
     S + "\"extra.seq\" is '8x', not an integer")
case("state_world_zero.json", "resume-state", state(extra={"world": "0"}),
     S + "\"extra.world\" is '0', not an integer in [1, 100000]")
case("state_zero_stage_9.json", "resume-state", state(extra={"zero_stage": "9"}),
     S + "\"extra.zero_stage\" is '9', not an integer in [0, 3]")
case("state_zero_world_junk.json", "export-state", state(extra={"zero_world": "-2"}),
     S + "\"extra.zero_world\" is '-2', not an integer in [1, 100000]")
case("state_steps_junk.json", "resume-state", state(extra={"steps": "four"}),
     S + "\"extra.steps\" is 'four', not an integer")

# ---- ZeRO shards (shard-00000-of-00001.safetensors of a checkpoint whose
# model.safetensors holds lnf_w and whose state says zero_world 1)
H = "shard-00000-of-00001.safetensors: error: "
chunk = [("wte", "F32", [1024], f32(WTE))]
case("shard_full_overflow.safetensors", "export-shard",
     st(chunk, {"full.wte": "16384x1125899906842625", "set.wte": "model"}),
     H + "malformed shard metadata: \"full.wte\" is '16384x1125899906842625'")
case("shard_full_negative.safetensors", "resume-shard",
     st(chunk, {"full.wte": "-256x-4", "set.wte": "model"}),
     H + "malformed shard metadata: \"full.wte\" is '-256x-4'")
case("shard_full_garbage.safetensors", "export-shard",
     st(chunk, {"full.wte": "256x4x", "set.wte": "model"}),
     H + "malformed shard metadata: \"full.wte\" is '256x4x'")
case("shard_full_missing.safetensors", "export-shard", st(chunk, {"set.wte": "model"}),
     H + "malformed shard 'wte': its full shape or set is missing or does not fit 1 chunks")
case("shard_full_too_big.safetensors", "export-shard",
     st(chunk, {"full.wte": "512x4", "set.wte": "model"}),
     H + "malformed shard 'wte': its full shape or set is missing or does not fit 1 chunks")
case("shard_set_unknown.safetensors", "export-shard",
     st(chunk, {"full.wte": "256x4", "set.wte": "weights"}),
     H + "malformed shard 'wte': its full shape or set is missing")
case("shard_nan.safetensors", "export-shard",
     st([("wte", "F32", [1024], f32([math.nan] + WTE[1:]))], {"full.wte": "256x4", "set.wte": "model"}),
     H + "tensor 'wte': element 0 is NaN")
case("shard_header_past_file.safetensors", "export-shard", struct.pack("<Q", 1 << 20) + b"{}",
     H + "header length 1048576 is larger than the rest of the file")

# ---- token shards (PREFIX_train.bin of dsc train tiny.dsm --data PREFIX)
D = "d_train.bin: error: "
case("data_empty.bin", "train-data", b"", D + "file too short for the header: 0 bytes")
case("data_short_header.bin", "train-data", shard_file(0)[:100],
     D + "file too short for the header: 100 bytes, the header alone is 1024")
case("data_bad_magic.bin", "train-data", shard_file(64, magic=20240521),
     D + "bad magic number 20240521 (expected 20240520 or 20240801): not a token shard")
case("data_bad_version.bin", "train-data", shard_file(64, version=7),
     D + "unsupported shard version 7 (this dsc reads version 1 under magic 20240520)")
case("data_count_past_file.bin", "train-data",
     struct.pack("<256i", 20240520, 1, 1 << 30, *[0] * 253) + b"\0" * 128,
     D + "truncated: the header says 1073741824 tokens (2147483648 bytes) but the file holds 128")
case("data_negative_count.bin", "train-data",
     struct.pack("<256i", 20240520, 1, -5, *[0] * 253) + b"\0" * 128,
     D + "negative token count -5 in the header")
case("data_odd_bytes.bin", "train-data", shard_file(64, extra=b"\x01"),
     D + "1 trailing bytes: the header says 64 tokens (128 bytes) but the file holds 129")
case("data_token_outside_vocab.bin", "train-data", shard_file(64, tokens=[3] * 63 + [300]),
     D + "token id 300 at position 63 is outside the vocabulary (size 256)")
case("data_too_few_tokens.bin", "train-data", shard_file(5),
     D + "the shard holds 5 tokens, fewer than seq + 1 = 9")

# ---- .dsx program files (dsc run FILE.dsx)
def dx(name):
    return name + ": error: "


secs = [("meta", META), ("module.forward", MODULE)]
case("dsx_empty.dsx", "run-dsx", b"", dx("dsx_empty.dsx") + "not a compiled program (no .dsx header)")
case("dsx_bad_magic.dsx", "run-dsx", b"DSCY" + dsx(secs)[4:],
     dx("dsx_bad_magic.dsx") + "not a compiled program (no .dsx header)")
case("dsx_truncated_header.dsx", "run-dsx", b"DSCX\x01\0\0",
     dx("dsx_truncated_header.dsx") + "not a valid .dsx file: no DSCX header")
case("dsx_bad_version.dsx", "run-dsx", dsx(secs, version=9),
     dx("dsx_bad_version.dsx") + "format version 9, this dsc reads version 1")
case("dsx_too_many_sections.dsx", "run-dsx", dsx(secs, count=1 << 20),
     dx("dsx_too_many_sections.dsx") + "not a valid .dsx file: too many sections")
case("dsx_truncated_table.dsx", "run-dsx", dsx(secs)[:40],
     dx("dsx_truncated_table.dsx") + "not a valid .dsx file: truncated section table")
case("dsx_truncated_body.dsx", "run-dsx", dsx(secs)[:-4],
     dx("dsx_truncated_body.dsx") + "not a valid .dsx file: section 'module.forward' runs past the end")


def past_end(i, e):
    if i == 1:
        e[0] = 1 << 62


def in_table(i, e):
    if i == 0:
        e[0] = 20


def overlap(i, e):
    if i == 1:
        e[0] -= 64  # onto meta's bytes (meta is shorter than 64)


def name_nul(i, e):
    if i == 0:
        e[3] = b"me\0a"


def bad_sum(i, e):
    if i == 0:
        e[2] ^= 1


case("dsx_section_past_end.dsx", "run-dsx", dsx(secs, fix=past_end),
     dx("dsx_section_past_end.dsx") + "not a valid .dsx file: section 'module.forward' runs past the end")
case("dsx_section_in_table.dsx", "run-dsx", dsx(secs, fix=in_table),
     dx("dsx_section_in_table.dsx") + "not a valid .dsx file: section 'meta' starts at byte 20, inside the section table")
case("dsx_sections_overlap.dsx", "run-dsx", dsx(secs, fix=overlap),
     dx("dsx_sections_overlap.dsx") + "not a valid .dsx file: sections 'module.forward' and 'meta' overlap")
case("dsx_section_twice.dsx", "run-dsx", dsx([("meta", META), ("meta", META)]),
     dx("dsx_section_twice.dsx") + "not a valid .dsx file: section 'meta' appears twice")
case("dsx_name_nul.dsx", "run-dsx", dsx(secs, fix=name_nul),
     dx("dsx_name_nul.dsx") + "not a valid .dsx file: bad section name")
case("dsx_checksum.dsx", "run-dsx", dsx(secs, fix=bad_sum),
     dx("dsx_checksum.dsx") + "not a valid .dsx file: section 'meta' is corrupted (checksum)")
case("dsx_no_meta.dsx", "run-dsx", dsx([("module.forward", MODULE)]),
     dx("dsx_no_meta.dsx") + "not a valid .dsx file: no meta section")
case("dsx_bad_meta.dsx", "run-dsx", dsx([("meta", b"format\n"), ("module.forward", MODULE)]),
     dx("dsx_bad_meta.dsx") + "not a valid .dsx file: malformed meta section")
case("dsx_module_type_overflow.dsx", "run-dsx",
     dsx([("meta", META), ("module.forward",
                           b"module m\n\ngraph forward(%x: f32[16384,1125899906842625]) {\n"
                           b"  return %x\n}\n")]),
     "dsx_module_type_overflow.dsx:module.forward:3:15: error: input: result "
     "f32[16384,1125899906842625] has too many elements")
case("dsx_module_garbage.dsx", "run-dsx", dsx([("meta", META), ("module.forward", b"\x01\x02 %%")]),
     "dsx_module_garbage.dsx:module.forward:1:")
case("dsx_bad_format.dsx", "run-dsx", dsx([("meta", b"format=7\n"), ("module.forward", MODULE)]),
     dx("dsx_bad_format.dsx") + "program format 7, this dsc reads format 1")


def main():
    os.makedirs(FILES, exist_ok=True)
    os.makedirs(BASE, exist_ok=True)
    for old in os.listdir(FILES):
        os.unlink(os.path.join(FILES, old))
    base = {
        "model.safetensors": st(GOOD_MODEL),
        "optimizer.safetensors": st(GOOD_OPT),
        "state.json": state(),
        "model_zero.safetensors": st(GOOD_MODEL[:1]),
        "state_zero.json": state(extra={"zero_world": "1"}),
        "shard-00000-of-00001.safetensors": st(chunk, {"full.wte": "256x4", "set.wte": "model"}),
        "d_train.bin": shard_file(256),
    }
    for name, data in base.items():
        with open(os.path.join(BASE, name), "wb") as f:
            f.write(data)
    names = set()
    with open(os.path.join(HERE, "EXPECTED"), "w") as table:
        table.write("# written by tests/crafted/gen.py: FILE<TAB>ROLE<TAB>EXIT<TAB>SUBSTRING\n")
        for name, role, data, want in cases:
            assert name not in names, name
            assert "\t" not in want and "\n" not in want
            names.add(name)
            with open(os.path.join(FILES, name), "wb") as f:
                f.write(data)
            table.write("%s\t%s\t1\t%s\n" % (name, role, want))
    print("%d crafted files, %d controls" % (len(cases), len(base)))


if __name__ == "__main__":
    main()
