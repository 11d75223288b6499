/* The settings schema (include/dsc/settings.h): the table of train keys,
 * the parser of printed train values (the frontend's printed forms:
 * "adamw(lr = 0.001, betas = (0.9, 0.95))", "8", "blocks"), the one parse
 * and range check of every setting, and the run knobs applied over a train
 * config. A row is added here once and the frontend, the metadata reader
 * (passes/train_config.c), the CLI flags and the library callers' checks
 * all follow it. */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "passes/passes.h"

/* ------------------------------------------------------------ the table */

#define CFG(f) offsetof(dsc_train_config, f)
#define KNOB(f) offsetof(dsc_run_knobs, f), offsetof(dsc_run_knobs, has_##f)
#define NOKNOB -1, -1
#define I64MAX INT64_C(9000000000000000) /* what a double holds exactly */

static const char *const pos_int = "a positive integer", *const nonneg_int =
                                                             "a non-negative integer";
static const char *const size_want = "a size in bytes (an integer or a size such as 25MB)";
static const char *const zero_bytes_flag = "a byte count such as 0, 4096, 25MB or 1GiB";

static const dsc_setting table[] = {
    {"batch", NULL, NULL, "the batch", DSC_SETTING_INT, 1, I64MAX, pos_int, NULL, CFG(batch),
     NOKNOB},
    {"seq", NULL, NULL, "the sequence length", DSC_SETTING_INT, 1, I64MAX, pos_int, NULL, CFG(seq),
     NOKNOB},
    {"grad_accum", NULL, NULL, "grad_accum", DSC_SETTING_INT, 1, I64MAX, pos_int, NULL,
     CFG(grad_accum), NOKNOB},
    {"steps", NULL, NULL, "steps", DSC_SETTING_INT, 1, I64MAX, pos_int, NULL, CFG(steps), NOKNOB},
    {"lr", NULL, NULL, "lr", DSC_SETTING_NUM, 0, 0, "a non-negative number", NULL, -1, NOKNOB},
    {"clip", NULL, NULL, "clip", DSC_SETTING_NUM, 0, 0, "a non-negative number", NULL, CFG(clip),
     NOKNOB},
    {"weight_decay", NULL, NULL, "weight_decay", DSC_SETTING_NUM, 0, 0, "a non-negative number",
     NULL, -1, NOKNOB},
    {"optimizer", NULL, NULL, "the optimizer", DSC_SETTING_OPTIMIZER, 0, 0,
     "one of adamw, adam, sgd, muon", NULL, -1, NOKNOB},
    {"schedule", NULL, NULL, "the schedule", DSC_SETTING_SCHEDULE, 0, 0,
     "one of constant, cosine, linear, warmup_cosine, warmup_linear, warmup_lr, warmup_decay_lr, "
     "warmup_cosine_lr, one_cycle, lr_range_test",
     NULL, -1, NOKNOB},
    {"precision", NULL, NULL, "the precision", DSC_SETTING_PRECISION, 0, 0, "f32, bf16 or fp16",
     NULL, CFG(precision), NOKNOB},
    {"master_weights", NULL, "--master-weights", "master_weights", DSC_SETTING_BOOL, 0, 0,
     "true or false", NULL, CFG(master_weights), KNOB(master_weights)},
    {"wall_clock_breakdown", NULL, "--wall-clock-breakdown", "wall_clock_breakdown",
     DSC_SETTING_BOOL, 0, 0, "true or false", NULL, CFG(wall_clock_breakdown),
     KNOB(wall_clock_breakdown)},
    {"fp16", NULL, NULL, "fp16", DSC_SETTING_SECTION, 0, 0, NULL, NULL, -1, NOKNOB},
    {"fp16.initial_scale_power", NULL, NULL, "fp16 initial_scale_power", DSC_SETTING_INT, 0, 126,
     "an integer in [0, 126]", NULL, CFG(fp16.initial_scale_power), NOKNOB},
    {"fp16.loss_scale_window", NULL, NULL, "fp16 loss_scale_window", DSC_SETTING_INT, 1, I64MAX,
     pos_int, NULL, CFG(fp16.loss_scale_window), NOKNOB},
    {"fp16.hysteresis", NULL, NULL, "fp16 hysteresis", DSC_SETTING_INT, 1, I64MAX, pos_int, NULL,
     CFG(fp16.hysteresis), NOKNOB},
    {"fp16.min_loss_scale", NULL, NULL, "fp16 min_loss_scale", DSC_SETTING_NUM, 0, 0,
     "a positive number", NULL, CFG(fp16.min_loss_scale), NOKNOB},
    {"seed", NULL, NULL, "the seed", DSC_SETTING_INT, 0, I64MAX, nonneg_int, NULL, CFG(seed),
     NOKNOB},
    {"eval_every", NULL, NULL, "eval_every", DSC_SETTING_INT, 0, I64MAX, nonneg_int, NULL,
     CFG(eval_every), NOKNOB},
    {"save_every", NULL, NULL, "save_every", DSC_SETTING_INT, 0, I64MAX, nonneg_int, NULL,
     CFG(save_every), NOKNOB},
    {"log_every", NULL, NULL, "log_every", DSC_SETTING_INT, 1, I64MAX, pos_int, NULL,
     CFG(log_every), NOKNOB},
    {"checkpoint_activations", NULL, "--checkpoint-activations", "checkpoint_activations",
     DSC_SETTING_REMAT, 0, 0, "none, selective or blocks, or offload",
     "none, selective, block, blocks:K or offload", CFG(remat), KNOB(remat)},
    {"checkpoint_every", NULL, NULL, "checkpoint_every", DSC_SETTING_INT, 1, 1000000, pos_int, NULL,
     CFG(remat_every), NOKNOB},
    {"train_batch_size", NULL, "--global-batch", "the global batch", DSC_SETTING_INT, 1, I64MAX,
     pos_int, "an integer >= 1", CFG(global_batch), KNOB(global_batch)},
    {"zero", NULL, NULL, "zero", DSC_SETTING_SECTION, 0, 0, NULL, NULL, -1, NOKNOB},
    {"offload", NULL, NULL, "offload", DSC_SETTING_SECTION, 0, 0, NULL, NULL, -1, NOKNOB},
    {"zero.stage", "zero_optimization.stage", "--zero-stage", "the ZeRO stage", DSC_SETTING_INT, 0,
     3, "0, 1, 2 or 3", NULL, CFG(zero.stage), KNOB(zero_stage)},
    {"zero.overlap", NULL, NULL, "zero.overlap", DSC_SETTING_BOOL, 0, 0, "true or false", NULL, -1,
     NOKNOB},
    {"zero.prefetch", NULL, NULL, "zero.prefetch", DSC_SETTING_INT, 0, I64MAX, nonneg_int, NULL, -1,
     NOKNOB},
    {"zero.bucket", NULL, NULL, "zero.bucket", DSC_SETTING_BYTES, 0, I64MAX, size_want, NULL,
     CFG(zero.bucket_bytes), NOKNOB},
    {"zero.bucket_bytes", NULL, "--bucket-bytes", "bucket_bytes", DSC_SETTING_BYTES, 0, I64MAX,
     size_want, zero_bytes_flag, CFG(zero.bucket_bytes), KNOB(bucket_bytes)},
    {"zero.prefetch_bytes", NULL, "--prefetch-bytes", "prefetch_bytes", DSC_SETTING_BYTES, 0,
     I64MAX, size_want, zero_bytes_flag, CFG(zero.prefetch_bytes), KNOB(prefetch_bytes)},
    {"zero.reduce_each_micro_batch", NULL, "--reduce-each-micro-batch", "reduce_each_micro_batch",
     DSC_SETTING_BOOL, 0, 0, "true or false", NULL, CFG(zero.reduce_each_micro_batch),
     KNOB(reduce_each_micro_batch)},
    {"zero.persist_threshold", "zero_optimization.stage3_param_persistence_threshold",
     "--persist-threshold", "persist_threshold", DSC_SETTING_INT, 0, I64MAX,
     "a number of elements (>= 0)", NULL, CFG(zero.persist_threshold), KNOB(persist_threshold)},
    {"zero.unshard_bytes", NULL, "--unshard-bytes", "unshard_bytes", DSC_SETTING_BYTES, 0, I64MAX,
     size_want, zero_bytes_flag, CFG(zero.unshard_bytes), KNOB(unshard_bytes)},
    {"offload.optimizer", NULL, "--offload-optimizer", "the optimizer states' tier",
     DSC_SETTING_TIER, 0, 0, "one of none, cpu, host, nvme, disk",
     "none, host (cpu) or disk (nvme), or auto", CFG(offload.optimizer), KNOB(offload_optimizer)},
    {"offload.param", NULL, "--offload-param", "the param shards' tier", DSC_SETTING_TIER, 0, 0,
     "one of none, cpu, host, nvme, disk", "none, host (cpu) or disk (nvme), or auto",
     CFG(offload.param), KNOB(offload_param)},
    {"offload.prefetch_bytes", NULL, "--offload-prefetch-bytes", "offload prefetch_bytes",
     DSC_SETTING_BYTES, 0, I64MAX, size_want, "a byte count such as 0, 4096 or 64MiB",
     CFG(offload.prefetch_bytes), KNOB(offload_prefetch_bytes)},
    {"offload.io_threads", NULL, "--offload-io-threads", "offload io_threads", DSC_SETTING_INT, 1,
     64, "1 to 64", NULL, CFG(offload.io_threads), KNOB(offload_io_threads)},
    {"offload.delayed_update", NULL, "--delayed-param-update", "offload delayed_update",
     DSC_SETTING_BOOL, 0, 0, "true or false", NULL, CFG(offload.delayed_update),
     KNOB(delayed_update)},
    {"offload.overlap", NULL, "--offload-overlap", "offload overlap", DSC_SETTING_SWITCH, 0, 0,
     "true, false or auto", NULL, CFG(offload.overlap), KNOB(offload_overlap)},
    {"zenflow", NULL, NULL, "zenflow", DSC_SETTING_SECTION, 0, 0, NULL, NULL, -1, NOKNOB},
    {"zenflow.enabled", NULL, "--zenflow", "zenflow enabled", DSC_SETTING_BOOL, 0, 0,
     "true or false", NULL, CFG(zenflow.enabled), KNOB(zenflow)},
    {"zenflow.topk_ratio", NULL, NULL, "zenflow topk_ratio", DSC_SETTING_NUM, 0, 0,
     "a number in (0, 1)", NULL, CFG(zenflow.topk_ratio), NOKNOB},
    {"zenflow.select_interval", NULL, NULL, "zenflow select_interval", DSC_SETTING_INT, 1, I64MAX,
     pos_int, NULL, CFG(zenflow.select_interval), NOKNOB},
    {"zenflow.update_interval", NULL, NULL, "zenflow update_interval", DSC_SETTING_INT, 1, I64MAX,
     pos_int, NULL, CFG(zenflow.update_interval), NOKNOB},
    {"zenflow.full_warm_up_rounds", NULL, NULL, "zenflow full_warm_up_rounds", DSC_SETTING_INT, 0,
     I64MAX, nonneg_int, NULL, CFG(zenflow.warm_up), NOKNOB},
    {"zenflow.overlap_step", NULL, NULL, "zenflow overlap_step", DSC_SETTING_BOOL, 0, 0,
     "true or false", NULL, CFG(zenflow.overlap_step), NOKNOB},
};
#define N_SETTINGS ((int)(sizeof table / sizeof table[0]))

/* The optimizers' and schedules' named forms: what the frontend checks in a
 * train section and passes/train_config.c reads (by index). */
#define KEYS(...) ((const char *const[]){__VA_ARGS__, NULL})
static const dsc_setting_form optimizer_forms[] = {
    {"adamw", KEYS("lr", "betas", "eps", "weight_decay", "decay_1d")},
    {"adam", KEYS("lr", "betas", "eps", "weight_decay", "decay_1d")},
    {"sgd", KEYS("lr", "momentum", "weight_decay", "nesterov", "decay_1d")},
    {"muon", /* betas and eps, adam_lr: its AdamW part (embeddings, 1-D params) */
     KEYS("lr", "momentum", "weight_decay", "nesterov", "betas", "eps", "adam_lr", "decay_1d")},
};
static const dsc_setting_form schedule_forms[] = {
    {"constant", KEYS("warmup")},
    {"cosine", KEYS("warmup", "min_lr", "decay_steps")},
    {"linear", KEYS("warmup", "min_lr", "decay_steps")},
    {"warmup_cosine", KEYS("warmup", "min_lr", "decay_steps")},
    {"warmup_linear", KEYS("warmup", "min_lr", "decay_steps")},
    /* DeepSpeed's (docs/deepspeed.md) */
    {"warmup_lr", KEYS("warmup", "min_lr", "warmup_type")},
    {"warmup_decay_lr", KEYS("warmup", "min_lr", "decay_steps", "warmup_type")},
    {"warmup_cosine_lr",
     KEYS("warmup", "decay_steps", "warmup_type", "min_ratio", "cos_min_ratio")},
    {"one_cycle", KEYS("min_lr", "first_steps", "second_steps", "first_stairs", "second_stairs",
                       "decay_step_size", "decay_lr_rate")},
    {"lr_range_test", KEYS("step_size", "step_rate", "staircase")},
};
#undef KEYS

const dsc_setting_form *dsc_setting_forms(const dsc_setting *s, int *n) {
  *n = 0;
  if (!s) return NULL;
  if (s->kind == DSC_SETTING_OPTIMIZER)
    return *n = (int)(sizeof optimizer_forms / sizeof optimizer_forms[0]), optimizer_forms;
  if (s->kind == DSC_SETTING_SCHEDULE)
    return *n = (int)(sizeof schedule_forms / sizeof schedule_forms[0]), schedule_forms;
  return NULL;
}

int dsc_setting_count(void) { return N_SETTINGS; }
const dsc_setting *dsc_setting_at(int i) { return i >= 0 && i < N_SETTINGS ? &table[i] : NULL; }

const dsc_setting *dsc_setting_find(const char *key) {
  for (int i = 0; key && i < N_SETTINGS; i++)
    if (strcmp(table[i].key, key) == 0 || (table[i].alias && strcmp(table[i].alias, key) == 0))
      return &table[i];
  return NULL;
}

const dsc_setting *dsc_setting_find_flag(const char *flag) {
  for (int i = 0; flag && i < N_SETTINGS; i++)
    if (table[i].flag && strcmp(table[i].flag, flag) == 0) return &table[i];
  return NULL;
}

const char *dsc_setting_want(const dsc_setting *s, bool flag) {
  return flag && s->flag_want ? s->flag_want : s->want;
}

/* ---------------------------------------------------- printed values */

static void tv_fail(pass_tv_parser *p, const char *what) {
  if (!p->failed && p->ctx)
    ir_error(p->ctx, ir_no_loc, "train setting '%s': %s in '%s'", p->key, what, p->s);
  p->failed = true;
}

static void skip_ws(const char **s) {
  while (isspace((unsigned char)**s)) (*s)++;
}

static size_t ident_len(const char *s) {
  size_t n = 0;
  if (!(isalpha((unsigned char)s[0]) || s[0] == '_')) return 0;
  while (isalnum((unsigned char)s[n]) || s[n] == '_') n++;
  return n;
}

static pass_tv *tv_parse(pass_tv_parser *p, const char **s, int depth) {
  skip_ws(s);
  if (p->used == p->cap || depth > 4) return tv_fail(p, "value nested too deeply"), NULL;
  pass_tv *v = &p->pool[p->used++];
  memset(v, 0, sizeof *v);
  size_t il = ident_len(*s);
  if (il && !(il == 3 && strncmp(*s, "inf", 3) == 0) && !(il == 3 && strncmp(*s, "nan", 3) == 0)) {
    if (il >= sizeof v->name) return tv_fail(p, "name too long"), NULL;
    memcpy(v->name, *s, il);
    *s += il;
    if (strcmp(v->name, "true") == 0 || strcmp(v->name, "false") == 0) {
      v->kind = PASS_TV_BOOL;
      v->b = v->name[0] == 't';
      return v;
    }
    v->kind = PASS_TV_NAME;
    skip_ws(s);
    if (**s != '(') return v;
    v->kind = PASS_TV_CALL;
  } else if (**s == '(') {
    v->kind = PASS_TV_TUPLE;
  } else {
    char *end;
    errno = 0;
    v->num = strtod(*s, &end);
    if (end == *s || errno == ERANGE) return tv_fail(p, "expected a value"), NULL;
    v->kind = PASS_TV_NUM;
    v->is_int = strcspn(*s, ".eEin") >= (size_t)(end - *s) && v->num == floor(v->num);
    *s = end;
    return v;
  }
  (*s)++; /* '(' */
  skip_ws(s);
  if (**s == ')') {
    (*s)++;
    return v;
  }
  for (;;) {
    if (v->n == PASS_TV_MAX_ITEMS) return tv_fail(p, "too many items"), NULL;
    skip_ws(s);
    if (v->kind == PASS_TV_CALL) {
      size_t kl = ident_len(*s);
      const char *after = *s + kl;
      skip_ws(&after);
      if (kl && *after == '=') {
        if (kl >= sizeof v->keys[0]) return tv_fail(p, "name too long"), NULL;
        memcpy(v->keys[v->n], *s, kl);
        *s = after + 1;
      }
    }
    pass_tv *it = tv_parse(p, s, depth + 1);
    if (!it) return NULL;
    v->items[v->n++] = it;
    skip_ws(s);
    if (**s == ',') {
      (*s)++;
      continue;
    }
    if (**s == ')') {
      (*s)++;
      return v;
    }
    return tv_fail(p, "expected ',' or ')'"), NULL;
  }
}

pass_tv *pass_tv_parse(pass_tv_parser *p, pass_tv *pool, int cap, dsc_context *ctx, const char *key,
                       const char *text) {
  memset(p, 0, sizeof *p);
  p->pool = pool, p->cap = cap;
  p->s = text;
  p->key = key;
  p->ctx = ctx;
  const char *s = text;
  pass_tv *v = tv_parse(p, &s, 0);
  if (!v) return NULL;
  skip_ws(&s);
  if (*s) return tv_fail(p, "unexpected text after the value"), NULL;
  return v;
}

/* ------------------------------------------------- parse and range check */

bool dsc_parse_bytes(const char *s, int64_t *out) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (end == s || errno || !(v >= 0)) return false;
  double unit = 1;
  if (*end == 'K' || *end == 'k')
    unit = 1024.0, end++;
  else if (*end == 'M' || *end == 'm')
    unit = 1024.0 * 1024, end++;
  else if (*end == 'G' || *end == 'g')
    unit = 1024.0 * 1024 * 1024, end++;
  if (unit > 1 && *end == 'i') end++;
  if (*end == 'B' || *end == 'b') end++;
  if (*end || v * unit > 9.0e15) return false;
  *out = (int64_t)(v * unit);
  return true;
}

/* A flag's integer: decimal digits only (as dsc's other integer flags). */
static bool flag_int(const char *s, int64_t *out) {
  if (!*s) return false;
  for (const char *c = s; *c; c++)
    if (!(isdigit((unsigned char)*c) || (c == s && *c == '-'))) return false;
  errno = 0;
  long long v = strtoll(s, NULL, 10);
  if (errno) return false;
  *out = v;
  return true;
}

/* The enums by name: the value in v->i. */
static bool parse_name(const dsc_setting *s, const char *name, dsc_setting_value *v) {
  switch (s->kind) {
    case DSC_SETTING_PRECISION: {
      dsc_precision p; /* the names it prints: f16 is no train.precision */
      if (dsc_precision_from_name(name, &p) != 0 || strcmp(dsc_precision_name(p), name) != 0)
        return false;
      return v->i = p, true;
    }
    case DSC_SETTING_TIER: {
      dsc_offload_tier t;
      if (dsc_offload_from_name(name, &t) != 0) return false;
      return v->i = t, true;
    }
    case DSC_SETTING_SWITCH:
      for (int k = DSC_SWITCH_FALSE; k <= DSC_SWITCH_AUTO; k++)
        if (strcmp(name, dsc_switch_name((dsc_switch)k)) == 0) return v->i = k, true;
      return false;
    case DSC_SETTING_REMAT: {
      dsc_remat_policy r;
      if (dsc_remat_parse(name, &r, &v->every) != 0) return false;
      return v->i = r, true;
    }
    default:
      return false;
  }
}

bool dsc_setting_parse(const dsc_setting *s, const char *text, bool flag, dsc_setting_value *out) {
  dsc_setting_value v = {0, 0, false, 1};
  bool ok = false;
  if (!s || !text) return false;
  if (flag) {
    if (s->kind == DSC_SETTING_INT)
      ok = flag_int(text, &v.i);
    else if (s->kind == DSC_SETTING_BYTES)
      ok = dsc_parse_bytes(text, &v.i);
    else if (s->kind == DSC_SETTING_NUM) {
      char *end;
      v.num = strtod(text, &end);
      ok = *text && !*end;
    } else if (s->kind == DSC_SETTING_BOOL) {
      v.b = strcmp(text, "true") == 0;
      ok = v.b || strcmp(text, "false") == 0;
    } else
      ok = parse_name(s, text, &v);
  } else {
    pass_tv pool[4];
    pass_tv_parser p;
    const pass_tv *t = pass_tv_parse(&p, pool, 4, NULL, s->key, text);
    if (!t) return false;
    switch (s->kind) {
      case DSC_SETTING_INT:
      case DSC_SETTING_BYTES:
        ok = t->kind == PASS_TV_NUM && t->is_int && fabs(t->num) <= 9.0e15;
        v.i = ok ? (int64_t)t->num : 0;
        break;
      case DSC_SETTING_NUM:
        ok = t->kind == PASS_TV_NUM;
        v.num = t->num;
        break;
      case DSC_SETTING_BOOL:
        ok = t->kind == PASS_TV_BOOL;
        v.b = t->b;
        break;
      case DSC_SETTING_SWITCH: /* true and false are booleans in a train section */
        ok = t->kind == PASS_TV_BOOL || (t->kind == PASS_TV_NAME && parse_name(s, t->name, &v));
        if (t->kind == PASS_TV_BOOL) v.i = t->b ? DSC_SWITCH_TRUE : DSC_SWITCH_FALSE;
        break;
      case DSC_SETTING_PRECISION:
      case DSC_SETTING_TIER:
      case DSC_SETTING_REMAT:
        ok = t->kind == PASS_TV_NAME && parse_name(s, t->name, &v);
        break;
      default: /* optimizer, schedule, sections: not scalars */
        return false;
    }
  }
  if (!ok) return false;
  if ((s->kind == DSC_SETTING_INT || s->kind == DSC_SETTING_BYTES) &&
      (v.i < s->min || v.i > s->max))
    return false;
  if (s->kind == DSC_SETTING_NUM && !(v.num >= 0 && isfinite(v.num))) return false;
  if (out) *out = v;
  return true;
}

/* ------------------------------------------------------- storing values */

static void store(void *base, ptrdiff_t off, const dsc_setting *s, const dsc_setting_value *v) {
  char *p = (char *)base + off;
  switch (s->kind) {
    case DSC_SETTING_INT:
    case DSC_SETTING_BYTES:
      memcpy(p, &v->i, sizeof(int64_t)); /* int64_t fields, and the uint64_t seed */
      break;
    case DSC_SETTING_NUM:
      memcpy(p, &v->num, sizeof(double));
      break;
    case DSC_SETTING_BOOL:
      memcpy(p, &v->b, sizeof(bool));
      break;
    case DSC_SETTING_PRECISION:
    case DSC_SETTING_TIER:
    case DSC_SETTING_SWITCH:
    case DSC_SETTING_REMAT: {
      int e = (int)v->i; /* the enums are int-sized */
      memcpy(p, &e, sizeof e);
      break;
    }
    default:
      break;
  }
}

bool dsc_run_knobs_store(dsc_run_knobs *k, const dsc_setting *s, const dsc_setting_value *v) {
  if (!s || s->knob_off < 0) return false;
  store(k, s->knob_off, s, v);
  if (s->kind == DSC_SETTING_REMAT) k->remat_every = v->every;
  *(bool *)((char *)k + s->has_off) = true;
  return true;
}

bool pass_setting_store_config(dsc_train_config *cfg, const dsc_setting *s,
                               const dsc_setting_value *v) {
  if (s->cfg_off < 0) return false;
  store(cfg, s->cfg_off, s, v);
  return true;
}

/* A knob's value back as the parse's value (the range check and store
 * below go through the same functions as a parsed one). */
static dsc_setting_value knob_value(const dsc_run_knobs *k, const dsc_setting *s) {
  dsc_setting_value v = {0, 0, false, k->remat_every > 0 ? k->remat_every : 1};
  const char *p = (const char *)k + s->knob_off;
  if (s->kind == DSC_SETTING_INT || s->kind == DSC_SETTING_BYTES)
    memcpy(&v.i, p, sizeof v.i);
  else if (s->kind == DSC_SETTING_BOOL)
    memcpy(&v.b, p, sizeof v.b);
  else {
    int e;
    memcpy(&e, p, sizeof e);
    v.i = e;
  }
  return v;
}

static bool in_range(const dsc_setting *s, const dsc_setting_value *v) {
  switch (s->kind) {
    case DSC_SETTING_INT:
    case DSC_SETTING_BYTES:
      return v->i >= s->min && v->i <= s->max;
    case DSC_SETTING_PRECISION:
      return dsc_precision_name((dsc_precision)v->i) != NULL;
    case DSC_SETTING_TIER:
      return v->i >= DSC_OFFLOAD_NONE && v->i <= DSC_OFFLOAD_AUTO;
    case DSC_SETTING_SWITCH:
      return dsc_switch_name((dsc_switch)v->i) != NULL;
    case DSC_SETTING_REMAT:
      return v->i >= DSC_REMAT_NONE && v->i <= DSC_REMAT_OFFLOAD && v->every >= 1 &&
             v->every <= 1000000;
    default:
      return true;
  }
}

dsc_status dsc_run_knobs_apply(dsc_context *ctx, const char *who, const dsc_run_knobs *k,
                               dsc_train_config *cfg) {
  for (int i = 0; i < N_SETTINGS; i++) {
    const dsc_setting *s = &table[i];
    if (s->knob_off < 0 || !*(const bool *)((const char *)k + s->has_off)) continue;
    dsc_setting_value v = knob_value(k, s);
    if (!in_range(s, &v)) {
      ir_error(ctx, ir_no_loc, "%s: %s (%s, train.%s) must be %s, got %lld", who, s->what, s->flag,
               s->key, dsc_setting_want(s, true), (long long)v.i);
      return DSC_ERR_USER;
    }
    store(cfg, s->cfg_off, s, &v);
    if (s->kind == DSC_SETTING_REMAT) cfg->remat_every = v.every;
  }
  return DSC_OK;
}

bool dsc_run_knobs_set(dsc_run_knobs *k, const char *flag, const char *value) {
  const dsc_setting *s = dsc_setting_find_flag(flag);
  dsc_setting_value v;
  return s && dsc_setting_parse(s, value, true, &v) && dsc_run_knobs_store(k, s, &v);
}
