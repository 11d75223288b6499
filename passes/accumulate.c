/* The accumulate pass: gradient accumulation as a loop (grad_accum K > 1).
 *
 * The optimizer pass builds "train_step" for one micro-batch; the zero,
 * offload and schedule passes then add the ranks' collectives and the
 * tiers to it. This pass cuts that graph in two:
 *
 *   micro_step(inputs of one micro-batch..., first: f32[]) -> (loss)
 *       the forward and backward of one micro-batch, and for each value the
 *       optimizer part reads from it (the carried values: the gradients,
 *       role IR_ROLE_GRAD, and the loss, IR_ROLE_LOSS) an accumulation
 *       state "acc.<n>" of its type:
 *           acc = first ? x / K : acc + x / K
 *       written right after x is computed, so that x dies at once;
 *   train_step(lr: f32[]) -> (loss, grad_norm[, skipped])
 *       the rest (the norm, clipping, the update, the loss's mean over
 *       ranks), reading the accumulation states where it read x.
 *
 * The program runs micro_step K times (first = 1 for k = 0) on rows
 * [k*B, (k+1)*B) of the step's inputs, then train_step once
 * (dsc_interp_run_step, dsc_exec_run_step). Program size, compile and plan
 * time do not depend on K; the accumulation states are counted once.
 *
 * Where the ranks reduce, as DeepSpeed does:
 * - stages 2-3 with cfg->zero.reduce_each_micro_batch (the default): the
 *   carried gradients are the reduced shards the zero pass hands the
 *   optimizer (or a schedule bucket of them), so their reduce_scatters run
 *   in every micro-batch, overlapping its backward, and the accumulation
 *   states are shard-sized;
 * - stages 0-1, or reduce_each_micro_batch false: the carried values are
 *   the collectives' inputs (each local gradient or bucket) and the
 *   reduction runs once, in train_step: 1/K the bytes on the wire, but
 *   full-size accumulation states and no overlap with the backward (at
 *   stages 0-1 the states are full-size anyway).
 *
 * Numerics: with K a power of two, x / K is exact, so the sum is the same
 * left-to-right sum of x_k / K as one unrolled graph's (x_0 + ... ) / K:
 * equal bitwise at world 1. Otherwise, and when the ranks reduce per
 * micro-batch, equal within f32 rounding (docs/training.md). */
#include <stdio.h>
#include <string.h>

#include "passes/passes.h"

static dsc_status internal(ir_module *m, const char *why, const ir_node *x) {
  ir_error(m->ctx, ir_no_loc,
           "accumulate: graph 'train_step' cannot be cut into micro-batch and optimizer parts: "
           "%s (node %%%d, %s); run the passes in order",
           why, x ? x->id : -1, x ? ir_op(x->op)->name : "-");
  return DSC_ERR_INTERNAL;
}

/* Sources that both parts may read: each gets its own copy. */
static bool duplicable(const ir_node *x) {
  return x->op == DSC_OP_CONST || x->op == DSC_OP_PARAM || x->op == DSC_OP_IOTA;
}

/* The value a carried gradient stands for: with reduce-once, the input of
 * the reduction whose result it is, so the reduction moves to train_step. */
static ir_node *carried_value(ir_node *x, bool reduce_each) {
  if (reduce_each || x->role != IR_ROLE_GRAD) return x;
  if (x->op != DSC_OP_ALL_REDUCE_WAIT && x->op != DSC_OP_REDUCE_SCATTER_WAIT) return x;
  return x->in[0]->in[0]; /* wait(start(value)) */
}

typedef struct {
  ir_module *m;
  ir_graph *g, *micro, *step;
  int64_t K;
  ir_node **map;   /* old id -> node of the part it went to */
  ir_node **dup;   /* old id -> the optimizer part's copy of a duplicable source */
  ir_node **acc;   /* old id -> the optimizer part's read of its accumulation state */
  ir_node **wide;  /* old id -> the f32 state itself, when acc is its cast to a low dtype */
  bool *in_micro;  /* old id -> in the micro-batch part */
  bool *carried;   /* old id -> accumulated */
  ir_node *first;  /* micro_step's input "first" as a bool */
  int n_acc;
} acc_state;

static ir_node *copy_node(ir_graph *dst, const ir_node *x, ir_node *const *in) {
  dsc_loc saved = dst->cur_loc;
  dst->cur_loc = x->loc;
  ir_node *c = ir_node_new_raw(dst, x->op, x->type, in, x->n_in, x->attrs, x->n_attrs);
  dst->cur_loc = saved;
  if (c) c->role = x->role, c->place = x->place;
  return c;
}

/* micro_step: acc = first ? x / K : acc + x / K, assigned. A bf16 or fp16
 * gradient is summed in f32 (as DeepSpeed's BF16_Optimizer accumulates
 * into fp32 buffers): one rounding to the low dtype per step instead of K. */
static bool accumulate(acc_state *s, const ir_node *old, ir_node *x) {
  ir_module *m = s->m;
  const char *name = ir_arena_printf(&m->arena, "acc.%d", s->n_acc++);
  if (!name) return false;
  dsc_init zeros = {DSC_INIT_ZEROS, 0, 0, NULL};
  ir_graph *g = s->micro;
  dsc_dtype low = x->type.dtype;
  bool widen = old->role != IR_ROLE_LOSS && (low == DSC_BF16 || low == DSC_F16);
  if (widen && !(x = dsc_cast(g, x, DSC_F32))) return false;
  if (dsc_module_add_state(m, name, x->type, zeros) != DSC_OK) return false;
  ir_node *inv = dsc_const(g, 1.0 / (double)s->K, dsc_type_make(x->type.dtype, 0, NULL));
  ir_node *part = inv ? dsc_binary(g, DSC_OP_MUL, x, inv) : NULL;
  ir_node *sum = part ? dsc_binary(g, DSC_OP_ADD, dsc_param_ref(g, name), part) : NULL;
  ir_node *w_in[3] = {s->first, part, sum};
  ir_node *w = sum ? dsc_build(g, DSC_OP_WHERE, w_in, 3, NULL, 0) : NULL;
  dsc_attr a = dsc_attr_str("name", name);
  if (!w || !dsc_build(g, DSC_OP_ASSIGN, &w, 1, &a, 1)) return false;
  /* the optimizer part reads the state where it read the value */
  ir_node *r = dsc_param_ref(s->step, name);
  if (!r) return false;
  if (widen) {
    s->wide[old->id] = r;
    if (!(r = dsc_cast(s->step, r, low))) return false;
  }
  s->acc[old->id] = r;
  return true;
}

/* The optimizer part's node for old input x. */
static ir_node *step_input(acc_state *s, const ir_node *x) {
  if (!s->in_micro[x->id]) return s->map[x->id];
  if (s->carried[x->id]) return s->acc[x->id];
  if (!duplicable(x)) return NULL;
  if (!s->dup[x->id]) s->dup[x->id] = copy_node(s->step, x, NULL);
  return s->dup[x->id];
}

static dsc_status split(acc_state *s, bool reduce_each) {
  ir_module *m = s->m;
  ir_graph *g = s->g;
  int n = g->n_nodes;
  size_t np = sizeof(ir_node *) * (size_t)(n + 1);
  s->map = ir_arena_alloc(&m->arena, np), s->dup = ir_arena_alloc(&m->arena, np);
  s->acc = ir_arena_alloc(&m->arena, np), s->wide = ir_arena_alloc(&m->arena, np);
  s->in_micro = ir_arena_alloc(&m->arena, (size_t)n + 1);
  s->carried = ir_arena_alloc(&m->arena, (size_t)n + 1);
  ir_node **stack = ir_arena_alloc(&m->arena, np);
  if (!s->map || !s->dup || !s->acc || !s->wide || !s->in_micro || !s->carried || !stack)
    return ir_error(m->ctx, ir_no_loc, "accumulate: out of memory"), DSC_ERR_INTERNAL;
  memset(s->map, 0, np), memset(s->dup, 0, np), memset(s->acc, 0, np), memset(s->wide, 0, np);
  memset(s->in_micro, 0, (size_t)n + 1), memset(s->carried, 0, (size_t)n + 1);

  /* live: what the outputs, the assigns and the tier writes need (the
   * passes before may leave dead nodes; cse drops them later) */
  bool *live = ir_arena_alloc(&m->arena, (size_t)n + 1), *cand = ir_arena_alloc(&m->arena, (size_t)n + 1);
  if (!live || !cand) return ir_error(m->ctx, ir_no_loc, "accumulate: out of memory"), DSC_ERR_INTERNAL;
  memset(live, 0, (size_t)n + 1), memset(cand, 0, (size_t)n + 1);
  int sp = 0;
  for (int k = 0; k < g->n_outputs; k++)
    if (!live[g->outputs[k]->id]) live[g->outputs[k]->id] = true, stack[sp++] = g->outputs[k];
  for (int i = 0; i < n; i++) {
    dsc_op op = g->nodes[i]->op;
    if ((op == DSC_OP_ASSIGN || op == DSC_OP_TIER_WRITE_START || op == DSC_OP_TIER_WRITE_WAIT) &&
        !live[i])
      live[i] = true, stack[sp++] = g->nodes[i];
  }
  while (sp > 0) {
    ir_node *x = stack[--sp];
    for (int q = 0; q < x->n_in; q++)
      if (!live[x->in[q]->id]) live[x->in[q]->id] = true, stack[sp++] = x->in[q];
  }

  /* the candidates (the gradients and the loss), the micro-batch part (their
   * ancestors, and the data inputs), and the carried values: the candidates
   * that a node outside it, or an output, reads */
  int n_loss = 0;
  for (int i = 0; i < n; i++) {
    ir_node *x = g->nodes[i];
    if (!live[i] || (x->role != IR_ROLE_GRAD && x->role != IR_ROLE_LOSS)) continue;
    n_loss += x->role == IR_ROLE_LOSS;
    ir_node *c = carried_value(x, reduce_each);
    if (!cand[c->id]) cand[c->id] = true, s->in_micro[c->id] = true, stack[sp++] = c;
  }
  if (n_loss != 1) return internal(m, "not exactly one micro-batch loss", NULL);
  for (int i = 0; i + 1 < g->n_inputs; i++) s->in_micro[g->inputs[i]->id] = true;
  while (sp > 0) {
    ir_node *x = stack[--sp];
    for (int q = 0; q < x->n_in; q++)
      if (!s->in_micro[x->in[q]->id]) s->in_micro[x->in[q]->id] = true, stack[sp++] = x->in[q];
  }
  for (int i = 0; i < n; i++) {
    const ir_node *x = g->nodes[i];
    if (!live[i] || s->in_micro[i]) continue;
    for (int q = 0; q < x->n_in; q++) s->carried[x->in[q]->id] |= cand[x->in[q]->id];
  }
  for (int k = 0; k < g->n_outputs; k++)
    s->carried[g->outputs[k]->id] |= cand[g->outputs[k]->id];

  /* inputs: the data to micro_step, lr to train_step */
  for (int i = 0; i < g->n_inputs; i++) {
    ir_node *x = g->inputs[i];
    bool data = i < g->n_inputs - 1; /* the optimizer pass's last input is lr */
    if (!data && s->in_micro[x->id]) return internal(m, "the micro-batch part reads lr", x);
    ir_graph *dst = data ? s->micro : s->step;
    if (!(s->map[x->id] = dsc_graph_input(dst, x->name, x->type))) return DSC_ERR_USER;
  }
  ir_node *first = dsc_graph_input(s->micro, "first", dsc_type_make(DSC_F32, 0, NULL));
  ir_node *half = first ? dsc_const(s->micro, 0.5, dsc_type_make(DSC_F32, 0, NULL)) : NULL;
  if (!half || !(s->first = dsc_binary(s->micro, DSC_OP_GREATER, first, half)))
    return DSC_ERR_USER;

  /* the nodes, in order, each to its part */
  ir_node *small[8];
  ir_node *micro_loss = NULL;
  for (int i = 0; i < n; i++) {
    ir_node *x = g->nodes[i];
    if (x->op == DSC_OP_INPUT || !live[i]) continue;
    ir_node **in = small;
    if (x->n_in > 8 && !(in = ir_arena_alloc(&m->arena, sizeof(ir_node *) * (size_t)x->n_in)))
      return ir_error(m->ctx, ir_no_loc, "accumulate: out of memory"), DSC_ERR_INTERNAL;
    bool micro = s->in_micro[i];
    if (!micro && x->op == DSC_OP_CAST && s->wide[x->in[0]->id] &&
        x->type.dtype == s->wide[x->in[0]->id]->type.dtype) {
      s->map[i] = s->wide[x->in[0]->id]; /* the f32 reader of a sum reads it unrounded */
      continue;
    }
    for (int q = 0; q < x->n_in; q++) {
      const ir_node *y = x->in[q];
      in[q] = micro ? s->map[y->id] : step_input(s, y);
      if (!in[q]) return internal(m, "the optimizer part reads a micro-batch value", y);
    }
    ir_node *c = copy_node(micro ? s->micro : s->step, x, in);
    if (!c) return DSC_ERR_USER;
    s->map[i] = c;
    if (!micro) continue;
    if (s->carried[i]) {
      if (x->role == IR_ROLE_LOSS) micro_loss = c;
      if (!accumulate(s, x, c)) return DSC_ERR_USER;
    }
  }
  /* a collective's or transfer's two ends stay in one part */
  for (int i = 0; i < n; i++) {
    ir_node *x = g->nodes[i];
    if (!live[i]) continue;
    if (!ir_is_collective_wait(x->op) && x->op != DSC_OP_TIER_READ_WAIT &&
        x->op != DSC_OP_TIER_WRITE_WAIT)
      continue;
    if (s->in_micro[i] != s->in_micro[x->in[0]->id])
      return internal(m, "a transfer starts in one part and is waited in the other", x);
  }

  /* outputs */
  ir_node *outs[4];
  if (g->n_outputs > 4) return internal(m, "more than 4 outputs", NULL);
  for (int k = 0; k < g->n_outputs; k++)
    if (!(outs[k] = step_input(s, g->outputs[k])))
      return internal(m, "an output is a micro-batch value", g->outputs[k]);
  if (dsc_graph_set_outputs(s->step, outs, g->n_outputs) != DSC_OK) return DSC_ERR_USER;
  if (!micro_loss) return internal(m, "the micro-batch loss is not read by the optimizer part", NULL);
  return dsc_graph_set_outputs(s->micro, &micro_loss, 1);
}

dsc_status pass_accumulate_run(ir_module *m, const dsc_train_config *cfg) {
  if (!cfg || cfg->grad_accum <= 1) return DSC_OK;
  ir_graph *g = dsc_module_find_graph(m, "train_step");
  if (!g) {
    ir_error(m->ctx, ir_no_loc,
             "accumulate: the module has no graph 'train_step' (run pass optimizer first)");
    return DSC_ERR_USER;
  }
  if (dsc_module_find_graph(m, "micro_step")) {
    ir_error(m->ctx, ir_no_loc, "accumulate: the module already has a graph 'micro_step'");
    return DSC_ERR_USER;
  }
  acc_state s;
  memset(&s, 0, sizeof s);
  s.m = m, s.g = g, s.K = cfg->grad_accum;
  if (!(s.micro = dsc_graph_new(m, "micro_step")) || !(s.step = dsc_graph_new(m, "train_step.cut")))
    return DSC_ERR_INTERNAL;
  bool each = cfg->zero.reduce_each_micro_batch && cfg->zero.stage >= 2 && cfg->world > 1;
  dsc_status st = split(&s, each);
  if (st != DSC_OK) {
    pass_remove_graph(m, "micro_step");
    pass_remove_graph(m, "train_step.cut");
    return st;
  }
  /* the cut graph takes the old one's place and name among the module's graphs */
  pass_remove_graph(m, "train_step.cut");
  for (int i = 0; i < m->n_graphs; i++)
    if (m->graphs[i] == g) m->graphs[i] = s.step;
  s.step->name = g->name;
  char k[32];
  snprintf(k, sizeof k, "%lld", (long long)s.K);
  st = dsc_module_set_meta(m, "accumulate.steps", k);
  if (st == DSC_OK)
    st = dsc_module_set_meta(m, "accumulate.reduce", each ? "micro_batch" : "step");
  return st;
}
