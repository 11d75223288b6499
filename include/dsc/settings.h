/* dsc public API: the settings schema (passes/settings.c; docs/training.md
 * "Settings and schedules").
 *
 * One table lists every key of a model's train section: its kind, its
 * range, the dsc_train_config field it sets and, for the run knobs that
 * dsc train, dsc plan and the auto-configuration override, the CLI flag and
 * the dsc_run_knobs field. The frontend checks a train section's values
 * with it, dsc_train_config_from_module reads the module's train.* metadata
 * with it, the CLI parses the flags with it, and dsc_run_knobs_apply
 * range-checks library callers' knobs with it: each value is parsed and
 * range-checked by one function, dsc_setting_parse. */
#ifndef DSC_SETTINGS_H
#define DSC_SETTINGS_H

#include <stddef.h>

#include "dsc/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Where a value lives (module meta "tier.<name>"; pass "offload"). */
typedef enum {
  DSC_OFFLOAD_NONE = 0, /* the device (on CPU-only runs: the device's arenas) */
  DSC_OFFLOAD_HOST = 1, /* host memory, an arena of its own */
  DSC_OFFLOAD_DISK = 2, /* a file per rank under the offload dir, two slots per value */
  /* --offload-optimizer/--offload-param auto (DeepCompile's adaptive
   * offloading, driver/offload_auto.c): only the values the memory budget
   * requires move, each to the tier given in dsc_train_config.offload.values */
  DSC_OFFLOAD_AUTO = 3,
} dsc_offload_tier;

typedef enum {
  DSC_REMAT_NONE = 0,
  DSC_REMAT_SELECTIVE = 1, /* recompute the cheap forward values */
  DSC_REMAT_BLOCKS = 2,    /* keep block inputs (every remat_every-th), recompute the rest */
  DSC_REMAT_OFFLOAD = 3,   /* copy the kept forward values to the host and back (to_host /
                            * to_device; passes/offload_host.c) instead of recomputing */
} dsc_remat_policy;

/* A switch that may also be left to the machine (train.offload.overlap). */
typedef enum {
  DSC_SWITCH_FALSE = 0,
  DSC_SWITCH_TRUE = 1,
  DSC_SWITCH_AUTO = 2, /* decided where the facts are known (the executor) */
} dsc_switch;
/* "false", "true", "auto"; NULL for another value. */
const char *dsc_switch_name(dsc_switch s);

/* The run knobs: the settings dsc train, dsc plan and the auto-configuration
 * take over the model's train section (embedded as `knobs` in
 * dsc_trainer_options, dsc_plan_options and dsc_autocfg_candidate). Each
 * value counts where its has_ flag is set; dsc_run_knobs_apply range-checks
 * and applies them. */
typedef struct {
  bool has_global_batch; /* sequences per step (DeepSpeed's train_batch_size) */
  int64_t global_batch;
  bool has_zero_stage; /* 0-3 */
  int64_t zero_stage;
  bool has_prefetch_bytes, has_bucket_bytes, has_persist_threshold, has_unshard_bytes;
  int64_t prefetch_bytes, bucket_bytes, persist_threshold, unshard_bytes;
  bool has_remat; /* activation checkpointing; remat_every: blocks:K */
  dsc_remat_policy remat;
  int64_t remat_every;
  bool has_offload_optimizer, has_offload_param;
  dsc_offload_tier offload_optimizer, offload_param;
  /* the disk tier's streaming */
  bool has_offload_prefetch_bytes, has_offload_io_threads;
  int64_t offload_prefetch_bytes, offload_io_threads;
  /* grad_accum > 1 at stages 2-3: reduce-scatter every micro-batch (true) or once per step */
  bool has_reduce_each_micro_batch, reduce_each_micro_batch;
  /* bf16/fp16: low-precision params and gradients with f32 master weights (true) */
  bool has_master_weights, master_weights;
  /* each step's time by phase (DeepSpeed's wall_clock_breakdown) */
  bool has_wall_clock_breakdown, wall_clock_breakdown;
  /* the optimizer applies the previous step's gradient (delayed parameter update) */
  bool has_delayed_update, delayed_update;
  /* host-placed work and tier copies beside the device's (train.offload.overlap):
   * a dsc_switch */
  bool has_offload_overlap;
  int offload_overlap;
  /* ZenFlow's importance-aware split of the update (train.zenflow.enabled) */
  bool has_zenflow, zenflow;
} dsc_run_knobs;

typedef enum {
  DSC_SETTING_INT,       /* an integer in [min, max] */
  DSC_SETTING_BYTES,     /* a byte count in [min, max] (flags: 25MB, 1GiB) */
  DSC_SETTING_NUM,       /* a non-negative finite number */
  DSC_SETTING_BOOL,      /* true or false */
  DSC_SETTING_SWITCH,    /* true, false or auto (a dsc_switch) */
  DSC_SETTING_PRECISION, /* f32, bf16, fp16 */
  DSC_SETTING_TIER,      /* none, host or cpu, disk or nvme, auto */
  DSC_SETTING_REMAT,     /* none, selective, block(s), blocks:K, offload */
  DSC_SETTING_OPTIMIZER, /* name(key = value, ...): passes/train_config.c */
  DSC_SETTING_SCHEDULE,  /* name(key = value, ...): passes/train_config.c */
  DSC_SETTING_SECTION,   /* zero { ... }, offload { ... } */
} dsc_setting_kind;

typedef struct {
  const char *key;   /* under "train.": "zero.stage" */
  const char *alias; /* ds_config's spelling of the metadata key, or NULL */
  const char *flag;  /* the dsc train / dsc plan flag, or NULL */
  const char *what;  /* for library callers' errors: "the ZeRO stage" */
  dsc_setting_kind kind;
  int64_t min, max;            /* INT, BYTES */
  const char *want;            /* what a value must be: "0, 1, 2 or 3" */
  const char *flag_want;       /* what a flag's value must be, where it differs */
  ptrdiff_t cfg_off;           /* the dsc_train_config field; -1: read by passes/train_config.c
                                * itself (lr, weight_decay, optimizer, schedule) or not used */
  ptrdiff_t knob_off, has_off; /* the dsc_run_knobs fields; -1: not a run knob */
} dsc_setting;

/* A parsed value: i (INT, BYTES, and the enums), num, b; every for REMAT. */
typedef struct {
  int64_t i;
  double num;
  bool b;
  int64_t every;
} dsc_setting_value;

int dsc_setting_count(void);
const dsc_setting *dsc_setting_at(int i);
/* By key under "train." (or its alias); NULL when unknown. */
const dsc_setting *dsc_setting_find(const char *key);
/* By flag ("--zero-stage"); NULL when none has it. */
const dsc_setting *dsc_setting_find_flag(const char *flag);
/* Parses and range-checks `text`: a printed train value (as the frontend
 * prints it), or with `flag` a command-line value (byte counts may carry
 * K/M/G suffixes, 1024-based as dsc's other flags). False when it is not a
 * value of the setting; s->want (flag: s->flag_want) says what is. */
bool dsc_setting_parse(const dsc_setting *s, const char *text, bool flag, dsc_setting_value *out);
/* The message part for a bad value: s->flag_want when flag and set, else
 * s->want. */
const char *dsc_setting_want(const dsc_setting *s, bool flag);

/* A named form of an optimizer or schedule value, as in "adamw(lr = 3e-4,
 * betas = (0.9, 0.95))": its name and the keyword settings it takes. */
typedef struct {
  const char *name;
  const char *const *keys; /* NULL-terminated */
} dsc_setting_form;
/* The forms of a DSC_SETTING_OPTIMIZER or DSC_SETTING_SCHEDULE setting in
 * their one order (passes/train_config.c reads a value's form by its index),
 * their count in *n; NULL and 0 for the other kinds. */
const dsc_setting_form *dsc_setting_forms(const dsc_setting *s, int *n);
/* Stores v into the run knob of s (setting its has_ flag); false when s is
 * not a run knob. */
bool dsc_run_knobs_store(dsc_run_knobs *k, const dsc_setting *s, const dsc_setting_value *v);
/* dsc_run_knobs_store of a flag's value ("--checkpoint-activations",
 * "selective"): what the CLI does for one flag; false when flag is no run
 * knob's or value not one of its values. */
bool dsc_run_knobs_set(dsc_run_knobs *k, const char *flag, const char *value);
/* A byte count: 4096, 25MB, 1.5GiB (K, M, G are 1024-based; an optional i
 * and B); false when malformed or above 9e15. */
bool dsc_parse_bytes(const char *s, int64_t *out);

#ifdef __cplusplus
}
#endif
#endif
