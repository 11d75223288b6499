/* The optimizer pass: turns the differentiated graph "forward" into the
 * training-step graph "train_step" (contract: include/dsc/train.h, formulas:
 * docs/training.md).
 *
 * 1. inputs: the forward inputs (one micro-batch), then lr;
 * 2. inline a copy of the differentiated forward graph; its loss (role
 *    IR_ROLE_LOSS) and gradients (IR_ROLE_GRAD) are the micro-batch's;
 * 3. with grad_accum K > 1 pass "accumulate" later splits the graph into
 *    "micro_step", run K times (the gradients and the loss summed x 1/K
 *    into accumulation states), and this graph's optimizer part, which
 *    reads the sums; the steps below are written for one micro-batch;
 * 4. grad_norm = sqrt(sum over params of sum(g*g)); clipping scales every
 *    gradient by clip / maximum(grad_norm, clip);
 * 5. the update of each param (adamw, sgd or muon) from states created
 *    here, all written back with `assign` at the end of the graph;
 * 6. outputs [loss, grad_norm]; graph "forward" is removed.
 * With precision fp16 the forward returns loss * opt.loss_scale (precision
 * pass): the averaged loss and gradients are divided by the scale before
 * 4., every assign keeps the old value when a gradient is not finite (the
 * step is skipped), the scale states are updated (DeepSpeed's dynamic loss
 * scaler) and a third output `skipped` is added.
 * With offload.delayed_update (ZeRO-Offload's delayed parameter update)
 * steps 4 and 5 read the previous step's gradients, states
 * "opt.delayed.<param>", and this step's are assigned to them: the update
 * depends on no gradient of this step, so it may run beside the backward.
 * State "opt.delayed_primed" is 0 until the first step has stored its
 * gradients; that step assigns every other value its old one (the update
 * and opt.step are skipped). The grad_norm output is this step's.
 * With zenflow (docs/memory.md "ZenFlow") each 2-D param's selected
 * columns get AdamW every step with states opt.zf.m/v.<param> on the
 * device; every gradient is summed into opt.zf.acc.<param> and the plain
 * update runs on the mean of the sums every update_interval steps (its
 * assigns and opt.step keep their old values on the other steps). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "passes/passes.h"

typedef struct {
  const char *name;
  ir_node *value;
} opt_assign;

typedef struct {
  ir_module *m;
  ir_graph *g;
  const dsc_train_config *cfg;
  ir_node *lr;                                          /* the f32[] input */
  ir_node *t;                                           /* steps taken including this one, f32[] */
  ir_node *lr_dt[DSC_DTYPE_COUNT];                      /* lr cast to each param dtype */
  ir_node *bc1[DSC_DTYPE_COUNT], *bc2[DSC_DTYPE_COUNT]; /* adam bias corrections */
  opt_assign *assigns;
  int n_assigns, cap_assigns;
} opt_state;

static ir_node *scalar(opt_state *o, double v, dsc_dtype dt) {
  return dsc_const(o->g, v, dsc_type_make(dt, 0, NULL));
}
static ir_node *add(opt_state *o, ir_node *a, ir_node *b) {
  return dsc_binary(o->g, DSC_OP_ADD, a, b);
}
static ir_node *sub(opt_state *o, ir_node *a, ir_node *b) {
  return dsc_binary(o->g, DSC_OP_SUB, a, b);
}
static ir_node *mul(opt_state *o, ir_node *a, ir_node *b) {
  return dsc_binary(o->g, DSC_OP_MUL, a, b);
}
static ir_node *divide(opt_state *o, ir_node *a, ir_node *b) {
  return dsc_binary(o->g, DSC_OP_DIV, a, b);
}
/* x * c for a compile-time constant c. */
static ir_node *scale(opt_state *o, ir_node *x, double c) {
  return x ? mul(o, scalar(o, c, x->type.dtype), x) : NULL;
}
static ir_node *as_dtype(opt_state *o, ir_node *x, dsc_dtype dt) {
  return !x || x->type.dtype == dt ? x : dsc_cast(o->g, x, dt);
}
static ir_node *transpose(opt_state *o, ir_node *x) {
  static const int64_t perm[2] = {1, 0};
  return dsc_permute(o->g, x, perm, 2);
}
/* sum of all elements, rank 0 */
static ir_node *sum_all(opt_state *o, ir_node *x) {
  int64_t axes[DSC_MAX_RANK];
  for (int i = 0; i < x->type.rank; i++) axes[i] = i;
  return dsc_reduce(o->g, DSC_OP_SUM, x, axes, x->type.rank, 0);
}

/* sqrt(sum over the gradients acc[1..n) of sum(g*g)), f32[] (0 without any) */
static ir_node *global_norm(opt_state *o, ir_node *const *acc, int n) {
  ir_node *sumsq = NULL;
  for (int j = 1; j < n; j++) {
    ir_node *s = as_dtype(o, sum_all(o, mul(o, acc[j], acc[j])), DSC_F32);
    sumsq = sumsq ? add(o, sumsq, s) : s;
  }
  return sumsq ? dsc_unary(o->g, DSC_OP_SQRT, sumsq) : scalar(o, 0, DSC_F32);
}

static ir_node *lr_of(opt_state *o, dsc_dtype dt) {
  if (!o->lr_dt[dt]) o->lr_dt[dt] = as_dtype(o, o->lr, dt);
  return o->lr_dt[dt];
}

static bool add_assign(opt_state *o, const char *name, ir_node *value) {
  if (!value) return false;
  if (!ir_grow(&o->m->arena, (void **)&o->assigns, &o->cap_assigns, o->n_assigns + 1,
               sizeof(opt_assign)))
    return ir_error(o->m->ctx, ir_no_loc, "out of memory in the optimizer pass"), false;
  o->assigns[o->n_assigns].name = name;
  o->assigns[o->n_assigns++].value = value;
  return true;
}

/* Creates state "opt.<what>.<param>" (zeros, the param's type); returns its
 * name in the arena or NULL. */
static const char *new_state(opt_state *o, const char *what, const char *param, dsc_type t) {
  const char *name = ir_arena_printf(&o->m->arena, "opt.%s.%s", what, param);
  if (!name) return ir_error(o->m->ctx, ir_no_loc, "out of memory in the optimizer pass"), NULL;
  dsc_init zeros = {DSC_INIT_ZEROS, 0, 0, NULL};
  return dsc_module_add_state(o->m, name, t, zeros) == DSC_OK ? name : NULL;
}

/* 1 - beta^t as 1 - exp(t * ln(beta)), so the graph needs no pow with a
 * tensor exponent; ln(0) = -inf gives exp(-inf) = 0, i.e. no correction. */
static ir_node *bias_correction_at(opt_state *o, ir_node *count, double beta, dsc_dtype dt) {
  ir_node *t = as_dtype(o, count, dt);
  return sub(o, scalar(o, 1, dt), dsc_unary(o->g, DSC_OP_EXP, scale(o, t, log(beta))));
}

/* AdamW (PyTorch semantics, decoupled weight decay) from moments m0, v0:
 *   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
 *   p = p (1 - lr wd) - lr (m / bc1) / (sqrt(v / bc2) + eps) */
static ir_node *adamw_math(opt_state *o, ir_node *p, ir_node *g, ir_node *m0, ir_node *v0,
                           ir_node *bc1, ir_node *bc2, ir_node *lr, bool decay, ir_node **m1,
                           ir_node **v1) {
  const dsc_train_config *c = o->cfg;
  dsc_dtype dt = p->type.dtype;
  *m1 = add(o, scale(o, m0, c->opt.beta1), scale(o, g, 1 - c->opt.beta1));
  *v1 = add(o, scale(o, v0, c->opt.beta2), scale(o, mul(o, g, g), 1 - c->opt.beta2));
  ir_node *mhat = divide(o, *m1, bc1);
  ir_node *denom =
      add(o, dsc_unary(o->g, DSC_OP_SQRT, divide(o, *v1, bc2)), scalar(o, c->opt.eps, dt));
  ir_node *step = mul(o, lr, divide(o, mhat, denom));
  if (decay) /* p * (1 - lr wd), as torch.optim.AdamW */
    p = mul(o, p, sub(o, scalar(o, 1, dt), scale(o, lr, c->opt.weight_decay)));
  return sub(o, p, step);
}

/* AdamW with states opt.m.<p>, opt.v.<p> and the step count opt.step. */
static ir_node *adamw_update(opt_state *o, const char *pname, ir_node *p, ir_node *g, ir_node *lr,
                             bool decay) {
  const dsc_train_config *c = o->cfg;
  dsc_type pt = p->type;
  dsc_dtype dt = pt.dtype;
  const char *mn = new_state(o, "m", pname, pt), *vn = new_state(o, "v", pname, pt);
  if (!mn || !vn) return NULL;
  if (!o->bc1[dt]) {
    o->bc1[dt] = bias_correction_at(o, o->t, c->opt.beta1, dt);
    o->bc2[dt] = bias_correction_at(o, o->t, c->opt.beta2, dt);
  }
  ir_node *m1, *v1;
  ir_node *np = adamw_math(o, p, g, dsc_param_ref(o->g, mn), dsc_param_ref(o->g, vn), o->bc1[dt],
                           o->bc2[dt], lr, decay, &m1, &v1);
  if (!add_assign(o, mn, m1) || !add_assign(o, vn, v1)) return NULL;
  return np;
}

/* SGD with momentum (PyTorch semantics, dampening 0):
 *   g' = g + wd p;  buf = mu buf + g';  p -= lr (nesterov ? g' + mu buf : buf) */
static ir_node *sgd_update(opt_state *o, const char *pname, ir_node *p, ir_node *g, ir_node *lr,
                           bool decay) {
  const dsc_train_config *c = o->cfg;
  if (decay) g = add(o, g, scale(o, p, c->opt.weight_decay));
  ir_node *u = g;
  if (c->opt.momentum > 0) {
    const char *bn = new_state(o, "momentum", pname, p->type);
    if (!bn) return NULL;
    /* buf starts at zero, so the first step gives buf = g' as torch does */
    ir_node *buf = add(o, scale(o, dsc_param_ref(o->g, bn), c->opt.momentum), g);
    if (!add_assign(o, bn, buf)) return NULL;
    u = c->opt.nesterov ? add(o, g, scale(o, buf, c->opt.momentum)) : buf;
  }
  return sub(o, p, mul(o, lr, u));
}

/* Muon for a 2-D weight: momentum, then the update orthogonalised by five
 * quintic Newton-Schulz iterations (Keller Jordan's coefficients), on the
 * transpose when rows > cols so that X X^T is the smaller Gram matrix. */
static ir_node *muon_update(opt_state *o, const char *pname, ir_node *p, ir_node *g, ir_node *lr) {
  const dsc_train_config *c = o->cfg;
  dsc_dtype dt = p->type.dtype;
  int64_t rows = p->type.dims[0], cols = p->type.dims[1];
  const char *bn = new_state(o, "momentum", pname, p->type);
  if (!bn) return NULL;
  ir_node *buf = add(o, scale(o, dsc_param_ref(o->g, bn), c->opt.momentum), g);
  if (!add_assign(o, bn, buf)) return NULL;
  ir_node *u = c->opt.nesterov ? add(o, g, scale(o, buf, c->opt.momentum)) : buf;
  ir_node *norm = dsc_unary(o->g, DSC_OP_SQRT, sum_all(o, mul(o, u, u)));
  ir_node *x = divide(o, u, add(o, norm, scalar(o, 1e-7, dt)));
  bool tall = rows > cols;
  if (tall) x = transpose(o, x);
  const double a = 3.4445, b = -4.7750, cc = 2.0315;
  for (int it = 0; it < 5; it++) {
    ir_node *gram = dsc_matmul(o->g, x, transpose(o, x));
    ir_node *poly = add(o, scale(o, gram, b), scale(o, dsc_matmul(o->g, gram, gram), cc));
    x = add(o, scale(o, x, a), dsc_matmul(o->g, poly, x));
  }
  if (tall) x = transpose(o, x);
  double shape_scale = sqrt(fmax(1.0, (double)rows / (double)cols));
  if (c->opt.weight_decay > 0)
    p = mul(o, p, sub(o, scalar(o, 1, dt), scale(o, lr, c->opt.weight_decay)));
  return sub(o, p, mul(o, scale(o, lr, shape_scale), x));
}

/* Params read as the table of an `embedding` (Muon leaves them to AdamW). */
static bool *embedding_tables(ir_module *m, const ir_graph *f) {
  bool *emb = ir_arena_alloc(&m->arena, sizeof(bool) * (size_t)(m->n_params + 1));
  if (!emb) return NULL;
  for (int i = 0; i < f->n_nodes; i++) {
    const ir_node *n = f->nodes[i];
    if (n->op != DSC_OP_EMBEDDING || n->in[0]->op != DSC_OP_PARAM) continue;
    int p = dsc_module_find_param(m, ir_attr_str(n->in[0], "name"));
    if (p >= 0) emb[p] = true;
  }
  return emb;
}

/* Checks that f is differentiated: [loss, one gradient per trainable param]. */
static bool check_forward(ir_module *m, const ir_graph *f) {
  int n_train = 0;
  for (int p = 0; p < m->n_params; p++) {
    if (m->params[p].state) continue;
    if (!dsc_dtype_is_float(m->params[p].type.dtype)) {
      ir_error(m->ctx, ir_no_loc, "optimizer: trainable parameter '%s' is not a float tensor",
               m->params[p].name);
      return false;
    }
    n_train++;
  }
  bool ok = f->n_outputs == 1 + n_train && f->outputs[0]->type.rank == 0 &&
            dsc_dtype_is_float(f->outputs[0]->type.dtype);
  for (int p = 0, k = 1; ok && p < m->n_params; p++)
    if (!m->params[p].state) ok = dsc_type_equal(&f->outputs[k++]->type, &m->params[p].type);
  if (!ok)
    ir_error(m->ctx, ir_no_loc,
             "optimizer: graph 'forward' must output [loss, gradient of each of the %d trainable "
             "parameters] (run autodiff first); it has %d output(s)",
             n_train, f->n_outputs);
  return ok;
}

static ir_node *where(opt_state *o, ir_node *c, ir_node *a, ir_node *b) {
  ir_node *in[3] = {c, a, b};
  return dsc_build(o->g, DSC_OP_WHERE, in, 3, NULL, 0);
}

/* DeepSpeed's DynamicLossScaler (scale_factor 2, consecutive_hysteresis
 * off), with hl = opt.hysteresis_left and good = opt.good_steps:
 *   overflow: hl <= 1 ? scale = max(scale / 2, min_loss_scale) : hl -= 1;
 *             good = 0
 *   else:     good += 1; good == window ? (scale *= 2, hl = hysteresis,
 *             good = 0)
 * Appended to the assigns (not guarded by `finite`). */
static bool loss_scale_update(opt_state *o, ir_node *finite) {
  const dsc_train_config *c = o->cfg;
  ir_node *ls = dsc_param_ref(o->g, "opt.loss_scale");
  ir_node *hl = dsc_param_ref(o->g, "opt.hysteresis_left");
  ir_node *good = dsc_param_ref(o->g, "opt.good_steps");
  ir_node *f1 = scalar(o, 1, DSC_F32), *f0 = scalar(o, 0, DSC_F32);
  /* overflow */
  ir_node *shrink = dsc_binary(o->g, DSC_OP_LESS, hl, scalar(o, 1.5, DSC_F32));
  ir_node *halved = dsc_binary(o->g, DSC_OP_MAXIMUM, scale(o, ls, 0.5),
                               scalar(o, c->fp16.min_loss_scale, DSC_F32));
  ir_node *ls_over = where(o, shrink, halved, ls);
  ir_node *hl_over = dsc_binary(o->g, DSC_OP_MAXIMUM, sub(o, hl, f1), f1);
  /* good step */
  ir_node *good1 = add(o, good, f1);
  ir_node *grow = dsc_binary(o->g, DSC_OP_GREATER, good1,
                             scalar(o, (double)c->fp16.loss_scale_window - 0.5, DSC_F32));
  ir_node *ls_good = where(o, grow, scale(o, ls, 2), ls);
  ir_node *hl_good = where(o, grow, scalar(o, (double)c->fp16.hysteresis, DSC_F32), hl);
  ir_node *good_good = where(o, grow, f0, good1);
  return add_assign(o, "opt.loss_scale", where(o, finite, ls_good, ls_over)) &&
         add_assign(o, "opt.hysteresis_left", where(o, finite, hl_good, hl_over)) &&
         add_assign(o, "opt.good_steps", where(o, finite, good_good, f0));
}

/* ---------------------------------------------------------------- ZenFlow */

/* ZenFlow (docs/memory.md "ZenFlow"): the step's schedule from the scalar
 * states opt.zf.step (steps taken), opt.zf.pending (gradients in the host's
 * sums) and opt.zf.sel_age (steps since the last selection). */
typedef struct {
  ir_node *apply;    /* bool: past the warm-up, the selective update runs */
  ir_node *select;   /* bool: a new selection (and fresh selective moments) */
  ir_node *boundary; /* bool: the host update runs (and its sums restart) */
  ir_node *pend1;    /* f32: gradients in the host's sums, this one included */
  ir_node *count;    /* f32: the selective update's step count (past the warm-up) */
} zf_sched;

static ir_node *gt_const(opt_state *o, ir_node *x, double c) {
  return dsc_binary(o->g, DSC_OP_GREATER, x, scalar(o, c, x->type.dtype));
}
static ir_node *as_flag(opt_state *o, ir_node *b) { return dsc_cast(o->g, b, DSC_F32); }
static ir_node *maximum(opt_state *o, ir_node *a, ir_node *b) {
  return dsc_binary(o->g, DSC_OP_MAXIMUM, a, b);
}
static ir_node *reshape2(opt_state *o, ir_node *x, int64_t d0, int64_t d1) {
  const int64_t shape[2] = {d0, d1};
  return dsc_reshape(o->g, x, shape, 2);
}
static ir_node *iota2(opt_state *o, int64_t d0, int64_t d1, int axis) {
  const int64_t shape[2] = {d0, d1};
  dsc_attr a[3] = {dsc_attr_int("axis", axis), dsc_attr_dtype("dtype", DSC_F32),
                   dsc_attr_ints("shape", shape, 2)};
  return dsc_build(o->g, DSC_OP_IOTA, NULL, 0, a, 3);
}
static ir_node *sum_axis1(opt_state *o, ir_node *x) {
  const int64_t axis = 1;
  return dsc_reduce(o->g, DSC_OP_SUM, x, &axis, 1, 0);
}

/* A state kept on the device by pass offload (meta place.<name>). */
static const char *device_state(opt_state *o, const char *what, const char *param, dsc_type t) {
  const char *name = new_state(o, what, param, t);
  const char *key = name ? ir_arena_printf(&o->m->arena, "place.%s", name) : NULL;
  if (!key || dsc_module_set_meta(o->m, key, "device") != DSC_OK) return NULL;
  return name;
}

/* With W warm-up steps, S = update_interval, R = select_interval, at step
 * t (1-based) and u = t - W:
 *   apply    u >= 1
 *   select   apply and (u == 1 or the selection is R steps old)
 *   boundary t <= W, or S gradients are summed, or the next step selects
 *            (DeepSpeed's flush before a new selection) */
static bool zf_schedule(opt_state *o, zf_sched *z) {
  const dsc_train_config *c = o->cfg;
  ir_graph *g = o->g;
  double W = (double)c->zenflow.warm_up, S = (double)c->zenflow.update_interval,
         R = (double)c->zenflow.select_interval;
  int first_node = g->n_nodes;
  ir_node *one = scalar(o, 1, DSC_F32), *zero = scalar(o, 0, DSC_F32);
  ir_node *t = add(o, dsc_param_ref(g, "opt.zf.step"), one);
  ir_node *u = sub(o, t, scalar(o, W, DSC_F32));
  z->apply = gt_const(o, u, 0.5);
  ir_node *apply = as_flag(o, z->apply);
  ir_node *age = dsc_param_ref(g, "opt.zf.sel_age");
  ir_node *first = as_flag(o, dsc_binary(g, DSC_OP_LESS, u, scalar(o, 1.5, DSC_F32)));
  ir_node *due = as_flag(o, gt_const(o, age, R - 0.5));
  z->select = gt_const(o, mul(o, apply, maximum(o, first, due)), 0.5);
  ir_node *age1 = where(o, z->select, one, mul(o, apply, add(o, age, one)));
  z->pend1 = add(o, dsc_param_ref(g, "opt.zf.pending"), one);
  ir_node *warm = sub(o, one, apply);
  ir_node *full = as_flag(o, gt_const(o, z->pend1, S - 0.5));
  ir_node *next_select = mul(o, apply, as_flag(o, gt_const(o, age1, R - 0.5)));
  z->boundary = gt_const(o, maximum(o, warm, maximum(o, full, next_select)), 0.5);
  z->count = maximum(o, u, one); /* >= 1, so the corrections stay finite in the warm-up */
  /* device scalars: the selective update reads them as soon as a gradient is final */
  for (int i = first_node; i < g->n_nodes; i++) g->nodes[i]->role = IR_ROLE_DEVICE_STEP;
  return z->boundary && add_assign(o, "opt.zf.step", t) && add_assign(o, "opt.zf.sel_age", age1) &&
         add_assign(o, "opt.zf.pending", where(o, z->boundary, zero, z->pend1));
}

/* rank[i] = #{j : imp[j] > imp[i]} + #{j < i : imp[j] == imp[i]}: each
 * row's place by importance, ties to the lower index, f32 [N]. */
static ir_node *importance_rank(opt_state *o, ir_node *imp, int64_t n) {
  ir_graph *g = o->g;
  ir_node *mine = reshape2(o, imp, n, 1), *other = reshape2(o, imp, 1, n);
  ir_node *above = as_flag(o, dsc_binary(g, DSC_OP_GREATER, other, mine));
  ir_node *tie = as_flag(o, dsc_binary(g, DSC_OP_EQUAL, other, mine));
  ir_node *before = as_flag(o, dsc_binary(g, DSC_OP_LESS, iota2(o, 1, n, 1), iota2(o, n, 1, 0)));
  return sum_axis1(o, add(o, above, mul(o, tie, before)));
}

/* ZenFlow's device part of one param: its AdamW over the selected rows
 * (1-D params: over all of it) with the selective moments opt.zf.m/v.<p>,
 * zeroed at each selection, counting the steps past the warm-up. Returns
 * the param's new value: the selective result where it applies, host_new
 * elsewhere. Every node made here is pinned to the device. The rows of a
 * linear [in, out] are nn.Linear's input columns, which DeepSpeed selects;
 * an embedding table [V, D] selects its D columns, as DeepSpeed does. */
static ir_node *zf_selective(opt_state *o, const zf_sched *z, const char *pname, ir_node *pv,
                             ir_node *graw, ir_node *factor, ir_node *lr, bool decay, bool table,
                             ir_node *host_new) {
  ir_graph *g = o->g;
  dsc_type pt = pv->type;
  dsc_dtype dt = pt.dtype;
  bool cols = pt.rank == 2 && table;
  int64_t n = pt.rank == 2 ? pt.dims[cols ? 1 : 0] : 0;
  int64_t k = (int64_t)floor(o->cfg->zenflow.topk_ratio * (double)n);
  if (pt.rank == 2 && k < 1) return host_new; /* too few rows to select one */
  int first_node = g->n_nodes;
  ir_node *zero = scalar(o, 0, dt), *res = host_new;
  ir_node *bc1 = bias_correction_at(o, z->count, o->cfg->opt.beta1, dt);
  ir_node *bc2 = bias_correction_at(o, z->count, o->cfg->opt.beta2, dt);
  ir_node *x = pv, *gr = as_dtype(o, graw, dt);
  if (cols) x = transpose(o, x), gr = transpose(o, gr);
  ir_node *idx = NULL, *pos = NULL, *keep = NULL;
  if (pt.rank == 2) {
    /* a column's importance: the sum of |g| over it (a table's: over the
     * untransposed gradient's rows, so that only the gathers transpose) */
    ir_node *g0 = cols ? as_dtype(o, graw, dt) : gr;
    const int64_t axis = cols ? 0 : 1;
    ir_node *imp = as_dtype(
        o, dsc_reduce(g, DSC_OP_SUM, maximum(o, g0, dsc_unary(g, DSC_OP_NEG, g0)), &axis, 1, 0),
        DSC_F32);
    const char *rn = device_state(o, "zf.rank", pname, dsc_type_make(DSC_F32, 1, &n));
    if (!rn) return NULL;
    ir_node *rank = where(o, z->select, importance_rank(o, imp, n), dsc_param_ref(g, rn));
    if (!add_assign(o, rn, rank)) return NULL;
    /* the selected rows in rank order, and each row's place among them */
    ir_node *hit = dsc_binary(g, DSC_OP_EQUAL, reshape2(o, rank, 1, n), iota2(o, k, 1, 0));
    /* before the first selection (warm-up) the ranks are all 0: kept in range */
    ir_node *sum = sum_axis1(o, where(o, hit, iota2(o, 1, n, 1), scalar(o, 0, DSC_F32)));
    idx = dsc_cast(
        g, where(o, gt_const(o, sum, (double)n - 1.5), scalar(o, (double)(n - 1), DSC_F32), sum),
        DSC_I32);
    ir_node *mask = dsc_binary(g, DSC_OP_LESS, rank, scalar(o, (double)k - 0.5, DSC_F32));
    pos = dsc_cast(g, where(o, mask, rank, scalar(o, (double)(k - 1), DSC_F32)), DSC_I32);
    ir_node *keep_f = mul(o, as_flag(o, mask), as_flag(o, z->apply));
    keep = gt_const(o, cols ? reshape2(o, keep_f, 1, n) : reshape2(o, keep_f, n, 1), 0.5);
    ir_node *in[2] = {x, idx};
    x = dsc_build(g, DSC_OP_EMBEDDING, in, 2, NULL, 0);
    in[0] = gr;
    gr = dsc_build(g, DSC_OP_EMBEDDING, in, 2, NULL, 0);
    /* a table's selected columns as columns ([V, k], its own layout): the
     * update's kernel then walks the table row by row, recomputing the
     * param's gather at each point (passes/fuse.c) */
    if (cols && x && gr) x = transpose(o, x), gr = transpose(o, gr);
  }
  if (!x || !gr) return NULL;
  ir_node *gs = mul(o, gr, as_dtype(o, factor, dt));
  const char *mn = device_state(o, "zf.m", pname, x->type);
  const char *vn = device_state(o, "zf.v", pname, x->type);
  if (!mn || !vn) return NULL;
  ir_node *ms = dsc_param_ref(g, mn), *vs = dsc_param_ref(g, vn), *m1, *v1;
  ir_node *xn = adamw_math(o, x, gs, where(o, z->select, zero, ms), where(o, z->select, zero, vs),
                           bc1, bc2, lr, decay, &m1, &v1);
  if (!add_assign(o, mn, where(o, z->apply, m1, ms)) ||
      !add_assign(o, vn, where(o, z->apply, v1, vs)))
    return NULL;
  if (pt.rank != 2) {
    res = where(o, z->apply, xn, host_new);
  } else {
    ir_node *in[2] = {cols ? transpose(o, xn) : xn, pos};
    ir_node *back = dsc_build(g, DSC_OP_EMBEDDING, in, 2, NULL, 0);
    /* in the param's layout: a table reads the updated columns transposed */
    res = where(o, keep, cols ? transpose(o, back) : back, host_new);
  }
  for (int i = first_node; res && i < g->n_nodes; i++) g->nodes[i]->role = IR_ROLE_DEVICE_STEP;
  return res;
}

/* Per trainable param j (1-based, as the forward's outputs): its state
 * opt.master.<p>, -1 when it has none (precision pass, master weights). */
static int *master_states(ir_module *m, int n_out) {
  int *ms = ir_arena_alloc(&m->arena, sizeof(int) * (size_t)(n_out + 1));
  if (!ms) return NULL;
  for (int p = 0, j = 1; p < m->n_params && j < n_out; p++) {
    if (m->params[p].state) continue;
    const char *name = ir_arena_printf(&m->arena, "opt.master.%s", m->params[p].name);
    int s = name ? dsc_module_find_param(m, name) : -1;
    ms[j++] = s >= 0 && m->params[s].state ? s : -1;
  }
  return ms;
}

static dsc_status build_step(opt_state *o, ir_graph *f) {
  ir_module *m = o->m;
  ir_graph *g = o->g;
  const dsc_train_config *cfg = o->cfg;
  int n_in = f->n_inputs, n_out = f->n_outputs;
  ir_node **in = ir_arena_alloc(&m->arena, sizeof(ir_node *) * (size_t)(n_in + 1));
  ir_node **acc = ir_arena_alloc(&m->arena, sizeof(ir_node *) * (size_t)n_out);
  if (!in || !acc)
    return ir_error(m->ctx, ir_no_loc, "out of memory in the optimizer pass"), DSC_ERR_INTERNAL;

  /* 1. inputs: one micro-batch (pass accumulate loops over K of them) */
  for (int i = 0; i < n_in; i++) {
    dsc_type t = f->inputs[i]->type;
    if (cfg->grad_accum > 1 && t.rank == 0) {
      ir_error(m->ctx, ir_no_loc,
               "optimizer: grad_accum = %lld needs a batch dim, but input '%s' is a scalar",
               (long long)cfg->grad_accum, f->inputs[i]->name);
      return DSC_ERR_USER;
    }
    if (!(in[i] = dsc_graph_input(g, f->inputs[i]->name, t))) return DSC_ERR_USER;
  }
  o->lr = dsc_graph_input(g, "lr", dsc_type_make(DSC_F32, 0, NULL));
  if (!o->lr) return DSC_ERR_USER;

  /* 2. the micro-batch's loss and gradients */
  if (!pass_inline_graph(g, f, in, acc)) return DSC_ERR_INTERNAL;
  acc[0]->role = IR_ROLE_LOSS;
  ir_node *loss = as_dtype(o, acc[0], DSC_F32);

  /* fp16: unscale, and test the gradients for inf/nan (a sum of all
   * gradient elements is finite iff s - s == 0; a finite sum that
   * overflows f32 would need gradients beyond 1e38 / numel) */
  for (int j = 1; j < n_out; j++)
    if (acc[j]) acc[j]->role = IR_ROLE_GRAD; /* the memory plan's "grads" */

  /* master weights: the low-precision gradients (what the ranks reduce)
   * are read in f32 by everything below, as the master weights are */
  int *masters = master_states(m, n_out);
  if (!masters) return ir_error(m->ctx, ir_no_loc, "out of memory"), DSC_ERR_INTERNAL;
  for (int j = 1; j < n_out; j++)
    if (acc[j]->type.dtype != DSC_F32 && dsc_dtype_is_float(acc[j]->type.dtype) && masters[j] >= 0)
      acc[j] = as_dtype(o, acc[j], DSC_F32);

  bool fp16 = cfg->precision == DSC_PRECISION_FP16;
  ir_node *finite = NULL;
  if (fp16) {
    ir_node *ls = dsc_param_ref(g, "opt.loss_scale");
    loss = divide(o, loss, ls);
    ir_node *s = scalar(o, 0, DSC_F32);
    for (int j = 1; j < n_out; j++) {
      acc[j] = divide(o, acc[j], as_dtype(o, ls, acc[j]->type.dtype));
      s = add(o, s, as_dtype(o, sum_all(o, acc[j]), DSC_F32));
    }
    finite = dsc_binary(g, DSC_OP_EQUAL, sub(o, s, s), scalar(o, 0, DSC_F32));
    if (!finite) return DSC_ERR_USER;
  }

  /* delayed update: this step's gradients are stored, the previous ones applied */
  ir_node *shown_norm = NULL, *primed = NULL;
  opt_assign *delayed = NULL;
  if (cfg->offload.delayed_update && n_out > 1) {
    shown_norm = global_norm(o, acc, n_out);
    delayed = ir_arena_alloc(&m->arena, sizeof(opt_assign) * (size_t)n_out);
    if (!delayed) return ir_error(m->ctx, ir_no_loc, "out of memory"), DSC_ERR_INTERNAL;
    for (int p = 0, j = 1; p < m->n_params; p++) {
      if (m->params[p].state) continue;
      const char *dn = new_state(o, "delayed", m->params[p].name, acc[j]->type);
      if (!dn) return DSC_ERR_USER;
      delayed[j] = (opt_assign){dn, acc[j]};
      acc[j++] = dsc_param_ref(g, dn);
    }
    primed = dsc_param_ref(g, "opt.delayed_primed");
  }

  /* ZenFlow's device part reads the gradients before clipping, and the factor */
  bool zf = cfg->zenflow.enabled && n_out > 1;
  ir_node **raw = zf ? ir_arena_alloc(&m->arena, sizeof(ir_node *) * (size_t)n_out) : NULL;
  if (zf && !raw) return ir_error(m->ctx, ir_no_loc, "out of memory"), DSC_ERR_INTERNAL;
  for (int j = 1; zf && j < n_out; j++) {
    raw[j] = acc[j];
    /* with master weights the device part casts the low gradient itself:
     * the f32 cast the host's part reads is placed on the host, and sharing
     * it brought the whole f32 gradient back (a to_device of 4 bytes per
     * value after a to_host of 2) */
    if (acc[j]->op == DSC_OP_CAST && acc[j]->in[0]->role == IR_ROLE_GRAD) {
      if (!(raw[j] = dsc_cast(g, acc[j]->in[0], DSC_F32))) return DSC_ERR_USER;
      raw[j]->role = IR_ROLE_DEVICE_STEP;
    }
  }
  ir_node *factor = scalar(o, 1, DSC_F32);

  /* 4. global norm and clipping */
  ir_node *grad_norm = global_norm(o, acc, n_out);
  if (cfg->clip > 0 && n_out > 1) {
    ir_node *clip = scalar(o, cfg->clip, DSC_F32);
    factor = divide(o, clip, dsc_binary(g, DSC_OP_MAXIMUM, grad_norm, clip));
    for (int j = 1; j < n_out; j++)
      acc[j] = mul(o, acc[j], as_dtype(o, factor, acc[j]->type.dtype));
  }
  if (!loss || !grad_norm) return DSC_ERR_USER;

  /* 5. the update */
  ir_node *t0 = dsc_param_ref(g, "opt.step");
  o->t = add(o, t0, scalar(o, 1, DSC_F32));
  zf_sched z = {0};
  if (zf && !zf_schedule(o, &z)) return DSC_ERR_USER;
  /* ZenFlow: opt.step counts the host's updates */
  if (!add_assign(o, "opt.step", zf ? where(o, z.boundary, o->t, t0) : o->t)) return DSC_ERR_USER;
  bool *emb = embedding_tables(m, f);
  if (!emb) return ir_error(m->ctx, ir_no_loc, "out of memory"), DSC_ERR_INTERNAL;
  double adam_ratio = cfg->opt.kind == DSC_OPT_MUON && cfg->opt.adam_lr > 0 && cfg->opt.lr > 0
                          ? cfg->opt.adam_lr / cfg->opt.lr
                          : 1.0;
  for (int p = 0, j = 1; p < m->n_params; p++) {
    if (m->params[p].state) continue;
    const char *pname = m->params[p].name;
    int master = masters[j];
    /* with master weights the update reads and writes the f32 copy, and
     * the param gets its rounding */
    const char *uname = master >= 0 ? m->params[master].name : pname;
    dsc_type pt = m->params[master >= 0 ? master : p].type;
    ir_node *pv = dsc_param_ref(g, uname), *grad = acc[j], *np;
    ir_node *lr = lr_of(o, pt.dtype);
    bool decay = cfg->opt.weight_decay > 0 && (pt.rank >= 2 || cfg->opt.decay_1d);
    int host_assigns = o->n_assigns;
    if (zf) { /* the host updates with the mean of the gradients summed since its last update */
      const char *an = new_state(o, "zf.acc", pname, grad->type);
      if (!an) return DSC_ERR_USER;
      ir_node *sum = add(o, dsc_param_ref(g, an), grad);
      if (!add_assign(o, an, where(o, z.boundary, scalar(o, 0, grad->type.dtype), sum)))
        return DSC_ERR_USER;
      grad = divide(o, sum, as_dtype(o, z.pend1, grad->type.dtype));
      host_assigns = o->n_assigns;
    }
    if (cfg->opt.kind == DSC_OPT_SGD) {
      np = sgd_update(o, pname, pv, grad, lr, decay);
    } else if (cfg->opt.kind == DSC_OPT_MUON && pt.rank == 2 && !emb[p]) {
      np = muon_update(o, pname, pv, grad, lr);
    } else {
      if (adam_ratio != 1.0) lr = scale(o, lr, adam_ratio);
      np = adamw_update(o, pname, pv, grad, lr, decay);
    }
    if (zf && np) { /* the host's update only at a boundary; the device's every step */
      for (int i = host_assigns; i < o->n_assigns; i++)
        o->assigns[i].value =
            where(o, z.boundary, o->assigns[i].value, dsc_param_ref(g, o->assigns[i].name));
      /* the choice on the device, so that the host's update and its copy
       * back are read only at a boundary (passes/guard.c skips them in the
       * other steps) */
      ir_node *host_new = where(o, z.boundary, np, pv);
      if (host_new) host_new->role = IR_ROLE_DEVICE_STEP;
      np = zf_selective(o, &z, pname, pv, raw[j], factor, lr, decay, emb[p], host_new);
    }
    j++;
    if (master >= 0 && !add_assign(o, uname, np)) return DSC_ERR_USER;
    if (master >= 0) np = as_dtype(o, np, m->params[p].type.dtype);
    if (!add_assign(o, pname, np)) return DSC_ERR_USER;
  }

  /* delayed update: the first step keeps every old value, then the
   * gradients are stored and the flag set */
  if (primed) {
    ir_node *on = dsc_binary(g, DSC_OP_GREATER, primed, scalar(o, 0.5, DSC_F32));
    for (int i = 0; i < o->n_assigns; i++) {
      ir_node *in[3] = {on, o->assigns[i].value, dsc_param_ref(g, o->assigns[i].name)};
      if (!(o->assigns[i].value = dsc_build(g, DSC_OP_WHERE, in, 3, NULL, 0))) return DSC_ERR_USER;
    }
    for (int j = 1; j < n_out; j++)
      if (!add_assign(o, delayed[j].name, delayed[j].value)) return DSC_ERR_USER;
    if (!add_assign(o, "opt.delayed_primed", scalar(o, 1, DSC_F32))) return DSC_ERR_USER;
    grad_norm = shown_norm;
  }

  /* fp16: a skipped step writes back the old values; then the scale */
  ir_node *skipped = NULL;
  if (fp16) {
    for (int i = 0; i < o->n_assigns; i++) {
      ir_node *in[3] = {finite, o->assigns[i].value, dsc_param_ref(g, o->assigns[i].name)};
      if (!(o->assigns[i].value = dsc_build(g, DSC_OP_WHERE, in, 3, NULL, 0))) return DSC_ERR_USER;
    }
    if (!loss_scale_update(o, finite)) return DSC_ERR_USER;
    skipped = sub(o, scalar(o, 1, DSC_F32), dsc_cast(g, finite, DSC_F32));
    if (!skipped) return DSC_ERR_USER;
  }

  /* 6. assigns last, so that the graph reads: compute, then commit */
  for (int i = 0; i < o->n_assigns; i++) {
    dsc_attr a = dsc_attr_str("name", o->assigns[i].name);
    if (!dsc_build(g, DSC_OP_ASSIGN, &o->assigns[i].value, 1, &a, 1)) return DSC_ERR_USER;
  }
  ir_node *res[3] = {loss, grad_norm, skipped};
  return dsc_graph_set_outputs(g, res, fp16 ? 3 : 2);
}

/* A scalar f32 state starting at zero, unless the module has it (a resume). */
static dsc_status ensure_scalar_state(ir_module *m, const char *name) {
  if (dsc_module_find_param(m, name) >= 0) return DSC_OK;
  dsc_init zeros = {DSC_INIT_ZEROS, 0, 0, NULL};
  return dsc_module_add_state(m, name, dsc_type_make(DSC_F32, 0, NULL), zeros);
}

/* What ZenFlow needs (as DeepSpeed: AdamW and the optimizer offloaded to
 * the host) and what it is not built for yet. */
static dsc_status zenflow_check(ir_module *m, const dsc_train_config *cfg) {
  const char *why = NULL;
  char buf[200];
  if (cfg->opt.kind != DSC_OPT_ADAMW)
    why = "updates with AdamW (DeepSpeed's ZenFlowSelectiveAdamW); set optimizer = adamw(...)";
  else if (cfg->offload.optimizer != DSC_OFFLOAD_HOST && cfg->offload.optimizer != DSC_OFFLOAD_NONE)
    why =
        "needs the optimizer on the host (--offload-optimizer host, train.offload.optimizer = "
        "cpu, ds_config offload_optimizer {\"device\": \"cpu\"}; implied when not given)";
  else if (cfg->precision == DSC_PRECISION_FP16)
    why =
        "with precision fp16 is not supported: a step the loss scaler skips would still sum "
        "its gradients (use bf16 or f32)";
  else if (cfg->offload.delayed_update)
    why =
        "and offload.delayed_update (--delayed-param-update) are two ways to delay the host's "
        "update; choose one";
  else if (cfg->zenflow.overlap_step)
    why =
        "overlap_step = true is not implemented yet: the host's update runs inside the step "
        "that reaches the update interval (set overlap_step = false)";
  else if (cfg->world > 1 && cfg->zero.stage >= 1)
    why =
        "at ZeRO stage 1-3 with world > 1 is not implemented yet (the selected columns of a "
        "sharded param); use zero.stage 0 or one rank";
  else if (!(cfg->zenflow.topk_ratio > 0 && cfg->zenflow.topk_ratio < 1))
    snprintf(buf, sizeof buf, "topk_ratio must be in (0, 1), got %g", cfg->zenflow.topk_ratio),
        why = buf;
  else if (cfg->zenflow.update_interval < 1 ||
           cfg->zenflow.select_interval < cfg->zenflow.update_interval)
    snprintf(buf, sizeof buf,
             "select_interval (%lld) must be at least update_interval (%lld), which must be >= 1",
             (long long)cfg->zenflow.select_interval, (long long)cfg->zenflow.update_interval),
        why = buf;
  if (why) {
    ir_error(m->ctx, ir_no_loc, "optimizer: zenflow %s", why);
    return DSC_ERR_USER;
  }
  return DSC_OK;
}

dsc_status pass_optimizer_run(ir_module *m, const dsc_train_config *cfg) {
  if (!cfg) {
    ir_error(m->ctx, ir_no_loc, "optimizer: no training settings given");
    return DSC_ERR_USER;
  }
  if (cfg->grad_accum < 1) {
    ir_error(m->ctx, ir_no_loc, "optimizer: grad_accum must be at least 1, got %lld",
             (long long)cfg->grad_accum);
    return DSC_ERR_USER;
  }
  ir_graph *f = dsc_module_find_graph(m, "forward");
  if (!f) {
    ir_error(m->ctx, ir_no_loc, "optimizer: the module has no graph 'forward'");
    return DSC_ERR_USER;
  }
  if (dsc_module_find_graph(m, "train_step")) {
    ir_error(m->ctx, ir_no_loc, "optimizer: the module already has a graph 'train_step'");
    return DSC_ERR_USER;
  }
  if (f->n_outputs == 1) {
    dsc_status st = pass_autodiff_run(m, f);
    if (st != DSC_OK) return st;
  }
  if (!check_forward(m, f)) return DSC_ERR_USER;
  dsc_status st0 = ensure_scalar_state(m, "opt.step");
  if (st0 != DSC_OK) return st0;
  if (cfg->offload.delayed_update && cfg->precision == DSC_PRECISION_FP16) {
    ir_error(m->ctx, ir_no_loc,
             "optimizer: offload.delayed_update (--delayed-param-update) with precision fp16 is "
             "not supported: a step the loss scaler skips would still store its gradients (use "
             "bf16 or f32)");
    return DSC_ERR_USER;
  }
  if (cfg->zenflow.enabled) { /* its schedule: docs/memory.md "ZenFlow" */
    static const char *const zf_states[] = {"opt.zf.step", "opt.zf.pending", "opt.zf.sel_age"};
    if ((st0 = zenflow_check(m, cfg)) != DSC_OK) return st0;
    for (int i = 0; i < 3; i++)
      if ((st0 = ensure_scalar_state(m, zf_states[i])) != DSC_OK) return st0;
  }
  if (cfg->offload.delayed_update && (st0 = ensure_scalar_state(m, "opt.delayed_primed")) != DSC_OK)
    return st0;
  if (cfg->precision == DSC_PRECISION_FP16) {
    if (!pass_precision_check_fp16(m, cfg)) return DSC_ERR_USER;
    int ls = dsc_module_find_param(m, "opt.loss_scale");
    if (ls < 0 || !m->params[ls].state) {
      ir_error(m->ctx, ir_no_loc,
               "optimizer: precision fp16 needs the state 'opt.loss_scale' that the precision "
               "pass creates (run it first)");
      return DSC_ERR_USER;
    }
    dsc_type t0 = dsc_type_make(DSC_F32, 0, NULL);
    dsc_init zeros = {DSC_INIT_ZEROS, 0, 0, NULL};
    dsc_init hyst = {DSC_INIT_CONST, (double)cfg->fp16.hysteresis, 0, NULL};
    dsc_status st = dsc_module_add_state(m, "opt.good_steps", t0, zeros);
    if (st == DSC_OK) st = dsc_module_add_state(m, "opt.hysteresis_left", t0, hyst);
    if (st != DSC_OK) return st;
  }
  opt_state o;
  memset(&o, 0, sizeof o);
  o.m = m;
  o.cfg = cfg;
  if (!(o.g = dsc_graph_new(m, "train_step"))) return DSC_ERR_INTERNAL;
  dsc_status st = build_step(&o, f);
  if (st != DSC_OK) {
    pass_remove_graph(m, "train_step");
    if (dsc_error_count(m->ctx) == 0)
      ir_error(m->ctx, ir_no_loc, "optimizer: could not build graph 'train_step'");
    return st;
  }
  pass_remove_graph(m, "forward");
  return DSC_OK;
}
