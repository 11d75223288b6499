# safetensors files written by dsc are read by the Python safetensors package
# (values equal), and the package writes the very same bytes for the same
# tensors. Skipped with a notice when python3 lacks safetensors or numpy.
source "$(dirname "$0")/lib/common.bash"
: "${UNIT:?set UNIT to the dsc_unit_tests binary}"

if ! python3 -c 'import safetensors, numpy' 2>/dev/null; then
  # CI installs them (scripts/install-deps.sh), so there a missing package fails
  if [ -n "${CI:-}" ]; then echo "FAIL: CI without python3 safetensors/numpy"; exit 1; fi
  echo "SKIP: python3 cannot import safetensors and numpy (pip install safetensors numpy)"
  exit 0
fi
mkdir -p "$TMP/st"
expect_exit 0 env DSC_ST_OUT="$TMP/st" "$UNIT" --gtest_filter=SafetensorsPython.WriteFixture
[ -s "$TMP/st/expected.txt" ] && pass || fail "the unit test wrote no fixture"

cat >"$TMP/check.py" <<'PY'
import struct, sys
import numpy as np
from safetensors import safe_open
from safetensors.numpy import load_file, save

d = sys.argv[1]
expected = {}
for line in open(d + "/expected.txt"):
    f = line.split()
    rank = int(f[3])
    shape = tuple(int(x) for x in f[4:4 + rank])
    vals = [float(x) for x in f[4 + rank:]]
    expected.setdefault(f[0], []).append((f[1], f[2], shape, vals))
npdt = {"F32": np.float32, "F64": np.float64, "F16": np.float16, "I32": np.int32,
        "I64": np.int64, "BOOL": np.bool_}
failed = 0
def check(ok, what):
    global failed
    print(("ok   " if ok else "FAIL ") + what)
    failed += not ok

# 1. Every dtype numpy has: the package loads the file, values match exactly,
#    and its own writer produces byte-identical output.
path = d + "/dsc.safetensors"
loaded = load_file(path)
arrays = {}
for name, dt, shape, vals in expected["dsc.safetensors"]:
    want = np.array(vals, dtype=np.float64).reshape(shape).astype(npdt[dt])
    got = loaded.get(name)
    check(got is not None and got.dtype == want.dtype and got.shape == shape
          and np.array_equal(got, want), f"{name} {dt}{list(shape)}")
    arrays[name] = want
check(set(loaded) == set(arrays), "tensor names")
with safe_open(path, framework="numpy") as f:
    check(f.metadata() == {"format": "np"}, "metadata")
mine = open(path, "rb").read()
check(save(arrays, metadata={"format": "np"}) == mine, "byte-identical to the package's writer")

# 2. BF16 (numpy has no bfloat16): the package opens the file and reads the
#    f32 tensor; the bf16 bytes are decoded by hand at the header's offsets.
path = d + "/dsc_bf16.safetensors"
raw = open(path, "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
import json
header = json.loads(raw[8:8 + n])
with safe_open(path, framework="numpy") as f:
    check(sorted(f.keys()) == ["bf", "f"], "bf16 file opens")
    for name, dt, shape, vals in expected["dsc_bf16.safetensors"]:
        if dt == "BF16":
            b, e = header[name]["data_offsets"]
            u16 = np.frombuffer(raw[8 + n + b:8 + n + e], dtype="<u2")
            got = (u16.astype("<u4") << 16).view("<f4").reshape(shape)
            check(header[name]["dtype"] == "BF16" and np.array_equal(got, np.array(vals, np.float32).reshape(shape)),
                  f"{name} BF16{list(shape)}")
        else:
            got = f.get_tensor(name)
            check(np.array_equal(got, np.array(vals, dtype=npdt[dt]).reshape(shape)), f"{name} {dt}")
sys.exit(1 if failed else 0)
PY
expect_exit 0 python3 "$TMP/check.py" "$TMP/st"
sed 's/^/    /' "$TMP/out"
finish
