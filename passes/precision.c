/* The precision pass: mixed-precision training (bf16 or fp16 compute with
 * f32 master weights), as DeepSpeed and PyTorch's autocast do it. Runs on
 * graph "forward" before autodiff; with f32 it does nothing.
 *
 * Master weights (cfg->master_weights, the default): every trainable f32
 * param is held in the low dtype from here on, and state opt.master.<p>
 * (f32, init copy(p)) is the optimizer's copy (pass optimizer updates it and
 * writes p = its rounding; the zero pass shards it with the moments). A
 * param read then is a low-precision value, cast up where an f32 op reads
 * it, and autodiff's gradients arrive in the low dtype: the ZeRO paper's
 * 2 + 2 + 12 bytes per param. Without (autocast), params stay f32:
 *
 * The forward graph is rebuilt node by node into a new graph that replaces
 * it (same name, inputs and outputs). Every f32 value gets a dtype from the
 * op that consumes it:
 *   - f32 ops (numerically sensitive, as autocast's fp32 list): layernorm,
 *     rmsnorm, softmax, log_softmax, cross_entropy, sum, mean, exp, log,
 *     pow, rsqrt, the comparisons, and assign;
 *   - every other op (matmul, attention, embedding, elementwise, layout,
 *     max) runs in the low dtype, except on integer-valued chains: what
 *     feeds a cast to an integer or a comparison stays f32 (mark_exact).
 * A value is cast on demand, once per dtype (casts are shared by all
 * consumers), so an f32 param read stays f32 and is followed by a cast to
 * the low dtype where a low op reads it (norm weights are read in f32
 * directly); an f32 const is rebuilt in the dtype asked for instead of cast.
 * Values of other dtypes (ints, bool, f64) are untouched, as are `cast`
 * inputs. The outputs are cast back to their f32 types: the loss stays f32.
 * Autodiff then differentiates through the casts (the gradient of a cast is
 * the cast back), so the params' gradients arrive in their dtype: f32
 * without master weights (the optimizer and its f32 states unchanged), the
 * low dtype with them.
 *
 * fp16 also creates the state opt.loss_scale (f32[], 2^initial_scale_power)
 * and makes the forward return loss * opt.loss_scale, so that the backward
 * pass runs on the scaled loss; the optimizer pass unscales the gradients
 * and owns the rest of dynamic loss scaling (docs/training.md). */
#include <math.h>
#include <string.h>

#include "passes/passes.h"

typedef struct {
  ir_module *m;
  ir_graph *g;       /* the new graph */
  const ir_graph *f; /* the forward graph being rebuilt */
  dsc_dtype low;
  ir_node **map;             /* [f->n_nodes] clone in its natural dtype; NULL: f32 const */
  ir_node **as_f32, **as_lo; /* [f->n_nodes] the value as f32 / as the low dtype */
  bool *held_low;            /* [f->n_nodes] a param read of a param now held in `low` */
  bool *exact;               /* [f->n_nodes] an integer-valued f32 value: computed in f32 */
} prec_state;

/* Ops that read their f32 inputs in f32 (their result is f32 too). */
static bool runs_in_f32(dsc_op op) {
  switch (op) {
    case DSC_OP_LAYERNORM:
    case DSC_OP_RMSNORM:
    case DSC_OP_SOFTMAX:
    case DSC_OP_LOG_SOFTMAX:
    case DSC_OP_CROSS_ENTROPY:
    case DSC_OP_SUM:
    case DSC_OP_MEAN:
    case DSC_OP_EXP:
    case DSC_OP_LOG:
    case DSC_OP_POW:
    case DSC_OP_RSQRT:
    case DSC_OP_LESS:    /* comparisons: exact on values already rounded, */
    case DSC_OP_GREATER: /* and exact on f32 sources (iota, inputs)       */
    case DSC_OP_EQUAL:
    case DSC_OP_ASSIGN: /* writes an f32 param or state */
      return true;
    default:
      return false;
  }
}

/* Ops whose f32 result is not an integer count even when their inputs are:
 * exactness stops at them (they run in f32 or read floats by design). */
static bool ends_exactness(dsc_op op) {
  return op == DSC_OP_SOFTMAX || op == DSC_OP_LOG_SOFTMAX || op == DSC_OP_LAYERNORM ||
         op == DSC_OP_RMSNORM || op == DSC_OP_CROSS_ENTROPY || op == DSC_OP_ATTENTION;
}

/* The f32 values that feed a cast to an integer (an index) or a comparison
 * (a mask): counts and indices built from one-hot masks by matmuls and
 * sums (the MoE router's slots, examples/lib/moe.dsm) must be exact, and
 * bf16 holds integers exactly only up to 256. They are computed in f32,
 * as DeepSpeed's gate computes in f32; the low dtype stays for the rest. */
static void mark_exact(prec_state *s) {
  const ir_graph *f = s->f;
  for (int i = f->n_nodes - 1; i >= 0; i--) {
    const ir_node *u = f->nodes[i];
    bool to_int = u->op == DSC_OP_CAST && !dsc_dtype_is_float(u->type.dtype);
    bool compare = u->op == DSC_OP_LESS || u->op == DSC_OP_GREATER || u->op == DSC_OP_EQUAL;
    if (!(to_int || compare || s->exact[i]) || ends_exactness(u->op)) continue;
    for (int j = 0; j < u->n_in; j++)
      if (u->in[j]->type.dtype == DSC_F32) s->exact[u->in[j]->id] = true;
  }
}

/* The natural dtype of the clone of f32 node n (consts are made on demand). */
static dsc_dtype natural(const prec_state *s, const ir_node *n) {
  return s->map[n->id] ? s->map[n->id]->type.dtype : n->type.dtype;
}

/* Forward node n's clone as dtype dt (only f32 values change dtype). */
static ir_node *value_as(prec_state *s, const ir_node *n, dsc_dtype dt) {
  if (n->type.dtype != DSC_F32) return s->map[n->id];
  ir_node **slot = dt == DSC_F32 ? &s->as_f32[n->id] : &s->as_lo[n->id];
  if (*slot) return *slot;
  dsc_loc saved = s->g->cur_loc;
  dsc_graph_set_loc(s->g, n->loc); /* the cast belongs to the value it converts */
  if (n->op == DSC_OP_CONST) {
    dsc_type t = n->type;
    t.dtype = dt;
    *slot = dsc_const(s->g, ir_attr_float(n, "value"), t);
  } else {
    ir_node *v = s->map[n->id];
    *slot = v->type.dtype == dt ? v : dsc_cast(s->g, v, dt);
  }
  dsc_graph_set_loc(s->g, saved);
  return *slot;
}

static bool oom(ir_module *m) {
  ir_error(m->ctx, ir_no_loc, "out of memory in the precision pass");
  return false;
}

/* Appends the low-precision copy of s->f to s->g; outs receives the
 * outputs (f->n_outputs entries). */
static bool rebuild(prec_state *s, ir_node **outs) {
  const ir_graph *f = s->f;
  ir_graph *g = s->g;
  for (int i = 0; i < f->n_nodes; i++) {
    const ir_node *n = f->nodes[i];
    dsc_graph_set_loc(g, n->loc);
    if (n->op == DSC_OP_INPUT) {
      if (!(s->map[i] = dsc_graph_input(g, n->name, n->type))) return false;
      continue;
    }
    if (n->op == DSC_OP_CONST && n->type.dtype == DSC_F32) continue; /* made per dtype */
    if (n->op == DSC_OP_PARAM && s->held_low[i]) { /* held in the low dtype now */
      if (!(s->map[i] = dsc_param_ref(g, ir_attr_str(n, "name")))) return false;
      continue;
    }
    ir_node *small[8], **in = small;
    if (n->n_in > 8 && !(in = ir_arena_alloc(&s->m->arena, sizeof(ir_node *) * (size_t)n->n_in)))
      return oom(s->m);
    dsc_dtype want = runs_in_f32(n->op) || s->exact[i] ? DSC_F32 : s->low;
    for (int j = 0; j < n->n_in; j++) {
      const ir_node *x = n->in[j];
      bool keep = n->op == DSC_OP_CAST || x->type.dtype != DSC_F32;
      if (!(in[j] = value_as(s, x, keep ? natural(s, x) : want))) return false;
    }
    if (!(s->map[i] = dsc_build(g, n->op, in, n->n_in, n->attrs, n->n_attrs))) return false;
  }
  for (int k = 0; k < f->n_outputs; k++)
    if (!(outs[k] = value_as(s, f->outputs[k], f->outputs[k]->type.dtype))) return false;
  return true;
}

bool pass_precision_check_fp16(ir_module *m, const dsc_train_config *cfg) {
  const char *what = NULL;
  if (cfg->fp16.initial_scale_power < 0 || cfg->fp16.initial_scale_power > 126)
    what = "initial_scale_power must be in [0, 126] (2^power must fit in f32)";
  else if (cfg->fp16.loss_scale_window < 1)
    what = "loss_scale_window must be at least 1";
  else if (cfg->fp16.hysteresis < 1)
    what = "hysteresis must be at least 1";
  else if (!(cfg->fp16.min_loss_scale > 0) || isinf(cfg->fp16.min_loss_scale))
    what = "min_loss_scale must be a positive number";
  if (what) ir_error(m->ctx, ir_no_loc, "precision fp16: %s", what);
  return what == NULL;
}

/* Master weights: every trainable f32 param is held in the low dtype from
 * now on, and state opt.master.<p> (f32, initial value copy(p): the low
 * value, exactly, as DeepSpeed's fp32 partition cloned from the bf16
 * params) is the optimizer's copy that the update reads and writes.
 * held[p] marks the params changed. Graphs other than `forward` must not
 * read them (their param nodes would keep the f32 type). */
static bool hold_params_low(ir_module *m, const ir_graph *f, dsc_dtype low, bool *held) {
  for (int p = 0; p < m->n_params; p++) {
    ir_param *pa = &m->params[p];
    held[p] = !pa->state && pa->type.dtype == DSC_F32;
    if (!held[p]) continue;
    const char *name = ir_arena_printf(&m->arena, "opt.master.%s", pa->name);
    if (!name) return oom(m);
    if (dsc_module_find_param(m, name) >= 0) {
      ir_error(m->ctx, ir_no_loc, "precision: the module already has '%s'", name);
      return false;
    }
  }
  for (int gi = 0; gi < m->n_graphs; gi++) {
    const ir_graph *o = m->graphs[gi];
    for (int i = 0; o != f && i < o->n_nodes; i++) {
      if (o->nodes[i]->op != DSC_OP_PARAM) continue;
      int p = dsc_module_find_param(m, ir_attr_str(o->nodes[i], "name"));
      if (p >= 0 && held[p]) {
        ir_error(m->ctx, ir_no_loc,
                 "precision: graph '%s' reads '%s', which master weights hold in %s; run it "
                 "from a module without the training passes, or set master_weights false",
                 o->name, m->params[p].name, dsc_dtype_name(low));
        return false;
      }
    }
  }
  int n = m->n_params;
  for (int p = 0; p < n; p++) {
    if (!held[p]) continue;
    dsc_type t = m->params[p].type;
    dsc_init copy = {DSC_INIT_COPY, 0, 0, m->params[p].name};
    const char *name = ir_arena_printf(&m->arena, "opt.master.%s", m->params[p].name);
    if (!name || dsc_module_add_state(m, name, t, copy) != DSC_OK) return false;
    m->params[p].type.dtype = low; /* after add_state: m->params may have moved */
  }
  return true;
}

/* Puts graph `g` (created last) in the place of `f` and gives it f's name. */
static void replace_graph(ir_module *m, ir_graph *f, ir_graph *g) {
  for (int i = 0; i < m->n_graphs; i++)
    if (m->graphs[i] == f) m->graphs[i] = g;
  m->n_graphs--; /* g's own slot, the last */
  g->name = f->name;
}

dsc_status pass_precision_run(ir_module *m, const dsc_train_config *cfg) {
  if (!cfg || cfg->precision == DSC_PRECISION_F32) return DSC_OK;
  if (cfg->precision != DSC_PRECISION_BF16 && cfg->precision != DSC_PRECISION_FP16) {
    ir_error(m->ctx, ir_no_loc, "precision: unknown precision %d", (int)cfg->precision);
    return DSC_ERR_USER;
  }
  bool fp16 = cfg->precision == DSC_PRECISION_FP16;
  if (fp16 && !pass_precision_check_fp16(m, cfg)) return DSC_ERR_USER;
  ir_graph *f = dsc_module_find_graph(m, "forward");
  if (!f) {
    ir_error(m->ctx, ir_no_loc, "precision: the module has no graph 'forward'");
    return DSC_ERR_USER;
  }
  if (f->n_outputs != 1) {
    ir_error(m->ctx, ir_no_loc,
             "precision: graph 'forward' must have exactly one output (the loss), it has %d "
             "(the pass runs before autodiff)",
             f->n_outputs);
    return DSC_ERR_USER;
  }
  if (fp16 && dsc_module_find_param(m, "opt.loss_scale") >= 0) {
    ir_error(m->ctx, ir_no_loc, "precision: the module already has 'opt.loss_scale'");
    return DSC_ERR_USER;
  }
  prec_state s;
  memset(&s, 0, sizeof s);
  s.m = m;
  s.f = f;
  s.low = fp16 ? DSC_F16 : DSC_BF16;
  size_t sz = sizeof(ir_node *) * (size_t)(f->n_nodes ? f->n_nodes : 1);
  s.map = ir_arena_alloc(&m->arena, sz);
  s.as_f32 = ir_arena_alloc(&m->arena, sz);
  s.as_lo = ir_arena_alloc(&m->arena, sz);
  s.held_low = ir_arena_alloc(&m->arena, sizeof(bool) * (size_t)(f->n_nodes + 1));
  s.exact = ir_arena_alloc(&m->arena, sizeof(bool) * (size_t)(f->n_nodes + 1));
  bool *held = ir_arena_alloc(&m->arena, sizeof(bool) * (size_t)(m->n_params + 1));
  if (!s.map || !s.as_f32 || !s.as_lo || !s.held_low || !s.exact || !held)
    return oom(m), DSC_ERR_INTERNAL;
  memset(s.held_low, 0, sizeof(bool) * (size_t)(f->n_nodes + 1));
  memset(s.exact, 0, sizeof(bool) * (size_t)(f->n_nodes + 1));
  mark_exact(&s);
  if (cfg->master_weights) {
    if (!hold_params_low(m, f, s.low, held)) return DSC_ERR_USER;
    for (int i = 0; i < f->n_nodes; i++) {
      const ir_node *n = f->nodes[i];
      int p = n->op == DSC_OP_PARAM ? dsc_module_find_param(m, ir_attr_str(n, "name")) : -1;
      s.held_low[i] = p >= 0 && held[p];
    }
  }
  const char *tmp = "forward.precision";
  if (!(s.g = dsc_graph_new(m, tmp))) return DSC_ERR_INTERNAL;
  ir_node *loss = NULL;
  bool ok = rebuild(&s, &loss);
  if (ok && fp16) {
    /* the backward pass runs on loss * scale; the scale is a power of two,
     * so the optimizer's division gives back the loss exactly */
    dsc_init init = {DSC_INIT_CONST, ldexp(1.0, (int)cfg->fp16.initial_scale_power), 0, NULL};
    dsc_graph_set_loc(s.g, loss->loc);
    ok = dsc_module_add_state(m, "opt.loss_scale", dsc_type_make(DSC_F32, 0, NULL), init) == DSC_OK;
    ir_node *scale = ok ? dsc_param_ref(s.g, "opt.loss_scale") : NULL;
    if (scale && loss->type.dtype != DSC_F32) scale = dsc_cast(s.g, scale, loss->type.dtype);
    ok = ok && (loss = dsc_binary(s.g, DSC_OP_MUL, loss, scale)) != NULL;
  }
  ok = ok && dsc_graph_set_outputs(s.g, &loss, 1) == DSC_OK;
  if (!ok) {
    pass_remove_graph(m, tmp);
    if (dsc_error_count(m->ctx) == 0)
      ir_error(m->ctx, ir_no_loc, "precision: could not rebuild graph 'forward'");
    return DSC_ERR_USER;
  }
  replace_graph(m, f, s.g);
  return DSC_OK;
}
