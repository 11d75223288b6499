/* dsc public API: the runtime's files.
 *
 * - Token shards in llm.c's format and a reproducible batch loader over one.
 * - safetensors files (the format of the Python `safetensors` package).
 * - Checkpoint directories: OUT/step-000123/{model,optimizer}.safetensors +
 *   state.json, with OUT/latest a symlink to the newest.
 *
 * Every writer is atomic (temporary file in the same directory, fsync,
 * rename): a failed write leaves what was there before untouched. Readers
 * validate everything and report "path: error: message" diagnostics on the
 * context; nothing here prints or exits. */
#ifndef DSC_RUNTIME_H
#define DSC_RUNTIME_H

#include "dsc/core.h"
#include "dsc/interp.h"
#include "dsc/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  const char *key, *value;
} dsc_kv;

/* ---- token shards (llm.c): 256 int32 little-endian header (magic, version,
 * token count, zeros), then `count` token ids, little-endian: uint16 in
 * llm.c's GPT-2 format (magic 20240520, version 1), uint32 in its Llama 3
 * format (magic 20240801, version 7) for vocabularies over 65,536. ---- */
#define DSC_SHARD_MAGIC 20240520
#define DSC_SHARD_VERSION 1
#define DSC_SHARD32_MAGIC 20240801
#define DSC_SHARD32_VERSION 7
#define DSC_SHARD_HEADER_INTS 256

dsc_status dsc_shard_write(dsc_context *ctx, const char *path, const uint16_t *tokens,
                           int64_t n_tokens);
/* The 32-bit format (whatever the ids; dsc data picks it for vocabularies
 * over 65,536). */
dsc_status dsc_shard_write32(dsc_context *ctx, const char *path, const uint32_t *tokens,
                             int64_t n_tokens);
/* Reads and validates a shard of either format. vocab_size > 0 rejects ids
 * >= vocab_size. *tokens is allocated with the context's allocator: free
 * with dsc_shard_free. */
dsc_status dsc_shard_read(dsc_context *ctx, const char *path, int64_t vocab_size, uint32_t **tokens,
                          int64_t *n_tokens);
void dsc_shard_free(dsc_context *ctx, uint32_t *tokens, int64_t n_tokens);

/* Copies a regular file of at most 64 MiB (a tokenizer, a config) to dst,
 * atomically. */
dsc_status dsc_file_copy(dsc_context *ctx, const char *src, const char *dst);

/* ---- tokenizers (Hugging Face tokenizer.json, BPE models) ----
 * Byte-level BPE (GPT-2, Llama 3, Qwen) and BPE with byte fallback (Llama 2,
 * Mistral), computing what the `tokenizers` library computes; what a file
 * uses and dsc does not support is refused at load (docs/models.md). Not
 * thread-safe: one tokenizer per thread. */
typedef struct dsc_tokenizer dsc_tokenizer;
dsc_status dsc_tokenizer_load(dsc_context *ctx, const char *path, dsc_tokenizer **out);
void dsc_tokenizer_free(dsc_tokenizer *t);
/* 1 + the largest id (vocabulary and added tokens). */
int64_t dsc_tokenizer_vocab_size(const dsc_tokenizer *t);
/* The token string of an id (the model's alphabet: Ġ for a space in a
 * byte-level vocabulary), NULL for an id without one. */
const char *dsc_tokenizer_token(const dsc_tokenizer *t, int64_t id);
/* An added token marked special (an end of text, a template's markers). */
bool dsc_tokenizer_is_special(const dsc_tokenizer *t, int64_t id);
/* text (UTF-8, else an error naming the byte) -> ids, as the library's
 * encode(text, add_special_tokens=add_special). *ids: free() it. */
dsc_status dsc_tokenizer_encode(dsc_tokenizer *t, const char *text, size_t len, bool add_special,
                                uint32_t **ids, int64_t *n_ids);
/* ids -> text, as the library's decode(ids, skip_special_tokens=skip_special).
 * *text is NUL-terminated: free() it. */
dsc_status dsc_tokenizer_decode(dsc_tokenizer *t, const uint32_t *ids, int64_t n, bool skip_special,
                                char **text, size_t *len);

/* ---- chat templates (tokenizer_config.json's chat_template) ----
 * The Jinja subset Hugging Face's templates use (runtime/chat_template.c
 * lists it), rendered as transformers' apply_chat_template(messages,
 * add_generation_prompt, tokenize=False) renders it: jinja2 with
 * trim_blocks and lstrip_blocks, raise_exception, bos_token and eos_token.
 * Parsing happens at load: a construct outside the subset is an error then
 * (DSC_ERR_USER naming the line), not at the first request. */
typedef struct dsc_chat_template dsc_chat_template;
/* path: a tokenizer_config.json (its chat_template: a string, or a list
 * whose "default" entry is used; bos_token, eos_token), or a file that is
 * the template itself. */
dsc_status dsc_chat_template_load(dsc_context *ctx, const char *path, dsc_chat_template **out);
dsc_status dsc_chat_template_parse(dsc_context *ctx, const char *source, const char *bos,
                                   const char *eos, dsc_chat_template **out);
/* messages_json: a JSON list of message objects. *out: NUL-terminated,
 * free() it. A raise_exception or an error of the template is DSC_ERR_USER
 * with its message ("chat template: Conversation roles must alternate ..."). */
dsc_status dsc_chat_template_render(const dsc_chat_template *t, const char *messages_json,
                                    bool add_generation_prompt, char **out, size_t *len);
void dsc_chat_template_free(dsc_chat_template *t);

/* ---- batch loader over one shard ----
 * Windows start at multiples of T (non-overlapping); a window s gives
 * inputs tokens[s, s+T) and targets tokens[s+1, s+T+1), so a shard has
 * (n_tokens - 1) / T windows and must hold at least T + 1 tokens.
 * Shuffle mode: epoch e visits the windows in a permutation drawn from
 * (seed, e) alone. Sequential mode: windows in file order every epoch (for
 * validation: seek to {0, 0} and draw N batches). A batch is the next B
 * windows of the stream; a batch may run across an epoch boundary. */
typedef struct dsc_loader dsc_loader;
typedef enum { DSC_LOADER_SHUFFLE, DSC_LOADER_SEQUENTIAL } dsc_loader_mode;
typedef struct {
  int64_t batch, seq; /* B, T */
  int64_t vocab_size; /* > 0: ids >= vocab_size are rejected at open */
  uint64_t seed;
  dsc_loader_mode mode;
} dsc_loader_options;
/* Where the loader stands: the next window is entry `index` of epoch `epoch`.
 * Save it with a checkpoint; seeking to it reproduces the same next batches. */
typedef struct {
  int64_t epoch, index;
} dsc_loader_pos;

dsc_status dsc_loader_open(dsc_context *ctx, const char *path, const dsc_loader_options *opts,
                           dsc_loader **out);
void dsc_loader_free(dsc_loader *l);
int64_t dsc_loader_windows(const dsc_loader *l); /* windows per epoch */
int64_t dsc_loader_tokens(const dsc_loader *l);  /* tokens in the shard */
/* Fills B*T ids each (row-major [B, T]) and advances. */
dsc_status dsc_loader_next(dsc_loader *l, int32_t *inputs, int32_t *targets);
/* Same into two i32[B, T] tensors. */
dsc_status dsc_loader_next_tensors(dsc_loader *l, dsc_tensor *inputs, dsc_tensor *targets);
dsc_loader_pos dsc_loader_tell(const dsc_loader *l);
/* Rejects (DSC_ERR_USER) a position with epoch < 0 or index outside [0, windows). */
dsc_status dsc_loader_seek(dsc_loader *l, dsc_loader_pos pos);

/* ---- named tensor sets and safetensors files ----
 * A set you build yourself points at your own arrays; a set returned by a
 * reader is owned by the library and freed with dsc_tensor_set_free. */
typedef struct {
  int n;
  const char **names;
  dsc_tensor **tensors;
  int n_meta; /* the file's "__metadata__" (string -> string) */
  dsc_kv *meta;
} dsc_tensor_set;

typedef struct {
  const char *name;
  dsc_type type;
} dsc_tensor_spec;

dsc_tensor *dsc_tensor_set_find(const dsc_tensor_set *s, const char *name);
const char *dsc_tensor_set_meta(const dsc_tensor_set *s, const char *key);
/* Only for sets returned by dsc_safetensors_read / dsc_checkpoint_load. */
void dsc_tensor_set_free(dsc_context *ctx, dsc_tensor_set *s);
/* Checks that s holds exactly the expected tensors with the expected types;
 * messages name the file (path), the tensor, expected and found types. */
dsc_status dsc_tensor_set_check(dsc_context *ctx, const char *path, const dsc_tensor_set *s,
                                const dsc_tensor_spec *expected, int n_expected);

/* Writes a safetensors file byte-for-byte as the Python package does (u64
 * header length, compact JSON header padded with spaces to a multiple of 8,
 * tensors ordered by dtype alignment then name). Values are converted to
 * each tensor's dtype (bf16/f16 round to nearest even); integer values that
 * the dtype cannot hold are an error. */
dsc_status dsc_safetensors_write(dsc_context *ctx, const char *path, const dsc_tensor_set *s);
dsc_status dsc_safetensors_read(dsc_context *ctx, const char *path, dsc_tensor_set **out);

/* ---- Hugging Face model directories (runtime/hf.c, docs/models.md) ----
 * dir holds config.json and model.safetensors, or model.safetensors.index.json
 * and its shards (f32, bf16, f16 or f64 tensors). config.json's model_type
 * (llama, mistral, qwen2, gpt2) picks a name map that turns each tensor into
 * a param of m (Linear weights transposed to dsc's [in, out]; a tied head
 * from the embedding; an embedding may have fewer rows than a padded
 * vocabulary, the rest zero). Every tensor must map to a model param of m
 * and every model param must be found, with the shape it needs; the errors
 * name the file, the tensor and both shapes. Nothing is read before all of
 * it is checked, and the data is read one tensor at a time.
 * dsc_hf_import writes each param i into dst[i] (full tensors of m's
 * types; NULL: skipped). */
dsc_status dsc_hf_import(dsc_context *ctx, const char *dir, const dsc_module *m,
                         dsc_tensor *const *dst);
/* ZeRO-3's import: param i into the full dst[i], or, where chunk[i] is set,
 * only this rank's chunk of it: ceil(n / world) elements from rank x that
 * of its flattened value (dsc's layout), zero past its end, reading only
 * the file bytes that hold them (a transposed weight's: the columns the
 * chunk covers, in each file row). *bytes_read (may be NULL): the tensor
 * bytes read from the files. */
dsc_status dsc_hf_import_sharded(dsc_context *ctx, const char *dir, const dsc_module *m,
                                 dsc_tensor *const *dst, dsc_tensor *const *chunk, int rank,
                                 int world, int64_t *bytes_read);
/* How each tensor of dir maps onto m, a line each (`dsc import --list`). */
dsc_status dsc_hf_list(dsc_context *ctx, const char *dir, const dsc_module *m, FILE *out);
/* config.json against the model's ops (m before the passes: its forward
 * graph still has attention, rope and the norms): heads, key/value heads,
 * rope_theta and Llama 3.1's rope scaling, Mistral's sliding window, the
 * norms' eps; other rotary frequency scalings are refused. */
dsc_status dsc_hf_check_config(dsc_context *ctx, const char *dir, const dsc_module *m);
/* The model params in params (full tensors under m's names) written to
 * out_dir (made if missing) for transformers' from_pretrained: config.json
 * from m's shapes and ops (m before the passes), model.safetensors in dtype,
 * or shards of at most max_shard_bytes (0: one file) with
 * model.safetensors.index.json. m's param names pick the architecture.
 * report (may be NULL) gets a line per file. */
dsc_status dsc_hf_export(dsc_context *ctx, const dsc_module *m, const dsc_tensor_set *params,
                         const char *out_dir, dsc_dtype dtype, int64_t seq, int64_t max_shard_bytes,
                         FILE *report);

/* ---- checkpoints ---- */
typedef struct {
  int64_t step;
  uint64_t rng[4];       /* the training RNG's state */
  dsc_loader_pos loader; /* the training loader's position */
  int n_extra;           /* any other string key/values */
  const dsc_kv *extra;
} dsc_checkpoint_state;

/* Writes OUT/step-%06d/ (model.safetensors, optimizer.safetensors, state.json)
 * through a temporary directory, then repoints OUT/latest at it. optimizer may
 * be NULL (an empty file is written). keep_last > 0 then removes every step
 * directory except the keep_last newest (by step number) and the one just
 * written. An existing directory for the same step is replaced atomically. */
dsc_status dsc_checkpoint_save(dsc_context *ctx, const char *out_dir, const dsc_tensor_set *model,
                               const dsc_tensor_set *optimizer, const dsc_checkpoint_state *state,
                               int keep_last);

/* ZeRO: a collective over comm (every rank calls it with its own shards).
 * Rank r writes shard-<r>-of-<N>.safetensors from `shards` (its chunks, [S]
 * each, named as the params, with metadata "full.<name>" = "d0xd1..." and
 * "set.<name>" = "model" | "optimizer"); rank 0 also writes model and
 * optimizer (the tensors that are not sharded) and state (which must carry
 * "zero_world" = N), then publishes the step as dsc_checkpoint_save does.
 * Every rank returns the outcome. dsc_checkpoint_load assembles the full
 * tensors, so nothing downstream sees the shards. */
dsc_status dsc_checkpoint_save_sharded(dsc_context *ctx, dsc_comm *comm, const char *out_dir,
                                       const dsc_tensor_set *model,
                                       const dsc_tensor_set *optimizer,
                                       const dsc_tensor_set *shards,
                                       const dsc_checkpoint_state *state, int keep_last);

typedef struct {
  const char *dir; /* the step directory that was read */
  dsc_tensor_set *model, *optimizer;
  dsc_checkpoint_state state;
} dsc_checkpoint;

/* path: a step directory, or OUT (follows OUT/latest). When model_spec
 * (optimizer_spec) is not NULL, the file must hold exactly those tensors. */
dsc_status dsc_checkpoint_load(dsc_context *ctx, const char *path,
                               const dsc_tensor_spec *model_spec, int n_model,
                               const dsc_tensor_spec *optimizer_spec, int n_optimizer,
                               dsc_checkpoint **out);
void dsc_checkpoint_free(dsc_context *ctx, dsc_checkpoint *c);
/* Mixed precision with master weights (train.master_weights): the model set
 * holds the bf16/fp16 params, the optimizer set their f32 copies
 * "opt.master.<name>". Replaces every model tensor that has one by a copy
 * of it, so that export and sampling read the full-precision weights (as
 * DeepSpeed's zero_to_fp32.py); *n_replaced (may be NULL) counts them. */
dsc_status dsc_checkpoint_use_master_weights(dsc_context *ctx, dsc_checkpoint *c, int *n_replaced);
/* The value of key in the checkpoint's state.json extras ("model", "seq",
 * "precision", ...); NULL when absent or c is NULL. */
const char *dsc_checkpoint_extra(const dsc_checkpoint *c, const char *key);

#ifdef __cplusplus
}
#endif
#endif
