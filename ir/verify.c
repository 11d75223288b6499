/* The verifier: checks a whole module and reports every problem it finds.
 *
 * It trusts nothing (modules may come from the text parser or from passes
 * that build nodes with ir_node_new_raw): pointers are checked before use
 * and a node's shape rule only runs once its inputs and attributes are
 * known to be well formed, so that one mistake gives one diagnostic. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "ir/ir.h"

typedef struct {
  const ir_module *m;
  int errors;
} verifier;

static const char *kind_name(dsc_attr_kind k) {
  switch (k) {
    case DSC_ATTR_INT:
      return "int";
    case DSC_ATTR_FLOAT:
      return "float";
    case DSC_ATTR_BOOL:
      return "bool";
    case DSC_ATTR_INTS:
      return "ints";
    case DSC_ATTR_DTYPE:
      return "dtype";
    case DSC_ATTR_STR:
      return "str";
  }
  return "invalid kind";
}

static void fmt_type(const dsc_type *t, char *buf, size_t n) {
  if ((unsigned)t->dtype >= DSC_DTYPE_COUNT || t->rank < 0 || t->rank > DSC_MAX_RANK)
    snprintf(buf, n, "<invalid type: dtype %d, rank %d>", (int)t->dtype, t->rank);
  else
    dsc_type_format(t, buf, n);
}

/* Why a type is not valid, or NULL: dtype known, rank <= 8, dims > 0. */
static const char *type_problem(const dsc_type *t) {
  if ((unsigned)t->dtype >= DSC_DTYPE_COUNT) return "has an invalid dtype";
  if (t->rank < 0 || t->rank > DSC_MAX_RANK) return "has a rank outside [0, 8]";
  for (int i = 0; i < t->rank; i++)
    if (t->dims[i] <= 0) return "has a dimension that is not positive";
  return NULL;
}

/* Reports a problem of node n (printed as %num or %name, as in the text
 * form): at the node's location when it has one, else naming the graph. */
static void node_error(verifier *v, const ir_graph *g, const ir_node *n, int num, const char *fmt,
                       ...) __attribute__((format(printf, 5, 6)));
static void node_error(verifier *v, const ir_graph *g, const ir_node *n, int num, const char *fmt,
                       ...) {
  char msg[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  v->errors++;
  const char *op = dsc_op_name(n->op);
  if (n->loc.file && n->loc.line > 0) {
    ir_error(v->m->ctx, n->loc, "%s: %s", op, msg);
  } else if (n->op == DSC_OP_INPUT && n->name) {
    ir_error(v->m->ctx, ir_no_loc, "graph %s, %%%s (%s): %s", g->name, n->name, op, msg);
  } else {
    ir_error(v->m->ctx, ir_no_loc, "graph %s, %%%d (%s): %s", g->name, num, op, msg);
  }
}

static void module_error(verifier *v, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void module_error(verifier *v, const char *fmt, ...) {
  char msg[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  v->errors++;
  ir_error(v->m->ctx, ir_no_loc, "%s", msg);
}

/* True when `in` is a node of g that comes before position `pos`. */
static bool defined_before(const ir_graph *g, const ir_node *in, int pos) {
  return in && in->graph == g && in->id >= 0 && in->id < pos && g->nodes[in->id] == in;
}

static bool in_graph(const ir_graph *g, const ir_node *n) {
  return n && n->graph == g && n->id >= 0 && n->id < g->n_nodes && g->nodes[n->id] == n;
}

/* Attributes must be exactly the op's spec: keys, order and kinds. */
static bool check_attrs(verifier *v, const ir_graph *g, const ir_node *n, int num) {
  const ir_op_info *info = ir_op(n->op);
  bool ok = true;
  if (n->n_attrs < 0 || (n->n_attrs > 0 && !n->attrs)) {
    node_error(v, g, n, num, "has a corrupt attribute list");
    return false;
  }
  for (int j = 0; j < n->n_attrs; j++) {
    const dsc_attr *a = &n->attrs[j];
    if (!a->key) {
      node_error(v, g, n, num, "attribute %d has no key", j);
      ok = false;
      continue;
    }
    int spec = -1;
    for (int k = 0; k < info->n_attrs; k++)
      if (strcmp(info->attr_keys[k], a->key) == 0) spec = k;
    bool dup = false;
    for (int i = 0; i < j; i++)
      if (n->attrs[i].key && strcmp(n->attrs[i].key, a->key) == 0) dup = true;
    if (dup) {
      node_error(v, g, n, num, "attribute '%s' is given twice", a->key);
      ok = false;
    } else if (spec < 0) {
      node_error(v, g, n, num, "unknown attribute '%s' (the op takes: %s)", a->key,
                 info->n_attrs ? info->attr_spec : "none");
      ok = false;
    } else if (a->kind != info->attr_kinds[spec]) {
      node_error(v, g, n, num, "attribute '%s' must be %s, not %s", a->key,
                 kind_name(info->attr_kinds[spec]), kind_name(a->kind));
      ok = false;
    } else if (spec != j) {
      node_error(v, g, n, num, "attribute '%s' is out of order (the order is: %s)", a->key,
                 info->attr_spec);
      ok = false;
    } else if ((a->kind == DSC_ATTR_DTYPE && (unsigned)a->u.dt >= DSC_DTYPE_COUNT) ||
               (a->kind == DSC_ATTR_STR && !a->u.s) ||
               (a->kind == DSC_ATTR_INTS && (a->u.ints.n < 0 || (a->u.ints.n && !a->u.ints.v)))) {
      node_error(v, g, n, num, "attribute '%s' has an invalid value", a->key);
      ok = false;
    }
  }
  for (int k = 0; k < info->n_attrs; k++) {
    bool found = false;
    for (int j = 0; j < n->n_attrs; j++)
      if (n->attrs[j].key && strcmp(n->attrs[j].key, info->attr_keys[k]) == 0) found = true;
    if (!found) {
      node_error(v, g, n, num, "missing attribute '%s' (%s)", info->attr_keys[k],
                 kind_name(info->attr_kinds[k]));
      ok = false;
    }
  }
  return ok;
}

bool ir_guard_may_skip(dsc_op op) {
  ir_cg_class c = ir_op(op)->cg;
  return c != IR_CG_SOURCE && c != IR_CG_COLLECTIVE && c != IR_CG_TIER;
}

const ir_node *ir_guard_root(const ir_node *c) {
  while ((c->op == DSC_OP_TO_HOST || c->op == DSC_OP_TO_DEVICE) && c->n_in == 1) c = c->in[0];
  return c;
}

const ir_node *ir_guard_kept_state(const ir_node *assign, bool *when) {
  if (assign->op != DSC_OP_ASSIGN || assign->n_in != 1 || assign->in[0]->op != DSC_OP_WHERE)
    return NULL;
  const ir_node *w = assign->in[0], *c = w->in[0];
  const char *name = ir_attr_str(assign, "name");
  if (c->type.dtype != DSC_BOOL || dsc_type_numel(&c->type) != 1 || !name) return NULL;
  for (int b = 1; b <= 2; b++) {
    const ir_node *s = w->in[b];
    const char *sn = s->op == DSC_OP_PARAM ? ir_attr_str(s, "name") : NULL;
    if (sn && strcmp(sn, name) == 0) {
      *when = b == 2; /* the other branch is the new value */
      return ir_guard_root(c);
    }
  }
  return NULL;
}

bool ir_guard_read_ok(const ir_node *x, const ir_node *y) {
  if (!x->guard) return true;
  const ir_node *c = ir_guard_root(x->guard);
  if (y->guard && ir_guard_root(y->guard) == c && y->guard_if == x->guard_if) return true;
  if (y->op != DSC_OP_WHERE || y->n_in != 3 || ir_guard_root(y->in[0]) != c) return false;
  int branch = x->guard_if ? 1 : 2;
  for (int q = 0; q < 3; q++)
    if (y->in[q] == x && q != branch) return false;
  return true;
}

const char *ir_guard_problem(const ir_node *n) {
  const ir_node *c = n->guard;
  if (!c) return NULL;
  const ir_graph *g = n->graph;
  if (!defined_before(g, c, n->id)) return "its guard is not a value defined before it";
  if (c->type.dtype != DSC_BOOL || dsc_type_numel(&c->type) != 1)
    return "its guard is not a bool scalar";
  if (!ir_guard_may_skip(n->op)) return "its op is never skipped, so it takes no guard";
  bool when;
  if (n->op == DSC_OP_ASSIGN &&
      (ir_guard_kept_state(n, &when) != ir_guard_root(c) || when != n->guard_if))
    return "an assign's guard must be the condition under which its where(...) changes the "
           "state";
  return NULL;
}

static void check_node(verifier *v, const ir_graph *g, const ir_node *n, int pos, int num) {
  if ((unsigned)n->op >= DSC_OP_COUNT) {
    node_error(v, g, n, num, "unknown op %d", (int)n->op);
    return;
  }
  const ir_op_info *info = ir_op(n->op);
  bool ok = true;
  if (n->graph != g || n->id != pos) {
    node_error(v, g, n, num, "is listed in graph '%s' but records another graph or position",
               g->name);
    ok = false;
  }
  const char *tp = type_problem(&n->type);
  if (tp) {
    char t[256];
    fmt_type(&n->type, t, sizeof t);
    node_error(v, g, n, num, "type %s %s", t, tp);
    ok = false;
  }
  if (n->op == DSC_OP_INPUT) {
    bool listed = false;
    for (int i = 0; i < g->n_inputs; i++)
      if (g->inputs[i] == n) listed = true;
    if (!listed) {
      node_error(v, g, n, num, "input node is not one of the graph's inputs");
      ok = false;
    }
    if (!n->name) {
      node_error(v, g, n, num, "input node has no name");
      ok = false;
    }
  }
  bool arity = info->n_inputs >= 0 ? n->n_in == info->n_inputs : n->n_in >= 1;
  if (!arity) {
    if (info->n_inputs >= 0)
      node_error(v, g, n, num, "takes %d input(s), got %d", info->n_inputs, n->n_in);
    else
      node_error(v, g, n, num, "takes at least 1 input, got %d", n->n_in);
    ok = false;
  }
  if (n->n_in > 0 && !n->in) {
    node_error(v, g, n, num, "has a corrupt input list");
    return;
  }
  bool inputs_ok = true;
  for (int j = 0; j < n->n_in; j++) {
    const ir_node *in = n->in[j];
    if (!in) {
      node_error(v, g, n, num, "input %d is missing (NULL)", j);
      inputs_ok = false;
    } else if (in->graph != g) {
      node_error(v, g, n, num, "input %d belongs to another graph", j);
      inputs_ok = false;
    } else if (!defined_before(g, in, pos)) {
      node_error(v, g, n, num, "input %d is used before it is defined", j);
      inputs_ok = false;
    } else if (type_problem(&in->type)) {
      inputs_ok = false; /* reported on the input itself */
    }
  }
  if (!check_attrs(v, g, n, num)) ok = false;
  if (!ok || !inputs_ok) return;
  const char *gp = ir_guard_problem(n);
  if (gp) {
    node_error(v, g, n, num, "%s", gp);
    return;
  }
  for (int j = 0; j < n->n_in; j++)
    if (!ir_guard_read_ok(n->in[j], n)) {
      node_error(v, g, n, num,
                 "input %d is computed only when its guard holds, and this node reads it "
                 "without that guard",
                 j);
      return;
    }
  if (n->op == DSC_OP_PARAM && !ir_module_param(v->m, ir_attr_str(n, "name"))) {
    node_error(v, g, n, num, "unknown parameter '%s'", ir_attr_str(n, "name"));
    return;
  }
  char err[512] = "";
  dsc_type t;
  memset(&t, 0, sizeof t);
  if (!info->shape(n, &t, err, sizeof err)) {
    node_error(v, g, n, num, "%s", err);
    return;
  }
  if (!dsc_type_equal(&t, &n->type)) {
    char have[256], want[256];
    fmt_type(&n->type, have, sizeof have);
    fmt_type(&t, want, sizeof want);
    node_error(v, g, n, num, "declared type %s differs from the inferred type %s", have, want);
  }
}

/* The initializer rules the frontend applies, for modules from anywhere. */
static const char *init_problem(const ir_param *p) {
  dsc_init in = p->init;
  bool is_float = dsc_dtype_is_float(p->type.dtype);
  switch (in.kind) {
    case DSC_INIT_NORMAL:
      if (!is_float) return "normal() initializes only float tensors";
      if (!isfinite(in.a) || !isfinite(in.b) || in.a < 0)
        return "normal(std, mean) needs a finite std >= 0 and a finite mean";
      return NULL;
    case DSC_INIT_UNIFORM:
      if (!is_float) return "uniform() initializes only float tensors";
      if (!isfinite(in.a) || !isfinite(in.b) || !(in.a < in.b))
        return "uniform(lo, hi) needs finite bounds with lo < hi";
      return NULL;
    case DSC_INIT_CONST:
      if (!isfinite(in.a)) return "const(v) needs a finite value";
      if (!is_float && in.a != trunc(in.a)) return "const(v) of an integer tensor needs an integer";
      if (p->type.dtype == DSC_BOOL && in.a != 0 && in.a != 1) return "const(v) of bool is 0 or 1";
      return NULL;
    default:
      return NULL;
  }
}

static void check_graph(verifier *v, const ir_graph *g) {
  const char *gname = g->name ? g->name : "?";
  if (g->module != v->m) module_error(v, "graph '%s' records another module", gname);
  if (g->n_nodes < 0 || (g->n_nodes > 0 && !g->nodes) || g->n_inputs < 0 ||
      (g->n_inputs > 0 && !g->inputs) || g->n_outputs < 0 || (g->n_outputs > 0 && !g->outputs)) {
    module_error(v, "graph '%s' has corrupt node, input or output lists", gname);
    return;
  }
  for (int i = 0; i < g->n_inputs; i++) {
    const ir_node *in = g->inputs[i];
    if (!in_graph(g, in) || in->op != DSC_OP_INPUT) {
      module_error(v, "graph '%s': input %d is not an input node of the graph", gname, i);
      continue;
    }
    for (int j = 0; j < i; j++)
      if (g->inputs[j] && g->inputs[j]->name && in->name &&
          strcmp(g->inputs[j]->name, in->name) == 0)
        module_error(v, "graph '%s' has two inputs named '%s'", gname, in->name);
  }
  int num = 0;
  for (int i = 0; i < g->n_nodes; i++) {
    const ir_node *n = g->nodes[i];
    if (!n) {
      module_error(v, "graph '%s': node %d is NULL", gname, i);
      continue;
    }
    check_node(v, g, n, i, num);
    /* Two assigns to one param or state in a step would race on a backend. */
    if (n->op == DSC_OP_ASSIGN && n->n_attrs == 1 && n->attrs[0].kind == DSC_ATTR_STR)
      for (int j = 0; j < i; j++) {
        const ir_node *o = g->nodes[j];
        if (o && o->op == DSC_OP_ASSIGN && o->n_attrs == 1 && o->attrs[0].kind == DSC_ATTR_STR &&
            strcmp(o->attrs[0].u.s, n->attrs[0].u.s) == 0) {
          node_error(v, g, n, num, "'%s' is assigned twice in one graph", n->attrs[0].u.s);
          break;
        }
      }
    if (n->op != DSC_OP_INPUT) num++;
  }
  const ir_node *r;
  int j, k;
  char tmsg[300];
  if (ir_find_tier_misuse(g, &r, tmsg, sizeof tmsg)) /* disk tier start/wait pairs */
    module_error(v, "graph '%s': node %%%d (%s): %s", gname, r->id, dsc_op_name(r->op), tmsg);
  if (ir_find_in_flight_read(g, &r, &j, &k)) {
    if (k < 0) {
      int rn = 0; /* r's number in the printed text: inputs are not numbered */
      for (int i = 0; i < r->id; i++) rn += g->nodes[i]->op != DSC_OP_INPUT;
      node_error(v, g, r, rn, "reads a %s whose data is in flight (only its wait may read it)",
                 ir_op(r->in[j]->op)->name);
    } else
      module_error(v, "graph '%s': output %d is a %s whose data is in flight; output its wait",
                   gname, k, ir_op(r->op)->name);
  }
  if (g->n_outputs < 1) module_error(v, "graph '%s' has no outputs", gname);
  for (int i = 0; i < g->n_outputs; i++)
    if (!in_graph(g, g->outputs[i]))
      module_error(v, "graph '%s': output %d is not a node of the graph", gname, i);
    else if (g->outputs[i]->guard)
      module_error(v, "graph '%s': output %d has a guard (an output is always computed)", gname,
                   i);
  /* one kernel per group: its members run or are skipped together */
  for (int i = 1; i < g->n_nodes; i++) {
    const ir_node *a = g->nodes[i - 1], *b = g->nodes[i];
    if (a && b && a->group > 0 && a->group == b->group &&
        ((a->guard ? ir_guard_root(a->guard) : NULL) != (b->guard ? ir_guard_root(b->guard) : NULL) ||
         a->guard_if != b->guard_if))
      module_error(v, "graph '%s': fusion group %d mixes nodes with different guards", gname,
                   a->group);
  }
}

dsc_status dsc_module_verify(const dsc_module *m) {
  if (!m) return DSC_ERR_INTERNAL;
  verifier v = {.m = m};
  for (int i = 0; i < m->n_params; i++) {
    const ir_param *p = &m->params[i];
    if (!p->name || !*p->name) {
      module_error(&v, "parameter %d has no name", i);
      continue;
    }
    const char *tp = type_problem(&p->type);
    if (tp) {
      char t[256];
      fmt_type(&p->type, t, sizeof t);
      module_error(&v, "parameter '%s': type %s %s", p->name, t, tp);
    }
    if ((unsigned)p->init.kind > DSC_INIT_COPY)
      module_error(&v, "parameter '%s' has an invalid initializer kind %d", p->name,
                   (int)p->init.kind);
    const char *ip = init_problem(p);
    if (ip) module_error(&v, "parameter '%s': %s", p->name, ip);
    if (p->init.kind == DSC_INIT_COPY) {
      const ir_param *src = ir_module_param(m, p->init.from);
      if (!src || src == p || src->init.kind == DSC_INIT_COPY)
        module_error(&v, "parameter '%s': copy(%s) names no other parameter with its own initializer",
                     p->name, p->init.from ? p->init.from : "");
      else if (!dsc_dtype_is_float(p->type.dtype) || !dsc_dtype_is_float(src->type.dtype))
        module_error(&v, "parameter '%s': copy() copies only float tensors", p->name);
    }
    for (int j = 0; j < i; j++)
      if (m->params[j].name && strcmp(m->params[j].name, p->name) == 0) {
        module_error(&v, "parameter '%s' is declared twice", p->name);
        break;
      }
  }
  for (int i = 0; i < m->n_graphs; i++) {
    const ir_graph *g = m->graphs[i];
    if (!g) {
      module_error(&v, "graph %d is NULL", i);
      continue;
    }
    if (!g->name) module_error(&v, "graph %d has no name", i);
    for (int j = 0; j < i && g->name; j++)
      if (m->graphs[j] && m->graphs[j]->name && strcmp(m->graphs[j]->name, g->name) == 0) {
        module_error(&v, "graph '%s' is defined twice", g->name);
        break;
      }
    check_graph(&v, g);
  }
  return v.errors ? DSC_ERR_USER : DSC_OK;
}
