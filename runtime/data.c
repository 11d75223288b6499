/* Token shards in llm.c's format and the batch loader over one shard.
 *
 * Format (llm.c, dev/data/data_common.py): 256 int32 little-endian header
 * words (magic, version, token count, then zeros) followed by the tokens,
 * little-endian: uint16 under magic 20240520 version 1 (GPT-2), uint32 under
 * magic 20240801 version 7 (Llama 3). The loader reads the whole shard (it
 * checks every id anyway) and draws B x T windows; see include/dsc/runtime.h. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/runtime.h"

#define HEADER_BYTES (DSC_SHARD_HEADER_INTS * 4)

static void put_i32le(unsigned char *p, int32_t v) {
  uint32_t u = (uint32_t)v;
  for (int i = 0; i < 4; i++) p[i] = (unsigned char)(u >> (8 * i));
}

static int32_t get_i32le(const unsigned char *p) {
  uint32_t u = 0;
  for (int i = 0; i < 4; i++) u |= (uint32_t)p[i] << (8 * i);
  return (int32_t)u;
}

/* Either format: width 2 (tokens16) or 4 (tokens32). */
static dsc_status shard_write(dsc_context *ctx, const char *path, const uint16_t *tokens16,
                              const uint32_t *tokens32, int64_t n_tokens) {
  if (n_tokens < 0 || n_tokens > INT32_MAX) {
    ir_error(ctx, rt_loc(path), "cannot write %" PRId64 " tokens: the format holds 0 to %d",
             n_tokens, INT32_MAX);
    return DSC_ERR_USER;
  }
  unsigned width = tokens32 ? 4 : 2;
  unsigned char header[HEADER_BYTES] = {0};
  put_i32le(header, tokens32 ? DSC_SHARD32_MAGIC : DSC_SHARD_MAGIC);
  put_i32le(header + 4, tokens32 ? DSC_SHARD32_VERSION : DSC_SHARD_VERSION);
  put_i32le(header + 8, (int32_t)n_tokens);
  rt_atomic_file f;
  dsc_status st = rt_atomic_open(ctx, path, &f);
  if (st != DSC_OK) return st;
  rt_atomic_write(&f, header, sizeof header);
  unsigned char buf[8192];
  for (int64_t i = 0; i < n_tokens && !f.failed;) {
    size_t k = 0;
    for (; k + width <= sizeof buf && i < n_tokens; i++, k += width) {
      uint32_t v = tokens32 ? tokens32[i] : tokens16[i];
      for (unsigned b = 0; b < width; b++) buf[k + b] = (unsigned char)(v >> (8 * b));
    }
    rt_atomic_write(&f, buf, k);
  }
  return rt_atomic_commit(&f);
}

dsc_status dsc_shard_write(dsc_context *ctx, const char *path, const uint16_t *tokens,
                           int64_t n_tokens) {
  return shard_write(ctx, path, tokens, NULL, n_tokens);
}

dsc_status dsc_shard_write32(dsc_context *ctx, const char *path, const uint32_t *tokens,
                             int64_t n_tokens) {
  return shard_write(ctx, path, NULL, tokens, n_tokens);
}

void dsc_shard_free(dsc_context *ctx, uint32_t *tokens, int64_t n_tokens) {
  if (tokens) ir_free(ctx, tokens, (size_t)(n_tokens > 0 ? n_tokens : 1) * sizeof(uint32_t));
}

/* Validates the header against the file size; sets the token count. */
static dsc_status check_header(dsc_context *ctx, const char *path, const unsigned char *h,
                               uint64_t file_size, int64_t *count, unsigned *width) {
  dsc_loc loc = rt_loc(path);
  int32_t magic = get_i32le(h), version = get_i32le(h + 4), n = get_i32le(h + 8);
  if (magic != DSC_SHARD_MAGIC && magic != DSC_SHARD32_MAGIC) {
    ir_error(ctx, loc, "bad magic number %" PRId32 " (expected %d or %d): not a token shard", magic,
             DSC_SHARD_MAGIC, DSC_SHARD32_MAGIC);
    return DSC_ERR_USER;
  }
  int32_t want_version = magic == DSC_SHARD_MAGIC ? DSC_SHARD_VERSION : DSC_SHARD32_VERSION;
  if (version != want_version) {
    ir_error(ctx, loc, "unsupported shard version %" PRId32 " (this dsc reads version %d under magic %" PRId32 ")",
             version, want_version, magic);
    return DSC_ERR_USER;
  }
  *width = magic == DSC_SHARD_MAGIC ? 2 : 4;
  const uint64_t w = *width;
  if (n < 0) {
    ir_error(ctx, loc, "negative token count %" PRId32 " in the header", n);
    return DSC_ERR_USER;
  }
  uint64_t want = HEADER_BYTES + w * (uint64_t)n;
  if (file_size < want) {
    ir_error(ctx, loc,
             "truncated: the header says %" PRId32 " tokens (%" PRIu64
             " bytes) but the file "
             "holds %" PRIu64 " bytes after the header",
             n, w * (uint64_t)n, file_size - HEADER_BYTES);
    return DSC_ERR_USER;
  }
  if (file_size > want) {
    ir_error(ctx, loc,
             "%" PRIu64 " trailing bytes: the header says %" PRId32 " tokens (%" PRIu64
             " bytes) but the file holds %" PRIu64 " bytes after the header",
             file_size - want, n, w * (uint64_t)n, file_size - HEADER_BYTES);
    return DSC_ERR_USER;
  }
  *count = n;
  return DSC_OK;
}

bool rt_shard_peek(const char *path, int64_t *n_tokens) {
  const char *kind;
  int fd = rt_open_regular_fd(path, 0, &kind);
  if (fd < 0) return false;
  unsigned char h[12];
  bool ok = rt_pread_full(fd, h, sizeof h, 0);
  close(fd);
  int32_t magic = ok ? get_i32le(h) : 0;
  if (magic != DSC_SHARD_MAGIC && magic != DSC_SHARD32_MAGIC) return false;
  *n_tokens = get_i32le(h + 8);
  return true;
}

dsc_status dsc_shard_read(dsc_context *ctx, const char *path, int64_t vocab_size, uint32_t **tokens,
                          int64_t *n_tokens) {
  *tokens = NULL;
  *n_tokens = 0;
  dsc_loc loc = rt_loc(path);
  int fd;
  dsc_status ost = rt_open_regular(ctx, path, 0, &fd);
  if (ost != DSC_OK) return ost;
  struct stat sb;
  if (fstat(fd, &sb) != 0) {
    dsc_status st = rt_io_error(ctx, path, "cannot stat");
    close(fd);
    return st;
  }
  if (!S_ISREG(sb.st_mode)) {
    ir_error(ctx, loc, "not a regular file");
    close(fd);
    return DSC_ERR_USER;
  }
  uint64_t size = (uint64_t)sb.st_size;
  if (size < HEADER_BYTES) {
    ir_error(ctx, loc, "file too short for the header: %" PRIu64 " bytes, the header alone is %d",
             size, HEADER_BYTES);
    close(fd);
    return DSC_ERR_USER;
  }
  unsigned char header[HEADER_BYTES];
  int64_t n = 0;
  unsigned width = 2;
  dsc_status st = DSC_OK;
  if (!rt_pread_full(fd, header, sizeof header, 0))
    st = rt_io_error(ctx, path, "read failed");
  else
    st = check_header(ctx, path, header, size, &n, &width);
  uint32_t *out = NULL;
  size_t out_bytes = (size_t)(n > 0 ? n : 1) * sizeof(uint32_t);
  if (st == DSC_OK) {
    out = ir_alloc(ctx, out_bytes);
    if (!out) {
      ir_error(ctx, loc, "out of memory for %" PRId64 " tokens", n);
      st = DSC_ERR_INTERNAL;
    }
  }
  unsigned char buf[1 << 16];
  for (int64_t i = 0; st == DSC_OK && i < n;) {
    size_t k = (size_t)(n - i) * width < sizeof buf ? (size_t)(n - i) * width : sizeof buf;
    if (!rt_pread_full(fd, buf, k, HEADER_BYTES + width * (uint64_t)i)) {
      st = rt_io_error(ctx, path, "read failed");
      break;
    }
    for (size_t j = 0; j < k; j += width, i++) {
      uint32_t v = 0;
      for (unsigned b = 0; b < width; b++) v |= (uint32_t)buf[j + b] << (8 * b);
      out[i] = v;
      if (vocab_size > 0 && out[i] >= vocab_size) {
        ir_error(ctx, loc,
                 "token id %u at position %" PRId64 " is outside the vocabulary (size %" PRId64 ")",
                 (unsigned)out[i], i, vocab_size);
        st = DSC_ERR_USER;
        break;
      }
    }
  }
  close(fd);
  if (st != DSC_OK) {
    if (out) ir_free(ctx, out, out_bytes);
    return st;
  }
  *tokens = out;
  *n_tokens = n;
  return DSC_OK;
}

/* ------------------------------------------------------------------ loader */

/* Unbiased integer in [0, bound) (rejection of the short first interval). */
static uint64_t rng_below(ir_rng *r, uint64_t bound) {
  uint64_t min = (0 - bound) % bound;
  uint64_t x;
  do x = ir_rng_next(r);
  while (x < min);
  return x % bound;
}

void rt_loader_permutation(uint64_t seed, int64_t epoch, int64_t *order, int64_t windows) {
  ir_rng r;
  /* The epoch's stream depends on (seed, epoch) only, so a resumed run can
   * redraw it; the odd multiplier keeps (seed, epoch) pairs apart. */
  ir_rng_seed(&r, seed ^ ((uint64_t)epoch * 0xd1b54a32d192ed03ULL + 0x632be59bd9b4e019ULL));
  for (int64_t i = 0; i < windows; i++) order[i] = i;
  for (int64_t i = windows - 1; i > 0; i--) {
    int64_t j = (int64_t)rng_below(&r, (uint64_t)i + 1);
    int64_t t = order[i];
    order[i] = order[j];
    order[j] = t;
  }
}

void dsc_loader_free(dsc_loader *l) {
  if (!l) return;
  dsc_context *ctx = l->ctx;
  dsc_shard_free(ctx, l->tokens, l->n_tokens);
  if (l->order) ir_free(ctx, l->order, (size_t)l->windows * sizeof(int64_t));
  if (l->path) ir_free(ctx, l->path, strlen(l->path) + 1);
  ir_free(ctx, l, sizeof *l);
}

dsc_status dsc_loader_open(dsc_context *ctx, const char *path, const dsc_loader_options *opts,
                           dsc_loader **out) {
  *out = NULL;
  dsc_loc loc = rt_loc(path);
  if (opts->batch <= 0 || opts->seq <= 0 || opts->batch > INT32_MAX || opts->seq > INT32_MAX) {
    ir_error(ctx, loc, "loader: batch and seq must be between 1 and 2^31-1 (got B=%" PRId64 ", T=%" PRId64 ")",
             opts->batch, opts->seq);
    return DSC_ERR_USER;
  }
  if (opts->mode != DSC_LOADER_SHUFFLE && opts->mode != DSC_LOADER_SEQUENTIAL) {
    ir_error(ctx, loc, "loader: unknown mode %d", (int)opts->mode);
    return DSC_ERR_USER;
  }
  dsc_loader *l = ir_alloc(ctx, sizeof *l);
  if (!l) {
    ir_error(ctx, loc, "out of memory");
    return DSC_ERR_INTERNAL;
  }
  memset(l, 0, sizeof *l);
  l->ctx = ctx;
  l->B = opts->batch;
  l->T = opts->seq;
  l->seed = opts->seed;
  l->mode = opts->mode;
  l->order_epoch = -1;
  l->path = rt_strdup(ctx, path);
  if (!l->path) {
    dsc_loader_free(l);
    ir_error(ctx, loc, "out of memory");
    return DSC_ERR_INTERNAL;
  }
  dsc_status st = dsc_shard_read(ctx, path, opts->vocab_size, &l->tokens, &l->n_tokens);
  if (st != DSC_OK) {
    dsc_loader_free(l);
    return st;
  }
  if (l->n_tokens < l->T + 1) {
    ir_error(ctx, loc,
             "the shard holds %" PRId64 " tokens, fewer than seq + 1 = %" PRId64
             " (one window of inputs and targets)",
             l->n_tokens, l->T + 1);
    dsc_loader_free(l);
    return DSC_ERR_USER;
  }
  l->windows = (l->n_tokens - 1) / l->T;
  if (l->mode == DSC_LOADER_SHUFFLE) {
    l->order = ir_alloc(ctx, (size_t)l->windows * sizeof(int64_t));
    if (!l->order) {
      dsc_loader_free(l);
      ir_error(ctx, loc, "out of memory");
      return DSC_ERR_INTERNAL;
    }
  }
  *out = l;
  return DSC_OK;
}

int64_t dsc_loader_windows(const dsc_loader *l) { return l->windows; }
int64_t dsc_loader_tokens(const dsc_loader *l) { return l->n_tokens; }
dsc_loader_pos dsc_loader_tell(const dsc_loader *l) { return l->pos; }

dsc_status dsc_loader_seek(dsc_loader *l, dsc_loader_pos pos) {
  if (pos.epoch < 0 || pos.index < 0 || pos.index >= l->windows) {
    ir_error(l->ctx, rt_loc(l->path),
             "loader position (epoch %" PRId64 ", index %" PRId64
             ") is outside this shard "
             "(%" PRId64 " windows per epoch)",
             pos.epoch, pos.index, l->windows);
    return DSC_ERR_USER;
  }
  l->pos = pos;
  return DSC_OK;
}

/* The start token of the next window; advances the position. */
static int64_t next_window(dsc_loader *l) {
  int64_t w = l->pos.index;
  if (l->mode == DSC_LOADER_SHUFFLE) {
    if (l->order_epoch != l->pos.epoch) {
      rt_loader_permutation(l->seed, l->pos.epoch, l->order, l->windows);
      l->order_epoch = l->pos.epoch;
    }
    w = l->order[l->pos.index];
  }
  if (++l->pos.index == l->windows) {
    l->pos.epoch++;
    l->pos.index = 0;
  }
  return w * l->T;
}

dsc_status dsc_loader_next(dsc_loader *l, int32_t *inputs, int32_t *targets) {
  for (int64_t b = 0; b < l->B; b++) {
    const uint32_t *src = l->tokens + next_window(l);
    for (int64_t t = 0; t < l->T; t++) {
      inputs[b * l->T + t] = (int32_t)src[t];
      targets[b * l->T + t] = (int32_t)src[t + 1];
    }
  }
  return DSC_OK;
}

dsc_status dsc_loader_next_tensors(dsc_loader *l, dsc_tensor *inputs, dsc_tensor *targets) {
  const dsc_tensor *ts[2] = {inputs, targets};
  for (int k = 0; k < 2; k++) {
    const dsc_type *ty = &ts[k]->type;
    if (ty->dtype != DSC_I32 || ty->rank != 2 || ty->dims[0] != l->B || ty->dims[1] != l->T) {
      char got[96];
      dsc_type_format(ty, got, sizeof got);
      ir_error(l->ctx, rt_loc(l->path),
               "loader: %s tensor is %s, expected i32[%" PRId64 ",%" PRId64 "]",
               k ? "targets" : "inputs", got, l->B, l->T);
      return DSC_ERR_USER;
    }
  }
  for (int64_t b = 0; b < l->B; b++) {
    const uint32_t *src = l->tokens + next_window(l);
    for (int64_t t = 0; t < l->T; t++) {
      inputs->data[b * l->T + t] = (int32_t)src[t];
      targets->data[b * l->T + t] = (int32_t)src[t + 1];
    }
  }
  return DSC_OK;
}
