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

#include "dsc/settings.h"
#include "frontend/frontend.h"

/* ---------------------------------------------------------------- values */

typedef enum {
  V_ERR,    /* an error was already reported */
  V_NUM,    /* is_int ? i : f */
  V_BOOL,   /* b */
  V_LIST,   /* items */
  V_TENSOR, /* node */
  V_DTYPE,  /* dt */
  V_BLOCK,  /* sym */
  V_INST,   /* sym, inst */
  V_FN,     /* sym, inst (the block instance it closes over, or -1) */
  V_SYM,    /* name: an identifier in the train section */
  V_TUPLE,  /* items: train section only */
  V_CALL,   /* name(keys[i] = items[i]): train section only */
} vkind;

typedef struct fe_sym fe_sym;
typedef struct fe_scope fe_scope;

typedef struct fe_value {
  vkind kind;
  bool is_int, is_size, b;
  int64_t i;
  double f;
  dsc_node *node;
  dsc_dtype dt;
  struct fe_value *items;
  const char **keys;
  int n;
  fe_sym *sym;
  int inst;
  const char *name;
} fe_value;

static const fe_value verr = {.kind = V_ERR};

static fe_value vint(int64_t i) {
  fe_value v = {.kind = V_NUM, .is_int = true, .i = i};
  return v;
}
static fe_value vfloat(double f) {
  fe_value v = {.kind = V_NUM, .f = f};
  return v;
}
static double num(const fe_value *v) { return v->is_int ? (double)v->i : v->f; }

static const char *kind_name(const fe_value *v) {
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

/* ---------------------------------------------------------------- scopes */

typedef enum { SYM_CONST, SYM_PARAM, SYM_FN, SYM_BLOCK } symkind;

struct fe_sym {
  symkind kind;
  const char *name;
  fe_decl *decl;
  fe_scope *scope; /* where it is declared */
  int state;       /* consts: 0 not evaluated, 1 evaluating, 2 done */
  fe_value val;
  fe_scope *inner; /* blocks: their own scope */
  int64_t count;   /* blocks: number of instances (0 when invalid) */
  bool ok;         /* params: type and init evaluated without error */
  dsc_type ptype;
  dsc_init pinit;
  int first_index; /* params: module index (block params: of instance 0) */
};

struct fe_scope {
  fe_scope *parent;
  fe_list syms;  /* fe_sym* */
  fe_sym *block; /* the block this scope belongs to, if any */
  int n_block_params;
};

typedef struct {
  const char *name; /* NULL: dead (a loop variable after its loop) */
  fe_value val;
} fe_local;

typedef struct fe_frame {
  fe_scope *scope;
  int inst;       /* block instance in effect for scope's block params */
  bool is_const;  /* constant expression: no tensors */
  fe_list locals; /* fe_local* */
  bool returned;
  fe_value ret;
  dsc_loc ret_loc;
} fe_frame;

typedef struct {
  dsc_context *ctx;
  ir_arena arena; /* AST and lowering values, released at the end */
  const dsc_frontend_options *opts;
  fe_list files; /* fe_file* */
  fe_file *import_stack[32];
  int import_depth;
  fe_scope global;
  fe_scope model_scope;
  fe_decl *model, *train;
  dsc_module *m;
  dsc_graph *g;
  dsc_node **param_nodes;
  bool has_batch, has_seq;
  int64_t batch, seq;
  fe_sym *calls[FE_MAX_INLINE_DEPTH];
  int n_calls;
  int const_depth;          /* constants being evaluated, one inside the other */
  bool const_deep_reported; /* report the depth limit once, not once per chain segment */
  int eval_depth;           /* ev() recursion: bounds the stack (deep expressions in deep
                               constant chains or inlined calls multiply) */
  long work;
  bool abort; /* the work limit was hit: stop evaluating */
  bool oom;
} fe_state;

static void *st_alloc(fe_state *st, size_t n) {
  void *p = ir_arena_alloc(&st->arena, n);
  if (!p) st->oom = true;
  return p;
}

static bool st_push(fe_state *st, fe_list *l, void *x) {
  if (!x || !fe_list_push(&st->arena, l, x)) {
    st->oom = true;
    return false;
  }
  return true;
}

#define ERR(loc, ...) ir_error(st->ctx, (loc), __VA_ARGS__)

static fe_sym *scope_find(const fe_scope *s, const char *name) {
  for (int i = 0; i < s->syms.n; i++) {
    fe_sym *y = s->syms.items[i];
    if (strcmp(y->name, name) == 0) return y;
  }
  return NULL;
}

static const char *decl_word(fe_decl_kind k) {
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

static fe_sym *scope_add(fe_state *st, fe_scope *s, symkind kind, fe_decl *d) {
  fe_sym *prev = scope_find(s, d->name);
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

/* -------------------------------------------------------------- builtins */

typedef enum {
  B_UNARY,
  B_POW,
  B_MAXIMUM,
  B_WHERE,
  B_CAST,
  B_REDUCE,
  B_MATMUL,
  B_TRANSPOSE,
  B_PERMUTE,
  B_RESHAPE,
  B_SLICE,
  B_CONCAT,
  B_BROADCAST,
  B_EMBEDDING,
  B_IOTA,
  B_FILL,
  B_FULL,
  B_SOFTMAX,
  B_LAYERNORM,
  B_RMSNORM,
  B_ATTENTION,
  B_XENT,
} bkind;

typedef struct {
  const char *name;
  bkind kind;
  dsc_op op;
  int n_req;
  const char *params[6];
  double fill; /* zeros/ones */
} fe_builtin;

static const fe_builtin builtins[] = {
    {"exp", B_UNARY, DSC_OP_EXP, 1, {"x"}, 0},
    {"log", B_UNARY, DSC_OP_LOG, 1, {"x"}, 0},
    {"sqrt", B_UNARY, DSC_OP_SQRT, 1, {"x"}, 0},
    {"rsqrt", B_UNARY, DSC_OP_RSQRT, 1, {"x"}, 0},
    {"tanh", B_UNARY, DSC_OP_TANH, 1, {"x"}, 0},
    {"relu", B_UNARY, DSC_OP_RELU, 1, {"x"}, 0},
    {"gelu", B_UNARY, DSC_OP_GELU, 1, {"x"}, 0},
    {"silu", B_UNARY, DSC_OP_SILU, 1, {"x"}, 0},
    {"sigmoid", B_UNARY, DSC_OP_SIGMOID, 1, {"x"}, 0},
    {"neg", B_UNARY, DSC_OP_NEG, 1, {"x"}, 0},
    {"pow", B_POW, DSC_OP_POW, 2, {"x", "p"}, 0},
    {"maximum", B_MAXIMUM, DSC_OP_MAXIMUM, 2, {"a", "b"}, 0},
    {"where", B_WHERE, DSC_OP_WHERE, 3, {"cond", "a", "b"}, 0},
    {"cast", B_CAST, DSC_OP_CAST, 2, {"x", "dtype"}, 0},
    {"sum", B_REDUCE, DSC_OP_SUM, 1, {"x", "axis", "keepdims"}, 0},
    {"mean", B_REDUCE, DSC_OP_MEAN, 1, {"x", "axis", "keepdims"}, 0},
    {"max", B_REDUCE, DSC_OP_MAX, 1, {"x", "axis", "keepdims"}, 0},
    {"matmul", B_MATMUL, DSC_OP_MATMUL, 2, {"a", "b"}, 0},
    {"transpose", B_TRANSPOSE, DSC_OP_PERMUTE, 1, {"x", "i", "j"}, 0},
    {"permute", B_PERMUTE, DSC_OP_PERMUTE, 2, {"x", "perm"}, 0},
    {"reshape", B_RESHAPE, DSC_OP_RESHAPE, 2, {"x", "shape"}, 0},
    {"slice", B_SLICE, DSC_OP_SLICE, 4, {"x", "axis", "start", "end"}, 0},
    {"concat", B_CONCAT, DSC_OP_CONCAT, 1, {"xs", "axis"}, 0},
    {"broadcast", B_BROADCAST, DSC_OP_BROADCAST, 2, {"x", "shape"}, 0},
    {"embedding", B_EMBEDDING, DSC_OP_EMBEDDING, 2, {"table", "ids"}, 0},
    {"iota", B_IOTA, DSC_OP_IOTA, 1, {"n", "dtype"}, 0},
    {"zeros", B_FILL, DSC_OP_CONST, 1, {"shape", "dtype"}, 0.0},
    {"ones", B_FILL, DSC_OP_CONST, 1, {"shape", "dtype"}, 1.0},
    {"full", B_FULL, DSC_OP_CONST, 2, {"shape", "value", "dtype"}, 0},
    {"softmax", B_SOFTMAX, DSC_OP_SOFTMAX, 1, {"x", "axis"}, 0},
    {"log_softmax", B_SOFTMAX, DSC_OP_LOG_SOFTMAX, 1, {"x", "axis"}, 0},
    {"layernorm", B_LAYERNORM, DSC_OP_LAYERNORM, 3, {"x", "w", "b", "eps"}, 0},
    {"rmsnorm", B_RMSNORM, DSC_OP_RMSNORM, 2, {"x", "w", "eps"}, 0},
    {"attention", B_ATTENTION, DSC_OP_ATTENTION, 4, {"q", "k", "v", "heads", "causal"}, 0},
    {"cross_entropy", B_XENT, DSC_OP_CROSS_ENTROPY, 2, {"logits", "targets"}, 0},
};
#define N_BUILTINS ((int)(sizeof builtins / sizeof builtins[0]))

static const fe_builtin *find_builtin(const char *name) {
  for (int i = 0; i < N_BUILTINS; i++)
    if (strcmp(builtins[i].name, name) == 0) return &builtins[i];
  return NULL;
}

static int builtin_n_params(const fe_builtin *b) {
  int n = 0;
  while (n < 6 && b->params[n]) n++;
  return n;
}

/* ------------------------------------------------------------ evaluation */

static fe_value ev(fe_state *st, fe_frame *fr, const fe_expr *e);
static fe_value const_value(fe_state *st, fe_sym *y, dsc_loc use);
static bool exec_body(fe_state *st, fe_frame *fr, const fe_list *body);

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
static fe_value tensor(fe_state *st, dsc_node *n, dsc_loc loc) {
  if (!n || !tick(st, loc)) return verr;
  fe_value v = {.kind = V_TENSOR, .node = n};
  return v;
}

static void at(fe_state *st, dsc_loc loc) { dsc_graph_set_loc(st->g, loc); }

static const char *fmt_type(dsc_type t, char *buf, size_t n) {
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

static fe_local *set_local(fe_state *st, fe_frame *fr, const char *name, fe_value v) {
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
    at(st, loc);
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
    for (int i = 0; i < N_BUILTINS && n < 512; i++) cands[n++] = builtins[i].name;
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
    fe_sym *y = scope_find(s, name);
    if (!y) continue;
    fe_value v = verr;
    switch (y->kind) {
      case SYM_CONST:
        return const_value(st, y, loc);
      case SYM_PARAM:
        if (fr->is_const) {
          ERR(loc, "parameter '%s' cannot be used in a constant expression", name);
          return verr;
        }
        return tensor(st, param_node(st, y, s->block ? fr->inst : -1, loc), loc);
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

static fe_value const_value(fe_state *st, fe_sym *y, dsc_loc use) {
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
  fe_value v = ev(st, &fr, y->decl->value);
  st->const_depth--;
  if (v.kind != V_ERR && v.kind != V_NUM && v.kind != V_BOOL && v.kind != V_LIST &&
      v.kind != V_DTYPE) {
    ERR(y->decl->value->loc, "constant '%s' must be a number, bool, list or dtype, not %s", y->name,
        kind_name(&v));
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
static bool check_fits(fe_state *st, const fe_value *n, dsc_dtype dt, const char *what,
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
static fe_value materialize(fe_state *st, fe_frame *fr, const fe_value *n, dsc_dtype dt,
                            dsc_loc loc) {
  if (fr->is_const || !st->g) {
    ERR(loc, "tensors cannot be used in a constant expression");
    return verr;
  }
  if (dt == DSC_BOOL) {
    ERR(loc, "cannot combine a number with a bool tensor");
    return verr;
  }
  if (!check_fits(st, n, dt, "the tensor it is combined with", loc)) return verr;
  dsc_type t = dsc_type_make(dt, 0, NULL);
  at(st, loc);
  return tensor(st, dsc_const(st->g, num(n), t), loc);
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
    if (!ta) a = materialize(st, fr, &a, dsc_node_type(b.node).dtype, la);
    if (!tb) b = materialize(st, fr, &b, dsc_node_type(a.node).dtype, lb);
    if (a.kind == V_ERR || b.kind == V_ERR) return verr;
    dsc_op o = op == '+'   ? DSC_OP_ADD
               : op == '-' ? DSC_OP_SUB
               : op == '*' ? DSC_OP_MUL
               : op == '/' ? DSC_OP_DIV
               : op == '<' ? DSC_OP_LESS
               : op == '>' ? DSC_OP_GREATER
                           : DSC_OP_EQUAL;
    at(st, loc);
    return tensor(st, dsc_binary(st->g, o, a.node, b.node), loc);
  }
  ERR(loc, "cannot apply '%s' to %s and %s", op_text(op), kind_name(&a), kind_name(&b));
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
    ERR(loc, "'.%s' needs a block instance, not %s", name, kind_name(&obj));
    return verr;
  }
  fe_sym *blk = obj.sym;
  fe_sym *y = scope_find(blk->inner, name);
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
      return const_value(st, y, loc);
    case SYM_PARAM:
      if (!st->g) {
        ERR(loc, "parameter '%s.%s' cannot be used in a constant expression", blk->name, name);
        return verr;
      }
      return tensor(st, param_node(st, y, obj.inst, loc), loc);
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

typedef struct {
  const char *fname;
  const char *const *params;
  int n_params, n_req;
  const fe_expr *slots[8];
  dsc_loc slot_loc[8];
} fe_binding;

/* Maps positional and keyword arguments of a call onto parameter slots. */
static bool bind_args(fe_state *st, const fe_expr *call, fe_binding *b) {
  bool ok = true, seen_key = false;
  int npos = 0;
  for (int i = 0; i < 8; i++) b->slots[i] = NULL;
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

static fe_value arg_tensor(fe_state *st, fe_frame *fr, fe_binding *b, int k) {
  fe_value v = ev(st, fr, b->slots[k]);
  if (v.kind == V_ERR || v.kind == V_TENSOR) return v;
  ERR(b->slot_loc[k], "argument '%s' of '%s' must be a tensor, not %s", b->params[k], b->fname,
      kind_name(&v));
  return verr;
}

static bool arg_int(fe_state *st, fe_frame *fr, fe_binding *b, int k, int64_t *out) {
  fe_value v = ev(st, fr, b->slots[k]);
  if (v.kind == V_ERR) return false;
  if (v.kind == V_NUM && v.is_int) {
    *out = v.i;
    return true;
  }
  ERR(b->slot_loc[k], "argument '%s' of '%s' must be an integer, not %s", b->params[k], b->fname,
      kind_name(&v));
  return false;
}

static bool arg_num(fe_state *st, fe_frame *fr, fe_binding *b, int k, double *out) {
  fe_value v = ev(st, fr, b->slots[k]);
  if (v.kind == V_ERR) return false;
  if (v.kind == V_NUM) {
    *out = num(&v);
    return true;
  }
  ERR(b->slot_loc[k], "argument '%s' of '%s' must be a number, not %s", b->params[k], b->fname,
      kind_name(&v));
  return false;
}

static bool arg_bool(fe_state *st, fe_frame *fr, fe_binding *b, int k, bool *out) {
  fe_value v = ev(st, fr, b->slots[k]);
  if (v.kind == V_ERR) return false;
  if (v.kind == V_BOOL) {
    *out = v.b;
    return true;
  }
  ERR(b->slot_loc[k], "argument '%s' of '%s' must be true or false, not %s", b->params[k], b->fname,
      kind_name(&v));
  return false;
}

static bool arg_dtype(fe_state *st, fe_frame *fr, fe_binding *b, int k, dsc_dtype *out) {
  fe_value v = ev(st, fr, b->slots[k]);
  if (v.kind == V_ERR) return false;
  if (v.kind == V_DTYPE) {
    *out = v.dt;
    return true;
  }
  ERR(b->slot_loc[k], "argument '%s' of '%s' must be a dtype (f32, bf16, i32, ...), not %s",
      b->params[k], b->fname, kind_name(&v));
  return false;
}

/* A list of at most DSC_MAX_RANK integers; a single integer when allow_int. */
static bool arg_ints(fe_state *st, fe_frame *fr, fe_binding *b, int k, bool allow_int, int64_t *out,
                     int *n) {
  fe_value v = ev(st, fr, b->slots[k]);
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
            b->params[k], b->fname, i, kind_name(&v.items[i]));
        return false;
      }
      out[i] = v.items[i].i;
    }
    *n = v.n;
    return true;
  }
  ERR(b->slot_loc[k], "argument '%s' of '%s' must be %s, not %s", b->params[k], b->fname,
      allow_int ? "an integer or a list of integers" : "a list of integers", kind_name(&v));
  return false;
}

static bool norm_axis(fe_state *st, fe_binding *b, int k, int64_t *axis, int rank) {
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

static bool need_graph(fe_state *st, fe_frame *fr, const char *fname, dsc_loc loc) {
  if (!fr->is_const && st->g) return true;
  ERR(loc, "'%s' creates a tensor and cannot be used in a constant expression", fname);
  return false;
}

/* Checks a shape list given to zeros/ones/full/broadcast/reshape. */
static bool check_shape(fe_state *st, dsc_loc loc, const int64_t *dims, int n) {
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

static double fold_unary(dsc_op op, double x) {
  switch (op) {
    case DSC_OP_EXP:
      return exp(x);
    case DSC_OP_LOG:
      return log(x);
    case DSC_OP_SQRT:
      return sqrt(x);
    case DSC_OP_RSQRT:
      return 1.0 / sqrt(x);
    case DSC_OP_TANH:
      return tanh(x);
    case DSC_OP_RELU:
      return x > 0 ? x : 0;
    case DSC_OP_GELU:
      return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
    case DSC_OP_SILU:
      return x / (1 + exp(-x));
    case DSC_OP_SIGMOID:
      return 1 / (1 + exp(-x));
    default:
      return -x;
  }
}

static fe_value call_builtin(fe_state *st, fe_frame *fr, const fe_builtin *bi,
                             const fe_expr *call) {
  fe_binding b;
  memset(&b, 0, sizeof b);
  b.fname = bi->name;
  b.params = bi->params;
  b.n_params = builtin_n_params(bi);
  b.n_req = bi->n_req;
  if (!bind_args(st, call, &b)) return verr;
  dsc_loc loc = call->loc;
  fe_value x = verr, y = verr, z = verr;
  int64_t ints[DSC_MAX_RANK];
  int n = 0;
  switch (bi->kind) {
    case B_UNARY: {
      x = ev(st, fr, b.slots[0]);
      if (x.kind == V_ERR) return verr;
      if (x.kind == V_NUM) {
        if ((bi->op == DSC_OP_NEG || bi->op == DSC_OP_RELU) && x.is_int) {
          if (bi->op == DSC_OP_RELU) return vint(x.i > 0 ? x.i : 0);
          if (x.i == INT64_MIN) return ERR(loc, "integer overflow in a constant expression"), verr;
          return vint(-x.i);
        }
        double r = fold_unary(bi->op, num(&x));
        if (!isfinite(r)) {
          ERR(loc, "'%s' of this number is not finite", bi->name);
          return verr;
        }
        return vfloat(r);
      }
      if (x.kind != V_TENSOR) {
        ERR(b.slot_loc[0], "argument 'x' of '%s' must be a tensor or a number, not %s", bi->name,
            kind_name(&x));
        return verr;
      }
      at(st, loc);
      return tensor(st, dsc_unary(st->g, bi->op, x.node), loc);
    }
    case B_POW: {
      double p;
      x = ev(st, fr, b.slots[0]);
      if (x.kind == V_ERR || !arg_num(st, fr, &b, 1, &p)) return verr;
      if (x.kind == V_NUM) {
        double r = pow(num(&x), p);
        if (!isfinite(r)) return ERR(loc, "'pow' of this number is not finite"), verr;
        return vfloat(r);
      }
      if (x.kind != V_TENSOR) {
        ERR(b.slot_loc[0], "argument 'x' of 'pow' must be a tensor or a number, not %s",
            kind_name(&x));
        return verr;
      }
      dsc_attr a = dsc_attr_float("exponent", p);
      at(st, loc);
      return tensor(st, dsc_build(st->g, DSC_OP_POW, &x.node, 1, &a, 1), loc);
    }
    case B_MAXIMUM: {
      x = ev(st, fr, b.slots[0]);
      y = ev(st, fr, b.slots[1]);
      if (x.kind == V_ERR || y.kind == V_ERR) return verr;
      if (x.kind == V_NUM && y.kind == V_NUM) {
        if (x.is_int && y.is_int) return vint(x.i > y.i ? x.i : y.i);
        return vfloat(num(&x) > num(&y) ? num(&x) : num(&y));
      }
      for (int k = 0; k < 2; k++) {
        fe_value *v = k ? &y : &x;
        if (v->kind != V_NUM && v->kind != V_TENSOR) {
          ERR(b.slot_loc[k], "argument '%s' of 'maximum' must be a tensor or a number, not %s",
              b.params[k], kind_name(v));
          return verr;
        }
      }
      if (x.kind == V_NUM) x = materialize(st, fr, &x, dsc_node_type(y.node).dtype, b.slot_loc[0]);
      if (y.kind == V_NUM) y = materialize(st, fr, &y, dsc_node_type(x.node).dtype, b.slot_loc[1]);
      if (x.kind == V_ERR || y.kind == V_ERR) return verr;
      at(st, loc);
      return tensor(st, dsc_binary(st->g, DSC_OP_MAXIMUM, x.node, y.node), loc);
    }
    case B_WHERE: {
      fe_value c = arg_tensor(st, fr, &b, 0);
      x = ev(st, fr, b.slots[1]);
      y = ev(st, fr, b.slots[2]);
      if (c.kind == V_ERR || x.kind == V_ERR || y.kind == V_ERR) return verr;
      for (int k = 1; k < 3; k++) {
        fe_value *v = k == 1 ? &x : &y;
        if (v->kind != V_NUM && v->kind != V_TENSOR) {
          ERR(b.slot_loc[k], "argument '%s' of 'where' must be a tensor or a number, not %s",
              b.params[k], kind_name(v));
          return verr;
        }
      }
      if (x.kind == V_NUM && y.kind == V_NUM) {
        ERR(loc, "'where' needs at least one of 'a' and 'b' to be a tensor (for its dtype)");
        return verr;
      }
      if (x.kind == V_NUM) x = materialize(st, fr, &x, dsc_node_type(y.node).dtype, b.slot_loc[1]);
      if (y.kind == V_NUM) y = materialize(st, fr, &y, dsc_node_type(x.node).dtype, b.slot_loc[2]);
      if (x.kind == V_ERR || y.kind == V_ERR) return verr;
      dsc_node *in[3] = {c.node, x.node, y.node};
      at(st, loc);
      return tensor(st, dsc_build(st->g, DSC_OP_WHERE, in, 3, NULL, 0), loc);
    }
    case B_CAST: {
      dsc_dtype dt;
      x = arg_tensor(st, fr, &b, 0);
      if (x.kind == V_ERR || !arg_dtype(st, fr, &b, 1, &dt)) return verr;
      at(st, loc);
      return tensor(st, dsc_cast(st->g, x.node, dt), loc);
    }
    case B_REDUCE: {
      x = arg_tensor(st, fr, &b, 0);
      if (x.kind == V_ERR) return verr;
      int rank = dsc_node_type(x.node).rank;
      bool keep = false;
      if (b.slots[2] && !arg_bool(st, fr, &b, 2, &keep)) return verr;
      if (b.slots[1]) {
        if (!arg_ints(st, fr, &b, 1, true, ints, &n)) return verr;
        for (int i = 0; i < n; i++)
          if (!norm_axis(st, &b, 1, &ints[i], rank)) return verr;
        for (int i = 1; i < n; i++) /* sort (insertion) and reject repeats */
          for (int j = i; j > 0 && ints[j - 1] > ints[j]; j--) {
            int64_t t = ints[j];
            ints[j] = ints[j - 1];
            ints[j - 1] = t;
          }
        for (int i = 1; i < n; i++)
          if (ints[i] == ints[i - 1]) {
            ERR(b.slot_loc[1], "axis %lld is listed twice", (long long)ints[i]);
            return verr;
          }
      } else {
        for (n = 0; n < rank; n++) ints[n] = n;
      }
      at(st, loc);
      return tensor(st, dsc_reduce(st->g, bi->op, x.node, ints, n, keep), loc);
    }
    case B_MATMUL:
    case B_EMBEDDING:
    case B_XENT: {
      x = arg_tensor(st, fr, &b, 0);
      y = arg_tensor(st, fr, &b, 1);
      if (x.kind == V_ERR || y.kind == V_ERR) return verr;
      at(st, loc);
      return tensor(st, dsc_binary(st->g, bi->op, x.node, y.node), loc);
    }
    case B_TRANSPOSE: {
      x = arg_tensor(st, fr, &b, 0);
      if (x.kind == V_ERR) return verr;
      int rank = dsc_node_type(x.node).rank;
      int64_t i = rank - 2, j = rank - 1;
      if (!b.slots[1] != !b.slots[2]) {
        ERR(loc, "'transpose' takes both axes i and j, or neither");
        return verr;
      }
      if (b.slots[1]) {
        if (!arg_int(st, fr, &b, 1, &i) || !arg_int(st, fr, &b, 2, &j)) return verr;
        if (!norm_axis(st, &b, 1, &i, rank) || !norm_axis(st, &b, 2, &j, rank)) return verr;
      } else if (rank < 2) {
        char t[64];
        ERR(b.slot_loc[0], "'transpose' needs a tensor of rank 2 or more, got %s",
            fmt_type(dsc_node_type(x.node), t, sizeof t));
        return verr;
      }
      for (int k = 0; k < rank; k++) ints[k] = k;
      ints[i] = j;
      ints[j] = i;
      at(st, loc);
      return tensor(st, dsc_permute(st->g, x.node, ints, rank), loc);
    }
    case B_PERMUTE: {
      x = arg_tensor(st, fr, &b, 0);
      if (x.kind == V_ERR || !arg_ints(st, fr, &b, 1, false, ints, &n)) return verr;
      int rank = dsc_node_type(x.node).rank;
      for (int k = 0; k < n; k++) /* each axis as written, like transpose */
        if (!norm_axis(st, &b, 1, &ints[k], rank)) return verr;
      at(st, loc);
      return tensor(st, dsc_permute(st->g, x.node, ints, n), loc);
    }
    case B_RESHAPE: {
      x = arg_tensor(st, fr, &b, 0);
      if (x.kind == V_ERR || !arg_ints(st, fr, &b, 1, false, ints, &n)) return verr;
      dsc_type t = dsc_node_type(x.node);
      int64_t total = dsc_type_numel(&t), known = 1;
      int infer = -1;
      for (int k = 0; k < n; k++) {
        if (ints[k] == -1) {
          if (infer >= 0) {
            ERR(b.slot_loc[1], "'reshape' can infer only one dimension (-1)");
            return verr;
          }
          infer = k;
        } else if (ints[k] <= 0) {
          ERR(b.slot_loc[1], "dimension %d of the new shape must be positive or -1, got %lld", k,
              (long long)ints[k]);
          return verr;
        } else if (__builtin_mul_overflow(known, ints[k], &known) || known > FE_MAX_NUMEL) {
          ERR(b.slot_loc[1], "the new shape has too many elements");
          return verr;
        }
      }
      char tb[96];
      if (infer >= 0) {
        if (total % known != 0) {
          ERR(loc, "cannot reshape %s (%lld elements) into a shape with a multiple of %lld",
              fmt_type(t, tb, sizeof tb), (long long)total, (long long)known);
          return verr;
        }
        ints[infer] = total / known;
      }
      at(st, loc);
      return tensor(st, dsc_reshape(st->g, x.node, ints, n), loc);
    }
    case B_SLICE: {
      int64_t axis, start, end;
      x = arg_tensor(st, fr, &b, 0);
      if (x.kind == V_ERR || !arg_int(st, fr, &b, 1, &axis) || !arg_int(st, fr, &b, 2, &start) ||
          !arg_int(st, fr, &b, 3, &end))
        return verr;
      dsc_type t = dsc_node_type(x.node);
      if (!norm_axis(st, &b, 1, &axis, t.rank)) return verr;
      int64_t d = t.dims[axis], s0 = start, e0 = end;
      if (start < 0) start += d;
      if (end < 0) end += d;
      if (start < 0 || start >= d || end <= start || end > d) {
        ERR(loc, "slice [%lld, %lld) is empty or out of range for axis %lld of size %lld",
            (long long)s0, (long long)e0, (long long)axis, (long long)d);
        return verr;
      }
      dsc_attr a[3] = {dsc_attr_int("axis", axis), dsc_attr_int("start", start),
                       dsc_attr_int("end", end)};
      at(st, loc);
      return tensor(st, dsc_build(st->g, DSC_OP_SLICE, &x.node, 1, a, 3), loc);
    }
    case B_CONCAT: {
      fe_value l = ev(st, fr, b.slots[0]);
      if (l.kind == V_ERR) return verr;
      if (l.kind != V_LIST || l.n == 0) {
        ERR(b.slot_loc[0], "argument 'xs' of 'concat' must be a non-empty list of tensors");
        return verr;
      }
      dsc_node **in = st_alloc(st, sizeof(dsc_node *) * (size_t)l.n);
      if (!in) return verr;
      for (int k = 0; k < l.n; k++) {
        if (l.items[k].kind == V_ERR) return verr;
        if (l.items[k].kind != V_TENSOR) {
          ERR(b.slot_loc[0], "entry %d of the list given to 'concat' is %s, not a tensor", k,
              kind_name(&l.items[k]));
          return verr;
        }
        in[k] = l.items[k].node;
      }
      int64_t axis = -1;
      if (b.slots[1] && !arg_int(st, fr, &b, 1, &axis)) return verr;
      if (!norm_axis(st, &b, b.slots[1] ? 1 : 0, &axis, dsc_node_type(in[0]).rank)) return verr;
      dsc_attr a = dsc_attr_int("axis", axis);
      at(st, loc);
      return tensor(st, dsc_build(st->g, DSC_OP_CONCAT, in, l.n, &a, 1), loc);
    }
    case B_BROADCAST: {
      x = arg_tensor(st, fr, &b, 0);
      if (x.kind == V_ERR || !arg_ints(st, fr, &b, 1, false, ints, &n)) return verr;
      if (!check_shape(st, b.slot_loc[1], ints, n)) return verr;
      dsc_attr a = dsc_attr_ints("shape", ints, n);
      at(st, loc);
      return tensor(st, dsc_build(st->g, DSC_OP_BROADCAST, &x.node, 1, &a, 1), loc);
    }
    case B_IOTA: {
      int64_t len;
      dsc_dtype dt = DSC_I32;
      if (!arg_int(st, fr, &b, 0, &len)) return verr;
      if (b.slots[1] && !arg_dtype(st, fr, &b, 1, &dt)) return verr;
      if (len <= 0 || len > FE_MAX_NUMEL) {
        ERR(b.slot_loc[0], "'iota' needs a positive length up to 2^40, got %lld", (long long)len);
        return verr;
      }
      if (!need_graph(st, fr, bi->name, loc)) return verr;
      dsc_attr a[3] = {dsc_attr_int("axis", 0), dsc_attr_dtype("dtype", dt),
                       dsc_attr_ints("shape", &len, 1)};
      at(st, loc);
      return tensor(st, dsc_build(st->g, DSC_OP_IOTA, NULL, 0, a, 3), loc);
    }
    case B_FILL:
    case B_FULL: {
      dsc_dtype dt = DSC_F32;
      fe_value value = vint((int64_t)bi->fill);
      int kdt = bi->kind == B_FULL ? 2 : 1;
      if (!arg_ints(st, fr, &b, 0, true, ints, &n)) return verr;
      if (bi->kind == B_FULL) {
        value = ev(st, fr, b.slots[1]);
        if (value.kind == V_ERR) return verr;
        if (value.kind != V_NUM) {
          ERR(b.slot_loc[1], "argument 'value' of 'full' must be a number, not %s",
              kind_name(&value));
          return verr;
        }
      }
      if (b.slots[kdt] && !arg_dtype(st, fr, &b, kdt, &dt)) return verr;
      if (bi->kind == B_FULL &&
          !check_fits(st, &value, dt, "the tensor 'full' creates", b.slot_loc[1]))
        return verr;
      if (!check_shape(st, b.slot_loc[0], ints, n) || !need_graph(st, fr, bi->name, loc))
        return verr;
      at(st, loc);
      return tensor(st, dsc_const(st->g, num(&value), dsc_type_make(dt, n, ints)), loc);
    }
    case B_SOFTMAX: {
      int64_t axis = -1;
      x = arg_tensor(st, fr, &b, 0);
      if (x.kind == V_ERR) return verr;
      if (b.slots[1] && !arg_int(st, fr, &b, 1, &axis)) return verr;
      if (!norm_axis(st, &b, b.slots[1] ? 1 : 0, &axis, dsc_node_type(x.node).rank)) return verr;
      dsc_attr a = dsc_attr_int("axis", axis);
      at(st, loc);
      return tensor(st, dsc_build(st->g, bi->op, &x.node, 1, &a, 1), loc);
    }
    case B_LAYERNORM:
    case B_RMSNORM: {
      int nt = bi->kind == B_LAYERNORM ? 3 : 2;
      double eps = bi->kind == B_LAYERNORM ? 1e-5 : 1e-6;
      dsc_node *in[3];
      for (int k = 0; k < nt; k++) {
        fe_value v = arg_tensor(st, fr, &b, k);
        if (v.kind == V_ERR) return verr;
        in[k] = v.node;
      }
      if (b.slots[nt] && !arg_num(st, fr, &b, nt, &eps)) return verr;
      if (!(eps > 0)) {
        ERR(b.slot_loc[nt], "'eps' must be positive");
        return verr;
      }
      dsc_attr a = dsc_attr_float("eps", eps);
      at(st, loc);
      return tensor(st, dsc_build(st->g, bi->op, in, nt, &a, 1), loc);
    }
    case B_ATTENTION: {
      x = arg_tensor(st, fr, &b, 0);
      y = arg_tensor(st, fr, &b, 1);
      z = arg_tensor(st, fr, &b, 2);
      int64_t heads;
      bool causal = true;
      if (x.kind == V_ERR || y.kind == V_ERR || z.kind == V_ERR || !arg_int(st, fr, &b, 3, &heads))
        return verr;
      if (b.slots[4] && !arg_bool(st, fr, &b, 4, &causal)) return verr;
      if (heads <= 0) {
        ERR(b.slot_loc[3], "'heads' must be positive, got %lld", (long long)heads);
        return verr;
      }
      dsc_node *in[3] = {x.node, y.node, z.node};
      dsc_attr a[2] = {dsc_attr_int("heads", heads), dsc_attr_bool("causal", causal)};
      at(st, loc);
      return tensor(st, dsc_build(st->g, DSC_OP_ATTENTION, in, 3, a, 2), loc);
    }
  }
  return verr;
}

/* ------------------------------------------------------------ user calls */

static bool eval_type(fe_state *st, fe_frame *fr, const fe_type_expr *te, dsc_type *out,
                      const char *what);

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
  if (!bind_args(st, call, &b)) return verr;

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
    fe_value v = ev(st, caller, b.slots[i]);
    if (v.kind == V_ERR) ok = false;
    if (v.kind != V_ERR && fa->type) {
      dsc_type want;
      char w[96], g[96];
      if (!eval_type(st, &tf, fa->type, &want, fa->name)) {
        ok = false;
      } else if (v.kind != V_TENSOR) {
        ERR(b.slot_loc[i], "argument '%s' of '%s': expected %s, got %s", fa->name, y->name,
            fmt_type(want, w, sizeof w), kind_name(&v));
        ok = false;
      } else {
        dsc_type got = dsc_node_type(v.node);
        if (!dsc_type_equal(&want, &got)) {
          ERR(b.slot_loc[i], "argument '%s' of '%s': expected %s, got %s", fa->name, y->name,
              fmt_type(want, w, sizeof w), fmt_type(got, g, sizeof g));
          ok = false;
        }
      }
    }
    if (!set_local(st, &fr, fa->name, v)) return verr;
  }
  if (!ok) return verr;
  st->calls[st->n_calls++] = y;
  exec_body(st, &fr, &d->body);
  st->n_calls--;
  if (st->abort) return verr;
  if (!fr.returned) {
    ERR(d->name_loc, "function '%s' ends without 'return'", y->name);
    return verr;
  }
  if (fr.ret.kind != V_ERR && d->type) {
    dsc_type want;
    char w[96], g[96];
    if (!eval_type(st, &tf, d->type, &want, "the return value")) return verr;
    if (fr.ret.kind != V_TENSOR) {
      ERR(fr.ret_loc, "'%s' returns %s, but its declared type is %s", y->name, kind_name(&fr.ret),
          fmt_type(want, w, sizeof w));
      return verr;
    }
    dsc_type got = dsc_node_type(fr.ret.node);
    if (!dsc_type_equal(&want, &got)) {
      ERR(fr.ret_loc, "'%s' returns %s, but its declared type is %s", y->name,
          fmt_type(got, g, sizeof g), fmt_type(want, w, sizeof w));
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
    const fe_builtin *bi = find_builtin(c->name);
    if (bi) return call_builtin(st, fr, bi, e);
    if (found) {
      if (v.kind == V_ERR) return verr;
      ERR(c->loc, "'%s' is %s, not a function", c->name, kind_name(&v));
      return verr;
    }
    const char *s = suggest_name(st, fr, c->name, true);
    if (s)
      ERR(c->loc, "unknown function '%s'; did you mean '%s'?", c->name, s);
    else
      ERR(c->loc, "unknown function '%s'", c->name);
    return verr;
  }
  fe_value f = ev(st, fr, c);
  if (f.kind == V_ERR) return verr;
  if (f.kind != V_FN) {
    ERR(c->loc, "%s cannot be called", kind_name(&f));
    return verr;
  }
  return call_user(st, fr, f, e);
}

static fe_value ev_inner(fe_state *st, fe_frame *fr, const fe_expr *e);

static fe_value ev(fe_state *st, fe_frame *fr, const fe_expr *e) {
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
      fe_value a = ev(st, fr, e->a);
      if (a.kind == V_ERR) return verr;
      if (a.kind == V_NUM) {
        if (!a.is_int) return vfloat(-a.f);
        if (a.i == INT64_MIN) return ERR(e->loc, "integer overflow in a constant expression"), verr;
        return vint(-a.i);
      }
      if (a.kind == V_TENSOR) {
        at(st, e->loc);
        return tensor(st, dsc_unary(st->g, DSC_OP_NEG, a.node), e->loc);
      }
      ERR(e->loc, "cannot negate %s", kind_name(&a));
      return verr;
    }
    case FE_E_BINARY: {
      fe_value a = ev(st, fr, e->a);
      fe_value b = ev(st, fr, e->b2);
      return binary(st, fr, e->op, a, b, e->loc, e->a->loc, e->b2->loc);
    }
    case FE_E_CALL:
      return ev_call(st, fr, e);
    case FE_E_MEMBER:
      return member(st, ev(st, fr, e->a), e->name, e->loc);
    case FE_E_INDEX: {
      fe_value obj = ev(st, fr, e->a);
      fe_value idx = ev(st, fr, e->b2);
      if (obj.kind == V_ERR || idx.kind == V_ERR) return verr;
      if (obj.kind != V_BLOCK) {
        ERR(e->loc, "only blocks can be indexed, not %s", kind_name(&obj));
        return verr;
      }
      if (idx.kind != V_NUM || !idx.is_int) {
        ERR(e->b2->loc, "a block index must be an integer, not %s", kind_name(&idx));
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
        v.items[i] = ev(st, fr, e->items.items[i]);
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

static bool exec_body(fe_state *st, fe_frame *fr, const fe_list *body) {
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
        if (!set_local(st, fr, s->name, ev(st, fr, s->value))) return false;
        break;
      case FE_S_RETURN:
        fr->ret = ev(st, fr, s->value);
        fr->ret_loc = s->value->loc;
        fr->returned = true;
        break;
      case FE_S_FOR: {
        fe_value bv = lookup(st, fr, s->block, s->block_loc, false, NULL);
        if (bv.kind == V_ERR) break;
        if (bv.kind != V_BLOCK) {
          ERR(s->block_loc, "'for' loops over a block, but '%s' is %s", s->block, kind_name(&bv));
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
          if (!exec_body(st, fr, &s->body) && (st->abort || st->oom)) return false;
        }
        if (var) var->name = NULL; /* the loop variable ends with its loop */
        break;
      }
    }
  }
  return true;
}

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
    fe_value v = ev(st, fr, de);
    if (v.kind == V_ERR) {
      ok = false;
      continue;
    }
    if (v.kind != V_NUM || !v.is_int) {
      ERR(de->loc, "dimension %d of %s must be an integer, not %s", i, what, kind_name(&v));
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

static bool eval_type(fe_state *st, fe_frame *fr, const fe_type_expr *te, dsc_type *out,
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
  if (!bind_args(st, e, &b)) return false;
  if (k < 4 && dt >= 0 && !dsc_dtype_is_float((dsc_dtype)dt)) {
    /* random values are floats: the runtime cannot draw them for an integer or bool tensor */
    ERR(e->loc, "'%s' initializes only float parameters, but '%s' is %s", name, pname,
        dsc_dtype_name((dsc_dtype)dt));
    return false;
  }
  double a = 0, c = 0;
  fe_value av = ev(st, fr, b.slots[0]);
  if (av.kind == V_ERR) return false;
  if (av.kind != V_NUM) {
    ERR(b.slot_loc[0], "argument '%s' of '%s' must be a number, not %s", b.params[0], name,
        kind_name(&av));
    return false;
  }
  a = num(&av);
  if (b.n_params > 1 && b.slots[1] && !arg_num(st, fr, &b, 1, &c)) return false;
  if (k == 4 && dt >= 0) {
    char what[160];
    snprintf(what, sizeof what, "parameter '%s'", pname);
    if (!check_fits(st, &av, (dsc_dtype)dt, what, b.slot_loc[0])) return false;
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
  bool ok = eval_type(st, &fr, y->decl->type, &y->ptype, what);
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
        ERR(d->loc, "'%s' is not allowed %s", decl_word(d->kind), where);
      continue;
    }
    switch (d->kind) {
      case FE_D_CONST:
        scope_add(st, s, SYM_CONST, d);
        break;
      case FE_D_PARAM: {
        fe_sym *y = scope_add(st, s, SYM_PARAM, d);
        if (y && s->block) s->n_block_params++;
        break;
      }
      case FE_D_FN:
        scope_add(st, s, SYM_FN, d);
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
        fe_sym *y = scope_add(st, s, SYM_BLOCK, d);
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
    if (y->kind == SYM_CONST) const_value(st, y, y->decl->name_loc);
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
    fe_value v = ev(st, &fr, y->decl->value);
    if (v.kind == V_ERR) continue;
    if (v.kind != V_NUM || !v.is_int) {
      ERR(y->decl->value->loc, "the instance count of block '%s' must be an integer, not %s",
          y->name, kind_name(&v));
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
    fe_sym *y = scope_find(&st->model_scope, d->name);
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
      fe_sym *y = scope_find(&st->global, e->name);
      if (y && y->kind == SYM_CONST) return const_value(st, y, e->loc);
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
      return ev(st, &fr, e);
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

/* A value of setting k: optimizers and schedules by their names and
 * keywords (with suggestions), every other kind by the settings table's
 * one parse of the printed value (`text`), which the pipeline's reader of
 * the module metadata applies again. */
static bool check_train_value(fe_state *st, const fe_setting *s, const dsc_setting *k,
                              const fe_value *v, const char *text) {
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
  dsc_loc loc = s->value->loc;
  if (k->kind == DSC_SETTING_OPTIMIZER)
    return check_named_call(st, v, loc, "optimizer", opts, 4, opt_keys);
  if (k->kind == DSC_SETTING_SCHEDULE)
    return check_named_call(st, v, loc, "schedule", scheds, 5, sched_keys);
  if (dsc_setting_parse(k, text, false, NULL)) return true;
  ERR(loc, "'%s' must be %s", s->key, dsc_setting_want(k, false));
  return false;
}

static void lower_settings(fe_state *st, const fe_list *settings, const char *section) {
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
      lower_settings(st, &s->settings, s->key);
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

/* --------------------------------------------------------------- imports */

/* Only regular files: a directory, FIFO or device could block or never end. */
static FILE *open_regular(dsc_context *ctx, const char *path, dsc_loc loc, const char *verb) {
  struct stat sb;
  if (stat(path, &sb) != 0) {
    ir_error(ctx, loc, "cannot %s '%s': %s", verb, path, strerror(errno));
    return NULL;
  }
  if (!S_ISREG(sb.st_mode)) {
    ir_error(ctx, loc, "cannot %s '%s': not a regular file", verb, path);
    return NULL;
  }
  FILE *f = fopen(path, "rb");
  if (!f) ir_error(ctx, loc, "cannot %s '%s': %s", verb, path, strerror(errno));
  return f;
}

static bool read_file(fe_state *st, const char *path, dsc_loc loc, char **text, size_t *len) {
  FILE *f = open_regular(st->ctx, path, loc, "import");
  if (!f) return false;
  size_t cap = 4096, n = 0;
  char *buf = ir_arena_alloc(&st->arena, cap + 1);
  while (buf) {
    size_t r = fread(buf + n, 1, cap - n, f);
    n += r;
    if (n < cap) break;
    if (cap >= FE_MAX_FILE_BYTES) {
      fclose(f);
      ERR(loc, "'%s' is too large (more than %d bytes)", path, FE_MAX_FILE_BYTES);
      return false;
    }
    char *nb = ir_arena_alloc(&st->arena, cap * 2 + 1);
    if (nb) memcpy(nb, buf, n);
    buf = nb;
    cap *= 2;
  }
  bool err = ferror(f) != 0;
  fclose(f);
  if (!buf) {
    st->oom = true;
    return false;
  }
  if (err) {
    ERR(loc, "cannot read '%s'", path);
    return false;
  }
  buf[n] = 0;
  *text = buf;
  *len = n;
  return true;
}

static void load_imports(fe_state *st, fe_file *file);

static fe_file *add_file(fe_state *st, const char *path, const char *text, size_t len) {
  fe_file *f = st_alloc(st, sizeof *f);
  if (!f) return NULL;
  f->path = ir_arena_strdup(&st->arena, path);
  char real[4096];
  const char *key = realpath(path, real) ? real : path;
  f->key = ir_arena_strdup(&st->arena, key);
  f->text = text;
  f->len = len;
  if (!f->path || !f->key || !st_push(st, &st->files, f)) {
    st->oom = true;
    return NULL;
  }
  /* Locations in the module outlive this arena: use the context's name. */
  if (!(f->path = ir_diag_add_source(st->ctx, f->path, text, len))) {
    st->oom = true;
    return NULL;
  }
  if (!fe_parse(st->ctx, &st->arena, f)) {
    st->oom = true;
    return NULL;
  }
  return f;
}

static void import_one(fe_state *st, fe_file *from, fe_decl *d) {
  char path[4096];
  const char *slash = strrchr(from->path, '/');
  if (d->name[0] == '/' || !slash)
    snprintf(path, sizeof path, "%s", d->name);
  else
    snprintf(path, sizeof path, "%.*s/%s", (int)(slash - from->path), from->path, d->name);
  char real[4096];
  const char *key = realpath(path, real) ? real : path;
  for (int i = 0; i < st->import_depth; i++)
    if (strcmp(st->import_stack[i]->key, key) == 0) {
      char chain[1024] = "";
      for (int j = i; j < st->import_depth; j++) {
        size_t l = strlen(chain);
        snprintf(chain + l, sizeof chain - l, "%.200s -> ", st->import_stack[j]->path);
      }
      size_t l = strlen(chain);
      snprintf(chain + l, sizeof chain - l, "%.200s", path);
      ERR(d->name_loc, "import cycle: %s", chain);
      return;
    }
  for (int i = 0; i < st->files.n; i++)
    if (strcmp(((fe_file *)st->files.items[i])->key, key) == 0) return; /* already loaded */
  if (st->import_depth >= 32) {
    ERR(d->name_loc, "imports nested too deeply (more than 32 files)");
    return;
  }
  char *text;
  size_t len;
  if (!read_file(st, path, d->name_loc, &text, &len)) return;
  fe_file *f = add_file(st, path, text, len);
  if (f) load_imports(st, f);
}

static void load_imports(fe_state *st, fe_file *file) {
  if (st->import_depth >= 32) return;
  st->import_stack[st->import_depth++] = file;
  for (int i = 0; i < file->decls.n && !st->oom; i++) {
    fe_decl *d = file->decls.items[i];
    if (d->kind == FE_D_IMPORT) import_one(st, file, d);
  }
  st->import_depth--;
}

/* ---------------------------------------------------------------- driver */

static void lower_forward(fe_state *st) {
  fe_sym *fwd = scope_find(&st->model_scope, "forward");
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
    if (!eval_type(st, &tf, a->type, &t, what)) {
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
    if (!set_local(st, &fr, a->name, v)) return;
  }
  if (!ok) return;
  st->calls[st->n_calls++] = fwd;
  exec_body(st, &fr, &d->body);
  st->n_calls--;
  if (st->abort || st->oom) return;
  if (!fr.returned) {
    ERR(d->name_loc, "function 'forward' ends without 'return'");
    return;
  }
  if (fr.ret.kind == V_ERR) return;
  if (fr.ret.kind != V_TENSOR) {
    ERR(fr.ret_loc, "the model's 'forward' must return a tensor, not %s", kind_name(&fr.ret));
    return;
  }
  if (d->type) {
    dsc_type want, got = dsc_node_type(fr.ret.node);
    char w[96], g[96];
    if (!eval_type(st, &tf, d->type, &want, "the return value")) return;
    if (!dsc_type_equal(&want, &got)) {
      ERR(fr.ret_loc, "'forward' returns %s, but its declared type is %s",
          fmt_type(got, g, sizeof g), fmt_type(want, w, sizeof w));
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
  fe_file *main = add_file(st, path, text, len);
  if (!main) return DSC_ERR_INTERNAL;
  if (FAILED()) return st->oom ? DSC_ERR_INTERNAL : DSC_ERR_USER;
  load_imports(st, main);
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
  if (st->train) lower_settings(st, &st->train->body, "");

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
  FILE *f = open_regular(ctx, path, loc, "open");
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
