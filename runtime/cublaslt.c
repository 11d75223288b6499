/* runtime/cublaslt.c: a cg_gemm as cuBLASLt matmul and layout descriptors
 * (the mapping is documented at rt_cublaslt_plan in runtime/cuda_api.h). Building a
 * plan needs no GPU: descriptor creation is host-only in cuBLASLt (checked
 * on a machine without a driver); only rt_cublaslt_run touches a device. */
#include "runtime/cuda_api.h"

#ifdef DSC_HAVE_CUDA
#include <cublasLt.h>
#include <string.h>

/* Checks one cuBLASLt call; the diagnostic names the function (the call's
 * text up to its parenthesis). */
#define LT_CHECK(ctx, call)                                                                        \
  do {                                                                                             \
    cublasStatus_t st_ = (call);                                                                   \
    if (st_ != CUBLAS_STATUS_SUCCESS) {                                                            \
      ir_error((ctx), ir_no_loc, "cublaslt: %.*s failed: %s", (int)strcspn(#call, "("), #call,     \
               cublasLtGetStatusName(st_));                                                        \
      goto fail;                                                                                   \
    }                                                                                              \
  } while (0)

/* A dsc operand (r x c, strides rs, cs) as a column-major cuBLASLt layout:
 * a unit column stride stores X^T (c x r, ld = rs), a unit row stride X
 * itself (r x c, ld = cs). A size-1 dim makes its stride irrelevant. */
typedef struct {
  bool holds_transpose; /* the layout is X^T */
  int64_t rows, cols, ld;
} lt_view;

static bool view_of(int64_t r, int64_t c, int64_t rs, int64_t cs, lt_view *v) {
  if ((cs == 1 || c == 1) && (r == 1 || rs >= c)) {
    *v = (lt_view){true, c, r, r == 1 ? c : rs};
    return true;
  }
  if ((rs == 1 || r == 1) && (c == 1 || cs >= r)) {
    *v = (lt_view){false, r, c, c == 1 ? r : cs};
    return true;
  }
  return false;
}

static cudaDataType_t lt_dtype(dsc_dtype dt) {
  switch (dt) {
  case DSC_BF16: return CUDA_R_16BF;
  case DSC_F16: return CUDA_R_16F;
  default: return CUDA_R_32F;
  }
}

void rt_cublaslt_plan_destroy(rt_cublaslt_plan *p) {
  for (int i = 0; i < 3; i++)
    if (p->layout[i]) cublasLtMatrixLayoutDestroy((cublasLtMatrixLayout_t)p->layout[i]);
  if (p->desc) cublasLtMatmulDescDestroy((cublasLtMatmulDesc_t)p->desc);
  memset(p, 0, sizeof *p);
}

dsc_status rt_cublaslt_plan_init(dsc_context *ctx, const cg_gemm *g, dsc_dtype ab, dsc_dtype c,
                                 rt_gemm_precision prec, rt_cublaslt_plan *p) {
  memset(p, 0, sizeof *p);
  /* Precision and dtypes. */
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  bool dtypes_ok;
  switch (prec) {
  case RT_GEMM_F32: dtypes_ok = ab == DSC_F32 && c == DSC_F32; break;
  case RT_GEMM_TF32:
    compute = CUBLAS_COMPUTE_32F_FAST_TF32;
    dtypes_ok = ab == DSC_F32 && c == DSC_F32;
    break;
  case RT_GEMM_BF16: dtypes_ok = ab == DSC_BF16 && (c == DSC_BF16 || c == DSC_F32); break;
  case RT_GEMM_F16: dtypes_ok = ab == DSC_F16 && (c == DSC_F16 || c == DSC_F32); break;
  default: dtypes_ok = false;
  }
  if (!dtypes_ok) {
    ir_error(ctx, ir_no_loc, "cublaslt: precision %d does not take %s inputs and a %s output",
             (int)prec, dsc_dtype_name(ab), dsc_dtype_name(c));
    return DSC_ERR_INTERNAL;
  }
  if (g->m < 1 || g->n < 1 || g->k < 1 || g->batch[0] < 1 || g->batch[1] < 1) {
    ir_error(ctx, ir_no_loc, "cublaslt: empty or negative gemm %lld x %lld x %lld (batch %lld x %lld)",
             (long long)g->m, (long long)g->n, (long long)g->k, (long long)g->batch[0],
             (long long)g->batch[1]);
    return DSC_ERR_INTERNAL;
  }

  /* Column-major views of the three operands. */
  const cg_matrix *mats[3] = {&g->a, &g->b, &g->c};
  const int64_t dims[3][2] = {{g->m, g->k}, {g->k, g->n}, {g->m, g->n}};
  lt_view v[3];
  for (int i = 0; i < 3; i++) {
    if (!view_of(dims[i][0], dims[i][1], mats[i]->row_stride, mats[i]->col_stride, &v[i])) {
      ir_error(ctx, ir_no_loc,
               "cublaslt: gemm operand %c (%lld x %lld, strides %lld, %lld) has no unit stride "
               "with non-overlapping rows or columns: it needs a contiguous copy",
               "ABC"[i], (long long)dims[i][0], (long long)dims[i][1],
               (long long)mats[i]->row_stride, (long long)mats[i]->col_stride);
      return DSC_ERR_INTERNAL;
    }
  }
  /* A row-major C is stored as C^T: compute C^T = B^T A^T (swap A and B).
   * cuBLASLt's operand i is dsc's src[i]; it wants `want_t[i]` (the
   * transpose of dsc's matrix when swapped), so op T is needed exactly when
   * the layout holds the other orientation. */
  p->swapped = v[2].holds_transpose;
  const int src[3] = {p->swapped ? 1 : 0, p->swapped ? 0 : 1, 2};
  for (int i = 0; i < 2; i++) {
    const lt_view *w = &v[src[i]];
    p->trans[i] = w->holds_transpose == p->swapped ? CUBLAS_OP_N : CUBLAS_OP_T;
  }
  for (int i = 0; i < 3; i++) {
    const lt_view *w = &v[src[i]];
    p->rows[i] = w->rows, p->cols[i] = w->cols, p->ld[i] = w->ld;
    p->offset[i] = mats[src[i]]->offset;
    p->elem_size[i] = dsc_dtype_size(i == 2 ? c : ab);
  }

  /* Batch dims: one strided batch when the outer stride is the inner
   * stride times the inner count for all three operands. */
  const int64_t b0 = g->batch[0], b1 = g->batch[1];
  bool collapse = b0 == 1 || b1 == 1;
  if (!collapse) {
    collapse = true;
    for (int i = 0; i < 3; i++)
      collapse = collapse && mats[i]->batch_stride[0] == b1 * mats[i]->batch_stride[1];
  }
  p->outer_count = collapse ? 1 : b0;
  p->batch_count = collapse ? b0 * b1 : b1;
  for (int i = 0; i < 3; i++) {
    const cg_matrix *mt = mats[src[i]];
    p->batch_stride[i] = b1 == 1 ? mt->batch_stride[0] : mt->batch_stride[1];
    p->outer_stride[i] = collapse ? 0 : mt->batch_stride[0];
  }
  if ((p->batch_count > 1 && p->batch_stride[2] == 0) ||
      (p->outer_count > 1 && p->outer_stride[2] == 0)) {
    ir_error(ctx, ir_no_loc, "cublaslt: gemm output C has a zero batch stride (batches would "
                             "overwrite each other)");
    return DSC_ERR_INTERNAL;
  }
  if (p->batch_count > INT32_MAX) {
    ir_error(ctx, ir_no_loc, "cublaslt: batch count %lld exceeds cuBLASLt's int32 limit",
             (long long)p->batch_count);
    return DSC_ERR_INTERNAL;
  }
  p->alpha = (float)g->alpha, p->beta = (float)g->beta;

  /* The descriptors. */
  cublasLtMatmulDesc_t desc = NULL;
  LT_CHECK(ctx, cublasLtMatmulDescCreate(&desc, compute, CUDA_R_32F));
  p->desc = desc;
  cublasOperation_t ta = (cublasOperation_t)p->trans[0], tb = (cublasOperation_t)p->trans[1];
  LT_CHECK(ctx, cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  LT_CHECK(ctx, cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  for (int i = 0; i < 3; i++) {
    cublasLtMatrixLayout_t l = NULL;
    LT_CHECK(ctx, cublasLtMatrixLayoutCreate(&l, lt_dtype(i == 2 ? c : ab), (uint64_t)p->rows[i],
                                             (uint64_t)p->cols[i], p->ld[i]));
    p->layout[i] = l;
    if (p->batch_count > 1) {
      int32_t count = (int32_t)p->batch_count;
      int64_t stride = p->batch_stride[i];
      LT_CHECK(ctx, cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                                     sizeof count));
      LT_CHECK(ctx, cublasLtMatrixLayoutSetAttribute(
                        l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride));
    }
  }
  return DSC_OK;
fail:
  rt_cublaslt_plan_destroy(p);
  return DSC_ERR_INTERNAL;
}

dsc_status rt_cublaslt_run(dsc_context *ctx, rt_cublaslt_plan *p, void *handle, void *stream,
                           const void *a, const void *b, void *c, void *workspace,
                           size_t workspace_bytes) {
  cublasLtHandle_t h = (cublasLtHandle_t)handle;
  cublasLtMatmulDesc_t desc = (cublasLtMatmulDesc_t)p->desc;
  cublasLtMatrixLayout_t la = p->layout[0], lb = p->layout[1], lc = p->layout[2];
  cublasLtMatmulPreference_t pref = NULL;
  if (!desc || !la || !lb || !lc) {
    ir_error(ctx, ir_no_loc, "cublaslt: run of an uninitialised plan");
    return DSC_ERR_INTERNAL;
  }
  if (!p->has_algo) {
    uint64_t ws = workspace ? workspace_bytes : 0;
    cublasLtMatmulHeuristicResult_t result;
    int found = 0;
    LT_CHECK(ctx, cublasLtMatmulPreferenceCreate(&pref));
    LT_CHECK(ctx, cublasLtMatmulPreferenceSetAttribute(
                      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    LT_CHECK(ctx, cublasLtMatmulAlgoGetHeuristic(h, desc, la, lb, lc, lc, pref, 1, &result,
                                                 &found));
    cublasLtMatmulPreferenceDestroy(pref);
    pref = NULL;
    if (found < 1) {
      const int64_t k = p->trans[0] == CUBLAS_OP_N ? p->cols[0] : p->rows[0];
      ir_error(ctx, ir_no_loc, "cublaslt: no algorithm for a %lld x %lld x %lld matmul",
               (long long)p->rows[2], (long long)p->cols[2], (long long)k);
      return DSC_ERR_INTERNAL;
    }
    _Static_assert(sizeof result.algo == sizeof p->algo, "cublasLtMatmulAlgo_t size");
    memcpy(p->algo, &result.algo, sizeof p->algo);
    p->has_algo = true;
  }
  cublasLtMatmulAlgo_t algo;
  memcpy(&algo, p->algo, sizeof algo);
  /* cuBLASLt's A, B, C are dsc's (B, A, C) when swapped. */
  const void *base[3] = {p->swapped ? b : a, p->swapped ? a : b, c};
  for (int64_t o = 0; o < p->outer_count; o++) {
    const char *ptr[3];
    for (int i = 0; i < 3; i++)
      ptr[i] = (const char *)base[i] +
               (size_t)(p->offset[i] + o * p->outer_stride[i]) * p->elem_size[i];
    LT_CHECK(ctx, cublasLtMatmul(h, desc, &p->alpha, ptr[0], la, ptr[1], lb, &p->beta, ptr[2], lc,
                                 (void *)ptr[2], lc, &algo, workspace, workspace ? workspace_bytes : 0,
                                 (cudaStream_t)stream));
  }
  return DSC_OK;
fail:
  if (pref) cublasLtMatmulPreferenceDestroy(pref);
  return DSC_ERR_INTERNAL;
}

#endif /* DSC_HAVE_CUDA */
