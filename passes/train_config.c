/* Training settings: defaults, then the module's "train.*" metadata as the
 * frontend prints it ("adamw(lr = 0.001, betas = (0.9, 0.95))", "8",
 * "cosine(warmup = 50)"), and the learning-rate schedule. The formulas are
 * documented in docs/training.md. */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "passes/passes.h"

#define TV_POOL 64 /* nodes of one printed value */

/* ------------------------------------------------------ setting checks */

static bool bad(dsc_context *ctx, const char *key, const char *raw, const char *want) {
  ir_error(ctx, ir_no_loc, "train setting '%s' must be %s, got '%s'", key, want, raw);
  return false;
}

static bool get_int(dsc_context *ctx, const char *key, const char *raw, const pass_tv *v,
                    int64_t min, int64_t *out) {
  if (v->kind != PASS_TV_NUM || !v->is_int || v->num < (double)min || v->num > 9.0e15)
    return bad(ctx, key, raw, min > 0 ? "a positive integer" : "a non-negative integer");
  *out = (int64_t)v->num;
  return true;
}

static bool get_num(dsc_context *ctx, const char *key, const char *raw, const pass_tv *v,
                    double *out) {
  if (v->kind != PASS_TV_NUM || !(v->num >= 0) || isinf(v->num))
    return bad(ctx, key, raw, "a non-negative number");
  *out = v->num;
  return true;
}

static bool get_fraction(dsc_context *ctx, const char *key, const char *raw, const pass_tv *v,
                         double *out) {
  if (v->kind != PASS_TV_NUM || !(v->num >= 0 && v->num < 1))
    return bad(ctx, key, raw, "a number in [0, 1)");
  *out = v->num;
  return true;
}

static bool get_bool(dsc_context *ctx, const char *key, const char *raw, const pass_tv *v,
                     bool *out) {
  if (v->kind != PASS_TV_BOOL) return bad(ctx, key, raw, "true or false");
  *out = v->b;
  return true;
}

/* The index of v's name among setting `key`'s forms (passes/settings.c),
 * or -1 (a diagnostic with the setting's want). */
static int form_index(dsc_context *ctx, const char *key, const char *raw, const pass_tv *v) {
  const dsc_setting *s = dsc_setting_find(key);
  int n = 0;
  const dsc_setting_form *f = dsc_setting_forms(s, &n);
  for (int i = 0; (v->kind == PASS_TV_NAME || v->kind == PASS_TV_CALL) && i < n; i++)
    if (strcmp(v->name, f[i].name) == 0) return i;
  char k[64];
  snprintf(k, sizeof k, "train.%s", key);
  bad(ctx, k, raw, s ? s->want : "?");
  return -1;
}

/* optimizer = NAME or NAME(key = value, ...); NAME's index in the forms:
 * adamw, adam, sgd, muon */
static bool set_optimizer(dsc_context *ctx, const char *raw, const pass_tv *v,
                          dsc_train_config *cfg) {
  int which = form_index(ctx, "optimizer", raw, v);
  if (which < 0) return false;
  cfg->opt.kind = which <= 1 ? DSC_OPT_ADAMW : which == 2 ? DSC_OPT_SGD : DSC_OPT_MUON;
  for (int i = 0; i < v->n; i++) {
    const char *k = v->keys[i];
    const pass_tv *a = v->items[i];
    char key[80];
    snprintf(key, sizeof key, "train.optimizer.%s", *k ? k : "?");
    bool adam_key = which <= 1 || which == 3, mom_key = which >= 2;
    bool ok;
    if (!*k) {
      ir_error(ctx, ir_no_loc,
               "train setting 'train.optimizer': the settings of '%s' must be "
               "named, as in %s(lr = ...), got '%s'",
               v->name, v->name, raw);
      return false;
    } else if (strcmp(k, "lr") == 0) {
      ok = get_num(ctx, key, raw, a, &cfg->opt.lr);
    } else if (strcmp(k, "weight_decay") == 0) {
      ok = get_num(ctx, key, raw, a, &cfg->opt.weight_decay);
    } else if (strcmp(k, "betas") == 0 && adam_key) {
      if (a->kind != PASS_TV_TUPLE || a->n != 2)
        return bad(ctx, key, raw, "a pair of numbers in [0, 1), as in (0.9, 0.95)");
      ok = get_fraction(ctx, key, raw, a->items[0], &cfg->opt.beta1) &&
           get_fraction(ctx, key, raw, a->items[1], &cfg->opt.beta2);
    } else if (strcmp(k, "eps") == 0 && adam_key) {
      ok = get_num(ctx, key, raw, a, &cfg->opt.eps);
    } else if (strcmp(k, "decay_1d") == 0) {
      ok = get_bool(ctx, key, raw, a, &cfg->opt.decay_1d);
    } else if (strcmp(k, "momentum") == 0 && mom_key) {
      ok = get_fraction(ctx, key, raw, a, &cfg->opt.momentum);
    } else if (strcmp(k, "nesterov") == 0 && mom_key) {
      ok = get_bool(ctx, key, raw, a, &cfg->opt.nesterov);
    } else if (strcmp(k, "adam_lr") == 0 && which == 3) {
      ok = get_num(ctx, key, raw, a, &cfg->opt.adam_lr);
    } else {
      ir_error(ctx, ir_no_loc, "train setting 'train.optimizer': '%s' has no setting '%s'", v->name,
               k);
      return false;
    }
    if (!ok) return false;
  }
  return true;
}

/* one_cycle(min_lr = X, first_steps = N, ...) and lr_range_test(step_size
 * = N, ...): DeepSpeed's OneCycle and LRRangeTest with its defaults, the
 * train's lr their cycle_max_lr and lr_range_test_min_lr. OneCycle's
 * cycle_min_lr has no default; its second half and stairs default to the
 * first's. */
static bool set_deepspeed_cycle(dsc_context *ctx, const char *raw, const pass_tv *v,
                                dsc_train_config *cfg) {
  bool cycle = cfg->sched.kind == DSC_SCHED_ONE_CYCLE;
  cfg->sched.first_steps = 2000, cfg->sched.first_stairs = 0;
  cfg->sched.decay_step_size = 0, cfg->sched.decay_lr_rate = 0, cfg->sched.min_lr = 0;
  cfg->sched.step_size = 2000, cfg->sched.step_rate = 1.0, cfg->sched.staircase = false;
  bool has_min = false, has_second = false, has_second_stairs = false;
  for (int i = 0; i < v->n; i++) {
    const char *k = v->keys[i];
    const pass_tv *a = v->items[i];
    char key[80];
    snprintf(key, sizeof key, "train.schedule.%s", *k ? k : "?");
    bool ok;
    if (!*k) {
      ir_error(ctx, ir_no_loc,
               "train setting 'train.schedule': the settings of '%s' must be named, as in "
               "%s(%s = ...), got '%s'",
               v->name, v->name, cycle ? "min_lr" : "step_size", raw);
      return false;
    } else if (cycle && strcmp(k, "min_lr") == 0) {
      ok = get_num(ctx, key, raw, a, &cfg->sched.min_lr), has_min = true;
    } else if (cycle && strcmp(k, "first_steps") == 0) {
      ok = get_int(ctx, key, raw, a, 1, &cfg->sched.first_steps);
    } else if (cycle && strcmp(k, "second_steps") == 0) {
      ok = get_int(ctx, key, raw, a, 0, &cfg->sched.second_steps), has_second = true;
    } else if (cycle && strcmp(k, "first_stairs") == 0) {
      ok = get_int(ctx, key, raw, a, 0, &cfg->sched.first_stairs);
    } else if (cycle && strcmp(k, "second_stairs") == 0) {
      ok = get_int(ctx, key, raw, a, 0, &cfg->sched.second_stairs), has_second_stairs = true;
    } else if (cycle && strcmp(k, "decay_step_size") == 0) {
      ok = get_int(ctx, key, raw, a, 0, &cfg->sched.decay_step_size);
    } else if (cycle && strcmp(k, "decay_lr_rate") == 0) {
      ok = get_num(ctx, key, raw, a, &cfg->sched.decay_lr_rate);
    } else if (!cycle && strcmp(k, "step_size") == 0) {
      ok = get_int(ctx, key, raw, a, 1, &cfg->sched.step_size);
    } else if (!cycle && strcmp(k, "step_rate") == 0) {
      ok = get_num(ctx, key, raw, a, &cfg->sched.step_rate);
    } else if (!cycle && strcmp(k, "staircase") == 0) {
      ok = get_bool(ctx, key, raw, a, &cfg->sched.staircase);
    } else {
      ir_error(ctx, ir_no_loc, "train setting 'train.schedule': '%s' has no setting '%s'", v->name,
               k);
      return false;
    }
    if (!ok) return false;
  }
  if (cycle && !has_min) {
    ir_error(ctx, ir_no_loc,
             "train setting 'train.schedule': one_cycle needs min_lr (DeepSpeed's cycle_min_lr, "
             "which has no default), as in one_cycle(min_lr = 1e-4, first_steps = 100), got '%s'",
             raw);
    return false;
  }
  if (!has_second) cfg->sched.second_steps = cfg->sched.first_steps;
  if (!has_second_stairs) cfg->sched.second_stairs = cfg->sched.first_stairs;
  return true;
}

/* schedule = NAME or NAME(warmup = N, min_lr = X, decay_steps = N, ...):
 * dsc's own (warmup from 0, then constant, cosine or linear to min_lr) and
 * DeepSpeed's WarmupLR, WarmupDecayLR and WarmupCosineLR (warmup_type =
 * log | linear; warmup_cosine_lr's min_ratio and cos_min_ratio), OneCycle
 * and LRRangeTest (set_deepspeed_cycle). */
static bool set_schedule(dsc_context *ctx, const char *raw, const pass_tv *v,
                         dsc_train_config *cfg) {
  /* by the index of its form: constant, cosine, linear, warmup_cosine,
   * warmup_linear, warmup_lr, warmup_decay_lr, warmup_cosine_lr,
   * one_cycle, lr_range_test */
  static const dsc_schedule_kind kinds[] = {DSC_SCHED_CONSTANT,        DSC_SCHED_COSINE,
                                            DSC_SCHED_LINEAR,          DSC_SCHED_COSINE,
                                            DSC_SCHED_LINEAR,          DSC_SCHED_WARMUP_LR,
                                            DSC_SCHED_WARMUP_DECAY_LR, DSC_SCHED_WARMUP_COSINE_LR,
                                            DSC_SCHED_ONE_CYCLE,       DSC_SCHED_LR_RANGE_TEST};
  int which = form_index(ctx, "schedule", raw, v);
  if (which < 0) return false;
  cfg->sched.kind = kinds[which];
  if (which >= 8) return set_deepspeed_cycle(ctx, raw, v, cfg);
  bool ds = which >= 5;
  if (ds) { /* DeepSpeed's defaults */
    cfg->sched.warmup = 1000, cfg->sched.min_lr = 0, cfg->sched.warmup_log = true;
    cfg->sched.min_ratio = 0, cfg->sched.cos_min_ratio = 0.0001;
  }
  for (int i = 0; i < v->n; i++) {
    const char *k = v->keys[i];
    const pass_tv *a = v->items[i];
    char key[80];
    snprintf(key, sizeof key, "train.schedule.%s", *k ? k : "?");
    bool ok;
    if (!*k) {
      ir_error(ctx, ir_no_loc,
               "train setting 'train.schedule': the settings of '%s' must be "
               "named, as in %s(warmup = ...), got '%s'",
               v->name, v->name, raw);
      return false;
    } else if (strcmp(k, "warmup") == 0) {
      ok = get_int(ctx, key, raw, a, ds ? 1 : 0, &cfg->sched.warmup);
    } else if (strcmp(k, "min_lr") == 0 && which > 0 && which != 7) {
      ok = get_num(ctx, key, raw, a, &cfg->sched.min_lr);
    } else if (strcmp(k, "decay_steps") == 0 && which > 0 && which != 5) {
      ok = get_int(ctx, key, raw, a, 0, &cfg->sched.decay_steps);
    } else if (strcmp(k, "warmup_type") == 0 && ds) {
      ok = a->kind == PASS_TV_NAME && (strcmp(a->name, "log") == 0 || strcmp(a->name, "linear") == 0);
      if (!ok) return bad(ctx, key, raw, "log or linear");
      cfg->sched.warmup_log = strcmp(a->name, "log") == 0;
    } else if ((strcmp(k, "min_ratio") == 0 || strcmp(k, "cos_min_ratio") == 0) && which == 7) {
      ok = get_num(ctx, key, raw, a, k[0] == 'm' ? &cfg->sched.min_ratio : &cfg->sched.cos_min_ratio);
    } else {
      ir_error(ctx, ir_no_loc, "train setting 'train.schedule': '%s' has no setting '%s'", v->name,
               k);
      return false;
    }
    if (!ok) return false;
  }
  return true;
}

void pass_format_optimizer(const dsc_train_config *cfg, char *buf, size_t n) {
  char lr[40], wd[40], b1[40], b2[40], eps[40], mom[40], alr[40];
  ir_format_double(cfg->opt.lr, lr, sizeof lr);
  ir_format_double(cfg->opt.weight_decay, wd, sizeof wd);
  ir_format_double(cfg->opt.beta1, b1, sizeof b1);
  ir_format_double(cfg->opt.beta2, b2, sizeof b2);
  ir_format_double(cfg->opt.eps, eps, sizeof eps);
  ir_format_double(cfg->opt.momentum, mom, sizeof mom);
  ir_format_double(cfg->opt.adam_lr, alr, sizeof alr);
  const char *d1 = cfg->opt.decay_1d ? ", decay_1d = true" : "";
  const char *nest = cfg->opt.nesterov ? "true" : "false";
  if (cfg->opt.kind == DSC_OPT_SGD)
    snprintf(buf, n, "sgd(lr = %s, momentum = %s, nesterov = %s, weight_decay = %s%s)", lr, mom,
             nest, wd, d1);
  else if (cfg->opt.kind == DSC_OPT_MUON) /* betas and eps: the AdamW that Muon leaves params to */
    snprintf(buf, n,
             "muon(lr = %s, momentum = %s, nesterov = %s, weight_decay = %s, betas = (%s, %s), "
             "eps = %s%s%s%s)",
             lr, mom, nest, wd, b1, b2, eps, d1, cfg->opt.adam_lr > 0 ? ", adam_lr = " : "",
             cfg->opt.adam_lr > 0 ? alr : "");
  else
    snprintf(buf, n, "adamw(lr = %s, betas = (%s, %s), eps = %s, weight_decay = %s%s)", lr, b1, b2,
             eps, wd, d1);
}

void pass_format_schedule(const dsc_train_config *cfg, char *buf, size_t n) {
  char min_lr[40], ratio[40], cos_ratio[40];
  ir_format_double(cfg->sched.min_lr, min_lr, sizeof min_lr);
  ir_format_double(cfg->sched.min_ratio, ratio, sizeof ratio);
  ir_format_double(cfg->sched.cos_min_ratio, cos_ratio, sizeof cos_ratio);
  int64_t w = cfg->sched.warmup, d = cfg->sched.decay_steps;
  const char *wt = cfg->sched.warmup_log ? "log" : "linear";
  switch (cfg->sched.kind) {
    case DSC_SCHED_COSINE:
    case DSC_SCHED_LINEAR:
      snprintf(buf, n, "%s(warmup = %" PRId64 ", min_lr = %s, decay_steps = %" PRId64 ")",
               cfg->sched.kind == DSC_SCHED_COSINE ? "cosine" : "linear", w, min_lr, d);
      break;
    case DSC_SCHED_WARMUP_LR:
      snprintf(buf, n, "warmup_lr(warmup = %" PRId64 ", min_lr = %s, warmup_type = %s)", w, min_lr,
               wt);
      break;
    case DSC_SCHED_WARMUP_DECAY_LR:
      snprintf(buf, n,
               "warmup_decay_lr(warmup = %" PRId64 ", min_lr = %s, decay_steps = %" PRId64
               ", warmup_type = %s)",
               w, min_lr, d, wt);
      break;
    case DSC_SCHED_WARMUP_COSINE_LR:
      snprintf(buf, n,
               "warmup_cosine_lr(warmup = %" PRId64 ", decay_steps = %" PRId64
               ", warmup_type = %s, min_ratio = %s, cos_min_ratio = %s)",
               w, d, wt, ratio, cos_ratio);
      break;
    case DSC_SCHED_ONE_CYCLE: {
      char rate[40];
      ir_format_double(cfg->sched.decay_lr_rate, rate, sizeof rate);
      snprintf(buf, n,
               "one_cycle(min_lr = %s, first_steps = %" PRId64 ", second_steps = %" PRId64
               ", first_stairs = %" PRId64 ", second_stairs = %" PRId64
               ", decay_step_size = %" PRId64 ", decay_lr_rate = %s)",
               min_lr, cfg->sched.first_steps, cfg->sched.second_steps, cfg->sched.first_stairs,
               cfg->sched.second_stairs, cfg->sched.decay_step_size, rate);
      break;
    }
    case DSC_SCHED_LR_RANGE_TEST: {
      char rate[40];
      ir_format_double(cfg->sched.step_rate, rate, sizeof rate);
      snprintf(buf, n, "lr_range_test(step_size = %" PRId64 ", step_rate = %s, staircase = %s)",
               cfg->sched.step_size, rate, cfg->sched.staircase ? "true" : "false");
      break;
    }
    default:
      snprintf(buf, n, "constant(warmup = %" PRId64 ")", w);
  }
}

/* DeepSpeed's OneCycle at iteration `it` (>= 0), its arithmetic in its
 * order (lr_schedules.py: _get_scale_factor, _get_cycle_lr,
 * _get_decay_lr), so that the doubles agree to the last bit: the cycle's
 * scale rises over first_steps and falls over second_steps, in stairs
 * counted from the integer step where stairs are asked for; after the
 * cycle min_lr / (1 + rate x steps past it / decay_step_size). */
static double one_cycle_lr(const dsc_train_config *cfg, int64_t it) {
  const double lo = cfg->sched.min_lr, hi = cfg->opt.lr;
  const double first = (double)cfg->sched.first_steps, second = (double)cfg->sched.second_steps;
  const double total = first + second;
  if ((double)it < total) {
    double bi = (double)(it + 1), ratio = first / total;
    double cycle = floor(1 + bi / total);
    double x = 1.0 + bi / total - cycle, scale;
    int64_t stairs;
    if (x <= ratio)
      scale = x / ratio, stairs = cfg->sched.first_stairs;
    else
      scale = (x - 1) / (ratio - 1), stairs = cfg->sched.second_stairs;
    if (stairs > 0) {
      double ci = fmod(bi, total);
      double pos =
          ci <= first ? ci * (double)stairs / first : (total - ci) * (double)stairs / second;
      scale = floor(pos) / (double)stairs;
    }
    return lo + (hi - lo) * scale;
  }
  if (cfg->sched.decay_step_size == 0 || cfg->sched.decay_lr_rate == 0) return lo;
  double past = (double)it - total + 1;
  return lo / (1 + cfg->sched.decay_lr_rate * (past / (double)cfg->sched.decay_step_size));
}

/* DeepSpeed's LRRangeTest at iteration `it` (>= -1): lr x (1 + step_rate x
 * (it + 1) / step_size), the quotient floored with staircase. */
static double lr_range_test_lr(const dsc_train_config *cfg, int64_t it) {
  double interval = (double)(it + 1) / (double)cfg->sched.step_size;
  if (cfg->sched.staircase) interval = floor(interval);
  return cfg->opt.lr * (1 + cfg->sched.step_rate * interval);
}

/* DeepSpeed's schedulers: the lr of (0-based) step `step` as DeepSpeed
 * 0.19's lr_schedules computes it. The scheduler sets the lr when it is
 * made (iteration -1: warmup_min_lr; WarmupCosineLR 0; OneCycle
 * cycle_min_lr; LRRangeTest lr_range_test_min_lr) and steps after each
 * optimizer step, so step s runs at iteration s - 1. */
static double deepspeed_lr(const dsc_train_config *cfg, int64_t step) {
  const double lr = cfg->opt.lr, min_lr = cfg->sched.min_lr;
  int64_t W = cfg->sched.warmup < 2 ? 2 : cfg->sched.warmup; /* max(2, warmup_num_steps) */
  int64_t T = cfg->sched.decay_steps > 0 ? cfg->sched.decay_steps : cfg->steps;
  int64_t it = step - 1;
  bool cosine = cfg->sched.kind == DSC_SCHED_WARMUP_COSINE_LR;
  if (cfg->sched.kind == DSC_SCHED_ONE_CYCLE) return it < 0 ? min_lr : one_cycle_lr(cfg, it);
  if (cfg->sched.kind == DSC_SCHED_LR_RANGE_TEST) return it < 0 ? lr : lr_range_test_lr(cfg, it);
  if (it < 0) return cosine ? 0.0 : min_lr;
  double warm = cfg->sched.warmup_log ? log((double)(it + 1)) / log((double)W)
                                      : (double)it / (double)W;
  if (cosine) {
    double ratio;
    if (it < W) {
      ratio = cfg->sched.min_ratio + warm * (1.0 - cfg->sched.min_ratio);
    } else {
      double p = (double)(it - W + 1) / (double)(T - W > 1 ? T - W : 1);
      if (p > 1) p = 1;
      double c = cfg->sched.cos_min_ratio;
      ratio = fmax(0.0, c + (1.0 - c) * (1.0 + cos(3.14159265358979323846 * p)) / 2.0);
    }
    return lr * ratio;
  }
  double gamma = it < W ? warm
                 : cfg->sched.kind == DSC_SCHED_WARMUP_LR
                     ? 1.0
                     : fmax(0.0, (double)(T - it) / fmax(1.0, (double)(T - W)));
  return min_lr + (lr - min_lr) * gamma;
}

int dsc_offload_from_name(const char *name, dsc_offload_tier *out) {
  if (strcmp(name, "none") == 0) return *out = DSC_OFFLOAD_NONE, 0;
  if (strcmp(name, "host") == 0 || strcmp(name, "cpu") == 0) return *out = DSC_OFFLOAD_HOST, 0;
  if (strcmp(name, "disk") == 0 || strcmp(name, "nvme") == 0) return *out = DSC_OFFLOAD_DISK, 0;
  if (strcmp(name, "auto") == 0) return *out = DSC_OFFLOAD_AUTO, 0;
  return -1;
}

const char *dsc_offload_name(dsc_offload_tier t) {
  return t == DSC_OFFLOAD_HOST   ? "host"
         : t == DSC_OFFLOAD_DISK ? "disk"
         : t == DSC_OFFLOAD_AUTO ? "auto"
                                 : "none";
}

const char *dsc_switch_name(dsc_switch s) {
  return s == DSC_SWITCH_FALSE  ? "false"
         : s == DSC_SWITCH_TRUE ? "true"
         : s == DSC_SWITCH_AUTO ? "auto"
                                : NULL;
}

int dsc_remat_parse(const char *name, dsc_remat_policy *out, int64_t *every) {
  *every = 1;
  if (strcmp(name, "none") == 0) return *out = DSC_REMAT_NONE, 0;
  if (strcmp(name, "selective") == 0) return *out = DSC_REMAT_SELECTIVE, 0;
  if (strcmp(name, "offload") == 0) return *out = DSC_REMAT_OFFLOAD, 0; /* activation offload */
  /* "block" is a keyword of the model language: train sections say "blocks" */
  if (strcmp(name, "block") == 0 || strcmp(name, "blocks") == 0) return *out = DSC_REMAT_BLOCKS, 0;
  if (strncmp(name, "blocks:", 7) == 0) {
    char *end;
    long long k = strtoll(name + 7, &end, 10);
    if (end == name + 7 || *end || k < 1 || k > 1000000) return -1;
    *every = k;
    return *out = DSC_REMAT_BLOCKS, 0;
  }
  return -1;
}

int dsc_remat_from_name(const char *name, dsc_remat_policy *out) {
  int64_t k;
  return dsc_remat_parse(name, out, &k);
}

const char *dsc_remat_name(dsc_remat_policy p) {
  return p == DSC_REMAT_SELECTIVE ? "selective"
         : p == DSC_REMAT_BLOCKS  ? "blocks"
         : p == DSC_REMAT_OFFLOAD ? "offload"
                                  : "none";
}

static void set_defaults(dsc_train_config *cfg) {
  memset(cfg, 0, sizeof *cfg);
  cfg->grad_accum = 1;
  cfg->steps = 1000;
  cfg->remat_every = 1;
  cfg->zero.prefetch_bytes = 64 << 20;
  cfg->zero.bucket_bytes = 25 << 20;
  cfg->zero.reduce_each_micro_batch = true;
  cfg->master_weights = true;
  cfg->offload.prefetch_bytes = 64 << 20;
  cfg->offload.io_threads = 4;
  cfg->offload.overlap = DSC_SWITCH_AUTO;
  cfg->zenflow.topk_ratio = 0.1;
  cfg->zenflow.select_interval = 4;
  cfg->zenflow.update_interval = 4;
  cfg->seed = 1337;
  cfg->log_every = 1;
  cfg->opt.kind = DSC_OPT_ADAMW;
  cfg->opt.lr = 1e-3;
  cfg->opt.beta1 = 0.9;
  cfg->opt.beta2 = 0.999;
  cfg->opt.eps = 1e-8;
  cfg->opt.momentum = 0.9;
  cfg->sched.kind = DSC_SCHED_CONSTANT;
  cfg->precision = DSC_PRECISION_F32;
  cfg->fp16.initial_scale_power = 16; /* DeepSpeed's defaults */
  cfg->fp16.loss_scale_window = 1000;
  cfg->fp16.hysteresis = 2;
  cfg->fp16.min_loss_scale = 1;
  cfg->world = 1;
}

const char *dsc_precision_name(dsc_precision p) {
  switch (p) {
    case DSC_PRECISION_F32:
      return "f32";
    case DSC_PRECISION_BF16:
      return "bf16";
    case DSC_PRECISION_FP16:
      return "fp16";
  }
  return NULL;
}

int dsc_precision_from_name(const char *name, dsc_precision *out) {
  static const struct {
    const char *name;
    dsc_precision p;
  } names[] = {{"f32", DSC_PRECISION_F32},
               {"bf16", DSC_PRECISION_BF16},
               {"fp16", DSC_PRECISION_FP16},
               {"f16", DSC_PRECISION_FP16}};
  for (size_t i = 0; name && i < sizeof names / sizeof names[0]; i++)
    if (strcmp(name, names[i].name) == 0) {
      *out = names[i].p;
      return 0;
    }
  return -1;
}

/* A train.* key the table does not know: ds_config's other zero keys are
 * accepted and not used (docs/training.md). */
static bool accepted_unused(const char *k) {
  return strncmp(k, "zero.", 5) == 0 || strncmp(k, "zero_optimization.", 18) == 0;
}

/* One train.* metadata value through the settings table
 * (passes/settings.c): the scalars by dsc_setting_parse, the optimizer and
 * schedule calls by their readers above. */
static bool read_setting(dsc_context *ctx, pass_tv_parser *p, pass_tv *pool, const char *key,
                         const char *raw, dsc_train_config *cfg, double *lr, bool *has_lr,
                         double *wd, bool *has_wd) {
  const char *k = key + 6;
  const dsc_setting *s = dsc_setting_find(k);
  if (!s && accepted_unused(k)) return true;
  if (!s || s->kind == DSC_SETTING_SECTION) {
    ir_error(ctx, ir_no_loc, "unknown train setting '%s'", key);
    return false;
  }
  if (s->kind == DSC_SETTING_OPTIMIZER || s->kind == DSC_SETTING_SCHEDULE) {
    const pass_tv *v = pass_tv_parse(p, pool, TV_POOL, ctx, key, raw);
    if (!v) return false;
    return s->kind == DSC_SETTING_OPTIMIZER ? set_optimizer(ctx, raw, v, cfg)
                                            : set_schedule(ctx, raw, v, cfg);
  }
  dsc_setting_value v;
  /* the metadata's own wording for the precision, as before the table */
  const char *want =
      s->kind == DSC_SETTING_PRECISION ? "one of f32, bf16, fp16" : dsc_setting_want(s, false);
  if (!dsc_setting_parse(s, raw, false, &v)) return bad(ctx, key, raw, want);
  /* top-level lr / weight_decay override the optimizer's, whatever the order */
  if (strcmp(s->key, "lr") == 0) return *lr = v.num, *has_lr = true;
  if (strcmp(s->key, "weight_decay") == 0) return *wd = v.num, *has_wd = true;
  pass_setting_store_config(cfg, s, &v);
  return true;
}

dsc_status dsc_train_config_from_module(const dsc_module *m, dsc_train_config *cfg) {
  dsc_context *ctx = dsc_module_context(m);
  set_defaults(cfg);
  bool ok = true, has_lr = false, has_wd = false;
  double lr = 0, wd = 0;
  size_t pool_bytes = sizeof(pass_tv) * TV_POOL;
  pass_tv *pool = ir_alloc(ctx, pool_bytes);
  if (!pool) return ir_error(ctx, ir_no_loc, "out of memory"), DSC_ERR_INTERNAL;
  pass_tv_parser p;
  for (int i = 0; i < dsc_module_meta_count(m); i++) {
    const char *key = dsc_module_meta_key(m, i), *raw = dsc_module_meta_value(m, i);
    if (strncmp(key, "train.", 6) != 0) continue;
    ok = read_setting(ctx, &p, pool, key, raw, cfg, &lr, &has_lr, &wd, &has_wd) && ok;
  }
  ir_free(ctx, pool, pool_bytes);
  if (has_lr) cfg->opt.lr = lr;
  if (has_wd) cfg->opt.weight_decay = wd;
  if (ok && cfg->opt.nesterov && cfg->opt.momentum <= 0) {
    ir_error(ctx, ir_no_loc, "train setting 'train.optimizer': nesterov needs momentum > 0");
    ok = false;
  }
  return ok ? DSC_OK : DSC_ERR_USER;
}

double dsc_lr_at(const dsc_train_config *cfg, int64_t step) {
  if (cfg->sched.kind >= DSC_SCHED_WARMUP_LR) return deepspeed_lr(cfg, step < 0 ? 0 : step);
  double lr = cfg->opt.lr, min_lr = cfg->sched.min_lr;
  int64_t warmup = cfg->sched.warmup;
  if (step < 0) step = 0;
  if (step < warmup) return lr * (double)(step + 1) / (double)warmup;
  if (cfg->sched.kind == DSC_SCHED_CONSTANT) return lr;
  int64_t end = cfg->sched.decay_steps > 0 ? cfg->sched.decay_steps : cfg->steps;
  if (step >= end) return min_lr;
  double progress = (double)(step - warmup) / (double)(end - warmup); /* in [0, 1) */
  if (cfg->sched.kind == DSC_SCHED_COSINE)
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + cos(3.14159265358979323846 * progress));
  return lr + (min_lr - lr) * progress;
}
