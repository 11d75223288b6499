# SIGINT and SIGTERM are honoured while loading and compiling, not only
# between training steps: the command stops within seconds with 130 / 143,
# says what it was doing, and leaves files as they were.
source "$(dirname "$0")/lib/common.bash"
source "$(dirname "$0")/lib/corpus.bash"
make_corpus "$TMP/corpus.txt"
expect_exit 0 "$DSC" data "$TMP/corpus.txt" -o "$TMP/c"
BOUND=${DSC_SIGNAL_BOUND:-5} # seconds from the signal to the exit (CI machines are loaded)

# stop_after SIG DELAY LOG CMD...: starts CMD, sends SIG after DELAY seconds,
# waits at most BOUND seconds for it; sets rc (KILLed: 137) and took (seconds).
stop_after() {
  local sig=$1 delay=$2 log=$3
  shift 3
  "$@" >"$log.out" 2>"$log.err" &
  local pid=$!
  # the signal once dsc catches SIGINT and SIGTERM (SigCgt bits 2 and 15;
  # a sanitizer build takes a while to get there), then DELAY seconds on
  for _ in $(seq 600); do
    local cgt=$(awk '/^SigCgt:/ {print $2}' /proc/$pid/status 2>/dev/null)
    [ -n "$cgt" ] && [ $(( (0x$cgt >> 1) & (0x$cgt >> 14) & 1 )) -eq 1 ] && break
    sleep 0.05
  done
  sleep "$delay"
  kill -"$sig" $pid
  local t0=$(date +%s%N)
  for _ in $(seq $((BOUND * 20))); do kill -0 $pid 2>/dev/null || break; sleep 0.05; done
  kill -0 $pid 2>/dev/null && kill -KILL $pid
  wait $pid
  rc=$?
  took=$(( ($(date +%s%N) - t0) / 1000000 ))
}

# 1. dsc train of GPT-2 with its own train section (seconds of initialising
# 124M params and compiling kernels): SIGINT after 1 s ends it with 130,
# nothing written.
stop_after INT 1 "$TMP/t" "$DSC" train "$SRC/examples/gpt2.dsm" --data "$TMP/c" --steps 1 --out "$TMP/run"
[ $rc -eq 130 ] && pass || { fail "train, SIGINT while compiling: exit $rc after ${took} ms, expected 130"; cat "$TMP/t.err"; }
expect_grep 'error: interrupted while ' "$TMP/t.err"
[ ! -e "$TMP/run" ] && pass || fail "an interrupted train created $TMP/run: $(ls "$TMP/run")"
echo "train SIGINT: exit $rc ${took} ms after the signal"

# 2. dsc plan of LLaMA-70B (80 layers through every pass: seconds): SIGTERM -> 143.
stop_after TERM 1 "$TMP/p" "$DSC" plan "$SRC/examples/llama-70b.dsm" --world 64
[ $rc -eq 143 ] && pass || { fail "plan, SIGTERM: exit $rc after ${took} ms, expected 143"; cat "$TMP/p.err"; }
expect_grep 'error: interrupted while ' "$TMP/p.err"
echo "plan SIGTERM: exit $rc ${took} ms after the signal"

# 3. dsc compile of LLaMA-70B (its passes and 6k kernels compiled cold:
# seconds): SIGINT -> 130 and no .dsx.
DSC_CACHE_DIR=off stop_after INT 1 "$TMP/k" "$DSC" compile "$SRC/examples/llama-70b.dsm" -o "$TMP/gpt2.dsx"
[ $rc -eq 130 ] && pass || { fail "compile, SIGINT: exit $rc after ${took} ms, expected 130"; cat "$TMP/k.err"; }
[ ! -e "$TMP/gpt2.dsx" ] && pass || fail "an interrupted compile wrote $TMP/gpt2.dsx"

# 4. a resume from a checkpoint whose model file holds 50k small tensors
# (loading and checking it took 12-21 s) that names GPT-2 as its model:
# SIGINT lands in the load or the compile; either way 130, files untouched.
expect_exit 0 "$DSC" train "$SRC/examples/gpt-tiny.dsm" --data "$TMP/c" --batch 2 --seq 16 --steps 1 --out "$TMP/ck" --quiet
python3 - "$TMP/ck/latest" "$SRC/examples/gpt2.dsm" <<'EOF'
import json, struct, sys
d, model = sys.argv[1], sys.argv[2]
n = 50000
hdr = {f"layer{i:05d}.w": {"dtype": "F32", "shape": [1], "data_offsets": [4 * i, 4 * i + 4]} for i in range(n)}
h = json.dumps(hdr).encode()
h += b" " * (-len(h) % 8)
with open(f"{d}/model.safetensors", "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h + b"\0" * (4 * n))
s = json.load(open(f"{d}/state.json"))
s["extra"]["model"] = model
for k in ("batch", "seq", "grad_accum"):  # GPT-2's own train section: a long compile
    s["extra"].pop(k, None)
json.dump(s, open(f"{d}/state.json", "w"))
EOF
sum_before=$(cd "$TMP/ck" && ls -l --time-style=+%s . latest/ && md5sum latest/*)
stop_after INT 1 "$TMP/r" "$DSC" train --resume "$TMP/ck" --steps 5
[ $rc -eq 130 ] && pass || { fail "resume, SIGINT: exit $rc after ${took} ms, expected 130"; cat "$TMP/r.err"; }
expect_grep 'error: interrupted while ' "$TMP/r.err"
sum_after=$(cd "$TMP/ck" && ls -l --time-style=+%s . latest/ && md5sum latest/*)
[ "$sum_after" = "$sum_before" ] && pass || { fail "an interrupted resume changed the checkpoint directory"; diff <(echo "$sum_before") <(echo "$sum_after"); }
echo "resume SIGINT: exit $rc ${took} ms after the signal"

# 5. in-process ranks inherit the interrupt: --ranks 2 while compiling.
stop_after TERM 1 "$TMP/n" "$DSC" train "$SRC/examples/gpt2.dsm" --data "$TMP/c" --steps 1 --ranks 2
[ $rc -eq 143 ] && pass || { fail "--ranks 2, SIGTERM while compiling: exit $rc after ${took} ms, expected 143"; cat "$TMP/n.err"; }
expect_grep 'interrupted while ' "$TMP/n.err"
finish
