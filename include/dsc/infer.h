/* Inference from a checkpoint with a paged KV cache (driver/infer.c;
 * docs/inference.md).
 *
 * An engine holds `slots` sequences at once, each of up to `context`
 * positions. Their keys and values stay in one pool of blocks of `block`
 * positions, a sequence taking blocks as it grows (a block table per slot,
 * as vLLM and FastGen page theirs), so a step runs only the new tokens: a
 * prompt in chunks of up to `chunk` tokens, then one token per step, and
 * the cache holds what the sequences use. The graphs are compiled once,
 * from the model's forward by pass kv_cache: `prefill` (chunk tokens per
 * row) and `decode` (one); a step with more than one token in any slot
 * runs a `prefill`, the others a `decode`. Each comes for every bucket of
 * rows (the slots and halves of them down to one) and every span (the
 * context and halves of it down to 64 positions): a step runs the slots
 * that have tokens as the rows of the smallest graph that takes them. */
#ifndef DSC_INFER_H
#define DSC_INFER_H

#include <stdbool.h>
#include <stddef.h>

#include "dsc/core.h"
#include "dsc/exec.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dsc_infer dsc_infer;

typedef struct {
  const char *checkpoint;       /* OUT or OUT/step-N */
  const char *model_path;       /* NULL: the one recorded in the checkpoint */
  const dsc_exec_options *exec; /* NULL: the default backend, one thread per core */
  int64_t slots;                /* sequences at once (B); 0: 1 */
  int64_t chunk;                /* prompt tokens per slot and step; 0: 16 (at most context) */
  int64_t context;              /* positions per sequence; 0: the model's position table, else
                                   the checkpoint's training seq (a rope model) */
  int64_t block;                /* positions per cache block; 0: 16 (at most context) */
  int64_t cache_tokens;         /* positions the pool holds (rounded up to blocks); 0: context
                                   for every slot */
} dsc_infer_options;

dsc_status dsc_infer_open(dsc_context *ctx, const dsc_infer_options *o, dsc_infer **out);
/* The executor of the two graphs (for its profile: dsc_exec_set_profiling),
 * and the graph a one-token step runs: "decode", or "forward" (the whole
 * window) for a model without a cache. */
dsc_exec *dsc_infer_exec(dsc_infer *e);
const char *dsc_infer_one_token_graph(const dsc_infer *e);
void dsc_infer_free(dsc_infer *e);
int64_t dsc_infer_vocab(const dsc_infer *e);
int64_t dsc_infer_context(const dsc_infer *e);
int64_t dsc_infer_slots(const dsc_infer *e);
int64_t dsc_infer_chunk(const dsc_infer *e);

/* The pool: positions per block, blocks in all, and those free. Without a
 * cache (the whole window each step) a block is a slot's window. */
void dsc_infer_cache(const dsc_infer *e, int64_t *block, int64_t *blocks, int64_t *free_blocks);
int64_t dsc_infer_held(const dsc_infer *e, int64_t slot); /* blocks slot holds */
/* Slot's blocks back to the pool (its sequence ended). */
void dsc_infer_release(dsc_infer *e, int64_t slot);

/* One step. For each slot b, n[b] tokens (0 .. chunk) at tokens[b * chunk
 * ...] go in at positions pos[b] .. pos[b] + n[b] - 1 (pos[b] + n[b] <=
 * context); the cache of slot b keeps positions below pos[b] from earlier
 * steps and is overwritten from pos[b] on. Row b of logits (slots x vocab)
 * is the distribution after slot b's last token, where n[b] > 0; a slot
 * with n[b] = 0 is left as it is. A position at 0 starts a new sequence in
 * its slot. Slot b then holds the blocks of positions 0 .. pos[b] + n[b] - 1
 * (those past them go back to the pool); when the pool has too few free
 * blocks the step fails (DSC_ERR_USER) and nothing changes. */
dsc_status dsc_infer_step(dsc_infer *e, const int64_t *n, const int64_t *pos, const int64_t *tokens,
                          double *logits);

/* How a token is drawn from a row of logits, as transformers' generate
 * filters them: temperature 0 (or top_k 1) is greedy, the first maximum;
 * else softmax(logits / temperature) over the top_k largest (top_k <= 0:
 * all; ties at the k-th taken in index order), then over the fewest most
 * likely of those whose probabilities reach top_p (top_p >= 1 or <= 0: all). */
typedef struct {
  double temperature;
  int64_t top_k;
  double top_p;
} dsc_sampling;

/* Draws a token from logits[0..V) (the candidates walked in index order
 * against one uniform draw). rng: four words of xoshiro256** state, advanced
 * by one draw unless greedy. */
int64_t dsc_sample_logits(const double *logits, int64_t V, const dsc_sampling *how,
                          uint64_t rng[4]);

/* Runs every graph once with no sequence in it (nothing is written to the
 * cache), so that what a graph's first run costs (the GEMM library's
 * kernels for its shapes, first touches of its memory) is paid before the
 * first request. *graphs: how many ran. Not counted in dsc_infer_times. */
dsc_status dsc_infer_warm_up(dsc_infer *e, int *graphs);

/* Seconds spent in each graph's runs and the runs, since open. */
void dsc_infer_times(const dsc_infer *e, double *prefill_s, int64_t *prefills, double *decode_s,
                     int64_t *decodes);

/* ---- continuous batching (driver/batcher.c) ----
 * Requests queue for the engine's slots. Each step gives the running
 * sequences the cache blocks their next tokens need, oldest first; when
 * the pool runs short, the youngest running sequence goes back to the
 * queue, its blocks freed, and later feeds its prompt and the tokens it had
 * drawn again (vLLM's preemption by recomputation). Then it admits queued
 * requests into free slots, oldest first, while the blocks of their first
 * chunk are free, runs every slot's next tokens in one engine step (a
 * prompt chunk, or the token drawn last), draws each sequence's next token
 * with its own settings and generator, and frees the slot and blocks of a
 * sequence that ends. A request's tokens are the same whatever runs beside
 * it. Not thread-safe. */
typedef struct dsc_batcher dsc_batcher;

typedef struct {
  dsc_sampling how;
  uint64_t seed;      /* of the request's own generator */
  int64_t max_tokens; /* >= 1; prompt + max_tokens <= the context */
} dsc_request_options;

typedef enum {
  DSC_FINISH_NONE,      /* queued or running */
  DSC_FINISH_LENGTH,    /* max_tokens generated */
  DSC_FINISH_STOP,      /* a stop token was drawn (not kept) */
  DSC_FINISH_CANCELLED, /* dsc_batcher_cancel */
} dsc_finish;

typedef struct {
  int64_t slots, positions;    /* the cache: sequences and positions in all */
  int64_t block, blocks;       /* the pool: positions per block, blocks in all */
  int64_t queued, running;     /* requests now */
  int64_t positions_used;      /* cache positions the running sequences have written */
  int64_t blocks_used;         /* blocks they hold */
  int64_t preempted;           /* sequences sent back to the queue to free blocks, since open */
  int64_t submitted, finished; /* requests since open */
  int64_t prompt_tokens, generated_tokens, steps;
} dsc_batcher_stats;

/* e stays the caller's and must outlive the batcher. */
dsc_status dsc_batcher_new(dsc_context *ctx, dsc_infer *e, dsc_batcher **out);
void dsc_batcher_free(dsc_batcher *b);
/* Drawing `token` ends a sequence (finish STOP), e.g. a tokenizer's end of text. */
void dsc_batcher_set_stop(dsc_batcher *b, int64_t token, bool stops);
/* Queues a request: *id names it from now on. A request that cannot run
 * (empty prompt, a token outside the vocabulary, prompt + max_tokens over
 * the context or over what the whole cache holds) is refused with
 * DSC_ERR_USER and the reason in why. */
dsc_status dsc_batcher_submit(dsc_batcher *b, const int64_t *prompt, int64_t n,
                              const dsc_request_options *o, int64_t *id, char *why, size_t why_len);
/* Ends a request now (finish CANCELLED); its slot is free for the next step. */
void dsc_batcher_cancel(dsc_batcher *b, int64_t id);
/* Forgets a request (cancelling it if it still runs). */
void dsc_batcher_release(dsc_batcher *b, int64_t id);
/* The tokens generated so far (valid until the next step or release) and
 * how the request ended; an unknown id: NULL, 0 tokens, CANCELLED. */
const int64_t *dsc_batcher_output(const dsc_batcher *b, int64_t id, int64_t *n,
                                  dsc_finish *finished);
/* Seconds from submission to the first token drawn; -1 before it. */
double dsc_batcher_first_token_s(const dsc_batcher *b, int64_t id);
bool dsc_batcher_idle(const dsc_batcher *b); /* nothing queued or running */
void dsc_batcher_get_stats(const dsc_batcher *b, dsc_batcher_stats *s);
/* One engine step over every running sequence (admitting first). An engine
 * failure is returned; the requests stay as they were. */
dsc_status dsc_batcher_step(dsc_batcher *b);
/* The step in three parts, for a server that lets its connections in while
 * the engine runs: begin (admits and takes the step's tokens; false: nothing
 * to run) and end (draws the next tokens) under the caller's lock, run
 * without it. During run, only submit, cancel, release, output, first_token_s,
 * idle and get_stats may be called; a request cancelled meanwhile is
 * skipped at end. */
bool dsc_batcher_step_begin(dsc_batcher *b);
dsc_status dsc_batcher_step_run(dsc_batcher *b);
void dsc_batcher_step_end(dsc_batcher *b);

#ifdef __cplusplus
}
#endif
#endif
