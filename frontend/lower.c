/* Semantic analysis and lowering of a parsed model into the IR.
 *
 * Lowering is an evaluator: expressions evaluate to compile-time values
 * (numbers, bools, lists, dtypes, blocks, functions) or to IR tensors (graph
 * nodes). User functions are inlined at each call and `for` loops over
 * blocks are unrolled, so the forward graph is straight-line SSA. Constants
 * are evaluated lazily on first use (declaration order does not matter;
 * cycles are reported). */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "frontend/frontend.h"

/* ----------------------------------------------------------------- types */

static bool eval_dims(fe_state *st, fe_frame *fr, const fe_list *dims, dsc_type *t,
                      const char *what, dsc_loc loc) {
  if (dims->n > DSC_MAX_RANK) {
    ERR(loc, "the type of %s has rank %d; at most %d is supported", what, dims->n, DSC_MAX_RANK);
    return false;
  }
  t->rank = dims->n;
  int64_t total = 1;
  bool ok = true;
  for (int i = 0; i < dims->n; i++) {
    const fe_expr *de = dims->items[i];
    fe_value v = fe_ev(st, fr, de);
    if (v.kind == V_ERR) {
      ok = false;
      continue;
    }
    if (v.kind != V_NUM || !v.is_int) {
      ERR(de->loc, "dimension %d of %s must be an integer, not %s", i, what, fe_kind_name(&v));
      ok = false;
      continue;
    }
    if (v.i <= 0) {
      ERR(de->loc, "dimension %d of %s must be positive, got %lld", i, what, (long long)v.i);
      ok = false;
      continue;
    }
    t->dims[i] = v.i;
    if (ok && (__builtin_mul_overflow(total, v.i, &total) || total > FE_MAX_NUMEL)) {
      ERR(de->loc, "%s has too many elements (the limit is 2^40)", what);
      ok = false;
    }
  }
  return ok;
}

bool fe_eval_type(fe_state *st, fe_frame *fr, const fe_type_expr *te, dsc_type *out,
                      const char *what) {
  memset(out, 0, sizeof *out);
  out->dtype = DSC_F32;
  if (te->dtype && dsc_dtype_from_name(te->dtype, &out->dtype) != 0) {
    static const char *const names[] = {"f32", "f64", "bf16", "f16", "i32", "i64", "bool"};
    const char *s = fe_suggest(te->dtype, names, 7);
    if (s)
      ERR(te->loc, "unknown dtype '%s'; did you mean '%s'?", te->dtype, s);
    else
      ERR(te->loc, "unknown dtype '%s' (expected f32, f64, bf16, f16, i32, i64 or bool)",
          te->dtype);
    return false;
  }
  if (!te->has_shape) return true;
  return eval_dims(st, fr, &te->dims, out, what, te->loc);
}

/* ---------------------------------------------------------------- params */

/* dt: the parameter's dtype, or -1 when its type is invalid (no dtype checks). */
static bool eval_init(fe_state *st, fe_frame *fr, const fe_expr *e, int dt, const char *pname,
                      dsc_init *out) {
  memset(out, 0, sizeof *out);
  static const char *const kinds[] = {"zeros", "ones", "normal", "uniform", "const"};
  const char *name = NULL;
  if (e->kind == FE_E_NAME) name = e->name;
  if (e->kind == FE_E_CALL && e->a->kind == FE_E_NAME) name = e->a->name;
  int k = -1;
  for (int i = 0; name && i < 5; i++)
    if (strcmp(kinds[i], name) == 0) k = i;
  if (k < 0 || (e->kind == FE_E_NAME && k >= 2)) {
    const char *s = name ? fe_suggest(name, kinds, 5) : NULL;
    ERR(e->loc,
        "bad initializer%s%s%s: expected zeros, ones, normal(std[, mean]), "
        "uniform(lo, hi) or const(v)%s%s%s",
        name ? " '" : "", name ? name : "", name ? "'" : "", s ? "; did you mean '" : "",
        s ? s : "", s ? "'?" : "");
    return false;
  }
  if (k < 2) {
    if (e->kind == FE_E_CALL) {
      ERR(e->loc, "'%s' takes no arguments: write '= %s'", name, name);
      return false;
    }
    out->kind = k == 0 ? DSC_INIT_ZEROS : DSC_INIT_ONES;
    return true;
  }
  static const char *const p_normal[] = {"std", "mean"};
  static const char *const p_uniform[] = {"lo", "hi"};
  static const char *const p_const[] = {"value"};
  fe_binding b;
  memset(&b, 0, sizeof b);
  b.fname = name;
  b.params = k == 2 ? p_normal : k == 3 ? p_uniform : p_const;
  b.n_params = k == 4 ? 1 : 2;
  b.n_req = k == 2 ? 1 : b.n_params;
  if (!fe_bind_args(st, e, &b)) return false;
  if (k < 4 && dt >= 0 && !dsc_dtype_is_float((dsc_dtype)dt)) {
    /* random values are floats: the runtime cannot draw them for an integer or bool tensor */
    ERR(e->loc, "'%s' initializes only float parameters, but '%s' is %s", name, pname,
        dsc_dtype_name((dsc_dtype)dt));
    return false;
  }
  double a = 0, c = 0;
  fe_value av = fe_ev(st, fr, b.slots[0]);
  if (av.kind == V_ERR) return false;
  if (av.kind != V_NUM) {
    ERR(b.slot_loc[0], "argument '%s' of '%s' must be a number, not %s", b.params[0], name,
        fe_kind_name(&av));
    return false;
  }
  a = num(&av);
  if (b.n_params > 1 && b.slots[1] && !fe_arg_num(st, fr, &b, 1, &c)) return false;
  if (k == 4 && dt >= 0) {
    char what[160];
    snprintf(what, sizeof what, "parameter '%s'", pname);
    if (!fe_check_fits(st, &av, (dsc_dtype)dt, what, b.slot_loc[0])) return false;
  }
  if (k == 2) {
    if (!(a >= 0) || !isfinite(a) || !isfinite(c)) {
      ERR(b.slot_loc[0], "'normal' needs a finite std >= 0");
      return false;
    }
    out->kind = DSC_INIT_NORMAL;
  } else if (k == 3) {
    if (!(a < c) || !isfinite(a) || !isfinite(c)) {
      ERR(e->loc, "'uniform' needs finite lo < hi");
      return false;
    }
    out->kind = DSC_INIT_UNIFORM;
  } else {
    if (!isfinite(a)) {
      ERR(b.slot_loc[0], "'const' needs a finite value");
      return false;
    }
    out->kind = DSC_INIT_CONST;
  }
  out->a = a;
  out->b = c;
  return true;
}

static void prepare_param(fe_state *st, fe_sym *y) {
  fe_frame fr;
  memset(&fr, 0, sizeof fr);
  fr.scope = y->scope;
  fr.inst = -1;
  fr.is_const = true;
  char what[160];
  snprintf(what, sizeof what, "parameter '%s'", y->name);
  bool ok = fe_eval_type(st, &fr, y->decl->type, &y->ptype, what);
  int dt = ok ? (int)y->ptype.dtype : -1;
  ok = eval_init(st, &fr, y->decl->value, dt, y->name, &y->pinit) && ok;
  y->ok = ok;
}

/* ----------------------------------------------------------- declarations */

/* Builds a scope from declarations; `where` names the place for messages. */
static void declare(fe_state *st, fe_scope *s, const fe_list *decls, const char *where,
                    unsigned allowed) {
  for (int i = 0; i < decls->n; i++) {
    fe_decl *d = decls->items[i];
    if (!(allowed & (1u << d->kind))) {
      if (d->kind == FE_D_IMPORT)
        ERR(d->loc, "'import' is only allowed at the top level of a file");
      else
        ERR(d->loc, "'%s' is not allowed %s", fe_decl_word(d->kind), where);
      continue;
    }
    switch (d->kind) {
      case FE_D_CONST:
        fe_scope_add(st, s, SYM_CONST, d);
        break;
      case FE_D_PARAM: {
        fe_sym *y = fe_scope_add(st, s, SYM_PARAM, d);
        if (y && s->block) s->n_block_params++;
        break;
      }
      case FE_D_FN:
        fe_scope_add(st, s, SYM_FN, d);
        for (int k = 1; k < d->args.n; k++) {
          fe_fn_arg *a = d->args.items[k];
          for (int j = 0; j < k; j++)
            if (strcmp(((fe_fn_arg *)d->args.items[j])->name, a->name) == 0) {
              ERR(a->loc, "argument '%s' is declared twice", a->name);
              break;
            }
        }
        break;
      case FE_D_BLOCK: {
        fe_sym *y = fe_scope_add(st, s, SYM_BLOCK, d);
        if (!y) break;
        y->inner = st_alloc(st, sizeof(fe_scope));
        if (!y->inner) return;
        y->inner->parent = s;
        y->inner->block = y;
        declare(st, y->inner, &d->body, "in a block",
                (1u << FE_D_CONST) | (1u << FE_D_PARAM) | (1u << FE_D_FN));
        break;
      }
      default:
        break; /* model, train, import: handled by the caller */
    }
  }
}

/* Evaluates every constant of a scope once, so that errors in unused ones are reported. */
static void eval_consts(fe_state *st, fe_scope *s) {
  for (int i = 0; i < s->syms.n; i++) {
    fe_sym *y = s->syms.items[i];
    if (y->kind == SYM_CONST) fe_const_value(st, y, y->decl->name_loc);
    if (y->kind == SYM_BLOCK) eval_consts(st, y->inner);
  }
}

static void block_counts(fe_state *st, fe_scope *s) {
  for (int i = 0; i < s->syms.n; i++) {
    fe_sym *y = s->syms.items[i];
    if (y->kind != SYM_BLOCK) continue;
    fe_frame fr;
    memset(&fr, 0, sizeof fr);
    fr.scope = s;
    fr.inst = -1;
    fr.is_const = true;
    fe_value v = fe_ev(st, &fr, y->decl->value);
    if (v.kind == V_ERR) continue;
    if (v.kind != V_NUM || !v.is_int) {
      ERR(y->decl->value->loc, "the instance count of block '%s' must be an integer, not %s",
          y->name, fe_kind_name(&v));
    } else if (v.i <= 0 || v.i > FE_MAX_BLOCK_COUNT) {
      ERR(y->decl->value->loc, "block '%s' must have between 1 and %d instances, got %lld", y->name,
          FE_MAX_BLOCK_COUNT, (long long)v.i);
    } else {
      y->count = v.i;
    }
  }
}

static void add_params(fe_state *st) {
  fe_list *members = &st->model->body;
  for (int i = 0; i < members->n; i++) {
    fe_decl *d = members->items[i];
    if (d->kind != FE_D_PARAM && d->kind != FE_D_BLOCK) continue;
    fe_sym *y = fe_scope_find(&st->model_scope, d->name);
    if (!y || y->decl != d) continue; /* a redefinition, already reported */
    if (d->kind == FE_D_PARAM) {
      prepare_param(st, y);
      y->first_index = dsc_module_param_count(st->m);
      if (y->ok && dsc_module_add_param(st->m, y->name, y->ptype, y->pinit) != DSC_OK)
        y->ok = false;
      continue;
    }
    /* a block: its params for every instance, instance by instance */
    fe_scope *bs = y->inner;
    int n_bp = 0;
    for (int k = 0; k < bs->syms.n; k++) {
      fe_sym *p = bs->syms.items[k];
      if (p->kind != SYM_PARAM) continue;
      prepare_param(st, p);
      p->first_index = dsc_module_param_count(st->m) + n_bp++;
    }
    bool all_ok = true;
    for (int k = 0; k < bs->syms.n; k++) {
      fe_sym *p = bs->syms.items[k];
      if (p->kind == SYM_PARAM && !p->ok) all_ok = false;
    }
    if (!all_ok || y->count <= 0) {
      for (int k = 0; k < bs->syms.n; k++) ((fe_sym *)bs->syms.items[k])->ok = false;
      continue;
    }
    if ((int64_t)dsc_module_param_count(st->m) + y->count * n_bp > 10000000) {
      ERR(d->name_loc, "block '%s' declares too many parameters", y->name);
      for (int k = 0; k < bs->syms.n; k++) ((fe_sym *)bs->syms.items[k])->ok = false;
      continue;
    }
    for (int64_t inst = 0; inst < y->count; inst++)
      for (int k = 0; k < bs->syms.n; k++) {
        fe_sym *p = bs->syms.items[k];
        if (p->kind != SYM_PARAM) continue;
        char name[512];
        snprintf(name, sizeof name, "%s.%lld.%s", y->name, (long long)inst, p->name);
        if (dsc_module_add_param(st->m, name, p->ptype, p->pinit) != DSC_OK) {
          st->oom = true;
          return;
        }
      }
  }
}

/* ---------------------------------------------------------------- driver */

static void lower_forward(fe_state *st) {
  fe_sym *fwd = fe_scope_find(&st->model_scope, "forward");
  if (!fwd || fwd->kind != SYM_FN) {
    ERR(st->model->name_loc, "model '%s' has no 'fn forward'", st->model->name);
    return;
  }
  fe_decl *d = fwd->decl;
  st->g = dsc_graph_new(st->m, "forward");
  if (!st->g) {
    st->oom = true;
    return;
  }
  int np = dsc_module_param_count(st->m);
  st->param_nodes = st_alloc(st, sizeof(dsc_node *) * (size_t)(np ? np : 1));
  if (!st->param_nodes) return;
  fe_frame fr;
  memset(&fr, 0, sizeof fr);
  fr.scope = &st->model_scope;
  fr.inst = -1;
  fe_frame tf = fr;
  tf.is_const = true;
  bool ok = true;
  for (int i = 0; i < d->args.n; i++) {
    fe_fn_arg *a = d->args.items[i];
    bool dup = false; /* reported by declare(): no second message from the graph */
    for (int j = 0; j < i; j++)
      dup = dup || strcmp(((fe_fn_arg *)d->args.items[j])->name, a->name) == 0;
    if (dup) {
      ok = false;
      continue;
    }
    if (!a->type) {
      ERR(a->loc, "argument '%s' of the model's 'forward' needs a type, as in %s: f32[B, T]",
          a->name, a->name);
      ok = false;
      continue;
    }
    char what[160];
    snprintf(what, sizeof what, "argument '%s'", a->name);
    dsc_type t;
    if (!fe_eval_type(st, &tf, a->type, &t, what)) {
      ok = false;
      continue;
    }
    dsc_graph_set_loc(st->g, a->loc);
    dsc_node *n = dsc_graph_input(st->g, a->name, t);
    if (!n) {
      ok = false;
      continue;
    }
    fe_value v = {.kind = V_TENSOR, .node = n};
    if (!fe_set_local(st, &fr, a->name, v)) return;
  }
  if (!ok) return;
  st->calls[st->n_calls++] = fwd;
  fe_exec_body(st, &fr, &d->body);
  st->n_calls--;
  if (st->abort || st->oom) return;
  if (!fr.returned) {
    ERR(d->name_loc, "function 'forward' ends without 'return'");
    return;
  }
  if (fr.ret.kind == V_ERR) return;
  if (fr.ret.kind != V_TENSOR) {
    ERR(fr.ret_loc, "the model's 'forward' must return a tensor, not %s", fe_kind_name(&fr.ret));
    return;
  }
  if (d->type) {
    dsc_type want, got = dsc_node_type(fr.ret.node);
    char w[96], g[96];
    if (!fe_eval_type(st, &tf, d->type, &want, "the return value")) return;
    if (!dsc_type_equal(&want, &got)) {
      ERR(fr.ret_loc, "'forward' returns %s, but its declared type is %s",
          fe_fmt_type(got, g, sizeof g), fe_fmt_type(want, w, sizeof w));
      return;
    }
  }
  dsc_graph_set_outputs(st->g, &fr.ret.node, 1);
}

static void check_options(fe_state *st) {
  if (!st->opts) return;
  for (int i = 0; i < st->opts->n_dims; i++) {
    const dsc_dim_binding *b = &st->opts->dims[i];
    if (!b->name || !*b->name)
      ERR(ir_no_loc, "a dimension binding has no name");
    else if (b->value <= 0)
      ERR(ir_no_loc, "dimension '%s' must be positive, got %lld", b->name, (long long)b->value);
  }
}

static dsc_status run(fe_state *st, const char *text, size_t len, const char *path,
                      dsc_module **out) {
  int errors0 = dsc_error_count(st->ctx);
#define FAILED() (st->oom || dsc_error_count(st->ctx) > errors0)
  check_options(st);
  fe_file *main = fe_add_file(st, path, text, len);
  if (!main) return DSC_ERR_INTERNAL;
  if (FAILED()) return st->oom ? DSC_ERR_INTERNAL : DSC_ERR_USER;
  fe_load_imports(st, main);
  if (FAILED()) return st->oom ? DSC_ERR_INTERNAL : DSC_ERR_USER;

  /* the global scope: top-level const and fn of every file */
  for (int f = 0; f < st->files.n; f++) {
    fe_file *file = st->files.items[f];
    unsigned allowed = (1u << FE_D_CONST) | (1u << FE_D_FN) | (1u << FE_D_IMPORT);
    if (file == main) allowed |= (1u << FE_D_MODEL) | (1u << FE_D_TRAIN);
    declare(st, &st->global, &file->decls,
            file == main ? "at the top level (only in a model or block)"
                         : "in an imported file (only const and fn are)",
            allowed);
    for (int i = 0; i < file->decls.n && file == main; i++) {
      fe_decl *d = file->decls.items[i];
      if (d->kind == FE_D_MODEL) {
        if (st->model)
          ERR(d->name_loc, "a file defines one model; '%s' was defined at line %d", st->model->name,
              st->model->name_loc.line);
        else
          st->model = d;
      } else if (d->kind == FE_D_TRAIN) {
        if (st->train)
          ERR(d->loc, "the train section is defined twice (first at line %d)", st->train->loc.line);
        else
          st->train = d;
      }
    }
  }
  if (!st->model) {
    dsc_loc loc = {main->path, 1, 1};
    ERR(loc, "no model defined in '%s' (expected 'model NAME { ... }')", main->path);
    return FAILED() && st->oom ? DSC_ERR_INTERNAL : DSC_ERR_USER;
  }
  st->m = dsc_module_new(st->ctx, st->model->name);
  if (!st->m) return DSC_ERR_INTERNAL;
  if (st->train) fe_lower_settings(st, &st->train->body, "");

  st->model_scope.parent = &st->global;
  declare(st, &st->model_scope, &st->model->body, "in a model",
          (1u << FE_D_CONST) | (1u << FE_D_PARAM) | (1u << FE_D_FN) | (1u << FE_D_BLOCK));
  eval_consts(st, &st->global);
  eval_consts(st, &st->model_scope);
  block_counts(st, &st->model_scope);
  add_params(st);
  if (!st->oom) lower_forward(st);
  if (FAILED() || st->m->arena.failed || st->arena.failed) {
    bool oom = st->oom || st->m->arena.failed || st->arena.failed;
    dsc_module_free(st->m);
    st->m = NULL;
    return oom ? DSC_ERR_INTERNAL : DSC_ERR_USER;
  }
  dsc_status vs = dsc_module_verify(st->m);
  if (vs != DSC_OK) {
    dsc_module_free(st->m);
    st->m = NULL;
    return vs;
  }
  *out = st->m;
  st->m = NULL;
  return DSC_OK;
#undef FAILED
}

dsc_status fe_compile(dsc_context *ctx, const char *text, size_t len, const char *file,
                      const dsc_frontend_options *opts, dsc_module **out) {
  fe_state *st = ir_alloc(ctx, sizeof *st);
  if (!st) return DSC_ERR_INTERNAL;
  memset(st, 0, sizeof *st);
  st->ctx = ctx;
  st->opts = opts;
  ir_arena_init(&st->arena, ctx);
  dsc_status s = run(st, text, len, file, out);
  if (st->m) dsc_module_free(st->m);
  ir_arena_release(&st->arena);
  ir_free(ctx, st, sizeof *st);
  return s;
}

dsc_status dsc_compile_string(dsc_context *ctx, const char *text, size_t len, const char *file,
                              const dsc_frontend_options *opts, dsc_module **out) {
  if (!ctx || !out || (!text && len)) return DSC_ERR_INTERNAL;
  *out = NULL;
  return fe_compile(ctx, text ? text : "", len, file ? file : "<string>", opts, out);
}

dsc_status dsc_compile_file(dsc_context *ctx, const char *path, const dsc_frontend_options *opts,
                            dsc_module **out) {
  if (!ctx || !path || !out) return DSC_ERR_INTERNAL;
  *out = NULL;
  /* read into the context's memory, then compile as a string */
  dsc_loc loc = {path, 0, 0};
  FILE *f = fe_open_regular(ctx, path, loc, "open");
  if (!f) return DSC_ERR_USER;
  size_t cap = 4096, n = 0;
  char *buf = ir_alloc(ctx, cap);
  while (buf) {
    n += fread(buf + n, 1, cap - n, f);
    if (n < cap) break;
    if (cap >= FE_MAX_FILE_BYTES) {
      fclose(f);
      ir_free(ctx, buf, cap);
      ir_error(ctx, loc, "'%s' is too large (more than %d bytes)", path, FE_MAX_FILE_BYTES);
      return DSC_ERR_USER;
    }
    char *nb = ir_realloc(ctx, buf, cap, cap * 2);
    if (!nb) ir_free(ctx, buf, cap);
    buf = nb;
    cap *= 2;
  }
  bool err = ferror(f) != 0;
  fclose(f);
  if (!buf) return DSC_ERR_INTERNAL;
  if (err) {
    ir_free(ctx, buf, cap);
    ir_error(ctx, loc, "cannot read '%s'", path);
    return DSC_ERR_USER;
  }
  dsc_status s = fe_compile(ctx, buf, n, path, opts, out);
  ir_free(ctx, buf, cap);
  return s;
}
