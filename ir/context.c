/* The context: allocator, diagnostics and the source texts they point into. */
#include <stdlib.h>
#include <string.h>

#include "ir/ir.h"

typedef struct {
  char *file;
  char *text;
  size_t len;
} ctx_source;

struct dsc_context {
  dsc_alloc_fn alloc;
  void *ud;
  dsc_diag *diags;
  int n_diags, cap_diags, n_errors;
  ctx_source *sources;
  int n_sources, cap_sources;
  dsc_diag_fn on_diag;
  void *on_diag_ud;
  dsc_interrupt_fn interrupt;
  void *interrupt_ud;
  bool interrupt_reported; /* one "interrupted" error however many layers poll */
  dsc_progress_fn progress;
  void *progress_ud;
};

static void *default_alloc(void *ud, void *ptr, size_t osize, size_t nsize) {
  (void)ud;
  (void)osize;
  if (nsize == 0) {
    free(ptr);
    return NULL;
  }
  return realloc(ptr, nsize);
}

dsc_context *dsc_context_new(dsc_alloc_fn alloc, void *ud) {
  if (!alloc) alloc = default_alloc;
  dsc_context *ctx = alloc(ud, NULL, 0, sizeof *ctx);
  if (!ctx) return NULL;
  memset(ctx, 0, sizeof *ctx);
  ctx->alloc = alloc;
  ctx->ud = ud;
  ir_ops_init();
  return ctx;
}

void *ir_alloc(dsc_context *ctx, size_t n) { return n ? ctx->alloc(ctx->ud, NULL, 0, n) : NULL; }

void *ir_realloc(dsc_context *ctx, void *p, size_t old, size_t n) {
  if (n == 0) {
    ir_free(ctx, p, old);
    return NULL;
  }
  return ctx->alloc(ctx->ud, p, old, n);
}

void ir_free(dsc_context *ctx, void *p, size_t n) {
  if (p) ctx->alloc(ctx->ud, p, n, 0);
}

static char *ctx_strdup(dsc_context *ctx, const char *s, size_t n) {
  char *d = ir_alloc(ctx, n + 1);
  if (!d) return NULL;
  memcpy(d, s, n);
  d[n] = 0;
  return d;
}

void dsc_diag_clear(dsc_context *ctx) {
  for (int i = 0; i < ctx->n_diags; i++) {
    dsc_diag *d = &ctx->diags[i];
    ir_free(ctx, (void *)d->message, strlen(d->message) + 1);
    if (d->loc.file) ir_free(ctx, (void *)d->loc.file, strlen(d->loc.file) + 1);
  }
  ir_free(ctx, ctx->diags, sizeof(dsc_diag) * (size_t)ctx->cap_diags);
  ctx->diags = NULL;
  ctx->n_diags = ctx->cap_diags = ctx->n_errors = 0;
}

void dsc_context_free(dsc_context *ctx) {
  if (!ctx) return;
  dsc_diag_clear(ctx);
  for (int i = 0; i < ctx->n_sources; i++) {
    ir_free(ctx, ctx->sources[i].file, strlen(ctx->sources[i].file) + 1);
    ir_free(ctx, ctx->sources[i].text, ctx->sources[i].len + 1);
  }
  ir_free(ctx, ctx->sources, sizeof(ctx_source) * (size_t)ctx->cap_sources);
  ctx->alloc(ctx->ud, ctx, sizeof *ctx, 0);
}

int dsc_diag_count(const dsc_context *ctx) { return ctx->n_diags; }
int dsc_error_count(const dsc_context *ctx) { return ctx->n_errors; }
const dsc_diag *dsc_diag_get(const dsc_context *ctx, int i) {
  return i >= 0 && i < ctx->n_diags ? &ctx->diags[i] : NULL;
}

void dsc_set_diag_callback(dsc_context *ctx, dsc_diag_fn fn, void *ud) {
  ctx->on_diag = fn;
  ctx->on_diag_ud = ud;
}

void dsc_context_set_interrupt(dsc_context *ctx, dsc_interrupt_fn fn, void *ud) {
  ctx->interrupt = fn;
  ctx->interrupt_ud = ud;
  ctx->interrupt_reported = false;
}

void dsc_context_set_progress(dsc_context *ctx, dsc_progress_fn fn, void *ud) {
  ctx->progress = fn;
  ctx->progress_ud = ud;
}

void ir_progress(dsc_context *ctx, const char *what, int64_t done, int64_t total) {
  if (ctx && ctx->progress) ctx->progress(ctx->progress_ud, what, done, total);
}

void ir_context_inherit_interrupt(dsc_context *to, const dsc_context *from) {
  dsc_context_set_interrupt(to, from->interrupt, from->interrupt_ud);
}

dsc_status ir_check_interrupt(dsc_context *ctx, const char *what_fmt, ...) {
  if (!ctx || !ctx->interrupt || !ctx->interrupt(ctx->interrupt_ud)) return DSC_OK;
  if (!ctx->interrupt_reported) {
    ctx->interrupt_reported = true;
    char what[512];
    va_list ap;
    va_start(ap, what_fmt);
    vsnprintf(what, sizeof what, what_fmt, ap);
    va_end(ap);
    ir_error(ctx, ir_no_loc, "interrupted while %s", what);
  }
  return DSC_ERR_INTERRUPTED;
}

const dsc_loc ir_no_loc = {NULL, 0, 0};

void ir_diag_v(dsc_context *ctx, dsc_severity sev, dsc_loc loc, const char *fmt, va_list ap) {
  char buf[1024];
  vsnprintf(buf, sizeof buf, fmt, ap);
  if (sev == DSC_DIAG_ERROR) ctx->n_errors++; /* counted even if storing fails */
  if (ctx->n_diags == ctx->cap_diags) {
    int cap = ctx->cap_diags ? ctx->cap_diags * 2 : 8;
    dsc_diag *d = ir_realloc(ctx, ctx->diags, sizeof(dsc_diag) * (size_t)ctx->cap_diags,
                             sizeof(dsc_diag) * (size_t)cap);
    if (!d) return;
    ctx->diags = d;
    ctx->cap_diags = cap;
  }
  dsc_diag *d = &ctx->diags[ctx->n_diags];
  d->severity = sev;
  d->loc = loc;
  d->loc.file = loc.file ? ctx_strdup(ctx, loc.file, strlen(loc.file)) : NULL;
  d->message = ctx_strdup(ctx, buf, strlen(buf));
  if (!d->message || (loc.file && !d->loc.file)) {
    if (d->message) ir_free(ctx, (void *)d->message, strlen(d->message) + 1);
    if (d->loc.file) ir_free(ctx, (void *)d->loc.file, strlen(d->loc.file) + 1);
    return;
  }
  ctx->n_diags++;
  if (ctx->on_diag) ctx->on_diag(ctx->on_diag_ud, d);
}

void ir_diag(dsc_context *ctx, dsc_severity sev, dsc_loc loc, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  ir_diag_v(ctx, sev, loc, fmt, ap);
  va_end(ap);
}

const char *ir_diag_add_source(dsc_context *ctx, const char *file, const char *text, size_t len) {
  for (int i = 0; i < ctx->n_sources; i++) {
    ctx_source *s = &ctx->sources[i];
    if (strcmp(s->file, file) != 0) continue;
    /* The newest text wins; the name keeps its address (locations use it). */
    char *t = ctx_strdup(ctx, text, len);
    if (!t) return NULL;
    ir_free(ctx, s->text, s->len + 1);
    s->text = t;
    s->len = len;
    return s->file;
  }
  if (ctx->n_sources == ctx->cap_sources) {
    int cap = ctx->cap_sources ? ctx->cap_sources * 2 : 4;
    ctx_source *s = ir_realloc(ctx, ctx->sources, sizeof(ctx_source) * (size_t)ctx->cap_sources,
                               sizeof(ctx_source) * (size_t)cap);
    if (!s) return NULL;
    ctx->sources = s;
    ctx->cap_sources = cap;
  }
  ctx_source *s = &ctx->sources[ctx->n_sources];
  s->file = ctx_strdup(ctx, file, strlen(file));
  s->text = ctx_strdup(ctx, text, len);
  s->len = len;
  if (!s->file || !s->text) {
    if (s->file) ir_free(ctx, s->file, strlen(s->file) + 1);
    if (s->text) ir_free(ctx, s->text, len + 1);
    return NULL;
  }
  ctx->n_sources++;
  return s->file;
}

/* Finds line `line` (1-based) of file's registered text. */
static bool source_line(const dsc_context *ctx, const char *file, int line, const char **start,
                        size_t *len) {
  for (int i = 0; i < ctx->n_sources; i++) {
    const ctx_source *s = &ctx->sources[i];
    if (strcmp(s->file, file) != 0) continue;
    const char *p = s->text, *end = s->text + s->len;
    for (int l = 1; l < line && p < end; l++) {
      const char *nl = memchr(p, '\n', (size_t)(end - p));
      if (!nl) return false;
      p = nl + 1;
    }
    if (p > end) return false;
    const char *e = p;
    while (e < end && *e != '\n' && *e != '\r') e++;
    *start = p;
    *len = (size_t)(e - p);
    return true;
  }
  return false;
}

static bool valid_utf8(const unsigned char *s, size_t n) {
  for (size_t i = 0; i < n;) {
    unsigned char c = s[i];
    size_t k = c < 0x80 ? 0 : (c >> 5) == 6 ? 1 : (c >> 4) == 14 ? 2 : (c >> 3) == 30 ? 3 : 9;
    if (k == 9 || i + k >= n + (k ? 0 : 1)) return false;
    for (size_t j = 1; j <= k; j++)
      if ((s[i + j] & 0xc0) != 0x80) return false;
    i += k + 1;
  }
  return true;
}

/* The source line and a caret under column `col` (1-based, in bytes). Long
 * lines are cut to a window around the column; lines that are not UTF-8
 * (binary garbage) show '?' for non-ASCII bytes so the terminal stays sane. */
static void print_source_line(FILE *out, const char *line, size_t len, int col) {
  enum { WINDOW = 100 };
  size_t c = (size_t)col - 1 > len ? len : (size_t)col - 1;
  size_t from = len > WINDOW && c > WINDOW / 2 ? c - WINDOW / 2 : 0;
  size_t to = from + WINDOW < len ? from + WINDOW : len;
  bool utf8 = valid_utf8((const unsigned char *)line, len);
  fputs(from > 0 ? "  ..." : "  ", out);
  for (size_t k = from; k < to; k++) {
    unsigned char ch = (unsigned char)line[k];
    fputc(ch == '\t' ? '\t' : ch < 32 || ch == 127 ? ' ' : (ch >= 128 && !utf8) ? '?' : ch, out);
  }
  fputs(to < len ? "...\n  " : "\n  ", out);
  if (from > 0) fputs("   ", out);
  for (size_t k = from; k < c; k++) {
    unsigned char ch = (unsigned char)line[k];
    if (ch == '\t')
      fputc('\t', out);
    else if (!(utf8 && (ch & 0xc0) == 0x80)) /* one column per character */
      fputc(' ', out);
  }
  fputs("^\n", out);
}

static const char *sev_name(dsc_severity s) {
  return s == DSC_DIAG_ERROR ? "error" : s == DSC_DIAG_WARNING ? "warning" : "note";
}

void dsc_diag_print(const dsc_context *ctx, FILE *out) {
  for (int i = 0; i < ctx->n_diags; i++) {
    const dsc_diag *d = &ctx->diags[i];
    if (d->loc.file && d->loc.line > 0)
      fprintf(out, "%s:%d:%d: %s: %s\n", d->loc.file, d->loc.line, d->loc.col > 0 ? d->loc.col : 1,
              sev_name(d->severity), d->message);
    else if (d->loc.file)
      fprintf(out, "%s: %s: %s\n", d->loc.file, sev_name(d->severity), d->message);
    else
      fprintf(out, "%s: %s\n", sev_name(d->severity), d->message);
    const char *line;
    size_t len;
    if (d->loc.file && d->loc.line > 0 && source_line(ctx, d->loc.file, d->loc.line, &line, &len))
      print_source_line(out, line, len, d->loc.col > 0 ? d->loc.col : 1);
  }
}
