/* Evaluation of the model language: values and scopes, names, constant
 * expressions and their folding, argument binding, inlined user calls and
 * statements (frontend/lower.c says how lowering evaluates). */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "frontend/frontend.h"

/* ---------------------------------------------------------------- values and scopes */

const char *fe_kind_name(const fe_value *v) {
  switch (v->kind) {
    case V_NUM:
      return v->is_int ? "an integer" : "a number";
    case V_BOOL:
      return "a bool";
    case V_LIST:
      return "a list";
    case V_TENSOR:
      return "a tensor";
    case V_DTYPE:
      return "a dtype";
    case V_BLOCK:
      return "a block";
    case V_INST:
      return "a block instance";
    case V_FN:
      return "a function";
    case V_SYM:
      return "a name";
    case V_TUPLE:
      return "a tuple";
    case V_CALL:
      return "a call";
    default:
      return "an invalid value";
  }
}

fe_sym *fe_scope_find(const fe_scope *s, const char *name) {
  for (int i = 0; i < s->syms.n; i++) {
    fe_sym *y = s->syms.items[i];
    if (strcmp(y->name, name) == 0) return y;
  }
  return NULL;
}

const char *fe_decl_word(fe_decl_kind k) {
  switch (k) {
    case FE_D_IMPORT:
      return "import";
    case FE_D_CONST:
      return "const";
    case FE_D_PARAM:
      return "param";
    case FE_D_FN:
      return "fn";
    case FE_D_BLOCK:
      return "block";
    case FE_D_MODEL:
      return "model";
    default:
      return "train";
  }
}

fe_sym *fe_scope_add(fe_state *st, fe_scope *s, symkind kind, fe_decl *d) {
  fe_sym *prev = fe_scope_find(s, d->name);
  if (prev) {
    ERR(d->name_loc, "redefinition of '%s'", d->name);
    ir_diag(st->ctx, DSC_DIAG_NOTE, prev->decl->name_loc, "'%s' was first declared here", d->name);
    return NULL;
  }
  fe_sym *y = st_alloc(st, sizeof *y);
  if (!y) return NULL;
  y->kind = kind;
  y->name = d->name;
  y->decl = d;
  y->scope = s;
  st_push(st, &s->syms, y);
  return y;
}

/* ------------------------------------------------------------ evaluation */


static bool tick(fe_state *st, dsc_loc loc) {
  if (st->abort) return false;
  if (++st->work > FE_MAX_WORK) {
    ERR(loc, "the forward function unrolls to more than %d operations", FE_MAX_WORK);
    st->abort = true;
    return false;
  }
  return true;
}

/* Wraps a builder result: NULL means the builder reported the problem. */
fe_value fe_tensor(fe_state *st, dsc_node *n, dsc_loc loc) {
  if (!n || !tick(st, loc)) return verr;
  fe_value v = {.kind = V_TENSOR, .node = n};
  return v;
}

void fe_at(fe_state *st, dsc_loc loc) { dsc_graph_set_loc(st->g, loc); }

const char *fe_fmt_type(dsc_type t, char *buf, size_t n) {
  dsc_type_format(&t, buf, n);
  return buf;
}

static fe_local *find_local(fe_frame *fr, const char *name) {
  for (int i = fr->locals.n - 1; i >= 0; i--) {
    fe_local *l = fr->locals.items[i];
    if (l->name && strcmp(l->name, name) == 0) return l;
  }
  return NULL;
}

fe_local *fe_set_local(fe_state *st, fe_frame *fr, const char *name, fe_value v) {
  fe_local *l = find_local(fr, name);
  if (l) {
    l->val = v;
    return l;
  }
  l = st_alloc(st, sizeof *l);
  if (!l) return NULL;
  l->name = name;
  l->val = v;
  return st_push(st, &fr->locals, l) ? l : NULL;
}

static dsc_node *param_node(fe_state *st, fe_sym *y, int inst, dsc_loc loc) {
  if (!st->g || !st->param_nodes || !y->ok) return NULL;
  int idx = y->first_index;
  if (y->scope->block) {
    if (inst < 0 || inst >= y->scope->block->count) return NULL;
    idx += inst * y->scope->n_block_params;
  }
  if (idx < 0 || idx >= dsc_module_param_count(st->m)) return NULL;
  if (!st->param_nodes[idx]) {
    fe_at(st, loc);
    st->param_nodes[idx] = dsc_param_ref(st->g, dsc_module_param_name(st->m, idx));
  }
  return st->param_nodes[idx];
}

static bool is_dim_name(fe_state *st, const char *name) {
  if (strcmp(name, "B") == 0 || strcmp(name, "T") == 0) return true;
  for (int f = 0; f < st->files.n; f++) {
    fe_file *file = st->files.items[f];
    for (int i = 0; i < file->dim_names.n; i++)
      if (strcmp(file->dim_names.items[i], name) == 0) return true;
  }
  return false;
}

/* Collects the names visible from fr for a "did you mean" suggestion. */
static const char *suggest_name(fe_state *st, fe_frame *fr, const char *name, bool calls) {
  IR_UNUSED(st);
  const char *cands[512];
  int n = 0;
  for (int i = 0; i < fr->locals.n && n < 512; i++) {
    fe_local *l = fr->locals.items[i];
    if (l->name) cands[n++] = l->name;
  }
  for (fe_scope *s = fr->scope; s; s = s->parent)
    for (int i = 0; i < s->syms.n && n < 512; i++) cands[n++] = ((fe_sym *)s->syms.items[i])->name;
  if (calls)
    n += fe_builtin_names(cands + n, 512 - n);
  return fe_suggest(name, cands, n);
}

/* Looks a name up: locals, then enclosing scopes, dtypes, bound dims.
 * quiet: return V_ERR with no diagnostic when not found (found = false). */
static fe_value lookup(fe_state *st, fe_frame *fr, const char *name, dsc_loc loc, bool quiet,
                       bool *found) {
  if (found) *found = true;
  fe_local *l = find_local(fr, name);
  if (l) return l->val;
  for (fe_scope *s = fr->scope; s; s = s->parent) {
    fe_sym *y = fe_scope_find(s, name);
    if (!y) continue;
    fe_value v = verr;
    switch (y->kind) {
      case SYM_CONST:
        return fe_const_value(st, y, loc);
      case SYM_PARAM:
        if (fr->is_const) {
          ERR(loc, "parameter '%s' cannot be used in a constant expression", name);
          return verr;
        }
        return fe_tensor(st, param_node(st, y, s->block ? fr->inst : -1, loc), loc);
      case SYM_FN:
        v.kind = V_FN;
        v.sym = y;
        v.inst = s->block ? fr->inst : -1;
        return v;
      case SYM_BLOCK:
        if (y->count <= 0) return verr;
        v.kind = V_BLOCK;
        v.sym = y;
        return v;
    }
  }
  dsc_dtype dt;
  if (dsc_dtype_from_name(name, &dt) == 0) {
    fe_value v = {.kind = V_DTYPE, .dt = dt};
    return v;
  }
  if (st->opts)
    for (int i = 0; i < st->opts->n_dims; i++)
      if (st->opts->dims[i].name && strcmp(st->opts->dims[i].name, name) == 0)
        return vint(st->opts->dims[i].value);
  if (strcmp(name, "B") == 0 && st->has_batch) return vint(st->batch);
  if (strcmp(name, "T") == 0 && st->has_seq) return vint(st->seq);
  if (found) *found = false;
  if (quiet) return verr;
  if (is_dim_name(st, name)) {
    ERR(loc, "dimension '%s' is not bound (use --batch/--seq or --dim %s=N)", name, name);
    return verr;
  }
  const char *s = suggest_name(st, fr, name, false);
  if (s)
    ERR(loc, "undefined name '%s'; did you mean '%s'?", name, s);
  else
    ERR(loc, "undefined name '%s'", name);
  return verr;
}

fe_value fe_const_value(fe_state *st, fe_sym *y, dsc_loc use) {
  if (y->state == 2) return y->val;
  if (y->state == 1) {
    ERR(use, "constant '%s' depends on itself", y->name);
    return verr;
  }
  /* each level recurses through ev/lookup: a long chain would overflow the stack */
  if (st->const_depth >= FE_MAX_CONST_DEPTH) {
    if (!st->const_deep_reported)
      ERR(use,
          "constant '%s': definitions nested too deeply (more than %d levels of constants "
          "defined through other constants)",
          y->name, FE_MAX_CONST_DEPTH);
    st->const_deep_reported = true;
    return verr;
  }
  y->state = 1;
  fe_frame fr;
  memset(&fr, 0, sizeof fr);
  fr.scope = y->scope;
  fr.inst = -1;
  fr.is_const = true;
  st->const_depth++;
  fe_value v = fe_ev(st, &fr, y->decl->value);
  st->const_depth--;
  if (v.kind != V_ERR && v.kind != V_NUM && v.kind != V_BOOL && v.kind != V_LIST &&
      v.kind != V_DTYPE) {
    ERR(y->decl->value->loc, "constant '%s' must be a number, bool, list or dtype, not %s", y->name,
        fe_kind_name(&v));
    v = verr;
  }
  y->val = v;
  y->state = 2;
  return v;
}

static const char *fmt_num(const fe_value *n, char *buf, size_t size) {
  if (n->is_int)
    snprintf(buf, size, "%lld", (long long)n->i);
  else if (n->f == floor(n->f) && fabs(n->f) < 1e16) /* 3e9 as 3000000000, not 3e+09 */
    snprintf(buf, size, "%.0f", n->f);
  else
    ir_format_double(n->f, buf, size);
  return buf;
}

/* Whether a number can be stored exactly (integers) or without overflow (floats) in a tensor
 * of dtype dt: the one check for scalars combined with tensors, full/zeros/ones and const
 * initializers. `what` names the tensor for the message ("the tensor it is combined with"). */
bool fe_check_fits(fe_state *st, const fe_value *n, dsc_dtype dt, const char *what,
                       dsc_loc loc) {
  char b[48];
  double x = num(n);
  if (dt == DSC_BOOL) {
    if (x == 0 || x == 1) return true;
    ERR(loc, "%s is not 0 or 1, but %s is bool", fmt_num(n, b, sizeof b), what);
    return false;
  }
  if (dsc_dtype_is_float(dt)) {
    double max = dt == DSC_F32    ? 3.4028234663852886e38
                 : dt == DSC_F16  ? 65504.0
                 : dt == DSC_BF16 ? 3.3895313892515355e38
                                  : INFINITY;
    if (isfinite(x) && fabs(x) <= max) return true;
    ERR(loc, "%s does not fit in %s, the dtype of %s", fmt_num(n, b, sizeof b), dsc_dtype_name(dt),
        what);
    return false;
  }
  if (!n->is_int && x != floor(x)) {
    ERR(loc, "the number %s is not an integer, but %s is %s", fmt_num(n, b, sizeof b), what,
        dsc_dtype_name(dt));
    return false;
  }
  /* constant values are stored as doubles: beyond 2^53 integers are not exact */
  const double exact = 9007199254740992.0;
  if (dt == DSC_I64) {
    bool ok = n->is_int ? n->i >= -(int64_t)exact && n->i <= (int64_t)exact : fabs(x) <= exact;
    if (ok) return true;
    ERR(loc,
        "%s does not fit in an i64 constant, the dtype of %s: constants are stored as "
        "doubles, exact only up to 2^53 in magnitude",
        fmt_num(n, b, sizeof b), what);
    return false;
  }
  if (x >= (double)INT32_MIN && x <= (double)INT32_MAX) return true;
  ERR(loc, "%s does not fit in %s, the dtype of %s", fmt_num(n, b, sizeof b), dsc_dtype_name(dt),
      what);
  return false;
}

/* A number as a rank-0 tensor of the other operand's dtype. */
fe_value fe_materialize(fe_state *st, fe_frame *fr, const fe_value *n, dsc_dtype dt,
                            dsc_loc loc) {
  if (fr->is_const || !st->g) {
    ERR(loc, "tensors cannot be used in a constant expression");
    return verr;
  }
  if (dt == DSC_BOOL) {
    ERR(loc, "cannot combine a number with a bool tensor");
    return verr;
  }
  if (!fe_check_fits(st, n, dt, "the tensor it is combined with", loc)) return verr;
  dsc_type t = dsc_type_make(dt, 0, NULL);
  fe_at(st, loc);
  return fe_tensor(st, dsc_const(st->g, num(n), t), loc);
}

static const char *op_text(int op) {
  switch (op) {
    case '+':
      return "+";
    case '-':
      return "-";
    case '*':
      return "*";
    case '/':
      return "/";
    case '%':
      return "%";
    case '<':
      return "<";
    case '>':
      return ">";
    default:
      return "==";
  }
}

static fe_value fold(fe_state *st, int op, const fe_value *a, const fe_value *b, dsc_loc loc) {
  if (op == '<' || op == '>' || op == 'E') {
    fe_value r = {.kind = V_BOOL};
    if (a->is_int && b->is_int)
      r.b = op == '<' ? a->i < b->i : op == '>' ? a->i > b->i : a->i == b->i;
    else
      r.b = op == '<' ? num(a) < num(b) : op == '>' ? num(a) > num(b) : num(a) == num(b);
    return r;
  }
  if (a->is_int && b->is_int) {
    int64_t x = a->i, y = b->i, r = 0;
    bool ovf = false;
    switch (op) {
      case '+':
        ovf = __builtin_add_overflow(x, y, &r);
        break;
      case '-':
        ovf = __builtin_sub_overflow(x, y, &r);
        break;
      case '*':
        ovf = __builtin_mul_overflow(x, y, &r);
        break;
      case '/':
      case '%':
        if (y == 0) {
          ERR(loc, "division by zero in a constant expression");
          return verr;
        }
        if (x == INT64_MIN && y == -1) {
          ovf = true;
          break;
        }
        if (op == '%') return vint(x % y);
        if (x % y == 0) return vint(x / y);
        return vfloat((double)x / (double)y);
    }
    if (ovf) {
      ERR(loc, "integer overflow in a constant expression");
      return verr;
    }
    return vint(r);
  }
  double x = num(a), y = num(b), r = 0;
  switch (op) {
    case '+':
      r = x + y;
      break;
    case '-':
      r = x - y;
      break;
    case '*':
      r = x * y;
      break;
    case '/':
    case '%':
      if (y == 0) {
        ERR(loc, "division by zero in a constant expression");
        return verr;
      }
      r = op == '/' ? x / y : fmod(x, y);
      break;
  }
  if (!isfinite(r)) {
    ERR(loc, "the constant expression overflows");
    return verr;
  }
  return vfloat(r);
}

/* la, lb: the operands, where a number that does not fit the other operand's dtype is reported */
static fe_value binary(fe_state *st, fe_frame *fr, int op, fe_value a, fe_value b, dsc_loc loc,
                       dsc_loc la, dsc_loc lb) {
  if (a.kind == V_ERR || b.kind == V_ERR) return verr;
  if (a.kind == V_NUM && b.kind == V_NUM) return fold(st, op, &a, &b, loc);
  if (a.kind == V_BOOL && b.kind == V_BOOL && op == 'E') {
    fe_value r = {.kind = V_BOOL, .b = a.b == b.b};
    return r;
  }
  bool ta = a.kind == V_TENSOR, tb = b.kind == V_TENSOR;
  if ((ta || a.kind == V_NUM) && (tb || b.kind == V_NUM)) {
    if (op == '%') {
      ERR(loc, "'%%' is only defined on numbers, not on tensors");
      return verr;
    }
    if (!ta) a = fe_materialize(st, fr, &a, dsc_node_type(b.node).dtype, la);
    if (!tb) b = fe_materialize(st, fr, &b, dsc_node_type(a.node).dtype, lb);
    if (a.kind == V_ERR || b.kind == V_ERR) return verr;
    dsc_op o = op == '+'   ? DSC_OP_ADD
               : op == '-' ? DSC_OP_SUB
               : op == '*' ? DSC_OP_MUL
               : op == '/' ? DSC_OP_DIV
               : op == '<' ? DSC_OP_LESS
               : op == '>' ? DSC_OP_GREATER
                           : DSC_OP_EQUAL;
    fe_at(st, loc);
    return fe_tensor(st, dsc_binary(st->g, o, a.node, b.node), loc);
  }
  ERR(loc, "cannot apply '%s' to %s and %s", op_text(op), fe_kind_name(&a), fe_kind_name(&b));
  return verr;
}

static fe_value member(fe_state *st, fe_value obj, const char *name, dsc_loc loc) {
  if (obj.kind == V_ERR) return verr;
  if (obj.kind == V_BLOCK) {
    ERR(loc, "block '%s' has %lld instances: write %s[i].%s, or loop with 'for b in %s'",
        obj.sym->name, (long long)obj.sym->count, obj.sym->name, name, obj.sym->name);
    return verr;
  }
  if (obj.kind != V_INST) {
    ERR(loc, "'.%s' needs a block instance, not %s", name, fe_kind_name(&obj));
    return verr;
  }
  fe_sym *blk = obj.sym;
  fe_sym *y = fe_scope_find(blk->inner, name);
  if (!y) {
    const char *cands[256];
    int n = 0;
    for (int i = 0; i < blk->inner->syms.n && n < 256; i++)
      cands[n++] = ((fe_sym *)blk->inner->syms.items[i])->name;
    const char *s = fe_suggest(name, cands, n);
    if (s)
      ERR(loc, "block '%s' has no member '%s'; did you mean '%s'?", blk->name, name, s);
    else
      ERR(loc, "block '%s' has no member '%s'", blk->name, name);
    return verr;
  }
  fe_value v = verr;
  switch (y->kind) {
    case SYM_CONST:
      return fe_const_value(st, y, loc);
    case SYM_PARAM:
      if (!st->g) {
        ERR(loc, "parameter '%s.%s' cannot be used in a constant expression", blk->name, name);
        return verr;
      }
      return fe_tensor(st, param_node(st, y, obj.inst, loc), loc);
    case SYM_FN:
      v.kind = V_FN;
      v.sym = y;
      v.inst = obj.inst;
      return v;
    default:
      return verr; /* blocks do not nest */
  }
}

/* ----------------------------------------------------- argument binding */

/* Maps positional and keyword arguments of a call onto parameter slots. */
bool fe_bind_args(fe_state *st, const fe_expr *call, fe_binding *b) {
  bool ok = true, seen_key = false;
  int npos = 0;
  for (size_t i = 0; i < sizeof b->slots / sizeof b->slots[0]; i++) b->slots[i] = NULL;
  for (int i = 0; i < call->items.n; i++) {
    const fe_arg *a = call->items.items[i];
    int slot = -1;
    if (!a->key) {
      if (seen_key) {
        ERR(a->loc, "positional argument after a keyword argument in a call to '%s'", b->fname);
        ok = false;
        continue;
      }
      if (npos >= b->n_params) {
        if (b->n_req == b->n_params)
          ERR(a->loc, "'%s' takes %d argument%s, got %d", b->fname, b->n_params,
              b->n_params == 1 ? "" : "s", call->items.n);
        else
          ERR(a->loc, "'%s' takes at most %d arguments, got %d", b->fname, b->n_params,
              call->items.n);
        return false;
      }
      slot = npos++;
    } else {
      seen_key = true;
      for (int k = 0; k < b->n_params; k++)
        if (strcmp(b->params[k], a->key) == 0) slot = k;
      if (slot < 0) {
        const char *s = fe_suggest(a->key, b->params, b->n_params);
        if (s)
          ERR(a->loc, "'%s' has no argument named '%s'; did you mean '%s'?", b->fname, a->key, s);
        else
          ERR(a->loc, "'%s' has no argument named '%s'", b->fname, a->key);
        ok = false;
        continue;
      }
    }
    if (b->slots[slot]) {
      ERR(a->loc, "argument '%s' of '%s' is given twice", b->params[slot], b->fname);
      ok = false;
      continue;
    }
    b->slots[slot] = a->value;
    b->slot_loc[slot] = a->loc;
  }
  if (!ok) return false;
  for (int k = 0; k < b->n_req; k++)
    if (!b->slots[k]) {
      ERR(call->loc, "missing argument '%s' in call to '%s'", b->params[k], b->fname);
      return false;
    }
  return true;
}

fe_value fe_arg_tensor(fe_state *st, fe_frame *fr, fe_binding *b, int k) {
  fe_value v = fe_ev(st, fr, b->slots[k]);
  if (v.kind == V_ERR || v.kind == V_TENSOR) return v;
  ERR(b->slot_loc[k], "argument '%s' of '%s' must be a tensor, not %s", b->params[k], b->fname,
      fe_kind_name(&v));
  return verr;
}

/* Argument k, when it is a value of kind `kind` (and an integer when
 * integer is set); else a message: it must be `what`. */
static bool arg_kind(fe_state *st, fe_frame *fr, fe_binding *b, int k, vkind kind, bool integer,
                     const char *what, fe_value *v) {
  *v = fe_ev(st, fr, b->slots[k]);
  if (v->kind == V_ERR) return false;
  if (v->kind == kind && (!integer || v->is_int)) return true;
  ERR(b->slot_loc[k], "argument '%s' of '%s' must be %s, not %s", b->params[k], b->fname, what,
      fe_kind_name(v));
  return false;
}

bool fe_arg_int(fe_state *st, fe_frame *fr, fe_binding *b, int k, int64_t *out) {
  fe_value v;
  if (!arg_kind(st, fr, b, k, V_NUM, true, "an integer", &v)) return false;
  *out = v.i;
  return true;
}

bool fe_arg_num(fe_state *st, fe_frame *fr, fe_binding *b, int k, double *out) {
  fe_value v;
  if (!arg_kind(st, fr, b, k, V_NUM, false, "a number", &v)) return false;
  *out = num(&v);
  return true;
}

bool fe_arg_bool(fe_state *st, fe_frame *fr, fe_binding *b, int k, bool *out) {
  fe_value v;
  if (!arg_kind(st, fr, b, k, V_BOOL, false, "true or false", &v)) return false;
  *out = v.b;
  return true;
}

bool fe_arg_dtype(fe_state *st, fe_frame *fr, fe_binding *b, int k, dsc_dtype *out) {
  fe_value v;
  if (!arg_kind(st, fr, b, k, V_DTYPE, false, "a dtype (f32, bf16, i32, ...)", &v)) return false;
  *out = v.dt;
  return true;
}

bool fe_arg_ints(fe_state *st, fe_frame *fr, fe_binding *b, int k, bool allow_int, int64_t *out,
                     int *n) {
  fe_value v = fe_ev(st, fr, b->slots[k]);
  if (v.kind == V_ERR) return false;
  if (allow_int && v.kind == V_NUM && v.is_int) {
    out[0] = v.i;
    *n = 1;
    return true;
  }
  if (v.kind == V_LIST) {
    if (v.n > DSC_MAX_RANK) {
      ERR(b->slot_loc[k], "argument '%s' of '%s' has %d entries; at most %d are allowed",
          b->params[k], b->fname, v.n, DSC_MAX_RANK);
      return false;
    }
    for (int i = 0; i < v.n; i++) {
      if (v.items[i].kind == V_ERR) return false;
      if (v.items[i].kind != V_NUM || !v.items[i].is_int) {
        ERR(b->slot_loc[k], "argument '%s' of '%s' must be a list of integers (entry %d is %s)",
            b->params[k], b->fname, i, fe_kind_name(&v.items[i]));
        return false;
      }
      out[i] = v.items[i].i;
    }
    *n = v.n;
    return true;
  }
  ERR(b->slot_loc[k], "argument '%s' of '%s' must be %s, not %s", b->params[k], b->fname,
      allow_int ? "an integer or a list of integers" : "a list of integers", fe_kind_name(&v));
  return false;
}

bool fe_norm_axis(fe_state *st, fe_binding *b, int k, int64_t *axis, int rank) {
  int64_t a = *axis;
  if (a < 0) a += rank;
  if (a < 0 || a >= rank) {
    ERR(b->slot_loc[k], "axis %lld is out of range for a tensor of rank %d", (long long)*axis,
        rank);
    return false;
  }
  *axis = a;
  return true;
}

bool fe_need_graph(fe_state *st, fe_frame *fr, const char *fname, dsc_loc loc) {
  if (!fr->is_const && st->g) return true;
  ERR(loc, "'%s' creates a tensor and cannot be used in a constant expression", fname);
  return false;
}

/* Checks a shape list given to zeros/ones/full/broadcast/reshape. */
bool fe_check_shape(fe_state *st, dsc_loc loc, const int64_t *dims, int n) {
  int64_t total = 1;
  for (int i = 0; i < n; i++) {
    if (dims[i] <= 0) {
      ERR(loc, "dimension %d of the shape must be positive, got %lld", i, (long long)dims[i]);
      return false;
    }
    if (__builtin_mul_overflow(total, dims[i], &total) || total > FE_MAX_NUMEL) {
      ERR(loc, "the shape has too many elements (the limit is 2^40)");
      return false;
    }
  }
  return true;
}

/* ------------------------------------------------------------ user calls */


static fe_value call_user(fe_state *st, fe_frame *caller, fe_value fnv, const fe_expr *call) {
  fe_sym *y = fnv.sym;
  fe_decl *d = y->decl;
  for (int i = 0; i < st->n_calls; i++)
    if (st->calls[i] == y) {
      ERR(call->loc, "recursive call to '%s'", y->name);
      return verr;
    }
  if (st->n_calls >= FE_MAX_INLINE_DEPTH) {
    ERR(call->loc, "calls nested too deeply (more than %d functions)", FE_MAX_INLINE_DEPTH);
    return verr;
  }
  if (d->args.n > 8) {
    ERR(d->name_loc, "function '%s' has more than 8 arguments", y->name);
    return verr;
  }
  const char *names[8];
  for (int i = 0; i < d->args.n; i++) names[i] = ((fe_fn_arg *)d->args.items[i])->name;
  fe_binding b;
  memset(&b, 0, sizeof b);
  b.fname = y->name;
  b.params = names;
  b.n_params = b.n_req = d->args.n;
  if (!fe_bind_args(st, call, &b)) return verr;

  fe_frame fr;
  memset(&fr, 0, sizeof fr);
  fr.scope = y->scope;
  fr.inst = fnv.inst;
  fr.is_const = caller->is_const;
  fe_frame tf = fr; /* for types: no locals */
  tf.is_const = true;
  bool ok = true;
  for (int i = 0; i < d->args.n; i++) {
    fe_fn_arg *fa = d->args.items[i];
    fe_value v = fe_ev(st, caller, b.slots[i]);
    if (v.kind == V_ERR) ok = false;
    if (v.kind != V_ERR && fa->type) {
      dsc_type want;
      char w[96], g[96];
      if (!fe_eval_type(st, &tf, fa->type, &want, fa->name)) {
        ok = false;
      } else if (v.kind != V_TENSOR) {
        ERR(b.slot_loc[i], "argument '%s' of '%s': expected %s, got %s", fa->name, y->name,
            fe_fmt_type(want, w, sizeof w), fe_kind_name(&v));
        ok = false;
      } else {
        dsc_type got = dsc_node_type(v.node);
        if (!dsc_type_equal(&want, &got)) {
          ERR(b.slot_loc[i], "argument '%s' of '%s': expected %s, got %s", fa->name, y->name,
              fe_fmt_type(want, w, sizeof w), fe_fmt_type(got, g, sizeof g));
          ok = false;
        }
      }
    }
    if (!fe_set_local(st, &fr, fa->name, v)) return verr;
  }
  if (!ok) return verr;
  st->calls[st->n_calls++] = y;
  fe_exec_body(st, &fr, &d->body);
  st->n_calls--;
  if (st->abort) return verr;
  if (!fr.returned) {
    ERR(d->name_loc, "function '%s' ends without 'return'", y->name);
    return verr;
  }
  if (fr.ret.kind != V_ERR && d->type) {
    dsc_type want;
    char w[96], g[96];
    if (!fe_eval_type(st, &tf, d->type, &want, "the return value")) return verr;
    if (fr.ret.kind != V_TENSOR) {
      ERR(fr.ret_loc, "'%s' returns %s, but its declared type is %s", y->name, fe_kind_name(&fr.ret),
          fe_fmt_type(want, w, sizeof w));
      return verr;
    }
    dsc_type got = dsc_node_type(fr.ret.node);
    if (!dsc_type_equal(&want, &got)) {
      ERR(fr.ret_loc, "'%s' returns %s, but its declared type is %s", y->name,
          fe_fmt_type(got, g, sizeof g), fe_fmt_type(want, w, sizeof w));
      return verr;
    }
  }
  return fr.ret;
}

static fe_value ev_call(fe_state *st, fe_frame *fr, const fe_expr *e) {
  const fe_expr *c = e->a;
  if (c->kind == FE_E_NAME) {
    bool found;
    fe_value v = lookup(st, fr, c->name, c->loc, true, &found);
    if (found && v.kind == V_FN) return call_user(st, fr, v, e);
    fe_builtin bi;
    if (fe_find_builtin(c->name, &bi)) return fe_call_builtin(st, fr, &bi, e);
    if (found) {
      if (v.kind == V_ERR) return verr;
      ERR(c->loc, "'%s' is %s, not a function", c->name, fe_kind_name(&v));
      return verr;
    }
    const char *s = suggest_name(st, fr, c->name, true);
    if (s)
      ERR(c->loc, "unknown function '%s'; did you mean '%s'?", c->name, s);
    else
      ERR(c->loc, "unknown function '%s'", c->name);
    return verr;
  }
  fe_value f = fe_ev(st, fr, c);
  if (f.kind == V_ERR) return verr;
  if (f.kind != V_FN) {
    ERR(c->loc, "%s cannot be called", fe_kind_name(&f));
    return verr;
  }
  return call_user(st, fr, f, e);
}

static fe_value ev_inner(fe_state *st, fe_frame *fr, const fe_expr *e);

fe_value fe_ev(fe_state *st, fe_frame *fr, const fe_expr *e) {
  if (st->abort || st->oom) return verr;
  if (st->eval_depth >= FE_MAX_EVAL_DEPTH) {
    ERR(e->loc,
        "evaluation nested too deeply (more than %d levels of expressions, constants and "
        "function calls)",
        FE_MAX_EVAL_DEPTH);
    st->abort = true; /* a resource limit, like the work limit: stop evaluating */
    return verr;
  }
  st->eval_depth++;
  fe_value v = ev_inner(st, fr, e);
  st->eval_depth--;
  return v;
}

static fe_value ev_inner(fe_state *st, fe_frame *fr, const fe_expr *e) {
  switch (e->kind) {
    case FE_E_INT: {
      fe_value v = vint(e->i);
      v.is_size = e->is_size;
      return v;
    }
    case FE_E_FLOAT:
      return vfloat(e->f);
    case FE_E_BOOL: {
      fe_value v = {.kind = V_BOOL, .b = e->b};
      return v;
    }
    case FE_E_NAME:
      return lookup(st, fr, e->name, e->loc, false, NULL);
    case FE_E_UNARY: {
      fe_value a = fe_ev(st, fr, e->a);
      if (a.kind == V_ERR) return verr;
      if (a.kind == V_NUM) {
        if (!a.is_int) return vfloat(-a.f);
        if (a.i == INT64_MIN) return ERR(e->loc, "integer overflow in a constant expression"), verr;
        return vint(-a.i);
      }
      if (a.kind == V_TENSOR) {
        fe_at(st, e->loc);
        return fe_tensor(st, dsc_unary(st->g, DSC_OP_NEG, a.node), e->loc);
      }
      ERR(e->loc, "cannot negate %s", fe_kind_name(&a));
      return verr;
    }
    case FE_E_BINARY: {
      fe_value a = fe_ev(st, fr, e->a);
      fe_value b = fe_ev(st, fr, e->b2);
      return binary(st, fr, e->op, a, b, e->loc, e->a->loc, e->b2->loc);
    }
    case FE_E_CALL:
      return ev_call(st, fr, e);
    case FE_E_MEMBER:
      return member(st, fe_ev(st, fr, e->a), e->name, e->loc);
    case FE_E_INDEX: {
      fe_value obj = fe_ev(st, fr, e->a);
      fe_value idx = fe_ev(st, fr, e->b2);
      if (obj.kind == V_ERR || idx.kind == V_ERR) return verr;
      if (obj.kind != V_BLOCK) {
        ERR(e->loc, "only blocks can be indexed, not %s", fe_kind_name(&obj));
        return verr;
      }
      if (idx.kind != V_NUM || !idx.is_int) {
        ERR(e->b2->loc, "a block index must be an integer, not %s", fe_kind_name(&idx));
        return verr;
      }
      int64_t i = idx.i < 0 ? idx.i + obj.sym->count : idx.i;
      if (i < 0 || i >= obj.sym->count) {
        ERR(e->b2->loc, "index %lld is out of range for block '%s' with %lld instances",
            (long long)idx.i, obj.sym->name, (long long)obj.sym->count);
        return verr;
      }
      fe_value v = {.kind = V_INST, .sym = obj.sym, .inst = (int)i};
      return v;
    }
    case FE_E_LIST: {
      fe_value v = {.kind = V_LIST, .n = e->items.n};
      v.items = st_alloc(st, sizeof(fe_value) * (size_t)(e->items.n ? e->items.n : 1));
      if (!v.items) return verr;
      for (int i = 0; i < e->items.n; i++) {
        v.items[i] = fe_ev(st, fr, e->items.items[i]);
        if (v.items[i].kind == V_ERR) return verr;
      }
      return v;
    }
    case FE_E_TUPLE:
      ERR(e->loc, "tuples are only allowed in the train section");
      return verr;
  }
  return verr;
}

/* ------------------------------------------------------------ statements */

bool fe_exec_body(fe_state *st, fe_frame *fr, const fe_list *body) {
  for (int i = 0; i < body->n; i++) {
    fe_stmt *s = body->items[i];
    if (st->abort || st->oom) return false;
    if (fr->returned) {
      ERR(s->loc, "unreachable statement after 'return'");
      return false;
    }
    if (!tick(st, s->loc)) return false;
    switch (s->kind) {
      case FE_S_ASSIGN:
        if (!fe_set_local(st, fr, s->name, fe_ev(st, fr, s->value))) return false;
        break;
      case FE_S_RETURN:
        fr->ret = fe_ev(st, fr, s->value);
        fr->ret_loc = s->value->loc;
        fr->returned = true;
        break;
      case FE_S_FOR: {
        fe_value bv = lookup(st, fr, s->block, s->block_loc, false, NULL);
        if (bv.kind == V_ERR) break;
        if (bv.kind != V_BLOCK) {
          ERR(s->block_loc, "'for' loops over a block, but '%s' is %s", s->block, fe_kind_name(&bv));
          break;
        }
        fe_local *var = NULL;
        for (int64_t k = 0; k < bv.sym->count && !fr->returned; k++) {
          fe_value inst = {.kind = V_INST, .sym = bv.sym, .inst = (int)k};
          if (!var) {
            var = st_alloc(st, sizeof *var);
            if (!var || !st_push(st, &fr->locals, var)) return false;
            var->name = s->name;
          }
          var->val = inst;
          if (!fe_exec_body(st, fr, &s->body) && (st->abort || st->oom)) return false;
        }
        if (var) var->name = NULL; /* the loop variable ends with its loop */
        break;
      }
    }
  }
  return true;
}
