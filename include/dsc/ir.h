/* dsc public API: the tensor IR.
 *
 * A module holds named parameters (type + initializer), graphs and
 * metadata (the model's `train` settings). A graph is a list of nodes in
 * SSA order; every node produces exactly one tensor value, so a node *is*
 * its value (as an LLVM instruction is). Graph inputs are nodes of op
 * `input`; parameters are read by nodes of op `param`.
 *
 * All IR memory belongs to the module's arena and is freed with the module. */
#ifndef DSC_IR_H
#define DSC_IR_H

#include "dsc/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dsc_module dsc_module;
typedef struct dsc_graph dsc_graph;
typedef struct dsc_node dsc_node;

/* Op kinds, generated from the op table (ir/ops.def). */
typedef enum {
#define OP(id, name, n_in, attrs, shape, interp, cg, grad) DSC_OP_##id,
#include "dsc/ops.def"
#undef OP
  DSC_OP_COUNT
} dsc_op;

const char *dsc_op_name(dsc_op op);
/* Returns 0 and sets *out if name is an op name. */
int dsc_op_from_name(const char *name, dsc_op *out);

/* ---- attributes ---- */
typedef enum {
  DSC_ATTR_INT,
  DSC_ATTR_FLOAT,
  DSC_ATTR_BOOL,
  DSC_ATTR_INTS,
  DSC_ATTR_DTYPE,
  DSC_ATTR_STR
} dsc_attr_kind;

typedef struct {
  const char *key;
  dsc_attr_kind kind;
  union {
    int64_t i;
    double f;
    int b;
    dsc_dtype dt;
    const char *s;
    struct {
      const int64_t *v;
      int n;
    } ints;
  } u;
} dsc_attr;

dsc_attr dsc_attr_int(const char *key, int64_t v);
dsc_attr dsc_attr_float(const char *key, double v);
dsc_attr dsc_attr_bool(const char *key, int v);
dsc_attr dsc_attr_ints(const char *key, const int64_t *v, int n);
dsc_attr dsc_attr_dtype(const char *key, dsc_dtype v);
dsc_attr dsc_attr_str(const char *key, const char *v);

/* ---- parameter initializers ---- */
typedef enum {
  DSC_INIT_ZEROS,
  DSC_INIT_ONES,
  DSC_INIT_CONST,   /* a = value */
  DSC_INIT_NORMAL,  /* a = std, b = mean */
  DSC_INIT_UNIFORM, /* [a, b) */
  DSC_INIT_COPY,    /* the initial value of param `from` (the same full numel), in this
                       dtype: mixed precision's f32 master weights (printed copy(NAME)) */
} dsc_init_kind;

typedef struct {
  dsc_init_kind kind;
  double a, b;
  const char *from; /* DSC_INIT_COPY: the param copied (the module keeps its own copy) */
} dsc_init;

/* ---- modules ---- */
dsc_module *dsc_module_new(dsc_context *ctx, const char *name);
void dsc_module_free(dsc_module *m);
const char *dsc_module_name(const dsc_module *m);
dsc_context *dsc_module_context(const dsc_module *m);

/* Parameters, in declaration order. Names are paths ("h.0.ln1_w"). */
dsc_status dsc_module_add_param(dsc_module *m, const char *name, dsc_type type, dsc_init init);
int dsc_module_param_count(const dsc_module *m);
const char *dsc_module_param_name(const dsc_module *m, int i);
dsc_type dsc_module_param_type(const dsc_module *m, int i);
dsc_init dsc_module_param_init(const dsc_module *m, int i);
int dsc_module_find_param(const dsc_module *m, const char *name); /* -1 if absent */
/* State: a non-trainable buffer that a graph reads with `param` and updates
 * with `assign` (optimizer moments, step counts). Listed with the params,
 * printed as `state NAME: TYPE = INIT`; autodiff does not differentiate it. */
dsc_status dsc_module_add_state(dsc_module *m, const char *name, dsc_type type, dsc_init init);
int dsc_module_param_is_state(const dsc_module *m, int i);
int64_t dsc_module_param_numel(const dsc_module *m); /* total elements */

/* ZeRO sharding (passes/zero.c): param/state i holds, on each of `world`
 * ranks, an [S] chunk of the flat tensor of type *full zero-padded to
 * world*S elements (S = ceil(numel/world)); rank r holds [r*S, (r+1)*S).
 * Returns 1 when i is sharded (meta "shard.<name>"), 0 when not (then *full
 * is its type and *world 1), -1 when the metadata is malformed. */
int dsc_module_param_shard(const dsc_module *m, int i, dsc_type *full, int64_t *world);

/* Metadata: string keys ("train.batch") to a printed value ("8", "adamw",
 * "(0.9, 0.95)"). Setting a key again replaces it; order is insertion order. */
dsc_status dsc_module_set_meta(dsc_module *m, const char *key, const char *value);
const char *dsc_module_get_meta(const dsc_module *m, const char *key); /* NULL if absent */
int dsc_module_meta_count(const dsc_module *m);
const char *dsc_module_meta_key(const dsc_module *m, int i);
const char *dsc_module_meta_value(const dsc_module *m, int i);

/* Graphs, in creation order. */
dsc_graph *dsc_graph_new(dsc_module *m, const char *name);
int dsc_module_graph_count(const dsc_module *m);
dsc_graph *dsc_module_graph(const dsc_module *m, int i);
dsc_graph *dsc_module_find_graph(const dsc_module *m, const char *name);

/* ---- graphs and the builder ----
 * Builder calls infer the result type with the op's shape rule. On a shape
 * error they add a diagnostic (at the graph's current location, see
 * dsc_graph_set_loc) and return NULL; passing NULL as an input returns NULL
 * without a new diagnostic, so a chain of calls needs one check at the end. */
const char *dsc_graph_name(const dsc_graph *g);
dsc_module *dsc_graph_module(const dsc_graph *g);
dsc_node *dsc_graph_input(dsc_graph *g, const char *name, dsc_type type);
dsc_status dsc_graph_set_outputs(dsc_graph *g, dsc_node *const *outs, int n);
int dsc_graph_node_count(const dsc_graph *g);
dsc_node *dsc_graph_node(const dsc_graph *g, int i);
int dsc_graph_input_count(const dsc_graph *g);
dsc_node *dsc_graph_input_at(const dsc_graph *g, int i);
int dsc_graph_output_count(const dsc_graph *g);
dsc_node *dsc_graph_output_at(const dsc_graph *g, int i);
/* Location attached to nodes built from now on (for diagnostics). */
void dsc_graph_set_loc(dsc_graph *g, dsc_loc loc);

dsc_node *dsc_build(dsc_graph *g, dsc_op op, dsc_node *const *in, int n_in, const dsc_attr *attrs,
                    int n_attrs);

/* Convenience builders. */
dsc_node *dsc_param_ref(dsc_graph *g, const char *param_name);
dsc_node *dsc_const(dsc_graph *g, double value, dsc_type type);
dsc_node *dsc_unary(dsc_graph *g, dsc_op op, dsc_node *x);
dsc_node *dsc_binary(dsc_graph *g, dsc_op op, dsc_node *a, dsc_node *b);
dsc_node *dsc_matmul(dsc_graph *g, dsc_node *a, dsc_node *b);
dsc_node *dsc_reduce(dsc_graph *g, dsc_op op, dsc_node *x, const int64_t *axes, int n_axes,
                     int keepdims);
dsc_node *dsc_reshape(dsc_graph *g, dsc_node *x, const int64_t *shape, int rank);
dsc_node *dsc_permute(dsc_graph *g, dsc_node *x, const int64_t *perm, int rank);
dsc_node *dsc_cast(dsc_graph *g, dsc_node *x, dsc_dtype to);
/* attention(q [B, T, heads hd], k and v [B, S, kv_heads hd]): kv_heads
 * divides heads (grouped-query attention; kv_heads == heads is multi-head);
 * scale <= 0 means 1/sqrt(hd). */
dsc_node *dsc_attention(dsc_graph *g, dsc_node *q, dsc_node *k, dsc_node *v, int64_t heads,
                        int64_t kv_heads, bool causal, double scale);
/* The same with a sliding window (Mistral's sliding_window): causal, and
 * query t sees only the keys fewer than window positions back (t + S - T -
 * s < window); window 0: all of them. */
dsc_node *dsc_attention_windowed(dsc_graph *g, dsc_node *q, dsc_node *k, dsc_node *v, int64_t heads,
                                 int64_t kv_heads, bool causal, double scale, int64_t window);
/* Rotary position embedding of x [..., T, heads hd] at integer positions
 * (shape [T], or x's without the last axis, broadcast): rotate-half pairs
 * (Llama, NeoX) or, interleaved, adjacent pairs (GPT-J); angle p theta^(-2i/hd). */
dsc_node *dsc_rope(dsc_graph *g, dsc_node *x, dsc_node *positions, int64_t heads, double theta,
                   bool interleaved);
/* Llama 3.1's frequency scaling (transformers' rope_type "llama3"): the
 * frequencies whose wavelength exceeds original_context / low_freq_factor
 * are divided by factor, those under original_context / high_freq_factor
 * kept, the ones between interpolated. factor 1: none. */
typedef struct {
  double factor, low_freq_factor, high_freq_factor;
  int64_t original_context;
} dsc_rope_scaling;
dsc_node *dsc_rope_scaled(dsc_graph *g, dsc_node *x, dsc_node *positions, int64_t heads,
                          double theta, bool interleaved, const dsc_rope_scaling *scaling);
/* Dropout of x with probability p in [0, 1): seed is i64 [] or [1] (a
 * graph input, drawn per micro-batch by the trainer), stream in [0, 8192)
 * distinct per dropout of a model (docs/ir.md "dropout"). */
dsc_node *dsc_dropout(dsc_graph *g, dsc_node *x, dsc_node *seed, double p, int64_t stream);

/* ---- nodes ---- */
dsc_op dsc_node_op(const dsc_node *n);
dsc_type dsc_node_type(const dsc_node *n);
int dsc_node_input_count(const dsc_node *n);
dsc_node *dsc_node_input(const dsc_node *n, int i);
const dsc_attr *dsc_node_attr(const dsc_node *n, const char *key); /* NULL if absent */
const char *dsc_node_name(const dsc_node *n); /* input name or NULL */

/* ---- text form, verification, DOT ----
 * The text form prints every value with its type and parses back:
 * print -> parse -> print is byte-identical. */
dsc_status dsc_module_print(const dsc_module *m, FILE *out);
/* Returns a string allocated with the context's allocator (free with
 * dsc_string_free) or NULL on failure. */
char *dsc_module_print_string(const dsc_module *m);
void dsc_string_free(dsc_context *ctx, char *s);
/* Parses the text form; `file` names the source in diagnostics. */
dsc_status dsc_module_parse(dsc_context *ctx, const char *text, size_t len, const char *file,
                            dsc_module **out);
/* Checks SSA order, op arity, attributes, types against the shape rules,
 * param references and graph outputs; reports every problem found. */
dsc_status dsc_module_verify(const dsc_module *m);
dsc_status dsc_module_print_dot(const dsc_module *m, FILE *out);

#ifdef __cplusplus
}
#endif
#endif
