# dsc train --precision: bf16 and fp16 (mixed precision, f32 master weights)
# and what a bf16 checkpoint holds
# train gpt-tiny for a few steps; a bad value is a usage error.
source "$(dirname "$0")/lib/common.bash"
source "$(dirname "$0")/lib/corpus.bash"
MODEL="$SRC/examples/gpt-tiny.dsm"

make_corpus "$TMP/corpus.txt"
expect_exit 0 "$DSC" data "$TMP/corpus.txt" -o "$TMP/c"
expect_exit 1 "$DSC" train "$MODEL" --data "$TMP/c" --precision f8 &&
  expect_grep "not one of f32, bf16, fp16" "$TMP/err"
expect_exit 0 "$DSC" train --help && expect_grep '--precision P' "$TMP/out"
for p in bf16 fp16; do
  expect_exit 0 "$DSC" train "$MODEL" --data "$TMP/c" --precision "$p" --batch 2 --seq 16 \
    --steps 3 --log "$TMP/$p.jsonl" --quiet &&
    [ "$(grep -c '"loss":' "$TMP/$p.jsonl")" -eq 3 ] && pass || fail "$p: expected 3 JSON lines"
done

# master weights (the default): the checkpoint holds bf16 params and their
# f32 masters, each param the master rounded to bf16; dsc export writes the
# masters (f32) under the params' names, dsc sample runs from them
expect_exit 0 "$DSC" train "$MODEL" --data "$TMP/c" --precision bf16 --batch 2 --seq 16 \
  --steps 3 --out "$TMP/run" --quiet
expect_exit 0 "$DSC" export "$TMP/run" -o "$TMP/e.safetensors" &&
  expect_grep 'from the f32 master weights' "$TMP/out"
expect_exit 0 "$DSC" sample "$TMP/run" --tokens 8
python3 - "$TMP/run/latest" "$TMP/e.safetensors" <<'PY' && pass || fail "master weights: the files disagree"
import json, struct, sys
import numpy as np

def read(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    out = {}
    for k, v in h.items():
        if k == "__metadata__":
            continue
        s, e = v["data_offsets"]
        raw = b[8 + n + s:8 + n + e]
        if v["dtype"] == "BF16":
            a = (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32)
        else:
            assert v["dtype"] == "F32", v["dtype"]
            a = np.frombuffer(raw, np.float32)
        out[k] = (v["dtype"], a)
    return out

model, opt = read(sys.argv[1] + "/model.safetensors"), read(sys.argv[1] + "/optimizer.safetensors")
exp = read(sys.argv[2])
assert model and set(exp) == set(model), (sorted(exp), sorted(model))
for k, (dt, p) in model.items():
    assert dt == "BF16", (k, dt)
    mdt, m = opt["opt.master." + k]
    assert mdt == "F32"
    # the param is its master rounded to bf16 (nearest even), bit for bit
    u = m.view(np.uint32).astype(np.uint64)
    r = (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32)
    assert np.array_equal(r, p), k
    assert exp[k][0] == "F32" and np.array_equal(exp[k][1], m), k
    if m.size >= 1000:  # after 3 updates a master holds more than bf16's 8 bits
        assert not np.array_equal(m, p), k
print("master weights:", len(model), "params checked")
PY
finish
