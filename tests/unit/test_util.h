/* Helpers every test shares: diagnostics as text, the tiny GPT's training
 * step through the pipeline, and the norm-wise comparison of a result with
 * its reference. Plain C (static inline) so that the C GPU check
 * (tests/gpu/gpu_check.c) and the GoogleTest binary use the same code; the
 * std::string form of the diagnostics is C++ only. */
#ifndef DSC_TESTS_TEST_UTIL_H
#define DSC_TESTS_TEST_UTIL_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "dsc/dsc.h"

/* ---- diagnostics ---- */

/* The location of d as "file:line:col: ", "" when it has no file. */
static inline void test_diag_where(const dsc_diag *d, char *buf, size_t n) {
  buf[0] = 0;
  /* a whole file (line 0) as "file: ", as the runtime's messages name it */
  if (d->loc.file && d->loc.line > 0)
    snprintf(buf, n, "%s:%d:%d: ", d->loc.file, d->loc.line, d->loc.col);
  else if (d->loc.file)
    snprintf(buf, n, "%s: ", d->loc.file);
}

/* Every diagnostic of ctx, located, joined by sep, into buf (truncated). */
static inline void test_diags_join(const dsc_context *ctx, const char *sep, char *buf, size_t n) {
  size_t len = 0;
  buf[0] = 0;
  for (int i = 0; i < dsc_diag_count(ctx) && len + 1 < n; i++) {
    char where[512];
    const dsc_diag *d = dsc_diag_get(ctx, i);
    test_diag_where(d, where, sizeof where);
    int w = snprintf(buf + len, n - len, "%s%s%s", i ? sep : "", where, d->message);
    if (w < 0) break;
    len += (size_t)w;
  }
}

/* ---- the tiny GPT (examples/gpt-tiny.dsm) ---- */

typedef struct {
  const char *source_dir;      /* the checkout holding examples/; NULL: DSC_SOURCE_DIR */
  int64_t batch, seq;          /* B and T; 0: 2 and 16 */
  const char *stop_after;      /* the last pass to run; NULL: the whole pipeline */
  double adam_eps;             /* > 0: replaces the model's Adam eps */
  dsc_offload_tier optimizer;  /* where the optimizer states live */
} test_tiny_options;

/* Compiles the tiny GPT at B, T (o may be NULL) and reads its train section
 * into *cfg, with batch/seq set and one micro-batch a step. *out is the
 * module (or NULL) whatever the status: the caller frees it. */
static inline dsc_status test_tiny_compile(dsc_context *ctx, const test_tiny_options *o,
                                           dsc_module **out, dsc_train_config *cfg) {
  char path[4096];
  snprintf(path, sizeof path, "%s/examples/gpt-tiny.dsm",
           o && o->source_dir ? o->source_dir : DSC_SOURCE_DIR);
  int64_t B = o && o->batch ? o->batch : 2, T = o && o->seq ? o->seq : 16;
  dsc_dim_binding dims[2] = {{"B", B}, {"T", T}};
  dsc_frontend_options fo;
  memset(&fo, 0, sizeof fo);
  fo.dims = dims;
  fo.n_dims = 2;
  *out = NULL;
  dsc_status st = dsc_compile_file(ctx, path, &fo, out);
  if (st != DSC_OK) return st;
  st = dsc_train_config_from_module(*out, cfg);
  if (st != DSC_OK) return st;
  cfg->batch = B, cfg->seq = T, cfg->grad_accum = 1;
  return DSC_OK;
}

/* The tiny GPT's train step through the pipeline (options above); NULL on
 * an error, which is in ctx's diagnostics. */
static inline dsc_module *test_tiny_step(dsc_context *ctx, const test_tiny_options *o) {
  dsc_module *m = NULL;
  dsc_train_config cfg;
  if (test_tiny_compile(ctx, o, &m, &cfg) != DSC_OK) {
    dsc_module_free(m);
    return NULL;
  }
  if (o && o->adam_eps > 0) cfg.opt.eps = o->adam_eps;
  if (o) cfg.offload.optimizer = o->optimizer;
  dsc_pipeline_options po;
  memset(&po, 0, sizeof po);
  po.train = &cfg;
  po.stop_after = o ? o->stop_after : NULL;
  if (dsc_run_pipeline(m, &po) != DSC_OK) {
    dsc_module_free(m);
    return NULL;
  }
  return m;
}

/* ---- comparing a result with its reference ---- */

typedef struct {
  double err;   /* max |got - ref|; a NaN on one side only: infinity */
  double scale; /* max |ref| */
  int64_t at;   /* where err is, -1 when every element agrees exactly */
  bool nonzero; /* some ref element is not 0 */
} test_diff;

static inline test_diff test_compare(const double *ref, const double *got, int64_t n) {
  test_diff r = {0, 0, -1, false};
  for (int64_t j = 0; j < n; j++) {
    double a = ref[j], b = got[j];
    double e = (isnan(a) && isnan(b)) ? 0 : isnan(a) != isnan(b) ? INFINITY : fabs(a - b);
    if (!isnan(a)) r.scale = fmax(r.scale, fabs(a));
    r.nonzero = r.nonzero || a != 0;
    if (e > r.err || isnan(e)) r.err = e, r.at = j;
  }
  return r;
}

/* The error relative to the reference's largest magnitude (norm-wise). */
static inline double test_normwise(test_diff d) { return d.err / fmax(d.scale, 1e-30); }

/* Two curves (losses per step): the worst relative difference, a NaN
 * counting as worst, and its step in *at (may be NULL). */
static inline double test_curve_diff(const double *ref, const double *got, int n, int *at) {
  double worst = 0;
  for (int s = 0; s < n; s++) {
    double e = fabs(got[s] - ref[s]) / fabs(ref[s]);
    if (!(e <= worst)) {
      worst = e;
      if (at) *at = s;
    }
  }
  return worst;
}

#ifdef __cplusplus
#include <string>

/* Every diagnostic of ctx, located, one per line. */
inline std::string diags(const dsc_context *ctx) {
  std::string s;
  for (int i = 0; ctx && i < dsc_diag_count(ctx); i++) {
    char where[512];
    const dsc_diag *d = dsc_diag_get(ctx, i);
    test_diag_where(d, where, sizeof where);
    s += std::string(where) + d->message + "\n";
  }
  return s;
}
#endif

#endif
