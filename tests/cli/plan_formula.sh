# dsc plan against the ZeRO paper's model-state formulas, to the byte (issue
# 17 item 2): GPT-2 124M at worlds 1, 8 and 64 (and 7, where shards pad),
# stages 0-3, in f32 and in
# bf16 with master weights. Per rank, with P, G, K the bytes per param of
# params, gradients and optimizer states (f32: 4, 4, 8; bf16: 2, 2, 12, the
# paper's mixed precision: bf16 params and gradients, f32 master + m + v):
#   stage 0  (P+G+K) Psi        stage 2  P Psi + (G+K) Psi_N
#   stage 1  (P+G) Psi + K Psi_N   stage 3  (P+G+K) Psi_N
# plus opt.step (4 bytes), where Psi_N = sum over tensors of ceil(n/N): a
# shard of n elements is padded to a multiple of N (the padding is stated:
# Psi_N - Psi/N per rank). Psi and the tensor sizes come from the model's
# dims, independently of dsc. At world 1 every stage is stage 0.
source "$(dirname "$0")/lib/common.bash"

jnum() { grep -oE "\"$1\": -?[0-9]+" "$2" | head -1 | grep -oE -- '-?[0-9]+$'; }

# GPT-2 small: vocab 50304, ctx 1024, d 768, 12 layers (examples/gpt2.dsm)
V=50304 C=1024 D=768 L=12
SIZES="$((V * D)) $((C * D))"
for _ in $(seq $L); do
  SIZES="$SIZES $D $D $((3 * D * D)) $((3 * D)) $((D * D)) $D $D $D $((4 * D * D)) $((4 * D)) $((4 * D * D)) $D"
done
SIZES="$SIZES $D $D"
PSI=0
for n in $SIZES; do PSI=$((PSI + n)); done
[ "$PSI" -eq 124475904 ] && pass || fail "GPT-2 Psi arithmetic: $PSI"

# psi_n N: elements per rank of every tensor sharded over N ranks
psi_n() {
  local s=0 n
  for n in $SIZES; do s=$((s + (n + $1 - 1) / $1)); done
  echo $s
}

for prec in f32 bf16; do
  if [ $prec = f32 ]; then P=4 G=4 K=8; else P=2 G=2 K=12; fi
  for w in 1 7 8 64; do
    PN=$(psi_n $w)
    echo "world $w: Psi_N = $PN elements per rank, padding $((PN * w - PSI)) elements in all"
    for s in 0 1 2 3; do
      f="$TMP/$prec-$w-$s.json"
      expect_exit 0 "$DSC" plan "$SRC/examples/gpt2.dsm" --world $w --zero-stage $s \
        --precision $prec --batch 1 --seq 64 --grad-accum 1 --json || continue
      cp "$TMP/out" "$f"
      mw=false
      [ $prec = bf16 ] && mw=true
      expect_grep "\"master_weights\": $mw, \"bytes_per_param\": \{\"P\": $P, \"G\": $G, \"K\": $K\}" "$f"
      es=$s
      [ $w -eq 1 ] && es=0
      case $es in
        0) wp=$((P * PSI)) wg=$((G * PSI)) wo=$((K * PSI + 4)) ;;
        1) wp=$((P * PSI)) wg=$((G * PSI)) wo=$((K * PN + 4)) ;;
        2) wp=$((P * PSI)) wg=$((G * PN)) wo=$((K * PN + 4)) ;;
        3) wp=$((P * PN)) wg=$((G * PN)) wo=$((K * PN + 4)) ;;
      esac
      p=$(jnum params "$f") g=$(jnum grads_held "$f") o=$(jnum optimizer "$f")
      ms=$(jnum model_states "$f")
      what="$prec world $w stage $s"
      [ "$p" -eq $wp ] && pass || fail "$what: params $p, the formula $wp"
      [ "$g" -eq $wg ] && pass || fail "$what: grads held $g, the formula $wg"
      [ "$o" -eq $wo ] && pass || fail "$what: optimizer $o, the formula $wo"
      [ "$ms" -eq $((wp + wg + wo)) ] && pass || fail "$what: model states $ms, the formula $((wp + wg + wo))"
      echo "$what: model states $ms B = $(awk -v m="$ms" -v p="$PSI" 'BEGIN { printf "%.4f", (m - 4) / p }') Psi"
    done
  done
done

# the table names the formulas it compares with
expect_exit 0 "$DSC" plan "$SRC/examples/gpt2.dsm" --world 8 --precision bf16 --batch 1 --seq 64 \
  --grad-accum 1
expect_grep '\(2\+2\+K\)Psi +\(2\+2\)Psi\+K\*Psi/N +2Psi\+\(2\+K\)Psi/N +\(2\+2\+K\)Psi/N' "$TMP/out"
expect_grep '^K = 12 \(optimizer state bytes per param: the f32 master weights' "$TMP/out"
# without master weights (autocast) the f32 params and gradients are the paper's f32 formulas
expect_exit 0 "$DSC" plan "$SRC/examples/gpt2.dsm" --world 8 --zero-stage 1 --precision bf16 \
  --master-weights false --batch 1 --seq 64 --grad-accum 1 --json
expect_grep '"master_weights": false, "bytes_per_param": \{"P": 4, "G": 4, "K": 8\}' "$TMP/out"
[ "$(jnum model_states "$TMP/out")" -eq $((8 * PSI + 8 * $(psi_n 8) + 4)) ] && pass ||
  fail "autocast stage 1: model states $(jnum model_states "$TMP/out")"
finish
