# dsc train --checkpoint-activations selective | block | blocks:2 (pass
# "remat"): the backward recomputes forward values instead of keeping them.
# The values are the same ops on the same inputs, so the interpreter's loss
# curve is bit for bit the one without it (the cpu backend's within 1e-6: its
# fusion groups differ); the memory plan's activations (selective) and peak
# (block) drop; the train section's keys and bad values.
source "$(dirname "$0")/lib/common.bash"
source "$(dirname "$0")/lib/corpus.bash"
MODEL="$SRC/examples/gpt-tiny.dsm"
export DSC_CACHE_DIR="$TMP/kernel-cache"

make_corpus "$TMP/corpus.txt"
expect_exit 0 "$DSC" data "$TMP/corpus.txt" -o "$TMP/c"
expect_exit 1 "$DSC" train "$MODEL" --data "$TMP/c" --checkpoint-activations all &&
  expect_grep "needs none, selective, block, blocks:K or offload" "$TMP/err"
expect_exit 0 "$DSC" train --help && expect_grep '--checkpoint-activations P' "$TMP/out"
RUN=(--data "$TMP/c" --batch 2 --seq 16 --steps 6 --lr 3e-3 --quiet)
backends=(interp)
"$DSC" run "$MODEL" --backend cpu --quiet >/dev/null 2>&1 && backends+=(cpu)
for b in "${backends[@]}"; do
  for c in none selective block blocks:2; do
    expect_exit 0 "$DSC" train "$MODEL" "${RUN[@]}" --backend "$b" --checkpoint-activations $c \
      --log "$TMP/$b-${c/:/}.jsonl"
  done
  for c in selective block blocks2; do
  python3 - "$TMP/$b-none.jsonl" "$TMP/$b-$c.jsonl" "$b" <<'PY' && pass || fail "$b: remat $c changed the curve"
import json, sys
a, b = [[json.loads(l) for l in open(p)] for p in sys.argv[1:3]]
assert len(a) == len(b) == 6
exact = sys.argv[3] == "interp"
for x, y in zip(a, b):
    for k in ("loss", "grad_norm"):
        assert (x[k] == y[k]) if exact else abs(x[k] - y[k]) <= 1e-6 * abs(x[k]), (k, x, y)
PY
  done
done

# bf16 compute on the cpu backend (the fuse pass's groups over the clones)
if [ "${#backends[@]}" -gt 1 ]; then
  for c in none selective; do
    expect_exit 0 "$DSC" train "$MODEL" "${RUN[@]}" --backend cpu --precision bf16 \
      --checkpoint-activations $c --log "$TMP/bf16-$c.jsonl"
  done
  python3 - "$TMP/bf16-none.jsonl" "$TMP/bf16-selective.jsonl" <<'PY' && pass || fail "bf16: selective remat changed the curve"
import json, sys
a, b = [[json.loads(l) for l in open(p)] for p in sys.argv[1:3]]
assert len(a) == len(b) == 6
for x, y in zip(a, b):
    assert abs(x["loss"] - y["loss"]) <= 1e-2 * abs(x["loss"]), (x, y)
PY
fi
expect_exit 0 "$DSC" plan "$SRC/examples/gpt2.dsm" --world 8 --zero-stage 3 --batch 1 --seq 64 \
  --grad-accum 1 --checkpoint-activations selective --json
# the pass clones norms for the backward: more layernorms after it
n0=$("$DSC" dump "$MODEL" --after autodiff | grep -c '= layernorm(')
n1=$("$DSC" dump "$MODEL" --after remat --checkpoint-activations selective | grep -c '= layernorm(')
[ "$n1" -gt "$n0" ] && pass || fail "dump --after remat: $n1 layernorms, not more than $n0"
# the plan's activations drop (batch 8 x seq 64)
act() { "$DSC" plan "$MODEL" --zero-stage 0 --bytes --checkpoint-activations "$1" |
  awk '/^activations/ { print $2 }'; }
a0=$(act none) a1=$(act selective)
[ "$a1" -lt "$a0" ] && pass || fail "plan: activations $a1 with selective, not below $a0"
peak() { "$DSC" plan "$SRC/examples/gpt2.dsm" --zero-stage 0 --batch 4 --seq 1024 --grad-accum 1 \
  --precision f32 --bytes --checkpoint-activations "$1" | awk '/^peak/ { print $2 }'; }
p0=$(peak none) p1=$(peak block)
[ "$p1" -lt "$p0" ] && pass || fail "plan: GPT-2's peak $p1 with block, not below $p0"
# block recomputes matmuls: more of them after the pass
m0=$("$DSC" dump "$MODEL" --after autodiff | grep -c '= matmul(')
m1=$("$DSC" dump "$MODEL" --after remat --checkpoint-activations block | grep -c '= matmul(')
[ "$m1" -gt "$m0" ] && pass || fail "block: $m1 matmuls after remat, not more than $m0"
# ... and they survive cse, which must not hand the backward the forward's
# matmul results back (that kept them alive: blocks planned like selective)
c0=$("$DSC" dump "$MODEL" --after cse | grep -c '= matmul(')
c1=$("$DSC" dump "$MODEL" --after cse --checkpoint-activations block | grep -c '= matmul(')
[ "$c1" -gt "$c0" ] && pass || fail "block: $c1 matmuls after cse, not more than $c0"
ps=$(peak selective)
[ "$p1" -lt "$ps" ] && pass || fail "plan: GPT-2's peak $p1 with block, not below selective's $ps"
# the train section's key (the copy imports lib/ next to it)
cp -r "$SRC/examples/lib" "$TMP/lib"
sed 's/^train {/train {\n  checkpoint_activations = selective/' "$MODEL" >"$TMP/m.dsm"
grep -q 'checkpoint_activations = selective' "$TMP/m.dsm" || fail "no train section to edit"
expect_exit 0 "$DSC" train "$TMP/m.dsm" "${RUN[@]}" --backend interp --log "$TMP/key.jsonl"
cmp -s <(cut -d, -f1-3 "$TMP/key.jsonl") <(cut -d, -f1-3 "$TMP/interp-selective.jsonl") && pass ||
  fail "train section key: a different curve"
sed 's/^train {/train {\n  checkpoint_activations = blocks\n  checkpoint_every = 2/' "$MODEL" >"$TMP/k.dsm"
expect_exit 0 "$DSC" train "$TMP/k.dsm" "${RUN[@]}" --backend interp --log "$TMP/k2.jsonl"
cmp -s <(cut -d, -f1-3 "$TMP/k2.jsonl") <(cut -d, -f1-3 "$TMP/interp-blocks2.jsonl") && pass ||
  fail "checkpoint_every key: a different curve"
sed 's/^train {/train {\n  checkpoint_activations = every/' "$MODEL" >"$TMP/bad.dsm"
expect_exit 1 "$DSC" train "$TMP/bad.dsm" "${RUN[@]}" &&
  expect_grep "checkpoint_activations.*none, selective or blocks" "$TMP/err"
finish
