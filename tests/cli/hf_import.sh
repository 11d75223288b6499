# dsc train --init-from DIR and dsc import --list on Hugging Face model
# directories written here byte by byte (tests/cli/lib/hf_dirs.py, numpy
# only): every tensor lands in its param (Linear weights transposed, a
# sharded index, bf16 and f16 files, a tied head, a padded vocabulary), read
# back from the checkpoint after a step of SGD at lr 1e-30; and every bad
# directory ends with exit 1 and a message naming the file and the tensor,
# before anything is trained.
source "$(dirname "$0")/lib/common.bash"
export DSC_CACHE_DIR="$TMP/kernel-cache"
LLAMA="$SRC/examples/llama-tiny.dsm"
GPT="$SRC/examples/gpt-tiny.dsm"
MK="$SRC/tests/cli/lib/hf_dirs.py"

if ! python3 -c 'import numpy' 2>/dev/null; then
  if [ -n "${CI:-}" ]; then echo "FAIL: CI without python3 numpy"; exit 1; fi
  echo "SKIP: python3 cannot import numpy"
  exit 0
fi
expect_exit 0 python3 "$MK" "$TMP"

# train 1 step of SGD at lr 1e-30 from DIR; the checkpoint then holds the imported values
import_run() { # MODEL DIR OUT
  expect_exit 0 "$DSC" train "$1" --init-from "$2" --data "$TMP/data" --deepspeed "$TMP/still.json" \
    --batch 2 --seq 16 --grad-accum 1 --steps 1 --save-every 1 --eval-every 0 --precision f32 \
    --backend interp --out "$3" --quiet
}
for d in llama llama_sharded llama_bf16 llama_f16 llama_tied; do
  import_run "$LLAMA" "$TMP/$d" "$TMP/out_$d"
  python3 "$MK" --compare "$TMP/$d" "$TMP/out_$d" && pass || fail "$d: the checkpoint is not the import"
done
import_run "$GPT" "$TMP/gpt2" "$TMP/out_gpt2"
python3 "$MK" --compare "$TMP/gpt2" "$TMP/out_gpt2" && pass || fail "gpt2: the checkpoint is not the import"

# ZeRO-3: each rank reads only its chunk of each param (rank 0 of 3 reads a
# third of the bytes) and the ranks gather the rest; the first step's loss
# over the same 6 sequences is the one-rank run's (1e-6: the ranks' mean of
# means rounds apart from one mean; a wrong weight moves it by far more),
# for transposed, tied, bf16 and padded-vocabulary (GPT-2) weights
zero3_run() { # MODEL DIR WORLD BACKEND: the first loss into $TMP/z3_*.jsonl, the header into $TMP/out
  expect_exit 0 "$DSC" train "$1" --init-from "$2" --data "$TMP/data" --deepspeed "$TMP/still.json" \
    --batch $((6 / $3)) --seq 16 --grad-accum 1 --steps 1 --save-every 0 --eval-every 0 \
    --precision f32 --backend "$4" --threads 1 --ranks "$3" --zero-stage 3 \
    --log "$TMP/z3_$(basename "$2")_$3_$4.jsonl"
}
first_loss() { sed -n 's/^{"step":1,"loss":\([^,]*\),.*/\1/p' "$1"; }
mb_read() { sed -n 's/^weights from .* (\([0-9.]*\) MB read.*/\1/p' "$TMP/out"; }
for d in llama llama_tied llama_bf16 gpt2; do
  model=$LLAMA
  [ $d = gpt2 ] && model=$GPT
  zero3_run "$model" "$TMP/$d" 1 interp && one=$(mb_read)
  zero3_run "$model" "$TMP/$d" 3 interp && third=$(mb_read)
  expect_grep "MB read by rank 0: its ZeRO-3 chunks" "$TMP/out"
  # within 2% of a third: a transposed weight's chunk reads its first and
  # last columns whole (measured: 0.171 of 0.501 MB, 0.085 of 0.250 for bf16)
  python3 -c 'import sys; one, third = map(float, sys.argv[1:]); sys.exit(0 if one > 0 and abs(third - one / 3) <= 0.02 * one else 1)' \
    "${one:-0}" "${third:-0}" && pass || fail "$d: rank 0 of 3 read ${third:-?} MB of ${one:-?}"
  python3 -c 'import sys; a, b = map(float, sys.argv[1:]); sys.exit(abs(a - b) > 1e-6 * abs(a))' \
    "$(first_loss "$TMP/z3_${d}_1_interp.jsonl")" "$(first_loss "$TMP/z3_${d}_3_interp.jsonl")" &&
    pass || fail "$d: ZeRO-3 at 3 ranks imports other weights than 1 rank"
done
zero3_run "$LLAMA" "$TMP/llama" 2 cpu
python3 -c 'import sys; a, b = map(float, sys.argv[1:]); sys.exit(abs(a - b) > 1e-5 * abs(a))' \
  "$(first_loss "$TMP/z3_llama_1_interp.jsonl")" "$(first_loss "$TMP/z3_llama_2_cpu.jsonl")" &&
  pass || fail "ZeRO-3 import: the cpu backend at 2 ranks differs"
# a bad value in one rank's chunk: that rank names it, none hangs, nothing is trained
expect_exit 1 timeout 120 "$DSC" train "$LLAMA" --init-from "$TMP/nan" --data "$TMP/data" --batch 2 \
  --seq 16 --steps 1 --backend interp --ranks 2 --zero-stage 3 --out "$TMP/never_z3" --quiet &&
  expect_grep "nan/model.safetensors: error: tensor 'model.norm.weight': element 3 is NaN" "$TMP/err"
[ ! -e "$TMP/never_z3/step-000001" ] && pass || fail "ZeRO-3 with a NaN: trained anyway"

# dsc run --init-from: the forward on the imported weights, the same on both backends
expect_exit 0 "$DSC" run "$LLAMA" --quiet && cp "$TMP/out" "$TMP/run_init"
expect_exit 0 "$DSC" run "$LLAMA" --init-from "$TMP/llama" --quiet && cp "$TMP/out" "$TMP/run_hf"
cmp -s "$TMP/run_init" "$TMP/run_hf" && fail "dsc run --init-from: the initializers' loss" || pass
expect_exit 0 "$DSC" run "$LLAMA" --init-from "$TMP/llama" --backend cpu --threads 2 --quiet
python3 -c 'import sys; a, b = (float(open(f).read().split()[1]) for f in sys.argv[1:]); sys.exit(abs(a - b) > 1e-5 * abs(a))' "$TMP/run_hf" "$TMP/out" && pass || fail "run --init-from: cpu differs from interp"
expect_exit 1 "$DSC" run "$LLAMA" --init-from "$TMP/bad_shape" --quiet && expect_grep "needs f32\[32,64\]" "$TMP/err"

# dsc export --format hf writes what --init-from reads back, value for value
expect_exit 0 "$DSC" export "$TMP/out_llama" --format hf -o "$TMP/exported" --max-shard-size 100KB &&
  expect_grep 'LlamaForCausalLM \(llama\), 21 tensors in [0-9]+ file\(s\)' "$TMP/out"
[ -s "$TMP/exported/model.safetensors.index.json" ] && pass || fail "no index for a sharded export"
expect_grep '"num_key_value_heads":[[:space:]]*2' "$TMP/exported/config.json"
import_run "$LLAMA" "$TMP/exported" "$TMP/out_exported"
python3 "$MK" --compare "$TMP/exported" "$TMP/out_exported" && pass || fail "export -> import differs"
expect_exit 0 "$DSC" export "$TMP/out_gpt2" --format hf -o "$TMP/exported_gpt2" --dtype bf16
expect_grep '"model_type":[[:space:]]*"gpt2"' "$TMP/exported_gpt2/config.json"
expect_grep '"torch_dtype":[[:space:]]*"bfloat16"' "$TMP/exported_gpt2/config.json"
expect_exit 1 "$DSC" export "$TMP/out_llama" --format hf -o "$TMP/x" --optimizer "$TMP/o.st" &&
  expect_grep "not with --format hf" "$TMP/err"
expect_exit 1 "$DSC" export "$TMP/out_llama" --format onnx -o "$TMP/x" &&
  expect_grep "needs hf or safetensors, got 'onnx'" "$TMP/err"

expect_exit 0 "$DSC" import --list "$TMP/llama_sharded" "$LLAMA"
expect_grep '^  model.layers.1.self_attn.k_proj.weight +f32\[32,64\] +model-00002-of-00002.safetensors  -> layers.1.k_proj \(transposed\)' "$TMP/out"
expect_grep '^  model.rotary_emb.inv_freq .*\(ignored: not a weight\)' "$TMP/out"
expect_exit 0 "$DSC" import --list "$TMP/llama_tied" "$LLAMA"
expect_grep '-> lm_head \(transposed, tied to the embedding\)' "$TMP/out"
expect_exit 0 "$DSC" import --list "$TMP/gpt2" "$GPT"
expect_grep '^  transformer.wte.weight +f32\[250,64\] .* -> wte \(rows\)' "$TMP/out"
expect_grep '^  transformer.h.0.attn.c_attn.weight +f32\[64,192\] .* -> h.0.attn_w \(as is\)' "$TMP/out"

# bad directories: exit 1, the file, the tensor, both shapes
bad() { # DIR MESSAGE(ERE) [MODEL]
  expect_exit 1 "$DSC" train "${3:-$LLAMA}" --init-from "$TMP/$1" --data "$TMP/data" \
    --batch 2 --seq 16 --steps 1 --out "$TMP/never_$1" --quiet && expect_grep "$2" "$TMP/err"
  [ ! -e "$TMP/never_$1/step-000001" ] && pass || fail "$1: trained anyway"
}
bad bad_shape "bad_shape/model.safetensors: error: tensor 'model.layers.0.self_attn.k_proj.weight' is f32\[64,64\]; param 'layers.0.k_proj' needs f32\[32,64\] \(transformers stores a Linear weight \[out, in\]\)"
bad missing "missing: error: param 'lm_head' of model 'llama_tiny' has no tensor here \(llama's name: lm_head.weight\)"
bad extra "extra/model.safetensors: error: tensor 'model.layers.0.self_attn.q_norm.weight' has no param in dsc's llama name map"
bad truncated "truncated/model-00002-of-00002.safetensors: error: "
bad bad_type "bad_type/config.json: error: model_type \"bert\" has no name map in dsc \(it has llama, mistral, qwen2, gpt2\)"
bad bad_theta "bad_theta/config.json: error: rope_theta is 500000, but the model's rope has theta = 10000"
bad bad_kv "bad_kv/config.json: error: num_key_value_heads is 4, but the model's attention has kv_heads = 2"
bad bad_scaling "bad_scaling/config.json: error: rope_scaling.factor is 8, but the model's rope has factor = 1"
bad bad_yarn "bad_yarn/config.json: error: rope_type \"yarn\" scales the rotary frequencies in a way dsc's rope does not"
bad no_config "no_config/config.json: error: "
bad bad_json "bad_json/config.json:3:[0-9]+: error: not valid JSON here"
bad index_missing "index_missing/model.safetensors.index.json: error: weight_map puts 'model.norm.weight' in model-0000[12]-of-00002.safetensors, which has no such tensor"
bad index_escape "index_escape/model.safetensors.index.json: error: weight_map\[\"model.norm.weight\"\] is not the name of a file in"
bad nan "nan/model.safetensors: error: tensor 'model.norm.weight': element 3 is NaN"
bad no_weights "no_weights: error: has neither model.safetensors nor model.safetensors.index.json"
bad llama "llama/config.json: error: num_key_value_heads is 2, but the model's attention has kv_heads = 4" "$GPT"
expect_exit 1 "$DSC" train "$LLAMA" --init-from "$TMP/llama" --resume "$TMP/out_llama" --quiet &&
  expect_grep "give one of them" "$TMP/err"
expect_exit 1 "$DSC" import "$TMP/llama" "$LLAMA" && expect_grep "only action" "$TMP/err"
expect_exit 1 "$DSC" import --list "$TMP/nope" "$LLAMA" && expect_grep "nope: error: not a directory" "$TMP/err"
finish
