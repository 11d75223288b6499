/* Lowering of a fused graph (passes/fuse.c) to a cg_program.
 *
 * - One LAUNCH per fusion group: stages REDUCE (each reduction), LET (each
 *   outer-only value read by a member over the whole domain), then STORE (each member used
 *   outside the group). Members not stored are recomputed (expression DAGs).
 * - Inlinable nodes (const, iota, elementwise/views of them) are recomputed
 *   by every kernel that reads them; they get a buffer (a copy kernel) only
 *   when a GEMM, embedding_grad, output or assign needs one.
 * - Views (permute, slice, broadcast, reshape) outside groups are strides
 *   over their base buffer (free); a reshape that strides cannot express
 *   copies its input first. GEMM operands fold views into cg_matrix strides
 *   (a transpose is swapped strides, a broadcast batch dim stride 0); an
 *   operand with neither unit row nor unit column stride is copied.
 * - concat: one copy kernel per input into its slice of the result buffer.
 * - set_rows: a copy of x, then its rows written; assigned to x's own
 *   state and read by nothing after, the rows go into the state in place.
 * - embedding_grad: a scatter-add into a zero-filled buffer; in a tied
 *   embedding's add(GEMM result, embedding_grad) it adds into the GEMM's
 *   buffer in place instead, and the add is that buffer (embedding_grad_base).
 * - Params and states live in the STATE arena (cg_state_layout); inputs and
 *   temporaries in WORK, placed first-fit by liveness (64-byte aligned).
 * - An assign whose value is stored by a kernel is written in place into the
 *   param's STATE buffer when no later instruction reads the param and the
 *   kernel reads the param only at the element it writes; STORE stages are
 *   ordered so that every stage reading a param runs before its in-place
 *   store.
 * - Collectives (start/wait pairs) become COLLECTIVE_START / _WAIT
 *   instructions over contiguous buffers: src (the input, copied or staged
 *   when not contiguous) and a new dst. Both stay live, and unwritten, from
 *   the start to the wait: their liveness covers the wait, and an in-place
 *   assign never writes a buffer a later instruction (the wait) still
 *   names. A start the graph never waits is waited at the end. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/codegen.h"
#include "dsc/comm.h"

typedef struct {
  int buffer;
  int64_t offset;
  int rank;
  int64_t dims[DSC_MAX_RANK], strides[DSC_MAX_RANK];
} view;

typedef struct {
  int node;    /* stored node */
  int stage;   /* its STORE stage */
} store_rec;

typedef struct {
  const ir_graph *g;
  ir_arena *a;
  dsc_context *ctx;
  cg_program *p;
  int n;
  int *buf;     /* node -> buffer holding it contiguously (offset 0), -1 */
  bool *pure;   /* inlinable (recomputed) */
  int *users;   /* per node: number of consumers */
  int **user_list;
  bool *is_output;
  int *store_instr; /* node -> instruction of the kernel that stores it, -1 */
  bool *alias;      /* node (an add) -> its value is in buf[] already (embedding_grad_base) */
  int *param_buf;   /* module param index -> buffer */
  int *input_buf;   /* graph input position -> buffer */
  /* kernel under construction */
  int cur_group;
  ir_domain dom;
  int *slot; /* node -> slot (current kernel), -1 */
  int n_args, cap_args, cap_arg_buf;
  kir_arg *args;
  int *arg_buf;
  int n_stages, cap_stages;
  kir_stage *stages;
  int n_slots, cap_slots;
  dsc_dtype *slot_types;
  /* memo of node expressions within one stage */
  int *memo_stamp;
  ir_affine *memo_pt; /* n * DSC_MAX_RANK */
  kir_expr **memo_expr;
  int stamp;
  /* collectives: node -> collective id (starts), and one record per id */
  int *coll_of;
  int n_coll, cap_coll;
  struct coll_rec *coll;
  const ir_node **assign_src; /* per assign (node order): its value */
  unsigned char *phase;       /* node -> ir_phase */
  const ir_node **instr_node; /* per instruction: the node it came from (NULL: none) */
  int cap_instr_node;
  dsc_status status;
} L;

/* A started collective: its buffers and whether the graph waited it. For a
 * sum in bf16/f16 (the communicator sums f32, f64, i32, i64) the data
 * travels as f32: `staged`, and the wait converts dst into a new buffer. */
typedef struct coll_rec {
  const ir_node *start;
  int src, dst;
  cg_collective c;
  bool staged, waited;
} coll_rec;

static dsc_dtype ct(dsc_dtype t) { return t == DSC_BF16 || t == DSC_F16 ? DSC_F32 : t; }

static bool fail(L *l, const ir_node *n, dsc_status st, const char *fmt, const char *a) {
  char msg[512]; /* room for the callers' messages (up to 400 bytes) */
  snprintf(msg, sizeof msg, fmt, a);
  if (n)
    ir_error(l->ctx, n->loc, "codegen: node %%%d (%s): %s", n->id, dsc_op_name(n->op), msg);
  else
    ir_error(l->ctx, ir_no_loc, "codegen: %s", msg);
  if (l->status == DSC_OK) l->status = st;
  return false;
}

static bool oom(L *l) { return fail(l, NULL, DSC_ERR_INTERNAL, "out of memory%s", ""); }

static int64_t align64(int64_t x) { return (x + 63) & ~(int64_t)63; }

static void contiguous(const dsc_type *t, int64_t *strides) {
  int64_t s = 1;
  for (int d = t->rank - 1; d >= 0; d--) strides[d] = s, s *= t->dims[d];
}

/* ------------------------------------------------------------ program pieces */

static int new_buffer(L *l, cg_buf_kind kind, int index, dsc_dtype dt, int64_t numel) {
  cg_program *p = l->p;
  if (!ir_grow(l->a, (void **)&p->buffers, &p->cap_buffers, p->n_buffers + 1, sizeof(cg_buffer)))
    return oom(l), -1;
  cg_buffer *b = &p->buffers[p->n_buffers];
  memset(b, 0, sizeof *b);
  b->kind = kind, b->index = index, b->dtype = dt, b->numel = numel;
  b->first_use = b->last_use = -1;
  return p->n_buffers++;
}

/* A node's guard (passes/guard.c) as a buffer: its condition's, when an
 * earlier instruction has produced it (a buffer is set when its producer is
 * emitted); else none, and the instruction always runs. */
static void guard_of(const L *l, const ir_node *node, bool *guarded, bool *when, int *buffer) {
  *guarded = false, *when = false, *buffer = -1;
  if (!node || !node->guard || l->buf[node->guard->id] < 0) return;
  *guarded = true, *when = node->guard_if, *buffer = l->buf[node->guard->id];
}

static cg_instr *new_instr(L *l, cg_ins_kind kind, const ir_node *node) {
  cg_program *p = l->p;
  if (!ir_grow(l->a, (void **)&p->instrs, &p->cap_instrs, p->n_instrs + 1, sizeof(cg_instr)))
    return oom(l), NULL;
  if (!ir_grow(l->a, (void **)&l->instr_node, &l->cap_instr_node, p->n_instrs + 1,
               sizeof(ir_node *)))
    return oom(l), NULL;
  l->instr_node[p->n_instrs] = node;
  cg_instr *in = &p->instrs[p->n_instrs++];
  memset(in, 0, sizeof *in);
  in->kind = kind;
  in->op = node ? dsc_op_name(node->op) : NULL;
  /* an instruction of no node (a tier wait at the end) joins the one before */
  in->phase = node ? l->phase[node->id] : p->n_instrs > 1 ? p->instrs[p->n_instrs - 2].phase : 0;
  in->ids = in->src = in->dst = -1;
  guard_of(l, node, &in->guarded, &in->guard_if, &in->guard);
  return in;
}

static view contiguous_view(const cg_program *p, int buffer, const dsc_type *t) {
  view v;
  memset(&v, 0, sizeof v);
  v.buffer = buffer;
  v.rank = t->rank;
  memcpy(v.dims, t->dims, sizeof(int64_t) * (size_t)t->rank);
  contiguous(t, v.strides);
  (void)p;
  return v;
}

static bool view_is_contiguous(const view *v) {
  int64_t s = 1;
  for (int d = v->rank - 1; d >= 0; d--) {
    if (v->dims[d] != 1 && v->strides[d] != s) return false;
    s *= v->dims[d];
  }
  return true;
}

/* Reshape of a strided view without copying (false: needs a copy). */
static bool view_reshape(const view *in, const dsc_type *to, view *out) {
  *out = *in;
  out->rank = to->rank;
  memcpy(out->dims, to->dims, sizeof(int64_t) * (size_t)to->rank);
  int ia[DSC_MAX_RANK], ib[DSC_MAX_RANK], na = 0, nb = 0;
  for (int i = 0; i < in->rank; i++)
    if (in->dims[i] != 1) ia[na++] = i;
  for (int j = 0; j < to->rank; j++) {
    out->strides[j] = 0;
    if (to->dims[j] != 1) ib[nb++] = j;
  }
  int i = 0, j = 0;
  while (i < na && j < nb) {
    int i0 = i, j0 = j;
    int64_t pa = in->dims[ia[i++]], pb = to->dims[ib[j++]];
    while (pa != pb) {
      if (pa < pb && i < na)
        pa *= in->dims[ia[i++]];
      else if (pb < pa && j < nb)
        pb *= to->dims[ib[j++]];
      else
        return false;
    }
    for (int x = i0; x + 1 < i; x++)
      if (in->strides[ia[x]] != in->strides[ia[x + 1]] * in->dims[ia[x + 1]]) return false;
    int64_t s = in->strides[ia[i - 1]];
    for (int y = j - 1; y >= j0; y--) out->strides[ib[y]] = s, s *= to->dims[ib[y]];
  }
  return i == na && j == nb;
}

/* ------------------------------------------------------------ kernel builder */

static void kb_clear(L *l) { l->n_args = l->n_stages = l->n_slots = 0; }

static void kb_reset(L *l, int group, const ir_domain *d) {
  l->cur_group = group;
  l->dom = *d;
  l->n_args = l->n_stages = l->n_slots = 0;
  /* slot[] is read for members of cur_group only (member()); lower_group
   * clears its own nodes' entries: clearing all n here was quadratic. */
}

static int kb_arg(L *l, int buffer, bool write) {
  for (int i = 0; i < l->n_args; i++)
    if (l->arg_buf[i] == buffer) {
      if (write) l->args[i].written = true;
      else l->args[i].read = true;
      return i;
    }
  if (!ir_grow(l->a, (void **)&l->args, &l->cap_args, l->n_args + 1, sizeof(kir_arg)) ||
      !ir_grow(l->a, (void **)&l->arg_buf, &l->cap_arg_buf, l->n_args + 1, sizeof(int)))
    return oom(l), -1;
  const cg_buffer *b = &l->p->buffers[buffer];
  kir_arg *a = &l->args[l->n_args];
  memset(a, 0, sizeof *a);
  a->dtype = b->dtype;
  a->numel = b->numel;
  a->read = !write;
  a->written = write;
  l->arg_buf[l->n_args] = buffer;
  return l->n_args++;
}

static kir_stage *kb_stage(L *l, kir_stage_kind kind) {
  if (!ir_grow(l->a, (void **)&l->stages, &l->cap_stages, l->n_stages + 1, sizeof(kir_stage)))
    return oom(l), NULL;
  kir_stage *s = &l->stages[l->n_stages++];
  memset(s, 0, sizeof *s);
  s->kind = kind;
  l->stamp++; /* expressions are memoised per stage */
  return s;
}

static int kb_slot(L *l, dsc_dtype t) {
  if (!ir_grow(l->a, (void **)&l->slot_types, &l->cap_slots, l->n_slots + 1, sizeof(dsc_dtype)))
    return oom(l), -1;
  l->slot_types[l->n_slots] = t;
  return l->n_slots++;
}

/* Finishes the kernel: appends it and its LAUNCH; returns the instr index. */
static int kb_finish(L *l, const ir_node *node, const char *opname) {
  cg_program *p = l->p;
  kir_kernel *k = ir_arena_alloc(l->a, sizeof *k);
  if (!k) return oom(l), -1;
  int instr = p->n_instrs;
  k->name = ir_arena_printf(l->a, "k%d_%s", instr, opname);
  k->rank = l->dom.rank;
  k->n_outer = l->dom.n_outer;
  memcpy(k->dims, l->dom.dims, sizeof(int64_t) * (size_t)k->rank);
  k->n_args = l->n_args;
  k->args = ir_arena_alloc(l->a, sizeof(kir_arg) * (size_t)(l->n_args ? l->n_args : 1));
  k->n_slots = l->n_slots;
  k->slot_types = ir_arena_alloc(l->a, sizeof(dsc_dtype) * (size_t)(l->n_slots ? l->n_slots : 1));
  k->n_stages = l->n_stages;
  k->stages = ir_arena_alloc(l->a, sizeof(kir_stage) * (size_t)(l->n_stages ? l->n_stages : 1));
  int *args = ir_arena_alloc(l->a, sizeof(int) * (size_t)(l->n_args ? l->n_args : 1));
  if (!k->name || !k->args || !k->slot_types || !k->stages || !args) return oom(l), -1;
  if (l->n_args) memcpy(k->args, l->args, sizeof(kir_arg) * (size_t)l->n_args);
  if (l->n_slots) memcpy(k->slot_types, l->slot_types, sizeof(dsc_dtype) * (size_t)l->n_slots);
  if (l->n_stages) memcpy(k->stages, l->stages, sizeof(kir_stage) * (size_t)l->n_stages);
  if (l->n_args) memcpy(args, l->arg_buf, sizeof(int) * (size_t)l->n_args);
  char err[256];
  if (!kir_validate(k, err, sizeof err)) {
    char msg[400];
    snprintf(msg, sizeof msg, "kernel %s is invalid: %s", k->name, err);
    return fail(l, node, DSC_ERR_INTERNAL, "%s", msg), -1;
  }
  if (!ir_grow(l->a, (void **)&p->kernels, &p->cap_kernels, p->n_kernels + 1, sizeof(kir_kernel *)))
    return oom(l), -1;
  p->kernels[p->n_kernels] = k;
  cg_instr *in = new_instr(l, CG_INS_LAUNCH, node);
  if (!in) return -1;
  in->kernel = p->n_kernels++;
  in->n_args = l->n_args;
  in->args = args;
  kb_clear(l);
  return instr;
}

/* ------------------------------------------------------------ values */

static bool resolve(L *l, const ir_node *n, view *v);
static bool materialize(L *l, const ir_node *n);

/* k + sum c[v] * index(v) as an i64 expression. */
static kir_expr *affine_expr(L *l, const ir_affine *p) {
  kir_expr *e = NULL;
  for (int v = 0; v < l->dom.rank; v++) {
    if (!p->c[v]) continue;
    kir_expr *t = kir_index(l->a, v);
    if (p->c[v] != 1) t = kir_bin(l->a, KIR_MUL, t, kir_const(l->a, DSC_I64, (double)p->c[v]));
    e = e ? kir_bin(l->a, KIR_ADD, e, t) : t;
  }
  if (!e) return kir_const(l->a, DSC_I64, (double)p->k);
  if (p->k) e = kir_bin(l->a, KIR_ADD, e, kir_const(l->a, DSC_I64, (double)p->k));
  return e;
}

static kir_access view_access(L *l, const view *v, const ir_affine *pt, bool write) {
  kir_access acc;
  memset(&acc, 0, sizeof acc);
  acc.arg = kb_arg(l, v->buffer, write);
  acc.offset = v->offset;
  for (int d = 0; d < v->rank; d++) {
    if (v->dims[d] == 1) continue;
    acc.offset += v->strides[d] * pt[d].k;
    for (int x = 0; x < l->dom.rank; x++) acc.stride[x] += v->strides[d] * pt[d].c[x];
  }
  return acc;
}

static kir_expr *expr(L *l, const ir_node *n, const ir_affine *pt);

static kir_expr *input_expr(L *l, const ir_node *n, int i, const ir_affine *pt) {
  ir_affine pin[DSC_MAX_RANK];
  memset(pin, 0, sizeof pin);
  if (!ir_input_point(n, i, &l->dom, pt, pin)) {
    fail(l, n, DSC_ERR_INTERNAL, "input %s cannot be read at an affine point", i ? "1+" : "0");
    return NULL;
  }
  return expr(l, n->in[i], pin);
}

/* An elementwise op's kernel expression: the formula of its row in
 * include/dsc/ops.def over the input expressions in[], in kernel IR (which
 * the LLVM and CUDA printers print), constants of type T. */
#define F_X in[0]
#define F_Y in[1]
#define F_Z in[2]
#define F_P kir_const(A, T, p)
#define F_K(c) kir_const(A, T, (c))
#define F_ADD(a, b) kir_bin(A, KIR_ADD, (a), (b))
#define F_SUB(a, b) kir_bin(A, KIR_SUB, (a), (b))
#define F_MUL(a, b) kir_bin(A, KIR_MUL, (a), (b))
#define F_DIV(a, b) kir_bin(A, KIR_DIV, (a), (b))
#define F_MAX(a, b) kir_bin(A, KIR_MAX, (a), (b))
#define F_POW(a, b) kir_bin(A, KIR_POW, (a), (b))
#define F_LT(a, b) kir_bin(A, KIR_LT, (a), (b))
#define F_GT(a, b) kir_bin(A, KIR_GT, (a), (b))
#define F_EQ(a, b) kir_bin(A, KIR_EQ, (a), (b))
#define F_SEL(c, a, b) kir_select(A, (c), (a), (b))
#define F_NEG(a) kir_un(A, KIR_NEG, (a))
#define F_ABS(a) kir_un(A, KIR_ABS, (a))
#define F_EXP(a) kir_un(A, KIR_EXP, (a))
#define F_LOG(a) kir_un(A, KIR_LOG, (a))
#define F_SQRT(a) kir_un(A, KIR_SQRT, (a))
#define F_RSQRT(a) kir_un(A, KIR_RSQRT, (a))
#define F_TANH(a) kir_un(A, KIR_TANH, (a))
#define F_SIGMOID(a) kir_un(A, KIR_SIGMOID, (a))
#define F_SIN(a) kir_un(A, KIR_SIN, (a))
#define F_COS(a) kir_un(A, KIR_COS, (a))
#define F_RAND24(a, b) kir_bin(A, KIR_RAND24, (a), (b))
static kir_expr *formula_expr(ir_arena *A, dsc_op op, dsc_dtype T, kir_expr *const *in, double p) {
  IR_UNUSED(p);
  switch (op) {
#define OP(...)
#define EW(id, nm, nin, attrs, shp, ik, gr, fl, bi, formula) \
  case DSC_OP_##id:                                          \
    return formula;
#include "dsc/ops.def"
#undef OP
#undef EW
    default:
      return NULL;
  }
}

/* The value of n (an inlinable node or a member of the current group) at
 * point pt; other nodes are loads of their buffers or views. */
static kir_expr *compute(L *l, const ir_node *n, const ir_affine *pt) {
  ir_arena *a = l->a;
  dsc_dtype t = ct(n->type.dtype);
  switch (n->op) {
    case DSC_OP_CONST:
      return kir_const(a, t, t == DSC_BOOL ? (ir_attr_float(n, "value") != 0) : ir_attr_float(n, "value"));
    case DSC_OP_IOTA: {
      int64_t axis = ir_attr_int(n, "axis");
      return kir_cast(a, t, affine_expr(l, &pt[axis]));
    }
    case DSC_OP_BROADCAST:
    case DSC_OP_PERMUTE:
    case DSC_OP_SLICE:
    case DSC_OP_RESHAPE:
    case DSC_OP_SUM: /* over no axes: identity */
    case DSC_OP_MEAN:
    case DSC_OP_MAX:
      return input_expr(l, n, 0, pt);
    case DSC_OP_EMBEDDING: {
      kir_expr *ids = input_expr(l, n, 1, pt);
      view tv;
      if (!ids || !resolve(l, n->in[0], &tv)) return NULL;
      kir_access acc;
      memset(&acc, 0, sizeof acc);
      acc.arg = kb_arg(l, tv.buffer, false);
      const ir_affine *col = &pt[n->type.rank - 1];
      acc.offset = tv.offset + tv.strides[1] * col->k;
      for (int v = 0; v < l->dom.rank; v++) acc.stride[v] = tv.strides[1] * col->c[v];
      acc.gather = ids->type == DSC_I64 ? ids : kir_cast(a, DSC_I64, ids);
      acc.gather_stride = tv.strides[0];
      acc.gather_bound = tv.dims[0];
      return kir_load(a, t, acc);
    }
    default:
      break;
  }
  if (ir_op(n->op)->cg != IR_CG_ELEMENTWISE) {
    fail(l, n, DSC_ERR_INTERNAL, "op %s cannot be computed inside a kernel", dsc_op_name(n->op));
    return NULL;
  }
  kir_expr *in[3] = {NULL, NULL, NULL};
  for (int i = 0; i < n->n_in && i < 3; i++)
    if (!(in[i] = input_expr(l, n, i, pt))) return NULL;
  if (n->op == DSC_OP_CAST) return kir_cast(a, t, in[0]);
  if (n->op == DSC_OP_DIV && (in[1]->type == DSC_I32 || in[1]->type == DSC_I64)) {
    kir_expr *z = kir_bin(a, KIR_EQ, in[1], kir_const(a, in[1]->type, 0)); /* never divide by 0 */
    in[1] = kir_select(a, z, kir_const(a, in[1]->type, 1), in[1]);
  }
  const ir_op_info *oi = ir_op(n->op);
  double p = 0;
  for (int k = 0; k < oi->n_attrs; k++)
    if (oi->attr_kinds[k] == DSC_ATTR_FLOAT) p = ir_attr_float(n, oi->attr_keys[k]);
  if (!oi->scalar) {
    fail(l, n, DSC_ERR_INTERNAL, "elementwise op %s has no kernel expression",
         dsc_op_name(n->op));
    return NULL;
  }
  /* constants take the type of the value inputs (where's condition is bool) */
  return formula_expr(a, n->op, in[n->n_in - 1]->type, in, p); /* NULL: out of memory */
}

static bool member(const L *l, const ir_node *n) {
  return l->cur_group != 0 && n->group == l->cur_group;
}

static kir_expr *expr(L *l, const ir_node *n, const ir_affine *pt) {
  if (l->status != DSC_OK) return NULL;
  int r = n->type.rank;
  ir_affine *mp = &l->memo_pt[(size_t)n->id * DSC_MAX_RANK];
  if (l->memo_stamp[n->id] == l->stamp && ir_point_equal(&n->type, mp, pt))
    return l->memo_expr[n->id];
  kir_expr *e = NULL;
  if (l->alias[n->id]) { /* read from its buffer, as a value of another group */
    view v;
    if (!resolve(l, n, &v)) return NULL;
    e = kir_load(l->a, ct(n->type.dtype), view_access(l, &v, pt, false));
  } else if (member(l, n) && l->slot[n->id] >= 0) {
    int s = l->slot[n->id];
    e = kir_scalar(l->a, l->slot_types[s], s);
    if (n->op == DSC_OP_MEAN) {
      double cnt = (double)(dsc_type_numel(&n->in[0]->type) / dsc_type_numel(&n->type));
      e = kir_bin(l->a, KIR_DIV, e, kir_const(l->a, e ? e->type : DSC_F32, cnt));
    }
  } else if (member(l, n) || (n->group == 0 && l->pure[n->id])) {
    e = compute(l, n, pt);
  } else {
    view v;
    if (!resolve(l, n, &v)) return NULL;
    e = kir_load(l->a, ct(n->type.dtype), view_access(l, &v, pt, false));
  }
  if (!e) {
    if (l->status == DSC_OK) oom(l);
    return NULL;
  }
  l->memo_stamp[n->id] = l->stamp;
  memcpy(mp, pt, sizeof(ir_affine) * (size_t)(r > 0 ? r : 1));
  l->memo_expr[n->id] = e;
  return e;
}

/* A kernel over n's shape (no reduction) storing expression(n) contiguously
 * into a new buffer; afterwards n is read from that buffer. */
static bool materialize(L *l, const ir_node *n) {
  if (l->n_stages || l->n_args) /* never while another kernel is being built */
    return fail(l, n, DSC_ERR_INTERNAL, "nested materialization%s", "");
  bool pure = l->pure[n->id] && n->group == 0;
  view v;
  if (!pure && !resolve(l, n, &v)) return false;
  ir_domain d, saved_dom = l->dom;
  int saved_group = l->cur_group;
  dsc_type shape = n->type;
  ir_domain_make(&shape, 0, false, &d);
  kb_reset(l, 0, &d);
  int b = new_buffer(l, CG_BUF_TEMP, 0, n->type.dtype, dsc_type_numel(&n->type));
  if (b < 0) return false;
  ir_affine pt[DSC_MAX_RANK];
  bool full;
  memset(pt, 0, sizeof pt);
  ir_natural_map(&d, &n->type, pt, &full);
  if (!kb_stage(l, KIR_STAGE_STORE)) return false;
  kir_expr *e = pure ? compute(l, n, pt)
                     : kir_load(l->a, ct(n->type.dtype), view_access(l, &v, pt, false));
  if (!e) return l->status == DSC_OK ? oom(l) : false;
  view dv = contiguous_view(l->p, b, &n->type);
  kir_stage *st = &l->stages[0];
  st->over_inner = d.rank > d.n_outer;
  st->expr = e;
  st->dst = view_access(l, &dv, pt, true);
  if (kb_finish(l, n, dsc_op_name(n->op)) < 0) return false;
  l->buf[n->id] = b;
  l->cur_group = saved_group;
  l->dom = saved_dom;
  return true;
}

static int param_index(const L *l, const ir_node *n) {
  return dsc_module_find_param(l->g->module, ir_attr_str(n, "name"));
}

static bool resolve(L *l, const ir_node *n, view *v) {
  if (l->buf[n->id] >= 0) {
    *v = contiguous_view(l->p, l->buf[n->id], &n->type);
    return true;
  }
  switch (n->op) {
    case DSC_OP_PARAM: {
      int j = param_index(l, n);
      if (j < 0) return fail(l, n, DSC_ERR_USER, "unknown param '%s'", ir_attr_str(n, "name"));
      if (l->p->buffers[l->param_buf[j]].tier == CG_TIER_DISK) /* no memory of its own */
        return fail(l, n, DSC_ERR_USER,
                    "'%s' is on the disk tier: read it with tier_read_start (pass offload)",
                    ir_attr_str(n, "name"));
      *v = contiguous_view(l->p, l->param_buf[j], &n->type);
      return true;
    }
    case DSC_OP_ASSIGN:
      return resolve(l, n->in[0], v);
    default:
      break;
  }
  if (n->group != 0)
    return fail(l, n, DSC_ERR_INTERNAL, "value is read before its kernel stored it%s", "");
  if (l->pure[n->id]) {
    if (!materialize(l, n)) return false;
    *v = contiguous_view(l->p, l->buf[n->id], &n->type);
    return true;
  }
  view in;
  switch (n->op) {
    case DSC_OP_PERMUTE: {
      if (!resolve(l, n->in[0], &in)) return false;
      int cnt;
      const int64_t *perm = ir_attr_ints(n, "perm", &cnt);
      *v = in;
      for (int j = 0; j < cnt; j++) v->dims[j] = in.dims[perm[j]], v->strides[j] = in.strides[perm[j]];
      return true;
    }
    case DSC_OP_SLICE: {
      if (!resolve(l, n->in[0], &in)) return false;
      int64_t axis = ir_attr_int(n, "axis"), start = ir_attr_int(n, "start");
      *v = in;
      v->offset += start * in.strides[axis];
      v->dims[axis] = n->type.dims[axis];
      return true;
    }
    case DSC_OP_BROADCAST: {
      if (!resolve(l, n->in[0], &in)) return false;
      *v = in;
      v->rank = n->type.rank;
      int off = n->type.rank - in.rank;
      for (int j = 0; j < n->type.rank; j++) {
        v->dims[j] = n->type.dims[j];
        int k = j - off;
        v->strides[j] = k < 0 || in.dims[k] == 1 ? 0 : in.strides[k];
      }
      return true;
    }
    case DSC_OP_RESHAPE:
      if (!resolve(l, n->in[0], &in)) return false;
      if (view_reshape(&in, &n->type, v)) return true;
      if (!materialize(l, n->in[0]) || !resolve(l, n->in[0], &in)) return false;
      if (view_reshape(&in, &n->type, v)) return true;
      return fail(l, n, DSC_ERR_INTERNAL, "reshape of a contiguous buffer failed%s", "");
    default:
      break;
  }
  if (ir_op(n->op)->cg == IR_CG_COMPOSITE && n->op != DSC_OP_EMBEDDING_GRAD &&
      n->op != DSC_OP_SET_ROWS)
    return fail(l, n, DSC_ERR_USER, "op %s has no code generation; run the decompose pass",
                dsc_op_name(n->op));
  return fail(l, n, DSC_ERR_USER, "op %s has no code generation (run the fuse pass first)",
              dsc_op_name(n->op));
}

/* A view usable as a whole contiguous buffer (offset 0), copying if not. */
static int contiguous_buffer(L *l, const ir_node *n, bool allow_state) {
  view v;
  if (!resolve(l, n, &v)) return -1;
  bool ok = v.offset == 0 && view_is_contiguous(&v) &&
            l->p->buffers[v.buffer].numel == dsc_type_numel(&n->type) &&
            (allow_state || l->p->buffers[v.buffer].kind != CG_BUF_PARAM);
  if (ok) return v.buffer;
  if (!materialize(l, n)) return -1;
  return l->buf[n->id];
}

/* ------------------------------------------------------------ groups */

static int natural(L *l, const ir_node *n, ir_affine *pt, bool *full) {
  memset(pt, 0, sizeof(ir_affine) * DSC_MAX_RANK);
  return ir_natural_map(&l->dom, &n->type, pt, full);
}

static bool lower_group(L *l, ir_node **m, int cnt) {
  ir_domain d;
  if (!ir_group_domain(m, cnt, &d))
    return fail(l, m[0], DSC_ERR_INTERNAL, "fusion group %s has no common domain", "");
  /* Inputs read through views or copies first: materialization emits its
   * own kernels, which must not interleave with this one. */
  for (int i = 0; i < cnt; i++)
    for (int j = 0; j < m[i]->n_in; j++) {
      const ir_node *p = m[i]->in[j];
      if (p->group == m[i]->group) continue;
      if (m[i]->op == DSC_OP_EMBEDDING && j == 0) {
        view v;
        if (!resolve(l, p, &v)) return false;
      } else if (!(p->group == 0 && l->pure[p->id])) {
        view v;
        if (!resolve(l, p, &v)) return false;
      }
    }
  kb_reset(l, m[0]->group, &d);
  for (int i = 0; i < cnt; i++) l->slot[m[i]->id] = -1;
  bool *stored = ir_arena_alloc(l->a, sizeof(bool) * (size_t)cnt);
  if (!stored) return oom(l);
  /* REDUCE and LET stages in node order */
  for (int i = 0; i < cnt; i++) {
    ir_node *n = m[i];
    ir_affine pt[DSC_MAX_RANK];
    bool full;
    if (!natural(l, n, pt, &full))
      return fail(l, n, DSC_ERR_INTERNAL, "shape does not fit its fusion group%s", "");
    stored[i] = l->is_output[n->id];
    bool inner_user = false; /* an in-group consumer over the whole domain */
    for (int u = 0; u < l->users[n->id]; u++) {
      const ir_node *c = l->g->nodes[l->user_list[n->id][u]];
      ir_affine cp[DSC_MAX_RANK];
      bool cfull = false;
      if (c->group != n->group)
        stored[i] = true;
      else if (natural(l, c, cp, &cfull) && cfull)
        inner_user = true;
    }
    if (l->alias[n->id]) stored[i] = inner_user = false; /* in its buffer already */
    uint32_t mask;
    if (ir_reduction_mask(n, &mask)) {
      ir_affine pin[DSC_MAX_RANK];
      memset(pin, 0, sizeof pin);
      if (!ir_input_point(n, 0, &d, pt, pin))
        return fail(l, n, DSC_ERR_INTERNAL, "reduction does not fit its group's domain%s", "");
      kir_stage *st = kb_stage(l, KIR_STAGE_REDUCE);
      if (!st) return false;
      kir_expr *e = expr(l, n->in[0], pin);
      int s = kb_slot(l, ct(n->type.dtype));
      if (!e || s < 0) return false;
      st = &l->stages[l->n_stages - 1];
      st->reduce = n->op == DSC_OP_MAX ? KIR_REDUCE_MAX : KIR_REDUCE_SUM;
      st->slot = s;
      st->expr = e;
      l->slot[n->id] = s;
    } else if (!full && inner_user) {
      kir_stage *st = kb_stage(l, KIR_STAGE_LET);
      if (!st) return false;
      kir_expr *e = expr(l, n, pt);
      int s = kb_slot(l, ct(n->type.dtype));
      if (!e || s < 0) return false;
      st = &l->stages[l->n_stages - 1];
      st->slot = s;
      st->expr = e;
      l->slot[n->id] = s;
    }
  }
  /* STORE stages */
  int first_store = l->n_stages;
  store_rec *recs = ir_arena_alloc(l->a, sizeof(store_rec) * (size_t)cnt);
  int n_recs = 0;
  if (!recs) return oom(l);
  for (int i = 0; i < cnt; i++) {
    if (!stored[i]) continue;
    ir_node *n = m[i];
    ir_affine pt[DSC_MAX_RANK];
    bool full;
    natural(l, n, pt, &full);
    int b = new_buffer(l, CG_BUF_TEMP, 0, n->type.dtype, dsc_type_numel(&n->type));
    if (b < 0) return false;
    kir_stage *st = kb_stage(l, KIR_STAGE_STORE);
    if (!st) return false;
    kir_expr *e = expr(l, n, pt);
    if (!e) return false;
    if (e->type != ct(n->type.dtype)) e = kir_cast(l->a, ct(n->type.dtype), e);
    view dv = contiguous_view(l->p, b, &n->type);
    st = &l->stages[l->n_stages - 1];
    st->over_inner = full && d.rank > d.n_outer;
    st->expr = e;
    st->dst = view_access(l, &dv, pt, true);
    recs[n_recs++] = (store_rec){n->id, l->n_stages - 1};
    l->buf[n->id] = b;
  }
  (void)first_store;
  if (n_recs == 0) { /* nothing leaves the group: dead code */
    kb_clear(l);
    return true;
  }
  int instr = kb_finish(l, m[0], dsc_op_name(m[0]->op));
  if (instr < 0) return false;
  for (int i = 0; i < n_recs; i++) l->store_instr[recs[i].node] = instr;
  return true;
}

/* ------------------------------------------------------------ GEMM */

static bool lower_matmul(L *l, const ir_node *n) {
  view A, B;
  for (int side = 0; side < 2; side++) {
    view *v = side ? &B : &A;
    if (!resolve(l, n->in[side], v)) return false;
    int r = v->rank;
    bool unit = v->strides[r - 1] == 1 || v->dims[r - 1] == 1 || v->strides[r - 2] == 1 ||
                v->dims[r - 2] == 1;
    if (!unit && (!materialize(l, n->in[side]) || !resolve(l, n->in[side], v))) return false;
  }
  const dsc_type *t = &n->type;
  int b = new_buffer(l, CG_BUF_TEMP, 0, t->dtype, dsc_type_numel(t));
  if (b < 0) return false;
  view C = contiguous_view(l->p, b, t);
  int nb = t->rank - 2;
  int64_t bs[3][DSC_MAX_RANK];
  const view *ops[3] = {&A, &B, &C};
  for (int o = 0; o < 3; o++)
    for (int j = 0; j < nb; j++) {
      const view *v = ops[o];
      int k = j - (nb - (v->rank - 2));
      bs[o][j] = k < 0 || v->dims[k] == 1 ? 0 : v->strides[k];
    }
  /* batch dims beyond two become separate GEMMs over the leading indices */
  int lead = nb > 2 ? nb - 2 : 0;
  int64_t count = 1;
  for (int j = 0; j < lead; j++) count *= t->dims[j];
  for (int64_t it = 0; it < count; it++) {
    int64_t off[3] = {A.offset, B.offset, C.offset}, rem = it;
    for (int j = lead - 1; j >= 0; j--) {
      int64_t idx = rem % t->dims[j];
      rem /= t->dims[j];
      for (int o = 0; o < 3; o++) off[o] += idx * bs[o][j];
    }
    cg_instr *in = new_instr(l, CG_INS_GEMM, n);
    if (!in) return false;
    cg_gemm *gm = &in->gemm;
    gm->batch[0] = gm->batch[1] = 1;
    gm->m = t->dims[t->rank - 2];
    gm->n = t->dims[t->rank - 1];
    gm->k = A.dims[A.rank - 1];
    gm->alpha = 1;
    gm->beta = 0;
    cg_matrix *mx[3] = {&gm->a, &gm->b, &gm->c};
    for (int o = 0; o < 3; o++) {
      const view *v = ops[o];
      mx[o]->buffer = v->buffer;
      mx[o]->offset = off[o];
      mx[o]->row_stride = v->strides[v->rank - 2];
      mx[o]->col_stride = v->strides[v->rank - 1];
      for (int j = lead; j < nb; j++) mx[o]->batch_stride[j - lead] = bs[o][j];
    }
    for (int j = lead; j < nb; j++) gm->batch[j - lead] = t->dims[j];
    /* A weight shared by every batch (B's batch stride 0) with A's and C's
     * rows back to back across the batch: one GEMM of m * batch rows, a far
     * better shape for the library than many short ones. Innermost batch
     * dim first; an outer one only once every inner one is merged. */
    for (int j = 1; j >= 0; j--) {
      if (gm->batch[j] == 1) continue;
      if (gm->b.batch_stride[j] != 0 || gm->a.batch_stride[j] != gm->m * gm->a.row_stride ||
          gm->c.batch_stride[j] != gm->m * gm->c.row_stride)
        break;
      gm->m *= gm->batch[j];
      gm->batch[j] = 1;
      gm->a.batch_stride[j] = gm->c.batch_stride[j] = 0;
    }
  }
  l->buf[n->id] = b;
  return true;
}

/* A tied embedding's gradient is add(X, embedding_grad(ids, dy)), X the
 * LM head's weight-gradient GEMM. When X (through permutes and reshapes) is
 * read by that add alone and lies in its GEMM's buffer as it is, the
 * scatter-add accumulates into that buffer in place and the add becomes the
 * buffer: no zero-filled [rows, D] buffer and no pass adding two of them.
 * Returns the add (and X's buffer), or NULL where this does not apply. */
static const ir_node *embedding_grad_base(L *l, const ir_node *n, int *buffer) {
  if (l->users[n->id] != 1 || l->is_output[n->id]) return NULL;
  const ir_node *a = l->g->nodes[l->user_list[n->id][0]];
  if (a->op != DSC_OP_ADD || a->n_in != 2 || a->group == 0 || a->in[0] == a->in[1]) return NULL;
  const ir_node *x = a->in[a->in[0] == n ? 1 : 0];
  if (!dsc_type_equal(&a->type, &n->type) || !dsc_type_equal(&x->type, &n->type)) return NULL;
  for (const ir_node *y = x;; y = y->in[0]) {
    if (y->group != 0 || l->users[y->id] != 1 || l->is_output[y->id]) return NULL;
    if (y->op == DSC_OP_MATMUL) {
      if (l->buf[y->id] < 0) return NULL;
      break;
    }
    if (y->op != DSC_OP_PERMUTE && y->op != DSC_OP_RESHAPE) return NULL;
  }
  view v;
  if (!resolve(l, x, &v)) return NULL;
  const cg_buffer *b = &l->p->buffers[v.buffer];
  if (v.offset != 0 || !view_is_contiguous(&v) || b->kind != CG_BUF_TEMP ||
      b->numel != dsc_type_numel(&n->type) || b->dtype != n->type.dtype)
    return NULL;
  *buffer = v.buffer;
  return a;
}

static bool lower_embedding_grad(L *l, const ir_node *n) {
  int ids = contiguous_buffer(l, n->in[0], true);
  if (ids < 0) return false;
  int src = contiguous_buffer(l, n->in[1], true);
  if (src < 0) return false;
  int dst = -1;
  const ir_node *sum = embedding_grad_base(l, n, &dst);
  if (l->status != DSC_OK) return false;
  if (!sum) dst = new_buffer(l, CG_BUF_TEMP, 0, n->type.dtype, dsc_type_numel(&n->type));
  if (dst < 0) return false;
  cg_instr *in = new_instr(l, CG_INS_EMBEDDING_GRAD, n);
  if (!in) return false;
  in->ids = ids, in->src = src, in->dst = dst;
  in->accumulate = sum != NULL;
  if (sum) l->alias[sum->id] = true, l->buf[sum->id] = dst;
  in->n_ids = dsc_type_numel(&n->in[0]->type);
  in->rows = n->type.dims[0];
  in->cols = n->type.dims[1];
  l->buf[n->id] = dst;
  return true;
}

/* set_rows(x, ids, rows) assigned to the state x reads, when nothing reads
 * that state after it and the value is not an output: the rows can go
 * into the state itself (its value from before the step is then not needed
 * by anyone; the value's other readers find it there). Returns the state's
 * buffer, or -1. */
/* Whether every read of x's value happens before node `before` runs: its
 * readers, and, through the views and recomputed values that are read
 * where they are used (not computed where they stand), their readers. A
 * fusion group is one contiguous run of nodes, so a reader in a group
 * before `before` runs before it. */
static bool read_before(const L *l, const ir_node *x, int before, int depth) {
  if (l->is_output[x->id] || depth > 64) return false;
  for (int u = 0; u < l->users[x->id]; u++) {
    const ir_node *r = l->g->nodes[l->user_list[x->id][u]];
    if (r->id > before) return false;
    bool where_read =
        r->group == 0 && (l->pure[r->id] || r->op == DSC_OP_BROADCAST || r->op == DSC_OP_PERMUTE ||
                          r->op == DSC_OP_SLICE || r->op == DSC_OP_RESHAPE);
    if (where_read && r->id != before && !read_before(l, r, before, depth + 1)) return false;
  }
  return true;
}

static int set_rows_in_place(L *l, const ir_node *n) {
  const ir_node *x = n->in[0];
  if (x->op != DSC_OP_PARAM || l->is_output[n->id]) return -1;
  const char *name = ir_attr_str(x, "name");
  int assigns = 0;
  for (int u = 0; u < l->users[n->id]; u++) {
    const ir_node *a = l->g->nodes[l->user_list[n->id][u]];
    if (a->op == DSC_OP_ASSIGN) {
      if (strcmp(ir_attr_str(a, "name"), name) != 0) return -1;
      assigns++;
    }
  }
  if (assigns != 1) return -1;
  for (int i = 0; i < l->g->n_nodes; i++) { /* every read of the state: before n */
    const ir_node *r = l->g->nodes[i];
    if (r->op == DSC_OP_PARAM && strcmp(ir_attr_str(r, "name"), name) == 0 &&
        !read_before(l, r, n->id, 0))
      return -1;
  }
  int j = param_index(l, x);
  if (j < 0) return -1;
  int b = l->param_buf[j];
  const cg_buffer *pb = &l->p->buffers[b];
  return pb->tier == CG_TIER_DEVICE && pb->numel == dsc_type_numel(&n->type) &&
                 pb->dtype == n->type.dtype
             ? b
             : -1;
}

static bool lower_set_rows(L *l, const ir_node *n) {
  int ids = contiguous_buffer(l, n->in[1], true), src = contiguous_buffer(l, n->in[2], true);
  if (ids < 0 || src < 0) return false;
  int64_t numel = dsc_type_numel(&n->type);
  int dst = set_rows_in_place(l, n);
  if (dst < 0) { /* a copy of x first */
    int x = contiguous_buffer(l, n->in[0], true);
    if (x < 0 || (dst = new_buffer(l, CG_BUF_TEMP, 0, n->type.dtype, numel)) < 0) return false;
    cg_instr *c = new_instr(l, CG_INS_COPY, n);
    if (!c) return false;
    c->src = x, c->dst = dst, c->numel = numel;
  }
  cg_instr *in = new_instr(l, CG_INS_SET_ROWS, n);
  if (!in) return false;
  in->ids = ids, in->src = src, in->dst = dst;
  in->n_ids = n->in[1]->type.dims[0];
  in->rows = n->type.dims[0];
  in->cols = n->type.dims[1];
  l->buf[n->id] = dst;
  return true;
}

static bool lower_concat(L *l, const ir_node *n) {
  for (int i = 0; i < n->n_in; i++) { /* views and copies of the inputs first */
    view v;
    if (!(n->in[i]->group == 0 && l->pure[n->in[i]->id]) && !resolve(l, n->in[i], &v)) return false;
  }
  int b = new_buffer(l, CG_BUF_TEMP, 0, n->type.dtype, dsc_type_numel(&n->type));
  if (b < 0) return false;
  view out = contiguous_view(l->p, b, &n->type);
  int64_t axis = ir_attr_int(n, "axis"), start = 0;
  for (int i = 0; i < n->n_in; i++) {
    const ir_node *x = n->in[i];
    ir_domain d;
    dsc_type shape = x->type;
    ir_domain_make(&shape, 0, false, &d);
    kb_reset(l, 0, &d);
    ir_affine pt[DSC_MAX_RANK];
    bool full;
    natural(l, x, pt, &full);
    kir_stage *st = kb_stage(l, KIR_STAGE_STORE);
    if (!st) return false;
    kir_expr *e = expr(l, x, pt);
    if (!e) return false;
    view dv = out;
    dv.offset += start * out.strides[axis];
    dv.dims[axis] = x->type.dims[axis];
    st = &l->stages[0];
    st->over_inner = d.rank > d.n_outer;
    st->expr = e;
    st->dst = view_access(l, &dv, pt, true);
    if (kb_finish(l, n, "concat") < 0) return false;
    start += x->type.dims[axis];
  }
  l->buf[n->id] = b;
  return true;
}

/* ------------------------------------------------------------ collectives */

/* dst = src converted to dst's dtype, both contiguous of shape t (staging
 * of bf16/f16 sums through f32). */
static bool convert_kernel(L *l, const ir_node *node, int src, int dst, const dsc_type *t) {
  ir_domain d, saved_dom = l->dom;
  int saved_group = l->cur_group;
  dsc_type shape = *t;
  ir_domain_make(&shape, 0, false, &d);
  kb_reset(l, 0, &d);
  ir_affine pt[DSC_MAX_RANK];
  bool full;
  memset(pt, 0, sizeof pt);
  ir_natural_map(&d, &shape, pt, &full);
  if (!kb_stage(l, KIR_STAGE_STORE)) return false;
  view sv = contiguous_view(l->p, src, t), dv = contiguous_view(l->p, dst, t);
  kir_expr *e = kir_load(l->a, ct(l->p->buffers[src].dtype), view_access(l, &sv, pt, false));
  if (!e) return oom(l);
  if (ct(l->p->buffers[src].dtype) != ct(l->p->buffers[dst].dtype))
    e = kir_cast(l->a, ct(l->p->buffers[dst].dtype), e);
  if (!e) return oom(l);
  kir_stage *st = &l->stages[0];
  st->over_inner = d.rank > d.n_outer;
  st->expr = e;
  st->dst = view_access(l, &dv, pt, true);
  bool ok = kb_finish(l, node, "convert") >= 0;
  l->cur_group = saved_group;
  l->dom = saved_dom;
  return ok;
}

static bool coll_kind(dsc_op op, cg_coll_kind *k) {
  switch (op) {
    case DSC_OP_ALL_REDUCE_START: *k = CG_COLL_ALL_REDUCE; return true;
    case DSC_OP_REDUCE_SCATTER_START: *k = CG_COLL_REDUCE_SCATTER; return true;
    case DSC_OP_ALL_GATHER_START: *k = CG_COLL_ALL_GATHER; return true;
    case DSC_OP_BROADCAST_START: *k = CG_COLL_BROADCAST; return true;
    case DSC_OP_ALL_TO_ALL_START:
      *k = CG_COLL_ALL_TO_ALL;
      return true;
    default: return false;
  }
}

/* The Program's name of n's group: "" for the executor's communicator (the
 * world), else the mesh axis. */
static void program_group(const ir_node *n, char out[8]) {
  const char *group = ir_collective_group(n);
  snprintf(out, 8, "%s", strcmp(group, "world") != 0 ? group : "");
}

static bool lower_collective_start(L *l, const ir_node *n) {
  cg_collective c;
  memset(&c, 0, sizeof c);
  if (!coll_kind(n->op, &c.kind)) return fail(l, n, DSC_ERR_INTERNAL, "not a collective start%s", "");
  const ir_node *x = n->in[0];
  bool sum = c.kind == CG_COLL_ALL_REDUCE || c.kind == CG_COLL_REDUCE_SCATTER;
  dsc_dtype dt = n->type.dtype;
  bool staged = sum && (dt == DSC_BF16 || dt == DSC_F16);
  if (sum && !staged && dt != DSC_F32 && dt != DSC_F64 && dt != DSC_I32 && dt != DSC_I64)
    return fail(l, n, DSC_ERR_USER, "the communicator cannot sum %s", dsc_dtype_name(dt));
  c.id = l->n_coll;
  c.dtype = staged ? DSC_F32 : dt;
  c.count = c.kind == CG_COLL_REDUCE_SCATTER || c.kind == CG_COLL_ALL_GATHER
                ? dsc_type_numel(&x->type)
                : dsc_type_numel(&n->type);
  c.op = DSC_COMM_SUM; /* the ops sum (ops.def); a mean is a multiply in the graph */
  c.world = ir_attr_int(n, "world");
  c.tag = ir_attr_int(n, "tag");
  c.root = c.kind == CG_COLL_BROADCAST ? (int)ir_attr_int(n, "root") : 0;
  if (c.kind == CG_COLL_ALL_TO_ALL) c.count /= c.world; /* per peer */
  program_group(n, c.group);
  int src = contiguous_buffer(l, x, true);
  if (src < 0) return false;
  if (staged) {
    int s32 = new_buffer(l, CG_BUF_TEMP, 0, DSC_F32, dsc_type_numel(&x->type));
    if (s32 < 0 || !convert_kernel(l, n, src, s32, &x->type)) return false;
    src = s32;
  }
  int dst = new_buffer(l, CG_BUF_TEMP, 0, c.dtype, dsc_type_numel(&n->type));
  if (dst < 0) return false;
  if (c.kind == CG_COLL_BROADCAST) { /* in place in dst: the root sends it, the others receive */
    cg_instr *cp = new_instr(l, CG_INS_COPY, n);
    if (!cp) return false;
    cp->src = src, cp->dst = dst, cp->numel = c.count;
  }
  cg_instr *in = new_instr(l, CG_INS_COLLECTIVE_START, n);
  if (!in) return false;
  in->src = src, in->dst = dst, in->coll = c;
  if (!ir_grow(l->a, (void **)&l->coll, &l->cap_coll, l->n_coll + 1, sizeof(coll_rec)))
    return oom(l);
  l->coll[l->n_coll] = (coll_rec){n, src, dst, c, staged, false};
  l->coll_of[n->id] = l->n_coll++;
  l->p->n_collectives = l->n_coll;
  return true;
}

/* The wait of collective r; node is the wait op (the start for the waits
 * added at the end). Sets the buffer of `value` (the wait op) if given. */
static bool emit_wait(L *l, coll_rec *r, const ir_node *node, const ir_node *value) {
  cg_instr *in = new_instr(l, CG_INS_COLLECTIVE_WAIT, node);
  if (!in) return false;
  in->src = r->src, in->dst = r->dst, in->coll = r->c;
  r->waited = true;
  if (!value) return true;
  if (!r->staged) {
    l->buf[value->id] = r->dst;
    return true;
  }
  int b = new_buffer(l, CG_BUF_TEMP, 0, value->type.dtype, dsc_type_numel(&value->type));
  if (b < 0 || !convert_kernel(l, value, r->dst, b, &value->type)) return false;
  l->buf[value->id] = b;
  return true;
}

static bool lower_collective_wait(L *l, const ir_node *n) {
  int id = l->coll_of[n->in[0]->id];
  if (id < 0)
    return fail(l, n, DSC_ERR_INTERNAL, "the wait's input is not a lowered collective start%s", "");
  if (l->coll[id].waited)
    return fail(l, n, DSC_ERR_USER, "%s: its collective is already waited (one wait per start)",
                dsc_op_name(n->op));
  return emit_wait(l, &l->coll[id], n, n);
}

/* Disk tier transfers (cg_tier_io): a start gets a WORK buffer of the whole
 * value (read) or sends its input's (write); its wait repeats it. */
static bool lower_tier(L *l, const ir_node *n) {
  cg_program *p = l->p;
  if (n->op == DSC_OP_TIER_READ_START || n->op == DSC_OP_TIER_WRITE_START) {
    int j = param_index(l, n);
    if (j < 0) return fail(l, n, DSC_ERR_USER, "unknown param '%s'", ir_attr_str(n, "name"));
    if (p->buffers[l->param_buf[j]].tier != CG_TIER_DISK)
      return fail(l, n, DSC_ERR_USER, "'%s' is not on the disk tier (module meta tier.<name>)",
                  ir_attr_str(n, "name"));
    bool write = n->op == DSC_OP_TIER_WRITE_START;
    int b = write ? contiguous_buffer(l, n->in[0], true)
                  : new_buffer(l, CG_BUF_TEMP, 0, n->type.dtype, dsc_type_numel(&n->type));
    cg_instr *in = b < 0 ? NULL : new_instr(l, CG_INS_TIER_START, n);
    if (!in) return false;
    in->src = in->dst = b;
    in->tier = (cg_tier_io){p->n_tier_ios++, j, write};
    l->buf[n->id] = b;
    return true;
  }
  const cg_instr *start = NULL;
  for (int i = p->n_instrs - 1; i >= 0 && !start; i--)
    if (p->instrs[i].kind == CG_INS_TIER_START && l->instr_node[i] == n->in[0])
      start = &p->instrs[i];
  if (!start) return fail(l, n, DSC_ERR_INTERNAL, "the wait's start was not lowered%s", "");
  cg_tier_io t = start->tier;
  int b = start->src;
  cg_instr *in = new_instr(l, CG_INS_TIER_WAIT, n);
  if (!in) return false;
  in->src = in->dst = b, in->tier = t;
  l->buf[n->id] = b;
  return true;
}

/* Starts without a wait are waited at the end of the program. */
static bool wait_tier_ios(L *l) {
  cg_program *p = l->p;
  int n = p->n_tier_ios;
  bool *waited = ir_arena_alloc(l->a, (size_t)n + 1);
  if (!waited) return oom(l);
  memset(waited, 0, (size_t)n + 1);
  for (int i = 0; i < p->n_instrs; i++)
    if (p->instrs[i].kind == CG_INS_TIER_WAIT) waited[p->instrs[i].tier.id] = true;
  for (int i = 0, end = p->n_instrs; i < end; i++) {
    if (p->instrs[i].kind != CG_INS_TIER_START || waited[p->instrs[i].tier.id]) continue;
    cg_instr s = p->instrs[i];
    cg_instr *in = new_instr(l, CG_INS_TIER_WAIT, l->instr_node[i]);
    if (!in) return false;
    in->src = in->dst = s.src, in->tier = s.tier;
    waited[s.tier.id] = true;
  }
  return true;
}

/* local_shard: a copy of the rank's chunk, whose offset only the run knows. */
static bool lower_local_shard(L *l, const ir_node *n) {
  int src = contiguous_buffer(l, n->in[0], true);
  if (src < 0) return false;
  int dst = new_buffer(l, CG_BUF_TEMP, 0, n->type.dtype, dsc_type_numel(&n->type));
  cg_instr *in = dst < 0 ? NULL : new_instr(l, CG_INS_COPY, n);
  if (!in) return false;
  in->src = src, in->dst = dst, in->numel = dsc_type_numel(&n->type);
  in->src_rank_chunk = true;
  in->src_len = dsc_type_numel(&n->in[0]->type);
  in->coll.world = ir_attr_int(n, "world");
  program_group(n, in->coll.group);
  l->p->needs_rank = true;
  l->buf[n->id] = dst;
  return true;
}

/* to_host / to_device (passes/offload_host.c): one copy into a buffer of
 * its own; place_work puts to_host's (a host node's) in the host work
 * arena. On the CPU both tiers are host memory, so it is a memcpy. */
static bool lower_transfer(L *l, const ir_node *n) {
  int src = contiguous_buffer(l, n->in[0], true);
  if (src < 0) return false;
  int dst = new_buffer(l, CG_BUF_TEMP, 0, n->type.dtype, dsc_type_numel(&n->type));
  cg_instr *in = dst < 0 ? NULL : new_instr(l, CG_INS_COPY, n);
  if (!in) return false;
  in->src = src, in->dst = dst, in->numel = dsc_type_numel(&n->type);
  l->buf[n->id] = dst;
  return true;
}

/* ------------------------------------------------------------ in-place assigns */

/* Every distinct load of a kernel (iterative DAG walk). */
typedef struct {
  const kir_expr **set;
  size_t cap;
  kir_expr **loads;
  int n_loads, cap_loads;
} load_walk;

static bool walk_seen(load_walk *w, const kir_expr *e) {
  size_t i = (((uintptr_t)e >> 4) * 0x9E3779B97F4A7C15ull) & (w->cap - 1);
  while (w->set[i]) {
    if (w->set[i] == e) return true;
    i = (i + 1) & (w->cap - 1);
  }
  w->set[i] = e;
  return false;
}

static bool collect_loads(L *l, const kir_kernel *k, load_walk *w) {
  size_t total = 16;
  /* upper bound of distinct nodes: count with a first walk would need the
   * set itself; grow by rebuilding instead */
  for (;;) {
    w->cap = total * 2;
    w->set = calloc(w->cap, sizeof *w->set);
    w->n_loads = 0;
    if (!w->set) return oom(l);
    size_t seen = 0;
    bool overflow = false;
    int cap = 256, sp = 0;
    const kir_expr **stack = malloc(sizeof *stack * (size_t)cap);
    if (!stack) return free(w->set), oom(l);
    for (int s = 0; s < k->n_stages && !overflow; s++) {
      const kir_expr *roots[2] = {k->stages[s].expr, k->stages[s].dst.gather};
      for (int r = 0; r < 2; r++)
        if (roots[r]) stack[sp++] = roots[r];
      while (sp > 0 && !overflow) {
        const kir_expr *e = stack[--sp];
        if (walk_seen(w, e)) continue;
        if (++seen * 2 >= w->cap) {
          overflow = true;
          break;
        }
        if (e->kind == KIR_LOAD) {
          if (!ir_grow(l->a, (void **)&w->loads, &w->cap_loads, w->n_loads + 1, sizeof(kir_expr *))) {
            free(stack), free(w->set);
            return oom(l);
          }
          w->loads[w->n_loads++] = (kir_expr *)e;
        }
        const kir_expr *kids[4] = {e->a, e->b, e->c, e->kind == KIR_LOAD ? e->access.gather : NULL};
        for (int c = 0; c < 4; c++) {
          if (!kids[c]) continue;
          if (sp == cap) {
            cap *= 2;
            const kir_expr **g = realloc(stack, sizeof *stack * (size_t)cap);
            if (!g) {
              free(stack), free(w->set);
              return oom(l);
            }
            stack = g;
          }
          stack[sp++] = kids[c];
        }
      }
      sp = 0;
    }
    free(stack);
    if (!overflow) return true;
    free(w->set);
    total *= 4;
  }
}

static bool access_equal(const kir_kernel *k, const kir_access *a, const kir_access *b) {
  if (a->offset != b->offset || a->gather || b->gather) return false;
  for (int v = 0; v < k->rank; v++)
    if (a->stride[v] != b->stride[v] && k->dims[v] != 1) return false;
  return true;
}

static bool instr_reads(const cg_program *p, const cg_instr *in, int buffer) {
  if (in->guarded && in->guard == buffer) return true;
  switch (in->kind) {
    case CG_INS_LAUNCH: {
      const kir_kernel *k = p->kernels[in->kernel];
      for (int i = 0; i < in->n_args; i++)
        if (in->args[i] == buffer && (k->args[i].read || k->args[i].written)) return true;
      return false;
    }
    case CG_INS_GEMM:
      return in->gemm.a.buffer == buffer || in->gemm.b.buffer == buffer ||
             in->gemm.c.buffer == buffer;
    case CG_INS_EMBEDDING_GRAD:
    case CG_INS_SET_ROWS: /* dst: the rows not written stay */
      return in->ids == buffer || in->src == buffer || in->dst == buffer;
    case CG_INS_COPY:
      return in->src == buffer || in->dst == buffer;
    case CG_INS_COLLECTIVE_START:
    case CG_INS_COLLECTIVE_WAIT: /* both buffers belong to the collective until its wait */
      return in->src == buffer || in->dst == buffer;
    case CG_INS_TIER_START:
    case CG_INS_TIER_WAIT:
      return in->src == buffer;
  }
  return true;
}

static void replace_buffer(cg_program *p, int from_instr, int old, int nb) {
  for (int i = from_instr; i < p->n_instrs; i++) {
    cg_instr *in = &p->instrs[i];
    if (in->kind == CG_INS_LAUNCH)
      for (int a = 0; a < in->n_args; a++)
        if (in->args[a] == old) in->args[a] = nb;
    if (in->kind == CG_INS_GEMM) {
      if (in->gemm.a.buffer == old) in->gemm.a.buffer = nb;
      if (in->gemm.b.buffer == old) in->gemm.b.buffer = nb;
    }
    if (in->ids == old) in->ids = nb;
    if (in->src == old) in->src = nb;
    if (in->guarded && in->guard == old) in->guard = nb;
  }
  for (int o = 0; o < p->n_outputs; o++)
    if (p->outputs[o].buffer == old) p->outputs[o].buffer = nb;
  for (int s = 0; s < p->n_assigns; s++) {
    if (p->assigns[s].buffer == old) p->assigns[s].buffer = nb;
    if (p->assigns[s].guarded && p->assigns[s].guard == old) p->assigns[s].guard = nb;
  }
}

/* Orders STORE stages of k: a stage reading an in-place target's arg runs
 * before the target's store. cand[i] = arg written in place by stage
 * store_stage[i]. Returns false when no order exists. */
static bool order_stores(L *l, kir_kernel *k, load_walk *per_stage, const int *cand_stage,
                         const int *cand_arg, int n_cand) {
  int ns = k->n_stages;
  int *placed = calloc((size_t)ns, sizeof(int));
  kir_stage *out = malloc(sizeof(kir_stage) * (size_t)ns);
  if (!placed || !out) {
    free(placed), free(out);
    return oom(l);
  }
  int o = 0;
  for (int s = 0; s < ns; s++)
    if (k->stages[s].kind != KIR_STAGE_STORE) out[o++] = k->stages[s], placed[s] = 1;
  bool progress = true;
  while (progress) {
    progress = false;
    for (int s = 0; s < ns; s++) {
      if (placed[s]) continue;
      /* s may go when no unplaced other stage reads the arg s writes in place */
      bool ok = true;
      for (int c = 0; c < n_cand && ok; c++) {
        if (cand_stage[c] != s) continue;
        for (int t = 0; t < ns && ok; t++) {
          if (t == s || placed[t]) continue;
          for (int x = 0; x < per_stage[t].n_loads; x++)
            if (per_stage[t].loads[x]->access.arg == cand_arg[c]) ok = false;
        }
      }
      if (ok) {
        out[o++] = k->stages[s];
        placed[s] = 1;
        progress = true;
      }
    }
  }
  bool done = o == ns;
  if (done) memcpy(k->stages, out, sizeof(kir_stage) * (size_t)ns);
  free(placed), free(out);
  return done;
}

static void remap_arg(kir_kernel *k, load_walk *all, int from, int to) {
  for (int x = 0; x < all->n_loads; x++)
    if (all->loads[x]->access.arg == from) all->loads[x]->access.arg = to;
  for (int s = 0; s < k->n_stages; s++)
    if (k->stages[s].kind == KIR_STAGE_STORE && k->stages[s].dst.arg == from) k->stages[s].dst.arg = to;
}

/* Tries to write the assigns stored by instruction `instr` in place. */
static bool inplace_kernel(L *l, int instr, int *assign_idx, int n) {
  cg_program *p = l->p;
  cg_instr *in = &p->instrs[instr];
  kir_kernel *k = p->kernels[in->kernel];
  load_walk all;
  memset(&all, 0, sizeof all);
  if (!collect_loads(l, k, &all)) return false;
  free(all.set);
  int cs[64], ca[64], ct_[64], nc = 0; /* stage, param arg (-1: none), temp arg */
  int which[64];
  for (int i = 0; i < n && nc < 64; i++) {
    cg_assign *as = &p->assigns[assign_idx[i]];
    int bp = l->param_buf[as->param], bt = as->buffer;
    int at = -1, ap = -1;
    for (int a = 0; a < in->n_args; a++) {
      if (in->args[a] == bt) at = a;
      if (in->args[a] == bp) ap = a;
    }
    if (at < 0 || p->buffers[bt].numel != p->buffers[bp].numel ||
        p->buffers[bt].dtype != p->buffers[bp].dtype)
      continue;
    /* One value assigned to two params: only the first can take the store
     * (the other assign copies it afterwards). */
    bool taken = false;
    for (int c = 0; c < nc; c++) taken |= ct_[c] == at;
    if (taken) continue;
    int st = -1;
    for (int s = 0; s < k->n_stages; s++)
      if (k->stages[s].kind == KIR_STAGE_STORE && k->stages[s].dst.arg == at) st = s;
    if (st < 0 || k->stages[st].dst.gather) continue;
    bool ok = true;
    for (int x = 0; x < all.n_loads && ok; x++)
      if (all.loads[x]->access.arg == ap && !access_equal(k, &all.loads[x]->access, &k->stages[st].dst))
        ok = false;
    for (int x = 0; x < all.n_loads && ok; x++)
      if (all.loads[x]->access.arg == at) ok = false;
    for (int j = instr + 1; j < p->n_instrs && ok; j++)
      if (instr_reads(p, &p->instrs[j], bp)) ok = false;
    for (int o = 0; o < p->n_outputs && ok; o++)
      if (p->outputs[o].buffer == bp) ok = false;
    if (!ok) continue;
    cs[nc] = st, ca[nc] = ap, ct_[nc] = at, which[nc] = assign_idx[i];
    nc++;
  }
  if (nc == 0) return true;
  /* per-stage loads for the ordering */
  load_walk *per = calloc((size_t)k->n_stages, sizeof(load_walk));
  if (!per) return oom(l);
  for (int s = 0; s < k->n_stages; s++) {
    kir_kernel one = *k;
    one.n_stages = 1;
    one.stages = &k->stages[s];
    if (!collect_loads(l, &one, &per[s])) {
      free(per);
      return false;
    }
    free(per[s].set);
    per[s].set = NULL;
  }
  int cand_arg[64];
  for (;;) {
    for (int c = 0; c < nc; c++) cand_arg[c] = ca[c];
    /* stages are identified by index before reordering */
    if (order_stores(l, k, per, cs, cand_arg, nc)) break;
    if (l->status != DSC_OK) {
      free(per);
      return false;
    }
    nc--; /* drop the last candidate and retry */
    if (nc == 0) {
      free(per);
      return true;
    }
  }
  free(per);
  /* retarget: the store to the temp writes the param's buffer instead */
  for (int c = 0; c < nc; c++) {
    cg_assign *as = &p->assigns[which[c]];
    int bp = l->param_buf[as->param], bt = as->buffer;
    int at = ct_[c], ap = ca[c];
    if (ap < 0) {
      in->args[at] = bp;
      k->args[at].read = false;
    } else {
      remap_arg(k, &all, at, ap);
      k->args[ap].written = true;
      int last = k->n_args - 1;
      if (at != last) {
        remap_arg(k, &all, last, at);
        k->args[at] = k->args[last];
        in->args[at] = in->args[last];
        for (int d = c + 1; d < nc; d++) {
          if (ca[d] == last) ca[d] = at;
          if (ct_[d] == last) ct_[d] = at;
        }
      }
      k->n_args--, in->n_args--;
    }
    replace_buffer(p, instr + 1, bt, bp);
    as->buffer = bp;
    as->in_place = true;
  }
  char err[256];
  if (!kir_validate(k, err, sizeof err))
    return fail(l, l->instr_node[instr], DSC_ERR_INTERNAL, "in-place rewrite broke a kernel: %s", err);
  return true;
}

/* An assign of to_device(x) to a device param: the copy writes the param's
 * STATE buffer directly when no later instruction or output reads it (as a
 * kernel's in-place store), so the updated params need no device copy. */
static void inplace_transfers(L *l, const ir_node *const *assign_src) {
  cg_program *p = l->p;
  for (int s = 0; s < p->n_assigns; s++) {
    const ir_node *x = assign_src[s];
    cg_assign *as = &p->assigns[s];
    int bp = l->param_buf[as->param], bt = as->buffer;
    if (x->op != DSC_OP_TO_DEVICE || bt != l->buf[x->id] || p->buffers[bp].tier != CG_TIER_DEVICE ||
        p->buffers[bt].numel != p->buffers[bp].numel || p->buffers[bt].dtype != p->buffers[bp].dtype)
      continue;
    int at = -1;
    for (int i = 0; i < p->n_instrs; i++)
      if (p->instrs[i].kind == CG_INS_COPY && l->instr_node[i] == x && p->instrs[i].dst == bt)
        at = i;
    bool ok = at >= 0;
    for (int j = at + 1; j < p->n_instrs && ok; j++)
      if (instr_reads(p, &p->instrs[j], bp)) ok = false;
    for (int o = 0; o < p->n_outputs && ok; o++)
      if (p->outputs[o].buffer == bp || p->outputs[o].buffer == bt) ok = false;
    for (int t = 0; t < p->n_assigns && ok; t++) /* one value assigned twice */
      if (t != s && p->assigns[t].buffer == bt) ok = false;
    if (!ok) continue;
    p->instrs[at].dst = bp;
    replace_buffer(p, at + 1, bt, bp);
    as->buffer = bp;
    as->in_place = true;
  }
}

/* ------------------------------------------------------------ placement */

/* With the host stream, placement may not reuse the bytes of a host
 * buffer the stream touches before the end of the program: the stream
 * gets to an instruction later than its place in the program, so a reuse
 * (by the executor's thread, or by the stream's own earlier place) would
 * make the executor wait for it. Host memory holds them all at once, as
 * DeepSpeed's ZeRO-Offload holds the whole gradient partition on the host;
 * dsc plan shows it in the host work arena. */
static void hold_host_buffer(cg_program *p, int b) {
  if (b >= 0 && p->buffers[b].kind == CG_BUF_TEMP && p->buffers[b].tier == CG_TIER_HOST)
    p->buffers[b].last_use = p->n_instrs;
}

static void stream_lifetimes(cg_program *p) {
  for (int i = 0; i < p->n_instrs; i++) {
    const cg_instr *in = &p->instrs[i];
    if (!in->host_stream) continue;
    if (in->kind == CG_INS_LAUNCH)
      for (int a = 0; a < in->n_args; a++) hold_host_buffer(p, in->args[a]);
    else
      hold_host_buffer(p, in->src), hold_host_buffer(p, in->dst);
    /* the stream reads its guard when it gets there: held to the end too,
     * wherever it lives (a scalar) */
    if (in->guarded && p->buffers[in->guard].kind == CG_BUF_TEMP)
      p->buffers[in->guard].last_use = p->n_instrs;
  }
}

static bool place_work(L *l) {
  cg_program *p = l->p;
  for (int i = 0; i < p->n_instrs; i++) {
    const cg_instr *in = &p->instrs[i];
    int bufs[8], nb = 0;
    if (in->kind == CG_INS_LAUNCH) {
      for (int a = 0; a < in->n_args; a++) {
        cg_buffer *b = &p->buffers[in->args[a]];
        if (b->first_use < 0) b->first_use = i;
        b->last_use = i;
      }
    } else if (in->kind == CG_INS_GEMM) {
      bufs[nb++] = in->gemm.a.buffer, bufs[nb++] = in->gemm.b.buffer, bufs[nb++] = in->gemm.c.buffer;
    } else if (in->kind == CG_INS_COLLECTIVE_START || in->kind == CG_INS_COLLECTIVE_WAIT) {
      /* live from the start through the wait: the communicator reads src
       * and writes dst in between */
      bufs[nb++] = in->src, bufs[nb++] = in->dst;
    } else if (in->kind == CG_INS_TIER_START || in->kind == CG_INS_TIER_WAIT) {
      bufs[nb++] = in->src; /* the transfer's, from its start through its wait */
    } else {
      if (in->ids >= 0) bufs[nb++] = in->ids;
      bufs[nb++] = in->src, bufs[nb++] = in->dst;
    }
    if (in->guarded) bufs[nb++] = in->guard; /* read when the instruction's turn comes */
    for (int j = 0; j < nb; j++) {
      cg_buffer *b = &p->buffers[bufs[j]];
      if (b->first_use < 0) b->first_use = i;
      b->last_use = i;
    }
  }
  int end = p->n_instrs;
  for (int o = 0; o < p->n_outputs; o++) {
    cg_buffer *b = &p->buffers[p->outputs[o].buffer];
    if (b->first_use < 0) b->first_use = end;
    b->last_use = end;
  }
  for (int s = 0; s < p->n_assigns; s++) {
    cg_buffer *b = &p->buffers[p->assigns[s].buffer];
    if (b->first_use < 0) b->first_use = end;
    b->last_use = end;
    if (p->assigns[s].guarded) p->buffers[p->assigns[s].guard].last_use = end;
  }
  for (int i = 0; i < p->n_buffers; i++) {
    cg_buffer *b = &p->buffers[i];
    if (b->kind == CG_BUF_PARAM) b->first_use = b->last_use = -1;
    /* a node's buffer that no instruction touches (a fused update that its
     * kernel writes straight into the param's STATE buffer): no memory */
    if (b->kind == CG_BUF_TEMP && b->first_use < 0) b->numel = 0;
    if (b->kind == CG_BUF_INPUT) {
      b->first_use = 0; /* written by the caller before the run */
      if (b->last_use < 0) b->last_use = 0;
    }
  }
  /* Host work buffers (passes/offload_host.c): a node's value whose node
   * is placed on the host (to_host's included), and a temporary no node
   * owns whose first writer runs on the host. */
  bool *owned = ir_arena_alloc(l->a, (size_t)(p->n_buffers + 1));
  if (!owned) return oom(l);
  memset(owned, 0, (size_t)(p->n_buffers + 1));
  for (int i = 0; i < l->n; i++) {
    int b = l->buf[i];
    if (b < 0 || p->buffers[b].kind != CG_BUF_TEMP) continue;
    const ir_node *x = l->g->nodes[i];
    owned[b] = true;
    if (x->op == DSC_OP_TO_HOST || (x->place == IR_PLACE_HOST && x->op != DSC_OP_TO_DEVICE))
      p->buffers[b].tier = CG_TIER_HOST;
  }
  for (int i = 0; i < p->n_buffers; i++) {
    cg_buffer *b = &p->buffers[i];
    if (b->kind != CG_BUF_TEMP || owned[i] || b->first_use < 0 || b->first_use >= p->n_instrs)
      continue;
    const ir_node *w = l->instr_node[b->first_use];
    if (w && w->place == IR_PLACE_HOST && w->op != DSC_OP_TO_DEVICE) b->tier = CG_TIER_HOST;
  }
  stream_lifetimes(p);
  int *order = ir_arena_alloc(l->a, sizeof(int) * (size_t)(p->n_buffers + 1));
  int *active = ir_arena_alloc(l->a, sizeof(int) * (size_t)(p->n_buffers + 1));
  int64_t *bytes = ir_arena_alloc(l->a, sizeof(int64_t) * (size_t)(p->n_buffers + 1));
  if (!order || !active || !bytes) return oom(l);
  for (int i = 0; i < p->n_buffers; i++) { /* as placed: 64-byte aligned, at least 64 */
    bytes[i] = align64((int64_t)dsc_dtype_size(p->buffers[i].dtype) * p->buffers[i].numel);
    if (bytes[i] == 0) bytes[i] = 64;
  }
  /* first fit in order of first use: the device WORK arena, then the host's */
  for (int tier = CG_TIER_DEVICE; tier <= CG_TIER_HOST; tier++) {
    int nw = 0;
    for (int i = 0; i < p->n_buffers; i++)
      if (p->buffers[i].kind != CG_BUF_PARAM && p->buffers[i].first_use >= 0 &&
          p->buffers[i].tier == tier)
        order[nw++] = i;
    for (int i = 1; i < nw; i++) { /* insertion sort by (first_use, index): stable */
      int x = order[i], j = i - 1;
      while (j >= 0 && p->buffers[order[j]].first_use > p->buffers[x].first_use)
        order[j + 1] = order[j], j--;
      order[j + 1] = x;
    }
    int na = 0;
    int64_t peak = 0;
    for (int i = 0; i < nw; i++) {
      if ((i & 15) == 0 &&
          (l->status = ir_check_interrupt(l->ctx, "placing the buffers of '%s'", l->g->name)))
        return false;
      cg_buffer *b = &p->buffers[order[i]];
      int k = 0;
      for (int j = 0; j < na; j++)
        if (p->buffers[active[j]].last_use >= b->first_use) active[k++] = active[j];
      na = k;
      int64_t size = bytes[order[i]];
      int64_t off = 0;
      for (;;) { /* lowest offset that overlaps no active buffer */
        bool moved = false;
        for (int j = 0; j < na; j++) {
          const cg_buffer *o = &p->buffers[active[j]];
          int64_t end = o->offset + bytes[active[j]];
          if (off < end && o->offset < off + size) {
            off = end;
            moved = true;
          }
        }
        if (!moved) break;
      }
      b->offset = off;
      active[na++] = order[i];
      if (off + size > peak) peak = off + size;
    }
    if (tier == CG_TIER_DEVICE)
      p->arena_bytes[CG_ARENA_WORK] = peak;
    else
      p->host_work_bytes = peak;
  }
  return true;
}

/* ------------------------------------------------------------ scalar reductions */

int kir_internal_topo(const kir_expr *root, const kir_expr ***items, int **a, int **b, int **c,
                      int **g);

/* -1: out of memory; else whether the expression reads a scalar slot. */
static int reads_slot(const kir_expr *e) {
  const kir_expr **items;
  int *a, *b, *c, *g;
  int n = kir_internal_topo(e, &items, &a, &b, &c, &g);
  if (n < 0) return -1;
  int found = 0;
  for (int i = 0; i < n; i++) found |= items[i]->kind == KIR_SCALAR;
  free(items), free(a), free(b), free(c), free(g);
  return found;
}

/* A reduction to a scalar (no outer dims: the gradient-norm sums, the loss)
 * would run on one thread. When it is large, its first inner dim becomes
 * the outer one: the kernel stores one partial result per row, and a
 * second kernel reduces the partials and runs the stages that need the
 * total. Only for kernels shaped REDUCEs (not reading slots), then STOREs
 * over the domain (not reading slots), then LETs and single STOREs. */
static bool split_scalar_reduction(L *l, int ins) {
  cg_program *p = l->p;
  kir_kernel *k = p->kernels[p->instrs[ins].kernel];
  int64_t inner = 1;
  for (int d = 0; d < k->rank; d++) inner *= k->dims[d];
  if (k->n_outer != 0 || k->rank < 2 || inner < ((int64_t)1 << 18) || k->dims[0] < 2) return true;
  int n_red = 0, tail;
  while (n_red < k->n_stages && k->stages[n_red].kind == KIR_STAGE_REDUCE) n_red++;
  if (n_red == 0) return true;
  for (tail = n_red; tail < k->n_stages; tail++)
    if (k->stages[tail].kind != KIR_STAGE_STORE || !k->stages[tail].over_inner) break;
  for (int s = tail; s < k->n_stages; s++)
    if (k->stages[s].kind == KIR_STAGE_REDUCE ||
        (k->stages[s].kind == KIR_STAGE_STORE && k->stages[s].over_inner))
      return true;
  for (int s = 0; s < tail; s++) {
    int r = reads_slot(k->stages[s].expr);
    if (r < 0) return oom(l), false;
    if (r) return true;
  }
  /* partial buffers, one per reduction */
  int n_args = k->n_args + n_red;
  kir_arg *args1 = ir_arena_alloc(l->a, sizeof(kir_arg) * (size_t)n_args);
  kir_arg *args2 = ir_arena_alloc(l->a, sizeof(kir_arg) * (size_t)n_args);
  int *bufs = ir_arena_alloc(l->a, sizeof(int) * (size_t)n_args);
  kir_stage *st1 = ir_arena_alloc(l->a, sizeof(kir_stage) * (size_t)(tail + n_red));
  kir_stage *st2 = ir_arena_alloc(l->a, sizeof(kir_stage) * (size_t)(n_red + k->n_stages - tail));
  kir_kernel *k2 = ir_arena_alloc(l->a, sizeof *k2);
  if (!args1 || !args2 || !bufs || !st1 || !st2 || !k2) return oom(l), false;
  memcpy(args1, k->args, sizeof(kir_arg) * (size_t)k->n_args);
  memcpy(bufs, p->instrs[ins].args, sizeof(int) * (size_t)k->n_args);
  memcpy(st1, k->stages, sizeof(kir_stage) * (size_t)tail);
  for (int r = 0; r < n_red; r++) {
    dsc_dtype t = k->slot_types[k->stages[r].slot];
    int b = new_buffer(l, CG_BUF_TEMP, 0, t, k->dims[0]);
    if (b < 0) return false;
    int arg = k->n_args + r;
    bufs[arg] = b;
    args1[arg] = (kir_arg){t, k->dims[0], false, true};
    kir_stage *w = &st1[tail + r];
    memset(w, 0, sizeof *w);
    w->kind = KIR_STAGE_STORE;
    w->dst.arg = arg;
    w->dst.stride[0] = 1;
    w->expr = kir_scalar(l->a, t, k->stages[r].slot);
    kir_stage *f = &st2[r];
    memset(f, 0, sizeof *f);
    f->kind = KIR_STAGE_REDUCE;
    f->reduce = k->stages[r].reduce;
    f->slot = k->stages[r].slot;
    kir_access acc;
    memset(&acc, 0, sizeof acc);
    acc.arg = arg;
    acc.stride[0] = 1;
    f->expr = kir_load(l->a, t, acc);
    if (!w->expr || !f->expr) return oom(l), false;
  }
  memcpy(args2, args1, sizeof(kir_arg) * (size_t)n_args);
  for (int r = 0; r < n_red; r++) args2[k->n_args + r].read = true, args2[k->n_args + r].written = false;
  memcpy(st2 + n_red, k->stages + tail, sizeof(kir_stage) * (size_t)(k->n_stages - tail));
  *k2 = *k;
  k2->name = ir_arena_printf(l->a, "%s_total", k->name);
  k2->rank = 1;
  k2->n_outer = 0;
  k2->args = args2;
  k2->n_args = n_args;
  k2->stages = st2;
  k2->n_stages = n_red + k->n_stages - tail;
  k->n_outer = 1;
  k->args = args1;
  k->n_args = n_args;
  k->stages = st1;
  k->n_stages = tail + n_red;
  char err[256];
  if (!k2->name || !kir_validate(k, err, sizeof err) || !kir_validate(k2, err, sizeof err))
    return fail(l, l->instr_node[ins], DSC_ERR_INTERNAL, "splitting a reduction: %s",
                k2->name ? err : "out of memory");
  if (!ir_grow(l->a, (void **)&p->kernels, &p->cap_kernels, p->n_kernels + 1, sizeof(kir_kernel *)) ||
      !new_instr(l, CG_INS_LAUNCH, NULL))
    return oom(l), false;
  p->kernels[p->n_kernels] = k2;
  memmove(&p->instrs[ins + 2], &p->instrs[ins + 1],
          sizeof(cg_instr) * (size_t)(p->n_instrs - 1 - (ins + 1)));
  memmove(&l->instr_node[ins + 2], &l->instr_node[ins + 1],
          sizeof(ir_node *) * (size_t)(p->n_instrs - 1 - (ins + 1)));
  l->instr_node[ins + 1] = l->instr_node[ins];
  p->instrs[ins].args = bufs;
  p->instrs[ins].n_args = n_args;
  p->instrs[ins + 1] = p->instrs[ins];
  p->instrs[ins + 1].kernel = p->n_kernels++;
  return true;
}

/* ------------------------------------------------------------ driver */

/* The lowering's bookkeeping, one array per node (arena a). */
static dsc_status lower_alloc(L *l, const ir_graph *g, ir_arena *a) {
  l->g = g, l->a = a, l->ctx = g->module->ctx, l->n = g->n_nodes;
  l->p = ir_arena_alloc(a, sizeof *l->p);
  int n = l->n;
  size_t isz = sizeof(int) * (size_t)(n ? n : 1);
  const ir_module *m = g->module;
  l->buf = ir_arena_alloc(a, isz);
  l->pure = ir_arena_alloc(a, (size_t)(n ? n : 1));
  l->users = ir_arena_alloc(a, isz);
  l->user_list = ir_arena_alloc(a, sizeof(int *) * (size_t)(n ? n : 1));
  l->is_output = ir_arena_alloc(a, (size_t)(n ? n : 1));
  l->store_instr = ir_arena_alloc(a, isz);
  l->alias = ir_arena_alloc(a, (size_t)(n ? n : 1));
  l->slot = ir_arena_alloc(a, isz);
  l->memo_stamp = ir_arena_alloc(a, isz);
  l->memo_pt = ir_arena_alloc(a, sizeof(ir_affine) * DSC_MAX_RANK * (size_t)(n ? n : 1));
  l->memo_expr = ir_arena_alloc(a, sizeof(kir_expr *) * (size_t)(n ? n : 1));
  l->param_buf = ir_arena_alloc(a, sizeof(int) * (size_t)(m->n_params + 1));
  l->input_buf = ir_arena_alloc(a, sizeof(int) * (size_t)(g->n_inputs + 1));
  l->coll_of = ir_arena_alloc(a, isz);
  l->phase = ir_arena_alloc(a, (size_t)(n ? n : 1));
  if (!l->phase || !ir_graph_phases(g, l->phase)) {
    ir_error(l->ctx, ir_no_loc, "codegen: out of memory");
    return DSC_ERR_INTERNAL;
  }
  if (!l->p || !l->buf || !l->pure || !l->users || !l->user_list || !l->is_output ||
      !l->store_instr || !l->alias || !l->slot || !l->memo_stamp || !l->memo_pt ||
      !l->memo_expr || !l->param_buf || !l->input_buf || !l->coll_of) {
    ir_error(l->ctx, ir_no_loc, "codegen: out of memory");
    return DSC_ERR_INTERNAL;
  }
  l->p->graph_name = g->name;
  return DSC_OK;
}

/* Params and states by tier (passes/offload.c): the device's in STATE,
 * host and disk (staging) values in arenas of their own. */
static dsc_status lower_state_buffers(L *l) {
  const ir_module *m = l->g->module;
  cg_program *p = l->p;
  int64_t *offsets = ir_arena_alloc(l->a, sizeof(int64_t) * (size_t)(m->n_params + 1));
  int *tiers = ir_arena_alloc(l->a, sizeof(int) * (size_t)(m->n_params + 1));
  if (!offsets || !tiers) return oom(l), DSC_ERR_INTERNAL;
  if (!cg_state_layout_tiers(m, offsets, tiers, p->tier_bytes)) {
    ir_error(l->ctx, ir_no_loc,
             "codegen: the module's params do not fit in memory, or a tier.<name> meta is not "
             "host or disk");
    return DSC_ERR_USER;
  }
  p->arena_bytes[CG_ARENA_STATE] = p->tier_bytes[CG_TIER_DEVICE];
  for (int j = 0; j < m->n_params; j++) {
    int b = new_buffer(l, CG_BUF_PARAM, j, m->params[j].type.dtype,
                       dsc_type_numel(&m->params[j].type));
    if (b < 0) return l->status;
    p->buffers[b].offset = offsets[j];
    p->buffers[b].tier = tiers[j];
    l->param_buf[j] = b;
  }
  return DSC_OK;
}

/* Per node: inlinable or not, its readers, whether it is an output; the
 * graph inputs' buffers. */
static dsc_status lower_scan_nodes(L *l) {
  const ir_graph *g = l->g;
  int n = l->n;
  for (int i = 0; i < n; i++) {
    ir_node *x = g->nodes[i];
    if (x->id != i) {
      ir_error(l->ctx, ir_no_loc, "codegen: graph '%s' has inconsistent node ids", g->name);
      return DSC_ERR_INTERNAL;
    }
    l->buf[i] = l->store_instr[i] = l->coll_of[i] = -1;
    l->alias[i] = false;
    bool all = x->n_in > 0;
    for (int j = 0; j < x->n_in; j++) all = all && l->pure[x->in[j]->id];
    /* a gather or a cast fusion left out of groups (passes/fuse.c) is
     * recomputed by its readers, loading its inputs from their buffers */
    l->pure[i] = x->group == 0 &&
                 (x->op == DSC_OP_CONST || x->op == DSC_OP_IOTA || (all && ir_inlinable_op(x)) ||
                  ir_recomputed_gather(x) || ir_recomputed_cast(x));
    for (int j = 0; j < x->n_in; j++) l->users[x->in[j]->id]++;
    if (x->guard) l->users[x->guard->id]++; /* read to skip it: stored by its kernel */
  }
  for (int i = 0; i < n; i++) {
    l->user_list[i] = ir_arena_alloc(l->a, sizeof(int) * (size_t)(l->users[i] ? l->users[i] : 1));
    if (!l->user_list[i]) return oom(l), DSC_ERR_INTERNAL;
    l->users[i] = 0;
  }
  for (int i = 0; i < n; i++) {
    for (int j = 0; j < g->nodes[i]->n_in; j++) {
      int s = g->nodes[i]->in[j]->id;
      l->user_list[s][l->users[s]++] = i;
    }
    if (g->nodes[i]->guard) {
      int s = g->nodes[i]->guard->id;
      l->user_list[s][l->users[s]++] = i;
    }
  }
  for (int o = 0; o < g->n_outputs; o++) l->is_output[g->outputs[o]->id] = true;
  for (int i = 0; i < g->n_inputs; i++) {
    const ir_node *x = g->inputs[i];
    int b = new_buffer(l, CG_BUF_INPUT, i, x->type.dtype, dsc_type_numel(&x->type));
    if (b < 0) return l->status;
    l->input_buf[i] = b;
    l->buf[x->id] = b;
  }
  /* assigns are collected in node order */
  int n_assign = 0;
  for (int i = 0; i < n; i++) n_assign += g->nodes[i]->op == DSC_OP_ASSIGN;
  l->p->assigns = ir_arena_alloc(l->a, sizeof(cg_assign) * (size_t)(n_assign + 1));
  l->p->outputs = ir_arena_alloc(l->a, sizeof(cg_output) * (size_t)(g->n_outputs + 1));
  l->assign_src = ir_arena_alloc(l->a, sizeof(ir_node *) * (size_t)(n_assign + 1));
  if (!l->p->assigns || !l->p->outputs || !l->assign_src) return oom(l), DSC_ERR_INTERNAL;
  return DSC_OK;
}

/* Only a wait may read a start. */
static dsc_status lower_check_in_flight(L *l) {
  const ir_node *rd;
  int rj, rk;
  if (!ir_find_in_flight_read(l->g, &rd, &rj, &rk)) return DSC_OK;
  if (rk < 0)
    ir_error(l->ctx, rd->loc, "codegen: %s reads %%%d, a %s whose data is in flight",
             dsc_op_name(rd->op), rd->in[rj]->id, dsc_op_name(rd->in[rj]->op));
  else
    ir_error(l->ctx, ir_no_loc, "codegen: output %d of graph '%s' is a %s whose data is in flight",
             rk, l->g->name, dsc_op_name(rd->op));
  return DSC_ERR_USER;
}

/* An assign: recorded now, resolved once every value has its buffer. */
static void lower_assign(L *l, const ir_node *x) {
  cg_program *p = l->p;
  int j = param_index(l, x);
  if (j < 0) {
    fail(l, x, DSC_ERR_USER, "assign to unknown param '%s'", ir_attr_str(x, "name"));
    return;
  }
  if (p->buffers[l->param_buf[j]].tier == CG_TIER_DISK) {
    fail(l, x, DSC_ERR_USER, "'%s' is on the disk tier: write it with tier_write_start "
         "(pass offload)", ir_attr_str(x, "name"));
    return;
  }
  cg_assign *as = &p->assigns[p->n_assigns];
  memset(as, 0, sizeof *as);
  as->param = j;
  guard_of(l, x, &as->guarded, &as->guard_if, &as->guard);
  l->assign_src[p->n_assigns++] = x->in[0];
}

/* One node outside any fusion group. */
static void lower_node(L *l, const ir_node *x) {
  switch (x->op) {
    case DSC_OP_MATMUL: lower_matmul(l, x); break;
    case DSC_OP_EMBEDDING_GRAD: lower_embedding_grad(l, x); break;
    case DSC_OP_SET_ROWS:
      lower_set_rows(l, x);
      break;
    case DSC_OP_CONCAT: lower_concat(l, x); break;
    case DSC_OP_ASSIGN: lower_assign(l, x); break;
    case DSC_OP_TIER_READ_START:
    case DSC_OP_TIER_WRITE_START:
    case DSC_OP_TIER_READ_WAIT:
    case DSC_OP_TIER_WRITE_WAIT: lower_tier(l, x); break;
    case DSC_OP_ALL_REDUCE_START:
    case DSC_OP_REDUCE_SCATTER_START:
    case DSC_OP_ALL_GATHER_START:
    case DSC_OP_BROADCAST_START:
    case DSC_OP_ALL_TO_ALL_START:
      lower_collective_start(l, x);
      break;
    case DSC_OP_ALL_REDUCE_WAIT:
    case DSC_OP_REDUCE_SCATTER_WAIT:
    case DSC_OP_ALL_GATHER_WAIT:
    case DSC_OP_BROADCAST_WAIT:
    case DSC_OP_ALL_TO_ALL_WAIT:
      lower_collective_wait(l, x);
      break;
    case DSC_OP_LOCAL_SHARD: lower_local_shard(l, x); break;
    case DSC_OP_TO_HOST:
    case DSC_OP_TO_DEVICE: lower_transfer(l, x); break;
    case DSC_OP_INPUT:
    case DSC_OP_PARAM: break;
    default:
      if (l->pure[x->id] || x->op == DSC_OP_BROADCAST || x->op == DSC_OP_PERMUTE ||
          x->op == DSC_OP_SLICE || x->op == DSC_OP_RESHAPE)
        break; /* recomputed or a view: resolved where read */
      if (ir_op(x->op)->cg == IR_CG_COMPOSITE)
        fail(l, x, DSC_ERR_USER, "op %s has no code generation; run the decompose pass",
             dsc_op_name(x->op));
      else
        fail(l, x, DSC_ERR_USER, "op %s is not in a fusion group; run the fuse pass",
             dsc_op_name(x->op));
      break;
  }
}

/* The instructions, in node order: one kernel per fusion group (its nodes
 * are contiguous), then the waits nobody asked for. */
static void lower_nodes(L *l) {
  const ir_graph *g = l->g;
  int n = l->n;
  /* A group seen again after its run ended is not contiguous: one flag per
   * group (scanning the rest of the graph per group was quadratic). */
  int max_group = 0;
  for (int i = 0; i < n; i++)
    if (g->nodes[i]->group > max_group) max_group = g->nodes[i]->group;
  unsigned char *group_done = ir_arena_alloc(l->a, (size_t)max_group + 1);
  if (!group_done) {
    oom(l);
    return;
  }
  memset(group_done, 0, (size_t)max_group + 1);
  for (int i = 0; i < n && l->status == DSC_OK; i++) {
    ir_node *x = g->nodes[i];
    if ((i & 15) == 0 && (l->status = ir_check_interrupt(l->ctx, "lowering graph '%s'", g->name)))
      break;
    if (x->group == 0) {
      lower_node(l, x);
      continue;
    }
    if (group_done[x->group]) {
      fail(l, x, DSC_ERR_INTERNAL, "fusion group %s is not contiguous", "");
      break;
    }
    int j = i;
    while (j < n && g->nodes[j]->group == x->group) j++;
    group_done[x->group] = 1;
    lower_group(l, &g->nodes[i], j - i);
    i = j - 1;
  }
  /* Starts the graph never waits are waited at the end (as the
   * interpreter does), so their buffers stay theirs until then. */
  for (int c = 0; c < l->n_coll && l->status == DSC_OK; c++)
    if (!l->coll[c].waited) emit_wait(l, &l->coll[c], l->coll[c].start, NULL);
  if (l->status == DSC_OK) wait_tier_ios(l); /* so do disk transfers */
}

/* Graph outputs: WORK buffers (copies of params and strided views). */
static void lower_outputs(L *l) {
  const ir_graph *g = l->g;
  cg_program *p = l->p;
  for (int o = 0; o < g->n_outputs && l->status == DSC_OK; o++) {
    const ir_node *x = g->outputs[o];
    view v;
    if (!resolve(l, x, &v)) break;
    if (!(view_is_contiguous(&v) && p->buffers[v.buffer].kind != CG_BUF_PARAM)) {
      if (!materialize(l, x)) break;
      v = contiguous_view(p, l->buf[x->id], &x->type);
    }
    p->outputs[o] = (cg_output){v.buffer, v.offset, x->type};
    p->n_outputs++;
  }
}

/* The assigns' buffers, and the ones a kernel or a transfer can write in
 * place. */
static dsc_status lower_assigns(L *l) {
  cg_program *p = l->p;
  const ir_node **assign_src = l->assign_src;
  for (int s = 0; s < p->n_assigns && l->status == DSC_OK; s++) {
    const ir_node *x = assign_src[s];
    if (x->op == DSC_OP_SET_ROWS && l->buf[x->id] == l->param_buf[p->assigns[s].param]) {
      p->assigns[s].buffer = l->buf[x->id]; /* its rows went into the state (lower_set_rows) */
      p->assigns[s].in_place = true;
      continue;
    }
    int b = contiguous_buffer(l, x, false);
    if (b >= 0) p->assigns[s].buffer = b;
  }
  /* in place: per kernel, the assigns whose value it stores */
  if (l->status == DSC_OK && p->n_assigns > 0) {
    /* the assigns grouped by kernel, in assign order (a scan of every
     * assign per instruction was O(instructions x assigns)) */
    int *idx = ir_arena_alloc(l->a, sizeof(int) * (size_t)p->n_assigns);
    int *first = ir_arena_alloc(l->a, sizeof(int) * (size_t)(p->n_instrs + 2));
    if (!idx || !first) return oom(l), DSC_ERR_INTERNAL;
    memset(first, 0, sizeof(int) * (size_t)(p->n_instrs + 2));
    for (int s = 0; s < p->n_assigns; s++) {
      int k = l->store_instr[assign_src[s]->id];
      if (k >= 0 && k < p->n_instrs && l->buf[assign_src[s]->id] == p->assigns[s].buffer)
        first[k + 2]++;
    }
    for (int i = 0; i < p->n_instrs; i++) first[i + 2] += first[i + 1];
    for (int s = 0; s < p->n_assigns; s++) {
      int k = l->store_instr[assign_src[s]->id];
      if (k >= 0 && k < p->n_instrs && l->buf[assign_src[s]->id] == p->assigns[s].buffer)
        idx[first[k + 1]++] = s;
    }
    /* first[i] is now where kernel i's assigns begin, first[i + 1] where they end */
    for (int i = 0; i < p->n_instrs && l->status == DSC_OK; i++)
      if (first[i + 1] > first[i]) inplace_kernel(l, i, idx + first[i], first[i + 1] - first[i]);
  }
  if (l->status == DSC_OK && p->n_assigns > 0) inplace_transfers(l, assign_src);
  return l->status;
}

/* With meta offload.overlap (passes/offload.c): the host's kernels and the
 * copies between the tiers run on the executor's host stream. Only kernels
 * and plain copies: GEMMs, collectives and disk transfers have resources
 * of their own on the executor's thread. */
static void mark_host_stream(L *l) {
  cg_program *p = l->p;
  const char *overlap = dsc_module_get_meta(l->g->module, "offload.overlap");
  if (!overlap) return;
  p->host_stream_own_thread = strcmp(overlap, "true") == 0;
  for (int i = 0; i < p->n_instrs; i++) {
    cg_instr *in = &p->instrs[i];
    const ir_node *x = l->instr_node[i];
    bool plain = in->kind == CG_INS_LAUNCH || (in->kind == CG_INS_COPY && !in->src_rank_chunk);
    /* a copy out of a device temporary stays on the executor's thread, in
     * its place: its source's bytes are free right after, as without the
     * stream (the stream would reach it later, and the device would hold
     * the gradient until then) */
    bool from_device_temp = x && x->op == DSC_OP_TO_HOST && x->in[0]->op != DSC_OP_PARAM;
    in->host_stream = plain && x && !from_device_temp &&
                      (x->place == IR_PLACE_HOST || x->op == DSC_OP_TO_DEVICE);
  }
}

/* kir_kernel.distinct_args: true for a kernel whose every launch passes
 * pairwise distinct buffers (placement keeps buffers live at one
 * instruction apart, so no two of its pointers reach the same bytes). */
static void mark_distinct_args(L *l) {
  cg_program *p = l->p;
  bool *mixed = ir_arena_alloc(l->a, (size_t)(p->n_kernels + 1));
  if (!mixed) return (void)oom(l);
  memset(mixed, 0, (size_t)(p->n_kernels + 1));
  for (int i = 0; i < p->n_instrs; i++) {
    const cg_instr *in = &p->instrs[i];
    if (in->kind != CG_INS_LAUNCH) continue;
    for (int a = 0; a < in->n_args && !mixed[in->kernel]; a++)
      for (int b = 0; b < a; b++)
        if (in->args[a] == in->args[b]) mixed[in->kernel] = true;
  }
  for (int k = 0; k < p->n_kernels; k++) p->kernels[k]->distinct_args = !mixed[k];
}

dsc_status cg_lower_graph(const ir_graph *g, ir_arena *a, cg_program **out) {
  *out = NULL;
  L l;
  memset(&l, 0, sizeof l);
  dsc_status st = lower_alloc(&l, g, a);
  if (st == DSC_OK) st = lower_state_buffers(&l);
  if (st == DSC_OK) st = lower_scan_nodes(&l);
  if (st == DSC_OK) st = lower_check_in_flight(&l);
  if (st != DSC_OK) return st;
  lower_nodes(&l);
  lower_outputs(&l);
  if (lower_assigns(&l) != DSC_OK) return l.status;
  cg_program *p = l.p;
  for (int i = 0; i < p->n_instrs && l.status == DSC_OK; i++)
    if (p->instrs[i].kind == CG_INS_LAUNCH && !split_scalar_reduction(&l, i)) break;
  if (l.status == DSC_OK) mark_host_stream(&l); /* before placement: stream_lifetimes */
  if (l.status == DSC_OK) place_work(&l);
  if (l.status == DSC_OK) mark_distinct_args(&l);
  if (l.status == DSC_OK && cg_program_kernel_table(a, p) != DSC_OK) oom(&l);
  if (l.status != DSC_OK) return l.status;
  p->n_nodes = l.n, p->node_buffer = l.buf; /* for the memory plan (memplan.c) */
  *out = p;
  return DSC_OK;
}
