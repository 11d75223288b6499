# Hostile or unlucky files (issue 14): FIFOs never block an open, outputs
# never replace a device or a FIFO, runs never leave their directory, one
# writer per run directory, every write is checked, and what a killed save
# left is cleaned up. CI runs as root (mknod).
source "$(dirname "$0")/lib/common.bash"
source "$(dirname "$0")/lib/corpus.bash"
MODEL="$SRC/examples/gpt-tiny.dsm"
export DSC_CACHE_DIR="$TMP/cache" # compile the kernels once for every run below
make_corpus "$TMP/corpus.txt" 400
expect_exit 0 "$DSC" data "$TMP/corpus.txt" -o "$TMP/c"
RUN=(--data "$TMP/c" --batch 2 --seq 16 --lr 3e-3 --quiet)
expect_exit 0 "$DSC" train "$MODEL" "${RUN[@]}" --steps 4 --save-every 2 --out "$TMP/r"
listing() { (cd "$1" && find . -printf '%p %y %l\n' | sort && md5sum $(find . -type f | sort)); }
is_kind() { # TEST PATH WHAT
  if test "$1" "$2"; then pass; else fail "$2 is no longer $3: $(ls -ld "$2")"; fi
}

# ---- 8. FIFOs as inputs: refused at once, never a hang (timeout's 124)
mkfifo "$TMP/fifo.dsm" "$TMP/fifo.txt"
expect_exit 1 timeout 20 "$DSC" check "$TMP/fifo.dsm" && expect_grep 'fifo.dsm: error: .*not a regular file' "$TMP/err"
expect_exit 1 timeout 20 "$DSC" data "$TMP/fifo.txt" -o "$TMP/x" &&
  expect_grep 'fifo.txt: error: not a regular file \(a FIFO\)' "$TMP/err"
for f in model.safetensors optimizer.safetensors state.json; do
  rm -rf "$TMP/f" && cp -r "$TMP/r" "$TMP/f"
  rm "$TMP/f/step-000004/$f" && mkfifo "$TMP/f/step-000004/$f"
  expect_exit 1 timeout 20 "$DSC" train --resume "$TMP/f" --steps 6 &&
    expect_grep "step-000004/$f: error: not a regular file \(a FIFO\)" "$TMP/err"
done
expect_exit 1 timeout 20 "$DSC" export "$TMP/f" -o "$TMP/f.safetensors" &&
  expect_grep 'not a regular file \(a FIFO\)' "$TMP/err"
mkdir -p "$TMP/fd" && cp "$TMP/c_val.bin" "$TMP/fd/c_val.bin" && mkfifo "$TMP/fd/c_train.bin"
expect_exit 1 timeout 20 "$DSC" train "$MODEL" --data "$TMP/fd/c" --batch 2 --seq 16 --steps 1 &&
  expect_grep 'c_train.bin: error: not a regular file \(a FIFO\)' "$TMP/err"
# a FIFO in the kernel cache is skipped (that kernel is compiled again)
for f in $(ls "$DSC_CACHE_DIR"/*.o | head -3); do rm "$f" && mkfifo "$f"; done
expect_exit 0 timeout -s KILL 300 "$DSC" train "$MODEL" "${RUN[@]}" --steps 1

# ---- 2. -o over special files: a character device or a FIFO is written
# into (never replaced), a directory is refused, a link keeps being a link
expect_exit 0 "$DSC" export "$TMP/r" -o "$TMP/ref.safetensors"
mknod "$TMP/null" c 1 3 && mknod "$TMP/full" c 1 7
expect_exit 0 "$DSC" export "$TMP/r" -o "$TMP/null"
is_kind -c "$TMP/null" "a character device"
expect_exit 0 "$DSC" compile "$MODEL" --batch 2 --seq 16 -o "$TMP/null"
is_kind -c "$TMP/null" "a character device"
mknod "$TMP/dn_train.bin" c 1 3
expect_exit 0 "$DSC" data "$TMP/corpus.txt" -o "$TMP/dn"
is_kind -c "$TMP/dn_train.bin" "a character device"
[ -f "$TMP/dn_val.bin" ] && pass || fail "data -o: the regular output is missing"
expect_exit 1 "$DSC" export "$TMP/r" -o "$TMP/full" && expect_grep 'full: error: .*No space left on device' "$TMP/err"
is_kind -c "$TMP/full" "a character device"
mkfifo "$TMP/out.fifo"
timeout 60 cat "$TMP/out.fifo" >"$TMP/from_fifo" &
reader=$!
expect_exit 0 timeout 60 "$DSC" export "$TMP/r" -o "$TMP/out.fifo"
wait $reader
is_kind -p "$TMP/out.fifo" "a FIFO"
cmp -s "$TMP/from_fifo" "$TMP/ref.safetensors" && pass || fail "export into a FIFO: the reader got other bytes"
mkdir "$TMP/outdir" && touch "$TMP/outdir/keep"
expect_exit 1 "$DSC" export "$TMP/r" -o "$TMP/outdir" && expect_grep 'outdir: error: cannot write here: it is a directory' "$TMP/err"
[ -f "$TMP/outdir/keep" ] && pass || fail "export -o DIR touched the directory"
echo old >"$TMP/real.safetensors" && ln -s real.safetensors "$TMP/link.safetensors"
expect_exit 0 "$DSC" export "$TMP/r" -o "$TMP/link.safetensors"
is_kind -L "$TMP/link.safetensors" "a symbolic link"
cmp -s "$TMP/real.safetensors" "$TMP/ref.safetensors" && pass || fail "export through a link: the target was not written"

# ---- 3. latest pointing out of its run directory: refused, victim untouched
expect_exit 0 "$DSC" train "$MODEL" "${RUN[@]}" --steps 4 --save-every 2 --out "$TMP/victim"
before=$(listing "$TMP/victim")
mkdir "$TMP/att" && ln -s ../victim/step-000004 "$TMP/att/latest"
expect_exit 1 "$DSC" train --resume "$TMP/att" --steps 6 --keep-last 1 &&
  expect_grep 'att/latest: error: points to .*victim/step-000004.*outside the run directory' "$TMP/err"
[ "$(listing "$TMP/victim")" = "$before" ] && pass || fail "a resume through att/latest changed victim/"
# a link named like a step is not the run's to prune
rm -rf "$TMP/p" && cp -r "$TMP/r" "$TMP/p" && ln -s ../victim/step-000002 "$TMP/p/step-000001"
expect_exit 0 "$DSC" train --resume "$TMP/p" --steps 6 --keep-last 1
[ "$(listing "$TMP/victim")" = "$before" ] && pass || fail "pruning followed p/step-000001 into victim/"
[ -L "$TMP/p/step-000001" ] && [ -d "$TMP/p/step-000006" ] && [ ! -e "$TMP/p/step-000004" ] && pass ||
  fail "prune: $(ls "$TMP/p")"

# ---- 4. a trailing slash names the same step directory (no nesting)
rm -rf "$TMP/s" && cp -r "$TMP/r" "$TMP/s"
expect_exit 0 "$DSC" train --resume "$TMP/s/step-000004/" --steps 6
[ -d "$TMP/s/step-000006" ] && [ "$(readlink "$TMP/s/latest")" = step-000006 ] &&
  [ ! -e "$TMP/s/step-000004/step-000006" ] && [ ! -e "$TMP/s/step-000004/metrics.jsonl" ] && pass ||
  fail "--resume DIR/step/: $(ls -R "$TMP/s")"

# ---- 5. one writer per run directory, released on death (kill -9 too)
"$DSC" train "$MODEL" "${RUN[@]}" --steps 100000 --save-every 1 --out "$TMP/L" --log "$TMP/L.jsonl" \
  >/dev/null 2>"$TMP/L.err" &
holder=$!
for _ in $(seq 600); do [ -s "$TMP/L.jsonl" ] && break; sleep 0.1; done
expect_exit 1 "$DSC" train "$MODEL" "${RUN[@]}" --steps 4 --out "$TMP/L" &&
  expect_grep "run directory .*L is in use by dsc \(pid $holder\)" "$TMP/err"
expect_exit 1 timeout 60 "$DSC" train --resume "$TMP/L" --steps 100000 &&
  expect_grep "is in use by dsc \(pid $holder\)" "$TMP/err"
kill -9 $holder
wait $holder 2>/dev/null
# the run directory moved away mid-run (a new one made in its place): the
# next save stops the run, naming it (or the save under way fails on its
# vanished directory); nothing is written into the new one
"$DSC" train "$MODEL" "${RUN[@]}" --steps 100000 --save-every 1 --out "$TMP/M" >/dev/null 2>"$TMP/M.err" &
mover=$!
for _ in $(seq 600); do [ -d "$TMP/M/step-000002" ] && break; sleep 0.1; done
mv "$TMP/M" "$TMP/M.moved" && mkdir "$TMP/M"
for _ in $(seq 100); do kill -0 $mover 2>/dev/null || break; sleep 0.1; done
kill -0 $mover 2>/dev/null && { fail "still training 10 s after its run directory moved"; kill -9 $mover; }
wait $mover
[ $? -eq 1 ] && pass || fail "a moved run directory: exit not 1"
# the error names M or a path in it (the check's message, or the failed step of a save under way)
expect_grep "/M: error: the run directory was moved, removed or replaced while this run held it|/M/[^ :]+: error: cannot" "$TMP/M.err"
[ -z "$(ls -A "$TMP/M")" ] && pass || fail "written into the new M: $(ls -A "$TMP/M")"
# ---- 12. what a killed save left: removed (with a note) by the next writer
mkdir -p "$TMP/L/.step-000099.tmp-999999" && echo x >"$TMP/L/.step-000099.tmp-999999/model.safetensors"
ln -s step-000099 "$TMP/L/.latest.tmp-999999"
last=$(readlink "$TMP/L/latest")
expect_exit 0 "$DSC" train --resume "$TMP/L" --steps $((10#${last#step-} + 1))
expect_grep 'step-000099.tmp-999999: note: removed what an interrupted save by process 999999 left' "$TMP/err"
[ -z "$(find "$TMP/L" -name '.*.tmp-*')" ] && pass || fail "stale temporaries left: $(find "$TMP/L" -name '.*.tmp-*')"

# kill -9 at random points of a run saving every step: whatever it leaves,
# the next writer cleans it up and resumes
for k in 1 2 3; do
  rm -f "$TMP/K.jsonl"
  if [ $k -eq 1 ]; then args=("$MODEL" "${RUN[@]}" --steps 100000 --save-every 1 --out "$TMP/K")
  else args=(--resume "$TMP/K" --steps 100000 --save-every 1); fi
  "$DSC" train "${args[@]}" --log "$TMP/K.jsonl" >/dev/null 2>&1 &
  victim=$!
  for _ in $(seq 600); do [ -s "$TMP/K.jsonl" ] && break; sleep 0.1; done
  sleep "0.$((RANDOM % 10))"
  kill -9 $victim
  wait $victim 2>/dev/null
done
left=$(find "$TMP/K" -maxdepth 1 -name '.*.tmp-*' | wc -l)
expect_exit 0 "$DSC" train --resume "$TMP/K" --steps $((10#$(readlink "$TMP/K/latest" | sed 's/step-//') + 1))
[ -z "$(find "$TMP/K" -name '.*.tmp-*')" ] && pass || fail "after $left leftovers of kill -9: $(ls -a "$TMP/K")"

# ---- 9. every write checked: a full log, metrics file or standard output fails the run
expect_exit 1 "$DSC" train "$MODEL" "${RUN[@]}" --steps 2 --out "$TMP/w1" --log /dev/full &&
  expect_grep '/dev/full: error: write failed: No space left on device' "$TMP/err"
mkdir "$TMP/w2" && ln -s /dev/full "$TMP/w2/metrics.jsonl"
expect_exit 1 "$DSC" train "$MODEL" "${RUN[@]}" --steps 2 --out "$TMP/w2" &&
  expect_grep 'metrics.jsonl: error: write failed: No space left on device' "$TMP/err"
"$DSC" sample "$TMP/r" --tokens 8 >/dev/full 2>"$TMP/err"
[ $? -eq 1 ] && pass || fail "dsc sample >/dev/full did not exit 1"
expect_grep 'cannot write the standard output: No space left on device' "$TMP/err"
"$DSC" train "$MODEL" --data "$TMP/c" --batch 2 --seq 16 --steps 2 >/dev/full 2>"$TMP/err"
[ $? -eq 1 ] && pass || fail "dsc train >/dev/full did not exit 1"
finish
