# dsc train --resume: exact continuation, corrupt and mismatched checkpoints,
# and a checkpoint on SIGINT.
source "$(dirname "$0")/lib/common.bash"
source "$(dirname "$0")/lib/corpus.bash"
MODEL="$SRC/examples/gpt-tiny.dsm"
make_corpus "$TMP/corpus.txt"
expect_exit 0 "$DSC" data "$TMP/corpus.txt" -o "$TMP/c"
RUN=(--data "$TMP/c" --batch 4 --seq 32 --lr 3e-3 --quiet)
N=6

# 1. 2N steps straight == N steps, stop, resume to 2N: byte-identical files.
expect_exit 0 "$DSC" train "$MODEL" "${RUN[@]}" --steps $((2 * N)) --out "$TMP/a"
expect_exit 0 "$DSC" train "$MODEL" "${RUN[@]}" --steps $((2 * N)) --stop-at $N --out "$TMP/b"
[ "$(readlink "$TMP/b/latest")" = step-00000$N ] && pass || fail "--stop-at: latest -> $(readlink "$TMP/b/latest")"
expect_exit 0 "$DSC" train --resume "$TMP/b" --steps $((2 * N)) --quiet
for f in model optimizer; do
  cmp "$TMP/a/latest/$f.safetensors" "$TMP/b/latest/$f.safetensors" && pass || fail "resumed $f.safetensors differs"
done
# the resumed run's log continues the first one: same steps and losses as straight
cut_log() { sed -E 's/,"tokens_per_s".*//' "$1"; }
[ "$(cut_log "$TMP/a/metrics.jsonl")" = "$(cut_log "$TMP/b/metrics.jsonl")" ] && pass || fail "metrics.jsonl of the resumed run differs"
# resuming from a step directory into a new --out gives the same again
expect_exit 0 "$DSC" train --resume "$TMP/b/step-00000$N" --steps $((2 * N)) --out "$TMP/c2" --quiet
cmp "$TMP/a/latest/model.safetensors" "$TMP/c2/latest/model.safetensors" && pass || fail "resume into --out differs"
# a checkpoint at the end of the run: nothing left to do is an error that
# says so, and nothing changes
expect_exit 1 "$DSC" train --resume "$TMP/a" --steps $((2 * N)) --quiet &&
  expect_grep "already at step $((2 * N)); give --steps" "$TMP/err"
cmp "$TMP/a/latest/model.safetensors" "$TMP/b/latest/model.safetensors" && pass || fail "a finished run changed"

# 2. mismatches: another batch, another model
expect_exit 1 "$DSC" train --resume "$TMP/a" --batch 8 && expect_grep 'trained with batch = 4, not 8' "$TMP/err"
mkdir -p "$TMP/m/lib" && cp "$SRC/examples/lib/layers.dsm" "$TMP/m/lib/"
sed 's/d = 64/d = 48/' "$MODEL" >"$TMP/m/wide.dsm"
expect_exit 1 "$DSC" train --resume "$TMP/a" "$TMP/m/wide.dsm" --steps 20
expect_grep "model.safetensors: error: tensor 'wte': expected f32\[256,48\], found f32\[256,64\]" "$TMP/err"

# 3. a corrupt checkpoint: clear error, exit 1, earlier checkpoints untouched
expect_exit 0 "$DSC" train "$MODEL" "${RUN[@]}" --steps 4 --save-every 2 --out "$TMP/k"
sum_before=$(cd "$TMP/k" && md5sum step-000002/* metrics.jsonl)
truncate -s 100 "$TMP/k/step-000004/model.safetensors"
expect_exit 1 "$DSC" train --resume "$TMP/k" --steps 8
expect_grep 'k/step-000004/model.safetensors: error: ' "$TMP/err"
[ "$(cd "$TMP/k" && md5sum step-000002/* metrics.jsonl)" = "$sum_before" ] && pass || fail "a failed resume touched step-000002 or the log"
[ "$(readlink "$TMP/k/latest")" = step-000004 ] && [ "$(ls "$TMP/k" | wc -l)" -eq 4 ] && pass || fail "a failed resume changed $TMP/k: $(ls "$TMP/k")"
printf '{"format": "dsc-checkpoint"' >"$TMP/k/step-000002/state.json"
expect_exit 1 "$DSC" train --resume "$TMP/k/step-000002" && expect_grep 'step-000002/state.json: error: malformed checkpoint state' "$TMP/err"
expect_exit 1 "$DSC" train --resume "$TMP/nothing" && expect_grep 'nothing: error: cannot open checkpoint' "$TMP/err"

# 4. SIGINT after the first step: the current step finishes, a checkpoint is
# written, exit 130; the run then resumes from it.
"$DSC" train "$MODEL" "${RUN[@]}" --steps 100000 --out "$TMP/s" --log "$TMP/s.jsonl" >"$TMP/s.out" 2>"$TMP/s.err" &
pid=$!
for _ in $(seq 600); do [ -s "$TMP/s.jsonl" ] && break; sleep 0.1; done
kill -INT $pid
wait $pid
rc=$?
[ $rc -eq 130 ] && pass || { fail "SIGINT: exit $rc"; cat "$TMP/s.err"; }
expect_grep 'stopped by SIGINT at step [0-9]+; checkpoint .*/s/step-0' "$TMP/s.err"
done_steps=$(wc -l <"$TMP/s.jsonl")
[ "$(readlink "$TMP/s/latest")" = "$(printf 'step-%06d' "$done_steps")" ] && pass || fail "SIGINT: latest -> $(readlink "$TMP/s/latest"), $done_steps steps logged"
expect_exit 0 "$DSC" train --resume "$TMP/s" --steps $((done_steps + 1)) --quiet
[ "$(readlink "$TMP/s/latest")" = "$(printf 'step-%06d' $((done_steps + 1)))" ] && pass || fail "resume after SIGINT"
# 4. a fresh run never mixes with another run's checkpoints
expect_exit 1 "$DSC" train "$MODEL" "${RUN[@]}" --steps 2 --out "$TMP/a" &&
  expect_grep 'already holds checkpoints .* --resume' "$TMP/err"
cmp "$TMP/a/latest/model.safetensors" "$TMP/b/latest/model.safetensors" && pass || fail "a refused run changed $TMP/a"

# 5. the precision is part of the checkpoint: a bf16 run resumes in bf16,
# exactly, and refuses another precision
expect_exit 0 "$DSC" train "$MODEL" "${RUN[@]}" --precision bf16 --steps 4 --out "$TMP/p1"
expect_exit 0 "$DSC" train "$MODEL" "${RUN[@]}" --precision bf16 --steps 4 --stop-at 2 --out "$TMP/p2"
expect_exit 1 "$DSC" train --resume "$TMP/p2" --precision f32 --quiet &&
  expect_grep 'trained with precision bf16, not f32' "$TMP/err"
expect_exit 0 "$DSC" train --resume "$TMP/p2" --quiet
for f in model optimizer; do
  cmp "$TMP/p1/latest/$f.safetensors" "$TMP/p2/latest/$f.safetensors" && pass || fail "bf16 resume: $f differs"
done
# with master weights (the default) the checkpoint holds bf16 params and
# f32 opt.master.* (resume keeps them, and refuses autocast's f32 params);
# a run with --master-weights false resumes as one
expect_grep '"master_weights":[[:space:]]*"true"' "$TMP/p2/latest/state.json"
expect_exit 1 "$DSC" train --resume "$TMP/p2" --master-weights false --quiet &&
  expect_grep 'trained with master_weights true, not false' "$TMP/err"
expect_exit 0 "$DSC" train "$MODEL" "${RUN[@]}" --precision bf16 --master-weights false --steps 4 \
  --out "$TMP/q1"
expect_exit 0 "$DSC" train "$MODEL" "${RUN[@]}" --precision bf16 --master-weights false --steps 4 \
  --stop-at 2 --out "$TMP/q2"
expect_exit 0 "$DSC" train --resume "$TMP/q2" --quiet
for f in model optimizer; do
  cmp "$TMP/q1/latest/$f.safetensors" "$TMP/q2/latest/$f.safetensors" && pass ||
    fail "bf16 autocast resume: $f differs"
done

# 6. a sequence longer than the model's context is refused before anything runs
expect_exit 1 "$DSC" train "$MODEL" --data "$TMP/c" --batch 2 --seq 65 --steps 1 --out "$TMP/long" &&
  expect_grep "sequence length 65 is longer than the model's context of 64" "$TMP/err"
[ ! -e "$TMP/long" ] && pass || fail "a refused run created its --out"
finish
