/* The train section: its keys, the checks of their values, and their
 * lowering into module metadata (read back by dsc_train_config_from_module). */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "frontend/frontend.h"

/* ----------------------------------------------------------------- train */

enum {
  TK_POS_INT,
  TK_INT,
  TK_NUM,
  TK_BOOL,
  TK_SIZE,
  TK_OPT,
  TK_SCHED,
  TK_PREC,
  TK_DEVICE,
  TK_CKPT,
  TK_STAGE,
  TK_SECTION
};

static const struct {
  const char *section, *key;
  int kind;
} train_keys[] = {
    {"", "batch", TK_POS_INT},
    {"", "seq", TK_POS_INT},
    {"", "grad_accum", TK_POS_INT},
    {"", "steps", TK_POS_INT},
    {"", "lr", TK_NUM},
    {"", "clip", TK_NUM},
    {"", "weight_decay", TK_NUM},
    {"", "optimizer", TK_OPT},
    {"", "schedule", TK_SCHED},
    {"", "precision", TK_PREC},
    {"", "seed", TK_INT},
    {"", "eval_every", TK_POS_INT},
    {"", "save_every", TK_POS_INT},
    {"", "log_every", TK_POS_INT},
    {"", "checkpoint_activations", TK_CKPT},
    {"", "checkpoint_every", TK_POS_INT},
    {"", "zero", TK_SECTION},
    {"", "offload", TK_SECTION},
    {"zero", "stage", TK_STAGE},
    {"zero", "overlap", TK_BOOL},
    {"zero", "prefetch", TK_INT},
    {"zero", "bucket", TK_SIZE},
    {"zero", "persist_threshold", TK_SIZE},
    {"zero", "prefetch_bytes", TK_SIZE},
    {"zero", "bucket_bytes", TK_SIZE},
    {"zero", "unshard_bytes", TK_SIZE},
    {"offload", "optimizer", TK_DEVICE},
    {"offload", "param", TK_DEVICE},
};
#define N_TRAIN_KEYS ((int)(sizeof train_keys / sizeof train_keys[0]))

/* Train values: numbers fold (global consts visible), other names stay symbolic. */
static fe_value tv(fe_state *st, const fe_expr *e) {
  fe_frame fr;
  memset(&fr, 0, sizeof fr);
  fr.scope = &st->global;
  fr.inst = -1;
  fr.is_const = true;
  switch (e->kind) {
    case FE_E_NAME: {
      fe_sym *y = fe_scope_find(&st->global, e->name);
      if (y && y->kind == SYM_CONST) return fe_const_value(st, y, e->loc);
      fe_value v = {.kind = V_SYM, .name = e->name};
      return v;
    }
    case FE_E_TUPLE:
    case FE_E_LIST: {
      fe_value v = {.kind = e->kind == FE_E_TUPLE ? V_TUPLE : V_LIST, .n = e->items.n};
      v.items = st_alloc(st, sizeof(fe_value) * (size_t)(e->items.n ? e->items.n : 1));
      if (!v.items) return verr;
      for (int i = 0; i < e->items.n; i++)
        if ((v.items[i] = tv(st, e->items.items[i])).kind == V_ERR) return verr;
      return v;
    }
    case FE_E_CALL: {
      if (e->a->kind != FE_E_NAME) {
        ERR(e->loc, "expected a name before '(' in a train setting");
        return verr;
      }
      fe_value v = {.kind = V_CALL, .name = e->a->name, .n = e->items.n};
      size_t n = (size_t)(e->items.n ? e->items.n : 1);
      v.items = st_alloc(st, sizeof(fe_value) * n);
      v.keys = st_alloc(st, sizeof(char *) * n);
      if (!v.items || !v.keys) return verr;
      for (int i = 0; i < e->items.n; i++) {
        fe_arg *a = e->items.items[i];
        v.keys[i] = a->key;
        if ((v.items[i] = tv(st, a->value)).kind == V_ERR) return verr;
      }
      return v;
    }
    default:
      return fe_ev(st, &fr, e);
  }
}

static void print_value(const fe_value *v, char *buf, size_t n) {
  size_t used = strlen(buf);
  if (used + 1 >= n) return;
  char *p = buf + used;
  size_t left = n - used;
  switch (v->kind) {
    case V_NUM:
      if (v->is_int)
        snprintf(p, left, "%lld", (long long)v->i);
      else
        ir_format_double(v->f, p, left);
      break;
    case V_BOOL:
      snprintf(p, left, "%s", v->b ? "true" : "false");
      break;
    case V_SYM:
      snprintf(p, left, "%s", v->name);
      break;
    case V_DTYPE:
      snprintf(p, left, "%s", dsc_dtype_name(v->dt));
      break;
    case V_TUPLE:
    case V_LIST:
    case V_CALL: {
      if (v->kind == V_CALL) snprintf(p, left, "%s", v->name);
      size_t l = strlen(buf);
      snprintf(buf + l, n - l, "%s", v->kind == V_LIST ? "[" : "(");
      for (int i = 0; i < v->n; i++) {
        l = strlen(buf);
        if (i) snprintf(buf + l, n - l, ", ");
        l = strlen(buf);
        if (v->kind == V_CALL && v->keys[i]) snprintf(buf + l, n - l, "%s = ", v->keys[i]);
        print_value(&v->items[i], buf, n);
      }
      l = strlen(buf);
      snprintf(buf + l, n - l, "%s", v->kind == V_LIST ? "]" : ")");
      break;
    }
    default:
      snprintf(p, left, "?");
      break;
  }
}

static bool is_one_of(const fe_value *v, const char *const *names, int n) {
  if (v->kind != V_SYM) return false;
  for (int i = 0; i < n; i++)
    if (strcmp(v->name, names[i]) == 0) return true;
  return false;
}

/* Checks an optimizer or schedule: a known name, alone or called with keyword settings. */
static bool check_named_call(fe_state *st, const fe_value *v, dsc_loc loc, const char *what,
                             const char *const *names, int n_names, const char *const (*keys)[6]) {
  const char *name = v->kind == V_SYM || v->kind == V_CALL ? v->name : NULL;
  int which = -1;
  for (int i = 0; name && i < n_names; i++)
    if (strcmp(names[i], name) == 0) which = i;
  if (which < 0) {
    const char *s = name ? fe_suggest(name, names, n_names) : NULL;
    char list[200] = "";
    for (int i = 0; i < n_names; i++) {
      size_t l = strlen(list);
      snprintf(list + l, sizeof list - l, "%s%s", i ? ", " : "", names[i]);
    }
    if (s)
      ERR(loc, "unknown %s '%s'; did you mean '%s'?", what, name, s);
    else
      ERR(loc, "'%s' must be one of %s", what, list);
    return false;
  }
  if (v->kind != V_CALL) return true;
  for (int i = 0; i < v->n; i++) {
    if (!v->keys[i]) {
      ERR(loc, "the settings of '%s' must be named, as in %s(%s = ...)", name, name,
          keys[which][0]);
      return false;
    }
    int k = -1, nk = 0;
    while (nk < 6 && keys[which][nk]) nk++;
    for (int j = 0; j < nk; j++)
      if (strcmp(keys[which][j], v->keys[i]) == 0) k = j;
    if (k < 0) {
      const char *s = fe_suggest(v->keys[i], keys[which], nk);
      if (s)
        ERR(loc, "'%s' has no setting '%s'; did you mean '%s'?", name, v->keys[i], s);
      else
        ERR(loc, "'%s' has no setting '%s'", name, v->keys[i]);
      return false;
    }
    const fe_value *a = &v->items[i];
    bool ok;
    if (strcmp(v->keys[i], "betas") == 0)
      ok =
          a->kind == V_TUPLE && a->n == 2 && a->items[0].kind == V_NUM && a->items[1].kind == V_NUM;
    else if (strcmp(v->keys[i], "nesterov") == 0)
      ok = a->kind == V_BOOL;
    else
      ok = a->kind == V_NUM && num(a) >= 0;
    if (!ok) {
      ERR(loc, "setting '%s' of '%s' must be %s", v->keys[i], name,
          strcmp(v->keys[i], "betas") == 0      ? "a pair of numbers, as in (0.9, 0.95)"
          : strcmp(v->keys[i], "nesterov") == 0 ? "true or false"
                                                : "a non-negative number");
      return false;
    }
  }
  return true;
}

static bool check_train_value(fe_state *st, const fe_setting *s, int kind, const fe_value *v) {
  static const char *const opts[] = {"adamw", "adam", "sgd", "muon"};
  static const char *const opt_keys[][6] = {{"lr", "betas", "eps", "weight_decay"},
                                            {"lr", "betas", "eps", "weight_decay"},
                                            {"lr", "momentum", "weight_decay", "nesterov"},
                                            {"lr", "momentum", "weight_decay", "nesterov"}};
  static const char *const scheds[] = {"constant", "cosine", "linear", "warmup_cosine",
                                       "warmup_linear"};
  static const char *const sched_keys[][6] = {{"warmup"},
                                              {"warmup", "min_lr", "decay_steps"},
                                              {"warmup", "min_lr", "decay_steps"},
                                              {"warmup", "min_lr", "decay_steps"},
                                              {"warmup", "min_lr", "decay_steps"}};
  static const char *const precs[] = {"f32", "bf16", "fp16"};
  static const char *const devices[] = {"none", "cpu", "host", "nvme", "disk"};
  dsc_loc loc = s->value->loc;
  const char *k = s->key;
  bool is_int = v->kind == V_NUM && v->is_int;
  switch (kind) {
    case TK_POS_INT:
      if (is_int && v->i > 0) return true;
      ERR(loc, "'%s' must be a positive integer", k);
      return false;
    case TK_INT:
      if (is_int && v->i >= 0) return true;
      ERR(loc, "'%s' must be a non-negative integer", k);
      return false;
    case TK_NUM:
      if (v->kind == V_NUM && num(v) >= 0) return true;
      ERR(loc, "'%s' must be a non-negative number", k);
      return false;
    case TK_BOOL:
      if (v->kind == V_BOOL) return true;
      ERR(loc, "'%s' must be true or false", k);
      return false;
    case TK_SIZE:
      if (is_int && v->i >= 0) return true;
      ERR(loc, "'%s' must be a size in bytes (an integer or a size such as 25MB)", k);
      return false;
    case TK_STAGE:
      if (is_int && v->i >= 0 && v->i <= 3) return true;
      ERR(loc, "'stage' must be 0, 1, 2 or 3");
      return false;
    case TK_OPT:
      return check_named_call(st, v, loc, "optimizer", opts, 4, opt_keys);
    case TK_SCHED:
      return check_named_call(st, v, loc, "schedule", scheds, 5, sched_keys);
    case TK_PREC:
      if (v->kind == V_DTYPE && (v->dt == DSC_F32 || v->dt == DSC_BF16)) return true;
      if (is_one_of(v, precs, 3)) return true;
      ERR(loc, "'precision' must be f32, bf16 or fp16");
      return false;
    case TK_DEVICE:
      if (is_one_of(v, devices, 5)) return true;
      ERR(loc, "'%s' must be one of none, cpu, host, nvme, disk", k);
      return false;
    case TK_CKPT:
      if (v->kind == V_SYM || v->kind == V_BOOL) return true;
      ERR(loc, "'%s' must be a name or true/false", k);
      return false;
  }
  return false;
}

void fe_lower_settings(fe_state *st, const fe_list *settings, const char *section) {
  for (int i = 0; i < settings->n; i++) {
    const fe_setting *s = settings->items[i];
    for (int j = 0; j < i; j++)
      if (strcmp(((fe_setting *)settings->items[j])->key, s->key) == 0) {
        ERR(s->loc, "train setting '%s' is set twice", s->key);
        goto next;
      }
    int kind = -1;
    for (int k = 0; k < N_TRAIN_KEYS; k++)
      if (strcmp(train_keys[k].section, section) == 0 && strcmp(train_keys[k].key, s->key) == 0)
        kind = train_keys[k].kind;
    if (kind < 0) {
      const char *cands[N_TRAIN_KEYS];
      int n = 0;
      for (int k = 0; k < N_TRAIN_KEYS; k++)
        if (strcmp(train_keys[k].section, section) == 0) cands[n++] = train_keys[k].key;
      const char *sug = fe_suggest(s->key, cands, n);
      char where[64] = "";
      if (*section) snprintf(where, sizeof where, " in '%s'", section);
      if (sug)
        ERR(s->loc, "unknown train setting '%s'%s; did you mean '%s'?", s->key, where, sug);
      else
        ERR(s->loc, "unknown train setting '%s'%s", s->key, where);
      continue;
    }
    if (kind == TK_SECTION) {
      if (s->value) {
        ERR(s->loc, "'%s' is a section: write %s { ... }", s->key, s->key);
        continue;
      }
      fe_lower_settings(st, &s->settings, s->key);
      continue;
    }
    if (!s->value) {
      ERR(s->loc, "'%s' is a setting, not a section: write %s = ...", s->key, s->key);
      continue;
    }
    fe_value v = tv(st, s->value);
    if (v.kind == V_ERR || !check_train_value(st, s, kind, &v)) continue;
    if (!*section && strcmp(s->key, "batch") == 0) {
      st->has_batch = true;
      st->batch = v.i;
    }
    if (!*section && strcmp(s->key, "seq") == 0) {
      st->has_seq = true;
      st->seq = v.i;
    }
    char key[160], val[1024] = "";
    snprintf(key, sizeof key, "train.%s%s%s", section, *section ? "." : "", s->key);
    print_value(&v, val, sizeof val);
    if (st->m && dsc_module_set_meta(st->m, key, val) != DSC_OK) st->oom = true;
  next:;
  }
}
