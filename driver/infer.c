/* Inference from a checkpoint (include/dsc/infer.h): the engine that runs
 * the KV-cache graphs of pass kv_cache, and the sampler of dsc sample /
 * dsc generate on top of it (include/dsc/trainer.h). */
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "driver/driver.h"
#include "dsc/infer.h"
#include "passes/passes.h"

#define MAX_SPANS 5   /* the context, and halves of it down to 64 positions */
#define MAX_BUCKETS 6 /* the slots, and halves of them down to 1 */

/* One compiled graph: its rows (sequences), the positions its attention
 * sees, its inputs and how often a step ran it. */
typedef struct {
  char name[48];
  int64_t rows, span;
  dsc_tensor *in[5]; /* tokens, pos, last, rows, dest */
  int64_t runs;
} infer_graph;

struct dsc_infer {
  dsc_context *ctx;
  dsc_module *m; /* params, the caches, graphs prefill and decode */
  dsc_exec *exec;
  int64_t slots, chunk, context, vocab;
  /* the pool: `blocks` blocks of `block` positions, handed to the slots as
   * their sequences grow; table[slot * per_seq + i] is the block holding the
   * slot's positions i * block .. (held[slot] of them), free the stack of
   * the others. Without a cache, one block per slot of `context` positions. */
  int64_t block, blocks, per_seq;
  int64_t *table, *held, *free, n_free;
  /* The graphs of a step with prompt chunks (0) and of one with single
   * tokens (1): prefill and decode, or decode twice when chunk is 1; each
   * for every bucket of rows (the slots, and halves of them down to one)
   * and every span, the positions its attention sees (the context, and
   * halves of it down to 64). graph[g][b * n_spans + s] is bucket b, span s,
   * both ascending: "decode" has every slot and the context, "decode.r2.128"
   * 2 rows and 128 positions. A step runs the fewest rows that take its
   * sequences and the shortest span that holds them, so it costs what the
   * running sequences hold, not what the engine could hold. */
  int n_buckets, n_spans;
  int64_t bucket[MAX_BUCKETS], span[MAX_SPANS];
  infer_graph graph[2][MAX_BUCKETS * MAX_SPANS];
  int64_t *row_slot; /* [slots]: the slot each row of a step runs */
  /* no cache (a model pass kv_cache cannot rewrite): graph `window`, the
   * forward over every slot's tokens so far, run whole at each step */
  dsc_tensor *window, *targets;
  double seconds[2];
  int64_t runs[2];
};

static dsc_status oom(dsc_context *ctx) {
  ir_error(ctx, ir_no_loc, "out of memory");
  return DSC_ERR_INTERNAL;
}

static double now_s(void) { return (double)dsc_trace_now_ns() * 1e-9; }

void dsc_infer_free(dsc_infer *e) {
  if (!e) return;
  for (int g = 0; g < 2; g++)
    for (int k = 0; k < MAX_BUCKETS * MAX_SPANS; k++)
      for (int i = 0; i < 5; i++) dsc_tensor_free(e->ctx, e->graph[g][k].in[i]);
  free(e->row_slot);
  free(e->table);
  free(e->held);
  free(e->free);
  dsc_tensor_free(e->ctx, e->window);
  dsc_tensor_free(e->ctx, e->targets);
  dsc_exec_free(e->exec);
  dsc_module_free(e->m);
  ir_free(e->ctx, e, sizeof *e);
}

int64_t dsc_infer_vocab(const dsc_infer *e) { return e->vocab; }
int64_t dsc_infer_context(const dsc_infer *e) { return e->context; }
int64_t dsc_infer_slots(const dsc_infer *e) { return e->slots; }
int64_t dsc_infer_chunk(const dsc_infer *e) { return e->chunk; }

void dsc_infer_times(const dsc_infer *e, double *prefill_s, int64_t *prefills, double *decode_s,
                     int64_t *decodes) {
  *prefill_s = e->seconds[0], *prefills = e->runs[0];
  *decode_s = e->seconds[1], *decodes = e->runs[1];
}

dsc_exec *dsc_infer_exec(dsc_infer *e) { return e->exec; }

const char *dsc_infer_one_token_graph(const dsc_infer *e) {
  if (e->window) return "forward";
  int most = e->n_buckets * e->n_spans - 1; /* "decode" */
  for (int k = 0; k < e->n_buckets * e->n_spans; k++)
    if (e->graph[1][k].runs > e->graph[1][most].runs) most = k;
  return e->graph[1][most].name;
}

/* x, then halves of it while they are at least lo, at most `max` values;
 * ascending. Returns how many. */
static int halves(int64_t x, int64_t lo, int max, int64_t *out) {
  int64_t s[MAX_SPANS > MAX_BUCKETS ? MAX_SPANS : MAX_BUCKETS];
  int n = 0;
  for (; n < max && (n == 0 || x >= lo); x /= 2) s[n++] = x;
  for (int k = 0; k < n; k++) out[k] = s[n - 1 - k];
  return n;
}

/* The graphs' names, rows and spans (halves of the slots down to one row,
 * of the context down to 64 positions and a chunk). */
static void name_graphs(dsc_infer *e, int kinds) {
  static const char *const names[2] = {"prefill", "decode"};
  int64_t lo = e->chunk > 64 ? e->chunk : 64;
  e->n_buckets = halves(e->slots, 1, MAX_BUCKETS, e->bucket);
  e->n_spans = halves(e->context, lo, MAX_SPANS, e->span);
  for (int g = 0; g < 2; g++)
    for (int b = 0; b < e->n_buckets; b++)
      for (int s = 0; s < e->n_spans; s++) {
        infer_graph *v = &e->graph[g][b * e->n_spans + s];
        int at = snprintf(v->name, sizeof v->name, "%s", names[kinds == 2 ? g : 1]);
        if (b < e->n_buckets - 1)
          at += snprintf(v->name + at, sizeof v->name - (size_t)at, ".r%" PRId64, e->bucket[b]);
        if (s < e->n_spans - 1)
          snprintf(v->name + at, sizeof v->name - (size_t)at, ".%" PRId64, e->span[s]);
        v->rows = e->bucket[b], v->span = e->span[s];
      }
}

void dsc_infer_cache(const dsc_infer *e, int64_t *block, int64_t *blocks, int64_t *free_blocks) {
  *block = e->block, *blocks = e->blocks, *free_blocks = e->n_free;
}

int64_t dsc_infer_held(const dsc_infer *e, int64_t slot) {
  return slot >= 0 && slot < e->slots ? e->held[slot] : 0;
}

/* blocks past the first `keep` of a slot back to the pool */
static void release_from(dsc_infer *e, int64_t slot, int64_t keep) {
  while (e->held[slot] > keep) e->free[e->n_free++] = e->table[slot * e->per_seq + --e->held[slot]];
}

void dsc_infer_release(dsc_infer *e, int64_t slot) {
  if (slot >= 0 && slot < e->slots) release_from(e, slot, 0);
}

/* The pool's size: blocks of o->block positions (default 16, at most the
 * context), o->cache_tokens in all, else a whole context for every slot. */
static dsc_status pool_size(dsc_infer *e, const dsc_infer_options *o) {
  e->block = o->block > 0 ? o->block : 16;
  if (e->block > e->context) e->block = e->context;
  e->per_seq = (e->context + e->block - 1) / e->block;
  e->blocks =
      o->cache_tokens > 0 ? (o->cache_tokens + e->block - 1) / e->block : e->slots * e->per_seq;
  if (e->blocks > (INT32_MAX - 1) / e->block) { /* the graphs index the pool in i32 */
    ir_error(e->ctx, ir_no_loc,
             "a KV cache of %" PRId64 " blocks of %" PRId64 " positions is over 2^31 positions",
             e->blocks, e->block);
    return DSC_ERR_USER;
  }
  return DSC_OK;
}

/* The tables, every block free (the lowest handed out first). */
static dsc_status pool_alloc(dsc_infer *e) {
  e->table = calloc((size_t)(e->slots * e->per_seq), sizeof *e->table);
  e->held = calloc((size_t)e->slots, sizeof *e->held);
  e->free = calloc((size_t)e->blocks, sizeof *e->free);
  if (!e->table || !e->held || !e->free) return oom(e->ctx);
  for (int64_t i = 0; i < e->blocks; i++) e->free[i] = e->blocks - 1 - i;
  e->n_free = e->blocks;
  return DSC_OK;
}

/* The model file a checkpoint was trained from: a .dsx names its source. */
static dsc_status model_source(dsc_context *ctx, const dsc_checkpoint *ck, const char *given,
                               char *out, size_t n) {
  const char *model = given ? given : dsc_checkpoint_extra(ck, "model");
  if (!model) {
    ir_error(ctx, rt_loc(ck->dir), "the checkpoint does not record its model file; give --model");
    return DSC_ERR_USER;
  }
  if (!drv_is_program(model)) {
    snprintf(out, n, "%s", model);
    return DSC_OK;
  }
  /* a .dsx's graphs are fixed at the training batch: its source instead */
  dsc_program *prog = NULL;
  dsc_status st = dsc_program_open(ctx, model, &prog);
  if (st != DSC_OK) return st;
  const char *src = dsc_program_meta(prog, "model");
  snprintf(out, n, "%s", src ? src : "");
  dsc_program_free(prog);
  if (!out[0]) {
    ir_error(ctx, rt_loc(model), "not a valid .dsx file: meta 'model' is missing");
    return DSC_ERR_USER;
  }
  return DSC_OK;
}

/* The forward of `path` at [B, t], checked to be a token model. */
static dsc_status forward_at(dsc_context *ctx, const char *path, int64_t B, int64_t t,
                             dsc_module **m, dsc_graph **fwd) {
  dsc_status st = drv_compile_model(ctx, path, B, t, true, m);
  if (st != DSC_OK) return st;
  *fwd = dsc_module_find_graph(*m, "forward");
  return drv_check_forward(ctx, path, *fwd);
}

/* The checkpoint's weights as params of module m (doubles). */
static dsc_status checkpoint_params(dsc_context *ctx, dsc_checkpoint *ck, const dsc_module *m,
                                    dsc_params **out) {
  int n = dsc_module_param_count(m);
  dsc_params *p = dsc_params_zeros(m);
  dsc_tensor_spec *spec = ir_alloc(ctx, sizeof *spec * (size_t)(n ? n : 1));
  char *path = ir_alloc(ctx, PATH_MAX);
  dsc_status st = p && spec && path ? DSC_OK : oom(ctx);
  for (int i = 0; st == DSC_OK && i < n; i++)
    spec[i] = (dsc_tensor_spec){dsc_module_param_name(m, i), dsc_module_param_type(m, i)};
  if (st == DSC_OK) {
    snprintf(path, PATH_MAX, "%s/model.safetensors", ck->dir);
    st = dsc_tensor_set_check(ctx, path, ck->model, spec, n);
  }
  for (int i = 0; st == DSC_OK && i < n; i++) {
    dsc_tensor *dst = dsc_params_get(p, i);
    const dsc_tensor *src = dsc_tensor_set_find(ck->model, spec[i].name);
    memcpy(dst->data, src->data, sizeof(double) * (size_t)dsc_type_numel(&dst->type));
  }
  if (spec) ir_free(ctx, spec, sizeof *spec * (size_t)(n ? n : 1));
  if (path) ir_free(ctx, path, PATH_MAX);
  if (st != DSC_OK) {
    dsc_params_free(p);
    p = NULL;
  }
  *out = p;
  return st;
}

/* The model has nothing pass kv_cache can cache (no attention, or positions
 * it cannot offset): its reason becomes a warning, and the engine runs the
 * forward over each slot's whole window (graph `forward` made a logits
 * graph, [slots, context]) at every step. *fwd, the failed attempt's
 * module, is freed. */
static dsc_status no_cache(dsc_infer *e, const char *model, dsc_module **fwd) {
  dsc_context *ctx = e->ctx;
  const dsc_diag *d = dsc_diag_get(ctx, dsc_diag_count(ctx) - 1);
  char why[512], file[PATH_MAX];
  dsc_loc loc = d->loc;
  snprintf(why, sizeof why, "%s", d->message);
  snprintf(file, sizeof file, "%s", loc.file ? loc.file : "");
  loc.file = loc.file ? file : NULL; /* the diagnostics own theirs */
  dsc_diag_clear(ctx);
  ir_diag(ctx, DSC_DIAG_WARNING, loc,
          "%s; generating without a KV cache (the whole window each token)",
          strncmp(why, "kv cache: ", 10) == 0 ? why + 10 : why);
  dsc_module_free(e->m);
  e->m = NULL;
  dsc_module_free(*fwd);
  *fwd = NULL;
  e->chunk = e->context;
  e->block = e->context, e->per_seq = 1, e->blocks = e->slots; /* a window per slot */
  dsc_graph *g = NULL;
  dsc_status st = forward_at(ctx, model, e->slots, e->context, &e->m, &g);
  if (st == DSC_OK) st = dsc_make_logits_graph(g);
  if (st == DSC_OK && !(e->window = dsc_tensor_new(ctx, dsc_node_type(dsc_graph_input_at(g, 0)))))
    st = oom(ctx);
  if (st == DSC_OK && !(e->targets = dsc_tensor_new(ctx, dsc_node_type(dsc_graph_input_at(g, 1)))))
    st = oom(ctx);
  return st;
}

static dsc_status infer_inner(dsc_infer *e, const dsc_infer_options *o) {
  dsc_context *ctx = e->ctx;
  dsc_checkpoint *ck = NULL;
  dsc_module *fm[2] = {NULL, NULL};
  dsc_graph *fg[2] = {NULL, NULL};
  dsc_params *params = NULL;
  char model[PATH_MAX];
  dsc_status st = dsc_checkpoint_load(ctx, o->checkpoint, NULL, 0, NULL, 0, &ck);
  if (st == DSC_OK) st = dsc_checkpoint_use_master_weights(ctx, ck, NULL);
  if (st == DSC_OK) st = model_source(ctx, ck, o->model_path, model, sizeof model);
  if (st != DSC_OK) goto done;
  e->slots = o->slots > 0 ? o->slots : 1;
  /* the context: asked, else the position table's rows, else the trained seq */
  int64_t seq = 0;
  const char *s = dsc_checkpoint_extra(ck, "seq");
  if (s) seq = strtoll(s, NULL, 10);
  if ((st = forward_at(ctx, model, 1, seq > 0 ? seq : 0, &fm[0], &fg[0])) != DSC_OK) goto done;
  int64_t table = dsc_model_context(fg[0]);
  if (seq <= 0) seq = dsc_node_type(dsc_graph_input_at(fg[0], 0)).dims[1];
  e->context = o->context > 0 ? o->context : table > 0 ? table : seq;
  if (table > 0 && e->context > table) {
    ir_error(ctx, rt_loc(model),
             "a context of %" PRId64
             " positions is longer than the model's position table (%" PRId64 " rows)",
             e->context, table);
    st = DSC_ERR_USER;
    goto done;
  }
  e->chunk = o->chunk > 0 ? o->chunk : 16;
  if (e->chunk > e->context) e->chunk = e->context;
  if ((st = pool_size(e, o)) != DSC_OK) goto done;
  dsc_module_free(fm[0]);
  fm[0] = NULL;
  /* prefill at [slots, chunk], decode at [slots, 1] (the same when chunk is 1) */
  int graphs = e->chunk > 1 ? 2 : 1;
  if (!(e->m = dsc_module_new(ctx, "infer"))) {
    st = oom(ctx);
    goto done;
  }
  name_graphs(e, graphs);
  int errors = dsc_error_count(ctx);
  /* the full graphs first: a model the cache cannot take fails there */
  for (int b = e->n_buckets - 1; b >= 0 && st == DSC_OK; b--) {
    for (int g = 0; g < graphs && st == DSC_OK; g++) {
      int64_t t = g == 0 ? e->chunk : 1;
      dsc_module_free(fm[g]);
      fm[g] = NULL;
      st = forward_at(ctx, model, e->bucket[b], t, &fm[g], &fg[g]);
      if (st != DSC_OK) fg[g] = NULL; /* the model itself is wrong: no fallback */
      for (int s = e->n_spans - 1; s >= 0 && st == DSC_OK; s--)
        st = pass_kv_cache_graph(e->m, fg[g], e->graph[g][b * e->n_spans + s].name, e->context,
                                 e->span[s], e->blocks * e->block);
      if (st == DSC_ERR_USER && fg[g] && errors == 0 && b == e->n_buckets - 1) {
        graphs = 1;
        st = no_cache(e, model, &fm[g]);
        break;
      }
    }
    if (e->window) break;
  }
  if (st == DSC_OK) st = pool_alloc(e);
  if (st != DSC_OK) goto done;
  dsc_type lt = dsc_node_type(dsc_graph_output_at(dsc_module_graph(e->m, 0), 0));
  e->vocab = lt.dims[lt.rank - 1];
  if ((st = dsc_module_verify(e->m)) != DSC_OK) goto done;
  dsc_exec_options eo = {dsc_backend_default(), 0, NULL};
  if (o->exec) eo = *o->exec;
  if (eo.backend != DSC_BACKEND_INTERP && (st = dsc_run_codegen_passes(e->m)) != DSC_OK) goto done;
  /* the weights by the module they were compiled for: a forward's params */
  const dsc_module *pm = e->window ? e->m : fm[graphs - 1];
  if ((st = checkpoint_params(ctx, ck, pm, &params)) != DSC_OK) goto done;
  dsc_checkpoint_free(ctx, ck);
  ck = NULL;
  if ((st = dsc_exec_new(e->m, &eo, &e->exec)) != DSC_OK) goto done;
  if ((st = dsc_exec_load_params(e->exec, params)) != DSC_OK) goto done;
  if (!(e->row_slot = calloc((size_t)e->slots, sizeof *e->row_slot))) {
    st = oom(ctx);
    goto done;
  }
  for (int g = 0; g < 2 && !e->window; g++)
    for (int k = 0; k < e->n_buckets * e->n_spans; k++) {
      infer_graph *v = &e->graph[g][k];
      const dsc_graph *gr = dsc_module_find_graph(e->m, v->name);
      for (int i = 0; i < 5; i++)
        if (!(v->in[i] = dsc_tensor_new(ctx, dsc_node_type(dsc_graph_input_at(gr, i))))) {
          st = oom(ctx);
          goto done;
        }
    }
done:
  dsc_params_free(params);
  for (int g = 0; g < 2; g++) dsc_module_free(fm[g]);
  dsc_checkpoint_free(ctx, ck);
  return st;
}

dsc_status dsc_infer_open(dsc_context *ctx, const dsc_infer_options *o, dsc_infer **out) {
  *out = NULL;
  dsc_infer *e = ir_alloc(ctx, sizeof *e);
  if (!e) return oom(ctx);
  memset(e, 0, sizeof *e);
  e->ctx = ctx;
  dsc_status st = infer_inner(e, o);
  if (st != DSC_OK) {
    dsc_infer_free(e);
    return st;
  }
  *out = e;
  return DSC_OK;
}

/* Each slot with tokens holds the blocks of its positions up to pos + n
 * (those past it, a sequence restarted or rewound, go back first): all of
 * them or, when the pool has too few free, none. */
static int64_t blocks_of(const dsc_infer *e, int64_t positions) {
  return (positions + e->block - 1) / e->block;
}

static dsc_status take_blocks(dsc_infer *e, const int64_t *n, const int64_t *pos) {
  int64_t want = 0, back = 0;
  for (int64_t b = 0; b < e->slots; b++) {
    if (n[b] == 0) continue;
    int64_t need = blocks_of(e, pos[b] + n[b]);
    if (need > e->held[b])
      want += need - e->held[b];
    else
      back += e->held[b] - need;
  }
  if (want > e->n_free + back) {
    ir_error(e->ctx, ir_no_loc,
             "infer: the KV cache is full: this step needs %" PRId64 " more blocks of %" PRId64
             " positions, %" PRId64 " of %" PRId64 " are free",
             want, e->block, e->n_free + back, e->blocks);
    return DSC_ERR_USER;
  }
  for (int64_t b = 0; b < e->slots; b++)
    if (n[b] > 0) release_from(e, b, blocks_of(e, pos[b] + n[b]));
  for (int64_t b = 0; b < e->slots; b++)
    while (n[b] > 0 && e->held[b] * e->block < pos[b] + n[b])
      e->table[b * e->per_seq + e->held[b]++] = e->free[--e->n_free];
  return DSC_OK;
}

/* A step without a cache: the slots' tokens written into the window at
 * their positions (the later ones zeroed, as a new sequence expects), the
 * forward run over all of it. */
static dsc_status window_step(dsc_infer *e, const int64_t *n, const int64_t *pos,
                              const int64_t *tokens, double *logits) {
  int64_t T = e->context;
  double *w = e->window->data;
  bool pre = false;
  for (int64_t b = 0; b < e->slots; b++) {
    if (n[b] == 0) continue;
    for (int64_t j = 0; j < n[b]; j++) w[b * T + pos[b] + j] = (double)tokens[b * e->chunk + j];
    for (int64_t p = pos[b] + n[b]; p < T; p++) w[b * T + p] = 0;
    pre |= n[b] > 1;
  }
  const dsc_tensor *in[2] = {e->window, e->targets};
  dsc_tensor *out = NULL;
  double t0 = now_s();
  dsc_status st = dsc_exec_run(e->exec, "forward", in, 2, &out);
  e->seconds[pre ? 0 : 1] += now_s() - t0;
  e->runs[pre ? 0 : 1]++;
  if (st != DSC_OK) return st;
  for (int64_t b = 0; b < e->slots; b++)
    if (n[b] > 0)
      memcpy(logits + b * e->vocab, out->data + (b * T + pos[b] + n[b] - 1) * e->vocab,
             sizeof(double) * (size_t)e->vocab);
  dsc_tensor_free(e->ctx, out);
  return DSC_OK;
}

dsc_status dsc_infer_step(dsc_infer *e, const int64_t *n, const int64_t *pos, const int64_t *tokens,
                          double *logits) {
  bool any = false, prefill = false;
  for (int64_t b = 0; b < e->slots; b++) {
    if (n[b] < 0 || n[b] > e->chunk || (n[b] > 0 && (pos[b] < 0 || pos[b] + n[b] > e->context))) {
      ir_error(e->ctx, ir_no_loc,
               "infer: slot %" PRId64 ": %" PRId64 " tokens at position %" PRId64
               " do not fit (at most %" PRId64 " a step, positions below %" PRId64 ")",
               b, n[b], pos[b], e->chunk, e->context);
      return DSC_ERR_USER;
    }
    for (int64_t j = 0; j < n[b]; j++)
      if (tokens[b * e->chunk + j] < 0 || tokens[b * e->chunk + j] >= e->vocab) {
        ir_error(e->ctx, ir_no_loc, "token %" PRId64 " is outside the vocabulary [0, %" PRId64 ")",
                 tokens[b * e->chunk + j], e->vocab);
        return DSC_ERR_USER;
      }
    any |= n[b] > 0;
    prefill |= n[b] > 1;
  }
  if (!any) return DSC_OK;
  dsc_status st = take_blocks(e, n, pos);
  if (st != DSC_OK) return st;
  if (e->window) return window_step(e, n, pos, tokens, logits);
  /* the slots with tokens become the graph's rows, in slot order: the
   * fewest rows that take them, the shortest span that holds them */
  int64_t R = 0, reach = 0;
  for (int64_t b = 0; b < e->slots; b++)
    if (n[b] > 0) {
      e->row_slot[R++] = b;
      if (pos[b] + n[b] > reach) reach = pos[b] + n[b];
    }
  int kb = 0, ks = 0;
  while (e->bucket[kb] < R) kb++;
  while (e->span[ks] < reach) ks++;
  infer_graph *v = &e->graph[prefill ? 0 : 1][kb * e->n_spans + ks];
  dsc_tensor **in = v->in;
  int64_t t = in[0]->type.dims[1], S = v->span;
  /* rows: the pool row of each row's positions (row 0 past what its slot
   * holds: masked); dest: the pool row of each new key (-1: padding, and
   * the rows past R of a bucket larger than the step, write nothing) */
  double *rows = in[3]->data, *dest = in[4]->data;
  for (int64_t r = 0; r < v->rows * t; r++) dest[r] = -1;
  for (int64_t r = 0; r < v->rows; r++) {
    int64_t b = r < R ? e->row_slot[r] : -1, k = b >= 0 ? n[b] : 0;
    for (int64_t j = 0; j < t; j++)
      in[0]->data[r * t + j] = j < k ? (double)tokens[b * e->chunk + j] : 0;
    in[1]->data[r] = k > 0 ? (double)pos[b] : 0;
    in[2]->data[r] = k > 0 ? (double)(k - 1) : 0;
    const int64_t *tb = b >= 0 ? e->table + b * e->per_seq : NULL;
    double *rr = rows + r * S;
    for (int64_t p = 0; p < S; p++) {
      int64_t i = p / e->block;
      rr[p] = tb && i < e->held[b] ? (double)(tb[i] * e->block + p % e->block) : 0;
    }
    for (int64_t j = 0; j < k; j++) dest[r * t + j] = rr[pos[b] + j];
  }
  dsc_tensor *out = NULL;
  double t0 = now_s();
  st = dsc_exec_run(e->exec, v->name, (const dsc_tensor *const *)in, 5, &out);
  int g = prefill ? 0 : 1;
  e->seconds[g] += now_s() - t0;
  e->runs[g]++;
  v->runs++;
  if (st != DSC_OK) return st;
  for (int64_t r = 0; r < R; r++)
    memcpy(logits + e->row_slot[r] * e->vocab, out->data + r * e->vocab,
           sizeof(double) * (size_t)e->vocab);
  dsc_tensor_free(e->ctx, out);
  return DSC_OK;
}

dsc_status dsc_infer_warm_up(dsc_infer *e, int *graphs) {
  *graphs = 0;
  if (e->window) return DSC_OK;
  for (int g = 0; g < 2; g++)
    for (int k = 0; k < e->n_buckets * e->n_spans; k++) {
      infer_graph *v = &e->graph[g][k];
      if (g == 0 && strcmp(v->name, e->graph[1][k].name) == 0) continue; /* chunk 1: decode twice */
      for (int i = 0; i < 5; i++) /* all rows idle: dest -1 writes nothing */
        for (int64_t j = 0; j < dsc_type_numel(&v->in[i]->type); j++)
          v->in[i]->data[j] = i == 4 ? -1 : 0;
      dsc_tensor *out = NULL;
      dsc_status st = dsc_exec_run(e->exec, v->name, (const dsc_tensor *const *)v->in, 5, &out);
      dsc_tensor_free(e->ctx, out);
      if (st != DSC_OK) return st;
      ++*graphs;
    }
  return DSC_OK;
}

/* ---------------------------------------------------------------- sampler */

/* One sequence in slot 0: the window's tokens, those already in the cache
 * (done), and the logits after the last one run. */
struct dsc_sampler {
  dsc_context *ctx;
  dsc_infer *e;
  int64_t *window, n, done;
  int64_t *row; /* one step's tokens: chunk */
  double *logits;
  bool fresh; /* logits belong to the window's last token */
  ir_rng rng;
};

void dsc_sampler_free(dsc_sampler *s) {
  if (!s) return;
  int64_t T = s->e ? dsc_infer_context(s->e) : 0, C = s->e ? dsc_infer_chunk(s->e) : 0;
  int64_t V = s->e ? dsc_infer_vocab(s->e) : 0;
  if (s->window) ir_free(s->ctx, s->window, sizeof(int64_t) * (size_t)T);
  if (s->row) ir_free(s->ctx, s->row, sizeof(int64_t) * (size_t)C);
  if (s->logits) ir_free(s->ctx, s->logits, sizeof(double) * (size_t)V);
  dsc_infer_free(s->e);
  ir_free(s->ctx, s, sizeof *s);
}

int64_t dsc_sampler_context(const dsc_sampler *s) { return dsc_infer_context(s->e); }
int64_t dsc_sampler_vocab(const dsc_sampler *s) { return dsc_infer_vocab(s->e); }
dsc_exec *dsc_sampler_exec(dsc_sampler *s) { return dsc_infer_exec(s->e); }
const char *dsc_sampler_one_token_graph(const dsc_sampler *s) {
  return dsc_infer_one_token_graph(s->e);
}

void dsc_sampler_times(const dsc_sampler *s, double *prefill_s, int64_t *prefills, double *decode_s,
                       int64_t *decodes) {
  dsc_infer_times(s->e, prefill_s, prefills, decode_s, decodes);
}

dsc_status dsc_sampler_open(dsc_context *ctx, const dsc_sampler_options *o, dsc_sampler **out) {
  *out = NULL;
  dsc_sampler *s = ir_alloc(ctx, sizeof *s);
  if (!s) return oom(ctx);
  memset(s, 0, sizeof *s);
  s->ctx = ctx;
  dsc_infer_options io = {o->checkpoint, o->model_path, o->exec, 1, o->chunk, o->context, 0, 0};
  dsc_status st = dsc_infer_open(ctx, &io, &s->e);
  if (st == DSC_OK) {
    s->window = ir_alloc(ctx, sizeof(int64_t) * (size_t)dsc_infer_context(s->e));
    s->row = ir_alloc(ctx, sizeof(int64_t) * (size_t)dsc_infer_chunk(s->e));
    s->logits = ir_alloc(ctx, sizeof(double) * (size_t)dsc_infer_vocab(s->e));
    if (!s->window || !s->row || !s->logits) st = oom(ctx);
  }
  if (st != DSC_OK) {
    dsc_sampler_free(s);
    return st;
  }
  ir_rng_seed(&s->rng, o->seed);
  *out = s;
  return DSC_OK;
}

dsc_status dsc_sampler_push(dsc_sampler *s, int64_t token) {
  int64_t V = dsc_infer_vocab(s->e), T = dsc_infer_context(s->e);
  if (token < 0 || token >= V) {
    ir_error(s->ctx, ir_no_loc, "token %" PRId64 " is outside the vocabulary [0, %" PRId64 ")",
             token, V);
    return DSC_ERR_USER;
  }
  if (s->n == T) { /* full: keep the newer half (room for the new token), run again from 0 */
    int64_t keep = T / 2;
    memmove(s->window, s->window + (T - keep), sizeof(int64_t) * (size_t)keep);
    s->n = keep, s->done = 0;
  }
  s->window[s->n++] = token;
  s->fresh = false;
  return DSC_OK;
}

dsc_status dsc_sampler_next(dsc_sampler *s, const dsc_sampling *how, int64_t *token) {
  if (s->n == 0) {
    ir_error(s->ctx, ir_no_loc, "sampler: the window is empty (push a first token)");
    return DSC_ERR_USER;
  }
  int64_t C = dsc_infer_chunk(s->e);
  while (!s->fresh) { /* the tokens not in the cache yet, a chunk at a time */
    int64_t k = s->n - s->done < C ? s->n - s->done : C;
    memcpy(s->row, s->window + s->done, sizeof(int64_t) * (size_t)k);
    dsc_status st = dsc_infer_step(s->e, &k, &s->done, s->row, s->logits);
    if (st != DSC_OK) return st;
    s->done += k;
    s->fresh = s->done == s->n;
  }
  *token = dsc_sample_logits(s->logits, dsc_infer_vocab(s->e), how, s->rng.s);
  return DSC_OK;
}
