# dsc train --deepspeed ds_config.json (issue 19 item 1): typical DeepSpeed
# configs train the tiny GPT with the same loss curve as the equivalent flags
# and train section; every error and warning names the key, its line and
# column; --print-config shows each setting's source.
source "$(dirname "$0")/lib/common.bash"
source "$(dirname "$0")/lib/corpus.bash"
MODEL="$SRC/examples/gpt-tiny.dsm"
make_corpus "$TMP/corpus.txt"
expect_exit 0 "$DSC" data "$TMP/corpus.txt" -o "$TMP/c"
RUN=(--data "$TMP/c" --seq 16 --steps 3 --eval-every 0 --quiet)

# losses FILE: the step losses of a run's log
losses() { grep -o '"loss":[^,}]*' "$1" | tr '\n' ' '; }
# same_curve NAME: the ds_config run and the flags run logged the same losses
same_curve() {
  local a b
  a=$(losses "$TMP/$1-ds.jsonl") b=$(losses "$TMP/$1-flags.jsonl")
  [ -n "$a" ] && [ "$a" = "$b" ] && pass || fail "$1: ds_config losses [$a], flags [$b]"
}
# variant NAME TRAIN-LINES...: gpt-tiny with its train section replaced (its
# schedule kept)
# (beside a copy of its imports)
cp -r "$SRC/examples/lib" "$TMP/lib"
variant() {
  local out="$TMP/$1.dsm"
  shift
  sed '/^train {/,$d' "$MODEL" >"$out"
  { echo "train {"; printf '  %s\n' "$@" "schedule = cosine(warmup = 50, min_lr = 3e-4)"; echo "}"; } >>"$out"
  echo "$out"
}

# 1. the batch triple: 8 sequences = micro x accumulation 2 x 2 ranks
cat >"$TMP/batch.json" <<'EOF'
{"train_batch_size": 8, "gradient_accumulation_steps": 2}
EOF
expect_exit 0 "$DSC" train "$MODEL" "${RUN[@]}" --ranks 2 --deepspeed "$TMP/batch.json" --log "$TMP/batch-ds.jsonl"
expect_exit 0 "$DSC" train "$MODEL" "${RUN[@]}" --ranks 2 --batch 2 --grad-accum 2 --log "$TMP/batch-flags.jsonl"
same_curve batch
expect_exit 0 "$DSC" train "$MODEL" "${RUN[@]}" --ranks 2 --deepspeed "$TMP/batch.json" --print-config
expect_grep '^  batch +2 +# .*batch.json:1 \(train_batch_size, DeepSpeed.s batch rule\)' "$TMP/out"
expect_grep '^  grad_accum +2 +# .*batch.json:1 \(gradient_accumulation_steps\)' "$TMP/out"
expect_grep '^  train_batch_size +8 ' "$TMP/out"
# a flag over the file: --grad-accum 4 contradicts 8 = 2 x 4 x 2? (micro 1)
expect_exit 0 "$DSC" train "$MODEL" "${RUN[@]}" --ranks 2 --deepspeed "$TMP/batch.json" --grad-accum 4 --print-config
expect_grep '^  batch +1 ' "$TMP/out"
expect_grep '^  grad_accum +4 +# flag --grad-accum' "$TMP/out"

# 2. AdamW + bf16 + ZeRO-3 with the optimizer states on the host
cat >"$TMP/z3.json" <<'EOF'
{
  "train_micro_batch_size_per_gpu": 2,
  "optimizer": {"type": "AdamW", "params": {"lr": 0.002, "betas": [0.9, 0.98], "eps": 1e-7, "weight_decay": 0.05}},
  "gradient_clipping": 0.5,
  "bf16": {"enabled": true},
  "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}
}
EOF
V=$(variant z3 "batch = 2, seq = 16" "optimizer = adamw(lr = 0.002, betas = (0.9, 0.98), eps = 1e-7, weight_decay = 0.05)" "clip = 0.5" "precision = bf16")
expect_exit 0 "$DSC" train "$MODEL" "${RUN[@]}" --ranks 2 --deepspeed "$TMP/z3.json" --log "$TMP/z3-ds.jsonl"
expect_exit 0 "$DSC" train "$V" "${RUN[@]}" --ranks 2 --zero-stage 3 --offload-optimizer host --log "$TMP/z3-flags.jsonl"
same_curve z3
expect_exit 0 "$DSC" train "$MODEL" "${RUN[@]}" --ranks 2 --deepspeed "$TMP/z3.json" --print-config
expect_grep '^  optimizer +adamw\(lr = 0.002, betas = \(0.9, 0.98\), eps = 1e-07, weight_decay = 0.05\) +# .*z3.json:3 \(optimizer\)' "$TMP/out"
expect_grep '^  zero.stage +3 +# .*z3.json:6 \(zero_optimization.stage\)' "$TMP/out"
expect_grep '^  offload.optimizer +host +# .*z3.json:6 \(zero_optimization.offload_optimizer.device\)' "$TMP/out"
expect_grep '^  precision +bf16 +# .*z3.json:5 \(bf16.enabled\)' "$TMP/out"
expect_grep '^  steps +3 +# flag --steps' "$TMP/out"
expect_grep '^  schedule +cosine.* # the model.s train section' "$TMP/out"

# --print-config needs no data, and dsc plan prints the same settings
expect_exit 0 "$DSC" train "$MODEL" --ranks 2 --deepspeed "$TMP/z3.json" --print-config
expect_grep '^  zero.stage +3 +# .*z3.json:6 \(zero_optimization.stage\)' "$TMP/out"
expect_exit 0 "$DSC" plan "$MODEL" --world 2 --deepspeed "$TMP/z3.json" --print-config --batch 4
expect_grep '^settings of .*gpt-tiny.dsm \(ds_config .*z3.json\), rank 0 of 2:' "$TMP/out"
expect_grep '^  zero.stage +3 +# .*z3.json:6 \(zero_optimization.stage\)' "$TMP/out"
expect_grep '^  batch +4 +# flag --batch' "$TMP/out"

# 3. fp16 with dynamic loss scaling and ZeRO-2 (the fp16 keys are train settings too)
cat >"$TMP/fp16.json" <<'EOF'
{"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 2},
 "fp16": {"enabled": true, "loss_scale": 0, "initial_scale_power": 12, "loss_scale_window": 2,
          "hysteresis": 1, "min_loss_scale": 0.5}}
EOF
V=$(variant fp16 "batch = 2, seq = 16" "optimizer = adamw(lr = 3e-3, betas = (0.9, 0.95), weight_decay = 0.1)" "clip = 1.0" "precision = fp16" "fp16 { initial_scale_power = 12, loss_scale_window = 2, hysteresis = 1, min_loss_scale = 0.5 }")
expect_exit 0 "$DSC" train "$MODEL" "${RUN[@]}" --ranks 2 --deepspeed "$TMP/fp16.json" --log "$TMP/fp16-ds.jsonl"
expect_exit 0 "$DSC" train "$V" "${RUN[@]}" --ranks 2 --zero-stage 2 --log "$TMP/fp16-flags.jsonl"
same_curve fp16

# 4. "auto" values (as Hugging Face's Trainer writes them): the model's values
cat >"$TMP/auto.json" <<'EOF'
{"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
 "gradient_accumulation_steps": "auto", "gradient_clipping": "auto",
 "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
 "bf16": {"enabled": "auto"}, "zero_optimization": {"stage": 2, "reduce_bucket_size": "auto"}}
EOF
expect_exit 0 "$DSC" train "$MODEL" "${RUN[@]}" --batch 2 --ranks 2 --deepspeed "$TMP/auto.json" --log "$TMP/auto-ds.jsonl"
expect_exit 0 "$DSC" train "$MODEL" "${RUN[@]}" --batch 2 --ranks 2 --zero-stage 2 --log "$TMP/auto-flags.jsonl"
same_curve auto
expect_exit 0 "$DSC" train "$MODEL" "${RUN[@]}" --batch 2 --ranks 2 --deepspeed "$TMP/auto.json" --print-config
expect_grep '^  auto: optimizer.params.lr: the model.s value' "$TMP/out"
expect_grep '^  lr +0.003 +# the model.s train section' "$TMP/out"
expect_grep '^  optimizer +adamw\(lr = 0.003, betas = \(0.9, 0.95\), eps = 1e-08, weight_decay = 0.1\)' "$TMP/out"

# 5. ZeRO-Infinity: optimizer states and param shards on NVMe (nvme_path is the offload dir)
mkdir -p "$TMP/nvme"
cat >"$TMP/nvme.json" <<EOF
{"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 3,
  "offload_optimizer": {"device": "nvme", "nvme_path": "$TMP/nvme"},
  "offload_param": {"device": "nvme", "nvme_path": "$TMP/nvme"}}}
EOF
expect_exit 0 "$DSC" train "$MODEL" "${RUN[@]}" --ranks 2 --deepspeed "$TMP/nvme.json" --log "$TMP/nvme-ds.jsonl"
expect_exit 0 "$DSC" train "$MODEL" "${RUN[@]}" --ranks 2 --batch 2 --zero-stage 3 --offload-optimizer disk \
  --offload-param disk --offload-dir "$TMP/nvme" --log "$TMP/nvme-flags.jsonl"
same_curve nvme

# DeepSpeed's schedulers, step for step: the lr each step logs (f32) against
# DeepSpeed's formulas computed on their own (lib/ds_lr.py), for each
# scheduler, both warmup types, past the end of the decay
sched_case() { # NAME SCHEDULER-JSON
  printf '{"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "AdamW", "params": {"lr": 0.004}},\n "scheduler": %s}\n' "$2" >"$TMP/$1.json"
  expect_exit 0 "$DSC" train "$MODEL" --data "$TMP/c" --seq 16 --steps 14 --eval-every 0 --quiet \
    --deepspeed "$TMP/$1.json" --log "$TMP/$1.jsonl" || return
  python3 "$(dirname "$0")/lib/ds_lr.py" "$TMP/$1.json" 0.004 14 >"$TMP/$1.want"
  python3 - "$TMP/$1.jsonl" "$TMP/$1.want" <<'PY' && pass || fail "$1: the lr differs from DeepSpeed's"
import json, struct, sys
got = [json.loads(l)["lr"] for l in open(sys.argv[1])]
want = [float(l) for l in open(sys.argv[2])]
f32 = lambda x: struct.unpack("f", struct.pack("f", x))[0]
assert len(got) == len(want) == 14, (len(got), len(want))
for k, (g, w) in enumerate(zip(got, want)):
    assert abs(g - f32(w)) <= 1e-7 * abs(w) + 1e-12, ("step", k + 1, g, w)
PY
}
sched_case warmup_log '{"type": "WarmupLR", "params": {"warmup_min_lr": 0.0005, "warmup_max_lr": 0.003, "warmup_num_steps": 5}}'
sched_case warmup_lin '{"type": "WarmupLR", "params": {"warmup_max_lr": 0.002, "warmup_num_steps": 6, "warmup_type": "linear"}}'
sched_case decay '{"type": "WarmupDecayLR", "params": {"warmup_min_lr": 0.0001, "warmup_max_lr": 0.003, "warmup_num_steps": 4, "total_num_steps": 10, "warmup_type": "linear"}}'
sched_case decay_log '{"type": "WarmupDecayLR", "params": {"warmup_num_steps": 1, "total_num_steps": 12}}'
sched_case cosine '{"type": "WarmupCosineLR", "params": {"total_num_steps": 11, "warmup_num_steps": 3, "warmup_min_ratio": 0.1, "cos_min_ratio": 0.05}}'
sched_case cosine_lin '{"type": "WarmupCosineLR", "params": {"total_num_steps": 9, "warmup_num_steps": 4, "warmup_type": "linear"}}'
# "auto" (Hugging Face): the max lr is the optimizer's, the total the run's steps
sched_case decay_auto '{"type": "WarmupDecayLR", "params": {"warmup_max_lr": "auto", "warmup_num_steps": 3, "total_num_steps": "auto"}}'
expect_exit 0 "$DSC" train "$MODEL" "${RUN[@]}" --deepspeed "$TMP/decay.json" --print-config
expect_grep '^  schedule +warmup_decay_lr\(warmup = 4, min_lr = 0.0001, decay_steps = 10, warmup_type = linear\) +# .*decay.json:2 \(scheduler\)' "$TMP/out"
expect_grep '^  lr +0.003 +# .*decay.json:2 \(scheduler.params.warmup_max_lr\)' "$TMP/out"
# OneCycle: symmetric halves (the second None: the first's), stairs,
# asymmetric halves with the decay after the cycle, "auto" max lr; the
# second stair count null is the first's
sched_case cycle '{"type": "OneCycle", "params": {"cycle_min_lr": 0.0005, "cycle_max_lr": 0.003, "cycle_first_step_size": 4, "cycle_momentum": false}}'
sched_case cycle_stairs '{"type": "OneCycle", "params": {"cycle_min_lr": 0.0001, "cycle_max_lr": 0.002, "cycle_first_step_size": 6, "cycle_second_step_size": 3, "cycle_first_stair_count": 3, "cycle_second_stair_count": 2, "cycle_momentum": false}}'
sched_case cycle_decay '{"type": "OneCycle", "params": {"cycle_min_lr": 0.0002, "cycle_max_lr": "auto", "cycle_first_step_size": 2, "cycle_second_step_size": 5, "cycle_first_stair_count": 2, "cycle_second_stair_count": null, "decay_step_size": 3, "decay_lr_rate": 0.25}}'
sched_case cycle_nodecay '{"type": "OneCycle", "params": {"cycle_min_lr": 0.0002, "cycle_max_lr": 0.001, "cycle_first_step_size": 3, "cycle_second_step_size": 1, "decay_step_size": 2, "decay_lr_rate": 0}}'
# LRRangeTest: continuous, and staircase from DeepSpeed's default min lr
sched_case range '{"type": "LRRangeTest", "params": {"lr_range_test_min_lr": 0.0002, "lr_range_test_step_size": 3, "lr_range_test_step_rate": 0.5}}'
sched_case range_stairs '{"type": "LRRangeTest", "params": {"lr_range_test_step_size": 4, "lr_range_test_step_rate": 2, "lr_range_test_staircase": true}}'
expect_exit 0 "$DSC" train "$MODEL" "${RUN[@]}" --deepspeed "$TMP/cycle_stairs.json" --print-config
expect_grep '^  schedule +one_cycle\(min_lr = 0.0001, first_steps = 6, second_steps = 3, first_stairs = 3, second_stairs = 2, decay_step_size = 0, decay_lr_rate = 0.0\) +# .*cycle_stairs.json:2 \(scheduler\)' "$TMP/out"
expect_grep '^  lr +0.002 +# .*cycle_stairs.json:2 \(scheduler.params.cycle_max_lr\)' "$TMP/out"
expect_exit 0 "$DSC" train "$MODEL" "${RUN[@]}" --deepspeed "$TMP/range_stairs.json" --print-config
expect_grep '^  schedule +lr_range_test\(step_size = 4, step_rate = 2.0, staircase = true\) +# .*range_stairs.json:2 \(scheduler\)' "$TMP/out"
expect_grep '^  lr +0.001 +# .*range_stairs.json:2 \(scheduler.params.lr_range_test_min_lr\)' "$TMP/out"
# the train section's one_cycle(...) and lr_range_test(...) give the same lr
# curve as the ds_config's OneCycle and LRRangeTest
section_lr() { # NAME SCHEDULE LR: gpt-tiny with that schedule trains the lr of $NAME.json
  local out="$TMP/$1-section.dsm"
  sed '/^train {/,$d' "$MODEL" >"$out"
  printf 'train {\n  optimizer = adamw(lr = %s)\n  schedule = %s\n}\n' "$3" "$2" >>"$out"
  expect_exit 0 "$DSC" train "$out" --data "$TMP/c" --batch 2 --seq 16 --steps 14 --eval-every 0 \
    --quiet --log "$TMP/$1-section.jsonl" || return
  local a b
  a=$(grep -o '"lr":[^,}]*' "$TMP/$1.jsonl" | tr '\n' ' ') b=$(grep -o '"lr":[^,}]*' "$TMP/$1-section.jsonl" | tr '\n' ' ')
  [ -n "$a" ] && [ "$a" = "$b" ] && pass || fail "$1: ds_config lr [$a], train section lr [$b]"
}
section_lr cycle_decay "one_cycle(min_lr = 2e-4, first_steps = 2, second_steps = 5, first_stairs = 2, decay_step_size = 3, decay_lr_rate = 0.25)" 0.004
section_lr range_stairs "lr_range_test(step_size = 4, step_rate = 2, staircase = true)" 1e-3

# dsc plan --deepspeed: DeepSpeed's estimators beside the exact plan, for
# Psi = 120576 (gpt-tiny) and its largest layer wte (256 x 64) at 2 GPUs
expect_exit 0 "$DSC" plan "$MODEL" --world 2 --deepspeed "$TMP/z3.json" --bytes
expect_grep "for Psi = 120576$" "$TMP/out"
expect_grep "^and the largest layer wte \(16384 params, 4 bytes each: 65536 B\) on 1 node x 2 GPUs," "$TMP/out"
PSI=120576 L=16384
ds_row() { # STAGE PARAM OPT ZI CPU GPU STATES: the row's DeepSpeed figures and dsc's model states
  expect_grep "^$1 +$2 +$3 +$4 +\| +$5 B +$6 B \| +[0-9]+ B +$7 B " "$TMP/out"
}
# stage 2: offload: cpu Psi x max(4 x 2, 16) x 1.5, gpu 2 Psi; none: cpu 4 Psi x 2 x 1.5, gpu 4 Psi + 16 Psi / 2
ds_row 2 - cpu - $((PSI * 16 * 3 / 2)) $((2 * PSI)) $((2 * PSI + PSI))
ds_row 2 - none - $((PSI * 4 * 2 * 3 / 2)) $((4 * PSI + 8 * PSI)) $((2 * PSI + 14 * PSI / 2 + 4))
# stage 3 without offload, zero_init: cpu 4 x largest x 2 x 1.5, gpu 4 x largest + 18 Psi / 2
ds_row 3 none none 1 $((4 * L * 2 * 3 / 2)) $((4 * L + 9 * PSI)) $((16 * PSI / 2 + 4))
# stage 3, everything on the CPU: cpu 18 Psi x 1.5, gpu the largest layer
ds_row 3 cpu cpu 1 $((18 * PSI * 3 / 2)) $((4 * L)) $((2 * PSI / 2)) # dsc: the grads on the device
expect_grep "^The terms that differ: DeepSpeed's per GPU is model states alone" "$TMP/out"

# 6. errors: each names the file, the line and column, and the key
err_case() { # NAME TEXT PATTERN
  printf '%s\n' "$2" >"$TMP/$1.json"
  expect_exit 1 "$DSC" train "$MODEL" "${RUN[@]}" --deepspeed "$TMP/$1.json" --print-config &&
    expect_grep "$3" "$TMP/err"
}
err_case syntax $'{\n  "zero_optimization" {"stage": 2}\n}' 'syntax.json:2:23: error: .*syntax.json is not valid JSON \(at line 2, column 23\)'
err_case trailing '{"zero_optimization": {"stage": 2}}}' 'trailing.json:1:36: error: .*is not valid JSON'
err_case unknown $'{\n  "zero_optimisation": {"stage": 2}\n}' "unknown.json:2:3: error: unknown ds_config key 'zero_optimisation'; did you mean 'zero_optimization'\\?"
err_case nested '{"zero_optimization": {"stag": 2}}' "nested.json:1:24: error: unknown ds_config key 'zero_optimization.stag'; did you mean 'stage'\\?"
err_case type '{"gradient_clipping": "1.0"}' "type.json:1:2: error: ds_config 'gradient_clipping' must be a non-negative number or \"auto\", got \"1.0\" \\(a string\\)"
err_case stage '{"zero_optimization": {"stage": 4}}' "ds_config zero_optimization.stage must be 0, 1, 2 or 3, got 4"
err_case triple '{"train_batch_size": 10, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2}' \
  "train_batch_size 10 is not train_micro_batch_size_per_gpu 2 x gradient_accumulation_steps 2 x world 1 = 4 \\(DeepSpeed's rule\\)"
err_case divide '{"train_batch_size": 9, "train_micro_batch_size_per_gpu": 2}' \
  "train_batch_size 9 is not divisible by train_micro_batch_size_per_gpu 2 x world 1 = 2"
err_case opt '{"optimizer": {"type": "Lamb"}}' "optimizer type 'Lamb' is not one dsc implements \\(Adam, AdamW, SGD, Muon\\)"
err_case l2 '{"optimizer": {"type": "Adam", "params": {"weight_decay": 0.1, "adam_w_mode": false}}}' "Adam with adam_w_mode false \\(L2 weight decay in the gradient\\) is not implemented"
err_case static '{"fp16": {"enabled": true, "loss_scale": 128}}' "fp16 static loss_scale 128 is not implemented in dsc; 0 \\(dynamic scaling\\) is"
err_case both '{"fp16": {"enabled": true}, "bf16": {"enabled": true}}' "ds_config enables both bf16 and fp16"
err_case device '{"zero_optimization": {"offload_param": {"device": "gpu"}}}' "'zero_optimization.offload_param.device' must be one of \"none\", \"cpu\", \"nvme\", got \"gpu\""
err_case array '[1, 2]' "a ds_config is a JSON object, got an array"
err_case sched '{"scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 5}}}' "scheduler WarmupDecayLR needs params.total_num_steps"
err_case schedtype '{"scheduler": {"type": "StepLR"}}' "scheduler type 'StepLR' is not one dsc implements \\(WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle, LRRangeTest\\)"
err_case schedkey '{"scheduler": {"type": "WarmupLR", "params": {"warmup_max_lrr": 1}}}' "unknown ds_config key 'scheduler.params.warmup_max_lrr'; did you mean 'warmup_max_lr'\\?"
err_case optobj '{"optimizer": "AdamW"}' "ds_config 'optimizer' must be an object, got \"AdamW\" \\(a string\\)"
err_case opttype '{"optimizer": {"params": {"lr": 0.1}}}' "ds_config 'optimizer' needs a \"type\" \\(Adam, AdamW, SGD or Muon\\)"
err_case bias '{"optimizer": {"type": "Adam", "params": {"bias_correction": false}}}' "Adam without bias correction is not implemented in dsc"
err_case sgdbetas '{"optimizer": {"type": "SGD", "params": {"betas": [0.9, 0.99]}}}' "ds_config optimizer SGD has no betas or eps"
err_case adammom '{"optimizer": {"type": "AdamW", "params": {"momentum": 0.9}}}' "ds_config optimizer AdamW has no momentum \\(it has betas\\)"
err_case adamnest '{"optimizer": {"type": "AdamW", "params": {"nesterov": true}}}' "ds_config optimizer AdamW has no nesterov"
err_case betas '{"optimizer": {"type": "AdamW", "params": {"betas": [0.9]}}}' "'optimizer.params.betas' must be an array of two numbers in \\[0, 1\\)"
err_case schedtype2 '{"scheduler": {"params": {}}}' "ds_config 'scheduler' needs a \"type\""
err_case lbi '{"scheduler": {"type": "WarmupLR", "params": {"last_batch_iteration": 5}}}' "last_batch_iteration other than -1 is not implemented"
err_case wtype '{"scheduler": {"type": "WarmupLR", "params": {"warmup_type": "exp"}}}' "'scheduler.params.warmup_type' must be \"log\" or \"linear\""
err_case costotal '{"scheduler": {"type": "WarmupCosineLR", "params": {}}}' "scheduler WarmupCosineLR needs params.total_num_steps"
err_case cycmin '{"scheduler": {"type": "OneCycle", "params": {"cycle_max_lr": 0.01}}}' "cycmin.json:1:2: error: ds_config scheduler OneCycle needs params.cycle_min_lr \\(DeepSpeed's OneCycle has no default for it; \"auto\": the model's min_lr\\)"
err_case cycmax '{"scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 0.01}}}' "ds_config scheduler OneCycle needs params.cycle_max_lr \\(DeepSpeed's OneCycle has no default for it; \"auto\": the optimizer's lr\\)"
err_case cycnone '{"scheduler": {"type": "OneCycle"}}' "OneCycle needs params.cycle_min_lr"
err_case cycfirst '{"scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 0, "cycle_max_lr": 1, "cycle_first_step_size": 0}}}' "'scheduler.params.cycle_first_step_size' must be an integer >= 1, got 0 \\(a number\\)"
err_case cycsecond '{"scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 0, "cycle_max_lr": 1, "cycle_second_step_size": -1}}}' "'scheduler.params.cycle_second_step_size' must be an integer >= 0, got -1"
err_case cycstairs '{"scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 0, "cycle_max_lr": 1, "cycle_first_stair_count": 1.5}}}' "'scheduler.params.cycle_first_stair_count' must be an integer >= 0, got 1.5"
err_case cycdecay '{"scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 0, "cycle_max_lr": 1, "decay_step_size": "2"}}}' "'scheduler.params.decay_step_size' must be an integer >= 0, got \"2\" \\(a string\\)"
err_case cycrate '{"scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 0, "cycle_max_lr": 1, "decay_lr_rate": -0.5}}}' "'scheduler.params.decay_lr_rate' must be a non-negative number, got -0.5"
err_case cyclr '{"scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": [0.1], "cycle_max_lr": 1}}}' "'scheduler.params.cycle_min_lr' must be a non-negative number, got \\[0.1\\] \\(an array\\)"
err_case cycmom '{"scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 0, "cycle_max_lr": 1, "cycle_momentum": "yes"}}}' "'scheduler.params.cycle_momentum' must be true or false, got \"yes\""
err_case cycmommin '{"scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 0, "cycle_max_lr": 1, "cycle_min_mom": "low"}}}' "'scheduler.params.cycle_min_mom' must be a non-negative number"
err_case cyckey '{"scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 0, "cycle_max_lr": 1, "cycle_first_stair_cont": 2}}}' "unknown ds_config key 'scheduler.params.cycle_first_stair_cont'; did you mean 'cycle_first_stair_count'\\?"
err_case cycwarm '{"scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 0, "cycle_max_lr": 1, "warmup_num_steps": 2}}}' "unknown ds_config key 'scheduler.params.warmup_num_steps'"
err_case cyclbi '{"scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 0, "cycle_max_lr": 1, "last_batch_iteration": 3}}}' "last_batch_iteration other than -1 is not implemented"
err_case rangesize '{"scheduler": {"type": "LRRangeTest", "params": {"lr_range_test_step_size": 0}}}' "'scheduler.params.lr_range_test_step_size' must be an integer >= 1, got 0"
err_case rangerate '{"scheduler": {"type": "LRRangeTest", "params": {"lr_range_test_step_rate": "fast"}}}' "'scheduler.params.lr_range_test_step_rate' must be a non-negative number, got \"fast\""
err_case rangemin '{"scheduler": {"type": "LRRangeTest", "params": {"lr_range_test_min_lr": -1}}}' "'scheduler.params.lr_range_test_min_lr' must be a non-negative number, got -1"
err_case rangestair '{"scheduler": {"type": "LRRangeTest", "params": {"lr_range_test_staircase": 1}}}' "'scheduler.params.lr_range_test_staircase' must be true or false, got 1 \\(a number\\)"
err_case rangekey '{"scheduler": {"type": "LRRangeTest", "params": {"lr_range_test_step_sise": 2}}}' "unknown ds_config key 'scheduler.params.lr_range_test_step_sise'; did you mean 'lr_range_test_step_size'\\?"
# the train section's one_cycle needs min_lr too
printf 'train {\n  schedule = one_cycle(first_steps = 4)\n}\n' >"$TMP/nomin-section.dsm"
sed '/^train {/,$d' "$MODEL" >"$TMP/nomin.dsm" && cat "$TMP/nomin-section.dsm" >>"$TMP/nomin.dsm"
expect_exit 1 "$DSC" train "$TMP/nomin.dsm" "${RUN[@]}" --batch 2 &&
  expect_grep "one_cycle needs min_lr \\(DeepSpeed's cycle_min_lr, which has no default\\)" "$TMP/err"
printf 'train {\n  schedule = lr_range_test(staircase = 1)\n}\n' >"$TMP/stair-section.dsm"
sed '/^train {/,$d' "$MODEL" >"$TMP/stair.dsm" && cat "$TMP/stair-section.dsm" >>"$TMP/stair.dsm"
expect_exit 1 "$DSC" train "$TMP/stair.dsm" "${RUN[@]}" --batch 2 &&
  expect_grep "setting 'staircase' of 'lr_range_test' must be true or false" "$TMP/err"
err_case nvme '{"zero_optimization": {"offload_param": {"device": "nvme", "nvme_path": ""}}}' "'zero_optimization.offload_param.nvme_path' must be a directory path"
err_case steps '{"steps_per_print": 0}' "ds_config 'steps_per_print' must be an integer >= 1"
# a .dsx holds its settings compiled in
if "$DSC" compile "$MODEL" --batch 2 --seq 16 -o "$TMP/tiny.dsx" >/dev/null 2>&1; then
  expect_exit 1 "$DSC" train "$TMP/tiny.dsx" "${RUN[@]}" --deepspeed "$TMP/batch.json" &&
    expect_grep "a .dsx program holds its settings compiled in; --deepspeed applies to a model file" "$TMP/err"
fi
expect_exit 1 "$DSC" train "$MODEL" "${RUN[@]}" --deepspeed "$TMP" &&
  expect_grep "is a directory|not a regular file" "$TMP/err"
expect_exit 1 "$DSC" train "$MODEL" "${RUN[@]}" --deepspeed "$TMP/none.json" &&
  expect_grep "cannot open .*none.json" "$TMP/err"
expect_exit 1 "$DSC" train "$MODEL" "${RUN[@]}" --deepspeed && expect_grep "deepspeed needs a ds_config.json file" "$TMP/err"

# 7. warnings: DeepSpeed keys dsc does not use or has not implemented yet,
# each with what dsc does instead; keys that are off stay silent
cat >"$TMP/warn.json" <<'EOF'
{"comms_logger": {"enabled": true}, "tensorboard": {"enabled": false}, "prescale_gradients": false,
 "zero_optimization": {"stage": 2, "overlap_comm": true, "zero_quantized_gradients": true},
 "scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 0.0001, "cycle_max_lr": 0.001}}}
EOF
expect_exit 0 "$DSC" train "$MODEL" "${RUN[@]}" --deepspeed "$TMP/warn.json" --print-config
expect_grep "warn.json:1:2: warning: ds_config 'comms_logger' is not implemented in dsc yet: --trace records every collective" "$TMP/err"
expect_grep "warning: ds_config 'zero_optimization.overlap_comm' has no effect in dsc: the schedule pass always overlaps" "$TMP/err"
expect_grep "warning: ds_config 'zero_optimization.zero_quantized_gradients' is not implemented in dsc yet: ZeRO\\+\\+" "$TMP/err"
expect_grep "warn.json:3:16: warning: ds_config 'scheduler.params.cycle_momentum' \\(DeepSpeed's default: true\\) is not implemented in dsc: DeepSpeed's OneCycle would cycle Adam's beta1 between cycle_max_mom 0.9 and cycle_min_mom 0.8 and set beta2 to 0.99; dsc keeps the optimizer's betas \\(0.9, 0.95\\) fixed \\(set \"cycle_momentum\": false to silence this\\)" "$TMP/err"
grep -q "'tensorboard'\|'prescale_gradients'" "$TMP/err" && fail "a key that is off warned" || pass
# 8. wall_clock_breakdown: DeepSpeed's two timer lines after every step (rank
# 0), the same figures in the log; at 2 ranks the gradients' reduce-scatters
# are bwd_allreduce; with grad_accum the microstep line is the mean
cat >"$TMP/wcb.json" <<'EOF'
{"wall_clock_breakdown": true, "zero_optimization": {"stage": 2}, "gradient_accumulation_steps": 2}
EOF
expect_exit 0 "$DSC" train "$MODEL" --data "$TMP/c" --seq 16 --steps 3 --eval-every 0 --ranks 2 \
  --deepspeed "$TMP/wcb.json" --log "$TMP/wcb.jsonl"
num='[0-9]+\.[0-9]{2}'
[ "$(grep -cE "^\[Rank 0\] time \(ms\) \| fwd_microstep: $num \| bwd_microstep: $num \| bwd_inner_microstep: $num \| bwd_allreduce_microstep: $num \| step_microstep: $num$" "$TMP/out")" = 3 ] &&
  [ "$(grep -cE "^\[Rank 0\] time \(ms\) \| fwd: $num \| bwd: $num \| bwd_inner: $num \| bwd_allreduce: $num \| step: $num$" "$TMP/out")" = 3 ] &&
  pass || fail "wall_clock_breakdown: not two timer lines per step: $(cat "$TMP/out")"
# the log's figures: every phase timed, bwd = bwd_inner + bwd_allreduce, the
# phases within the step's time; the printed line is the log's
python3 - "$TMP/wcb.jsonl" "$TMP/out" <<'PY' && pass || fail "wall_clock_breakdown figures"
import json, re, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
lines = [l for l in open(sys.argv[2]) if l.startswith("[Rank 0] time (ms) | fwd: ")]
assert len(rows) == 3 and len(lines) == 3, (rows, lines)
for r, l in zip(rows, lines):
    for k in ("fwd_ms", "bwd_ms", "bwd_inner_ms", "bwd_allreduce_ms", "step_ms"):
        assert r[k] > 0, (k, r)
    assert abs(r["bwd_ms"] - r["bwd_inner_ms"] - r["bwd_allreduce_ms"]) < 0.01, r
    total = r["fwd_ms"] + r["bwd_ms"] + r["step_ms"]
    assert total <= r["ms"] * 1.01 + 0.1, (total, r)
    got = [float(x) for x in re.findall(r": ([0-9.]+)", l)]
    want = [r["fwd_ms"], r["bwd_ms"], r["bwd_inner_ms"], r["bwd_allreduce_ms"], r["step_ms"]]
    assert all(abs(a - b) <= 0.006 for a, b in zip(got, want)), (got, want)
PY
# the microstep line: the step's figures over its 2 micro-batches (step's whole)
python3 - "$TMP/out" <<'PY' && pass || fail "wall_clock_breakdown microstep means"
import re, sys
ls = [l for l in open(sys.argv[1]) if l.startswith("[Rank 0] time (ms)")]
assert len(ls) == 6, ls
for micro, whole in zip(ls[0::2], ls[1::2]):
    m = [float(x) for x in re.findall(r": ([0-9.]+)", micro)]
    w = [float(x) for x in re.findall(r": ([0-9.]+)", whole)]
    assert all(abs(a - b / 2) <= 0.011 for a, b in zip(m[:4], w[:4])) and abs(m[4] - w[4]) <= 0.011, (m, w)
PY
# one rank: no reduction, so no bwd_allreduce; the train section's key
expect_exit 0 "$DSC" train "$(variant wcb "batch = 2" "wall_clock_breakdown = true")" --data "$TMP/c" --seq 16 --steps 2 --eval-every 0 --log "$TMP/wcb1.jsonl"
grep -q '"bwd_allreduce_ms":0.000' "$TMP/wcb1.jsonl" && grep -q '"step_ms":' "$TMP/wcb1.jsonl" &&
  pass || fail "wall_clock_breakdown from the train section at one rank: $(cat "$TMP/wcb1.jsonl")"
# the flag; --quiet prints no timer lines
expect_exit 0 "$DSC" train "$MODEL" "${RUN[@]}" --wall-clock-breakdown true --log "$TMP/wcb2.jsonl"
grep -q '"fwd_ms":' "$TMP/wcb2.jsonl" && pass || fail "--wall-clock-breakdown true logs no phases"
grep -q 'time (ms)' "$TMP/out" && fail "--quiet printed the timer lines" || pass
expect_exit 0 "$DSC" train "$MODEL" "${RUN[@]}" --wall-clock-breakdown false --deepspeed "$TMP/wcb.json" --print-config
expect_grep '^  wall_clock_breakdown +false +# flag --wall-clock-breakdown' "$TMP/out"
expect_exit 0 "$DSC" train "$MODEL" "${RUN[@]}" --deepspeed "$TMP/wcb.json" --print-config
expect_grep '^  wall_clock_breakdown +true +# .*wcb.json:1' "$TMP/out"
# a compiled program: the phases come from the graph's shape, so a .dsx has them
if "$DSC" compile "$MODEL" --batch 2 --seq 16 -o "$TMP/wcb.dsx" >/dev/null 2>&1; then
  expect_exit 0 "$DSC" train "$TMP/wcb.dsx" --data "$TMP/c" --steps 2 --eval-every 0 --quiet \
    --wall-clock-breakdown true --log "$TMP/wcb3.jsonl"
  python3 -c 'import json,sys; r=[json.loads(l) for l in open(sys.argv[1])]; assert r and all(x["fwd_ms"]>0 and x["bwd_ms"]>0 and x["step_ms"]>0 for x in r)' "$TMP/wcb3.jsonl" &&
    pass || fail "wall_clock_breakdown of a .dsx: $(cat "$TMP/wcb3.jsonl")"
fi
# the interpreter times nothing: a warning, and training goes on
expect_exit 0 "$DSC" train "$MODEL" "${RUN[@]}" --backend interp --steps 1 --wall-clock-breakdown true
expect_grep "warning: wall_clock_breakdown: the interp backend times no instructions, so no breakdown is printed" "$TMP/err"
err_case wcbtype '{"wall_clock_breakdown": "yes"}' "'wall_clock_breakdown' must be true, false or \"auto\""
# 9. fp16: a step skipped for an overflow does not step the schedule, as
# DeepSpeed's engine does not step its lr scheduler then (a scale of 2^17
# overflows the tiny GPT's first steps); a resumed run keeps the count
cat >"$TMP/skip.json" <<'EOF'
{"fp16": {"enabled": true, "initial_scale_power": 17, "hysteresis": 1},
 "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 8, "warmup_type": "linear", "warmup_max_lr": 0.004}}}
EOF
SKIP=(--data "$TMP/c" --seq 16 --batch 2 --steps 10 --eval-every 0 --quiet --deepspeed "$TMP/skip.json")
expect_exit 0 "$DSC" train "$MODEL" "${SKIP[@]}" --log "$TMP/skip.jsonl"
python3 "$(dirname "$0")/lib/ds_lr.py" "$TMP/skip.json" 0.004 10 >"$TMP/skip.want"
python3 - "$TMP/skip.jsonl" "$TMP/skip.want" <<'PY' && pass || fail "fp16 skipped steps and the schedule"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
want = [float(x) for x in open(sys.argv[2])]
skipped = 0
for r in rows:  # step k runs at the scheduler's iteration of step k - skipped so far
    w = want[r["step"] - skipped - 1]
    assert abs(r["lr"] - w) <= 1e-7 * max(w, 1e-3), (r, w, skipped)
    skipped += bool(r.get("skipped"))
assert 0 < skipped < len(rows) - 3, skipped  # some skipped, then steps that update
PY
expect_exit 0 "$DSC" train "$MODEL" "${SKIP[@]}" --out "$TMP/skip-out" --stop-at 4 --log "$TMP/skip-a.jsonl"
grep -q '"skipped_steps":' "$TMP/skip-out/step-000004/state.json" && pass || fail "no skipped_steps in the checkpoint"
expect_exit 0 "$DSC" train "$MODEL" --resume "$TMP/skip-out" --data "$TMP/c" --quiet --deepspeed "$TMP/skip.json" \
  --log "$TMP/skip-b.jsonl"
a=$(cat "$TMP/skip-a.jsonl" "$TMP/skip-b.jsonl" | grep -o '"lr":[^,]*' | tr '\n' ' ')
b=$(grep -o '"lr":[^,]*' "$TMP/skip.jsonl" | tr '\n' ' ')
[ -n "$a" ] && [ "$a" = "$b" ] && pass || fail "resumed lrs [$a], uninterrupted [$b]"
sed -i 's/"skipped_steps":[^,}]*/"skipped_steps":\t"99"/' "$TMP/skip-out/step-000004/state.json"
expect_exit 1 "$DSC" train "$MODEL" --resume "$TMP/skip-out/step-000004" --data "$TMP/c" --quiet &&
  expect_grep "malformed checkpoint state: \"skipped_steps\" is '99' \(0 to the step, 4\)" "$TMP/err"
# cycle_momentum given true: the warning points at it, with the file's momenta
# and the optimizer's betas; false, or SGD (DeepSpeed cycles only betas), is silent
mom_case() { # NAME OPTIMIZER-JSON CYCLE-PARAMS
  printf '{"optimizer": %s,\n "scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 0.0001, "cycle_max_lr": 0.001%s}}}\n' "$2" "$3" >"$TMP/$1.json"
  expect_exit 0 "$DSC" train "$MODEL" "${RUN[@]}" --deepspeed "$TMP/$1.json" --print-config
}
mom_case mom_on '{"type": "Adam", "params": {"betas": [0.8, 0.9]}}' ',
   "cycle_momentum": true, "cycle_min_mom": 0.85, "cycle_max_mom": 0.95'
expect_grep "mom_on.json:3:4: warning: ds_config 'scheduler.params.cycle_momentum' .*between cycle_max_mom 0.95 and cycle_min_mom 0.85 .*betas \\(0.8, 0.9\\) fixed" "$TMP/err"
mom_case mom_off '{"type": "AdamW"}' ', "cycle_momentum": false'
grep -q "cycle_momentum" "$TMP/err" && fail "cycle_momentum false warned" || pass
mom_case mom_sgd '{"type": "SGD", "params": {"momentum": 0.9}}' ''
grep -q "cycle_momentum" "$TMP/err" && fail "OneCycle with SGD warned of cycle_momentum" || pass
finish
