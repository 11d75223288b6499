# dsc plan past this machine (issue 7 item 5): GPT-2 1.5B, LLaMA 7B and
# LLaMA 2 70B (rotary embeddings, grouped-query attention) plan at ZeRO
# stage 3 in seconds, with the param counts their headers state (computed
# here from their dims, independently of dsc), model states equal to the ZeRO
# formula 16 Psi / N within the shard padding (bf16 params: 2 Psi / N), and a peak above the model
# states. Nothing is allocated: only the compile runs.
source "$(dirname "$0")/lib/common.bash"

# jnum KEY FILE: the first "KEY": N of a JSON line (rank 0's figures)
jnum() { grep -oE "\"$1\": -?[0-9]+" "$2" | head -1 | grep -oE -- '-?[0-9]+$'; }

# Psi from the dims (see each file's header comment)
gpt2() { # vocab ctx d layers
  local v=$1 c=$2 d=$3 l=$4
  echo $((v * d + c * d + l * (12 * d * d + 13 * d) + 2 * d))
}
llama() { # vocab d layers hidden kv_dim (rotary positions: no table; untied head)
  local v=$1 d=$2 l=$3 h=$4 kv=$5
  echo $((l * (2 * d * d + 2 * d * kv + 3 * d * h + 2 * d) + 2 * v * d + d))
}
PSI_XL=$(gpt2 50304 1024 1600 48)
PSI_7B=$(llama 32000 4096 32 11008 4096)
PSI_70B=$(llama 32000 8192 80 28672 1024)
# the figures the headers and docs/memory.md state
[ "$PSI_XL" -eq 1557686400 ] && pass || fail "GPT-2 1.5B Psi arithmetic: $PSI_XL"
# the published counts of LLaMA 7B and LLaMA 2 70B
[ "$PSI_7B" -eq 6738415616 ] && pass || fail "7B Psi arithmetic: $PSI_7B"
[ "$PSI_70B" -eq 68976648192 ] && pass || fail "70B Psi arithmetic: $PSI_70B"

# check MODEL PSI NTENSORS WORLD: plan at stage 3 and check the figures
check() {
  local model=$1 psi=$2 nt=$3 w=$4 f="$TMP/$1-$4.json" t0 t1
  t0=$(date +%s)
  expect_exit 0 "$DSC" plan "$SRC/examples/$model.dsm" --world "$w" --zero-stage 3 --batch 1 \
    --seq 128 --grad-accum 1 --json || return
  t1=$(date +%s)
  echo "$model world $w: planned in $((t1 - t0)) s"
  cp "$TMP/out" "$f"
  expect_grep "^\{\"param_count\": $psi, \"world\": $w, \"stage\": 3, \"precision\": \"bf16\"" "$f"
  [ "$(grep -o '"rank": ' "$f" | wc -l)" -eq "$w" ] && pass || fail "$model: not $w ranks"
  local p g o ms peak sum
  p=$(jnum params "$f") g=$(jnum grads_held "$f") o=$(jnum optimizer "$f")
  ms=$(jnum model_states "$f") peak=$(jnum peak "$f")
  sum=$(($(jnum params "$f") + $(jnum grads "$f") + o + $(jnum activations "$f") +
    $(jnum workspace "$f") + $(jnum comm "$f")))
  [ "$sum" -eq "$peak" ] && pass || fail "$model world $w: categories add up to $sum, peak $peak"
  [ "$ms" -eq $((p + g + o)) ] && pass || fail "$model world $w: model_states $ms != $p + $g + $o"
  # bf16 with master weights: (2+2+12) Psi / N, + opt.step (4 bytes); each of
  # the 5 value kinds pads each tensor by at most 4 bytes on a rank
  local want=$((16 * psi / w + 4)) tol=$((16 * nt)) diff
  diff=$((ms - want))
  [ "${diff#-}" -le "$tol" ] && pass || fail "$model world $w: model states $ms, 16 Psi/N = $want (+-$tol)"
  diff=$((p - 2 * psi / w))
  [ "${diff#-}" -le $((2 * nt)) ] && pass || fail "$model world $w: params $p, 2 Psi/N = $((2 * psi / w))"
  [ "$peak" -gt "$ms" ] && pass || fail "$model world $w: peak $peak not above model states $ms"
  # a plan is a compile: seconds, not minutes, even under the sanitizers
  [ $((t1 - t0)) -le 30 ] && pass || fail "$model world $w: planning took $((t1 - t0)) s"
}

check gpt2-xl "$PSI_XL" $((2 + 48 * 12 + 2)) 8
check llama-7b "$PSI_7B" $((1 + 32 * 9 + 2)) 8
check llama-70b "$PSI_70B" $((1 + 80 * 9 + 2)) 64
finish
