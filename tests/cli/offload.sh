# Offload (passes/offload.c, docs/memory.md "Offload"): optimizer states on
# the host and disk tiers, and param shards (stage 3, 2 ranks) on both, train
# the same loss curve as without (1e-5 relative, f32) and export the same
# weights, on the interp and cpu backends; a resumed offloaded run continues
# the curve; dsc plan's device peak drops by exactly the offloaded bytes (host),
# the streamed disk tier (passes/offload_disk.c) plans no host bytes and a
# peak below the old whole staging's with the RSS following, reads start
# ahead of their use in `dsc dump --after schedule`, the disk file has the
# planned size and the trainer's plan equals dsc plan's;
# bad flags, a missing or unusable --offload-dir and a full disk end with a
# clear message and exit 1 (a full disk mid-step leaves the file's active
# slot), and the last checkpoint stays loadable.
source "$(dirname "$0")/lib/common.bash"
source "$(dirname "$0")/lib/corpus.bash"
MODEL="$SRC/examples/gpt-tiny.dsm"
export DSC_CACHE_DIR="$TMP/kernel-cache"
make_corpus "$TMP/corpus.txt"
expect_exit 0 "$DSC" data "$TMP/corpus.txt" -o "$TMP/c"
COMMON=(--data "$TMP/c" --batch 2 --seq 32 --steps 4 --eval-every 0 --quiet)
mkdir -p "$TMP/od"

# losses NAME: the run's losses, one a line (metrics.jsonl, full precision)
losses() { grep -oE '"loss":[^,]*' "$TMP/o-$1/metrics.jsonl" | cut -d: -f2; }
# same_curve A B: every loss within 1e-5 relative, and as many
same_curve() {
  local a b
  a=$(losses "$1") b=$(losses "$2")
  [ "$(wc -l <<<"$a")" -eq 4 ] && [ "$(wc -l <<<"$b")" -eq 4 ] || { fail "$1/$2: not 4 losses"; return; }
  paste <(echo "$a") <(echo "$b") | awk -v n="$1 vs $2" '
    { d = $1 - $2; if (d < 0) d = -d; if (d > 1e-5 * ($1 < 0 ? -$1 : $1)) { print "FAIL: " n ": " $1 " vs " $2; bad = 1 } }
    END { exit bad }' && pass || fail "loss curves differ: $1 vs $2"
}
train() { # NAME ARGS...: trains into $TMP/o-NAME
  local name=$1
  shift
  expect_exit 0 "$DSC" train "$MODEL" "${COMMON[@]}" --out "$TMP/o-$name" "$@"
}
exported() { # NAME: export the final weights
  expect_exit 0 "$DSC" export "$TMP/o-$1" -o "$TMP/w-$1.safetensors"
}

for be in interp cpu; do
  train "$be-none" --backend "$be"
  train "$be-host" --backend "$be" --offload-optimizer host
  train "$be-disk" --backend "$be" --offload-optimizer disk --offload-dir "$TMP/od"
  # DeepSpeed's names for the tiers
  train "$be-nvme" --backend "$be" --offload-optimizer nvme --offload-dir "$TMP/od"
  train "$be-r2" --backend "$be" --ranks 2 --zero-stage 3
  train "$be-r2host" --backend "$be" --ranks 2 --zero-stage 3 --offload-param cpu
  train "$be-r2disk" --backend "$be" --ranks 2 --zero-stage 3 --offload-param disk \
    --offload-optimizer disk --offload-dir "$TMP/od"
  # the disk tier streamed with no prefetch (each read right before its use)
  # on one IO thread: another schedule, the same numbers
  train "$be-disk0" --backend "$be" --offload-optimizer disk --offload-dir "$TMP/od" \
    --offload-prefetch-bytes 0 --offload-io-threads 1
  exported "$be-none" && exported "$be-r2"
  for m in host disk nvme disk0; do
    same_curve "$be-none" "$be-$m"
    exported "$be-$m" && cmp -s "$TMP/w-$be-none.safetensors" "$TMP/w-$be-$m.safetensors" &&
      pass || fail "$be $m: exported weights differ from the run without offload"
  done
  for m in r2host r2disk; do
    same_curve "$be-r2" "$be-$m"
    exported "$be-$m" && cmp -s "$TMP/w-$be-r2.safetensors" "$TMP/w-$be-$m.safetensors" &&
      pass || fail "$be $m: exported weights differ from stage 3 without offload"
  done
done
# the disk tier's files: one per rank, a 4 KiB header and two slots
[ -f "$TMP/od/dsc-offload-rank0.bin" ] && [ -f "$TMP/od/dsc-offload-rank1.bin" ] && pass ||
  fail "no offload file per rank in $(ls "$TMP/od")"

# ---- resume: 2 steps, then 2 more from the checkpoint, both offloaded to disk
expect_exit 0 "$DSC" train "$MODEL" "${COMMON[@]}" --backend cpu --out "$TMP/o-res" \
  --offload-optimizer disk --offload-dir "$TMP/od" --stop-at 2
expect_exit 0 "$DSC" train --resume "$TMP/o-res" --backend cpu --quiet --eval-every 0 \
  --offload-optimizer disk --offload-dir "$TMP/od"
same_curve cpu-none res

# ---- the plan: the device peak drops by the offloaded bytes
jnum() { grep -oE "\"$1\": -?[0-9]+" "$2" | head -1 | grep -oE -- '-?[0-9]+$'; }
plan() { # NAME ARGS...
  local name=$1
  shift
  expect_exit 0 "$DSC" plan "$MODEL" --batch 2 --seq 32 --json "$@" && cp "$TMP/out" "$TMP/plan-$name"
}
plan none --zero-stage 0
plan host --zero-stage 0 --offload-optimizer host
plan disk --zero-stage 0 --offload-optimizer disk
plan r2 --world 2 --zero-stage 3
plan r2host --world 2 --zero-stage 3 --offload-param host --offload-optimizer host
plan disk0 --zero-stage 0 --offload-optimizer disk --offload-prefetch-bytes 0
for m in host r2host; do
  base=none && [ "$m" = r2host ] && base=r2
  peak0=$(jnum peak "$TMP/plan-$base") peak=$(jnum peak "$TMP/plan-$m") host=$(jnum host "$TMP/plan-$m")
  # the offloaded values; the host step's work arena (offload_host.sh) can drop more
  host=$((host - $(jnum host_work "$TMP/plan-$m")))
  [ "$host" -gt 0 ] && [ $((peak0 - peak)) -ge "$host" ] && pass ||
    fail "$m: device peak $peak0 -> $peak, host $host: the drop is not the offloaded bytes"
  [ "$(jnum optimizer "$TMP/plan-$m")" -eq 0 ] && pass || fail "$m: optimizer states left on the device"
done
# disk: streamed (passes/offload_disk.c), so no host bytes; the reads in
# flight are WORK buffers. The old whole staging held every disk value for
# the step: its host peak was the device peak without offload (the drop
# plus the staging of the same bytes). Streaming is at most that (the
# default prefetch budget, 64 MiB, reads gpt-tiny's states all ahead) and
# below it without prefetch.
for m in disk disk0; do
  [ "$(jnum host "$TMP/plan-$m")" -eq 0 ] && pass || fail "$m: host bytes with the disk tier"
  [ "$(jnum optimizer "$TMP/plan-$m")" -eq 0 ] && pass || fail "$m: optimizer states left on the device"
done
peak0=$(jnum peak "$TMP/plan-none")
[ "$(jnum peak "$TMP/plan-disk")" -le "$peak0" ] && pass || fail "disk: peak over the whole staging's"
[ "$(jnum peak "$TMP/plan-disk0")" -lt $((peak0 - 100000)) ] && pass ||
  fail "disk, no prefetch: peak $(jnum peak "$TMP/plan-disk0") not below the whole staging's $peak0"
[ "$(jnum params "$TMP/plan-r2host")" -eq 0 ] && pass || fail "r2host: param shards left on the device"
[ "$(jnum disk "$TMP/plan-host")" -eq 0 ] && pass || fail "host: disk bytes"
disk=$(jnum disk "$TMP/plan-disk") size=$(stat -c %s "$TMP/od/dsc-offload-rank0.bin")
# the last writer of rank 0's file was the resumed run: optimizer disk, world 1
[ "$disk" -eq "$size" ] && pass || fail "planned disk bytes $disk, the file has $size"
# the trainer plans what dsc plan does (device peak + host arena); the RSS growth follows
for m in none host; do
  expect_exit 0 "$DSC" train "$MODEL" --data "$TMP/c" --batch 2 --seq 32 --steps 2 --eval-every 0 --backend cpu --out "$TMP/o-mem-$m" \
    $([ $m = host ] && echo --offload-optimizer host)
  line=$(grep '^memory: planned' "$TMP/out")
  planned=$(sed -E 's/^memory: planned ([0-9.]+) MiB.*/\1/' <<<"$line")
  want=$(awk -v p="$(jnum peak "$TMP/plan-$m")" -v h="$(jnum host "$TMP/plan-$m")" \
    'BEGIN { printf "%.1f", (p + h) / 1048576 }')
  [ "$planned" = "$want" ] && pass || fail "$m: trainer planned $planned MiB, dsc plan $want MiB"
done

# the measured RSS growth follows the plan (device + host arena) with
# plan.sh's tolerance: measured in [planned - 1, 1.10 x planned + 16] MiB
# (batch 64: the activations dominate, the offloaded states move ~1 MiB)
for m in none host disk; do
  off=() && [ $m != none ] && off=(--offload-optimizer $m --offload-dir "$TMP/od")
  [ $m = disk ] && off+=(--offload-prefetch-bytes 0)
  "$DSC" train "$MODEL" --data "$TMP/c" --batch 64 --threads 2 --steps 1 --quiet "${off[@]}" >/dev/null 2>&1
  expect_exit 0 "$DSC" train "$MODEL" --data "$TMP/c" --batch 64 --threads 2 --steps 2 --eval-every 0 \
    "${off[@]}" || continue
  line=$(grep '^memory: planned' "$TMP/out")
  echo "offload $m, batch 64: $line"
  planned=$(sed -E 's/^memory: planned ([0-9.]+) MiB.*/\1/' <<<"$line")
  measured=$(sed -E 's/.*measured ([0-9.]+) MiB.*/\1/' <<<"$line")
  if grep -q __asan_init "$DSC"; then continue; fi # the sanitizer's RSS
  awk -v p="$planned" -v m="$measured" 'BEGIN { exit !(m >= p - 1 && m <= 1.10 * p + 16) }' && pass ||
    fail "offload $m: measured $measured MiB is not within [planned - 1, 1.10 x planned + 16] of $planned MiB"
done

# ---- host memory budget
expect_exit 1 "$DSC" train "$MODEL" "${COMMON[@]}" --backend cpu --out "$TMP/o-hb" \
  --offload-optimizer host --host-memory-budget 64KiB &&
  expect_grep 'offloaded values need [0-9.]+ MiB of host memory per rank, over the host memory budget' "$TMP/err"
expect_exit 1 "$DSC" plan "$MODEL" --batch 2 --seq 32 --zero-stage 0 --offload-optimizer host \
  --host-memory-budget 64KiB && expect_grep 'stage 0: does not fit: host memory' "$TMP/err"
# (4 MiB: the host stream holds its host buffers to the step's end, 2.3 MiB)
expect_exit 0 "$DSC" plan "$MODEL" --batch 2 --seq 32 --zero-stage 0 --offload-optimizer host \
  --host-memory-budget 4MiB
expect_exit 0 "$DSC" plan "$MODEL" --batch 2 --seq 32 --zero-stage 0 --offload-optimizer host \
  --offload-overlap false --host-memory-budget 2MiB

# ---- bad input
expect_exit 1 "$DSC" train "$MODEL" "${COMMON[@]}" --offload-optimizer ram &&
  expect_grep 'offload-optimizer needs none, host \(cpu\) or disk \(nvme\)' "$TMP/err"
expect_exit 1 "$DSC" plan "$MODEL" --offload-param tape && expect_grep 'offload-param needs' "$TMP/err"
expect_exit 1 "$DSC" dump "$MODEL" --offload-param && expect_grep 'offload-param needs' "$TMP/err"
expect_exit 1 "$DSC" train "$MODEL" "${COMMON[@]}" --out "$TMP/o-x" --offload-param host &&
  expect_grep 'offload-param host needs ZeRO stage 3 at world > 1' "$TMP/err"
expect_exit 1 "$DSC" train "$MODEL" "${COMMON[@]}" --out "$TMP/o-x" --offload-optimizer disk &&
  expect_grep 'needs a directory for the offload files: give --offload-dir' "$TMP/err"
# a path under a regular file (unwritable even for root)
: >"$TMP/plainfile"
for be in interp cpu; do
  expect_exit 1 "$DSC" train "$MODEL" "${COMMON[@]}" --backend $be --out "$TMP/o-x" \
    --offload-optimizer disk --offload-dir "$TMP/plainfile/sub" &&
    expect_grep "cannot create offload file '.*plainfile/sub/dsc-offload-rank0.bin': Not a directory" "$TMP/err"
done
# a directory without write permission (not for root, who may write anyway)
if [ "$(id -u)" -ne 0 ]; then
  mkdir -p "$TMP/ro" && chmod 500 "$TMP/ro"
  expect_exit 1 "$DSC" train "$MODEL" "${COMMON[@]}" --out "$TMP/o-x" --offload-optimizer disk \
    --offload-dir "$TMP/ro" && expect_grep "cannot create offload file .*Permission denied" "$TMP/err"
fi

# ---- a full disk: resuming the offloaded run with a file size limit of 1 MiB
# (the file needs ~1.9 MiB; SIGXFSZ ignored so that the write fails with EFBIG)
for be in interp cpu; do
  (trap '' XFSZ && ulimit -f 1024 && exec "$DSC" train --resume "$TMP/o-res" --backend $be --steps 6 \
    --quiet --eval-every 0 --offload-optimizer disk --offload-dir "$TMP/od") >"$TMP/out" 2>"$TMP/err"
  [ $? -eq 1 ] && pass || fail "$be: a full disk did not exit 1"
  expect_grep "offload file '.*/od/dsc-offload-rank0.bin': writing at offset [0-9]+ failed: File too large" "$TMP/err"
  # mid-step: the first commit (the resumed values, slot 0) fit, the step's
  # write to slot 1 did not; the header still names slot 0, generation 1
  [ "$(od -An -tu8 -j16 -N16 "$TMP/od/dsc-offload-rank0.bin" | tr -s ' ')" = " 0 1" ] && pass ||
    fail "$be: a failed write moved the offload file's header"
  grep -q '"step":5' "$TMP/o-res/metrics.jsonl" && fail "$be: the failed step was logged" || pass
done
# the last checkpoint is intact: it loads, exports and resumes without offload
expect_exit 0 "$DSC" export "$TMP/o-res" -o "$TMP/w-res.safetensors"
expect_exit 0 "$DSC" train --resume "$TMP/o-res" --backend cpu --steps 5 --quiet --eval-every 0

# ---- dsc dump --after schedule: reads start ahead of their use (within the
# prefetch budget), right before it without one; writes wait late
read_gaps() { # the distance in lines from each tier_read_start to its wait (train_step)
  awk '/^graph train_step/ { g = 1 } g && /tier_read_start/ { s[$1] = NR }
    g && /tier_read_wait/ { match($0, /tier_read_wait\(%[0-9]+\)/); id = substr($0, RSTART + 15, RLENGTH - 16); print NR - s[id] }' "$TMP/out"
}
expect_exit 0 "$DSC" dump "$MODEL" --after schedule --offload-optimizer disk --batch 2 --seq 32
[ "$(read_gaps | awk '$1 > 1' | wc -l)" -gt 10 ] && pass || fail "no read started ahead of its use"
expect_grep 'tier_write_start\(%[0-9]+\) \{name = "opt\.m\.wte"\}' "$TMP/out"
# each write waits after the next write started (the last at the end)
awk '/^graph train_step/ { g = 1 } g && /tier_write_start/ { n++ } g && /tier_write_wait/ { if (n < 2) bad = 1; w++ }
  END { exit bad || w < 10 }' "$TMP/out" && pass || fail "a write waited before the next one started"
expect_exit 0 "$DSC" dump "$MODEL" --after schedule --offload-optimizer disk --batch 2 --seq 32 \
  --offload-prefetch-bytes 0
[ "$(read_gaps | sort -u)" = 1 ] && pass || fail "prefetch 0: a read started before its use"
expect_exit 1 "$DSC" train "$MODEL" "${COMMON[@]}" --offload-io-threads 0 &&
  expect_grep 'offload-io-threads needs 1 to 64' "$TMP/err"

# ---- dsc dump --after offload shows the tiers
expect_exit 0 "$DSC" dump "$MODEL" --after offload --offload-optimizer disk &&
  expect_grep 'tier\.opt\.m\.[^ ]* *= *"disk"' "$TMP/out"
expect_exit 0 "$DSC" dump --list-passes && expect_grep 'offload' "$TMP/out"
finish
