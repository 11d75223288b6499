/* Continuous batching over the KV-cache engine (include/dsc/infer.h), as
 * DeepSpeed-FastGen's Dynamic SplitFuse schedules: every step admits queued
 * requests into free slots, feeds each prompt a chunk at a time in the same
 * step as the running sequences' single tokens, draws each sequence's next
 * token with its own sampling settings and generator, and frees a slot and
 * its cache blocks the moment its sequence ends. When the blocks run short
 * the youngest sequence is preempted: back to the queue, to feed its prompt
 * and drawn tokens again when it returns. Not thread-safe: the server
 * serializes calls. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "driver/driver.h"
#include "dsc/infer.h"

typedef struct {
  int64_t id;
  int64_t *prompt, n_prompt;
  int64_t *out, n_out; /* generated so far (a stop token is not kept) */
  int64_t fed;         /* of the prompt, then the tokens drawn: those in the cache */
  int64_t slot;        /* -1: queued or finished */
  bool preempted;      /* in this step: not admitted again before the next */
  dsc_request_options o;
  ir_rng rng;
  dsc_finish finish;
  double t_submit, t_first, t_done; /* CLOCK_MONOTONIC seconds; 0: not yet */
} request;

struct dsc_batcher {
  dsc_context *ctx;
  dsc_infer *e;
  int64_t slots, chunk, context, vocab;
  int64_t block, blocks; /* the engine's pool */
  request **req; /* every request not released, in submission order */
  int64_t n_req, cap_req, next_id;
  request **slot;            /* [slots]: the request in each slot, or NULL */
  bool *release;             /* [slots]: blocks to free after the engine's run */
  bool in_run;               /* between step_begin and step_end */
  bool *stop;                /* [vocab]: ids that end a sequence */
  int64_t *n, *pos, *tokens; /* one step's inputs: [slots], [slots], [slots * chunk] */
  double *logits;            /* [slots * vocab] */
  dsc_batcher_stats st;
};

static double now_s(void) { return (double)dsc_trace_now_ns() * 1e-9; }

static void request_free(request *r) {
  if (!r) return;
  free(r->prompt);
  free(r->out);
  free(r);
}

void dsc_batcher_free(dsc_batcher *b) {
  if (!b) return;
  for (int64_t i = 0; i < b->n_req; i++) request_free(b->req[i]);
  free(b->req);
  free(b->slot);
  free(b->release);
  free(b->stop);
  free(b->n);
  free(b->pos);
  free(b->tokens);
  free(b->logits);
  free(b);
}

dsc_status dsc_batcher_new(dsc_context *ctx, dsc_infer *e, dsc_batcher **out) {
  *out = NULL;
  dsc_batcher *b = calloc(1, sizeof *b);
  if (!b) goto oom;
  b->ctx = ctx, b->e = e;
  b->slots = dsc_infer_slots(e), b->chunk = dsc_infer_chunk(e);
  b->context = dsc_infer_context(e), b->vocab = dsc_infer_vocab(e);
  int64_t free_blocks;
  dsc_infer_cache(e, &b->block, &b->blocks, &free_blocks);
  b->slot = calloc((size_t)b->slots, sizeof *b->slot);
  b->release = calloc((size_t)b->slots, sizeof *b->release);
  b->stop = calloc((size_t)b->vocab, sizeof *b->stop);
  b->n = calloc((size_t)b->slots, sizeof *b->n);
  b->pos = calloc((size_t)b->slots, sizeof *b->pos);
  b->tokens = calloc((size_t)(b->slots * b->chunk), sizeof *b->tokens);
  b->logits = calloc((size_t)(b->slots * b->vocab), sizeof *b->logits);
  if (!b->slot || !b->release || !b->stop || !b->n || !b->pos || !b->tokens || !b->logits) goto oom;
  b->next_id = 1;
  b->st.slots = b->slots;
  b->st.positions = b->blocks * b->block;
  b->st.block = b->block, b->st.blocks = b->blocks;
  *out = b;
  return DSC_OK;
oom:
  dsc_batcher_free(b);
  ir_error(ctx, ir_no_loc, "out of memory");
  return DSC_ERR_INTERNAL;
}

void dsc_batcher_set_stop(dsc_batcher *b, int64_t token, bool stops) {
  if (token >= 0 && token < b->vocab) b->stop[token] = stops;
}

static request *find(const dsc_batcher *b, int64_t id) {
  for (int64_t i = 0; i < b->n_req; i++)
    if (b->req[i]->id == id) return b->req[i];
  return NULL;
}

/* Request r out of its slot, the slot's blocks freed (after the engine's
 * run when it runs: it reads the block tables). */
static void vacate(dsc_batcher *b, request *r) {
  if (r->slot < 0) return;
  b->slot[r->slot] = NULL;
  if (b->in_run)
    b->release[r->slot] = true;
  else
    dsc_infer_release(b->e, r->slot);
  r->slot = -1;
}

static void finish(dsc_batcher *b, request *r, dsc_finish why) {
  if (r->finish != DSC_FINISH_NONE) return;
  r->finish = why;
  r->t_done = now_s();
  vacate(b, r);
  b->st.finished++;
}

static int64_t blocks_for(const dsc_batcher *b, int64_t positions) {
  return (positions + b->block - 1) / b->block;
}

/* Token i of r's sequence: its prompt, then the tokens drawn. */
static int64_t seq_token(const request *r, int64_t i) {
  return i < r->n_prompt ? r->prompt[i] : r->out[i - r->n_prompt];
}

/* Tokens r feeds in its next step: the rest of its prompt (and, after a
 * preemption, of the tokens it had drawn) a chunk at a time, else the
 * token drawn last. */
static int64_t next_tokens(const dsc_batcher *b, const request *r) {
  int64_t left = r->n_prompt + r->n_out - r->fed;
  return left < b->chunk ? left : b->chunk;
}

/* More blocks r's next step takes than it holds. */
static int64_t blocks_wanted(const dsc_batcher *b, const request *r) {
  int64_t need = blocks_for(b, r->fed + next_tokens(b, r));
  int64_t held = r->slot >= 0 ? dsc_infer_held(b->e, r->slot) : 0;
  return need > held ? need - held : 0;
}

dsc_status dsc_batcher_submit(dsc_batcher *b, const int64_t *prompt, int64_t n,
                              const dsc_request_options *o, int64_t *id, char *why,
                              size_t why_len) {
  *id = 0;
  if (n < 1) {
    snprintf(why, why_len, "the prompt is empty");
    return DSC_ERR_USER;
  }
  if (o->max_tokens < 1) {
    snprintf(why, why_len, "max_tokens must be at least 1 (got %" PRId64 ")", o->max_tokens);
    return DSC_ERR_USER;
  }
  if (n > b->context - o->max_tokens) {
    snprintf(why, why_len,
             "this model's context is %" PRId64 " tokens, but %" PRId64 " were asked for (%" PRId64
             " in the prompt, %" PRId64 " to generate)",
             b->context, n + o->max_tokens, n, o->max_tokens);
    return DSC_ERR_USER;
  }
  /* the last token drawn is never fed */
  if (blocks_for(b, n + o->max_tokens - 1) > b->blocks) {
    snprintf(why, why_len,
             "the KV cache holds %" PRId64 " positions (%" PRId64 " blocks of %" PRId64
             "), but this request needs %" PRId64 " (%" PRId64 " in the prompt, %" PRId64
             " to generate)",
             b->blocks * b->block, b->blocks, b->block, n + o->max_tokens - 1, n, o->max_tokens);
    return DSC_ERR_USER;
  }
  for (int64_t i = 0; i < n; i++)
    if (prompt[i] < 0 || prompt[i] >= b->vocab) {
      snprintf(why, why_len,
               "prompt token %" PRId64 " (at %" PRId64 ") is outside the vocabulary [0, %" PRId64
               ")",
               prompt[i], i, b->vocab);
      return DSC_ERR_USER;
    }
  request *r = calloc(1, sizeof *r);
  if (r) {
    r->prompt = malloc(sizeof(int64_t) * (size_t)n);
    r->out = malloc(sizeof(int64_t) * (size_t)o->max_tokens);
  }
  if (b->n_req == b->cap_req && r) {
    int64_t cap = b->cap_req ? 2 * b->cap_req : 16;
    request **grown = realloc(b->req, sizeof *grown * (size_t)cap);
    if (grown) b->req = grown, b->cap_req = cap;
  }
  if (!r || !r->prompt || !r->out || b->n_req == b->cap_req) {
    request_free(r);
    snprintf(why, why_len, "out of memory");
    return DSC_ERR_INTERNAL;
  }
  memcpy(r->prompt, prompt, sizeof(int64_t) * (size_t)n);
  r->n_prompt = n;
  r->o = *o;
  r->slot = -1;
  r->id = b->next_id++;
  r->t_submit = now_s();
  ir_rng_seed(&r->rng, o->seed);
  b->req[b->n_req++] = r;
  b->st.submitted++;
  b->st.prompt_tokens += n;
  *id = r->id;
  return DSC_OK;
}

void dsc_batcher_cancel(dsc_batcher *b, int64_t id) {
  request *r = find(b, id);
  if (r) finish(b, r, DSC_FINISH_CANCELLED);
}

void dsc_batcher_release(dsc_batcher *b, int64_t id) {
  for (int64_t i = 0; i < b->n_req; i++)
    if (b->req[i]->id == id) {
      finish(b, b->req[i], DSC_FINISH_CANCELLED);
      request_free(b->req[i]);
      memmove(b->req + i, b->req + i + 1, sizeof *b->req * (size_t)(b->n_req - i - 1));
      b->n_req--;
      return;
    }
}

const int64_t *dsc_batcher_output(const dsc_batcher *b, int64_t id, int64_t *n,
                                  dsc_finish *finished) {
  const request *r = find(b, id);
  *n = r ? r->n_out : 0;
  *finished = r ? r->finish : DSC_FINISH_CANCELLED;
  return r ? r->out : NULL;
}

double dsc_batcher_first_token_s(const dsc_batcher *b, int64_t id) {
  const request *r = find(b, id);
  return r && r->t_first > 0 ? r->t_first - r->t_submit : -1;
}

void dsc_batcher_get_stats(const dsc_batcher *b, dsc_batcher_stats *s) {
  *s = b->st;
  s->queued = s->running = s->positions_used = s->blocks_used = 0;
  for (int64_t i = 0; i < b->n_req; i++) {
    const request *r = b->req[i];
    if (r->finish != DSC_FINISH_NONE) continue;
    if (r->slot < 0) {
      s->queued++;
    } else {
      s->running++;
      s->positions_used += r->fed;
      s->blocks_used += dsc_infer_held(b->e, r->slot);
    }
  }
}

bool dsc_batcher_idle(const dsc_batcher *b) {
  for (int64_t i = 0; i < b->n_req; i++)
    if (b->req[i]->finish == DSC_FINISH_NONE) return false;
  return true;
}

/* The running requests' blocks for this step, oldest first: while they
 * want more than are free, the youngest goes back to the queue. Returns
 * the blocks left free. */
static int64_t make_room(dsc_batcher *b) {
  int64_t block, blocks, free_blocks, want = 0;
  dsc_infer_cache(b->e, &block, &blocks, &free_blocks);
  for (int64_t i = 0; i < b->n_req; i++)
    if (b->req[i]->slot >= 0) want += blocks_wanted(b, b->req[i]);
  for (int64_t i = b->n_req - 1; i >= 0 && want > free_blocks; i--) {
    request *r = b->req[i];
    if (r->slot < 0) continue;
    want -= blocks_wanted(b, r);
    free_blocks += dsc_infer_held(b->e, r->slot);
    vacate(b, r);
    r->fed = 0, r->preempted = true;
    b->st.preempted++;
  }
  return free_blocks - want;
}

/* Queued requests, oldest first, into the free slots while the blocks of
 * their first step are free. */
static void admit(dsc_batcher *b, int64_t free_blocks) {
  int64_t s = 0;
  for (int64_t i = 0; i < b->n_req; i++) {
    request *r = b->req[i];
    if (r->finish != DSC_FINISH_NONE || r->slot >= 0) continue;
    while (s < b->slots && b->slot[s]) s++;
    int64_t want = blocks_wanted(b, r);
    if (s == b->slots || r->preempted || want > free_blocks) return;
    free_blocks -= want;
    r->slot = s;
    b->slot[s] = r;
  }
}

bool dsc_batcher_step_begin(dsc_batcher *b) {
  for (int64_t s = 0; s < b->slots; s++)
    if (b->release[s]) dsc_infer_release(b->e, s), b->release[s] = false;
  for (int64_t i = 0; i < b->n_req; i++) b->req[i]->preempted = false;
  admit(b, make_room(b));
  bool any = false;
  for (int64_t s = 0; s < b->slots; s++) {
    request *r = b->slot[s];
    b->n[s] = 0;
    if (!r) continue;
    int64_t k = next_tokens(b, r);
    for (int64_t j = 0; j < k; j++) b->tokens[s * b->chunk + j] = seq_token(r, r->fed + j);
    b->n[s] = k, b->pos[s] = r->fed;
    any = true;
  }
  b->in_run = any;
  return any;
}

/* Reads only the step's own inputs: requests may come and go meanwhile. */
dsc_status dsc_batcher_step_run(dsc_batcher *b) {
  return dsc_infer_step(b->e, b->n, b->pos, b->tokens, b->logits);
}

void dsc_batcher_step_end(dsc_batcher *b) {
  b->in_run = false;
  b->st.steps++;
  double t = now_s();
  for (int64_t s = 0; s < b->slots; s++) {
    request *r = b->slot[s]; /* NULL when it was cancelled during the run */
    if (!r || b->n[s] == 0) continue;
    r->fed += b->n[s];
    if (r->fed < r->n_prompt + r->n_out) continue; /* more to feed before drawing */
    int64_t tok = dsc_sample_logits(b->logits + s * b->vocab, b->vocab, &r->o.how, r->rng.s);
    if (r->t_first == 0) r->t_first = t;
    if (b->stop[tok]) {
      finish(b, r, DSC_FINISH_STOP);
      continue;
    }
    r->out[r->n_out++] = tok;
    b->st.generated_tokens++;
    if (r->n_out == r->o.max_tokens) finish(b, r, DSC_FINISH_LENGTH);
  }
}

dsc_status dsc_batcher_step(dsc_batcher *b) {
  if (!dsc_batcher_step_begin(b)) return DSC_OK;
  dsc_status st = dsc_batcher_step_run(b);
  if (st == DSC_OK)
    dsc_batcher_step_end(b);
  else
    b->in_run = false;
  return st;
}
