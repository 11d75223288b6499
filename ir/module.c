/* Modules, params, metadata, graphs, nodes and the builder API. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir/ir.h"

bool ir_grow(ir_arena *a, void **items, int *cap, int need, size_t elem) {
  if (need <= *cap) return true;
  int ncap = *cap ? *cap * 2 : 8;
  while (ncap < need) ncap *= 2;
  void *n = ir_arena_alloc(a, elem * (size_t)ncap);
  if (!n) return false;
  if (*items) memcpy(n, *items, elem * (size_t)*cap);
  *items = n;
  *cap = ncap;
  return true;
}

static bool oom(ir_module *m) {
  ir_error(m->ctx, ir_no_loc, "out of memory while building the IR");
  return false;
}

dsc_module *dsc_module_new(dsc_context *ctx, const char *name) {
  ir_module *m = ir_alloc(ctx, sizeof *m);
  if (!m) return NULL;
  memset(m, 0, sizeof *m);
  m->ctx = ctx;
  ir_arena_init(&m->arena, ctx);
  m->name = ir_arena_strdup(&m->arena, name ? name : "main");
  if (!m->name) {
    dsc_module_free(m);
    return NULL;
  }
  return m;
}

void dsc_module_free(dsc_module *m) {
  if (!m) return;
  ir_arena_release(&m->arena);
  ir_free(m->ctx, m, sizeof *m);
}

const char *dsc_module_name(const dsc_module *m) { return m->name; }
dsc_context *dsc_module_context(const dsc_module *m) { return m->ctx; }

static void slot_insert(int *slots, int cap, const ir_param *params, int i) {
  size_t h = (size_t)ir_fnv1a64(params[i].name) & (size_t)(cap - 1);
  while (slots[h] >= 0) h = (h + 1) & (size_t)(cap - 1);
  slots[h] = i;
}

/* Keeps the table at most half full; false when out of memory. */
static bool index_param(dsc_module *m, int i) {
  if (2 * (i + 1) > m->cap_slots) {
    int cap = m->cap_slots ? 2 * m->cap_slots : 64;
    int *slots = ir_arena_alloc(&m->arena, sizeof(int) * (size_t)cap);
    if (!slots) return false;
    for (int k = 0; k < cap; k++) slots[k] = -1;
    for (int k = 0; k < i; k++) slot_insert(slots, cap, m->params, k);
    m->param_slots = slots, m->cap_slots = cap; /* the old table stays in the arena */
  }
  slot_insert(m->param_slots, m->cap_slots, m->params, i);
  return true;
}

dsc_status dsc_module_add_param(dsc_module *m, const char *name, dsc_type type, dsc_init init) {
  if (dsc_module_find_param(m, name) >= 0) {
    ir_error(m->ctx, ir_no_loc, "parameter '%s' is declared twice", name);
    return DSC_ERR_USER;
  }
  if (!ir_grow(&m->arena, (void **)&m->params, &m->cap_params, m->n_params + 1, sizeof(ir_param)))
    return oom(m), DSC_ERR_INTERNAL;
  ir_param *p = &m->params[m->n_params];
  p->name = ir_arena_strdup(&m->arena, name);
  if (!p->name) return oom(m), DSC_ERR_INTERNAL;
  p->type = type;
  p->init = init;
  p->init.from = NULL;
  if (init.kind == DSC_INIT_COPY && !(p->init.from = ir_arena_strdup(&m->arena, init.from ? init.from : "")))
    return oom(m), DSC_ERR_INTERNAL;
  if (!index_param(m, m->n_params)) return oom(m), DSC_ERR_INTERNAL;
  m->n_params++;
  return DSC_OK;
}

dsc_status dsc_module_add_state(dsc_module *m, const char *name, dsc_type type, dsc_init init) {
  dsc_status st = dsc_module_add_param(m, name, type, init);
  if (st == DSC_OK) m->params[m->n_params - 1].state = true;
  return st;
}

int dsc_module_param_is_state(const dsc_module *m, int i) { return m->params[i].state; }
int dsc_module_param_count(const dsc_module *m) { return m->n_params; }
const char *dsc_module_param_name(const dsc_module *m, int i) { return m->params[i].name; }
dsc_type dsc_module_param_type(const dsc_module *m, int i) { return m->params[i].type; }
dsc_init dsc_module_param_init(const dsc_module *m, int i) { return m->params[i].init; }

int dsc_module_find_param(const dsc_module *m, const char *name) {
  if (!name || m->cap_slots == 0) return -1;
  for (size_t h = (size_t)ir_fnv1a64(name) & (size_t)(m->cap_slots - 1); m->param_slots[h] >= 0;
       h = (h + 1) & (size_t)(m->cap_slots - 1))
    if (strcmp(m->params[m->param_slots[h]].name, name) == 0) return m->param_slots[h];
  return -1;
}

const ir_param *ir_module_param(const ir_module *m, const char *name) {
  int i = dsc_module_find_param(m, name);
  return i >= 0 ? &m->params[i] : NULL;
}

int64_t dsc_module_param_numel(const dsc_module *m) {
  int64_t n = 0;
  for (int i = 0; i < m->n_params; i++) n += dsc_type_numel(&m->params[i].type);
  return n;
}

dsc_status dsc_module_set_meta(dsc_module *m, const char *key, const char *value) {
  const char *v = ir_arena_strdup(&m->arena, value);
  if (!v) return oom(m), DSC_ERR_INTERNAL;
  for (int i = 0; i < m->n_meta; i++)
    if (strcmp(m->meta[i].key, key) == 0) {
      m->meta[i].value = v;
      return DSC_OK;
    }
  if (!ir_grow(&m->arena, (void **)&m->meta, &m->cap_meta, m->n_meta + 1, sizeof(ir_meta)))
    return oom(m), DSC_ERR_INTERNAL;
  m->meta[m->n_meta].key = ir_arena_strdup(&m->arena, key);
  if (!m->meta[m->n_meta].key) return oom(m), DSC_ERR_INTERNAL;
  m->meta[m->n_meta++].value = v;
  return DSC_OK;
}

int dsc_module_param_shard(const dsc_module *m, int i, dsc_type *full, int64_t *world) {
  const ir_param *pa = &m->params[i];
  *full = pa->type, *world = 1;
  char key[300];
  snprintf(key, sizeof key, "shard.%s", pa->name);
  const char *v = dsc_module_get_meta(m, key);
  if (!v) return 0;
  char *end;
  long long w = strtoll(v, &end, 10);
  if (w < 1 || w > INT32_MAX || *end != ' ') return -1;
  dsc_type t = dsc_type_make(pa->type.dtype, 0, NULL);
  const char *s = end + 1;
  if (strcmp(s, "scalar") != 0) {
    for (;;) {
      long long d = strtoll(s, &end, 10);
      if (d < 1 || end == s || t.rank == DSC_MAX_RANK) return -1;
      t.dims[t.rank++] = d;
      if (*end == 0) break;
      if (*end != 'x') return -1;
      s = end + 1;
    }
  }
  int64_t n = dsc_type_numel(&t), chunk = n / w + (n % w != 0);
  if (pa->type.rank != 1 || pa->type.dims[0] != chunk) return -1;
  *full = t, *world = w;
  return 1;
}

const char *dsc_module_get_meta(const dsc_module *m, const char *key) {
  for (int i = 0; i < m->n_meta; i++)
    if (strcmp(m->meta[i].key, key) == 0) return m->meta[i].value;
  return NULL;
}
int dsc_module_meta_count(const dsc_module *m) { return m->n_meta; }
const char *dsc_module_meta_key(const dsc_module *m, int i) { return m->meta[i].key; }
const char *dsc_module_meta_value(const dsc_module *m, int i) { return m->meta[i].value; }

dsc_graph *dsc_graph_new(dsc_module *m, const char *name) {
  if (dsc_module_find_graph(m, name)) {
    ir_error(m->ctx, ir_no_loc, "graph '%s' is defined twice", name);
    return NULL;
  }
  if (!ir_grow(&m->arena, (void **)&m->graphs, &m->cap_graphs, m->n_graphs + 1, sizeof(ir_graph *)))
    return oom(m), NULL;
  ir_graph *g = ir_arena_alloc(&m->arena, sizeof *g);
  if (!g || !(g->name = ir_arena_strdup(&m->arena, name))) return oom(m), NULL;
  g->module = m;
  m->graphs[m->n_graphs++] = g;
  return g;
}

int dsc_module_graph_count(const dsc_module *m) { return m->n_graphs; }
dsc_graph *dsc_module_graph(const dsc_module *m, int i) { return m->graphs[i]; }
dsc_graph *dsc_module_find_graph(const dsc_module *m, const char *name) {
  for (int i = 0; i < m->n_graphs; i++)
    if (strcmp(m->graphs[i]->name, name) == 0) return m->graphs[i];
  return NULL;
}

const char *dsc_graph_name(const dsc_graph *g) { return g->name; }
dsc_module *dsc_graph_module(const dsc_graph *g) { return g->module; }
int dsc_graph_node_count(const dsc_graph *g) { return g->n_nodes; }
dsc_node *dsc_graph_node(const dsc_graph *g, int i) { return g->nodes[i]; }
int dsc_graph_input_count(const dsc_graph *g) { return g->n_inputs; }
dsc_node *dsc_graph_input_at(const dsc_graph *g, int i) { return g->inputs[i]; }
int dsc_graph_output_count(const dsc_graph *g) { return g->n_outputs; }
dsc_node *dsc_graph_output_at(const dsc_graph *g, int i) { return g->outputs[i]; }
void dsc_graph_set_loc(dsc_graph *g, dsc_loc loc) { g->cur_loc = loc; }

dsc_status dsc_graph_set_outputs(dsc_graph *g, dsc_node *const *outs, int n) {
  for (int i = 0; i < n; i++)
    if (!outs[i]) return DSC_ERR_USER; /* an earlier builder call failed and said why */
  ir_node **o = ir_arena_alloc(&g->module->arena, sizeof(ir_node *) * (size_t)(n ? n : 1));
  if (!o) return oom(g->module), DSC_ERR_INTERNAL;
  memcpy(o, outs, sizeof(ir_node *) * (size_t)n);
  g->outputs = o;
  g->n_outputs = n;
  return DSC_OK;
}

/* Copies attrs into the arena (ints and strings included). */
static dsc_attr *copy_attrs(ir_arena *a, const dsc_attr *attrs, int n) {
  if (n == 0) return NULL;
  dsc_attr *d = ir_arena_alloc(a, sizeof(dsc_attr) * (size_t)n);
  if (!d) return NULL;
  for (int i = 0; i < n; i++) {
    d[i] = attrs[i];
    d[i].key = ir_arena_strdup(a, attrs[i].key);
    if (!d[i].key) return NULL;
    if (attrs[i].kind == DSC_ATTR_STR) {
      d[i].u.s = ir_arena_strdup(a, attrs[i].u.s ? attrs[i].u.s : "");
      if (!d[i].u.s) return NULL;
    } else if (attrs[i].kind == DSC_ATTR_INTS) {
      int cnt = attrs[i].u.ints.n;
      int64_t *v = ir_arena_alloc(a, sizeof(int64_t) * (size_t)(cnt ? cnt : 1));
      if (!v) return NULL;
      if (cnt) memcpy(v, attrs[i].u.ints.v, sizeof(int64_t) * (size_t)cnt);
      d[i].u.ints.v = v;
    }
  }
  return d;
}

static ir_node *node_alloc(ir_graph *g, dsc_op op, dsc_type type, ir_node *const *in, int n_in,
                           const dsc_attr *attrs, int n_attrs) {
  ir_arena *a = &g->module->arena;
  ir_node *n = ir_arena_alloc(a, sizeof *n);
  if (!n) return NULL;
  n->op = op;
  n->type = type;
  n->n_in = n_in;
  n->graph = g;
  n->loc = g->cur_loc;
  if (n_in > 0) {
    n->in = ir_arena_alloc(a, sizeof(ir_node *) * (size_t)n_in);
    if (!n->in) return NULL;
    memcpy(n->in, in, sizeof(ir_node *) * (size_t)n_in);
  }
  n->n_attrs = n_attrs;
  if (n_attrs && !(n->attrs = copy_attrs(a, attrs, n_attrs))) return NULL;
  return n;
}

static bool node_append(ir_graph *g, ir_node *n) {
  if (!ir_grow(&g->module->arena, (void **)&g->nodes, &g->cap_nodes, g->n_nodes + 1,
               sizeof(ir_node *)))
    return false;
  n->id = g->n_nodes;
  g->nodes[g->n_nodes++] = n;
  return true;
}

ir_node *ir_node_new_raw(ir_graph *g, dsc_op op, dsc_type type, ir_node *const *in, int n_in,
                         const dsc_attr *attrs, int n_attrs) {
  ir_node *n = node_alloc(g, op, type, in, n_in, attrs, n_attrs);
  if (!n || !node_append(g, n)) return oom(g->module), NULL;
  return n;
}

dsc_node *dsc_graph_input(dsc_graph *g, const char *name, dsc_type type) {
  /* %0, %1, ... name the other values in the text form */
  size_t digits = strspn(name, "0123456789");
  if (!*name || digits == strlen(name)) {
    ir_error(g->module->ctx, g->cur_loc,
             "graph input name '%s' must not be empty or a number (numbers name the graph's "
             "other values)",
             name);
    return NULL;
  }
  for (int i = 0; i < g->n_inputs; i++)
    if (strcmp(g->inputs[i]->name, name) == 0) {
      ir_error(g->module->ctx, g->cur_loc, "graph '%s' has two inputs named '%s'", g->name, name);
      return NULL;
    }
  ir_node *n = ir_node_new_raw(g, DSC_OP_INPUT, type, NULL, 0, NULL, 0);
  if (!n) return NULL;
  if (!(n->name = ir_arena_strdup(&g->module->arena, name)) ||
      !ir_grow(&g->module->arena, (void **)&g->inputs, &g->cap_inputs, g->n_inputs + 1,
               sizeof(ir_node *)))
    return oom(g->module), NULL;
  g->inputs[g->n_inputs++] = n;
  return n;
}

/* Puts attrs in the op's declared order; reports missing/extra/mistyped. */
static bool order_attrs(ir_graph *g, dsc_op op, const dsc_attr *attrs, int n_attrs, dsc_attr *out) {
  const ir_op_info *info = ir_op(op);
  dsc_context *ctx = g->module->ctx;
  if (n_attrs != info->n_attrs) {
    ir_error(ctx, g->cur_loc, "op '%s' takes %d attribute(s) (%s), got %d", info->name,
             info->n_attrs, info->attr_spec, n_attrs);
    return false;
  }
  for (int k = 0; k < info->n_attrs; k++) {
    int found = -1;
    for (int j = 0; j < n_attrs; j++)
      if (attrs[j].key && strcmp(attrs[j].key, info->attr_keys[k]) == 0) found = j;
    if (found < 0) {
      ir_error(ctx, g->cur_loc, "op '%s' needs attribute '%s'", info->name, info->attr_keys[k]);
      return false;
    }
    if (attrs[found].kind != info->attr_kinds[k]) {
      ir_error(ctx, g->cur_loc, "attribute '%s' of op '%s' has the wrong kind", info->attr_keys[k],
               info->name);
      return false;
    }
    out[k] = attrs[found];
  }
  return true;
}

dsc_node *dsc_build(dsc_graph *g, dsc_op op, dsc_node *const *in, int n_in, const dsc_attr *attrs,
                    int n_attrs) {
  if (!g) return NULL;
  dsc_context *ctx = g->module->ctx;
  const ir_op_info *info = ir_op(op);
  if (!info) {
    ir_error(ctx, g->cur_loc, "unknown op %d", (int)op);
    return NULL;
  }
  for (int i = 0; i < n_in; i++)
    if (!in[i]) return NULL; /* an earlier failure was already reported */
  if (op == DSC_OP_INPUT) {
    ir_error(ctx, g->cur_loc, "graph inputs are made with dsc_graph_input");
    return NULL;
  }
  if (info->n_inputs >= 0 ? n_in != info->n_inputs : n_in < 1) {
    ir_error(ctx, g->cur_loc, "op '%s' takes %s%d input(s), got %d", info->name,
             info->n_inputs < 0 ? "at least " : "", info->n_inputs < 0 ? 1 : info->n_inputs, n_in);
    return NULL;
  }
  for (int i = 0; i < n_in; i++)
    if (in[i]->graph != g) {
      ir_error(ctx, g->cur_loc, "input %d of '%s' belongs to another graph", i, info->name);
      return NULL;
    }
  dsc_attr ordered[IR_MAX_OP_ATTRS];
  memset(ordered, 0, sizeof ordered); /* gcc -O3 cannot see order_attrs fill them */
  if (!order_attrs(g, op, attrs, n_attrs, ordered)) return NULL;
  dsc_type zero;
  memset(&zero, 0, sizeof zero);
  ir_node *n = node_alloc(g, op, zero, in, n_in, ordered, info->n_attrs);
  if (!n) return oom(g->module), NULL;
  char err[512] = "";
  dsc_type t;
  memset(&t, 0, sizeof t);
  if (!info->shape(n, &t, err, sizeof err)) {
    ir_error(ctx, g->cur_loc, "%s: %s", info->name, err);
    return NULL;
  }
  n->type = t;
  if (!node_append(g, n)) return oom(g->module), NULL;
  return n;
}

dsc_node *dsc_param_ref(dsc_graph *g, const char *param_name) {
  dsc_attr a = dsc_attr_str("name", param_name);
  return dsc_build(g, DSC_OP_PARAM, NULL, 0, &a, 1);
}

dsc_node *dsc_const(dsc_graph *g, double value, dsc_type type) {
  dsc_attr a[3] = {dsc_attr_float("value", value), dsc_attr_dtype("dtype", type.dtype),
                   dsc_attr_ints("shape", type.dims, type.rank)};
  return dsc_build(g, DSC_OP_CONST, NULL, 0, a, 3);
}

dsc_node *dsc_unary(dsc_graph *g, dsc_op op, dsc_node *x) { return dsc_build(g, op, &x, 1, NULL, 0); }

dsc_node *dsc_binary(dsc_graph *g, dsc_op op, dsc_node *a, dsc_node *b) {
  dsc_node *in[2] = {a, b};
  return dsc_build(g, op, in, 2, NULL, 0);
}

dsc_node *dsc_matmul(dsc_graph *g, dsc_node *a, dsc_node *b) {
  return dsc_binary(g, DSC_OP_MATMUL, a, b);
}

dsc_node *dsc_reduce(dsc_graph *g, dsc_op op, dsc_node *x, const int64_t *axes, int n_axes,
                     int keepdims) {
  dsc_attr a[2] = {dsc_attr_ints("axes", axes, n_axes), dsc_attr_bool("keepdims", keepdims)};
  return dsc_build(g, op, &x, 1, a, 2);
}

dsc_node *dsc_reshape(dsc_graph *g, dsc_node *x, const int64_t *shape, int rank) {
  dsc_attr a = dsc_attr_ints("shape", shape, rank);
  return dsc_build(g, DSC_OP_RESHAPE, &x, 1, &a, 1);
}

dsc_node *dsc_permute(dsc_graph *g, dsc_node *x, const int64_t *perm, int rank) {
  dsc_attr a = dsc_attr_ints("perm", perm, rank);
  return dsc_build(g, DSC_OP_PERMUTE, &x, 1, &a, 1);
}

dsc_node *dsc_cast(dsc_graph *g, dsc_node *x, dsc_dtype to) {
  dsc_attr a = dsc_attr_dtype("dtype", to);
  return dsc_build(g, DSC_OP_CAST, &x, 1, &a, 1);
}

dsc_op dsc_node_op(const dsc_node *n) { return n->op; }
dsc_type dsc_node_type(const dsc_node *n) { return n->type; }
int dsc_node_input_count(const dsc_node *n) { return n->n_in; }
dsc_node *dsc_node_input(const dsc_node *n, int i) { return n->in[i]; }
const char *dsc_node_name(const dsc_node *n) { return n->name; }

const dsc_attr *dsc_node_attr(const dsc_node *n, const char *key) { return ir_attr(n, key); }

const dsc_attr *ir_attr(const ir_node *n, const char *key) {
  for (int i = 0; i < n->n_attrs; i++)
    if (strcmp(n->attrs[i].key, key) == 0) return &n->attrs[i];
  return NULL;
}

int64_t ir_attr_int(const ir_node *n, const char *key) {
  const dsc_attr *a = ir_attr(n, key);
  return a && a->kind == DSC_ATTR_INT ? a->u.i : 0;
}
double ir_attr_float(const ir_node *n, const char *key) {
  const dsc_attr *a = ir_attr(n, key);
  return a && a->kind == DSC_ATTR_FLOAT ? a->u.f : 0.0;
}
bool ir_attr_bool(const ir_node *n, const char *key) {
  const dsc_attr *a = ir_attr(n, key);
  return a && a->kind == DSC_ATTR_BOOL && a->u.b;
}
dsc_dtype ir_attr_dtype(const ir_node *n, const char *key) {
  const dsc_attr *a = ir_attr(n, key);
  return a && a->kind == DSC_ATTR_DTYPE ? a->u.dt : DSC_F32;
}
const char *ir_attr_str(const ir_node *n, const char *key) {
  const dsc_attr *a = ir_attr(n, key);
  return a && a->kind == DSC_ATTR_STR ? a->u.s : "";
}
const int64_t *ir_attr_ints(const ir_node *n, const char *key, int *count) {
  const dsc_attr *a = ir_attr(n, key);
  if (!a || a->kind != DSC_ATTR_INTS) {
    *count = 0;
    return NULL;
  }
  *count = a->u.ints.n;
  return a->u.ints.v;
}

dsc_attr dsc_attr_int(const char *key, int64_t v) {
  dsc_attr a = {.key = key, .kind = DSC_ATTR_INT};
  a.u.i = v;
  return a;
}
dsc_attr dsc_attr_float(const char *key, double v) {
  dsc_attr a = {.key = key, .kind = DSC_ATTR_FLOAT};
  a.u.f = v;
  return a;
}
dsc_attr dsc_attr_bool(const char *key, int v) {
  dsc_attr a = {.key = key, .kind = DSC_ATTR_BOOL};
  a.u.b = v != 0;
  return a;
}
dsc_attr dsc_attr_ints(const char *key, const int64_t *v, int n) {
  dsc_attr a = {.key = key, .kind = DSC_ATTR_INTS};
  a.u.ints.v = v;
  a.u.ints.n = n;
  return a;
}
dsc_attr dsc_attr_dtype(const char *key, dsc_dtype v) {
  dsc_attr a = {.key = key, .kind = DSC_ATTR_DTYPE};
  a.u.dt = v;
  return a;
}
dsc_attr dsc_attr_str(const char *key, const char *v) {
  dsc_attr a = {.key = key, .kind = DSC_ATTR_STR};
  a.u.s = v;
  return a;
}
