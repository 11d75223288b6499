/* ir/: the layer's whole internal vocabulary, sectioned by source file.
 * The public view of the same types is include/dsc/ir.h. */
#ifndef DSC_IR_INTERNAL_H
#define DSC_IR_INTERNAL_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dsc/core.h"
#include "dsc/interp.h"
#include "dsc/ir.h"

#define IR_UNUSED(x) ((void)(x))

#ifdef __cplusplus
extern "C" {
#endif

/* ======================= ir/context.c ======================= */
/* Raw allocation through the context's allocator; NULL on failure. */
void *ir_alloc(dsc_context *ctx, size_t n);
void *ir_realloc(dsc_context *ctx, void *p, size_t old, size_t n);
void ir_free(dsc_context *ctx, void *p, size_t n);

/* ======================= ir/arena.c =======================
 * Bump allocator freed as a whole; all IR objects of a module live in one.
 * Allocation failure is sticky: `failed` is set and NULL returned. */
typedef struct ir_arena_chunk ir_arena_chunk;
typedef struct {
  dsc_context *ctx;
  ir_arena_chunk *head;
  bool failed;
} ir_arena;

void ir_arena_init(ir_arena *a, dsc_context *ctx);
void ir_arena_release(ir_arena *a);
void *ir_arena_alloc(ir_arena *a, size_t n); /* zeroed, 16-byte aligned */
char *ir_arena_strdup(ir_arena *a, const char *s);
char *ir_arena_strndup(ir_arena *a, const char *s, size_t n);
char *ir_arena_printf(ir_arena *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ======================= ir/diag.c ======================= */
/* Adds a diagnostic; the message is formatted and copied. */
void ir_diag(dsc_context *ctx, dsc_severity sev, dsc_loc loc, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
void ir_diag_v(dsc_context *ctx, dsc_severity sev, dsc_loc loc, const char *fmt, va_list ap);
#define ir_error(ctx, loc, ...) ir_diag((ctx), DSC_DIAG_ERROR, (loc), __VA_ARGS__)
/* Registers source text so that diagnostics in `file` print the line and a
 * caret. The context keeps its own copies; the returned name (NULL when out
 * of memory) lives as long as the context, so node locations that outlive
 * the frontend or parser point at it. */
const char *ir_diag_add_source(dsc_context *ctx, const char *file, const char *text, size_t len);
extern const dsc_loc ir_no_loc;
/* DSC_ERR_INTERRUPTED (and, the first time, an "interrupted while <what>"
 * error) when the context's interrupt callback says stop; else DSC_OK.
 * Called between units of work: cheap (one indirect call). */
dsc_status ir_check_interrupt(dsc_context *ctx, const char *what_fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Reports a long step's progress to the context's progress callback (if
 * any): `what` (e.g. "compiling 612 kernels"), done of total units. */
void ir_progress(dsc_context *ctx, const char *what, int64_t done, int64_t total);
/* A rank context made for a run takes its parent's callback. */
void ir_context_inherit_interrupt(dsc_context *to, const dsc_context *from);

/* ======================= ir/types.c ======================= */
/* Broadcast two shapes numpy-style; returns false if incompatible. */
bool ir_broadcast_shapes(const dsc_type *a, const dsc_type *b, dsc_type *out);
/* Writes a message into err (as shape rules and kernels report) and returns
 * false, so that `return ir_fail(err, errlen, "...", ...);` reads well. */
bool ir_fail(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Shortest decimal text that reads back as exactly `v` ("1", "0.02", "inf"). */
int ir_format_double(double v, char *buf, size_t n);
/* 16-bit floats: the bit pattern of x rounded once to nearest even (NaN
 * stays NaN, overflow goes to inf), and a pattern's exact value. Used by
 * safetensors files, the kernel evaluator and the CPU runtime alike. */
uint16_t ir_bf16_bits(double x);
uint16_t ir_f16_bits(double x);
double ir_bf16_value(uint16_t bits);
double ir_f16_value(uint16_t bits);

/* ======================= ir/ops.c ======================= */
typedef enum {
  IR_CG_SOURCE,      /* input, param, constants */
  IR_CG_ELEMENTWISE, /* pointwise over a broadcast domain */
  IR_CG_REDUCTION,   /* reduces axes */
  IR_CG_COPY,        /* moves data without arithmetic */
  IR_CG_LIBRARY,     /* GEMM libraries */
  IR_CG_COMPOSITE,   /* templates (softmax, norms, attention, loss) */
  IR_CG_COLLECTIVE,  /* communication (later) */
  IR_CG_TIER,        /* disk tier transfers (tier_read_start, ...: ir/tier_ops.c) */
} ir_cg_class;

typedef struct dsc_node ir_node;
typedef struct dsc_graph ir_graph;
typedef struct dsc_module ir_module;

/* Gradient rule (ir/grad.c): given forward node n and dy (the loss
 * gradient w.r.t. n), appends nodes to g and sets dx[i] to the gradient
 * w.r.t. input i (NULL: not differentiable). */
typedef bool (*ir_grad_fn)(ir_graph *g, const ir_node *n, ir_node *dy, ir_node **dx);

/* Shape rule: computes the output type of n from its inputs and attributes.
 * On error returns false and writes a message (no location) into err. */
typedef bool (*ir_shape_fn)(const ir_node *n, dsc_type *out, char *err, size_t errlen);

/* An elementwise op's value at one point, in doubles: x[] its inputs, p its
 * float attribute (pow's exponent; 0 for the others). */
typedef double (*ir_scalar_fn)(const double *x, double p);

/* Elementwise op properties (the flags column of include/dsc/ops.def). */
enum {
  IR_OPF_KEEPS_ZERO = 1, /* f(0, ...) == 0 */
  IR_OPF_INT = 2,        /* defined on integers: folds integers to integers */
};

#define IR_MAX_OP_ATTRS 8 /* attributes in one op's row, keys under 24 bytes */
typedef struct {
  const char *name;
  int n_inputs; /* -1: variadic, at least one */
  const char *attr_spec;
  int n_attrs;
  const char *attr_keys[IR_MAX_OP_ATTRS];
  dsc_attr_kind attr_kinds[IR_MAX_OP_ATTRS];
  ir_shape_fn shape;
  dsc_interp_kernel interp;
  ir_cg_class cg;
  ir_grad_fn grad; /* NULL: no gradient rule */
  /* elementwise ops (EW rows) only: */
  ir_scalar_fn scalar; /* the value at one point; NULL for other ops */
  unsigned flags;      /* IR_OPF_* */
  const char *builtin; /* the model language's signature; "" none */
} ir_op_info;

const ir_op_info *ir_op(dsc_op op);
void ir_ops_init(void); /* parses attr specs once; idempotent, thread-safe */

/* ======================= ir/module.c ======================= */
typedef struct {
  const char *name;
  dsc_type type;
  dsc_init init;
  bool state; /* a non-trainable buffer (optimizer state, step count) */
} ir_param;

typedef struct {
  const char *key, *value;
} ir_meta;

struct dsc_node {
  int id; /* index in the graph's node list */
  dsc_op op;
  dsc_type type;
  int n_in;
  ir_node **in;
  int n_attrs;
  dsc_attr *attrs;
  const char *name; /* graph inputs: the input's name; otherwise NULL */
  dsc_loc loc;      /* source location of the expression that built it */
  ir_graph *graph;
  int group; /* fusion group set by passes/fuse.c (printed `group N`); 0 = none */
  int role;  /* ir_role: what the value is, for memory accounting (not printed) */
  int place; /* ir_place: where the value is computed and kept (printed ` host`) */
  /* Set by passes/guard.c (printed ` when %c` or ` unless %c`): the value
   * is needed only in runs where the bool scalar `guard` equals guard_if,
   * so an executor may skip computing it in the others (its value is then
   * unspecified and nothing reads it). An assign with a guard keeps its
   * state's value in those runs: its input is where(c, x, that state).
   * NULL: always computed. The interpreter computes everything. */
  ir_node *guard;
  bool guard_if;
};

/* IR_PLACE_HOST: the node runs on the host and its value lives in host
 * memory (passes/offload_host.c: ZeRO-Offload's optimizer step, to_host's
 * results); the code generator puts its buffer in the host work arena. */
typedef enum { IR_PLACE_DEVICE = 0, IR_PLACE_HOST = 1 } ir_place;

/* Set by the passes that create such values: the optimizer pass marks each
 * param's averaged gradient, the zero pass the reduced/sharded gradients the
 * update reads. The memory plan counts these buffers as "grads". */
/* IR_ROLE_RECOMPUTED: a value the backward computes again instead of
 * keeping the forward's (passes/remat.c, and what decompose expands it to):
 * cse must not give it back the forward's matmul or gather.
 * IR_ROLE_LOSS: the micro-batch's loss as the forward computes it (the
 * optimizer pass marks it); with the gradients it is what pass accumulate
 * carries from one micro-batch to the optimizer step. */
typedef enum {
  IR_ROLE_NONE = 0,
  IR_ROLE_GRAD = 1,
  IR_ROLE_RECOMPUTED = 2,
  IR_ROLE_LOSS = 3,
  /* a node of an update that stays on the device (ZenFlow's selective
   * update, passes/optimizer.c): pass offload_host never moves it */
  IR_ROLE_DEVICE_STEP = 4
} ir_role;

struct dsc_graph {
  const char *name;
  ir_module *module;
  ir_node **nodes;
  int n_nodes, cap_nodes;
  ir_node **inputs;
  int n_inputs, cap_inputs;
  ir_node **outputs;
  int n_outputs;
  dsc_loc cur_loc;
};

struct dsc_module {
  dsc_context *ctx;
  ir_arena arena;
  const char *name;
  ir_param *params;
  int n_params, cap_params;
  /* name -> index of params (open addressing, -1 empty; grown as params are
   * added): shape rules look params up by name once per node */
  int *param_slots;
  int cap_slots;
  ir_graph **graphs;
  int n_graphs, cap_graphs;
  ir_meta *meta;
  int n_meta, cap_meta;
};

/* Grows an arena-backed array (old storage is abandoned to the arena). */
bool ir_grow(ir_arena *a, void **items, int *cap, int need, size_t elem);
/* Creates a node without running the shape rule (used by the text parser,
 * which checks declared types with the verifier). Attributes are copied. */
ir_node *ir_node_new_raw(ir_graph *g, dsc_op op, dsc_type type, ir_node *const *in, int n_in,
                         const dsc_attr *attrs, int n_attrs);
/* Attribute lookups that assume the verifier has checked presence/kind. */
const dsc_attr *ir_attr(const ir_node *n, const char *key);
int64_t ir_attr_int(const ir_node *n, const char *key);
double ir_attr_float(const ir_node *n, const char *key);
bool ir_attr_bool(const ir_node *n, const char *key);
dsc_dtype ir_attr_dtype(const ir_node *n, const char *key);
const char *ir_attr_str(const ir_node *n, const char *key);
const int64_t *ir_attr_ints(const ir_node *n, const char *key, int *count);
const ir_param *ir_module_param(const ir_module *m, const char *name);
/* Guards (ir_node.guard, passes/guard.c). ir_guard_may_skip: whether a
 * node of this op may carry one at all: sources cost nothing, and
 * collectives and disk transfers are paired across ranks and calls.
 * ir_guard_kept_state: for an assign of where(c, x, s) or where(c, s, x)
 * with s a read of the assigned state, c's root, and in *when the value of c for
 * which the assign changes the state; NULL otherwise. ir_guard_problem: why
 * n's guard is not valid (NULL when it is, or n has none). */
bool ir_guard_may_skip(dsc_op op);
/* A condition's value as computed: c through its to_host / to_device
 * copies (the same value on either side), which guards compare by. */
const ir_node *ir_guard_root(const ir_node *c);
const ir_node *ir_guard_kept_state(const ir_node *assign, bool *when);
const char *ir_guard_problem(const ir_node *n);
/* Whether y may read x (x an input of y) given x's guard: y has the same
 * guard, or y is a where on that guard reading x only as the branch it
 * takes when the guard has x's value (a skipped x is then never used). */
bool ir_guard_read_ok(const ir_node *x, const ir_node *y);

/* ======================= ir/shape.c ======================= */
#define OP(id, name, n_in, attrs, shape, interp, cg, grad) \
  bool shape(const ir_node *n, dsc_type *out, char *err, size_t errlen);
#include "dsc/ops.def"
#undef OP

/* ======================= ir/tier_ops.c =======================
 * The disk tier's start/wait ops. ir_find_tier_misuse: a node reading a
 * tier start other than its wait, a start read by two waits, a start that
 * is a graph output, or a value written twice (tier_write_start or assign);
 * false when there is none, else *bad and a message in msg. */
bool ir_is_tier_start(dsc_op op);
bool ir_find_tier_misuse(const ir_graph *g, const ir_node **bad, char *msg, size_t msglen);

/* ======================= ir/collective_ops.c =======================
 * A start's value is the data in flight: only its matching wait may read it
 * (the verifier and the interpreter both enforce this). */
bool ir_is_collective_start(dsc_op op);
bool ir_is_collective_wait(dsc_op op);
/* Finds a node that reads a start other than its wait (*input = which
 * input) or a graph output that is a start (*output = which output, and
 * *reader = the start); false when there is none. */
bool ir_find_in_flight_read(const ir_graph *g, const ir_node **reader, int *input, int *output);
/* The communicator a collective start runs over: its group attribute, or
 * "world" for the ops that have none. */
const char *ir_collective_group(const ir_node *n);

/* ======================= ir/phase.c =======================
 * The part of a training step each node belongs to, as DeepSpeed's
 * wall_clock_breakdown times them (the engine's forward, backward and
 * step): in "train_step" and "micro_step" (passes optimizer and
 * accumulate), IR_PHASE_FORWARD is what output 0 (the loss) depends on,
 * IR_PHASE_BACKWARD what else output 1 (the gradient norm) depends on, and
 * in micro_step everything else; the rest of train_step (the update, the
 * assigns, stages 1-2's all-gather of the new params) is IR_PHASE_STEP.
 * Read from the graph's shape alone, so a module read back from text or a
 * .dsx gets the same phases. Every node of any other graph is FORWARD. */
typedef enum { IR_PHASE_FORWARD = 0, IR_PHASE_BACKWARD = 1, IR_PHASE_STEP = 2 } ir_phase;
#define IR_PHASE_COUNT 3
/* phase[i] for node i of g (g->n_nodes bytes); false when out of memory. */
bool ir_graph_phases(const ir_graph *g, unsigned char *phase);

/* ======================= ir/domain.c =======================
 * A fusion group's iteration domain and the affine points its members are
 * read at: passes/fuse.c decides groups with these, codegen/lower.c turns
 * the same analysis into kernel IR, so what the pass accepts is exactly
 * what the lowering can express. */
/* An index expression k + sum_v c[v] * i_v over the kernel's domain vars. */
typedef struct {
  int64_t k;
  int64_t c[DSC_MAX_RANK];
} ir_affine;

/* A group's domain: the full value shape D (in its own dim order) and the
 * reduced dims R (a bit mask over D). Kernel vars: D's dims outside R in
 * order (outer), then R's dims (inner). Without a reduction the last dim is
 * the inner one. */
typedef struct {
  dsc_type full;
  uint32_t rmask;
  bool reduces;
  int rank, n_outer;
  int64_t dims[DSC_MAX_RANK]; /* kernel order */
  int var_of[DSC_MAX_RANK];   /* D's dim j -> kernel var */
} ir_domain;

void ir_domain_make(const dsc_type *full, uint32_t rmask, bool reduces, ir_domain *d);
/* The domain of a group from its members (any order). False when the
 * members disagree (two reductions over different domains). */
bool ir_group_domain(ir_node *const *members, int n, ir_domain *d);
/* Whether gather x (an embedding), left out of fusion groups, may be
 * recomputed by each kernel that reads it at that kernel's point: none of
 * it or its inputs has a guard (a recomputed load must not read a buffer
 * a guard may have skipped). passes/fuse.c leaves such a gather out of
 * groups when every reader is a permute; codegen/lower.c then inlines it. */
bool ir_recomputed_gather(const ir_node *x);
/* Whether cast x, between float dtypes, may likewise be recomputed by each
 * kernel that reads it (no guards on it or its input; not a gradient, which
 * the memory plan holds as a model state): passes/fuse.c leaves
 * it out of groups when its input is a stored buffer (a matmul's result, a
 * param, a collective's, a lone reduction's), codegen/lower.c then inlines
 * it. Mixed precision casts each bf16 gradient up for the norm and the
 * update: stored, the f32 copy cost more traffic than the readers' own
 * conversions. */
bool ir_recomputed_cast(const ir_node *x);
/* A sum/mean/max over a non-empty axis list: sets *mask and returns true. */
bool ir_reduction_mask(const ir_node *n, uint32_t *mask);
/* The natural position of a value of type t in domain d: a full value
 * (t == D) or, when d reduces, a reduced one (D without R, or with R's dims
 * kept as 1). *full tells which. False when t is neither. */
bool ir_natural_map(const ir_domain *d, const dsc_type *t, ir_affine *p, bool *full);
/* The point of input i of n read when n is evaluated at point pn (per dim
 * of n): broadcasting, views, reductions (their reduced dims run over d's
 * inner vars), the ids of an embedding. False when not affine (a reshape
 * that splits a computed dim) or not an op a kernel evaluates. */
bool ir_input_point(const ir_node *n, int i, const ir_domain *d, const ir_affine *pn,
                           ir_affine *pin);
/* Same point, ignoring dims of size 1 (always index 0). */
bool ir_point_equal(const dsc_type *t, const ir_affine *a, const ir_affine *b);
/* Ops a kernel recomputes wherever they are read when all their inputs are
 * recomputable too (const, iota, elementwise, broadcast, permute, slice,
 * affine reshape): they are never grouped and never stored by fusion. */
bool ir_inlinable_op(const ir_node *n);

/* ======================= ir/interp.c ======================= */
/* The collectives the interpreter runs for the collective ops: an interface
 * ir/ declares and runtime/ implements (runtime/interp_comm.c, over
 * dsc_comm), so that ir/ calls nothing above it. comm and the requests are
 * the implementation's objects. Data is f64; reductions sum; a broadcast
 * sends from and receives into recv (send == recv). */
typedef enum {
  IR_COLL_ALL_REDUCE,
  IR_COLL_REDUCE_SCATTER,
  IR_COLL_ALL_GATHER,
  IR_COLL_BROADCAST,
  IR_COLL_ALL_TO_ALL, /* count: elements per peer */
} ir_coll_kind;
typedef struct {
  int (*world)(void *comm);
  int (*rank)(void *comm);
  dsc_context *(*context)(void *comm); /* where a failed collective is reported */
  bool (*broken)(void *comm);
  void (*abort)(void *comm, const char *why);
  dsc_status (*start)(void *comm, ir_coll_kind kind, const double *send, double *recv,
                      int64_t count, int root, int64_t tag, void **req);
  dsc_status (*wait)(void *req);
  /* The communicator a collective op's group attribute names ("world": comm
   * itself), NULL when comm has none by that name. */
  void *(*group)(void *comm, const char *name);
} ir_collectives;
/* dsc_interp_run (include/dsc/interp.h) with the collectives of comm
 * (coll NULL or comm NULL: none; a graph with collective ops then fails). */
dsc_status ir_interp_run(const ir_graph *g, const dsc_params *params,
                         const dsc_tensor *const *inputs, int n_inputs, dsc_tensor **outputs,
                         const ir_collectives *coll, void *comm);
/* Rounds every element of t to the precision of its dtype (f32, bf16, f16
 * round-to-nearest-even; integers truncate toward zero; bool to 0/1). */
void ir_round_to_dtype(dsc_tensor *t);
float ir_bf16_round(float x);
float ir_f16_round(float x);

/* ======================= ir/interp_ops.c ======================= */
#define OP(id, name, n_in, attrs, shape, interp, cg, grad)                                \
  bool interp(const dsc_node *n, const dsc_tensor *const *in, dsc_tensor *out, char *err, \
              size_t errlen);
#include "dsc/ops.def"
#undef OP

/* ======================= ir/attention.c =======================
 * The head layout of attention(q, k, v) {heads, kv_heads} that its gradient
 * rule and its decomposition share (the file's comment). */
/* G = heads / kv_heads. */
int64_t ir_attn_groups(const ir_node *n);
/* x [B, L, kv_heads groups hd] as [B, kv_heads, groups, L, hd] when grouped,
 * else [B, kv_heads groups, L, hd]; the last two axes swapped when
 * transposed. */
ir_node *ir_attn_split(ir_graph *g, ir_node *x, int64_t kv_heads, int64_t groups, bool grouped,
                       bool transposed);
/* The inverse of ir_attn_split (not transposed): back to [B, L, n hd]. */
ir_node *ir_attn_merge(ir_graph *g, ir_node *x);
/* bool [T, S]: key s is after query t (s > t + S - T), the causal mask, or
 * with window W > 0 also W or more positions before it. */
ir_node *ir_attn_masked(ir_graph *g, int64_t T, int64_t S, int64_t window);
/* rope node n's frequency i of a head of size hd: theta^(-2i/hd), scaled by
 * its llama3 attributes when factor > 1 (the interpreter's; the
 * decomposition builds the same in IR ops). */
double ir_rope_freq(const ir_node *n, int64_t i, int64_t hd);

/* ======================= ir/grad.c =======================
 * Gradient rules, one per differentiable op, written in IR ops with the
 * builder. Given forward node n and dy (the loss gradient w.r.t. n, n's
 * type), a rule appends nodes to g and sets dx[i] to the gradient w.r.t.
 * input i (input i's type), or NULL when input i is not differentiable
 * (integer ids/targets, where's condition, a cast from an integer).
 * Returns false when a builder call failed (a diagnostic says why). */
/* The rule table, DSC_OP_COUNT entries; NULL where an op has no rule
 * (sources, comparisons). */
const ir_grad_fn *ir_grad_rules(void);
ir_grad_fn ir_grad_rule(dsc_op op);
/* Every rule named in the op table, and ir_grad_none for ops without one. */
#define OP(id, name, n_in, attrs, shape, interp, cg, grad) \
  bool grad(ir_graph *g, const ir_node *n, ir_node *dy, ir_node **dx);
#include "dsc/ops.def"
#undef OP

/* ======================= ir/grad_ops.c =======================
 * Shape rule and kernel of embedding_grad (the scatter-add adjoint of
 * embedding); declared with every other op's by the X-macro sections above
 * (ir_shape_embedding_grad, interp_embedding_grad). */

/* ======================= ir/rng.c =======================
 * Deterministic parameter initialisation (documented in docs/ir.md):
 * each param's stream is seeded with splitmix64(seed ^ fnv1a64(name)), drawn
 * with xoshiro256**; normals by Box-Muller on (0,1] uniforms. */
typedef struct {
  uint64_t s[4];
} ir_rng;
uint64_t ir_fnv1a64(const char *s);
uint64_t ir_splitmix64(uint64_t *x); /* advances *x, returns the next output */
void ir_rng_seed(ir_rng *r, uint64_t seed);
uint64_t ir_rng_next(ir_rng *r);
double ir_rng_uniform(ir_rng *r); /* [0, 1) with 53 random bits */
double ir_rng_normal(ir_rng *r);  /* standard normal */

/* Dropout's random numbers: counter-based, so that every backend computes
 * the same bits with no state (ir/rng.c gives the formula; the LLVM and CUDA
 * emitters spell the same operations). A dropout's counter is
 * stream * 2^IR_DROPOUT_STREAM_SHIFT + the element's row-major index; the
 * whole counter stays below 2^53 so that the interpreter's doubles hold it. */
#define IR_RAND24_BITS 24
#define IR_DROPOUT_STREAM_SHIFT 40
#define IR_DROPOUT_MAX_STREAMS 8192               /* 2^(53 - 40) */
#define IR_RAND_MAX_SEED 0x1fffffffffffffLL       /* 2^53 - 1 */
int64_t ir_rand24(int64_t seed, int64_t counter); /* in [0, 2^24) */
/* The drop threshold: an element is dropped when rand24 < round(p 2^24). */
int64_t ir_dropout_threshold(double p);

#ifdef __cplusplus
}
#endif

#endif
