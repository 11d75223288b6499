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

struct dsc_infer {
  dsc_context *ctx;
  dsc_module *m; /* params, the caches, graphs prefill and decode */
  dsc_exec *exec;
  int64_t slots, chunk, context, vocab;
  /* the graph of a step with prompt chunks (0) and of one with single
   * tokens (1): prefill and decode, or decode twice when chunk is 1 */
  const char *graph[2];
  dsc_tensor *in[2][3]; /* per graph: tokens, pos, last */
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
    for (int i = 0; i < 3; i++) dsc_tensor_free(e->ctx, e->in[g][i]);
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
  return e->window ? "forward" : e->graph[1];
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
  dsc_module_free(fm[0]);
  fm[0] = NULL;
  /* prefill at [slots, chunk], decode at [slots, 1] (the same when chunk is 1) */
  int graphs = e->chunk > 1 ? 2 : 1;
  if (!(e->m = dsc_module_new(ctx, "infer"))) {
    st = oom(ctx);
    goto done;
  }
  static const char *const names[2] = {"prefill", "decode"};
  int errors = dsc_error_count(ctx);
  for (int g = 0; g < graphs && st == DSC_OK; g++) {
    int64_t t = g == 0 ? e->chunk : 1;
    st = forward_at(ctx, model, e->slots, t, &fm[g], &fg[g]);
    if (st == DSC_OK)
      st = pass_kv_cache_graph(e->m, fg[g], graphs == 2 ? names[g] : "decode", e->context);
    else
      fg[g] = NULL; /* the model itself is wrong: no fallback */
    if (st == DSC_ERR_USER && fg[g] && errors == 0) {
      graphs = 1;
      st = no_cache(e, model, &fm[g]);
      break;
    }
  }
  if (st != DSC_OK) goto done;
  e->graph[0] = graphs == 2 ? names[0] : names[1], e->graph[1] = names[1];
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
  for (int g = 0; g < 2 && !e->window; g++) {
    const dsc_graph *gr = dsc_module_find_graph(e->m, e->graph[g]);
    for (int i = 0; i < 3; i++)
      if (!(e->in[g][i] = dsc_tensor_new(ctx, dsc_node_type(dsc_graph_input_at(gr, i))))) {
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
  if (e->window) return window_step(e, n, pos, tokens, logits);
  int g = prefill ? 0 : 1;
  dsc_tensor **in = e->in[g];
  int64_t t = in[0]->type.dims[1];
  for (int64_t b = 0; b < e->slots; b++) {
    for (int64_t j = 0; j < t; j++)
      in[0]->data[b * t + j] = j < n[b] ? (double)tokens[b * e->chunk + j] : 0;
    /* a slot without tokens writes nothing: its row lands past the cache */
    in[1]->data[b] = n[b] > 0 ? (double)pos[b] : (double)e->context;
    in[2]->data[b] = n[b] > 0 ? (double)(n[b] - 1) : 0;
  }
  dsc_tensor *out = NULL;
  double t0 = now_s();
  dsc_status st = dsc_exec_run(e->exec, e->graph[g], (const dsc_tensor *const *)in, 3, &out);
  e->seconds[g] += now_s() - t0;
  e->runs[g]++;
  if (st != DSC_OK) return st;
  for (int64_t b = 0; b < e->slots; b++)
    if (n[b] > 0)
      memcpy(logits + b * e->vocab, out->data + b * e->vocab, sizeof(double) * (size_t)e->vocab);
  dsc_tensor_free(e->ctx, out);
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
  dsc_infer_options io = {o->checkpoint, o->model_path, o->exec, 1, o->chunk, o->context};
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
