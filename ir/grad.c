/* Gradient rules: one function per differentiable op, written in IR ops.
 *
 * A rule receives the forward node n and the gradient dy of the loss with
 * respect to n (same type as n), appends the nodes that compute the
 * gradient with respect to each input to g with the builder, and stores
 * them in dx[i] (NULL for inputs that are not differentiable: integer ids
 * and targets, the bool condition of `where`). Rules may reuse n itself
 * (the forward value) and its inputs. Builder calls return NULL after a
 * failure, so a rule checks only its final results.
 *
 * Conventions where the math leaves a choice:
 * - relu: derivative 0 at x == 0.
 * - maximum(a, b) and max over axes: at ties the gradient is split equally
 *   between the tied elements (as PyTorch does for amax/maximum).
 * - cast: only float -> float is differentiable; dy is cast back to the
 *   input's dtype. */
#include <pthread.h>
#include <math.h>
#include <string.h>

#include "ir/ir.h"

/* ---------------------------------------------------------------- helpers */

static dsc_type scalar_type(dsc_dtype dt) {
  dsc_type t;
  memset(&t, 0, sizeof t);
  t.dtype = dt;
  return t;
}

static ir_node *scalar(ir_graph *g, double v, dsc_dtype dt) {
  return dsc_const(g, v, scalar_type(dt));
}

static dsc_dtype dtype_of(const ir_node *x) { return x ? x->type.dtype : DSC_F32; }

static ir_node *add(ir_graph *g, ir_node *a, ir_node *b) { return dsc_binary(g, DSC_OP_ADD, a, b); }
static ir_node *sub(ir_graph *g, ir_node *a, ir_node *b) { return dsc_binary(g, DSC_OP_SUB, a, b); }
static ir_node *mul(ir_graph *g, ir_node *a, ir_node *b) { return dsc_binary(g, DSC_OP_MUL, a, b); }
static ir_node *divide(ir_graph *g, ir_node *a, ir_node *b) {
  return dsc_binary(g, DSC_OP_DIV, a, b);
}
/* x * c for a scalar constant c of x's dtype. */
static ir_node *mulc(ir_graph *g, ir_node *x, double c) {
  return mul(g, x, scalar(g, c, dtype_of(x)));
}
/* c - x for a scalar constant c of x's dtype. */
static ir_node *rsubc(ir_graph *g, double c, ir_node *x) {
  return sub(g, scalar(g, c, dtype_of(x)), x);
}

static bool same_dims(const dsc_type *a, const dsc_type *b) {
  if (a->rank != b->rank) return false;
  for (int i = 0; i < a->rank; i++)
    if (a->dims[i] != b->dims[i]) return false;
  return true;
}

static ir_node *reshape_to(ir_graph *g, ir_node *x, const dsc_type *t) {
  if (!x) return NULL;
  if (same_dims(&x->type, t)) return x;
  return dsc_reshape(g, x, t->dims, t->rank);
}

static ir_node *broadcast_to(ir_graph *g, ir_node *x, const dsc_type *t) {
  if (!x) return NULL;
  if (same_dims(&x->type, t)) return x;
  dsc_attr a = dsc_attr_ints("shape", t->dims, t->rank);
  return dsc_build(g, DSC_OP_BROADCAST, &x, 1, &a, 1);
}

/* Reduces dy (of a broadcast result's shape) back to `to`, a shape that
 * broadcasts to it: sums the leading axes `to` lacks and the axes where `to`
 * has size 1, then reshapes away the leading ones. */
static ir_node *sum_to(ir_graph *g, ir_node *dy, const dsc_type *to) {
  if (!dy) return NULL;
  const dsc_type *y = &dy->type;
  if (same_dims(y, to)) return dy;
  int lead = y->rank - to->rank;
  if (lead < 0) {
    ir_error(g->module->ctx, g->cur_loc, "autodiff: cannot reduce a gradient of rank %d to rank %d",
             y->rank, to->rank);
    return NULL;
  }
  int64_t axes[DSC_MAX_RANK];
  int na = 0;
  for (int d = 0; d < y->rank; d++)
    if (d < lead || (to->dims[d - lead] == 1 && y->dims[d] != 1)) axes[na++] = d;
  ir_node *s = na ? dsc_reduce(g, DSC_OP_SUM, dy, axes, na, 0) : dy;
  return reshape_to(g, s, to);
}

static ir_node *sum_keep(ir_graph *g, ir_node *x, int64_t axis) {
  return dsc_reduce(g, DSC_OP_SUM, x, &axis, 1, 1);
}
static ir_node *mean_keep(ir_graph *g, ir_node *x, int64_t axis) {
  return dsc_reduce(g, DSC_OP_MEAN, x, &axis, 1, 1);
}

/* Swaps the last two axes (matrix transpose of every batch element). */
static ir_node *transpose(ir_graph *g, ir_node *x) {
  if (!x) return NULL;
  int r = x->type.rank;
  int64_t perm[DSC_MAX_RANK];
  for (int i = 0; i < r; i++) perm[i] = i;
  perm[r - 2] = r - 1;
  perm[r - 1] = r - 2;
  return dsc_permute(g, x, perm, r);
}

/* The shape of reduce node n's result with keepdims (reduced axes as 1). */
static dsc_type keep_shape(const ir_node *n) {
  dsc_type t = n->in[0]->type;
  int cnt;
  const int64_t *axes = ir_attr_ints(n, "axes", &cnt);
  for (int i = 0; i < cnt; i++) t.dims[axes[i]] = 1;
  t.dtype = n->type.dtype;
  return t;
}

/* ---------------------------------------------------------------- binary */

bool ir_grad_add(ir_graph *g, const ir_node *n, ir_node *dy, ir_node **dx) {
  dx[0] = sum_to(g, dy, &n->in[0]->type);
  dx[1] = sum_to(g, dy, &n->in[1]->type);
  return dx[0] && dx[1];
}

bool ir_grad_sub(ir_graph *g, const ir_node *n, ir_node *dy, ir_node **dx) {
  dx[0] = sum_to(g, dy, &n->in[0]->type);
  dx[1] = sum_to(g, dsc_unary(g, DSC_OP_NEG, dy), &n->in[1]->type);
  return dx[0] && dx[1];
}

bool ir_grad_mul(ir_graph *g, const ir_node *n, ir_node *dy, ir_node **dx) {
  dx[0] = sum_to(g, mul(g, dy, n->in[1]), &n->in[0]->type);
  dx[1] = sum_to(g, mul(g, dy, n->in[0]), &n->in[1]->type);
  return dx[0] && dx[1];
}

/* y = a / b: da = dy / b, db = -dy * y / b. */
bool ir_grad_div(ir_graph *g, const ir_node *n, ir_node *dy, ir_node **dx) {
  ir_node *b = n->in[1], *da = divide(g, dy, b);
  dx[0] = sum_to(g, da, &n->in[0]->type);
  dx[1] = sum_to(g, dsc_unary(g, DSC_OP_NEG, mul(g, da, (ir_node *)n)), &b->type);
  return dx[0] && dx[1];
}

/* The share of a in maximum(a, b): 1 where a > b, 1/2 at ties, else 0. */
bool ir_grad_maximum(ir_graph *g, const ir_node *n, ir_node *dy, ir_node **dx) {
  ir_node *a = n->in[0], *b = n->in[1];
  dsc_dtype dt = n->type.dtype;
  ir_node *tie = dsc_build(
      g, DSC_OP_WHERE,
      (ir_node *[]){dsc_binary(g, DSC_OP_EQUAL, a, b), scalar(g, 0.5, dt), scalar(g, 0.0, dt)}, 3,
      NULL, 0);
  ir_node *wa = dsc_build(
      g, DSC_OP_WHERE, (ir_node *[]){dsc_binary(g, DSC_OP_GREATER, a, b), scalar(g, 1.0, dt), tie},
      3, NULL, 0);
  dx[0] = sum_to(g, mul(g, dy, wa), &a->type);
  dx[1] = sum_to(g, mul(g, dy, rsubc(g, 1.0, wa)), &b->type);
  return dx[0] && dx[1];
}

bool ir_grad_where(ir_graph *g, const ir_node *n, ir_node *dy, ir_node **dx) {
  ir_node *c = n->in[0], *zero = scalar(g, 0.0, n->type.dtype);
  dx[0] = NULL;
  dx[1] = sum_to(g, dsc_build(g, DSC_OP_WHERE, (ir_node *[]){c, dy, zero}, 3, NULL, 0),
                 &n->in[1]->type);
  dx[2] = sum_to(g, dsc_build(g, DSC_OP_WHERE, (ir_node *[]){c, zero, dy}, 3, NULL, 0),
                 &n->in[2]->type);
  return dx[1] && dx[2];
}

/* ---------------------------------------------------------------- unary */

bool ir_grad_neg(ir_graph *g, const ir_node *n, ir_node *dy, ir_node **dx) {
  IR_UNUSED(n);
  return (dx[0] = dsc_unary(g, DSC_OP_NEG, dy)) != NULL;
}

bool ir_grad_exp(ir_graph *g, const ir_node *n, ir_node *dy, ir_node **dx) {
  return (dx[0] = mul(g, dy, (ir_node *)n)) != NULL;
}

bool ir_grad_log(ir_graph *g, const ir_node *n, ir_node *dy, ir_node **dx) {
  return (dx[0] = divide(g, dy, n->in[0])) != NULL;
}

/* y = sqrt(x): dx = dy * 0.5 / y. */
bool ir_grad_sqrt(ir_graph *g, const ir_node *n, ir_node *dy, ir_node **dx) {
  return (dx[0] = divide(g, mulc(g, dy, 0.5), (ir_node *)n)) != NULL;
}

/* y = x^(-1/2): dx = -0.5 * dy * y / x. */
bool ir_grad_rsqrt(ir_graph *g, const ir_node *n, ir_node *dy, ir_node **dx) {
  ir_node *t = divide(g, mul(g, dy, (ir_node *)n), n->in[0]);
  return (dx[0] = mulc(g, t, -0.5)) != NULL;
}

bool ir_grad_tanh(ir_graph *g, const ir_node *n, ir_node *dy, ir_node **dx) {
  ir_node *y = (ir_node *)n;
  return (dx[0] = mul(g, dy, rsubc(g, 1.0, mul(g, y, y)))) != NULL;
}

bool ir_grad_relu(ir_graph *g, const ir_node *n, ir_node *dy, ir_node **dx) {
  ir_node *x = n->in[0], *zero = scalar(g, 0.0, n->type.dtype);
  ir_node *pos = dsc_binary(g, DSC_OP_GREATER, x, zero);
  return (dx[0] = dsc_build(g, DSC_OP_WHERE, (ir_node *[]){pos, dy, zero}, 3, NULL, 0)) != NULL;
}

/* gelu(x) = 0.5 x (1 + t), t = tanh(c (x + k x^3)) (the formula and c, k:
 * include/dsc/ops.def): gelu'(x) = 0.5 (1 + t) + 0.5 x (1 - t^2) c (1 + 3 k x^2). */
bool ir_grad_gelu(ir_graph *g, const ir_node *n, ir_node *dy, ir_node **dx) {
  const double c = DSC_GELU_C, k = DSC_GELU_K;
  ir_node *x = n->in[0], *x2 = mul(g, x, x);
  ir_node *u = mulc(g, add(g, x, mul(g, mulc(g, x2, k), x)), c);
  ir_node *t = dsc_unary(g, DSC_OP_TANH, u);
  ir_node *left = mulc(g, add(g, t, scalar(g, 1.0, dtype_of(x))), 0.5);
  ir_node *du = mulc(g, add(g, mulc(g, x2, 3.0 * k), scalar(g, 1.0, dtype_of(x))), c);
  ir_node *right = mul(g, mul(g, mulc(g, x, 0.5), rsubc(g, 1.0, mul(g, t, t))), du);
  return (dx[0] = mul(g, dy, add(g, left, right))) != NULL;
}

/* silu(x) = x s, s = sigmoid(x): silu'(x) = s (1 + x (1 - s)). */
bool ir_grad_silu(ir_graph *g, const ir_node *n, ir_node *dy, ir_node **dx) {
  ir_node *x = n->in[0], *s = dsc_unary(g, DSC_OP_SIGMOID, x);
  ir_node *d = mul(g, s, add(g, scalar(g, 1.0, dtype_of(x)), mul(g, x, rsubc(g, 1.0, s))));
  return (dx[0] = mul(g, dy, d)) != NULL;
}

/* softplus'(x) = sigmoid(x). */
bool ir_grad_softplus(ir_graph *g, const ir_node *n, ir_node *dy, ir_node **dx) {
  return (dx[0] = mul(g, dy, dsc_unary(g, DSC_OP_SIGMOID, n->in[0]))) != NULL;
}

/* sin' = cos, cos' = -sin. */
bool ir_grad_sin(ir_graph *g, const ir_node *n, ir_node *dy, ir_node **dx) {
  return (dx[0] = mul(g, dy, dsc_unary(g, DSC_OP_COS, n->in[0]))) != NULL;
}

bool ir_grad_cos(ir_graph *g, const ir_node *n, ir_node *dy, ir_node **dx) {
  ir_node *s = dsc_unary(g, DSC_OP_SIN, n->in[0]);
  return (dx[0] = mul(g, dy, dsc_unary(g, DSC_OP_NEG, s))) != NULL;
}

bool ir_grad_sigmoid(ir_graph *g, const ir_node *n, ir_node *dy, ir_node **dx) {
  ir_node *y = (ir_node *)n;
  return (dx[0] = mul(g, dy, mul(g, y, rsubc(g, 1.0, y)))) != NULL;
}

/* y = x^p: dx = dy * p * x^(p-1). */
bool ir_grad_pow(ir_graph *g, const ir_node *n, ir_node *dy, ir_node **dx) {
  double p = ir_attr_float(n, "exponent");
  ir_node *x = n->in[0];
  if (p == 1.0) return (dx[0] = dy) != NULL;
  ir_node *xp;
  if (p == 2.0) {
    xp = x;
  } else {
    dsc_attr a = dsc_attr_float("exponent", p - 1.0);
    xp = dsc_build(g, DSC_OP_POW, &x, 1, &a, 1);
  }
  return (dx[0] = mul(g, dy, mulc(g, xp, p))) != NULL;
}

bool ir_grad_cast(ir_graph *g, const ir_node *n, ir_node *dy, ir_node **dx) {
  dsc_dtype from = n->in[0]->type.dtype;
  dx[0] = NULL;
  if (!dsc_dtype_is_float(from) || !dsc_dtype_is_float(n->type.dtype)) return true;
  dx[0] = from == n->type.dtype ? dy : dsc_cast(g, dy, from);
  return dx[0] != NULL;
}

/* ---------------------------------------------------------------- reductions */

/* dy reshaped to the keepdims shape of reduce node n. */
static ir_node *dy_keep(ir_graph *g, const ir_node *n, ir_node *dy) {
  dsc_type k = keep_shape(n);
  return reshape_to(g, dy, &k);
}

static int reduce_axes(const ir_node *n) {
  int cnt;
  ir_attr_ints(n, "axes", &cnt);
  return cnt;
}

bool ir_grad_sum(ir_graph *g, const ir_node *n, ir_node *dy, ir_node **dx) {
  if (reduce_axes(n) == 0) return (dx[0] = dy) != NULL;
  return (dx[0] = broadcast_to(g, dy_keep(g, n, dy), &n->in[0]->type)) != NULL;
}

bool ir_grad_mean(ir_graph *g, const ir_node *n, ir_node *dy, ir_node **dx) {
  if (reduce_axes(n) == 0) return (dx[0] = dy) != NULL;
  double count = (double)dsc_type_numel(&n->in[0]->type) / (double)dsc_type_numel(&n->type);
  ir_node *b = broadcast_to(g, dy_keep(g, n, dy), &n->in[0]->type);
  return (dx[0] = mulc(g, b, 1.0 / count)) != NULL;
}

/* The gradient goes to the positions equal to the maximum, split equally
 * among ties: dx = mask * dy / count(mask). */
bool ir_grad_max(ir_graph *g, const ir_node *n, ir_node *dy, ir_node **dx) {
  if (reduce_axes(n) == 0) return (dx[0] = dy) != NULL;
  ir_node *x = n->in[0];
  ir_node *mask =
      dsc_cast(g, dsc_binary(g, DSC_OP_EQUAL, x, dy_keep(g, n, (ir_node *)n)), n->type.dtype);
  int cnt;
  const int64_t *axes = ir_attr_ints(n, "axes", &cnt);
  ir_node *count = dsc_reduce(g, DSC_OP_SUM, mask, axes, cnt, 1);
  return (dx[0] = mul(g, mask, divide(g, dy_keep(g, n, dy), count))) != NULL;
}

/* ---------------------------------------------------------------- layout */

bool ir_grad_reshape(ir_graph *g, const ir_node *n, ir_node *dy, ir_node **dx) {
  return (dx[0] = reshape_to(g, dy, &n->in[0]->type)) != NULL;
}

bool ir_grad_permute(ir_graph *g, const ir_node *n, ir_node *dy, ir_node **dx) {
  int cnt;
  const int64_t *perm = ir_attr_ints(n, "perm", &cnt);
  int64_t inv[DSC_MAX_RANK];
  for (int i = 0; i < cnt && i < DSC_MAX_RANK; i++) inv[perm[i]] = i;
  return (dx[0] = dsc_permute(g, dy, inv, cnt)) != NULL;
}

/* The collectives' adjoints, over the same group: all_to_all and all_reduce
 * are their own (an exchange of equal chunks; the sum y_r = sum_s x_s has
 * dx_s = sum_r dy_r), all_gather and reduce_scatter each other's (chunk r
 * of the gathered value went to every rank: its gradient is the sum of
 * their chunks r). A wait's result is its start's (the data in flight), so
 * the wait's rule passes dy on and the start's rule runs the adjoint. */
bool ir_grad_collective_wait(ir_graph *g, const ir_node *n, ir_node *dy, ir_node **dx) {
  IR_UNUSED(g), IR_UNUSED(n);
  return (dx[0] = dy) != NULL;
}

bool ir_grad_collective_start(ir_graph *g, const ir_node *n, ir_node *dy, ir_node **dx) {
  dsc_op start = n->op == DSC_OP_ALL_GATHER_START       ? DSC_OP_REDUCE_SCATTER_START
                 : n->op == DSC_OP_REDUCE_SCATTER_START ? DSC_OP_ALL_GATHER_START
                                                        : n->op;
  dsc_op wait = start == DSC_OP_ALL_GATHER_START       ? DSC_OP_ALL_GATHER_WAIT
                : start == DSC_OP_REDUCE_SCATTER_START ? DSC_OP_REDUCE_SCATTER_WAIT
                : start == DSC_OP_ALL_REDUCE_START     ? DSC_OP_ALL_REDUCE_WAIT
                                                       : DSC_OP_ALL_TO_ALL_WAIT;
  dsc_attr a[3] = {dsc_attr_int("world", ir_attr_int(n, "world")),
                   dsc_attr_int("tag", ir_attr_int(n, "tag")),
                   dsc_attr_str("group", ir_attr_str(n, "group"))};
  ir_node *st = dsc_build(g, start, &dy, 1, a, 3);
  return st && (dx[0] = dsc_build(g, wait, &st, 1, NULL, 0)) != NULL;
}

/* local_shard: x [P] -> this rank's chunk [S]: dx is dy at the chunk and
 * zeros elsewhere, built as onehot(rank) [W, 1] * dy [1, S] flattened, the
 * rank being local_shard(iota(W)) over the same group (its one element). */
bool ir_grad_local_shard(ir_graph *g, const ir_node *n, ir_node *dy, ir_node **dx) {
  int64_t W = ir_attr_int(n, "world"), S = dy->type.dims[0], P = n->in[0]->type.dims[0];
  dsc_dtype dt = dy->type.dtype;
  dsc_attr io[3] = {dsc_attr_int("axis", 0), dsc_attr_dtype("dtype", DSC_F32),
                    dsc_attr_ints("shape", &W, 1)};
  dsc_attr ls[2] = {dsc_attr_int("world", W), dsc_attr_str("group", ir_attr_str(n, "group"))};
  ir_node *ranks = dsc_build(g, DSC_OP_IOTA, NULL, 0, io, 3);
  ir_node *me = ranks ? dsc_build(g, DSC_OP_LOCAL_SHARD, &ranks, 1, ls, 2) : NULL;
  int64_t col[2] = {W, 1}, row[2] = {1, S}, flat = W * S;
  ir_node *hot = dsc_cast(g, dsc_binary(g, DSC_OP_EQUAL, ranks, me), dt);
  ir_node *x = dsc_binary(g, DSC_OP_MUL, hot ? dsc_reshape(g, hot, col, 2) : NULL,
                          dsc_reshape(g, dy, row, 2));
  x = x ? dsc_reshape(g, x, &flat, 1) : NULL;
  if (x && flat != P) {
    dsc_attr sl[3] = {dsc_attr_int("axis", 0), dsc_attr_int("start", 0), dsc_attr_int("end", P)};
    x = dsc_build(g, DSC_OP_SLICE, &x, 1, sl, 3);
  }
  return (dx[0] = x) != NULL;
}

/* Pads dy back to the input's extent with zero constants on both sides. */
bool ir_grad_slice(ir_graph *g, const ir_node *n, ir_node *dy, ir_node **dx) {
  const dsc_type *x = &n->in[0]->type;
  int64_t axis = ir_attr_int(n, "axis"), start = ir_attr_int(n, "start");
  int64_t end = ir_attr_int(n, "end");
  ir_node *parts[3];
  int np = 0;
  if (start > 0) {
    dsc_type t = *x;
    t.dims[axis] = start;
    parts[np++] = dsc_const(g, 0.0, t);
  }
  parts[np++] = dy;
  if (end < x->dims[axis]) {
    dsc_type t = *x;
    t.dims[axis] = x->dims[axis] - end;
    parts[np++] = dsc_const(g, 0.0, t);
  }
  if (np == 1) return (dx[0] = dy) != NULL;
  dsc_attr a = dsc_attr_int("axis", axis);
  return (dx[0] = dsc_build(g, DSC_OP_CONCAT, parts, np, &a, 1)) != NULL;
}

bool ir_grad_concat(ir_graph *g, const ir_node *n, ir_node *dy, ir_node **dx) {
  int64_t axis = ir_attr_int(n, "axis"), off = 0;
  if (n->n_in == 1) return (dx[0] = dy) != NULL;
  bool ok = true;
  for (int i = 0; i < n->n_in; i++) {
    int64_t len = n->in[i]->type.dims[axis];
    dsc_attr a[3] = {dsc_attr_int("axis", axis), dsc_attr_int("start", off),
                     dsc_attr_int("end", off + len)};
    dx[i] = dsc_build(g, DSC_OP_SLICE, &dy, 1, a, 3);
    ok = ok && dx[i];
    off += len;
  }
  return ok;
}

bool ir_grad_broadcast(ir_graph *g, const ir_node *n, ir_node *dy, ir_node **dx) {
  return (dx[0] = sum_to(g, dy, &n->in[0]->type)) != NULL;
}

/* The table's gradient is a scatter-add of dy rows into [V, D]. */
bool ir_grad_embedding(ir_graph *g, const ir_node *n, ir_node *dy, ir_node **dx) {
  ir_node *in[2] = {n->in[1], dy};
  dsc_attr a = dsc_attr_int("rows", n->in[0]->type.dims[0]);
  dx[0] = dsc_build(g, DSC_OP_EMBEDDING_GRAD, in, 2, &a, 1);
  dx[1] = NULL;
  return dx[0] != NULL;
}

/* embedding_grad is linear in dy; its adjoint is a lookup of the rows. */
bool ir_grad_embedding_grad(ir_graph *g, const ir_node *n, ir_node *dy, ir_node **dx) {
  dx[0] = NULL;
  return (dx[1] = dsc_binary(g, DSC_OP_EMBEDDING, dy, n->in[0])) != NULL;
}

/* ---------------------------------------------------------------- matmul */

/* y = a b with batch dims broadcast: da = dy b^T, db = a^T dy, each summed
 * over the batch axes its operand was broadcast along. */
/* [..., R, C] -> [prod(...) * R, C]: a free view of a contiguous value. */
static ir_node *flatten_rows(ir_graph *g, ir_node *x) {
  if (!x) return NULL;
  int64_t rows = dsc_type_numel(&x->type) / x->type.dims[x->type.rank - 1];
  int64_t shape[2] = {rows, x->type.dims[x->type.rank - 1]};
  return dsc_reshape(g, x, shape, 2);
}

static bool is_transpose_2d(const ir_node *x) {
  if (x->op != DSC_OP_PERMUTE || x->type.rank != 2) return false;
  int n;
  const int64_t *perm = ir_attr_ints(x, "perm", &n);
  return n == 2 && perm[0] == 1 && perm[1] == 0;
}

/* With a weight b of rank 2 shared by every batch of a, d b is one GEMM
 * over all rows at once, a^T [K, P] . dy [P, N], rather than one GEMM per
 * batch and a sum: the same numbers, a far better GEMM shape. When b is
 * itself w^T (a tied embedding) the product is formed as dy^T . a, [N, K],
 * so that w's gradient needs no transposing copy. */
bool ir_grad_matmul(ir_graph *g, const ir_node *n, ir_node *dy, ir_node **dx) {
  ir_node *a = n->in[0], *b = n->in[1];
  dx[0] = sum_to(g, dsc_matmul(g, dy, transpose(g, b)), &a->type);
  if (b->type.rank == 2 && a->type.rank > 2) {
    ir_node *a2 = flatten_rows(g, a), *dy2 = flatten_rows(g, dy);
    if (is_transpose_2d(b))
      dx[1] = transpose(g, dsc_matmul(g, transpose(g, dy2), a2));
    else
      dx[1] = dsc_matmul(g, transpose(g, a2), dy2);
  } else {
    dx[1] = sum_to(g, dsc_matmul(g, transpose(g, a), dy), &b->type);
  }
  return dx[0] && dx[1];
}

/* ---------------------------------------------------------------- composites */

/* dx = y (dy - sum(dy y)) along the axis. */
bool ir_grad_softmax(ir_graph *g, const ir_node *n, ir_node *dy, ir_node **dx) {
  ir_node *y = (ir_node *)n;
  int64_t axis = ir_attr_int(n, "axis");
  return (dx[0] = mul(g, y, sub(g, dy, sum_keep(g, mul(g, dy, y), axis)))) != NULL;
}

/* dx = dy - exp(y) sum(dy) along the axis. */
bool ir_grad_log_softmax(ir_graph *g, const ir_node *n, ir_node *dy, ir_node **dx) {
  int64_t axis = ir_attr_int(n, "axis");
  ir_node *p = dsc_unary(g, DSC_OP_EXP, (ir_node *)n);
  return (dx[0] = sub(g, dy, mul(g, p, sum_keep(g, dy, axis)))) != NULL;
}

/* Recomputes xhat = (x - mean) * rstd, then with gx = dy * w:
 * dx = rstd (gx - mean(gx) - xhat mean(gx xhat)), dw = sum(dy xhat), db = sum(dy). */
bool ir_grad_layernorm(ir_graph *g, const ir_node *n, ir_node *dy, ir_node **dx) {
  ir_node *x = n->in[0], *w = n->in[1], *b = n->in[2];
  int64_t ax = x->type.rank - 1;
  ir_node *xc = sub(g, x, mean_keep(g, x, ax));
  ir_node *var = mean_keep(g, mul(g, xc, xc), ax);
  ir_node *rstd =
      dsc_unary(g, DSC_OP_RSQRT, add(g, var, scalar(g, ir_attr_float(n, "eps"), dtype_of(x))));
  ir_node *xhat = mul(g, xc, rstd);
  ir_node *gx = mul(g, dy, w);
  ir_node *inner =
      sub(g, sub(g, gx, mean_keep(g, gx, ax)), mul(g, xhat, mean_keep(g, mul(g, gx, xhat), ax)));
  dx[0] = mul(g, rstd, inner);
  dx[1] = sum_to(g, mul(g, dy, xhat), &w->type);
  dx[2] = sum_to(g, dy, &b->type);
  return dx[0] && dx[1] && dx[2];
}

/* Recomputes r = rsqrt(mean(x^2) + eps), xhat = x r; with gx = dy * w:
 * dx = r (gx - xhat mean(gx xhat)), dw = sum(dy xhat). */
bool ir_grad_rmsnorm(ir_graph *g, const ir_node *n, ir_node *dy, ir_node **dx) {
  ir_node *x = n->in[0], *w = n->in[1];
  int64_t ax = x->type.rank - 1;
  ir_node *ms = mean_keep(g, mul(g, x, x), ax);
  ir_node *r =
      dsc_unary(g, DSC_OP_RSQRT, add(g, ms, scalar(g, ir_attr_float(n, "eps"), dtype_of(x))));
  ir_node *xhat = mul(g, x, r);
  ir_node *gx = mul(g, dy, w);
  dx[0] = mul(g, r, sub(g, gx, mul(g, xhat, mean_keep(g, mul(g, gx, xhat), ax))));
  dx[1] = sum_to(g, mul(g, dy, xhat), &w->type);
  return dx[0] && dx[1];
}

/* Recomputes the probabilities in IR ops, per head (the layout of
 * ir/attention.c: q [B, KVH, G, T, hd], k and v [B, KVH, 1, S, hd]):
 *   S = Q K^T scale, masked where s > t + S - T when causal (and where s <=
 *   t + S - T - window with a window), P = softmax(S)
 * and backpropagates: dV = P^T dO, dP = dO V^T, dS = P (dP - sum(dP P)),
 * dQ = dS K scale, dK = dS^T Q scale, dK and dV summed over the G query
 * heads that share them. Masked entries have P = 0, so they get no gradient
 * without a second mask. */
bool ir_grad_attention(ir_graph *g, const ir_node *n, ir_node *dy, ir_node **dx) {
  int64_t G = ir_attn_groups(n), KVH = ir_attr_int(n, "kv_heads");
  int64_t T = n->type.dims[1], S = n->in[1]->type.dims[1];
  bool grouped = G > 1;
  dsc_dtype dt = n->type.dtype;
  double scale = ir_attr_float(n, "scale");
  ir_node *q = ir_attn_split(g, n->in[0], KVH, G, grouped, false);
  ir_node *k = ir_attn_split(g, n->in[1], KVH, 1, grouped, false);
  ir_node *v = ir_attn_split(g, n->in[2], KVH, 1, grouped, false);
  ir_node *dout = ir_attn_split(g, dy, KVH, G, grouped, false);
  ir_node *s = mulc(g, dsc_matmul(g, q, transpose(g, k)), scale);
  int64_t ax = grouped ? 4 : 3;
  if (ir_attr_bool(n, "causal"))
    s = dsc_build(g, DSC_OP_WHERE,
                  (ir_node *[]){ir_attn_masked(g, T, S, ir_attr_int(n, "window")),
                                scalar(g, -INFINITY, dt), s},
                  3, NULL, 0);
  dsc_attr axa = dsc_attr_int("axis", ax);
  ir_node *p = dsc_build(g, DSC_OP_SOFTMAX, &s, 1, &axa, 1);
  ir_node *dv = dsc_matmul(g, transpose(g, p), dout);
  ir_node *dp = dsc_matmul(g, dout, transpose(g, v));
  ir_node *ds = mulc(g, mul(g, p, sub(g, dp, sum_keep(g, mul(g, dp, p), ax))), scale);
  ir_node *dk = dsc_matmul(g, transpose(g, ds), q);
  if (grouped) dk = sum_keep(g, dk, 2), dv = sum_keep(g, dv, 2); /* over the group's query heads */
  dx[0] = ir_attn_merge(g, dsc_matmul(g, ds, k));
  dx[1] = ir_attn_merge(g, dk);
  dx[2] = ir_attn_merge(g, dv);
  return dx[0] && dx[1] && dx[2];
}

/* A rotation by -angle is the transpose of one by angle, and angles are
 * linear in the position: dx = rope(dy) at the negated positions. */
bool ir_grad_rope(ir_graph *g, const ir_node *n, ir_node *dy, ir_node **dx) {
  ir_node *back = dsc_unary(g, DSC_OP_NEG, n->in[1]);
  dx[0] = dsc_build(g, DSC_OP_ROPE, (ir_node *[]){dy, back}, 2, n->attrs, n->n_attrs);
  dx[1] = NULL;
  return dx[0] != NULL;
}

/* dropout is linear in x with a mask that its attributes and seed decide:
 * the gradient is the same dropout of dy (the same bits, recomputed). */
bool ir_grad_dropout(ir_graph *g, const ir_node *n, ir_node *dy, ir_node **dx) {
  dx[0] = dsc_dropout(g, dy, n->in[1], ir_attr_float(n, "p"), ir_attr_int(n, "stream"));
  dx[1] = NULL;
  return dx[0] != NULL;
}

/* d logits = (softmax(logits) - one_hot(targets)) * dy / positions, with the
 * one-hot built as cast(equal(iota along the class axis, targets[..., None])). */
bool ir_grad_cross_entropy(ir_graph *g, const ir_node *n, ir_node *dy, ir_node **dx) {
  ir_node *lg = n->in[0], *tg = n->in[1];
  const dsc_type *lt = &lg->type;
  int64_t ax = lt->rank - 1;
  dsc_attr sa = dsc_attr_int("axis", ax);
  ir_node *sm = dsc_build(g, DSC_OP_SOFTMAX, &lg, 1, &sa, 1);
  dsc_attr ia[3] = {dsc_attr_int("axis", ax), dsc_attr_dtype("dtype", tg->type.dtype),
                    dsc_attr_ints("shape", lt->dims, lt->rank)};
  ir_node *cls = dsc_build(g, DSC_OP_IOTA, NULL, 0, ia, 3);
  dsc_type tk = tg->type;
  tk.dims[tk.rank++] = 1;
  ir_node *onehot =
      dsc_cast(g, dsc_binary(g, DSC_OP_EQUAL, cls, reshape_to(g, tg, &tk)), lt->dtype);
  double positions = (double)dsc_type_numel(&tg->type);
  dx[0] = mul(g, sub(g, sm, onehot), mulc(g, dy, 1.0 / positions));
  dx[1] = NULL;
  return dx[0] != NULL;
}

/* ---------------------------------------------------------------- the table */

/* The rules are declared in the op table (include/dsc/ops.def); this
 * array is the op table's grad column, for passes that take a rule set. */
static ir_grad_fn grad_rules[DSC_OP_COUNT];
static pthread_once_t grad_rules_once = PTHREAD_ONCE_INIT;

static void collect_rules(void) {
  for (int op = 0; op < DSC_OP_COUNT; op++) grad_rules[op] = ir_op((dsc_op)op)->grad;
}

bool ir_grad_none(ir_graph *g, const ir_node *n, ir_node *dy, ir_node **dx) {
  IR_UNUSED(g), IR_UNUSED(dy), IR_UNUSED(dx);
  ir_error(n->graph->module->ctx, n->loc, "op '%s' has no gradient rule", dsc_op_name(n->op));
  return false;
}

const ir_grad_fn *ir_grad_rules(void) {
  pthread_once(&grad_rules_once, collect_rules);
  return grad_rules;
}

ir_grad_fn ir_grad_rule(dsc_op op) { return (unsigned)op < DSC_OP_COUNT ? ir_grad_rules()[op] : NULL; }
