/* codegen/cuda_templates.c: the registry of hand-written CUDA templates
 * (the kernels/ .cuh files): their entry points, the NVRTC source of an instantiation
 * and the launch configuration for given sizes. Pure text and arithmetic:
 * no CUDA library is needed here (cg_nvrtc_compile compiles the source). */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "codegen/codegen.h"

/* Generated from the kernels/ .cuh files by cmake/embed_kernels.cmake. */
struct cg_kernel_file {
  const char *name, *text;
};
extern const struct cg_kernel_file cg_kernel_files[];

static const cg_cuda_template templates[CG_TPL_COUNT] = {
    [CG_TPL_SOFTMAX_CE] = {"softmax_ce", "softmax_ce.cuh", "DSC_SOFTMAX_CE_INSTANTIATE",
                           CG_ENTRY_SOFTMAX_CE_FWD, 3},
    [CG_TPL_LAYERNORM] = {"layernorm", "layernorm.cuh", "DSC_LAYERNORM_INSTANTIATE",
                          CG_ENTRY_LAYERNORM_FWD, 3},
    [CG_TPL_ATTENTION] = {"attention", "attention.cuh", "DSC_ATTENTION_INSTANTIATE",
                          CG_ENTRY_ATTENTION_FWD, 4},
    [CG_TPL_ADAMW] = {"adamw", "adamw.cuh", "DSC_ADAMW_INSTANTIATE", CG_ENTRY_ADAMW, 1},
};

static const char *const entry_bases[CG_ENTRY_COUNT] = {
    [CG_ENTRY_SOFTMAX_CE_FWD] = "softmax_ce_fwd",
    [CG_ENTRY_CE_LOSS_MEAN] = "ce_loss_mean",
    [CG_ENTRY_SOFTMAX_CE_BWD] = "softmax_ce_bwd",
    [CG_ENTRY_LAYERNORM_FWD] = "layernorm_fwd",
    [CG_ENTRY_LAYERNORM_BWD] = "layernorm_bwd",
    [CG_ENTRY_LAYERNORM_BWD_DWDB] = "layernorm_bwd_dwdb",
    [CG_ENTRY_ATTENTION_FWD] = "attention_fwd",
    [CG_ENTRY_ATTENTION_BWD_PRE] = "attention_bwd_pre",
    [CG_ENTRY_ATTENTION_BWD_DQ] = "attention_bwd_dq",
    [CG_ENTRY_ATTENTION_BWD_DKDV] = "attention_bwd_dkdv",
    [CG_ENTRY_ADAMW] = "adamw",
};

/* Tile constants of kernels/attention.cuh and the block sizes used below. */
enum {
  ATT_THREADS = 128,
  ATT_FWD_QUERIES = 16,
  ATT_BWD_ROWS = 8,
  ATT_ROWS_PER_PRE_BLOCK = 4,
  MAX_HEAD_DIM = 128,
  SHARED_LIMIT = 48 * 1024 - 256, /* default dynamic limit, less the static scratch */
  LN_BWD_BLOCKS = 256,            /* ~2 per SM on an H100/H200 */
  ADAMW_THREADS = 256,
  ADAMW_MAX_BLOCKS = 4096,
  GRID_YZ_MAX = 65535,
};

static bool fail(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static bool fail(char *err, size_t errlen, const char *fmt, ...) {
  if (err && errlen) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
  }
  return false;
}

const cg_cuda_template *cg_cuda_template_info(cg_cuda_template_id id) {
  return (unsigned)id < CG_TPL_COUNT ? &templates[id] : NULL;
}

cg_cuda_template_id cg_cuda_entry_template(cg_cuda_entry e) {
  for (int t = 0; t < CG_TPL_COUNT; t++)
    if ((int)e >= (int)templates[t].first_entry &&
        (int)e < (int)templates[t].first_entry + templates[t].n_entries)
      return (cg_cuda_template_id)t;
  return CG_TPL_COUNT;
}

const char *cg_cuda_entry_base(cg_cuda_entry e) {
  return (unsigned)e < CG_ENTRY_COUNT ? entry_bases[e] : NULL;
}

const char *cg_cuda_kernel_file(const char *file) {
  for (const struct cg_kernel_file *f = cg_kernel_files; f->name; f++)
    if (strcmp(f->name, file) == 0) return f->text;
  return NULL;
}

/* Storage dtypes the templates support, as CUDA type and suffix names. */
static bool float_type(dsc_dtype dt, const char **cuda, const char **suffix) {
  switch (dt) {
  case DSC_F32: *cuda = "float", *suffix = "f32"; return true;
  case DSC_BF16: *cuda = "dsc_bf16", *suffix = "bf16"; return true;
  case DSC_F16: *cuda = "dsc_f16", *suffix = "f16"; return true;
  default: return false;
  }
}
static bool index_type(dsc_dtype dt, const char **cuda, const char **suffix) {
  switch (dt) {
  case DSC_I32: *cuda = "int", *suffix = "i32"; return true;
  case DSC_I64: *cuda = "long long", *suffix = "i64"; return true;
  default: return false;
  }
}

/* Suffix and the macro arguments of one instantiation. */
static bool instantiation(cg_cuda_template_id id, const cg_cuda_template_params *p, char *suffix,
                          size_t slen, char *args, size_t alen, char *err, size_t errlen) {
  if ((unsigned)id >= CG_TPL_COUNT) return fail(err, errlen, "unknown CUDA template %d", (int)id);
  const char *name = templates[id].name, *ct, *cs, *it, *is;
  if (!float_type(p->dtype, &ct, &cs))
    return fail(err, errlen, "%s template: element dtype %s not supported (f32, bf16, f16)", name,
                dsc_dtype_name(p->dtype));
  switch (id) {
  case CG_TPL_SOFTMAX_CE:
    if (!index_type(p->index_dtype, &it, &is))
      return fail(err, errlen, "softmax_ce template: target dtype %s not supported (i32, i64)",
                  dsc_dtype_name(p->index_dtype));
    snprintf(suffix, slen, "%s_%s", cs, is);
    snprintf(args, alen, "%s, %s, %s", ct, it, suffix);
    return true;
  case CG_TPL_ATTENTION:
    if (p->head_dim < 1 || p->head_dim > MAX_HEAD_DIM)
      return fail(err, errlen, "attention template: head dim %d outside [1, %d]", p->head_dim,
                  MAX_HEAD_DIM);
    snprintf(suffix, slen, "%s_hd%d", cs, p->head_dim);
    snprintf(args, alen, "%s, %d, %s", ct, p->head_dim, suffix);
    return true;
  case CG_TPL_LAYERNORM:
  case CG_TPL_ADAMW:
    snprintf(suffix, slen, "%s", cs);
    snprintf(args, alen, "%s, %s", ct, suffix);
    return true;
  default: return fail(err, errlen, "unknown CUDA template %d", (int)id);
  }
}

bool cg_cuda_template_suffix(cg_cuda_template_id id, const cg_cuda_template_params *p, char *buf,
                             size_t len, char *err, size_t errlen) {
  char args[128];
  return instantiation(id, p, buf, len, args, sizeof args, err, errlen);
}

bool cg_cuda_entry_name(cg_cuda_entry e, const cg_cuda_template_params *p, char *buf, size_t len,
                        char *err, size_t errlen) {
  cg_cuda_template_id id = cg_cuda_entry_template(e);
  if (id == CG_TPL_COUNT) return fail(err, errlen, "unknown CUDA template entry %d", (int)e);
  char suffix[64];
  if (!cg_cuda_template_suffix(id, p, suffix, sizeof suffix, err, errlen)) return false;
  snprintf(buf, len, "dsc_%s_%s", entry_bases[e], suffix);
  return true;
}

/* Appends text to a growing buffer in the arena (sources are a few tens of
 * KiB: copying on growth is fine). */
typedef struct {
  ir_arena *a;
  char *s;
  size_t len, cap;
} strbuf;

static bool sb_put(strbuf *b, const char *s, size_t n) {
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 4096;
    while (b->len + n + 1 > cap) cap *= 2;
    char *s2 = ir_arena_alloc(b->a, cap);
    if (!s2) return false;
    if (b->len) memcpy(s2, b->s, b->len);
    b->s = s2, b->cap = cap;
  }
  memcpy(b->s + b->len, s, n);
  b->len += n;
  b->s[b->len] = '\0';
  return true;
}

/* Copies file's text, replacing each `#include "X"` line by the embedded X
 * (one level suffices: only common.cuh is included, and it has a guard). */
static bool put_file(strbuf *b, const char *file, int depth, char *err, size_t errlen) {
  const char *text = cg_cuda_kernel_file(file);
  if (!text) return fail(err, errlen, "kernels/%s is not embedded in this build", file);
  static const char inc[] = "#include \"";
  for (const char *line = text; *line;) {
    const char *eol = strchr(line, '\n');
    size_t n = eol ? (size_t)(eol - line) + 1 : strlen(line);
    if (strncmp(line, inc, sizeof inc - 1) == 0) {
      const char *name = line + sizeof inc - 1, *q = memchr(name, '"', n - (sizeof inc - 1));
      char inner[64];
      if (!q || (size_t)(q - name) >= sizeof inner || depth > 2)
        return fail(err, errlen, "kernels/%s: malformed or nested #include", file);
      memcpy(inner, name, (size_t)(q - name));
      inner[q - name] = '\0';
      if (!put_file(b, inner, depth + 1, err, errlen)) return false;
    } else if (!sb_put(b, line, n)) {
      return fail(err, errlen, "out of memory");
    }
    line += n;
  }
  return true;
}

char *cg_cuda_template_source(ir_arena *a, cg_cuda_template_id id,
                              const cg_cuda_template_params *params, int n_params, char *err,
                              size_t errlen) {
  if ((unsigned)id >= CG_TPL_COUNT) {
    fail(err, errlen, "unknown CUDA template %d", (int)id);
    return NULL;
  }
  if (n_params < 1) {
    fail(err, errlen, "%s template: no instantiation requested", templates[id].name);
    return NULL;
  }
  strbuf b = {a, NULL, 0, 0};
  if (!put_file(&b, templates[id].file, 0, err, errlen)) return NULL;
  char seen[16][64];
  int n_seen = 0;
  static const char header[] = "\n/* Instantiations (codegen/cuda_templates.c) */\n";
  if (!sb_put(&b, header, sizeof header - 1)) goto oom;
  for (int i = 0; i < n_params; i++) {
    char suffix[64], args[128], line[256];
    if (!instantiation(id, &params[i], suffix, sizeof suffix, args, sizeof args, err, errlen))
      return NULL;
    bool dup = false;
    for (int j = 0; j < n_seen; j++) dup = dup || strcmp(seen[j], suffix) == 0;
    if (dup) continue; /* the same entry points twice would not link */
    if (n_seen == (int)(sizeof seen / sizeof seen[0])) {
      fail(err, errlen, "%s template: more than %d instantiations in one source",
           templates[id].name, n_seen);
      return NULL;
    }
    snprintf(seen[n_seen++], sizeof seen[0], "%s", suffix);
    int n = snprintf(line, sizeof line, "%s(%s)\n", templates[id].instantiate, args);
    if (!sb_put(&b, line, (size_t)n)) goto oom;
  }
  return b.s;
oom:
  fail(err, errlen, "out of memory");
  return NULL;
}

void cg_cuda_layernorm_bwd_split(int64_t rows, int64_t *rows_per_block, int64_t *n_parts) {
  if (rows < 1) rows = 1;
  int64_t rpb = (rows + LN_BWD_BLOCKS - 1) / LN_BWD_BLOCKS;
  *rows_per_block = rpb;
  *n_parts = (rows + rpb - 1) / rpb;
}

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* Threads for a row of n elements: a multiple of 32 in [32, max]. */
static unsigned row_threads(int64_t n, unsigned max) {
  int64_t t = ceil_div(n, 32) * 32;
  return t > (int64_t)max ? max : t < 32 ? 32 : (unsigned)t;
}

static bool positive_int(const char *what, int64_t v, char *err, size_t errlen) {
  if (v < 1 || v > INT32_MAX)
    return fail(err, errlen, "%s %lld outside [1, 2^31)", what, (long long)v);
  return true;
}

static void set_launch(cg_cuda_launch *o, int64_t gx, int64_t gy, unsigned block, unsigned shared) {
  *o = (cg_cuda_launch){{(unsigned)gx, (unsigned)gy, 1}, {block, 1, 1}, shared};
}

bool cg_cuda_template_launch(cg_cuda_entry e, const cg_cuda_template_params *p,
                             const cg_cuda_template_sizes *s, cg_cuda_launch *out, char *err,
                             size_t errlen) {
  char name[128];
  if (!cg_cuda_entry_name(e, p, name, sizeof name, err, errlen)) return false;
  switch (cg_cuda_entry_template(e)) {
  case CG_TPL_SOFTMAX_CE: {
    if (!positive_int("softmax_ce rows", s->rows, err, errlen) ||
        !positive_int("softmax_ce row length", s->cols, err, errlen))
      return false;
    if (e == CG_ENTRY_CE_LOSS_MEAN) {
      set_launch(out, 1, 1, row_threads(s->rows, 1024), 0);
    } else {
      /* Enough threads that each does a few 16-byte loads (8 per 50304 row). */
      const int vec = p->dtype == DSC_F32 ? 4 : 8;
      set_launch(out, s->rows, 1, row_threads(ceil_div(s->cols, vec), 512), 0);
    }
    return true;
  }
  case CG_TPL_LAYERNORM: {
    if (!positive_int("layernorm rows", s->rows, err, errlen) ||
        !positive_int("layernorm row length", s->cols, err, errlen))
      return false;
    if (e == CG_ENTRY_LAYERNORM_BWD_DWDB) {
      set_launch(out, ceil_div(s->cols, 256), 1, 256, 0);
      return true;
    }
    /* fwd caches the row, bwd keeps dw and db partials: C or 2C floats. */
    const int64_t shared = (e == CG_ENTRY_LAYERNORM_FWD ? 1 : 2) * s->cols * (int64_t)sizeof(float);
    if (shared > SHARED_LIMIT)
      return fail(err, errlen, "%s: row length %lld needs %lld bytes of shared memory (limit %d)",
                  name, (long long)s->cols, (long long)shared, (int)SHARED_LIMIT);
    int64_t grid = s->rows;
    if (e == CG_ENTRY_LAYERNORM_BWD) {
      int64_t rpb;
      cg_cuda_layernorm_bwd_split(s->rows, &rpb, &grid);
    }
    set_launch(out, grid, 1, row_threads(s->cols, 256), (unsigned)shared);
    return true;
  }
  case CG_TPL_ATTENTION: {
    if (!positive_int("attention batch", s->batch, err, errlen) ||
        !positive_int("attention sequence length", s->seq, err, errlen) ||
        !positive_int("attention heads", s->heads, err, errlen))
      return false;
    const int64_t bh = s->batch * s->heads;
    if (bh > GRID_YZ_MAX)
      return fail(err, errlen, "%s: batch x heads = %lld exceeds the grid's y limit %d", name,
                  (long long)bh, GRID_YZ_MAX);
    if (s->heads * p->head_dim > INT32_MAX ||
        ceil_div(s->batch * s->seq * s->heads, ATT_ROWS_PER_PRE_BLOCK) > INT32_MAX)
      return fail(err, errlen, "%s: %lld x %lld x %lld heads of %d too large for one launch", name,
                  (long long)s->batch, (long long)s->seq, (long long)s->heads, p->head_dim);
    switch (e) {
    case CG_ENTRY_ATTENTION_FWD:
      set_launch(out, ceil_div(s->seq, ATT_FWD_QUERIES), bh, ATT_THREADS, 0);
      break;
    case CG_ENTRY_ATTENTION_BWD_PRE:
      set_launch(out, ceil_div(s->batch * s->seq * s->heads, ATT_ROWS_PER_PRE_BLOCK), 1,
                 ATT_THREADS, 0);
      break;
    default: set_launch(out, ceil_div(s->seq, ATT_BWD_ROWS), bh, ATT_THREADS, 0); break;
    }
    return true;
  }
  case CG_TPL_ADAMW: {
    if (s->n_tensors < 1 || s->max_numel < 1)
      return fail(err, errlen, "%s: needs at least one tensor of at least one element", name);
    if (s->n_tensors > GRID_YZ_MAX)
      return fail(err, errlen, "%s: %lld tensors exceed one launch (%d)", name,
                  (long long)s->n_tensors, GRID_YZ_MAX);
    /* Grid-stride loop: ~4 elements per thread on the largest tensor. */
    int64_t gx = ceil_div(s->max_numel, ADAMW_THREADS * 4);
    set_launch(out, gx > ADAMW_MAX_BLOCKS ? ADAMW_MAX_BLOCKS : gx, s->n_tensors, ADAMW_THREADS, 0);
    return true;
  }
  default: return fail(err, errlen, "unknown CUDA template entry %d", (int)e);
  }
}
