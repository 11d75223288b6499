# transformers as the oracle (issue: real models from the ecosystem): a
# random-init LlamaForCausalLM (rotary embeddings, grouped-query attention,
# untied head) and GPT2LMHeadModel (Conv1D, tied head) saved with
# save_pretrained, imported by `dsc train --init-from`: the first step's loss
# within 1e-5 relative of transformers', every param's gradient within 1e-4
# (normwise) and the weights after one AdamW step within 1e-5
# (tests/cli/lib/hf_oracle.py); `dsc export --format hf` of the trained
# model loads with from_pretrained, every weight and the loss the same.
# Needs torch and transformers: the Python of $DSC_HF_PYTHON (scripts/test.sh
# sets it: transformers 4.46 over Debian's torch), else build/hf-venv
# (bench/hf_venv.sh: PyPI's newest); without them the test is skipped
# (tests/cli/hf_import.sh still runs), and a named Python without them fails.
source "$(dirname "$0")/lib/common.bash"
export DSC_CACHE_DIR="$TMP/kernel-cache"
PY=${DSC_HF_PYTHON:-$SRC/build/hf-venv/bin/python3}
ORACLE="$SRC/tests/cli/lib/hf_oracle.py"

if ! "$PY" -c 'import torch, transformers, safetensors' >/dev/null 2>&1; then
  # scripts/test.sh names its Python: there, a missing oracle is a failure
  [ -n "${DSC_HF_PYTHON:-}" ] && fail "DSC_HF_PYTHON=$PY lacks torch, transformers or safetensors"
  echo "no torch + transformers at $PY (bench/hf_venv.sh): the oracle comparison is skipped"
  finish
  exit
fi

# llama3: the same Llama with Llama 3.1's rope scaling, in transformers'
# config and in the model's rope calls
sed 's/theta = theta)/theta = theta, factor = 8, low_freq_factor = 1, high_freq_factor = 4, original_context = 64)/' \
  "$SRC/examples/llama-tiny.dsm" >"$TMP/llama3-tiny.dsm"
[ "$(grep -c 'original_context = 64' "$TMP/llama3-tiny.dsm")" -eq 2 ] && pass || fail "llama3-tiny.dsm: 2 ropes to scale"
# mistral: the same Llama with Mistral's sliding window of 8 on its attention
sed 's/causal = true)/causal = true, window = 8)/' "$SRC/examples/llama-tiny.dsm" >"$TMP/mistral-tiny.dsm"
[ "$(grep -c 'window = 8' "$TMP/mistral-tiny.dsm")" -eq 1 ] && pass || fail "mistral-tiny.dsm: 1 attention to window"
for arch in llama llama3 mistral gpt2; do
  model="$SRC/examples/llama-tiny.dsm"
  [ $arch = llama3 ] && model="$TMP/llama3-tiny.dsm"
  [ $arch = mistral ] && model="$TMP/mistral-tiny.dsm"
  [ $arch = gpt2 ] && model="$SRC/examples/gpt-tiny.dsm"
  W="$TMP/$arch"
  mkdir -p "$W"
  "$PY" "$ORACLE" make $arch "$W" >"$TMP/out" 2>"$TMP/err" && pass ||
    { fail "$arch: the transformers side failed"; tail -5 "$TMP/err"; continue; }
  cat "$TMP/out"
  expect_exit 0 "$DSC" import --list "$W/model" "$model"
  expect_grep 'model.safetensors' "$TMP/out"
  for run in sgd adamw; do
    expect_exit 0 "$DSC" train "$model" --init-from "$W/model" --data "$W/data" \
      --deepspeed "$W/$run.json" --batch 4 --seq 32 --grad-accum 1 --steps 1 --save-every 1 \
      --eval-every 0 --backend cpu --threads 2 --precision f32 --out "$W/$run" \
      --log "$W/$run.jsonl" --quiet
  done
  "$PY" "$ORACLE" check $arch "$W" && pass || fail "$arch: dsc differs from transformers"
  # export for transformers (the Llama in shards and an index), reload there
  expect_exit 0 "$DSC" export "$W/adamw" --format hf -o "$W/export" --max-shard-size 200KB
  expect_exit 0 "$DSC" train "$model" --init-from "$W/export" --data "$W/data" \
    --deepspeed "$W/sgd.json" --batch 4 --seq 32 --grad-accum 1 --steps 1 --save-every 0 \
    --eval-every 0 --backend cpu --threads 2 --precision f32 --log "$W/reimport.jsonl" --quiet
  "$PY" "$ORACLE" reload $arch "$W" && pass || fail "$arch: the export does not reload in transformers"
done
# Mistral's window into a model without one: refused
expect_exit 1 "$DSC" train "$SRC/examples/llama-tiny.dsm" --init-from "$TMP/mistral/model" \
  --data "$TMP/llama/data" --batch 4 --seq 32 --steps 1 --out "$TMP/never" --quiet &&
  expect_grep "config.json: error: sliding_window is 8, but the model's attention has window = 0" "$TMP/err"
# weights of the unscaled Llama into the scaled model, and back: refused
expect_exit 1 "$DSC" train "$TMP/llama3-tiny.dsm" --init-from "$TMP/llama/model" --data "$TMP/llama/data" \
  --batch 4 --seq 32 --steps 1 --out "$TMP/never" --quiet &&
  expect_grep "config.json: error: the rope scaling factor \(none\) is 1, but the model's rope has factor = 8" "$TMP/err"
expect_exit 1 "$DSC" train "$SRC/examples/llama-tiny.dsm" --init-from "$TMP/llama3/model" \
  --data "$TMP/llama/data" --batch 4 --seq 32 --steps 1 --out "$TMP/never" --quiet &&
  expect_grep "config.json: error: rope_scaling.factor is 8, but the model's rope has factor = 1" "$TMP/err"
finish
