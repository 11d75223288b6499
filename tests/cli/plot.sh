# dsc plot: a short gpt-tiny run's metrics.jsonl drawn as an SVG that parses
# as XML and holds one point per step (train loss, lr) and per evaluation
# (validation loss); a missing, empty or garbled metrics file is an error
# naming the file and line; null values are left out with a note; the output
# is written atomically (a failed plot leaves an existing file alone).
source "$(dirname "$0")/lib/common.bash"
source "$(dirname "$0")/lib/corpus.bash"

expect_exit 0 "$DSC" plot --help && expect_grep '^usage: dsc plot RUN_DIR -o FILE.svg' "$TMP/out"
expect_exit 0 "$DSC" --help && expect_grep '^  plot ' "$TMP/out"
expect_exit 1 "$DSC" plot && expect_grep 'missing RUN_DIR' "$TMP/err"
expect_exit 1 "$DSC" plot "$TMP" && expect_grep 'missing -o FILE.svg' "$TMP/err"
expect_exit 1 "$DSC" plot "$TMP" -o x.svg --bogus && expect_grep "unknown option '--bogus'" "$TMP/err"

make_corpus "$TMP/corpus.txt"
expect_exit 0 "$DSC" data "$TMP/corpus.txt" -o "$TMP/c"
# the interpreter: no kernel compilation, the 12 steps take about a second
expect_exit 0 "$DSC" train "$SRC/examples/gpt-tiny.dsm" --data "$TMP/c" --batch 2 --seq 16 \
  --steps 12 --eval-every 4 --eval-batches 1 --backend interp --out "$TMP/run"
expect_exit 0 "$DSC" plot "$TMP/run" -o "$TMP/loss.svg" &&
  expect_grep 'loss.svg: 12 steps \(12 train-loss, 3 validation, 12 learning-rate points\)' "$TMP/out"

# check_svg FILE TRAIN VAL LR PIECES: XML with that many points per curve
# (the train loss in PIECES pieces: gaps where values were null), every
# point inside the plot area, a title naming the run, a legend, numbered ticks
check_svg() {
  python3 - "$@" <<'PY'
import sys, xml.etree.ElementTree as ET
path, want = sys.argv[1], [int(x) for x in sys.argv[2:5]]
ns = {"s": "http://www.w3.org/2000/svg"}
root = ET.parse(path).getroot()
assert root.tag == "{http://www.w3.org/2000/svg}svg", root.tag
pieces = {}
def points(id_):  # a path of "Mx,y Lx,y ...": an M starts a piece (after a gap)
    el = root.find(".//s:path[@id='%s']" % id_, ns)
    if el is None:
        return None
    cmds = el.get("d").split()
    assert all(c[0] in "ML" for c in cmds) and cmds[0][0] == "M", el.get("d")[:80]
    pieces[id_] = sum(c[0] == "M" for c in cmds)
    return [tuple(float(v) for v in c[1:].split(",")) for c in cmds]
got = [points(i) for i in ("train-loss", "val-loss", "lr")]
for name, g, w in zip(("train-loss", "val-loss", "lr"), got, want):
    n = len(g) if g is not None else 0
    assert n == w, "%s: %d points, want %d" % (name, n, w)
# the train loss breaks where a value is left out, nowhere else
want_pieces = int(sys.argv[5])
assert pieces["train-loss"] == want_pieces, (pieces, want_pieces)
assert all(pieces.get(k, 1) == 1 for k in ("val-loss", "lr")), pieces
area = root.find(".//s:clipPath/s:rect", ns)
x0, y0 = float(area.get("x")), float(area.get("y"))
x1, y1 = x0 + float(area.get("width")), y0 + float(area.get("height"))
for g in got:
    for x, y in g or []:
        assert x0 - 0.01 <= x <= x1 + 0.01 and y0 - 0.01 <= y <= y1 + 0.01, (x, y)
    # steps increase along each curve
    xs = [x for x, _ in g or []]
    assert xs == sorted(xs), "points not in step order"
texts = ["".join(t.itertext()) for t in root.iter("{http://www.w3.org/2000/svg}text")]
assert any("run" in t for t in texts), "no title naming the run"
legend = root.find(".//s:g[@id='legend']", ns)
assert legend is not None and "train loss" in "".join(legend.itertext())
for axis in ("x-ticks", "loss-ticks"):
    labels = ["".join(t.itertext()) for t in root.find(".//s:g[@id='%s']" % axis, ns).iter("{http://www.w3.org/2000/svg}text")]
    assert len(labels) >= 3 and all(float(l) == float(l) for l in labels), (axis, labels)
PY
}
check_svg "$TMP/loss.svg" 12 3 12 1 && pass || fail "the SVG of the run"

# A JSON-lines file (dsc train --log) is taken as it is; null values (a
# non-finite loss) are left out with a note; a title with XML's special
# characters stays well-formed.
head -n 5 "$TMP/run/metrics.jsonl" >"$TMP/five.jsonl"
sed -i '3s/"loss":[-0-9.e]*/"loss":null/' "$TMP/five.jsonl"
expect_exit 0 "$DSC" plot "$TMP/five.jsonl" -o "$TMP/five.svg" --title 'run <a & "b">' &&
  expect_grep 'five.jsonl: note: 1 non-finite value \(null\) left out' "$TMP/err" &&
  expect_grep '5 steps \(4 train-loss, 1 validation, 5 learning-rate points\)' "$TMP/out"
check_svg "$TMP/five.svg" 4 1 5 2 && pass || fail "the SVG with a null loss"

# errors: exit 1, the file (and line) named, an existing output left alone
cp "$TMP/loss.svg" "$TMP/keep.svg"
mkdir -p "$TMP/norun"
expect_exit 1 "$DSC" plot "$TMP/norun" -o "$TMP/keep.svg" && expect_grep 'norun: error: no metrics.jsonl in the run directory' "$TMP/err"
expect_exit 1 "$DSC" plot "$TMP/nothing" -o "$TMP/keep.svg" && expect_grep 'nothing: error: cannot open' "$TMP/err"
: >"$TMP/empty.jsonl"
expect_exit 1 "$DSC" plot "$TMP/empty.jsonl" -o "$TMP/keep.svg" && expect_grep 'empty.jsonl: error: no metrics in the file' "$TMP/err"
{ head -n 2 "$TMP/run/metrics.jsonl"; echo '{"step":3,"loss":2.5,"lr":'; } >"$TMP/cut.jsonl"
expect_exit 1 "$DSC" plot "$TMP/cut.jsonl" -o "$TMP/keep.svg" && expect_grep '^[^ ]*cut.jsonl:3: error: ' "$TMP/err"
printf '{"step":1,"loss":2}\nhello\n' >"$TMP/text.jsonl"
expect_exit 1 "$DSC" plot "$TMP/text.jsonl" -o "$TMP/keep.svg" && expect_grep 'text.jsonl:2: error: not a JSON object' "$TMP/err"
printf '{"loss":2}\n' >"$TMP/nostep.jsonl"
expect_exit 1 "$DSC" plot "$TMP/nostep.jsonl" -o "$TMP/keep.svg" && expect_grep 'nostep.jsonl:1: error: no "step"' "$TMP/err"
printf '{"step":1,"loss":"x"}\n' >"$TMP/str.jsonl"
expect_exit 1 "$DSC" plot "$TMP/str.jsonl" -o "$TMP/keep.svg" && expect_grep 'str.jsonl:1: error: a value that is not a number' "$TMP/err"
printf '{"step":1,"loss":2}\0\n' >"$TMP/bin.jsonl"
expect_exit 1 "$DSC" plot "$TMP/bin.jsonl" -o "$TMP/keep.svg" && expect_grep 'bin.jsonl: error: a binary file' "$TMP/err"
cmp -s "$TMP/loss.svg" "$TMP/keep.svg" && pass || fail "a failed plot changed the existing output"
# an output that cannot be written: the error names it, nothing is left behind
expect_exit 1 "$DSC" plot "$TMP/run" -o "$TMP/nodir/x.svg" && expect_grep 'nodir/x.svg: error: ' "$TMP/err"
[ -z "$(find "$TMP" -name '*.tmp-*')" ] && pass || fail "a temporary file was left behind"
finish
