# The crafted-input corpus (tests/crafted, written by tests/crafted/gen.py):
# every file goes through the real dsc command that reads it and must be
# refused with exit 1 and the message of tests/crafted/EXPECTED (which names
# the file and the field), never a crash (exit >= 128), a sanitizer report
# or a hang. The controls (tests/crafted/base) must pass the same commands.
source "$(dirname "$0")/lib/common.bash"

C="$SRC/tests/crafted"
MODEL="$C/tiny.dsm"
LIMIT=60 # seconds a command may take (ASan, a loaded CI machine); each takes well under 1 s
mkdir -p "$TMP/data"
cp "$C/base/d_train.bin" "$TMP/d_train.bin" # the data prefix the states record: $TMP/d

# A checkpoint step directory from the controls: $1 = directory, $2 = zero
# for the ZeRO variant (model.safetensors without wte, one shard with it).
make_ckpt() {
  mkdir -p "$1"
  cp "$C/base/optimizer.safetensors" "$1/"
  if [ "${2:-}" = zero ]; then
    cp "$C/base/model_zero.safetensors" "$1/model.safetensors"
    cp "$C/base/shard-00000-of-00001.safetensors" "$1/"
    subst "$C/base/state_zero.json" >"$1/state.json"
  else
    cp "$C/base/model.safetensors" "$1/"
    subst "$C/base/state.json" >"$1/state.json"
  fi
}
subst() { sed -e "s|@SRC@|$SRC|g" -e "s|@TMP@|$TMP|g" "$1"; }

# runs "$@" with the checks every case shares; rc in $rc, stderr in $TMP/err
run_checked() { # NAME WANT_RC CMD...
  local name=$1 want=$2
  shift 2
  local t0=$SECONDS
  timeout "$((LIMIT * 2))" "$@" >"$TMP/out" 2>"$TMP/err"
  rc=$?
  local took=$((SECONDS - t0))
  if [ "$rc" -ge 124 ]; then
    fail "$name: '$*' crashed or hung (exit $rc)"
    sed 's/^/    /' "$TMP/err" | head -20
  elif [ "$rc" -ne "$want" ]; then
    fail "$name: '$*' exited $rc, expected $want"
    sed 's/^/    /' "$TMP/err" | head -20
  else
    pass
  fi
  if grep -qE 'Sanitizer|runtime error:' "$TMP/err"; then
    fail "$name: sanitizer report"
    sed 's/^/    /' "$TMP/err" | head -20
  fi
  [ "$took" -le "$LIMIT" ] && pass || fail "$name: took $took s (limit $LIMIT s)"
}

# ROLE FILE: the command for a file in that role, in the array CMD
setup() { # ROLE FILE DIR
  local role=$1 file=$2 dir=$3
  rm -rf "$dir"
  case "$role" in
    *-shard) make_ckpt "$dir" zero ;;
    train-data | run-dsx) mkdir -p "$dir" ;;
    *) make_ckpt "$dir" ;;
  esac
  case "$role" in
    *-model) cp "$file" "$dir/model.safetensors" ;;
    *-opt) cp "$file" "$dir/optimizer.safetensors" ;;
    *-state) subst "$file" >"$dir/state.json" ;;
    *-shard) cp "$file" "$dir/shard-00000-of-00001.safetensors" ;;
    train-data) cp "$file" "$dir/d_train.bin" ;;
    run-dsx) cp "$file" "$dir/$(basename "$file")" ;;
  esac
  case "$role" in
    export-*) CMD=("$DSC" export "$dir" -o "$TMP/export.safetensors") ;;
    resume-*) CMD=("$DSC" train --resume "$dir" --steps 4 --quiet) ;;
    sample-*) CMD=("$DSC" sample "$dir" --tokens 2) ;;
    train-data) CMD=("$DSC" train "$MODEL" --data "$dir/d" --steps 1 --quiet --out "$dir/o") ;;
    run-dsx) CMD=("$DSC" run "$dir/$(basename "$file")") ;;
    *) CMD=(false) && fail "unknown role '$role'" ;;
  esac
}

# 1. the controls pass every command the corpus uses
for role in export-model resume-model sample-model export-shard resume-shard; do
  case "$role" in
    *-shard) src="$C/base/shard-00000-of-00001.safetensors" ;;
    *) src="$C/base/model.safetensors" ;;
  esac
  setup "$role" "$src" "$TMP/ctl"
  run_checked "control $role" 0 "${CMD[@]}"
done
setup train-data "$C/base/d_train.bin" "$TMP/ctl"
run_checked "control train-data" 0 "${CMD[@]}"
[ -s "$TMP/export.safetensors" ] && pass || fail "the control export wrote nothing"

# 2. every crafted file: exit 1 and its message
n=0
while IFS=$'\t' read -r file role want msg; do
  case "$file" in '#'* | '') continue ;; esac
  n=$((n + 1))
  [ -f "$C/files/$file" ] || { fail "$file: listed in EXPECTED but missing"; continue; }
  rm -f "$TMP/export.safetensors"
  setup "$role" "$C/files/$file" "$TMP/case"
  run_checked "$file" "$want" "${CMD[@]}"
  if grep -qF -- "$msg" "$TMP/err"; then
    pass
  else
    fail "$file ($role): no '$msg' in:"
    sed 's/^/    /' "$TMP/err" | head -10
  fi
  [ ! -e "$TMP/export.safetensors" ] && pass || fail "$file: export wrote a file anyway"
done <"$C/EXPECTED"
# every file of the corpus is in the table, and the table is not short
[ "$n" -ge 40 ] && pass || fail "only $n crafted files in EXPECTED"
for f in "$C"/files/*; do
  grep -q "^$(basename "$f")	" "$C/EXPECTED" && pass || fail "$(basename "$f") is not in EXPECTED"
done
finish
