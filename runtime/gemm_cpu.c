/* GEMMs for the CPU executor, planned once per program instruction: f32 and
 * bf16 on AVX-512 and AVX2 hosts through dsc's packed GEMM (runtime/sgemm.c,
 * the kernel cg_cpu_isa_get() names) on our pool; other dtypes and baseline
 * hosts through oneDNN (dnnl_sgemm or matmul primitives), with a blocked C
 * loop for what oneDNN refuses.
 *
 * Threading (found on Debian 12's libdnnl 2.6): DNNL_CPU_THREADING_RUNTIME is
 * OMP and libdnnl.so links libgomp, so oneDNN runs its own OpenMP team, not
 * our pool. omp_set_num_threads acts on the calling thread's ICV, and oneDNN
 * picks its blocking from omp_get_max_threads() when the primitive is created,
 * so both plan creation and every run set it to the pool's thread count. */
#include <inttypes.h>
#include <math.h>
#include <string.h>

#include "runtime/runtime.h"

#ifdef DSC_HAVE_LLVM
#include <dnnl.h>
#include <dnnl_debug.h>
#if defined(_OPENMP) && DNNL_CPU_THREADING_RUNTIME == DNNL_RUNTIME_OMP
#include <omp.h>
#define RT_GEMM_OMP 1
#endif
#endif

struct rt_gemm_engine {
  dsc_context *ctx;
  rt_pool *pool;
  int n_threads;
  /* packing scratch of rt_sgemm, shared by the engine's plans (runs never
   * overlap): n_threads slots of sg_per_thread floats, grown at planning */
  void *sg_raw;
  size_t sg_bytes;
  float *sg_scratch;
  int64_t sg_per_thread;
#ifdef DSC_HAVE_LLVM
  dnnl_engine_t engine;
  dnnl_stream_t stream;
#endif
};

struct rt_gemm_plan {
  rt_gemm_engine *e;
  cg_gemm g;
  dsc_dtype ab, c;
  char impl[72];
  bool dsc_sgemm; /* through rt_sgemm_typed (runtime/sgemm.c) */
  rt_sgemm_kernel kernel; /* its kernel, fixed at planning */
  /* the C loop's job (set per run) */
  const char *pa, *pb;
  char *pc;
#ifdef DSC_HAVE_LLVM
  bool sgemm;            /* f32 through dnnl_sgemm (one call per batch) */
  char ta, tb;           /* its transposes ('N'/'T') and leading dims */
  int64_t lda, ldb, ldc;
  dnnl_primitive_t prim; /* NULL (and !sgemm): the C loop */
  dnnl_memory_t ma, mb, mc, ms;
  void *scratch_raw;
  size_t scratch_bytes;
#endif
};


rt_gemm_engine *rt_gemm_engine_new(dsc_context *ctx, rt_pool *pool) {
  rt_gemm_engine *e = ir_alloc(ctx, sizeof *e);
  if (!e) {
    ir_error(ctx, ir_no_loc, "out of memory creating the GEMM engine");
    return NULL;
  }
  memset(e, 0, sizeof *e);
  e->ctx = ctx;
  e->pool = pool;
  e->n_threads = rt_pool_threads(pool);
#ifdef DSC_HAVE_LLVM
  dnnl_status_t st = dnnl_engine_create(&e->engine, dnnl_cpu, 0);
  if (st == dnnl_success) st = dnnl_stream_create(&e->stream, e->engine, dnnl_stream_default_flags);
  if (st != dnnl_success) {
    ir_error(ctx, ir_no_loc, "oneDNN: cannot create the CPU engine: %s", dnnl_status2str(st));
    rt_gemm_engine_free(e);
    return NULL;
  }
#endif
  return e;
}

int64_t rt_gemm_engine_scratch_resident(const rt_gemm_engine *e) {
  return e && e->sg_raw ? rt_resident_bytes(e->sg_raw, e->sg_bytes) : 0;
}

void rt_gemm_engine_free(rt_gemm_engine *e) {
  if (!e) return;
  if (e->sg_raw) ir_free(e->ctx, e->sg_raw, e->sg_bytes);
#ifdef DSC_HAVE_LLVM
  if (e->stream) dnnl_stream_destroy(e->stream);
  if (e->engine) dnnl_engine_destroy(e->engine);
#endif
  ir_free(e->ctx, e, sizeof *e);
}

static bool check_gemm(dsc_context *ctx, const cg_gemm *g, dsc_dtype ab, dsc_dtype c) {
  const char *what = NULL;
  if (g->m < 1 || g->n < 1 || g->k < 1 || g->batch[0] < 1 || g->batch[1] < 1)
    what = "sizes must be positive";
  else if (!dsc_dtype_is_float(ab) || !dsc_dtype_is_float(c))
    what = "operands must have float dtypes";
  else if (g->c.batch_stride[0] == 0 && g->batch[0] > 1)
    what = "C cannot be broadcast over a batch dim";
  else if (g->c.batch_stride[1] == 0 && g->batch[1] > 1)
    what = "C cannot be broadcast over a batch dim";
  const cg_matrix *ms[3] = {&g->a, &g->b, &g->c};
  for (int i = 0; i < 3 && !what; i++) {
    const cg_matrix *x = ms[i];
    if (x->offset < 0 || x->batch_stride[0] < 0 || x->batch_stride[1] < 0 || x->row_stride < 0 ||
        x->col_stride < 0)
      what = "offsets and strides must be non-negative";
  }
  if (what) {
    ir_error(ctx, ir_no_loc,
             "GEMM %" PRId64 "x%" PRId64 "x%" PRId64 " (batch %" PRId64 "x%" PRId64 "): %s", g->m,
             g->n, g->k, g->batch[0], g->batch[1], what);
    return false;
  }
  return true;
}

/* ---- the C loop ---- */



#define RT_GEMM_JB 256 /* columns of C per block (1 KiB of f32: L1) */
#define RT_GEMM_PB 128 /* depth per block: a 128 KiB panel of B stays in L2 */

/* Rows [i0, i1) of one batch of C for f32 operands. C is first scaled by
 * beta; then, per (column block, depth block), every row accumulates
 * alpha * A[i, p] * B[p, jb] in a local block, so the panel of B is reused
 * by all rows while it is in cache. */
static void rows_f32(const cg_gemm *g, const float *a, const float *b, float *c, int64_t i0,
                     int64_t i1) {
  float alpha = (float)g->alpha, beta = (float)g->beta;
  int64_t ars = g->a.row_stride, acs = g->a.col_stride, brs = g->b.row_stride;
  int64_t bcs = g->b.col_stride, crs = g->c.row_stride, ccs = g->c.col_stride;
  for (int64_t i = i0; i < i1; i++)
    for (int64_t j = 0; j < g->n; j++) {
      float *cj = c + i * crs + j * ccs;
      *cj = beta == 0 ? 0.0f : beta * *cj; /* beta 0 never reads C (it may be garbage) */
    }
  float acc[RT_GEMM_JB];
  for (int64_t j0 = 0; j0 < g->n; j0 += RT_GEMM_JB) {
    int64_t jn = g->n - j0 < RT_GEMM_JB ? g->n - j0 : RT_GEMM_JB;
    for (int64_t p0 = 0; p0 < g->k; p0 += RT_GEMM_PB) {
      int64_t p1 = p0 + RT_GEMM_PB < g->k ? p0 + RT_GEMM_PB : g->k;
      for (int64_t i = i0; i < i1; i++) {
        float *ci = c + i * crs + j0 * ccs;
        for (int64_t j = 0; j < jn; j++) acc[j] = ci[j * ccs];
        for (int64_t p = p0; p < p1; p++) {
          float av = alpha * a[i * ars + p * acs];
          const float *bp = b + p * brs + j0 * bcs;
          if (bcs == 1 && jn == RT_GEMM_JB) {
            /* a constant trip count: vectorised even by -O2's cheap cost model */
            for (int j = 0; j < RT_GEMM_JB; j++) acc[j] += av * bp[j];
          } else {
            for (int64_t j = 0; j < jn; j++) acc[j] += av * bp[j * bcs];
          }
        }
        for (int64_t j = 0; j < jn; j++) ci[j * ccs] = acc[j];
      }
    }
  }
}

/* Any float dtypes: double accumulation, one element at a time. */

/* Element i of a buffer of dtype dt (program/elem.c). */
static double load_elem(const char *base, dsc_dtype dt, int64_t i) {
  return cg_load_elem(dt, base + i * (int64_t)dsc_dtype_size(dt));
}

static void store_elem(char *base, dsc_dtype dt, int64_t i, double v) {
  cg_store_elem(dt, base + i * (int64_t)dsc_dtype_size(dt), v);
}

static void rows_generic(const rt_gemm_plan *pl, int64_t ao, int64_t bo, int64_t co, int64_t i0,
                         int64_t i1) {
  const cg_gemm *g = &pl->g;
  for (int64_t i = i0; i < i1; i++)
    for (int64_t j = 0; j < g->n; j++) {
      double s = 0;
      for (int64_t p = 0; p < g->k; p++)
        s += load_elem(pl->pa, pl->ab, ao + i * g->a.row_stride + p * g->a.col_stride) *
             load_elem(pl->pb, pl->ab, bo + p * g->b.row_stride + j * g->b.col_stride);
      int64_t cj = co + i * g->c.row_stride + j * g->c.col_stride;
      double v = g->alpha * s;
      if (g->beta != 0) v += g->beta * load_elem(pl->pc, pl->c, cj);
      store_elem(pl->pc, pl->c, cj, v);
    }
}

/* Rows [begin, end) of the flattened (batch0, batch1, m) rows of C, cut
 * into runs within one batch. */
static void loop_rows(void *arg, int64_t begin, int64_t end, int chunk) {
  (void)chunk;
  const rt_gemm_plan *pl = arg;
  const cg_gemm *g = &pl->g;
  for (int64_t r = begin; r < end;) {
    int64_t bb = r / g->m, i0 = r % g->m;
    int64_t i1 = end - bb * g->m < g->m ? end - bb * g->m : g->m;
    int64_t b1 = bb % g->batch[1], b0 = bb / g->batch[1];
    int64_t ao = g->a.offset + b0 * g->a.batch_stride[0] + b1 * g->a.batch_stride[1];
    int64_t bo = g->b.offset + b0 * g->b.batch_stride[0] + b1 * g->b.batch_stride[1];
    int64_t co = g->c.offset + b0 * g->c.batch_stride[0] + b1 * g->c.batch_stride[1];
    if (pl->ab == DSC_F32 && pl->c == DSC_F32)
      rows_f32(g, (const float *)pl->pa + ao, (const float *)pl->pb + bo, (float *)pl->pc + co, i0,
               i1);
    else
      rows_generic(pl, ao, bo, co, i0, i1);
    r += i1 - i0;
  }
}

static void run_loop(rt_gemm_plan *pl) {
  const cg_gemm *g = &pl->g;
  int64_t rows = g->batch[0] * g->batch[1] * g->m;
  /* at least ~64K multiply-adds per chunk */
  int64_t per_row = g->n * g->k, min_rows = per_row >= 65536 ? 1 : 65536 / per_row;
  rt_pool_parallel_for(pl->e->pool, rows, min_rows, loop_rows, pl);
}

/* ---- oneDNN ---- */

#ifdef DSC_HAVE_LLVM
static void set_threads(const rt_gemm_engine *e) {
#ifdef RT_GEMM_OMP
  if (omp_get_max_threads() != e->n_threads) omp_set_num_threads(e->n_threads);
#else
  (void)e;
#endif
}

static bool dnnl_dtype(dsc_dtype dt, dnnl_data_type_t *out) {
  switch (dt) {
    case DSC_F32:
      *out = dnnl_f32;
      return true;
    case DSC_BF16:
      *out = dnnl_bf16;
      return true;
    case DSC_F16:
      *out = dnnl_f16;
      return true;
    default:
      return false;
  }
}

/* The memory descriptor of one operand: [batch dims > 1..., rows, cols].
 * A batch dim the operand broadcasts (stride 0) has size 1 there, as oneDNN
 * wants; every size-1 dim gets a harmless stride (the largest extent), since
 * a stride of 0 or a huge one could fail oneDNN's layout checks. */
static dnnl_status_t operand_md(const cg_gemm *g, const cg_matrix *x, int64_t rows, int64_t cols,
                                dnnl_data_type_t dt, dnnl_memory_desc_t *md) {
  dnnl_dims_t dims, strides;
  int nd = 0;
  for (int d = 0; d < 2; d++) {
    if (g->batch[d] == 1) continue;
    dims[nd] = x->batch_stride[d] == 0 ? 1 : g->batch[d];
    strides[nd++] = x->batch_stride[d];
  }
  dims[nd] = rows;
  strides[nd++] = x->row_stride;
  dims[nd] = cols;
  strides[nd++] = x->col_stride;
  int64_t span = 1;
  for (int d = 0; d < nd; d++)
    if (dims[d] > 1 && strides[d] * dims[d] > span) span = strides[d] * dims[d];
  for (int d = 0; d < nd; d++)
    if (dims[d] == 1) strides[d] = span;
  return dnnl_memory_desc_init_by_strides(md, nd, dims, dt, strides);
}

static void free_dnnl(rt_gemm_plan *pl) {
  if (pl->prim) dnnl_primitive_destroy(pl->prim);
  if (pl->ma) dnnl_memory_destroy(pl->ma);
  if (pl->mb) dnnl_memory_destroy(pl->mb);
  if (pl->mc) dnnl_memory_destroy(pl->mc);
  if (pl->ms) dnnl_memory_destroy(pl->ms);
  if (pl->scratch_raw) ir_free(pl->e->ctx, pl->scratch_raw, pl->scratch_bytes + 64);
  pl->prim = NULL;
  pl->ma = pl->mb = pl->mc = pl->ms = NULL;
  pl->scratch_raw = NULL;
}

/* Builds the primitive; false (no diagnostic) when oneDNN refuses the shape
 * or offers only its reference implementation for f32 (the C loop is
 * faster), so that the plan falls back to the loop. Out of memory is an
 * error (returned through *oom). */
static bool build_dnnl(rt_gemm_plan *pl, bool *oom) {
  const cg_gemm *g = &pl->g;
  dnnl_data_type_t tab, tc;
  if (!dnnl_dtype(pl->ab, &tab) || !dnnl_dtype(pl->c, &tc)) return false;
  dnnl_memory_desc_t mda, mdb, mdc;
  if (operand_md(g, &g->a, g->m, g->k, tab, &mda) != dnnl_success ||
      operand_md(g, &g->b, g->k, g->n, tab, &mdb) != dnnl_success ||
      operand_md(g, &g->c, g->m, g->n, tc, &mdc) != dnnl_success)
    return false;
  dnnl_matmul_desc_t desc;
  if (dnnl_matmul_desc_init(&desc, &mda, &mdb, NULL, &mdc) != dnnl_success) return false;
  dnnl_primitive_attr_t attr = NULL;
  dnnl_post_ops_t po = NULL;
  dnnl_primitive_desc_t pd = NULL;
  bool ok =
      dnnl_primitive_attr_create(&attr) == dnnl_success &&
      dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user) == dnnl_success;
  if (ok && g->alpha != 1) {
    float alpha = (float)g->alpha;
    ok = dnnl_primitive_attr_set_output_scales(attr, 1, 0, &alpha) == dnnl_success;
  }
  if (ok && g->beta != 0) {
    ok = dnnl_post_ops_create(&po) == dnnl_success &&
         dnnl_post_ops_append_sum(po, (float)g->beta) == dnnl_success &&
         dnnl_primitive_attr_set_post_ops(attr, po) == dnnl_success;
  }
  set_threads(pl->e);
  if (ok) ok = dnnl_primitive_desc_create(&pd, &desc, attr, pl->e->engine, NULL) == dnnl_success;
  if (po) dnnl_post_ops_destroy(po);
  if (attr) dnnl_primitive_attr_destroy(attr);
  if (!ok) return false;
  const char *impl = NULL;
  dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl);
  if (!impl) impl = "?";
  if (strncmp(impl, "ref", 3) == 0 && pl->ab == DSC_F32 && pl->c == DSC_F32) {
    dnnl_primitive_desc_destroy(pd);
    return false;
  }
  snprintf(pl->impl, sizeof pl->impl, "onednn:%s", impl);
  const dnnl_memory_desc_t *smd = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
  pl->scratch_bytes = smd ? dnnl_memory_desc_get_size(smd) : 0;
  ok = dnnl_primitive_create(&pl->prim, pd) == dnnl_success &&
       dnnl_memory_create(&pl->ma, &mda, pl->e->engine, DNNL_MEMORY_NONE) == dnnl_success &&
       dnnl_memory_create(&pl->mb, &mdb, pl->e->engine, DNNL_MEMORY_NONE) == dnnl_success &&
       dnnl_memory_create(&pl->mc, &mdc, pl->e->engine, DNNL_MEMORY_NONE) == dnnl_success;
  if (ok && pl->scratch_bytes > 0) {
    pl->scratch_raw = ir_alloc(pl->e->ctx, pl->scratch_bytes + 64);
    if (!pl->scratch_raw) {
      *oom = true;
      ok = false;
    } else {
      char *aligned = (char *)(((uintptr_t)pl->scratch_raw + 63) & ~(uintptr_t)63);
      ok = dnnl_memory_create(&pl->ms, smd, pl->e->engine, aligned) == dnnl_success;
    }
  }
  dnnl_primitive_desc_destroy(pd);
  if (!ok) free_dnnl(pl);
  return ok;
}
#endif

#ifdef DSC_HAVE_LLVM
/* f32 operands with a unit stride on one side go to dnnl_sgemm, oneDNN's
 * BLAS-style entry: on these machines it runs GPT-2's shapes at 240-330
 * GFLOP/s where the matmul primitive over the same strided descriptors
 * gave 120-220 (and far less for the per-head attention products). */
static bool sgemm_operand(const cg_matrix *x, char *trans, int64_t *ld, int64_t rows,
                          int64_t cols) {
  if (x->col_stride == 1 && (rows == 1 || x->row_stride >= cols)) {
    *trans = 'N';
    *ld = rows == 1 ? (cols > 0 ? cols : 1) : x->row_stride;
    return true;
  }
  if (x->row_stride == 1 && (cols == 1 || x->col_stride >= rows)) {
    *trans = 'T';
    *ld = cols == 1 ? (rows > 0 ? rows : 1) : x->col_stride;
    return true;
  }
  return false;
}

static bool plan_sgemm(rt_gemm_plan *pl) {
  const cg_gemm *g = &pl->g;
  if (pl->ab != DSC_F32 || pl->c != DSC_F32) return false;
  char tc;
  if (!sgemm_operand(&g->a, &pl->ta, &pl->lda, g->m, g->k) ||
      !sgemm_operand(&g->b, &pl->tb, &pl->ldb, g->k, g->n) ||
      !sgemm_operand(&g->c, &tc, &pl->ldc, g->m, g->n) || tc != 'N')
    return false;
  pl->sgemm = true;
  snprintf(pl->impl, sizeof pl->impl, "onednn:sgemm");
  return true;
}

static bool run_sgemm(rt_gemm_plan *p, const float *a, const float *b, float *c, char *err,
                      size_t errlen) {
  const cg_gemm *g = &p->g;
  set_threads(p->e);
  for (int64_t i = 0; i < g->batch[0]; i++)
    for (int64_t j = 0; j < g->batch[1]; j++) {
      const float *pa = a + g->a.offset + i * g->a.batch_stride[0] + j * g->a.batch_stride[1];
      const float *pb = b + g->b.offset + i * g->b.batch_stride[0] + j * g->b.batch_stride[1];
      float *pc = c + g->c.offset + i * g->c.batch_stride[0] + j * g->c.batch_stride[1];
      dnnl_status_t st = dnnl_sgemm(p->ta, p->tb, g->m, g->n, g->k, (float)g->alpha, pa, p->lda,
                                    pb, p->ldb, (float)g->beta, pc, p->ldc);
      if (st != dnnl_success)
        return ir_fail(err, errlen, "dnnl_sgemm failed: %s", dnnl_status2str(st));
    }
  return true;
}
#endif

/* f32 and bf16 on AVX-512 and AVX2 hosts: dsc's packed GEMM on the pool
 * (faster than oneDNN 2.6's sgemm and matmul here, far faster for bf16,
 * and bitwise independent of the thread count), with the kernel of
 * cg_cpu_isa_get() at planning. Grows the engine's scratch to what the
 * GEMM needs; false with *oom on allocation failure. */
static bool plan_dsc_sgemm(rt_gemm_plan *pl, int flags, bool *oom) {
  rt_gemm_engine *e = pl->e;
  cg_cpu_isa isa = cg_cpu_isa_get();
  if (!rt_sgemm_dtypes_supported(pl->ab, pl->c) || !rt_sgemm_isa_supported(isa)) return false;
  int64_t need = rt_sgemm_scratch_floats(&pl->g);
  if (need > e->sg_per_thread) {
    size_t bytes = (size_t)need * sizeof(float) * (size_t)e->n_threads + 64;
    void *raw = ir_alloc(e->ctx, bytes);
    if (!raw) {
      *oom = true;
      return false;
    }
    if (e->sg_raw) ir_free(e->ctx, e->sg_raw, e->sg_bytes);
    e->sg_raw = raw;
    e->sg_bytes = bytes;
    e->sg_scratch = (float *)(((uintptr_t)raw + 63) & ~(uintptr_t)63);
    e->sg_per_thread = need;
  }
  pl->dsc_sgemm = true;
  pl->kernel = rt_sgemm_kernel_for(isa, pl->ab, (flags & RT_GEMM_DPBF16) != 0);
  snprintf(pl->impl, sizeof pl->impl, "dsc:sgemm-%s%s", rt_sgemm_kernel_name(pl->kernel),
           pl->ab == DSC_BF16 && pl->kernel != RT_SGEMM_AVX512_DPBF16 ? "-bf16" : "");
  return true;
}

rt_gemm_plan *rt_gemm_plan_new(rt_gemm_engine *e, const cg_gemm *g, dsc_dtype ab, dsc_dtype c,
                               int flags) {
  if (!check_gemm(e->ctx, g, ab, c)) return NULL;
  rt_gemm_plan *pl = ir_alloc(e->ctx, sizeof *pl);
  if (!pl) {
    ir_error(e->ctx, ir_no_loc, "out of memory planning a GEMM");
    return NULL;
  }
  memset(pl, 0, sizeof *pl);
  pl->e = e;
  pl->g = *g;
  pl->ab = ab;
  pl->c = c;
  snprintf(pl->impl, sizeof pl->impl, "loop");
  bool oom = false;
  if (!(flags & RT_GEMM_NO_LIBRARY) && plan_dsc_sgemm(pl, flags, &oom)) return pl;
  if (oom) {
    ir_error(e->ctx, ir_no_loc, "out of memory planning a GEMM");
    rt_gemm_plan_free(pl);
    return NULL;
  }
#ifdef DSC_HAVE_LLVM
  if (!(flags & RT_GEMM_NO_LIBRARY) && plan_sgemm(pl)) return pl;
  if (!(flags & RT_GEMM_NO_LIBRARY) && !build_dnnl(pl, &oom) && oom) {
    ir_error(e->ctx, ir_no_loc, "out of memory planning a GEMM");
    rt_gemm_plan_free(pl);
    return NULL;
  }
#else
  (void)flags;
#endif
  return pl;
}

void rt_gemm_plan_free(rt_gemm_plan *p) {
  if (!p) return;
#ifdef DSC_HAVE_LLVM
  free_dnnl(p);
#endif
  ir_free(p->e->ctx, p, sizeof *p);
}

const char *rt_gemm_plan_impl(const rt_gemm_plan *p) { return p->impl; }

bool rt_gemm_run(rt_gemm_plan *p, const void *a, const void *b, void *c, char *err, size_t errlen) {
  if (p->dsc_sgemm) {
    rt_sgemm_typed(p->e->pool, &p->g, p->kernel, p->ab, p->c, a, b, c, p->e->sg_scratch,
                   p->e->sg_per_thread);
    return true;
  }
#ifdef DSC_HAVE_LLVM
  if (p->sgemm) return run_sgemm(p, a, b, c, err, errlen);
  if (p->prim) {
    size_t ea = dsc_dtype_size(p->ab), ec = dsc_dtype_size(p->c);
    dnnl_status_t st = dnnl_memory_set_data_handle(p->ma, (char *)a + p->g.a.offset * ea);
    if (st == dnnl_success) st = dnnl_memory_set_data_handle(p->mb, (char *)b + p->g.b.offset * ea);
    if (st == dnnl_success) st = dnnl_memory_set_data_handle(p->mc, (char *)c + p->g.c.offset * ec);
    dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, p->ma},
                               {DNNL_ARG_WEIGHTS, p->mb},
                               {DNNL_ARG_DST, p->mc},
                               {DNNL_ARG_SCRATCHPAD, p->ms}};
    set_threads(p->e);
    if (st == dnnl_success) st = dnnl_primitive_execute(p->prim, p->e->stream, p->ms ? 4 : 3, args);
    if (st == dnnl_success) st = dnnl_stream_wait(p->e->stream);
    if (st != dnnl_success)
      return ir_fail(err, errlen, "oneDNN matmul failed: %s", dnnl_status2str(st));
    return true;
  }
#endif
  (void)err;
  (void)errlen;
  p->pa = a;
  p->pb = b;
  p->pc = c;
  run_loop(p);
  return true;
}
