/* Inference from a checkpoint with a KV cache (driver/infer.c;
 * docs/inference.md).
 *
 * An engine holds `slots` sequences at once. Each sequence's keys and
 * values stay in a cache of `context` positions per slot, so a step runs
 * only the new tokens: a prompt in chunks of up to `chunk` tokens, then one
 * token per step. Two graphs are compiled once, from the model's forward
 * by pass kv_cache: `prefill` (chunk tokens per slot) and `decode` (one);
 * a step with more than one token in any slot runs `prefill`, the others
 * `decode`. */
#ifndef DSC_INFER_H
#define DSC_INFER_H

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
} dsc_infer_options;

dsc_status dsc_infer_open(dsc_context *ctx, const dsc_infer_options *o, dsc_infer **out);
void dsc_infer_free(dsc_infer *e);
int64_t dsc_infer_vocab(const dsc_infer *e);
int64_t dsc_infer_context(const dsc_infer *e);
int64_t dsc_infer_slots(const dsc_infer *e);
int64_t dsc_infer_chunk(const dsc_infer *e);

/* One step. For each slot b, n[b] tokens (0 .. chunk) at tokens[b * chunk
 * ...] go in at positions pos[b] .. pos[b] + n[b] - 1 (pos[b] + n[b] <=
 * context); the cache of slot b keeps positions below pos[b] from earlier
 * steps and is overwritten from pos[b] on. Row b of logits (slots x vocab)
 * is the distribution after slot b's last token, where n[b] > 0; a slot
 * with n[b] = 0 is left as it is. A position at 0 starts a new sequence in
 * its slot. */
dsc_status dsc_infer_step(dsc_infer *e, const int64_t *n, const int64_t *pos, const int64_t *tokens,
                          double *logits);

/* Seconds spent in each graph's runs and the runs, since open. */
void dsc_infer_times(const dsc_infer *e, double *prefill_s, int64_t *prefills, double *decode_s,
                     int64_t *decodes);

#ifdef __cplusplus
}
#endif
#endif
