/* passes/: the pass layer's internal vocabulary, sectioned by source file.
 * Passes transform IR modules in place; the public entry points are in
 * include/dsc/passes.h. */
#ifndef DSC_PASSES_INTERNAL_H
#define DSC_PASSES_INTERNAL_H

#include "dsc/passes.h"
#include "dsc/train.h"
#include "ir/ir.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ======================= passes/settings.c =======================
 * The printed train values (module meta train.*: numbers, true/false,
 * names, tuples, name(key = value, ...)) as a tree, for the settings table
 * (include/dsc/settings.h) and the optimizer and schedule readers of
 * passes/train_config.c. */
enum { PASS_TV_NUM, PASS_TV_BOOL, PASS_TV_NAME, PASS_TV_TUPLE, PASS_TV_CALL };
#define PASS_TV_MAX_ITEMS 8
typedef struct pass_tv pass_tv;
struct pass_tv {
  int kind;
  double num;
  bool is_int; /* a number written without '.', 'e', inf or nan */
  bool b;
  char name[48];
  int n; /* tuple items or call arguments */
  pass_tv *items[PASS_TV_MAX_ITEMS];
  char keys[PASS_TV_MAX_ITEMS][32]; /* call arguments: "" when positional */
};
typedef struct {
  const char *s, *key;
  pass_tv *pool;
  int used, cap;
  dsc_context *ctx; /* NULL: no diagnostic */
  bool failed;
} pass_tv_parser;
/* Parses the whole of `text` (the value of `key`) with nodes from
 * pool[0..cap); NULL, with a diagnostic on ctx, when malformed. */
pass_tv *pass_tv_parse(pass_tv_parser *p, pass_tv *pool, int cap, dsc_context *ctx, const char *key,
                       const char *text);
/* Stores a parsed value into the setting's dsc_train_config field; false
 * when it has none. */
bool pass_setting_store_config(dsc_train_config *cfg, const dsc_setting *s,
                               const dsc_setting_value *v);

/* ======================= passes/train_config.c =======================
 * The optimizer and schedule of cfg as the train section writes them
 * ("adamw(lr = 0.001, betas = (0.9, 0.95), eps = 1e-08, weight_decay =
 * 0.1)", "cosine(warmup = 50, min_lr = 0.0003, decay_steps = 0)"): text
 * that dsc_train_config_from_module reads back to the same fields. */
void pass_format_optimizer(const dsc_train_config *cfg, char *buf, size_t n);
void pass_format_schedule(const dsc_train_config *cfg, char *buf, size_t n);

/* ======================= passes/autodiff.c =======================
 * Reverse-mode differentiation of a graph whose single output is a rank-0
 * float loss. Appends the backward nodes to g and sets g's outputs to
 * [loss, d loss / d param 0, d loss / d param 1, ...] in module param order.
 * Only float values on a path from a param to the loss are differentiated
 * (integer and bool values cut the path). A param the loss does not depend
 * on gets a zero gradient and a warning. An op on a path without a gradient
 * rule is an error at the node's source location. On error g is unchanged. */
dsc_status pass_autodiff_run(ir_module *m, ir_graph *g);
/* Same with an explicit rule table (DSC_OP_COUNT entries, NULL = no rule);
 * pass_autodiff_run uses ir_grad_rules(). Tests use it to remove a rule. */
dsc_status pass_autodiff_run_with_rules(ir_module *m, ir_graph *g, const ir_grad_fn *rules);

/* ======================= passes/sequence_parallel.c =======================
 * Ulysses sequence parallelism over cfg->sp ranks of the mesh axis "sp"
 * (the comment at the top of the file): graph 'forward', compiled at T/sp
 * positions, exchanges attention's q, k, v into a split over heads and
 * back, and numbers its positions as its part of the sequence. Runs before
 * autodiff; nothing at sp <= 1. */
dsc_status pass_sequence_parallel_run(ir_module *m, const dsc_train_config *cfg);

/* ======================= passes/expert_parallel.c =======================
 * Expert parallelism over cfg->ep ranks of the mesh axis "ep" (the comment
 * at the top of the file): each MoE layer's expert region runs on this
 * rank's E/ep experts, the slots exchanged over ep before and after. Runs
 * before autodiff; nothing at ep <= 1. */
dsc_status pass_expert_parallel_run(ir_module *m, const dsc_train_config *cfg);

/* ======================= passes/tensor_parallel.c =======================
 * Tensor parallelism over cfg->tp ranks of the mesh axis "tp" (the comment
 * at the top of the file): attention's heads and the MLPs' hidden units
 * split over tp, Megatron's column- and row-parallel matmuls found in the
 * graph, the partial products summed by an all_reduce over tp; the output
 * layer and the loss over the vocabulary's columns. Runs before autodiff;
 * nothing at tp <= 1. */
dsc_status pass_tensor_parallel_run(ir_module *m, const dsc_train_config *cfg);

/* ======================= passes/decompose.c =======================
 * Rewrites every composite op (softmax, log_softmax, layernorm, rmsnorm,
 * attention, cross_entropy; not embedding_grad) of every graph into
 * primitive ops (elementwise, reductions, layout, iota/const, matmul,
 * embedding), in numerically stable forms, keeping each composite's result
 * type and source location; f32 compute for bf16/f16 norms, softmaxes and
 * losses. A cross_entropy target outside [0, V) stays a runtime error
 * (through a bounds-checked embedding). On error the graphs are unchanged
 * except for those already rewritten (each graph is rewritten whole). */
dsc_status pass_decompose_run(ir_module *m);
/* Whether the pass rewrites ops of this kind. */
bool pass_decompose_op(dsc_op op);
/* attention(q, k, v) as the pass writes it, with the op `attn`'s heads and
 * scale: `masked` (bool, broadcast to the scores [B, KVH, G, T, S] when
 * grouped, else [B, H, T, S]; NULL: none) is true where a key is hidden
 * from a query. passes/kv_cache.c gives it a mask of runtime positions. */
ir_node *pass_attention_form(ir_graph *g, const ir_node *attn, ir_node *q, ir_node *k, ir_node *v,
                             ir_node *masked);

/* ======================= passes/kv_cache.c =======================
 * The inference graph of a token model (issue 23): from `fwd`, a forward
 * graph compiled at [B, t] that ends in cross_entropy(logits, targets),
 * builds graph `name` in `dst`:
 *   name(tokens: [B, t], pos: i32[B], last: i32[B], rows: i32[B, span],
 *        dest: i32[B * t]) -> logits [B, V]
 * Row b holds t tokens of sequence b at positions pos[b] .. pos[b] + t - 1;
 * the result is the logits after token last[b] of the row. Each attention
 * keeps its keys and values in states kv.<i>.k and kv.<i>.v [pool, C]
 * (zeros at first), rows shared by all sequences: the run writes the new
 * key of row b, token j into pool row dest[b * t + j] (none where that is
 * outside the pool, e.g. -1), then attends, for sequence b, to pool rows
 * rows[b, 0 .. span) as its positions 0 .. span - 1, up to each query's
 * own (t <= span <= context; a query at span or later is not answered).
 * Positions are clamped to context - 1. dst takes fwd's params when it
 * has none; another graph (another B, t or span) must agree with the
 * first on params and pool. The model's positions
 * must be iota(T) read by embedding or rope, its attentions causal. On an
 * error dst may hold part of the graph and its states: discard it. */
dsc_status pass_kv_cache_graph(ir_module *dst, const ir_graph *fwd, const char *name,
                               int64_t context, int64_t span, int64_t pool);

/* ======================= passes/cse.c =======================
 * Common subexpression elimination: equal reductions, matmuls and
 * embeddings (same op, attributes and inputs up to equality) are computed
 * once; unused pure nodes are removed. The rules are the comment at the top
 * of cse.c. Exact (the same values); out of memory is the only error. */
dsc_status pass_cse_graph(ir_graph *g);
dsc_status pass_cse_run(ir_module *m); /* every graph of the module */

/* ======================= passes/ir_util.c =======================
 * Graph surgery shared by passes. */
/* Appends a copy of every node of `src` (same module) to `dst`: src's i-th
 * input becomes inputs[i] (a node of dst), other nodes are cloned with their
 * types, attributes and source locations (no shape rule runs: the types are
 * already checked). outs[k] receives the clone of src's k-th output.
 * Returns false (with a diagnostic) when out of memory. */
bool pass_inline_graph(ir_graph *dst, const ir_graph *src, ir_node *const *inputs, ir_node **outs);
/* A view: reshape, permute, slice or broadcast (reads its input's bytes in
 * place; no buffer of its own to move, no time of its own). */
bool pass_is_view(const ir_node *x);
/* Removes graph `name` from the module (its nodes stay in the arena).
 * Returns false when there is no such graph. */
bool pass_remove_graph(ir_module *m, const char *name);
/* The start op (all_reduce, reduce_scatter, all_gather or all_to_all) of x
 * over `group` ("world" or a mesh axis) of `world` ranks, tag 0 (the
 * trainer sets the step's); NULL when x is NULL or on a shape error. */
ir_node *pass_collective_start(ir_graph *g, dsc_op op, ir_node *x, int64_t world,
                               const char *group);
/* This rank's chunk of vector x over `group` of `world` ranks (local_shard). */
ir_node *pass_local_shard(ir_graph *g, ir_node *x, int64_t world, const char *group);
/* all_to_all_wait(all_to_all_start(x)), as above. */
ir_node *pass_all_to_all(ir_graph *g, ir_node *x, int64_t world, const char *group);
/* Whether input j of u is read as token positions: a position embedding's
 * index or rope's positions (what the kv-cache and sequence-parallel passes
 * renumber). */
bool pass_reads_positions(const ir_node *u, int j);
/* Graph 'forward' of the pass `what` ("tensor parallel") over the n ranks
 * of mesh axis `axis`; NULL with the error reported and *st set when there
 * is none or n does not divide cfg's world. */
ir_graph *pass_mesh_forward(ir_module *m, const char *what, const char *axis, int64_t n,
                            int64_t world, dsc_status *st);
/* Whether collective start x is the model's own: put in graph 'forward' by
 * a parallelism pass (over sp, ep or tp), or autodiff's adjoint of one, as
 * opposed to the reductions and gathers of params and gradients that the
 * zero pass adds (over the world). The schedule pass leaves the model's
 * where they are. */
bool pass_model_collective(const ir_node *x);
/* Every read of `from` in g (its nodes but `to`, its outputs) reads `to`. */
void pass_replace_uses(ir_graph *g, ir_node *from, ir_node *to);

/* Removes the nodes that neither an output nor an assign needs, then orders
 * graph g by a priority topological sort: nodes with id < n_orig keep their
 * position as key, `fixed` nodes get the given key (e.g. id + 0.5: right
 * after node id), every other node goes right before its first reader (as
 * late as possible). Ids are renumbered. */
typedef struct {
  ir_node *node;
  double key;
} pass_fixed_key;
dsc_status pass_reorder(ir_graph *g, int n_orig, const pass_fixed_key *fixed, int n_fixed);

/* ======================= passes/guard.c =======================
 * Marks the values a step needs only when a bool scalar has one value
 * (ir_node.guard; the rules are the comment at the top of guard.c).
 * pass_guard_settle drops the guards that the node order or the fusion
 * groups no longer allow (fuse calls it after reordering). */
dsc_status pass_guard_run(ir_module *m);
void pass_guard_settle(ir_graph *g);

/* ======================= passes/fuse.c =======================
 * Fusion: sets node->group so that each group becomes one kernel (the rules
 * are the comment at the top of fuse.c). A group's iteration domain is
 * ir/domain.c's (shared with codegen/lower.c). */
dsc_status pass_fuse_graph(ir_graph *g);
dsc_status pass_fuse_run(ir_module *m); /* every graph of the module */

/* ======================= passes/optimizer.c =======================
 * Builds the training-step graph "train_step" from graph "forward" (run
 * through autodiff first when it still has one output) as include/dsc/train.h
 * describes: grad_accum micro-batches, gradient averaging, global norm,
 * clipping, the optimizer update (adamw, sgd, muon) with its states and the
 * `assign`s. Removes "forward". On error "train_step" is removed again, but
 * states already created stay (callers discard the module). */
dsc_status pass_optimizer_run(ir_module *m, const dsc_train_config *cfg);

/* ======================= passes/precision.c =======================
 * Mixed precision (cfg->precision): rebuilds graph "forward" (one output,
 * before autodiff) so that it computes in bf16 or f16 with the params kept
 * in f32; norms, softmax, losses and sum/mean stay in f32; the outputs keep
 * their types. fp16 also creates state opt.loss_scale and scales the loss
 * by it. f32 (or cfg NULL): nothing changes. On error "forward" is
 * unchanged. */
/* passes/remat.c: activation checkpointing of graph 'forward' after autodiff
 * (cfg->remat). */
dsc_status pass_remat_run(ir_module *m, const dsc_train_config *cfg);
/* passes/schedule.c: buckets reduce_scatters and prefetches all_gathers of
 * graph train_step (cfg->zero.bucket_bytes, prefetch_bytes). */
dsc_status pass_schedule_run(ir_module *m, const dsc_train_config *cfg);

/* ======================= passes/accumulate.c =======================
 * Gradient accumulation as a loop: with cfg->grad_accum K > 1, graph
 * "train_step" (one micro-batch, after zero/offload/schedule) is cut into
 * "micro_step" (forward, backward and the gradients' collectives, summing
 * the gradients and the loss x 1/K into states "acc.<n>"; inputs: the
 * micro-batch's, then first: f32[]) and "train_step" (lr) -> its outputs,
 * reading the sums. Module meta accumulate.steps = K, accumulate.reduce =
 * micro_batch | step (cfg->zero.reduce_each_micro_batch). Nothing at K 1. */
dsc_status pass_accumulate_run(ir_module *m, const dsc_train_config *cfg);
dsc_status pass_precision_run(ir_module *m, const dsc_train_config *cfg);
/* Checks cfg->fp16's loss-scaling settings (a diagnostic when invalid). */
bool pass_precision_check_fp16(ir_module *m, const dsc_train_config *cfg);

/* ======================= passes/zero.c =======================
 * Data parallelism (docs/training.md "Data parallel"): at cfg->world > 1 and
 * zero.stage 0, rewrites graph "train_step" so that the averaged gradients
 * (before norm and clipping) and the loss are means over the ranks, through
 * all_reduce start/wait pairs. World <= 1 (or cfg NULL): nothing. Stages
 * 1-3 at world > 1: a "not implemented yet" error. */
dsc_status pass_zero_run(ir_module *m, const dsc_train_config *cfg);

/* ======================= passes/offload.c =======================
 * Offload tiers (cfg->offload): module meta "tier.<name>" = host | disk for
 * the optimizer states and (stage 3 at world > 1 only, else an error) the
 * sharded params; nothing when both are none. */
dsc_status pass_offload_run(ir_module *m, const dsc_train_config *cfg);
/* passes/offload_disk.c: the disk tier's values streamed (tier_read_start/
 * _wait, tier_write_start/_wait instead of param/assign; run by pass
 * offload) and their starts and waits scheduled (run by pass schedule). */
dsc_status pass_offload_disk_run(ir_module *m, const dsc_train_config *cfg);
dsc_status pass_offload_schedule_run(ir_module *m, const dsc_train_config *cfg);
/* passes/prefetch.c (run by pass schedule): with the host stream (meta
 * offload.overlap) each offloaded activation's to_device starts ahead of
 * its first reader by its copy's time, from pass_node_seconds, within
 * cfg->offload.prefetch_bytes of early returns at any point. */
dsc_status pass_prefetch_returns_run(ir_module *m, const dsc_train_config *cfg);
/* The cost model's rates, per second (cfg->gemm_gflops, cfg->mem_gbps,
 * cfg->copy_gbps, else the defaults: a 2-core server's). */
#define PASS_DEFAULT_GEMM_GFLOPS 200.0
#define PASS_DEFAULT_MEM_GBPS 20.0
#define PASS_DEFAULT_COPY_GBPS 20.0
typedef struct {
  double gemm_flops, mem_bytes, copy_bytes; /* device GEMM, device memory, host <-> device */
} pass_rates;
void pass_rates_of(const dsc_train_config *cfg, pass_rates *out);
/* The executor's time for node x: matmul and attention flops at the GEMM
 * rate, to_host its bytes at the copy rate, other ops their bytes at the
 * memory rate; 0 for views, sources,
 * assigns, host-placed nodes and to_device (the host stream's). */
double pass_node_seconds(const ir_node *x, const pass_rates *r);
/* passes/offload_host.c: --offload-optimizer host runs the update of graph
 * "train_step" on the host (nodes placed IR_PLACE_HOST; gradients copied
 * out with to_host as soon as final, updated device params back with
 * to_device); run by pass offload. */
dsc_status pass_offload_host_run(ir_module *m, const dsc_train_config *cfg);
/* Activation offload (remat policy "offload"), on the differentiated
 * "forward" graph: pass_act_offload_ref(s, x) is what a backward reader of
 * forward value x reads instead: to_device(to_host(x)) for a value with a
 * buffer (x itself for sources, constants, views and scalars), one per x.
 * Each to_host goes right after x's last forward reader: the fixed keys for
 * pass_reorder. NULL on out of memory. */
typedef struct pass_act_offload pass_act_offload;
pass_act_offload *pass_act_offload_new(ir_graph *g, const bool *fwd);
ir_node *pass_act_offload_ref(pass_act_offload *s, ir_node *x);
const pass_fixed_key *pass_act_offload_keys(const pass_act_offload *s, int *n);

/* ======================= passes/pass_manager.c =======================
 * The default pipeline is a table of rows {name, description, run}; a new
 * pass is one row. dsc_run_pipeline (include/dsc/train.h) runs them in
 * order, verifying after each one (always in builds without NDEBUG). */
typedef dsc_status (*pass_run_fn)(ir_module *m, const dsc_pipeline_options *opts);

#ifdef __cplusplus
}
#endif
#endif
