/* A DeepSpeed config (ds_config.json) as one more layer of dsc's settings:
 * defaults < the model's train section < the JSON < command-line flags.
 * Each key DeepSpeed defines is read with DeepSpeed's meaning and becomes
 * a train setting in the train section's syntax (so the one settings table,
 * passes/settings.c, checks it); the batch triple follows DeepSpeed's rule
 * train_batch_size = micro x accumulation x world. Keys DeepSpeed defines
 * that dsc does not implement get a warning that names what dsc does
 * instead; unknown keys an error with a suggestion; every message points at
 * the key's line and column. docs/deepspeed.md has the table. */
#include <ctype.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "driver/driver.h"
#include "frontend/frontend.h"
#include "passes/passes.h"

/* ---------------------------------------------------- where keys are */

/* The position of every object key, by dotted path ("zero_optimization.
 * stage"): cJSON keeps none, so a small scanner of the same text finds them. */
typedef struct {
  char path[160];
  int line, col;
} key_pos;

typedef struct {
  dsc_context *ctx;
  const char *file; /* as the diagnostics name it (registered with its text) */
  const char *text;
  key_pos *pos;
  int n_pos, cap_pos;
  ir_arena *arena;
  drv_ds_config *out;
  bool failed;
} ds_reader;

static void scan_string(const char **s, char *buf, size_t n, int *col) {
  size_t k = 0;
  (*s)++, (*col)++;
  while (**s && **s != '"') {
    if (**s == '\\' && (*s)[1]) (*s)++, (*col)++;
    if (k + 1 < n) buf[k++] = **s;
    (*s)++, (*col)++;
  }
  buf[k] = 0;
  if (**s) (*s)++, (*col)++;
}

/* Records every key's path and position (the JSON is known to parse). */
static void index_keys(ds_reader *r) {
  char stack[16][160];
  bool is_obj[16];
  int depth = 0, line = 1, col = 1;
  const char *s = r->text;
  char last[128] = "";
  bool expect_key = false;
  stack[0][0] = 0;
  while (*s) {
    char c = *s;
    if (c == '\n') {
      line++, col = 1, s++;
      continue;
    }
    if (c == '"') {
      int l0 = line, c0 = col;
      char buf[128];
      scan_string(&s, buf, sizeof buf, &col);
      const char *t = s;
      while (*t == ' ' || *t == '\t' || *t == '\r' || *t == '\n') t++;
      if (expect_key && *t == ':' && depth > 0 && depth <= 16 && is_obj[depth - 1]) {
        snprintf(last, sizeof last, "%s", buf);
        if (ir_grow(r->arena, (void **)&r->pos, &r->cap_pos, r->n_pos + 1, sizeof(key_pos))) {
          key_pos *p = &r->pos[r->n_pos++];
          snprintf(p->path, sizeof p->path, "%s%s%s", stack[depth - 1], *stack[depth - 1] ? "." : "",
                   buf);
          p->line = l0, p->col = c0;
        }
        expect_key = false;
      }
      continue;
    }
    if (c == '{' || c == '[') {
      /* an object value's path is its key's; array items keep the array's;
       * past 16 levels keys get no place (depth still counts) */
      if (depth < 16) {
        char here[160];
        const char *parent = depth > 0 ? stack[depth - 1] : "";
        if (depth > 0 && is_obj[depth - 1] && *last)
          snprintf(here, sizeof here, "%s%s%s", parent, *parent ? "." : "", last);
        else
          snprintf(here, sizeof here, "%s", parent);
        memcpy(stack[depth], here, sizeof here);
        is_obj[depth] = c == '{';
      }
      depth++;
      expect_key = c == '{';
      last[0] = 0;
    } else if ((c == '}' || c == ']') && depth > 0) {
      depth--;
      last[0] = 0;
    } else if (c == ',') {
      expect_key = depth > 0 && depth <= 16 && is_obj[depth - 1];
      last[0] = 0;
    }
    s++, col++;
  }
}

static dsc_loc key_loc(const ds_reader *r, const char *path) {
  for (int i = 0; i < r->n_pos; i++)
    if (strcmp(r->pos[i].path, path) == 0) {
      dsc_loc l = {r->file, r->pos[i].line, r->pos[i].col};
      return l;
    }
  dsc_loc none = {r->file, 0, 0};
  return none;
}

/* ---------------------------------------------------- messages */

static void err(ds_reader *r, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void err(ds_reader *r, const char *path, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  ir_diag_v(r->ctx, DSC_DIAG_ERROR, key_loc(r, path), fmt, ap);
  va_end(ap);
  r->failed = true;
}

static void warn(ds_reader *r, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void warn(ds_reader *r, const char *path, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  ir_diag_v(r->ctx, DSC_DIAG_WARNING, key_loc(r, path), fmt, ap);
  va_end(ap);
}

static const char *type_name(const cJSON *v) {
  if (cJSON_IsBool(v)) return "a boolean";
  if (cJSON_IsNumber(v)) return "a number";
  if (cJSON_IsString(v)) return "a string";
  if (cJSON_IsArray(v)) return "an array";
  if (cJSON_IsObject(v)) return "an object";
  return "null";
}

static void value_text(const cJSON *v, char *buf, size_t n) {
  char *p = cJSON_PrintUnformatted(v);
  snprintf(buf, n, "%s", p ? p : "?");
  if (strlen(buf) > 60) strcpy(buf + 57, "...");
  free(p);
}

static void bad_type(ds_reader *r, const char *path, const cJSON *v, const char *want) {
  char t[80];
  value_text(v, t, sizeof t);
  err(r, path, "ds_config '%s' must be %s, got %s (%s)", path, want, t, type_name(v));
}

/* ---------------------------------------------------- the settings made */

static bool is_auto(const cJSON *v) { return cJSON_IsString(v) && strcmp(v->valuestring, "auto") == 0; }

/* x as the text IR prints numbers: the shortest text that reads back as x. */
static const char *fmt_num(ds_reader *r, double x) {
  char b[40];
  ir_format_double(x, b, sizeof b);
  return ir_arena_strdup(r->arena, b);
}

/* A train setting from key `path` (NULL, reported, when out of memory). */
static drv_ds_setting *put(ds_reader *r, const char *path, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static drv_ds_setting *put(ds_reader *r, const char *path, const char *key, const char *fmt, ...) {
  drv_ds_config *o = r->out;
  char value[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(value, sizeof value, fmt, ap);
  va_end(ap);
  drv_ds_setting *s = NULL;
  for (int i = 0; i < o->n && !s; i++)
    if (strcmp(o->set[i].key, key) == 0) s = &o->set[i]; /* a later key of the same setting wins */
  if (!s) {
    if (!ir_grow(r->arena, (void **)&o->set, &o->cap, o->n + 1, sizeof(drv_ds_setting))) {
      err(r, path, "out of memory reading the ds_config");
      return NULL;
    }
    s = &o->set[o->n++];
    s->key = key;
  }
  s->value = ir_arena_strdup(r->arena, value);
  s->from = ir_arena_strdup(r->arena, path);
  s->loc = key_loc(r, path);
  s->elements = false;
  if (!s->value || !s->from) err(r, path, "out of memory reading the ds_config");
  return s;
}

/* A byte-count setting DeepSpeed gives in elements: scaled when applied by
 * the bytes of the gradients (bucket) or params (prefetch) the module
 * then holds, 2 with bf16/fp16 master weights, else 4. */
static void put_elements(ds_reader *r, const char *path, const char *key, int64_t n) {
  drv_ds_setting *s = put(r, path, key, "%" PRId64, n);
  if (s) s->elements = true;
}

static void note_auto(ds_reader *r, const char *path, const char *what) {
  drv_ds_config *o = r->out;
  if (o->n_auto < DRV_DS_AUTO_MAX) {
    o->autos[o->n_auto].path = ir_arena_strdup(r->arena, path);
    o->autos[o->n_auto].what = what;
    o->n_auto++;
  }
}

/* An integer >= min into *out; false (nothing stored) for a bad value,
 * reported, and for "auto" where auto_what says what decides instead. */
static bool get_int(ds_reader *r, const char *path, const cJSON *v, int64_t min, int64_t *out,
                    const char *auto_what) {
  if (auto_what && is_auto(v)) return note_auto(r, path, auto_what), false;
  if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < (double)min ||
      v->valuedouble > 9e15) {
    char want[64];
    snprintf(want, sizeof want, "an integer >= %" PRId64 "%s", min, auto_what ? " or \"auto\"" : "");
    bad_type(r, path, v, want);
    return false;
  }
  *out = (int64_t)v->valuedouble;
  return true;
}

static bool get_num(ds_reader *r, const char *path, const cJSON *v, double *out,
                    const char *auto_what) {
  if (auto_what && is_auto(v)) return note_auto(r, path, auto_what), false;
  if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0) || isinf(v->valuedouble)) {
    bad_type(r, path, v, auto_what ? "a non-negative number or \"auto\"" : "a non-negative number");
    return false;
  }
  *out = v->valuedouble;
  return true;
}

static bool get_bool(ds_reader *r, const char *path, const cJSON *v, bool *out,
                     const char *auto_what) {
  if (auto_what && is_auto(v)) return note_auto(r, path, auto_what), false;
  if (!cJSON_IsBool(v)) {
    bad_type(r, path, v, auto_what ? "true, false or \"auto\"" : "true or false");
    return false;
  }
  *out = cJSON_IsTrue(v);
  return true;
}

/* ---------------------------------------------------- the keys */

typedef enum { K_MAPPED, K_UNUSED, K_NOT_YET } key_kind;

typedef struct {
  const char *name;
  key_kind kind;
  const char *instead; /* K_UNUSED / K_NOT_YET: what dsc does instead */
} known_key;

static const char *path_of(ds_reader *r, const char *parent, const char *name) {
  return *parent ? ir_arena_printf(r->arena, "%s.%s", parent, name) : name;
}

static const cJSON *member(const cJSON *obj, const char *name) {
  return cJSON_GetObjectItemCaseSensitive(obj, name);
}

/* A feature turned off: false, 0, or an object with "enabled": false. */
static bool is_off(const cJSON *v) {
  if (cJSON_IsFalse(v) || (cJSON_IsNumber(v) && v->valuedouble == 0)) return true;
  return cJSON_IsObject(v) && cJSON_IsFalse(member(v, "enabled"));
}

/* Warns about, or refuses, each key of object `obj` (at `parent`) that is
 * not a K_MAPPED one of keys[]. */
static void check_keys(ds_reader *r, const cJSON *obj, const char *parent, const known_key *keys,
                       int n) {
  const char *names[96];
  for (int i = 0; i < n && i < 96; i++) names[i] = keys[i].name;
  for (const cJSON *c = obj->child; c; c = c->next) {
    const char *path = path_of(r, parent, c->string);
    int k = -1;
    for (int i = 0; i < n; i++)
      if (strcmp(keys[i].name, c->string) == 0) k = i;
    if (k < 0) {
      const char *s = fe_suggest(c->string, names, n < 96 ? n : 96);
      if (s)
        err(r, path, "unknown ds_config key '%s'; did you mean '%s'?", path, s);
      else
        err(r, path, "unknown ds_config key '%s' (DeepSpeed defines no such key%s%s)", path,
            *parent ? " in " : "", parent);
    } else if (is_off(c)) {
      continue; /* false, or {"enabled": false}: off, as dsc is */
    } else if (keys[k].kind == K_UNUSED) {
      warn(r, path, "ds_config '%s' has no effect in dsc: %s", path, keys[k].instead);
    } else if (keys[k].kind == K_NOT_YET) {
      warn(r, path, "ds_config '%s' is not implemented in dsc yet: %s", path, keys[k].instead);
    }
  }
}

static bool want_object(ds_reader *r, const char *path, const cJSON *v) {
  if (cJSON_IsObject(v)) return true;
  bad_type(r, path, v, "an object");
  return false;
}

/* a number >= 0, in [0, 1), an integer >= 1, an integer >= 0 */
typedef enum { F_NUM, F_FRACTION, F_COUNT, F_INT } field_kind;

/* One optimizer or scheduler param `name` of object `params` (at `parent`):
 * absent (DeepSpeed's default), "auto" (the model's value) or given. A
 * null is absent where DeepSpeed's default is None (null_absent). */
static void ds_field_null(ds_reader *r, const cJSON *params, const char *parent, const char *name,
                          drv_ds_opt_field *f, field_kind kind, bool null_absent) {
  const cJSON *v = member(params, name);
  if (!v || (null_absent && cJSON_IsNull(v))) return;
  const char *path = ir_arena_printf(r->arena, "%s.%s", parent, name);
  if (is_auto(v)) {
    f->state = DRV_DS_AUTO;
    note_auto(r, path, "the model's value");
    return;
  }
  double x;
  int64_t i;
  bool integer = kind == F_COUNT || kind == F_INT;
  if (integer ? !get_int(r, path, v, kind == F_COUNT ? 1 : 0, &i, NULL)
              : !get_num(r, path, v, &x, NULL))
    return;
  if (integer) x = (double)i;
  if (kind == F_FRACTION && !(x < 1)) {
    bad_type(r, path, v, "a number in [0, 1)");
    return;
  }
  f->state = DRV_DS_GIVEN, f->v = x;
}

static void ds_field(ds_reader *r, const cJSON *params, const char *parent, const char *name,
                     drv_ds_opt_field *f, field_kind kind) {
  ds_field_null(r, params, parent, name, f, kind, false);
}

/* "optimizer": {"type": ..., "params": {...}} with DeepSpeed's names; the
 * train setting is made when applied (its "auto" values are the model's). */
static void read_optimizer(ds_reader *r, const cJSON *o) {
  static const known_key keys[] = {{"type", K_MAPPED, NULL}, {"params", K_MAPPED, NULL}};
  if (!want_object(r, "optimizer", o)) return;
  check_keys(r, o, "optimizer", keys, 2);
  const cJSON *type = member(o, "type"), *params = member(o, "params");
  if (!cJSON_IsString(type)) {
    if (type) bad_type(r, "optimizer.type", type, "a string (Adam, AdamW, SGD or Muon)");
    else err(r, "optimizer", "ds_config 'optimizer' needs a \"type\" (Adam, AdamW, SGD or Muon)");
    return;
  }
  char t[32];
  size_t i = 0;
  for (; type->valuestring[i] && i + 1 < sizeof t; i++) t[i] = (char)tolower((unsigned char)type->valuestring[i]);
  t[i] = 0;
  drv_ds_opt *op = &r->out->opt;
  memset(op, 0, sizeof *op);
  if (strcmp(t, "adam") == 0 || strcmp(t, "adamw") == 0)
    op->kind = DSC_OPT_ADAMW;
  else if (strcmp(t, "sgd") == 0)
    op->kind = DSC_OPT_SGD;
  else if (strcmp(t, "muon") == 0)
    op->kind = DSC_OPT_MUON;
  else {
    err(r, "optimizer.type",
        "ds_config optimizer type '%s' is not one dsc implements (Adam, AdamW, SGD, Muon)",
        type->valuestring);
    return;
  }
  op->loc = key_loc(r, "optimizer.type");
  bool adam = op->kind == DSC_OPT_ADAMW;
  static const known_key pkeys[] = {
      {"lr", K_MAPPED, NULL},
      {"betas", K_MAPPED, NULL},
      {"eps", K_MAPPED, NULL},
      {"weight_decay", K_MAPPED, NULL},
      {"momentum", K_MAPPED, NULL},
      {"nesterov", K_MAPPED, NULL},
      {"adam_w_mode", K_MAPPED, NULL},
      {"bias_correction", K_MAPPED, NULL},
      {"torch_adam", K_UNUSED, "dsc runs its own fused update"},
      {"fused", K_UNUSED, "dsc runs its own fused update"},
      {"amsgrad", K_NOT_YET, "AdamW without amsgrad runs"},
      {"dampening", K_NOT_YET, "SGD without dampening runs"},
  };
  bool adam_w = true;
  if (params && want_object(r, "optimizer.params", params)) {
    check_keys(r, params, "optimizer.params", pkeys, (int)(sizeof pkeys / sizeof pkeys[0]));
    ds_field(r, params, "optimizer.params", "lr", &op->lr, F_NUM);
    ds_field(r, params, "optimizer.params", "weight_decay", &op->weight_decay, F_NUM);
    ds_field(r, params, "optimizer.params", "eps", &op->eps, F_NUM);
    ds_field(r, params, "optimizer.params", "momentum", &op->momentum, F_FRACTION);
    const cJSON *v = member(params, "betas");
    if (v && is_auto(v)) {
      op->beta1.state = op->beta2.state = DRV_DS_AUTO;
      note_auto(r, "optimizer.params.betas", "the model's value");
    } else if (v) {
      const cJSON *b0 = cJSON_GetArrayItem(v, 0), *b1 = cJSON_GetArrayItem(v, 1);
      if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) != 2 || !cJSON_IsNumber(b0) ||
          !cJSON_IsNumber(b1) || !(b0->valuedouble >= 0 && b0->valuedouble < 1) ||
          !(b1->valuedouble >= 0 && b1->valuedouble < 1))
        bad_type(r, "optimizer.params.betas", v, "an array of two numbers in [0, 1)");
      else
        op->beta1 = (drv_ds_opt_field){DRV_DS_GIVEN, b0->valuedouble},
        op->beta2 = (drv_ds_opt_field){DRV_DS_GIVEN, b1->valuedouble};
    }
    if ((v = member(params, "nesterov"))) get_bool(r, "optimizer.params.nesterov", v, &op->nesterov, NULL);
    if ((v = member(params, "adam_w_mode"))) get_bool(r, "optimizer.params.adam_w_mode", v, &adam_w, NULL);
    bool bc = true;
    if ((v = member(params, "bias_correction")) &&
        get_bool(r, "optimizer.params.bias_correction", v, &bc, NULL) && !bc)
      err(r, "optimizer.params.bias_correction",
          "ds_config Adam without bias correction is not implemented in dsc");
    if (!adam && (op->beta1.state || op->eps.state) && op->kind == DSC_OPT_SGD)
      err(r, "optimizer.params", "ds_config optimizer SGD has no betas or eps");
    if (adam && op->momentum.state)
      err(r, "optimizer.params.momentum", "ds_config optimizer %s has no momentum (it has betas)",
          type->valuestring);
    if (adam && op->nesterov)
      err(r, "optimizer.params.nesterov", "ds_config optimizer %s has no nesterov", type->valuestring);
  }
  if (adam && !adam_w && !(op->weight_decay.state == DRV_DS_GIVEN && op->weight_decay.v == 0))
    err(r, "optimizer.params.adam_w_mode",
        "ds_config Adam with adam_w_mode false (L2 weight decay in the gradient) is not "
        "implemented in dsc; use adam_w_mode true (decoupled weight decay, DeepSpeed's default)");
  op->given = true;
  /* where --print-config says the three settings come from ("auto": the model) */
  op->src[0] = (drv_ds_setting){.key = "optimizer", .from = "optimizer", .loc = op->loc};
  if (op->lr.state != DRV_DS_AUTO)
    op->src[1] = (drv_ds_setting){.key = "lr", .from = "optimizer.params.lr", .loc = op->loc};
  if (op->weight_decay.state != DRV_DS_AUTO)
    op->src[2] = (drv_ds_setting){.key = "weight_decay", .from = "optimizer.params.weight_decay", .loc = op->loc};
}

/* "scheduler": DeepSpeed's WarmupLR, WarmupDecayLR, WarmupCosineLR,
 * OneCycle and LRRangeTest with their params (made the train setting when
 * applied: "auto" values are the model's). */
static void read_scheduler(ds_reader *r, const cJSON *o) {
  static const known_key keys[] = {{"type", K_MAPPED, NULL}, {"params", K_MAPPED, NULL}};
  static const char *const types = "WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle, LRRangeTest";
  if (!want_object(r, "scheduler", o)) return;
  check_keys(r, o, "scheduler", keys, 2);
  const cJSON *type = member(o, "type"), *params = member(o, "params");
  if (!cJSON_IsString(type)) {
    if (type)
      bad_type(r, "scheduler.type", type, ir_arena_printf(r->arena, "a string (%s)", types));
    else
      err(r, "scheduler", "ds_config 'scheduler' needs a \"type\" (%s)", types);
    return;
  }
  drv_ds_sched *sc = &r->out->sched;
  memset(sc, 0, sizeof *sc);
  const char *t = type->valuestring;
  static const struct {
    const char *name;
    dsc_schedule_kind kind;
  } kinds[] = {{"WarmupLR", DSC_SCHED_WARMUP_LR},
               {"WarmupDecayLR", DSC_SCHED_WARMUP_DECAY_LR},
               {"WarmupCosineLR", DSC_SCHED_WARMUP_COSINE_LR},
               {"OneCycle", DSC_SCHED_ONE_CYCLE},
               {"LRRangeTest", DSC_SCHED_LR_RANGE_TEST}};
  int which = -1;
  for (int k = 0; k < 5; k++)
    if (strcmp(t, kinds[k].name) == 0) which = k;
  if (which < 0) {
    err(r, "scheduler.type", "ds_config scheduler type '%s' is not one dsc implements (%s)", t,
        types);
    return;
  }
  sc->kind = kinds[which].kind;
  sc->loc = sc->momentum_loc = key_loc(r, "scheduler.type");
  sc->cycle_momentum = true; /* OneCycle's default */
  bool cosine = sc->kind == DSC_SCHED_WARMUP_COSINE_LR, decay = sc->kind == DSC_SCHED_WARMUP_DECAY_LR;
  bool cycle = sc->kind == DSC_SCHED_ONE_CYCLE, range = sc->kind == DSC_SCHED_LR_RANGE_TEST;
  static const char *const warmup_keys[] = {"warmup_num_steps", "warmup_type", "warmup_min_lr",
                                            "warmup_max_lr", "total_num_steps"};
  static const char *const cosine_keys[] = {"warmup_num_steps", "warmup_type", "warmup_min_ratio",
                                            "cos_min_ratio", "total_num_steps"};
  static const char *const cycle_keys[] = {"cycle_min_lr",
                                           "cycle_max_lr",
                                           "decay_lr_rate",
                                           "cycle_first_step_size",
                                           "cycle_second_step_size",
                                           "cycle_first_stair_count",
                                           "cycle_second_stair_count",
                                           "decay_step_size",
                                           "cycle_momentum",
                                           "cycle_min_mom",
                                           "cycle_max_mom",
                                           "decay_mom_rate"};
  static const char *const range_keys[] = {"lr_range_test_min_lr", "lr_range_test_step_size",
                                           "lr_range_test_step_rate", "lr_range_test_staircase"};
  const char *const *names = cycle    ? cycle_keys
                             : range  ? range_keys
                             : cosine ? cosine_keys
                                      : warmup_keys;
  int n_names = cycle ? 12 : range ? 4 : decay || cosine ? 5 : 4;
  known_key pkeys[16];
  int np = 0;
  pkeys[np++] = (known_key){"last_batch_iteration", K_MAPPED, NULL};
  for (int k = 0; k < n_names; k++) pkeys[np++] = (known_key){names[k], K_MAPPED, NULL};
  if (params && want_object(r, "scheduler.params", params)) {
    check_keys(r, params, "scheduler.params", pkeys, np);
    static const char *const P = "scheduler.params";
    const cJSON *v;
    if (cycle) {
      ds_field(r, params, P, "cycle_min_lr", &sc->min_lr, F_NUM);
      ds_field(r, params, P, "cycle_max_lr", &sc->max_lr, F_NUM);
      ds_field(r, params, P, "decay_lr_rate", &sc->decay_rate, F_NUM);
      ds_field(r, params, P, "cycle_first_step_size", &sc->first, F_COUNT);
      ds_field_null(r, params, P, "cycle_second_step_size", &sc->second, F_INT, true);
      ds_field(r, params, P, "cycle_first_stair_count", &sc->first_stairs, F_INT);
      ds_field_null(r, params, P, "cycle_second_stair_count", &sc->second_stairs, F_INT, true);
      ds_field(r, params, P, "decay_step_size", &sc->decay_size, F_INT);
      ds_field(r, params, P, "cycle_min_mom", &sc->min_mom, F_NUM);
      ds_field(r, params, P, "cycle_max_mom", &sc->max_mom, F_NUM);
      drv_ds_opt_field mom_rate = {0, 0};
      ds_field(r, params, P, "decay_mom_rate", &mom_rate, F_NUM);
      if ((v = member(params, "cycle_momentum"))) {
        get_bool(r, "scheduler.params.cycle_momentum", v, &sc->cycle_momentum, NULL);
        sc->momentum_loc = key_loc(r, "scheduler.params.cycle_momentum");
      }
    } else if (range) {
      ds_field(r, params, P, "lr_range_test_min_lr", &sc->max_lr, F_NUM);
      ds_field(r, params, P, "lr_range_test_step_size", &sc->step_size, F_COUNT);
      ds_field(r, params, P, "lr_range_test_step_rate", &sc->step_rate, F_NUM);
      if ((v = member(params, "lr_range_test_staircase")))
        get_bool(r, "scheduler.params.lr_range_test_staircase", v, &sc->staircase, NULL);
    } else {
      ds_field(r, params, P, "warmup_min_lr", &sc->min_lr, F_NUM);
      ds_field(r, params, P, "warmup_max_lr", &sc->max_lr, F_NUM);
      ds_field(r, params, P, "warmup_num_steps", &sc->warmup, F_COUNT);
      ds_field(r, params, P, "total_num_steps", &sc->total, F_COUNT);
      ds_field(r, params, P, "warmup_min_ratio", &sc->min_ratio, F_NUM);
      ds_field(r, params, P, "cos_min_ratio", &sc->cos_min_ratio, F_NUM);
      v = member(params, "warmup_type");
      if (v) {
        if (!cJSON_IsString(v) ||
            (strcmp(v->valuestring, "log") != 0 && strcmp(v->valuestring, "linear") != 0))
          bad_type(r, "scheduler.params.warmup_type", v, "\"log\" or \"linear\"");
        else
          sc->linear = strcmp(v->valuestring, "linear") == 0;
      }
    }
    if ((v = member(params, "last_batch_iteration")) && !is_auto(v) &&
        (!cJSON_IsNumber(v) || v->valuedouble != -1))
      err(r, "scheduler.params.last_batch_iteration",
          "ds_config scheduler last_batch_iteration other than -1 is not implemented in dsc (a "
          "resumed run keeps its step from the checkpoint)");
  }
  if (decay && sc->total.state == DRV_DS_ABSENT)
    err(r, "scheduler", "ds_config scheduler WarmupDecayLR needs params.total_num_steps (or \"auto\": the run's steps)");
  if (cosine && sc->total.state == DRV_DS_ABSENT)
    err(r, "scheduler", "ds_config scheduler WarmupCosineLR needs params.total_num_steps (or \"auto\": the run's steps)");
  /* OneCycle(optimizer, cycle_min_lr, cycle_max_lr, ...): DeepSpeed's engine
   * passes the params as keywords, and without these two it fails */
  if (cycle && sc->min_lr.state == DRV_DS_ABSENT)
    err(r, "scheduler",
        "ds_config scheduler OneCycle needs params.cycle_min_lr (DeepSpeed's OneCycle has no "
        "default for it; \"auto\": the model's min_lr)");
  if (cycle && sc->max_lr.state == DRV_DS_ABSENT)
    err(r, "scheduler",
        "ds_config scheduler OneCycle needs params.cycle_max_lr (DeepSpeed's OneCycle has no "
        "default for it; \"auto\": the optimizer's lr)");
  sc->given = true;
  r->out->sched_src = (drv_ds_setting){.key = "schedule", .from = "scheduler", .loc = sc->loc};
  const char *lr_key = cycle   ? "scheduler.params.cycle_max_lr"
                       : range ? "scheduler.params.lr_range_test_min_lr"
                               : "scheduler.params.warmup_max_lr";
  if (!cosine && sc->max_lr.state != DRV_DS_AUTO)
    r->out->sched_lr_src = (drv_ds_setting){.key = "lr", .from = lr_key, .loc = sc->loc};
}

static void read_precision(ds_reader *r, const cJSON *root) {
  static const known_key bkeys[] = {{"enabled", K_MAPPED, NULL},
                                    {"immediate_grad_update", K_UNUSED, "gradients go to the update as they are reduced"},
                                    {"check_grad_overflow", K_UNUSED, "bf16 steps are never skipped"}};
  static const known_key fkeys[] = {
      {"enabled", K_MAPPED, NULL},          {"loss_scale", K_MAPPED, NULL},
      {"initial_scale_power", K_MAPPED, NULL}, {"loss_scale_window", K_MAPPED, NULL},
      {"hysteresis", K_MAPPED, NULL},       {"min_loss_scale", K_MAPPED, NULL},
      {"consecutive_hysteresis", K_NOT_YET, "hysteresis is not consecutive (DeepSpeed's default)"},
      {"auto_cast", K_UNUSED, "the precision pass casts the forward's inputs"},
      {"fp16_master_weights_and_grads", K_NOT_YET, "the master weights are f32"}};
  bool bf = false, fp = false;
  for (int k = 0; k < 2; k++) {
    const char *name = k ? "bfloat16" : "bf16";
    const cJSON *b = member(root, name);
    if (!b || !want_object(r, name, b)) continue;
    check_keys(r, b, name, bkeys, 3);
    const cJSON *e = member(b, "enabled");
    bool on = false;
    if (e && get_bool(r, ir_arena_printf(r->arena, "%s.enabled", name), e, &on, "the model's precision") && on) {
      bf = true;
      put(r, ir_arena_printf(r->arena, "%s.enabled", name), "precision", "bf16");
    }
  }
  const cJSON *f = member(root, "fp16");
  if (f && want_object(r, "fp16", f)) {
    check_keys(r, f, "fp16", fkeys, (int)(sizeof fkeys / sizeof fkeys[0]));
    const cJSON *v = member(f, "enabled");
    if (v && get_bool(r, "fp16.enabled", v, &fp, "the model's precision") && fp)
      put(r, "fp16.enabled", "precision", "fp16");
    double ls = 0;
    if ((v = member(f, "loss_scale")) && get_num(r, "fp16.loss_scale", v, &ls, NULL) && ls != 0)
      err(r, "fp16.loss_scale",
          "ds_config fp16 static loss_scale %g is not implemented in dsc; 0 (dynamic scaling) is",
          ls);
    int64_t i;
    static const char *const ints[] = {"initial_scale_power", "loss_scale_window", "hysteresis"};
    for (int k = 0; k < 3; k++)
      if ((v = member(f, ints[k]))) {
        const char *path = ir_arena_printf(r->arena, "fp16.%s", ints[k]);
        if (get_int(r, path, v, k ? 1 : 0, &i, "dsc's default")) put(r, path, path, "%" PRId64, i);
      }
    double mls;
    if ((v = member(f, "min_loss_scale")) && get_num(r, "fp16.min_loss_scale", v, &mls, "dsc's default"))
      put(r, "fp16.min_loss_scale", "fp16.min_loss_scale", "%s", fmt_num(r, mls));
  }
  if (bf && fp) err(r, "fp16.enabled", "ds_config enables both bf16 and fp16; enable one");
}

static void read_offload(ds_reader *r, const cJSON *o, const char *name, const char *key) {
  static const known_key keys[] = {
      {"device", K_MAPPED, NULL},
      {"nvme_path", K_MAPPED, NULL},
      {"pin_memory", K_UNUSED, "host buffers are allocated once and reused"},
      {"buffer_count", K_UNUSED, "the disk tier streams through train.offload.prefetch_bytes"},
      {"buffer_size", K_UNUSED, "the disk tier streams through train.offload.prefetch_bytes"},
      {"max_in_cpu", K_UNUSED, "the host tier holds what is offloaded to it"},
      {"fast_init", K_UNUSED, "offloaded states are initialised where they live"},
      {"ratio", K_NOT_YET, "all of the optimizer states move (offload auto moves a part: --offload-optimizer auto)"},
  };
  const char *path = ir_arena_printf(r->arena, "zero_optimization.%s", name);
  if (!want_object(r, path, o)) return;
  check_keys(r, o, path, keys, (int)(sizeof keys / sizeof keys[0]));
  const cJSON *d = member(o, "device"), *np = member(o, "nvme_path");
  const char *dp = ir_arena_printf(r->arena, "%s.device", path);
  if (d && !is_auto(d)) {
    if (!cJSON_IsString(d) || (strcmp(d->valuestring, "none") != 0 && strcmp(d->valuestring, "cpu") != 0 &&
                               strcmp(d->valuestring, "nvme") != 0))
      bad_type(r, dp, d, "one of \"none\", \"cpu\", \"nvme\"");
    else
      put(r, dp, key, "%s", strcmp(d->valuestring, "cpu") == 0 ? "host" : strcmp(d->valuestring, "nvme") == 0 ? "disk" : "none");
  }
  if (np) {
    if (!cJSON_IsString(np) || !*np->valuestring)
      bad_type(r, ir_arena_printf(r->arena, "%s.nvme_path", path), np, "a directory path");
    else
      r->out->offload_dir = ir_arena_strdup(r->arena, np->valuestring);
  }
}

/* zero_optimization.zenflow: its presence turns ZenFlow on (DeepSpeed's
 * rule); the intervals are steps ("step" strategy). */
static void read_zenflow(ds_reader *r, const cJSON *z) {
  static const known_key keys[] = {
      {"topk_ratio", K_MAPPED, NULL},
      {"select_strategy", K_MAPPED, NULL},
      {"select_interval", K_MAPPED, NULL},
      {"update_interval", K_MAPPED, NULL},
      {"full_warm_up_rounds", K_MAPPED, NULL},
      {"overlap_step", K_MAPPED, NULL},
      {"offload", K_NOT_YET, "the selective moments stay on the device"},
      {"auto_ratio", K_UNUSED, "update_interval is fixed (\"auto\" is not implemented)"},
      {"pt_reserved_cores_perc", K_UNUSED, "the host step runs on the executor's threads"},
      {"steps_per_epoch", K_UNUSED, "select_interval counts steps"},
  };
  const char *path = "zero_optimization.zenflow";
  if (!want_object(r, path, z)) return;
  check_keys(r, z, path, keys, (int)(sizeof keys / sizeof keys[0]));
  put(r, path, "zenflow.enabled", "true");
  const cJSON *v;
  double ratio;
  if ((v = member(z, "topk_ratio")) &&
      get_num(r, "zero_optimization.zenflow.topk_ratio", v, &ratio, NULL)) {
    if (!(ratio > 0 && ratio < 1))
      err(r, "zero_optimization.zenflow.topk_ratio",
          "ds_config zero_optimization.zenflow.topk_ratio must be in (0, 1), got %g", ratio);
    else
      put(r, "zero_optimization.zenflow.topk_ratio", "zenflow.topk_ratio", "%s", fmt_num(r, ratio));
  }
  if ((v = member(z, "select_strategy"))) {
    const char *sp = "zero_optimization.zenflow.select_strategy";
    if (!cJSON_IsString(v) ||
        (strcmp(v->valuestring, "auto") != 0 && strcmp(v->valuestring, "step") != 0 &&
         strcmp(v->valuestring, "epoch") != 0))
      bad_type(r, sp, v, "one of \"auto\", \"step\", \"epoch\"");
    else if (strcmp(v->valuestring, "step") != 0)
      err(r, sp,
          "ds_config %s \"%s\" (a selection once per epoch) is not implemented in dsc; use "
          "\"step\" with select_interval in steps",
          sp, v->valuestring);
  }
  static const char *const ints[] = {"select_interval", "update_interval", "full_warm_up_rounds"};
  static const char *const to[] = {"zenflow.select_interval", "zenflow.update_interval",
                                   "zenflow.full_warm_up_rounds"};
  for (int k = 0; k < 3; k++) {
    int64_t i;
    const char *ip = ir_arena_printf(r->arena, "%s.%s", path, ints[k]);
    if (!(v = member(z, ints[k]))) continue;
    if (k < 2 && is_auto(v)) {
      err(r, ip,
          "ds_config %s \"auto\" (DeepSpeed's %s) is not implemented in dsc; give a number of "
          "steps",
          ip, k == 0 ? "once per epoch" : "adaptive interval from auto_ratio");
      continue;
    }
    if (get_int(r, ip, v, k < 2 ? 1 : 0, &i, NULL)) put(r, ip, to[k], "%" PRId64, i);
  }
  bool b;
  if ((v = member(z, "overlap_step")) &&
      get_bool(r, "zero_optimization.zenflow.overlap_step", v, &b, NULL))
    put(r, "zero_optimization.zenflow.overlap_step", "zenflow.overlap_step", "%s",
        b ? "true" : "false");
}

static void read_zero(ds_reader *r, const cJSON *z) {
  static const known_key keys[] = {
      {"stage", K_MAPPED, NULL},
      {"reduce_bucket_size", K_MAPPED, NULL},
      {"stage3_prefetch_bucket_size", K_MAPPED, NULL},
      {"stage3_param_persistence_threshold", K_MAPPED, NULL},
      {"offload_optimizer", K_MAPPED, NULL},
      {"offload_param", K_MAPPED, NULL},
      {"zenflow", K_MAPPED, NULL},
      {"overlap_comm", K_UNUSED, "the schedule pass always overlaps collectives with compute, and the host stream the offloaded step (--offload-overlap)"},
      {"contiguous_gradients", K_UNUSED, "gradients are reduced from planned buffers (no fragmentation)"},
      {"reduce_scatter", K_UNUSED, "stages 2-3 always reduce-scatter; stages 0-1 all-reduce"},
      {"allgather_partitions", K_UNUSED, "stages 1-2 all-gather each updated param"},
      {"allgather_bucket_size", K_UNUSED, "stages 1-2 all-gather each updated param on its own"},
      {"round_robin_gradients", K_UNUSED, "gradients are reduced in the order they are computed"},
      {"elastic_checkpoint", K_UNUSED, "every checkpoint resumes at any world size and stage"},
      {"ignore_unused_parameters", K_UNUSED, "the compiled step knows which params have gradients"},
      {"load_from_fp32_weights", K_UNUSED, "a resume loads the f32 master weights"},
      {"stage3_gather_16bit_weights_on_model_save", K_UNUSED, "dsc export consolidates the shards"},
      {"stage3_max_live_parameters", K_UNUSED, "live gathered params are bounded by stage3_prefetch_bucket_size (train.zero.prefetch_bytes)"},
      {"stage3_max_reuse_distance", K_UNUSED, "gathered params are released after their last use (train.zero.unshard_bytes keeps some)"},
      {"sub_group_size", K_UNUSED, "the optimizer step runs per param"},
      {"memory_efficient_linear", K_UNUSED, "matmul memory follows the plan"},
      {"cpu_offload", K_NOT_YET, "use offload_optimizer {\"device\": \"cpu\"}"},
      {"zero_quantized_weights", K_NOT_YET, "ZeRO++ is not implemented yet: weights are gathered unquantized"},
      {"zero_quantized_gradients", K_NOT_YET, "ZeRO++ is not implemented yet: gradients are reduced unquantized"},
      {"zero_hpz_partition_size", K_NOT_YET, "ZeRO++ is not implemented yet: params are sharded over all ranks"},
      {"mics_shard_size", K_NOT_YET, "params are sharded over all ranks"},
  };
  if (!want_object(r, "zero_optimization", z)) return;
  check_keys(r, z, "zero_optimization", keys, (int)(sizeof keys / sizeof keys[0]));
  const cJSON *v;
  int64_t i;
  if ((v = member(z, "stage")) && get_int(r, "zero_optimization.stage", v, 0, &i, "the model's stage")) {
    if (i > 3) err(r, "zero_optimization.stage", "ds_config zero_optimization.stage must be 0, 1, 2 or 3, got %" PRId64, i);
    else put(r, "zero_optimization.stage", "zero.stage", "%" PRId64, i);
  }
  if ((v = member(z, "reduce_bucket_size")) &&
      get_int(r, "zero_optimization.reduce_bucket_size", v, 0, &i, "dsc's bucket size"))
    put_elements(r, "zero_optimization.reduce_bucket_size", "zero.bucket_bytes", i);
  if ((v = member(z, "stage3_prefetch_bucket_size")) &&
      get_int(r, "zero_optimization.stage3_prefetch_bucket_size", v, 0, &i, "dsc's prefetch size"))
    put_elements(r, "zero_optimization.stage3_prefetch_bucket_size", "zero.prefetch_bytes", i);
  if ((v = member(z, "stage3_param_persistence_threshold")) &&
      get_int(r, "zero_optimization.stage3_param_persistence_threshold", v, 0, &i, "dsc's threshold"))
    put(r, "zero_optimization.stage3_param_persistence_threshold", "zero.persist_threshold", "%" PRId64, i);
  if ((v = member(z, "offload_optimizer"))) read_offload(r, v, "offload_optimizer", "offload.optimizer");
  if ((v = member(z, "offload_param"))) read_offload(r, v, "offload_param", "offload.param");
  if ((v = member(z, "zenflow")) && !is_off(v)) read_zenflow(r, v);
}

static void read_remat(ds_reader *r, const cJSON *a) {
  static const known_key keys[] = {
      {"partition_activations", K_NOT_YET, "activations are not sharded over ranks (no model parallelism yet)"},
      {"cpu_checkpointing", K_MAPPED, NULL},
      {"contiguous_memory_optimization", K_UNUSED, "the memory plan places checkpoints without fragmentation"},
      {"number_checkpoints", K_UNUSED, "every block's input is kept"},
      {"synchronize_checkpoint_boundary", K_UNUSED, "there is no device synchronisation to add"},
      {"profile", K_UNUSED, "--profile times every instruction"},
  };
  if (!want_object(r, "activation_checkpointing", a)) return;
  check_keys(r, a, "activation_checkpointing", keys, (int)(sizeof keys / sizeof keys[0]));
  bool cpu = false;
  const cJSON *v = member(a, "cpu_checkpointing");
  if (v) get_bool(r, "activation_checkpointing.cpu_checkpointing", v, &cpu, NULL);
  /* DeepSpeed checkpoints where the model calls its checkpoint(): every
   * transformer block in Hugging Face's models */
  put(r, "activation_checkpointing", "checkpoint_activations", "%s", cpu ? "offload" : "blocks");
}

static void read_batch(ds_reader *r, const cJSON *root) {
  static const struct {
    const char *name;
    int which;
  } keys[] = {{"train_batch_size", 0}, {"train_micro_batch_size_per_gpu", 1}, {"gradient_accumulation_steps", 2}};
  for (int k = 0; k < 3; k++) {
    const cJSON *v = member(root, keys[k].name);
    int64_t x;
    if (v && get_int(r, keys[k].name, v, 1, &x, "the model's batch and flags")) {
      int64_t *dst[3] = {&r->out->global, &r->out->micro, &r->out->accum};
      *dst[keys[k].which] = x;
      r->out->batch_loc[keys[k].which] = key_loc(r, keys[k].name);
    }
  }
}

/* The file's text (NUL-terminated, malloc'd), a regular file of at most
 * 16 MiB (opened as the frontend opens model files). */
static dsc_status read_all(dsc_context *ctx, const char *path, char **text, size_t *len) {
  dsc_loc loc = {path, 0, 0};
  FILE *f = fe_open_regular(ctx, path, loc, "open");
  if (!f) return DSC_ERR_USER;
  struct stat sb;
  if (fstat(fileno(f), &sb) != 0 || sb.st_size > (1 << 24)) {
    fclose(f);
    ir_error(ctx, loc, "'%s' is too large for a ds_config (more than 16 MiB)", path);
    return DSC_ERR_USER;
  }
  size_t n = (size_t)sb.st_size;
  char *buf = malloc(n + 1);
  if (!buf) {
    fclose(f);
    ir_error(ctx, loc, "out of memory reading '%s'", path);
    return DSC_ERR_INTERNAL;
  }
  bool ok = fread(buf, 1, n, f) == n && !ferror(f);
  fclose(f);
  if (!ok) {
    free(buf);
    ir_error(ctx, loc, "cannot read '%s'", path);
    return DSC_ERR_USER;
  }
  buf[n] = 0;
  *text = buf, *len = n;
  return DSC_OK;
}

dsc_status drv_ds_config_read(dsc_context *ctx, const char *path, ir_arena *arena,
                              drv_ds_config *out) {
  memset(out, 0, sizeof *out);
  out->path = path;
  char *text = NULL;
  size_t len = 0;
  dsc_status st = read_all(ctx, path, &text, &len);
  if (st != DSC_OK) return st;
  ds_reader r = {ctx, ir_diag_add_source(ctx, path, text, len), text, NULL, 0, 0, arena, out, false};
  if (!r.file) r.file = path;
  const char *end = NULL;
  cJSON *root = cJSON_ParseWithLengthOpts(text, len + 1, &end, 1); /* + its NUL: nothing may follow */
  if (!root) {
    int line = 1, col = 1;
    const char *at = end ? end : cJSON_GetErrorPtr();
    for (const char *p = text; at && p < at && p < text + len; p++)
      if (*p == '\n') line++, col = 1;
      else col++;
    dsc_loc where = {r.file, line, col};
    ir_error(ctx, where, "%s is not valid JSON (at line %d, column %d)", path, line, col);
    free(text);
    return DSC_ERR_USER;
  }
  index_keys(&r);
  if (!cJSON_IsObject(root)) {
    dsc_loc at = {r.file, 1, 1};
    ir_error(ctx, at, "%s: a ds_config is a JSON object, got %s", path, type_name(root));
    cJSON_Delete(root);
    free(text);
    return DSC_ERR_USER;
  }
  static const known_key top[] = {
      {"train_batch_size", K_MAPPED, NULL},
      {"train_micro_batch_size_per_gpu", K_MAPPED, NULL},
      {"gradient_accumulation_steps", K_MAPPED, NULL},
      {"optimizer", K_MAPPED, NULL},
      {"scheduler", K_MAPPED, NULL},
      {"gradient_clipping", K_MAPPED, NULL},
      {"bf16", K_MAPPED, NULL},
      {"bfloat16", K_MAPPED, NULL},
      {"fp16", K_MAPPED, NULL},
      {"zero_optimization", K_MAPPED, NULL},
      {"activation_checkpointing", K_MAPPED, NULL},
      {"steps_per_print", K_MAPPED, NULL},
      {"seed", K_MAPPED, NULL},
      {"wall_clock_breakdown", K_MAPPED, NULL},
      {"prescale_gradients", K_UNUSED, "gradients are averaged once, after the reduction (x 1/N)"},
      {"gradient_predivide_factor", K_UNUSED, "gradients are averaged once, after the reduction (x 1/N)"},
      {"communication_data_type", K_NOT_YET, "gradients are reduced in their own dtype"},
      {"sparse_gradients", K_UNUSED, "embedding gradients are dense"},
      {"amp", K_NOT_YET, "use bf16 or fp16"},
      {"zero_allow_untested_optimizer", K_UNUSED, "every dsc optimizer runs at every stage"},
      {"zero_force_ds_cpu_optimizer", K_UNUSED, "the host optimizer step is dsc's own"},
      {"data_types", K_NOT_YET, "gradients accumulate in f32 with bf16/fp16 master weights"},
      {"checkpoint", K_UNUSED, "checkpoints are dsc's (docs/zero.md)"},
      {"aio", K_UNUSED, "the disk tier has train.offload.io_threads"},
      {"tensorboard", K_NOT_YET, "metrics go to OUT/metrics.jsonl (dsc plot draws them)"},
      {"wandb", K_NOT_YET, "metrics go to OUT/metrics.jsonl"},
      {"csv_monitor", K_NOT_YET, "metrics go to OUT/metrics.jsonl"},
      {"comet", K_NOT_YET, "metrics go to OUT/metrics.jsonl"},
      {"flops_profiler", K_NOT_YET, "--profile times every instruction"},
      {"comms_logger", K_NOT_YET, "--trace records every collective"},
      {"memory_breakdown", K_UNUSED, "dsc plan and the trainer's memory lines break memory down"},
      {"dump_state", K_UNUSED, "dsc dump prints the compiled step"},
      {"autotuning", K_NOT_YET, "dsc plan|train --auto searches stage, offload and checkpointing"},
      {"elasticity", K_NOT_YET, "a checkpoint resumes at any world size"},
      {"compression_training", K_NOT_YET, "training is uncompressed"},
      {"data_efficiency", K_NOT_YET, "the data is read in order"},
      {"curriculum_learning", K_NOT_YET, "the data is read in order"},
      {"sparse_attention", K_NOT_YET, "attention is dense"},
      {"pipeline", K_NOT_YET, "no pipeline parallelism yet"},
      {"eigenvalue", K_NOT_YET, "not computed"},
      {"progressive_layer_drop", K_NOT_YET, "every layer runs"},
      {"disable_allgather", K_UNUSED, "stages 1-2 all-gather each updated param"},
      {"timers", K_UNUSED, "--trace records the step's timeline"},
      {"zenflow", K_UNUSED, "ZenFlow is read from zero_optimization.zenflow, as DeepSpeed reads it"},
  };
  check_keys(&r, root, "", top, (int)(sizeof top / sizeof top[0]));
  read_batch(&r, root);
  const cJSON *v;
  if ((v = member(root, "optimizer"))) read_optimizer(&r, v);
  if ((v = member(root, "scheduler"))) read_scheduler(&r, v);
  double clip;
  if ((v = member(root, "gradient_clipping")) && get_num(&r, "gradient_clipping", v, &clip, "the model's clip"))
    put(&r, "gradient_clipping", "clip", "%s", fmt_num(&r, clip));
  read_precision(&r, root);
  if ((v = member(root, "zero_optimization"))) read_zero(&r, v);
  if ((v = member(root, "activation_checkpointing"))) read_remat(&r, v);
  int64_t i;
  if ((v = member(root, "steps_per_print")) && get_int(&r, "steps_per_print", v, 1, &i, "the model's log_every"))
    put(&r, "steps_per_print", "log_every", "%" PRId64, i);
  bool on;
  if ((v = member(root, "wall_clock_breakdown")) &&
      get_bool(&r, "wall_clock_breakdown", v, &on, "the model's wall_clock_breakdown"))
    put(&r, "wall_clock_breakdown", "wall_clock_breakdown", "%s", on ? "true" : "false");
  if ((v = member(root, "seed")) && get_int(&r, "seed", v, 0, &i, "the model's seed"))
    put(&r, "seed", "seed", "%" PRId64, i);
  cJSON_Delete(root);
  free(text);
  return r.failed ? DSC_ERR_USER : DSC_OK;
}

dsc_status drv_ds_config_batch(dsc_context *ctx, const drv_ds_config *c, int64_t world,
                               int64_t flag_micro, int64_t flag_accum, int64_t *micro,
                               int64_t *accum) {
  int64_t g = c->global, m = flag_micro > 0 ? flag_micro : c->micro,
          a = flag_accum > 0 ? flag_accum : c->accum, w = world > 0 ? world : 1;
  dsc_loc at = c->batch_loc[0];
  *micro = m, *accum = a;
  if (g <= 0) {
    if (m > 0 && a <= 0) *accum = 1;
    return DSC_OK;
  }
  if (m > 0 && a > 0) {
    int64_t ma, maw;
    if (__builtin_mul_overflow(m, a, &ma) || __builtin_mul_overflow(ma, w, &maw) || maw != g) {
      ir_error(ctx, at,
               "%s: train_batch_size %" PRId64 " is not train_micro_batch_size_per_gpu %" PRId64
               " x gradient_accumulation_steps %" PRId64 " x world %" PRId64 " = %.17g"
               " (DeepSpeed's rule)",
               c->path, g, m, a, w, (double)m * (double)a * (double)w);
      return DSC_ERR_USER;
    }
    return DSC_OK;
  }
  int64_t known = m > 0 ? m : a > 0 ? a : 1, per;
  if (__builtin_mul_overflow(known, w, &per) || g % per != 0) {
    ir_error(ctx, at,
             "%s: train_batch_size %" PRId64 " is not divisible by %s %" PRId64 " x world %" PRId64
             " = %" PRId64,
             c->path, g,
             m > 0 ? "train_micro_batch_size_per_gpu" : a > 0 ? "gradient_accumulation_steps" : "1",
             known, w, per);
    return DSC_ERR_USER;
  }
  if (m > 0) *accum = g / per;
  else if (a > 0) *micro = g / per;
  else *micro = g / w, *accum = 1;
  return DSC_OK;
}

/* f's value: given, the model's (auto), or DeepSpeed's default. */
static double field(const drv_ds_opt_field *f, double model, double deepspeed) {
  return f->state == DRV_DS_GIVEN ? f->v : f->state == DRV_DS_AUTO ? model : deepspeed;
}

static dsc_status set_meta(dsc_context *ctx, dsc_module *m, const char *key, const char *value,
                           dsc_loc loc) {
  if (dsc_module_set_meta(m, key, value) == DSC_OK) return DSC_OK;
  ir_error(ctx, loc, "out of memory");
  return DSC_ERR_INTERNAL;
}

/* The optimizer as a train setting: DeepSpeed's defaults for what the file
 * leaves out (FusedAdam's lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight
 * decay 0; torch SGD's momentum 0; Muon's 0.95), the model's values for
 * "auto". lr and weight_decay also at the top level: a train section's
 * top-level lr would override the optimizer's. */
static dsc_status apply_optimizer(dsc_context *ctx, const drv_ds_config *c, dsc_module *m) {
  const drv_ds_opt *o = &c->opt;
  dsc_train_config base, cfg;
  dsc_status st = dsc_train_config_from_module(m, &base);
  if (st != DSC_OK) return st;
  cfg = base;
  cfg.opt.kind = o->kind;
  cfg.opt.lr = field(&o->lr, base.opt.lr, 1e-3);
  cfg.opt.weight_decay = field(&o->weight_decay, base.opt.weight_decay, 0);
  cfg.opt.beta1 = field(&o->beta1, base.opt.beta1, 0.9);
  cfg.opt.beta2 = field(&o->beta2, base.opt.beta2, 0.999);
  cfg.opt.eps = field(&o->eps, base.opt.eps, 1e-8);
  bool same = o->kind == base.opt.kind; /* "auto" momentum: the model's, if it has one */
  cfg.opt.momentum = field(&o->momentum, same ? base.opt.momentum : 0, o->kind == DSC_OPT_MUON ? 0.95 : 0);
  cfg.opt.nesterov = o->nesterov;
  cfg.opt.decay_1d = false, cfg.opt.adam_lr = 0; /* not DeepSpeed's settings */
  char val[400], lr[40], wd[40];
  pass_format_optimizer(&cfg, val, sizeof val);
  ir_format_double(cfg.opt.lr, lr, sizeof lr);
  ir_format_double(cfg.opt.weight_decay, wd, sizeof wd);
  if ((st = set_meta(ctx, m, "train.optimizer", val, o->loc)) != DSC_OK ||
      (st = set_meta(ctx, m, "train.lr", lr, o->loc)) != DSC_OK)
    return st;
  return set_meta(ctx, m, "train.weight_decay", wd, o->loc);
}

/* The scheduler as a train setting, DeepSpeed's defaults for what the file
 * leaves out (warmup_min_lr 0, warmup_max_lr 1e-3, warmup_num_steps 1000,
 * warmup_min_ratio 0, cos_min_ratio 1e-4; OneCycle's step sizes 2000, the
 * second the first's, no stairs, no decay; LRRangeTest's min lr 1e-3, step
 * size 2000, rate 1, continuous), the model's values for "auto" (its
 * OneCycle or LRRangeTest settings where it has that schedule, else
 * DeepSpeed's defaults); warmup_max_lr, cycle_max_lr and
 * lr_range_test_min_lr are the lr. OneCycle's momentum cycling is not done:
 * a warning with an Adam optimizer (DeepSpeed's only cycles betas). */
static dsc_status apply_scheduler(dsc_context *ctx, const drv_ds_config *c, dsc_module *m) {
  const drv_ds_sched *s = &c->sched;
  dsc_train_config base, cfg; /* the train section and the file's optimizer */
  dsc_status st = dsc_train_config_from_module(m, &base);
  if (st != DSC_OK) return st;
  cfg = base;
  cfg.sched.kind = s->kind;
  cfg.sched.warmup = (int64_t)field(&s->warmup, (double)base.sched.warmup, 1000);
  cfg.sched.decay_steps = (int64_t)field(&s->total, (double)base.sched.decay_steps, 0);
  cfg.sched.warmup_log = !s->linear;
  cfg.sched.min_lr = field(&s->min_lr, base.sched.min_lr, 0);
  cfg.sched.min_ratio = field(&s->min_ratio, base.sched.min_ratio, 0);
  cfg.sched.cos_min_ratio = field(&s->cos_min_ratio, base.sched.cos_min_ratio, 1e-4);
  bool same = base.sched.kind == s->kind; /* "auto": the model's, if it has this schedule */
  const dsc_train_config *mb = same ? &base : NULL;
#define MODEL_OR(f, dflt) (mb ? (double)mb->sched.f : (dflt))
  int64_t first = (int64_t)field(&s->first, MODEL_OR(first_steps, 2000), 2000);
  int64_t stairs = (int64_t)field(&s->first_stairs, MODEL_OR(first_stairs, 0), 0);
  cfg.sched.first_steps = first, cfg.sched.first_stairs = stairs;
  cfg.sched.second_steps = (int64_t)field(&s->second, MODEL_OR(second_steps, first), (double)first);
  cfg.sched.second_stairs =
      (int64_t)field(&s->second_stairs, MODEL_OR(second_stairs, stairs), (double)stairs);
  cfg.sched.decay_step_size = (int64_t)field(&s->decay_size, MODEL_OR(decay_step_size, 0), 0);
  cfg.sched.decay_lr_rate = field(&s->decay_rate, MODEL_OR(decay_lr_rate, 0), 0);
  cfg.sched.step_size = (int64_t)field(&s->step_size, MODEL_OR(step_size, 2000), 2000);
  cfg.sched.step_rate = field(&s->step_rate, MODEL_OR(step_rate, 1.0), 1.0);
  cfg.sched.staircase = s->staircase;
#undef MODEL_OR
  if (s->kind == DSC_SCHED_ONE_CYCLE && s->cycle_momentum && base.opt.kind == DSC_OPT_ADAMW) {
    char lo[40], hi[40], b1[40], b2[40];
    ir_format_double(field(&s->min_mom, 0.8, 0.8), lo, sizeof lo);
    ir_format_double(field(&s->max_mom, 0.9, 0.9), hi, sizeof hi);
    ir_format_double(base.opt.beta1, b1, sizeof b1);
    ir_format_double(base.opt.beta2, b2, sizeof b2);
    ir_diag(ctx, DSC_DIAG_WARNING, s->momentum_loc,
            "ds_config 'scheduler.params.cycle_momentum' (DeepSpeed's default: true) is not "
            "implemented in dsc: DeepSpeed's OneCycle would cycle Adam's beta1 between "
            "cycle_max_mom %s and cycle_min_mom %s and set beta2 to 0.99; dsc keeps the "
            "optimizer's betas (%s, %s) fixed (set \"cycle_momentum\": false to silence this)",
            hi, lo, b1, b2);
  }
  char val[400], lr[40];
  pass_format_schedule(&cfg, val, sizeof val);
  if (s->kind != DSC_SCHED_WARMUP_COSINE_LR) {
    ir_format_double(field(&s->max_lr, base.opt.lr, 1e-3), lr, sizeof lr);
    if ((st = set_meta(ctx, m, "train.lr", lr, s->loc)) != DSC_OK) return st;
  }
  return set_meta(ctx, m, "train.schedule", val, s->loc);
}

dsc_status drv_ds_config_apply(dsc_context *ctx, const drv_ds_config *c, dsc_module *m) {
  if (c->opt.given) {
    dsc_status st = apply_optimizer(ctx, c, m);
    if (st != DSC_OK) return st;
  }
  if (c->sched.given) {
    dsc_status st = apply_scheduler(ctx, c, m);
    if (st != DSC_OK) return st;
  }
  /* the settings as given; then DeepSpeed's element counts in the bytes of
   * the precision they set (with the train section's) */
  int64_t elem_bytes = 4;
  for (int pass = 0; pass < 2; pass++) {
    if (pass == 1) {
      dsc_train_config cfg;
      dsc_status st = dsc_train_config_from_module(m, &cfg);
      if (st != DSC_OK) return st;
      if (cfg.precision != DSC_PRECISION_F32 && cfg.master_weights) elem_bytes = 2;
    }
    for (int i = 0; i < c->n; i++) {
      const drv_ds_setting *d = &c->set[i];
      if (d->elements != (pass == 1)) continue;
      char key[96], bytes[32];
      snprintf(key, sizeof key, "train.%s", d->key);
      const char *value = d->value;
      if (d->elements) {
        snprintf(bytes, sizeof bytes, "%" PRId64, (int64_t)strtoll(d->value, NULL, 10) * elem_bytes);
        value = bytes;
      }
      dsc_status st = set_meta(ctx, m, key, value, d->loc);
      if (st != DSC_OK) return st;
    }
  }
  return DSC_OK;
}

const drv_ds_setting *drv_ds_config_find(const drv_ds_config *c, const char *key) {
  for (int i = 0; c && i < c->n; i++)
    if (strcmp(c->set[i].key, key) == 0) return &c->set[i];
  if (c && c->sched.given && c->sched_lr_src.key && strcmp(key, "lr") == 0) return &c->sched_lr_src;
  if (c && c->sched.given && strcmp(key, "schedule") == 0) return &c->sched_src;
  for (int k = 0; c && c->opt.given && k < 3; k++)
    if (c->opt.src[k].key && strcmp(c->opt.src[k].key, key) == 0) return &c->opt.src[k];
  return NULL;
}
