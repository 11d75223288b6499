/* Common subexpression elimination of reductions and library calls.
 *
 * Why: autodiff builds each gradient rule from the forward node alone, and
 * decompose rewrites each composite op on its own, so the backward recomputes
 * what the forward already has: cross_entropy's gradient builds a fresh
 * softmax of the logits (max and sum of exp over 50304 classes per row),
 * attention's backward a fresh max and sum over every score row. The values
 * are the same nodes up to identity; this pass finds them.
 *
 * How: value numbering in node order (SSA order is topological). Two pure
 * nodes are equal when op, type, attributes and the value numbers of their
 * inputs are equal. Pure = every op except input, assign and the collective
 * start/wait ops. Only reductions over at least one axis (sum, mean, max),
 * matmuls and embeddings are REPLACED by their equal: each is worth storing
 * (a reduction's result is small; a matmul or gather is expensive).
 * Elementwise nodes, views, consts and iotas only get value numbers (so the
 * reductions above them can match) and keep their own copies: an
 * elementwise value shared by two fusion groups would have to be stored as
 * a full buffer (exp(logits - max) is 51 MB in GPT-2), where a copy in each
 * group is recomputed for free. Nodes left without a use are then removed.
 *
 * A matmul or gather that activation checkpointing recomputes (role
 * IR_ROLE_RECOMPUTED) is not replaced by the forward's: that would keep
 * the forward's result alive until the backward, which is what the policy
 * chose not to do.
 *
 * Exact: a replaced node computes the very same value. Runs after decompose,
 * before fuse (include/dsc/train.h lists the pipeline). */
#include <stdint.h>
#include <string.h>

#include "passes/passes.h"

static bool is_pure(dsc_op op) {
  return op != DSC_OP_INPUT && op != DSC_OP_ASSIGN && !ir_is_collective_start(op) &&
         !ir_is_collective_wait(op) && ir_op(op)->cg != IR_CG_TIER; /* disk transfers */
}

static bool worth_replacing(const ir_node *n) {
  switch (n->op) {
    case DSC_OP_SUM:
    case DSC_OP_MEAN:
    case DSC_OP_MAX: {
      int cnt = 0;
      ir_attr_ints(n, "axes", &cnt);
      return cnt > 0;
    }
    case DSC_OP_MATMUL:
    case DSC_OP_EMBEDDING:
      return true;
    default:
      return false;
  }
}

static uint64_t mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  return h * 0xff51afd7ed558ccdull;
}

static uint64_t mix_str(uint64_t h, const char *s) {
  return mix(h, s ? ir_fnv1a64(s) : 0);
}

static uint64_t attr_hash(uint64_t h, const dsc_attr *a) {
  h = mix_str(h, a->key);
  h = mix(h, (uint64_t)a->kind);
  switch (a->kind) {
    case DSC_ATTR_INT: return mix(h, (uint64_t)a->u.i);
    case DSC_ATTR_FLOAT: {
      uint64_t bits;
      memcpy(&bits, &a->u.f, sizeof bits);
      return mix(h, bits);
    }
    case DSC_ATTR_BOOL: return mix(h, (uint64_t)a->u.b);
    case DSC_ATTR_DTYPE: return mix(h, (uint64_t)a->u.dt);
    case DSC_ATTR_STR: return mix_str(h, a->u.s);
    case DSC_ATTR_INTS:
      h = mix(h, (uint64_t)a->u.ints.n);
      for (int i = 0; i < a->u.ints.n; i++) h = mix(h, (uint64_t)a->u.ints.v[i]);
      return h;
  }
  return h;
}

static bool attr_equal(const dsc_attr *a, const dsc_attr *b) {
  if (strcmp(a->key, b->key) != 0 || a->kind != b->kind) return false;
  switch (a->kind) {
    case DSC_ATTR_INT: return a->u.i == b->u.i;
    case DSC_ATTR_FLOAT: return memcmp(&a->u.f, &b->u.f, sizeof a->u.f) == 0;
    case DSC_ATTR_BOOL: return a->u.b == b->u.b;
    case DSC_ATTR_DTYPE: return a->u.dt == b->u.dt;
    case DSC_ATTR_STR: return strcmp(a->u.s, b->u.s) == 0;
    case DSC_ATTR_INTS:
      return a->u.ints.n == b->u.ints.n &&
             (a->u.ints.n == 0 ||
              memcmp(a->u.ints.v, b->u.ints.v, sizeof(int64_t) * (size_t)a->u.ints.n) == 0);
  }
  return false;
}

typedef struct {
  ir_graph *g;
  int *vn;           /* [n] value number: id of the first equal node */
  int *table;        /* open addressing over node ids, -1 = empty */
  uint64_t *hash;    /* [n] */
  size_t cap;        /* table slots, a power of two */
} cse_state;

static uint64_t node_hash(const cse_state *s, const ir_node *n) {
  uint64_t h = mix(0x243f6a8885a308d3ull, (uint64_t)n->op);
  h = mix(h, (uint64_t)n->type.dtype);
  h = mix(h, (uint64_t)n->type.rank);
  for (int d = 0; d < n->type.rank; d++) h = mix(h, (uint64_t)n->type.dims[d]);
  h = mix(h, (uint64_t)n->n_in);
  for (int i = 0; i < n->n_in; i++) h = mix(h, (uint64_t)s->vn[n->in[i]->id]);
  for (int i = 0; i < n->n_attrs; i++) h = attr_hash(h, &n->attrs[i]);
  return h;
}

static bool node_equal(const cse_state *s, const ir_node *a, const ir_node *b) {
  if (a->op != b->op || !dsc_type_equal(&a->type, &b->type) || a->n_in != b->n_in ||
      a->n_attrs != b->n_attrs || a->place != b->place) /* host and device copies stay apart */
    return false;
  for (int i = 0; i < a->n_in; i++)
    if (s->vn[a->in[i]->id] != s->vn[b->in[i]->id]) return false;
  for (int i = 0; i < a->n_attrs; i++)
    if (!attr_equal(&a->attrs[i], &b->attrs[i])) return false;
  return true;
}

/* Removes pure nodes that no output, assign or collective needs. */
static void drop_unused(ir_graph *g, bool *live) {
  memset(live, 0, sizeof(bool) * (size_t)g->n_nodes);
  for (int i = 0; i < g->n_outputs; i++) live[g->outputs[i]->id] = true;
  for (int i = g->n_nodes - 1; i >= 0; i--) {
    ir_node *n = g->nodes[i];
    if (!is_pure(n->op)) live[i] = true;
    if (live[i])
      for (int j = 0; j < n->n_in; j++) live[n->in[j]->id] = true;
  }
  int k = 0;
  for (int i = 0; i < g->n_nodes; i++)
    if (live[i]) {
      g->nodes[k] = g->nodes[i];
      g->nodes[k]->id = k;
      k++;
    }
  g->n_nodes = k;
}

dsc_status pass_cse_graph(ir_graph *g) {
  dsc_context *ctx = g->module->ctx;
  int n = g->n_nodes;
  if (n == 0) return DSC_OK;
  cse_state s = {g, NULL, NULL, NULL, 16};
  while (s.cap < (size_t)n * 2) s.cap *= 2;
  size_t vn_bytes = sizeof(int) * (size_t)n, hash_bytes = sizeof(uint64_t) * (size_t)n;
  size_t table_bytes = sizeof(int) * s.cap, live_bytes = sizeof(bool) * (size_t)n;
  s.vn = ir_alloc(ctx, vn_bytes);
  s.hash = ir_alloc(ctx, hash_bytes);
  s.table = ir_alloc(ctx, table_bytes);
  bool *live = ir_alloc(ctx, live_bytes);
  ir_node **repl = ir_alloc(ctx, sizeof(ir_node *) * (size_t)n);
  dsc_status st = DSC_OK;
  if (!s.vn || !s.hash || !s.table || !live || !repl) {
    ir_error(ctx, ir_no_loc, "out of memory in common subexpression elimination");
    st = DSC_ERR_INTERNAL;
    goto done;
  }
  memset(s.table, 0xff, table_bytes);
  memset(repl, 0, sizeof(ir_node *) * (size_t)n);
  for (int i = 0; i < n; i++) {
    ir_node *x = g->nodes[i];
    for (int j = 0; j < x->n_in; j++)
      if (repl[x->in[j]->id]) x->in[j] = repl[x->in[j]->id];
    s.vn[i] = i;
    if (!is_pure(x->op)) continue;
    uint64_t h = s.hash[i] = node_hash(&s, x);
    size_t slot = (size_t)h & (s.cap - 1);
    for (; s.table[slot] >= 0; slot = (slot + 1) & (s.cap - 1)) {
      int j = s.table[slot];
      if (s.hash[j] == h && node_equal(&s, x, g->nodes[j])) break;
    }
    if (s.table[slot] < 0) {
      s.table[slot] = i;
      continue;
    }
    int j = s.table[slot];
    if (x->role == IR_ROLE_RECOMPUTED && g->nodes[j]->role != IR_ROLE_RECOMPUTED &&
        (x->op == DSC_OP_MATMUL || x->op == DSC_OP_EMBEDDING)) {
      /* activation checkpointing chose to compute this again rather than
       * keep the forward's (large) result: the recomputation stands, and
       * later equal nodes (the backward's) read it */
      s.table[slot] = i;
      continue;
    }
    s.vn[i] = s.vn[j];
    if (worth_replacing(x)) repl[i] = g->nodes[j];
  }
  for (int k = 0; k < g->n_outputs; k++)
    if (repl[g->outputs[k]->id]) g->outputs[k] = repl[g->outputs[k]->id];
  drop_unused(g, live);
done:
  if (s.vn) ir_free(ctx, s.vn, vn_bytes);
  if (s.hash) ir_free(ctx, s.hash, hash_bytes);
  if (s.table) ir_free(ctx, s.table, table_bytes);
  if (live) ir_free(ctx, live, live_bytes);
  if (repl) ir_free(ctx, repl, sizeof(ir_node *) * (size_t)n);
  return st;
}

dsc_status pass_cse_run(ir_module *m) {
  for (int i = 0; i < m->n_graphs; i++) {
    dsc_status st = pass_cse_graph(m->graphs[i]);
    if (st != DSC_OK) return st;
  }
  return DSC_OK;
}
