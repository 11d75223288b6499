/* The train section: its keys, the checks of their values, and their
 * lowering into module metadata (read back by dsc_train_config_from_module). */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "dsc/settings.h"
#include "frontend/frontend.h"

/* ----------------------------------------------------------------- train */

/* The train section's keys are the settings table's (passes/settings.c,
 * include/dsc/settings.h): a key of section S is "S.key" there. */
static const dsc_setting *train_key(const char *section, const char *key) {
  char full[128];
  snprintf(full, sizeof full, "%s%s%s", section, *section ? "." : "", key);
  const dsc_setting *s = dsc_setting_find(full);
  /* the table's aliases are ds_config's metadata spellings, not the language's */
  return s && strcmp(s->key, full) == 0 ? s : NULL;
}

/* The keys of one section (for suggestions): n of them into out[]. */
static int section_keys(const char *section, const char **out, int cap) {
  size_t sl = strlen(section);
  int n = 0;
  for (int i = 0; i < dsc_setting_count() && n < cap; i++) {
    const char *k = dsc_setting_at(i)->key, *dot = strchr(k, '.');
    if (!*section ? !dot : dot && (size_t)(dot - k) == sl && strncmp(k, section, sl) == 0)
      out[n++] = *section ? dot + 1 : k;
  }
  return n;
}

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

/* Checks an optimizer or schedule: a known name, alone or called with keyword settings. */
static bool is_bool_key(const char *k) {
  return strcmp(k, "nesterov") == 0 || strcmp(k, "staircase") == 0 || strcmp(k, "decay_1d") == 0;
}

static bool check_named_call(fe_state *st, const fe_value *v, dsc_loc loc, const char *what,
                             const dsc_setting_form *forms, int n_names) {
  const char *names[16];
  if (n_names > 16) n_names = 16;
  for (int i = 0; i < n_names; i++) names[i] = forms[i].name;
  const char *name = v->kind == V_SYM || v->kind == V_CALL ? v->name : NULL;
  int which = -1;
  for (int i = 0; name && i < n_names; i++)
    if (strcmp(names[i], name) == 0) which = i;
  if (which < 0) {
    const char *s = name ? fe_suggest(name, names, n_names) : NULL;
    char list[400] = "";
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
          forms[which].keys[0]);
      return false;
    }
    const char *const *keys = forms[which].keys;
    int k = -1, nk = 0;
    while (keys[nk]) nk++;
    for (int j = 0; j < nk; j++)
      if (strcmp(keys[j], v->keys[i]) == 0) k = j;
    if (k < 0) {
      const char *s = fe_suggest(v->keys[i], keys, nk);
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
    else if (is_bool_key(v->keys[i]))
      ok = a->kind == V_BOOL;
    else if (strcmp(v->keys[i], "warmup_type") == 0)
      ok = a->kind == V_SYM && (strcmp(a->name, "log") == 0 || strcmp(a->name, "linear") == 0);
    else
      ok = a->kind == V_NUM && num(a) >= 0;
    if (!ok) {
      ERR(loc, "setting '%s' of '%s' must be %s", v->keys[i], name,
          strcmp(v->keys[i], "betas") == 0         ? "a pair of numbers, as in (0.9, 0.95)"
          : is_bool_key(v->keys[i])                ? "true or false"
          : strcmp(v->keys[i], "warmup_type") == 0 ? "log or linear"
                                                   : "a non-negative number");
      return false;
    }
  }
  return true;
}

/* A value of setting k: optimizers and schedules by their names and
 * keywords (with suggestions), every other kind by the settings table's
 * one parse of the printed value (`text`), which the pipeline's reader of
 * the module metadata applies again. */
static bool check_train_value(fe_state *st, const fe_setting *s, const dsc_setting *k,
                              const fe_value *v, const char *text) {
  dsc_loc loc = s->value->loc;
  int n_forms = 0;
  const dsc_setting_form *forms = dsc_setting_forms(k, &n_forms);
  if (forms)
    return check_named_call(st, v, loc, k->kind == DSC_SETTING_OPTIMIZER ? "optimizer" : "schedule",
                            forms, n_forms);
  if (dsc_setting_parse(k, text, false, NULL)) return true;
  ERR(loc, "'%s' must be %s", s->key, dsc_setting_want(k, false));
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
    const dsc_setting *k = train_key(section, s->key);
    if (!k) {
      const char *cands[64];
      int n = section_keys(section, cands, 64);
      const char *sug = fe_suggest(s->key, cands, n);
      char where[64] = "";
      if (*section) snprintf(where, sizeof where, " in '%s'", section);
      if (sug)
        ERR(s->loc, "unknown train setting '%s'%s; did you mean '%s'?", s->key, where, sug);
      else
        ERR(s->loc, "unknown train setting '%s'%s", s->key, where);
      continue;
    }
    if (k->kind == DSC_SETTING_SECTION) {
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
    if (v.kind == V_ERR) continue;
    char key[160], val[1024] = "";
    snprintf(key, sizeof key, "train.%s", k->key);
    print_value(&v, val, sizeof val);
    if (!check_train_value(st, s, k, &v, val)) continue;
    if (!*section && strcmp(s->key, "batch") == 0) {
      st->has_batch = true;
      st->batch = v.i;
    }
    if (!*section && strcmp(s->key, "seq") == 0) {
      st->has_seq = true;
      st->seq = v.i;
    }
    if (st->m && dsc_module_set_meta(st->m, key, val) != DSC_OK) st->oom = true;
  next:;
  }
}
