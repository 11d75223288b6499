# Host-side work (passes/offload_host.c, docs/memory.md "Offload"): the
# optimizer step on the host (--offload-optimizer host: gradients copied out
# with to_host during the backward, the update in the host work arena,
# params back with to_device) and activation offload
# (--checkpoint-activations offload) train the same loss curve as without
# (1e-5 relative, f32) on the interp and cpu backends, at world 1 and with
# --ranks 2 at ZeRO stage 2; dsc dump shows the copies and the host
# placement; dsc plan's device peak drops and its host figure rises by the
# host work arena; the trainer's planned memory is dsc plan's peak plus its
# host bytes, and the measured RSS follows it as in tests/cli/plan.sh.
source "$(dirname "$0")/lib/common.bash"
source "$(dirname "$0")/lib/corpus.bash"
MODEL="$SRC/examples/gpt-tiny.dsm"
export DSC_CACHE_DIR="$TMP/kernel-cache"
make_corpus "$TMP/corpus.txt"
expect_exit 0 "$DSC" data "$TMP/corpus.txt" -o "$TMP/c"
COMMON=(--data "$TMP/c" --batch 2 --seq 32 --steps 4 --eval-every 0 --quiet)

losses() { grep -oE '"loss":[^,]*' "$TMP/o-$1/metrics.jsonl" | cut -d: -f2; }
same_curve() { # A B: every loss within 1e-5 relative, 4 of each
  local a b
  a=$(losses "$1") b=$(losses "$2")
  [ "$(wc -l <<<"$a")" -eq 4 ] && [ "$(wc -l <<<"$b")" -eq 4 ] || { fail "$1/$2: not 4 losses"; return; }
  paste <(echo "$a") <(echo "$b") | awk -v n="$1 vs $2" '
    { d = $1 - $2; if (d < 0) d = -d; if (d > 1e-5 * ($1 < 0 ? -$1 : $1)) { print "FAIL: " n ": " $1 " vs " $2; bad = 1 } }
    END { exit bad }' && pass || fail "loss curves differ: $1 vs $2"
}
train() { # NAME ARGS...
  local name=$1
  shift
  expect_exit 0 "$DSC" train "$MODEL" "${COMMON[@]}" --out "$TMP/o-$name" "$@"
}
jnum() { grep -oE "\"$1\": [0-9]+" "$2" | head -1 | grep -oE '[0-9]+$'; }

for be in interp cpu; do
  train "$be-none" --backend "$be"
  train "$be-host" --backend "$be" --offload-optimizer host
  train "$be-act" --backend "$be" --checkpoint-activations offload
  train "$be-both" --backend "$be" --checkpoint-activations offload --offload-optimizer host
  train "$be-r2" --backend "$be" --ranks 2 --zero-stage 2
  train "$be-r2host" --backend "$be" --ranks 2 --zero-stage 2 --offload-optimizer host
  train "$be-r2act" --backend "$be" --ranks 2 --zero-stage 2 --checkpoint-activations offload
  for m in host act both; do same_curve "$be-none" "$be-$m"; done
  for m in r2host r2act; do same_curve "$be-r2" "$be-$m"; done
done
# the host step computes the same update: byte-identical weights on cpu
expect_exit 0 "$DSC" export "$TMP/o-cpu-none" -o "$TMP/w-none.safetensors"
expect_exit 0 "$DSC" export "$TMP/o-cpu-host" -o "$TMP/w-host.safetensors"
cmp -s "$TMP/w-none.safetensors" "$TMP/w-host.safetensors" && pass ||
  fail "cpu: weights after the host optimizer step differ from the device step"

# ---- the IR: copies and placement
D=(--batch 2 --seq 32)
expect_exit 0 "$DSC" dump "$MODEL" "${D[@]}" --after offload --offload-optimizer host
cp "$TMP/out" "$TMP/host.dsir"
# each gradient goes out right after it is final: 28 params, 28 gradients
# and 28 params copied to the host, 28 updated params back
[ "$(grep -cE '= to_host\(' "$TMP/host.dsir")" -ge 56 ] && pass || fail "host step: too few to_host"
[ "$(grep -cE '= to_device\(' "$TMP/host.dsir")" -eq 28 ] && pass || fail "host step: not 28 to_device"
expect_grep '= to_host\(%lr\) : f32\[\] host$' "$TMP/host.dsir"
expect_grep '= sqrt\(%[0-9]+\) : f32\[64,64\] host$' "$TMP/host.dsir"
expect_grep 'assign\(%[0-9]+\) \{name = "opt.m.wte"\}' "$TMP/host.dsir"
# every device param's assign reads a to_device; states (host tier) do not
bad=$(awk '/= to_device\(/ { td[$1] = 1 } /= assign\(/ && !/"opt\./ {
  v = $0; sub(/.*assign\(/, "", v); sub(/\).*/, "", v); if (!td[v]) n++ } END { print n + 0 }' "$TMP/host.dsir")
[ "$bad" -eq 0 ] && pass || fail "host step: $bad param assigns read no to_device"
# the text form with placements round-trips byte for byte
expect_exit 0 "$DSC" dump "$TMP/host.dsir" && cmp -s "$TMP/out" "$TMP/host.dsir" && pass ||
  fail "the printed host placement does not round-trip"
# the gradient's copy follows the gradient directly
awk '/= to_host\(/ { v = $0; sub(/.*to_host\(/, "", v); sub(/\).*/, "", v); if (prev == v) hit++ }
  { prev = $1 } END { exit !(hit >= 20) }' "$TMP/host.dsir" && pass ||
  fail "host step: the gradients' to_host do not follow the gradients"
expect_exit 0 "$DSC" dump "$MODEL" "${D[@]}" --after optimizer --checkpoint-activations offload
cp "$TMP/out" "$TMP/act.dsir"
n=$(grep -cE '= to_host\(' "$TMP/act.dsir")
[ "$n" -ge 15 ] && [ "$(grep -cE '= to_device\(' "$TMP/act.dsir")" -eq "$n" ] && pass ||
  fail "activation offload: $n to_host, not as many to_device"
expect_exit 1 "$DSC" dump "$MODEL" "${D[@]}" --checkpoint-activations offloaded
expect_grep 'blocks:K or offload' "$TMP/err"

# ---- the plan: device peak down, host up by the host work arena
plan() { # OUT ARGS...
  local o=$1
  shift
  expect_exit 0 "$DSC" plan "$MODEL" --zero-stage 0 --json "$@" && cp "$TMP/out" "$TMP/$o.json"
}
plan p0 --batch 1 --seq 8
plan p-tier --batch 1 --seq 8 --offload-optimizer disk --offload-dir "$TMP"
plan p-host --batch 1 --seq 8 --offload-optimizer host
peak0=$(jnum peak "$TMP/p0.json") opt0=$(jnum optimizer "$TMP/p0.json")
peakh=$(jnum peak "$TMP/p-host.json") hw=$(jnum host_work "$TMP/p-host.json")
host=$(jnum host "$TMP/p-host.json")
echo "host step (batch 1 x 8): device peak $peak0 -> $peakh, host $host (work $hw)"
# more than the states moved: gradients and the update's temporaries too
[ "$peakh" -lt $((peak0 - opt0)) ] && pass || fail "host step: peak $peakh not below $peak0 - $opt0"
# host = the states' host arena (as a slot of the disk tier's file: 4 KiB +
# 2 slots; the disk tier streams, it has no staging) + the host work arena
tier=$((($(jnum disk "$TMP/p-tier.json") - 4096) / 2))
[ "$hw" -gt 0 ] && [ "$host" -eq $((tier + hw)) ] && pass ||
  fail "host step: host $host is not the states' $tier + host work $hw"
[ "$(jnum host_work "$TMP/p-tier.json")" -eq 0 ] && pass || fail "disk tier: host work without a host step"
[ "$(jnum grads_held "$TMP/p-host.json")" -lt "$(jnum grads_held "$TMP/p0.json")" ] && pass ||
  fail "host step: the device still holds every gradient"
plan a0 --batch 8 --seq 64
plan a-off --batch 8 --seq 64 --checkpoint-activations offload
peak0=$(jnum peak "$TMP/a0.json") peaka=$(jnum peak "$TMP/a-off.json")
act0=$(jnum activations "$TMP/a0.json") acta=$(jnum activations "$TMP/a-off.json")
hw=$(jnum host_work "$TMP/a-off.json")
echo "activation offload (batch 8 x 64): device peak $peak0 -> $peaka, activations $act0 -> $acta, host work $hw"
[ "$peaka" -lt $((peak0 * 8 / 10)) ] && [ "$acta" -lt $((act0 / 10)) ] && pass ||
  fail "activation offload: peak $peak0 -> $peaka, activations $act0 -> $acta"
[ "$hw" -gt $((act0 / 2)) ] && [ "$(jnum host "$TMP/a-off.json")" -eq "$hw" ] && pass ||
  fail "activation offload: host work $hw"

# ---- --profile: the host-placed kernels (the offloaded AdamW) as a stream
expect_exit 0 "$DSC" train "$MODEL" --data "$TMP/c" --batch 8 --threads 2 --steps 2 --eval-every 0 \
  --offload-optimizer host --profile
n_params=$(sed -n 's/^model .*: \([0-9]*\) parameters.*/\1/p' "$TMP/out")
line=$(grep '^  (host kernels)' "$TMP/out")
echo "profile: $line"
# "(host kernels)  N  X ms  P%  M MB per run, G GB/s": G = M / X, and M is
# at least AdamW's 28 bytes (p g m v in, p m v out) per f32 param
awk -v n="$n_params" '{ms = $4; mb = $7; gb = $11
  exit !($3 > 0 && ms > 0 && mb >= 28 * n / 1e6 && (gb - mb / ms) ^ 2 <= (0.02 * gb + 0.01) ^ 2)}' \
  <<<"$line" && pass || fail "--profile's host kernel line: '$line' (params $n_params)"
expect_exit 0 "$DSC" train "$MODEL" --data "$TMP/c" --batch 8 --threads 2 --steps 2 --eval-every 0 \
  --profile --quiet
grep -q '(host kernels)' "$TMP/out" && fail "--profile without offload shows host kernels" || pass

# ---- measured against planned (cpu backend), as tests/cli/plan.sh
mib() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1048576 }'; }
for v in "--offload-optimizer host" "--checkpoint-activations offload"; do
  args=(--batch 8 --threads 2 $v)
  "$DSC" train "$MODEL" --data "$TMP/c" "${args[@]}" --steps 1 --quiet >/dev/null 2>&1
  expect_exit 0 "$DSC" train "$MODEL" --data "$TMP/c" "${args[@]}" --steps 2 --eval-every 0 || continue
  line=$(grep '^memory: planned' "$TMP/out")
  [ -n "$line" ] && pass || { fail "$v: no memory line"; continue; }
  echo "$v: $line"
  planned=$(sed -E 's/^memory: planned ([0-9.]+) MiB.*/\1/' <<<"$line")
  measured=$(sed -E 's/.*measured ([0-9.]+) MiB.*/\1/' <<<"$line")
  expect_exit 0 "$DSC" plan "$MODEL" "${args[@]}" --zero-stage 0 --json
  want=$(mib $(($(jnum peak "$TMP/out") + $(jnum host "$TMP/out"))))
  [ "$want" = "$planned" ] && pass || fail "$v: trainer planned $planned MiB, dsc plan peak + host $want MiB"
  if grep -q __asan_init "$DSC"; then
    echo "sanitizer build: skipped the RSS tolerance check"
    continue
  fi
  awk -v p="$planned" -v m="$measured" 'BEGIN { exit !(m >= p - 1 && m <= 1.10 * p + 16) }' && pass ||
    fail "$v: measured $measured MiB is not within [planned - 1, 1.10 x planned + 16] of $planned MiB"
done
finish
