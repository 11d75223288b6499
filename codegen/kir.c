/* Kernel IR: constructors, validation, printing, hashing (codegen/codegen.h). */
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/codegen.h"

/* ---------------- constructors ---------------- */

static kir_expr *expr_new(ir_arena *a, kir_expr_kind kind, dsc_dtype type) {
  kir_expr *e = ir_arena_alloc(a, sizeof *e);
  if (!e) return NULL;
  e->kind = kind;
  e->type = type;
  return e;
}

kir_expr *kir_const(ir_arena *a, dsc_dtype type, double value) {
  kir_expr *e = expr_new(a, KIR_CONST, type);
  if (e) e->value = value;
  return e;
}

kir_expr *kir_load(ir_arena *a, dsc_dtype type, kir_access access) {
  if (access.gather_stride && !access.gather) return NULL;
  kir_expr *e = expr_new(a, KIR_LOAD, type);
  if (e) e->access = access;
  return e;
}

kir_expr *kir_index(ir_arena *a, int var) {
  kir_expr *e = expr_new(a, KIR_INDEX, DSC_I64);
  if (e) e->var = var;
  return e;
}

kir_expr *kir_scalar(ir_arena *a, dsc_dtype type, int slot) {
  kir_expr *e = expr_new(a, KIR_SCALAR, type);
  if (e) e->slot = slot;
  return e;
}

kir_expr *kir_un(ir_arena *a, kir_unary op, kir_expr *x) {
  if (!x) return NULL;
  kir_expr *e = expr_new(a, KIR_UNARY, x->type);
  if (!e) return NULL;
  e->op = op;
  e->a = x;
  return e;
}

static bool binary_is_compare(int op) { return op == KIR_LT || op == KIR_GT || op == KIR_EQ; }

kir_expr *kir_bin(ir_arena *a, kir_binary op, kir_expr *x, kir_expr *y) {
  if (!x || !y) return NULL;
  kir_expr *e = expr_new(a, KIR_BINARY, binary_is_compare(op) ? DSC_BOOL : x->type);
  if (!e) return NULL;
  e->op = op;
  e->a = x;
  e->b = y;
  return e;
}

kir_expr *kir_select(ir_arena *a, kir_expr *cond, kir_expr *x, kir_expr *y) {
  if (!cond || !x || !y) return NULL;
  kir_expr *e = expr_new(a, KIR_SELECT, x->type);
  if (!e) return NULL;
  e->a = cond;
  e->b = x;
  e->c = y;
  return e;
}

kir_expr *kir_cast(ir_arena *a, dsc_dtype type, kir_expr *x) {
  if (!x) return NULL;
  kir_expr *e = expr_new(a, KIR_CAST, type);
  if (e) e->a = x;
  return e;
}

/* ---------------- DAG traversal ----------------
 * Expressions are DAGs: every walk below visits a node once, numbering nodes
 * in post-order through a small pointer map (malloc'd scratch, freed). */

typedef struct {
  const kir_expr **keys;
  int *vals;
  size_t cap, n;
} ptr_map;

static bool map_init(ptr_map *m) {
  m->cap = 64;
  m->n = 0;
  m->keys = calloc(m->cap, sizeof *m->keys);
  m->vals = calloc(m->cap, sizeof *m->vals);
  return m->keys && m->vals;
}

static void map_free(ptr_map *m) {
  free(m->keys);
  free(m->vals);
}

static size_t ptr_slot(const ptr_map *m, const kir_expr *p) {
  size_t h = ((uintptr_t)p >> 4) * 0x9E3779B97F4A7C15ull;
  size_t i = h & (m->cap - 1);
  while (m->keys[i] && m->keys[i] != p) i = (i + 1) & (m->cap - 1);
  return i;
}

static int map_get(const ptr_map *m, const kir_expr *p) {
  size_t i = ptr_slot(m, p);
  return m->keys[i] ? m->vals[i] : -1;
}

static bool map_put(ptr_map *m, const kir_expr *p, int v) {
  if ((m->n + 1) * 2 > m->cap) {
    ptr_map bigger = {calloc(m->cap * 2, sizeof *m->keys), calloc(m->cap * 2, sizeof *m->vals),
                      m->cap * 2, 0};
    if (!bigger.keys || !bigger.vals) {
      map_free(&bigger);
      return false;
    }
    for (size_t i = 0; i < m->cap; i++)
      if (m->keys[i]) {
        size_t j = ptr_slot(&bigger, m->keys[i]);
        bigger.keys[j] = m->keys[i];
        bigger.vals[j] = m->vals[i];
        bigger.n++;
      }
    map_free(m);
    *m = bigger;
  }
  size_t i = ptr_slot(m, p);
  if (!m->keys[i]) m->n++;
  m->keys[i] = p;
  m->vals[i] = v;
  return true;
}

/* Post-order list of the distinct nodes reachable from e (children first). */
typedef struct {
  const kir_expr **items;
  int n, cap;
  ptr_map seen;
  bool failed;
} expr_list;

static void list_push(expr_list *l, const kir_expr *e) {
  if (l->n == l->cap) {
    int cap = l->cap ? l->cap * 2 : 32;
    const kir_expr **items = realloc(l->items, (size_t)cap * sizeof *items);
    if (!items) {
      l->failed = true;
      return;
    }
    l->items = items;
    l->cap = cap;
  }
  if (!map_put(&l->seen, e, l->n)) {
    l->failed = true;
    return;
  }
  l->items[l->n++] = e;
}

/* Iterative post-order walk (DAGs from fused backward passes get deep). */
static void list_collect(expr_list *l, const kir_expr *root) {
  if (!root || map_get(&l->seen, root) >= 0) return;
  int cap = 64, sp = 0;
  struct frame {
    const kir_expr *e;
    int child;
  } *stack = malloc((size_t)cap * sizeof *stack);
  if (!stack) {
    l->failed = true;
    return;
  }
  stack[sp++] = (struct frame){root, 0};
  while (sp > 0 && !l->failed) {
    struct frame *f = &stack[sp - 1];
    const kir_expr *kids[4] = {f->e->a, f->e->b, f->e->c,
                               f->e->kind == KIR_LOAD ? f->e->access.gather : NULL};
    const kir_expr *next = NULL;
    while (f->child < 4 && !next) {
      const kir_expr *k = kids[f->child++];
      if (k && map_get(&l->seen, k) < 0) next = k;
    }
    if (next) {
      if (sp == cap) {
        cap *= 2;
        void *grown = realloc(stack, (size_t)cap * sizeof *stack);
        if (!grown) {
          l->failed = true;
          break;
        }
        stack = grown;
      }
      stack[sp++] = (struct frame){next, 0};
      continue;
    }
    if (map_get(&l->seen, f->e) < 0) list_push(l, f->e);
    sp--;
  }
  free(stack);
}

static bool list_init(expr_list *l) {
  memset(l, 0, sizeof *l);
  return map_init(&l->seen);
}

static void list_free(expr_list *l) {
  free(l->items);
  map_free(&l->seen);
}

/* ---------------- validation ---------------- */

static bool is_float(dsc_dtype t) { return t == DSC_F32 || t == DSC_F64; }
static bool is_compute_type(dsc_dtype t) {
  return t == DSC_F32 || t == DSC_F64 || t == DSC_I32 || t == DSC_I64 || t == DSC_BOOL;
}

/* Checks that every address of `acc` over the domain stays in its argument;
 * `outer_only`: the access may not move with inner dims. */
static bool check_access(const kir_kernel *k, const kir_access *acc, bool outer_only, char *err,
                         size_t errlen) {
  if (acc->arg < 0 || acc->arg >= k->n_args)
    return ir_fail(err, errlen, "access of argument %d of %d", acc->arg, k->n_args);
  int64_t lo = acc->offset, hi = acc->offset;
  for (int d = 0; d < k->rank; d++) {
    int64_t span = acc->stride[d] * (k->dims[d] - 1);
    if (span < 0) lo += span;
    else hi += span;
    if (outer_only && d >= k->n_outer && acc->stride[d] != 0)
      return ir_fail(err, errlen, "argument %d: an outer-only value moves with inner dim %d",
                     acc->arg, d);
  }
  for (int d = k->rank; d < KIR_MAX_RANK; d++)
    if (acc->stride[d] != 0)
      return ir_fail(err, errlen, "argument %d: stride for dim %d beyond rank %d", acc->arg, d,
                     k->rank);
  if (acc->gather) {
    if (acc->gather_bound <= 0 || acc->gather_stride < 0)
      return ir_fail(err, errlen, "argument %d: gather bound %" PRId64 " stride %" PRId64,
                     acc->arg, acc->gather_bound, acc->gather_stride);
    if (acc->gather->type != DSC_I32 && acc->gather->type != DSC_I64)
      return ir_fail(err, errlen, "argument %d: gather index is %s, not an integer", acc->arg,
                     dsc_dtype_name(acc->gather->type));
    hi += acc->gather_stride * (acc->gather_bound - 1);
  }
  if (lo < 0 || hi >= k->args[acc->arg].numel)
    return ir_fail(err, errlen,
                   "argument %d: addresses [%" PRId64 ", %" PRId64 "] outside its %" PRId64
                   " elements",
                   acc->arg, lo, hi, k->args[acc->arg].numel);
  return true;
}

static bool check_expr(const kir_kernel *k, const kir_expr *root, const bool *defined,
                       bool outer_only, char *err, size_t errlen) {
  expr_list l;
  if (!list_init(&l)) return ir_fail(err, errlen, "out of memory");
  list_collect(&l, root);
  bool ok = !l.failed;
  if (!ok) ir_fail(err, errlen, "out of memory");
  for (int i = 0; ok && i < l.n; i++) {
    const kir_expr *e = l.items[i];
    if (!is_compute_type(e->type)) {
      ok = ir_fail(err, errlen, "expression of storage type %s (loads widen to f32)",
                   dsc_dtype_name(e->type));
      break;
    }
    switch (e->kind) {
      case KIR_CONST:
        break;
      case KIR_LOAD:
        ok = check_access(k, &e->access, outer_only, err, errlen);
        if (ok && !k->args[e->access.arg].read)
          ok = ir_fail(err, errlen, "load of argument %d, which is not marked read",
                       e->access.arg);
        break;
      case KIR_INDEX:
        if (e->var < 0 || e->var >= k->rank || (outer_only && e->var >= k->n_outer))
          ok = ir_fail(err, errlen, "index of dim %d not available here", e->var);
        else if (e->type != DSC_I64) ok = ir_fail(err, errlen, "an index is i64");
        break;
      case KIR_SCALAR:
        if (e->slot < 0 || e->slot >= k->n_slots || !defined[e->slot])
          ok = ir_fail(err, errlen, "slot %d used before it is computed", e->slot);
        else if (k->slot_types[e->slot] != e->type)
          ok = ir_fail(err, errlen, "slot %d is %s, read as %s", e->slot,
                       dsc_dtype_name(k->slot_types[e->slot]), dsc_dtype_name(e->type));
        break;
      case KIR_UNARY:
        if (!e->a || e->a->type != e->type) ok = ir_fail(err, errlen, "unary operand type");
        else if (e->op != KIR_NEG && e->op != KIR_ABS && !is_float(e->type))
          ok = ir_fail(err, errlen, "unary op %d on %s", e->op, dsc_dtype_name(e->type));
        break;
      case KIR_BINARY:
        if (!e->a || !e->b || e->a->type != e->b->type)
          ok = ir_fail(err, errlen, "binary operands of different types");
        else if (binary_is_compare(e->op) ? e->type != DSC_BOOL : e->type != e->a->type)
          ok = ir_fail(err, errlen, "binary result type");
        else if ((e->op == KIR_AND || e->op == KIR_OR) != (e->a->type == DSC_BOOL) &&
                 !binary_is_compare(e->op))
          ok = ir_fail(err, errlen, "and/or take bools, arithmetic does not");
        else if (e->op == KIR_POW && !is_float(e->type))
          ok = ir_fail(err, errlen, "pow on integers");
        else if (e->op == KIR_RAND24 && e->type != DSC_I64)
          ok = ir_fail(err, errlen, "rand24 on %s (i64 only)", dsc_dtype_name(e->type));
        break;
      case KIR_SELECT:
        if (!e->a || !e->b || !e->c || e->a->type != DSC_BOOL || e->b->type != e->type ||
            e->c->type != e->type)
          ok = ir_fail(err, errlen, "select operand types");
        break;
      case KIR_CAST:
        if (!e->a) ok = ir_fail(err, errlen, "cast without operand");
        break;
    }
  }
  list_free(&l);
  return ok;
}

bool kir_validate(const kir_kernel *k, char *err, size_t errlen) {
  if (!k->name || !k->name[0]) return ir_fail(err, errlen, "kernel without a name");
  if (k->rank < 0 || k->rank > KIR_MAX_RANK || k->n_outer < 0 || k->n_outer > k->rank)
    return ir_fail(err, errlen, "%s: rank %d with %d outer dims", k->name, k->rank, k->n_outer);
  for (int d = 0; d < k->rank; d++)
    if (k->dims[d] <= 0)
      return ir_fail(err, errlen, "%s: dim %d has extent %" PRId64, k->name, d, k->dims[d]);
  for (int i = 0; i < k->n_args; i++)
    if (k->args[i].numel <= 0 || !(k->args[i].read || k->args[i].written))
      return ir_fail(err, errlen, "%s: argument %d unused or empty", k->name, i);
  bool defined[256] = {0};
  if (k->n_slots > 256) return ir_fail(err, errlen, "%s: more than 256 slots", k->name);
  char sub[200];
  for (int s = 0; s < k->n_stages; s++) {
    const kir_stage *st = &k->stages[s];
    if (!st->expr) return ir_fail(err, errlen, "%s: stage %d has no expression", k->name, s);
    bool outer_only = st->kind == KIR_STAGE_LET || (st->kind == KIR_STAGE_STORE && !st->over_inner);
    if (!check_expr(k, st->expr, defined, outer_only, sub, sizeof sub))
      return ir_fail(err, errlen, "%s: stage %d: %s", k->name, s, sub);
    switch (st->kind) {
      case KIR_STAGE_REDUCE:
      case KIR_STAGE_LET:
        if (st->slot < 0 || st->slot >= k->n_slots)
          return ir_fail(err, errlen, "%s: stage %d writes slot %d", k->name, s, st->slot);
        if (k->slot_types[st->slot] != st->expr->type)
          return ir_fail(err, errlen, "%s: stage %d: slot %d is %s, value is %s", k->name, s,
                         st->slot, dsc_dtype_name(k->slot_types[st->slot]),
                         dsc_dtype_name(st->expr->type));
        if (st->kind == KIR_STAGE_REDUCE && st->expr->type == DSC_BOOL)
          return ir_fail(err, errlen, "%s: stage %d reduces bools", k->name, s);
        defined[st->slot] = true;
        break;
      case KIR_STAGE_STORE:
        if (st->dst.arg < 0 || st->dst.arg >= k->n_args || !k->args[st->dst.arg].written)
          return ir_fail(err, errlen, "%s: stage %d stores to argument %d, not marked written",
                         k->name, s, st->dst.arg);
        if (!check_access(k, &st->dst, outer_only, sub, sizeof sub))
          return ir_fail(err, errlen, "%s: stage %d: %s", k->name, s, sub);
        if (st->dst.gather && !check_expr(k, st->dst.gather, defined, outer_only, sub, sizeof sub))
          return ir_fail(err, errlen, "%s: stage %d: %s", k->name, s, sub);
        break;
    }
  }
  return true;
}

/* ---------------- printing ---------------- */

typedef struct {
  char *buf;
  size_t len, cap;
  bool failed;
} strbuf;

static void sb_printf(strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(strbuf *b, const char *fmt, ...) {
  if (b->failed) return;
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(b->buf ? b->buf + b->len : NULL, b->buf ? b->cap - b->len : 0, fmt, ap);
    va_end(ap);
    if (n < 0) {
      b->failed = true;
      return;
    }
    if (b->buf && b->len + (size_t)n < b->cap) {
      b->len += (size_t)n;
      return;
    }
    size_t cap = b->cap ? b->cap * 2 : 1024;
    while (cap < b->len + (size_t)n + 1) cap *= 2;
    char *grown = realloc(b->buf, cap);
    if (!grown) {
      b->failed = true;
      return;
    }
    b->buf = grown;
    b->cap = cap;
  }
}

static const char *unary_names[] = {"neg",  "exp",     "log", "sqrt", "rsqrt",
                                    "tanh", "sigmoid", "abs", "sin",  "cos"};
#define N_UNARY_NAMES ((int)(sizeof unary_names / sizeof unary_names[0]))
static const char *binary_names[] = {"add", "sub", "mul", "div", "max", "min",
                                     "pow", "lt",  "gt",  "eq",  "and", "or"};
static const char *reduce_names[] = {"sum", "max", "min"};

static void print_access(strbuf *b, const kir_kernel *k, const kir_access *acc,
                         const ptr_map *ids) {
  sb_printf(b, "a%d[%" PRId64, acc->arg, acc->offset);
  for (int d = 0; d < k->rank; d++)
    if (acc->stride[d]) sb_printf(b, " + %" PRId64 "*i%d", acc->stride[d], d);
  if (acc->gather)
    sb_printf(b, " + %" PRId64 "*t%d (< %" PRId64 ")", acc->gather_stride,
              map_get(ids, acc->gather), acc->gather_bound);
  sb_printf(b, "]");
}

static void print_expr_nodes(strbuf *b, const kir_kernel *k, const kir_expr *root) {
  expr_list l;
  if (!list_init(&l)) {
    b->failed = true;
    return;
  }
  list_collect(&l, root);
  for (int i = 0; i < l.n; i++) {
    const kir_expr *e = l.items[i];
    sb_printf(b, "    t%d: %s = ", i, dsc_dtype_name(e->type));
    switch (e->kind) {
      case KIR_CONST: {
        char num[40];
        ir_format_double(e->value, num, sizeof num);
        sb_printf(b, "%s", num);
        break;
      }
      case KIR_LOAD:
        sb_printf(b, "load ");
        print_access(b, k, &e->access, &l.seen);
        break;
      case KIR_INDEX:
        sb_printf(b, "i%d", e->var);
        break;
      case KIR_SCALAR:
        sb_printf(b, "s%d", e->slot);
        break;
      case KIR_UNARY:
        sb_printf(b, "%s t%d", e->op >= 0 && e->op < N_UNARY_NAMES ? unary_names[e->op] : "?",
                  map_get(&l.seen, e->a));
        break;
      case KIR_BINARY:
        sb_printf(b, "%s t%d, t%d", e->op >= 0 && e->op < 12 ? binary_names[e->op] : "?",
                  map_get(&l.seen, e->a), map_get(&l.seen, e->b));
        break;
      case KIR_SELECT:
        sb_printf(b, "select t%d, t%d, t%d", map_get(&l.seen, e->a), map_get(&l.seen, e->b),
                  map_get(&l.seen, e->c));
        break;
      case KIR_CAST:
        sb_printf(b, "cast t%d", map_get(&l.seen, e->a));
        break;
    }
    sb_printf(b, "\n");
  }
  if (l.failed) b->failed = true;
  list_free(&l);
}

char *kir_print(ir_arena *a, const kir_kernel *k) {
  strbuf b = {0};
  sb_printf(&b, "kernel %s over [", k->name);
  for (int d = 0; d < k->rank; d++)
    sb_printf(&b, "%s%s%" PRId64, d ? ", " : "", d == k->n_outer ? "| " : "", k->dims[d]);
  sb_printf(&b, "%s]\n", k->rank == k->n_outer ? " |" : "");
  for (int i = 0; i < k->n_args; i++)
    sb_printf(&b, "  a%d: %s[%" PRId64 "]%s%s\n", i, dsc_dtype_name(k->args[i].dtype),
              k->args[i].numel, k->args[i].read ? " read" : "",
              k->args[i].written ? " written" : "");
  for (int s = 0; s < k->n_stages; s++) {
    const kir_stage *st = &k->stages[s];
    switch (st->kind) {
      case KIR_STAGE_REDUCE:
        sb_printf(&b, "  s%d = reduce %s over inner of\n", st->slot,
                  reduce_names[st->reduce % 3]);
        break;
      case KIR_STAGE_LET:
        sb_printf(&b, "  s%d = let\n", st->slot);
        break;
      case KIR_STAGE_STORE: {
        expr_list l;
        if (list_init(&l)) {
          list_collect(&l, st->expr);
          sb_printf(&b, "  store%s ", st->over_inner ? " over inner" : " once");
          print_access(&b, k, &st->dst, &l.seen);
          sb_printf(&b, " = last of\n");
        }
        list_free(&l);
        break;
      }
    }
    print_expr_nodes(&b, k, st->expr);
  }
  char *out = NULL;
  if (!b.failed && b.buf) out = ir_arena_strndup(a, b.buf, b.len);
  free(b.buf);
  return out;
}

/* ---------------- hashing ---------------- */

static uint64_t mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
  return h * 0x100000001B3ull;
}

static uint64_t mix_double(uint64_t h, double v) {
  uint64_t bits;
  memcpy(&bits, &v, sizeof bits);
  return mix(h, bits);
}

static uint64_t hash_access(uint64_t h, const kir_access *acc, const ptr_map *ids) {
  h = mix(h, (uint64_t)acc->arg);
  h = mix(h, (uint64_t)acc->offset);
  for (int d = 0; d < KIR_MAX_RANK; d++) h = mix(h, (uint64_t)acc->stride[d]);
  h = mix(h, acc->gather ? (uint64_t)map_get(ids, acc->gather) + 1 : 0);
  h = mix(h, (uint64_t)acc->gather_stride);
  return mix(h, (uint64_t)acc->gather_bound);
}

static uint64_t hash_expr(uint64_t h, const kir_expr *root) {
  expr_list l;
  if (!list_init(&l)) return mix(h, 0xdead);
  list_collect(&l, root);
  for (int i = 0; i < l.n; i++) {
    const kir_expr *e = l.items[i];
    h = mix(h, (uint64_t)e->kind);
    h = mix(h, (uint64_t)e->type);
    h = mix(h, (uint64_t)e->op);
    h = mix_double(h, e->value);
    h = mix(h, (uint64_t)e->var);
    h = mix(h, (uint64_t)e->slot);
    if (e->kind == KIR_LOAD) h = hash_access(h, &e->access, &l.seen);
    h = mix(h, e->a ? (uint64_t)map_get(&l.seen, e->a) : UINT64_MAX);
    h = mix(h, e->b ? (uint64_t)map_get(&l.seen, e->b) : UINT64_MAX);
    h = mix(h, e->c ? (uint64_t)map_get(&l.seen, e->c) : UINT64_MAX);
  }
  if (l.failed) h = mix(h, 0xdead);
  list_free(&l);
  return h;
}

static uint64_t hash_kernel(const kir_kernel *k, const char *name);

uint64_t kir_hash(const kir_kernel *k) { return hash_kernel(k, k->name); }

uint64_t kir_body_hash(const kir_kernel *k) { return hash_kernel(k, NULL); }

static uint64_t hash_kernel(const kir_kernel *k, const char *name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const char *p = name; p && *p; p++) h = mix(h, (uint64_t)(unsigned char)*p);
  h = mix(h, (uint64_t)k->rank);
  h = mix(h, (uint64_t)k->n_outer);
  for (int d = 0; d < k->rank; d++) h = mix(h, (uint64_t)k->dims[d]);
  for (int i = 0; i < k->n_args; i++) {
    h = mix(h, (uint64_t)k->args[i].dtype);
    h = mix(h, (uint64_t)k->args[i].numel);
    h = mix(h, (uint64_t)(k->args[i].read | (k->args[i].written << 1)));
  }
  for (int i = 0; i < k->n_slots; i++) h = mix(h, (uint64_t)k->slot_types[i]);
  h = mix(h, (uint64_t)k->distinct_args);
  for (int s = 0; s < k->n_stages; s++) {
    const kir_stage *st = &k->stages[s];
    h = mix(h, (uint64_t)st->kind);
    h = mix(h, (uint64_t)st->reduce);
    h = mix(h, (uint64_t)st->slot);
    h = mix(h, (uint64_t)st->over_inner);
    h = hash_expr(h, st->expr);
    if (st->kind == KIR_STAGE_STORE) {
      ptr_map none;
      if (map_init(&none)) {
        h = hash_access(h, &st->dst, &none);
        map_free(&none);
      }
      if (st->dst.gather) h = hash_expr(h, st->dst.gather);
    }
  }
  return h;
}

/* ---------------- shared with kir_eval.c ---------------- */

int kir_internal_topo(const kir_expr *root, const kir_expr ***items, int **a, int **b, int **c,
                      int **g);
/* Post-order node list of root with each node's operand positions (-1 none):
 * the evaluator's per-stage program. Returns the count, -1 when out of
 * memory; the caller frees the five arrays. */
int kir_internal_topo(const kir_expr *root, const kir_expr ***items, int **a, int **b, int **c,
                      int **g) {
  expr_list l;
  if (!list_init(&l)) return -1;
  list_collect(&l, root);
  int n = l.n;
  *items = NULL;
  *a = malloc((size_t)(n + 1) * sizeof **a);
  *b = malloc((size_t)(n + 1) * sizeof **b);
  *c = malloc((size_t)(n + 1) * sizeof **c);
  *g = malloc((size_t)(n + 1) * sizeof **g);
  if (l.failed || !*a || !*b || !*c || !*g) {
    free(*a);
    free(*b);
    free(*c);
    free(*g);
    list_free(&l);
    return -1;
  }
  for (int i = 0; i < n; i++) {
    const kir_expr *e = l.items[i];
    (*a)[i] = e->a ? map_get(&l.seen, e->a) : -1;
    (*b)[i] = e->b ? map_get(&l.seen, e->b) : -1;
    (*c)[i] = e->c ? map_get(&l.seen, e->c) : -1;
    (*g)[i] = e->kind == KIR_LOAD && e->access.gather ? map_get(&l.seen, e->access.gather) : -1;
  }
  *items = l.items;
  l.items = NULL;
  list_free(&l);
  return n;
}
