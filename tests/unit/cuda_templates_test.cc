// Hand-written CUDA templates (codegen/cuda_templates.c, kernels/ .cuh) and
// the cuBLASLt GEMM plans (codegen/cublaslt.c). No GPU here: the templates
// are NVRTC-compiled for sm_90 and checked by name in the PTX; the plans are
// checked by reading the cuBLASLt descriptors back and running the
// column-major matmul they describe on the host. The kernels' math is stated
// by the references in cuda_reference.h, themselves checked here.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "codegen/codegen.h"
#include "cuda_reference.h"
#include "runtime/cuda_api.h"

#ifdef DSC_HAVE_CUDA
#include <cublasLt.h>
#include "tests/unit/test_util.h"
#endif

namespace {

struct Env {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  ir_arena a;
  Env() { ir_arena_init(&a, ctx); }
  ~Env() {
    ir_arena_release(&a);
    dsc_context_free(ctx);
  }
};

std::vector<float> randn(size_t n, unsigned seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (auto &x : v) x = u(rng);
  return v;
}

cg_cuda_template_params params(dsc_dtype dt, dsc_dtype idx = DSC_I32, int hd = 64) {
  cg_cuda_template_params p;
  p.dtype = dt;
  p.index_dtype = idx;
  p.head_dim = hd;
  return p;
}

// ---------------- registry ----------------

TEST(CudaTemplates, EntryNamesFollowTemplateDtypeAndParams) {
  char name[128], err[256];
  cg_cuda_template_params p = params(DSC_BF16);
  ASSERT_TRUE(cg_cuda_entry_name(CG_ENTRY_LAYERNORM_BWD_DWDB, &p, name, sizeof name, err, sizeof err));
  EXPECT_STREQ(name, "dsc_layernorm_bwd_dwdb_bf16");
  p = params(DSC_F32, DSC_I64);
  ASSERT_TRUE(cg_cuda_entry_name(CG_ENTRY_SOFTMAX_CE_FWD, &p, name, sizeof name, err, sizeof err));
  EXPECT_STREQ(name, "dsc_softmax_ce_fwd_f32_i64");
  p = params(DSC_F16, DSC_I32, 128);
  ASSERT_TRUE(cg_cuda_entry_name(CG_ENTRY_ATTENTION_BWD_DKDV, &p, name, sizeof name, err, sizeof err));
  EXPECT_STREQ(name, "dsc_attention_bwd_dkdv_f16_hd128");
  for (int e = 0; e < CG_ENTRY_COUNT; e++) {
    cg_cuda_template_id t = cg_cuda_entry_template((cg_cuda_entry)e);
    ASSERT_LT(t, CG_TPL_COUNT) << e;
    const cg_cuda_template *info = cg_cuda_template_info(t);
    EXPECT_GE(e, (int)info->first_entry);
    EXPECT_LT(e, (int)info->first_entry + info->n_entries);
    EXPECT_NE(cg_cuda_kernel_file(info->file), nullptr) << info->file;
  }
  EXPECT_EQ(cg_cuda_entry_template(CG_ENTRY_COUNT), CG_TPL_COUNT);
  EXPECT_EQ(cg_cuda_kernel_file("nope.cuh"), nullptr);
}

TEST(CudaTemplates, UnsupportedParamsAreRejectedWithAReason) {
  char buf[64], err[256];
  cg_cuda_template_params p = params(DSC_I32);
  EXPECT_FALSE(cg_cuda_template_suffix(CG_TPL_LAYERNORM, &p, buf, sizeof buf, err, sizeof err));
  EXPECT_NE(std::string(err).find("element dtype i32"), std::string::npos) << err;
  p = params(DSC_F32, DSC_F32);
  EXPECT_FALSE(cg_cuda_template_suffix(CG_TPL_SOFTMAX_CE, &p, buf, sizeof buf, err, sizeof err));
  EXPECT_NE(std::string(err).find("target dtype f32"), std::string::npos) << err;
  for (int hd : {0, 129}) {
    p = params(DSC_F32, DSC_I32, hd);
    EXPECT_FALSE(cg_cuda_template_suffix(CG_TPL_ATTENTION, &p, buf, sizeof buf, err, sizeof err));
    EXPECT_NE(std::string(err).find("head dim"), std::string::npos) << err;
  }
  Env env;
  EXPECT_EQ(cg_cuda_template_source(&env.a, CG_TPL_ADAMW, &p, 0, err, sizeof err), nullptr);
  EXPECT_EQ(cg_cuda_template_source(&env.a, CG_TPL_COUNT, &p, 1, err, sizeof err), nullptr);
}

TEST(CudaTemplates, SourceInlinesIncludesAndInstantiatesEachParamSetOnce) {
  Env env;
  char err[256];
  cg_cuda_template_params ps[3] = {params(DSC_F32), params(DSC_BF16), params(DSC_F32)};
  char *src = cg_cuda_template_source(&env.a, CG_TPL_LAYERNORM, ps, 3, err, sizeof err);
  ASSERT_NE(src, nullptr) << err;
  std::string s(src);
  EXPECT_EQ(s.find("#include"), std::string::npos) << "NVRTC gets no include path";
  EXPECT_NE(s.find("struct __align__(2) dsc_bf16"), std::string::npos);  // common.cuh inlined
  EXPECT_NE(s.find("DSC_LAYERNORM_INSTANTIATE(float, f32)"), std::string::npos);
  EXPECT_NE(s.find("DSC_LAYERNORM_INSTANTIATE(dsc_bf16, bf16)"), std::string::npos);
  size_t first = s.find("DSC_LAYERNORM_INSTANTIATE(float, f32)");
  EXPECT_EQ(s.find("DSC_LAYERNORM_INSTANTIATE(float, f32)", first + 1), std::string::npos);
}

TEST(CudaTemplates, LaunchConfigurationsForGpt2Sizes) {
  char err[256];
  cg_cuda_launch l;
  cg_cuda_template_sizes s = {};
  cg_cuda_template_params p = params(DSC_F32);
  // Softmax+CE: a block per row of 50304 logits, 4 floats per 16-byte load.
  s.rows = 256, s.cols = 50304;
  ASSERT_TRUE(cg_cuda_template_launch(CG_ENTRY_SOFTMAX_CE_FWD, &p, &s, &l, err, sizeof err)) << err;
  EXPECT_EQ(l.grid[0], 256u);
  EXPECT_EQ(l.block[0], 512u);
  EXPECT_EQ(l.block[0] % 32, 0u);
  ASSERT_TRUE(cg_cuda_template_launch(CG_ENTRY_CE_LOSS_MEAN, &p, &s, &l, err, sizeof err));
  EXPECT_EQ(l.grid[0], 1u);
  EXPECT_EQ(l.block[0], 256u);
  // Layernorm: the row cached in shared memory (C floats), bwd 2C.
  s.rows = 256, s.cols = 768;
  ASSERT_TRUE(cg_cuda_template_launch(CG_ENTRY_LAYERNORM_FWD, &p, &s, &l, err, sizeof err));
  EXPECT_EQ(l.grid[0], 256u);
  EXPECT_EQ(l.shared_bytes, 768u * 4);
  ASSERT_TRUE(cg_cuda_template_launch(CG_ENTRY_LAYERNORM_BWD, &p, &s, &l, err, sizeof err));
  EXPECT_EQ(l.shared_bytes, 768u * 8);
  int64_t rpb, parts;
  cg_cuda_layernorm_bwd_split(1000, &rpb, &parts);
  EXPECT_EQ(rpb, 4);
  EXPECT_EQ(parts, 250);
  EXPECT_GE(rpb * parts, 1000);
  s.cols = 12288;  // 2 x 48 KiB: beyond the default shared memory limit
  EXPECT_FALSE(cg_cuda_template_launch(CG_ENTRY_LAYERNORM_BWD, &p, &s, &l, err, sizeof err));
  EXPECT_NE(std::string(err).find("shared memory"), std::string::npos) << err;
  // Attention: 16 queries per forward block, 8 rows per backward block.
  s = {};
  s.batch = 4, s.seq = 64, s.heads = 12;
  ASSERT_TRUE(cg_cuda_template_launch(CG_ENTRY_ATTENTION_FWD, &p, &s, &l, err, sizeof err));
  EXPECT_EQ(l.grid[0], 4u);
  EXPECT_EQ(l.grid[1], 48u);
  EXPECT_EQ(l.block[0], 128u);
  ASSERT_TRUE(cg_cuda_template_launch(CG_ENTRY_ATTENTION_BWD_DKDV, &p, &s, &l, err, sizeof err));
  EXPECT_EQ(l.grid[0], 8u);
  ASSERT_TRUE(cg_cuda_template_launch(CG_ENTRY_ATTENTION_BWD_PRE, &p, &s, &l, err, sizeof err));
  EXPECT_EQ(l.grid[0], 4u * 64 * 12 / 4);
  s.heads = 0;
  EXPECT_FALSE(cg_cuda_template_launch(CG_ENTRY_ATTENTION_FWD, &p, &s, &l, err, sizeof err));
  // AdamW: one launch for all tensors, grid y = tensors.
  s = {};
  s.n_tensors = 148, s.max_numel = 50304 * 768;
  ASSERT_TRUE(cg_cuda_template_launch(CG_ENTRY_ADAMW, &p, &s, &l, err, sizeof err));
  EXPECT_EQ(l.grid[1], 148u);
  EXPECT_EQ(l.grid[0], 4096u);
  s.n_tensors = 0;
  EXPECT_FALSE(cg_cuda_template_launch(CG_ENTRY_ADAMW, &p, &s, &l, err, sizeof err));
}

#ifdef DSC_HAVE_CUDA
// Compiles the given templates' sources as one NVRTC program and checks
// every entry point is in the PTX and the cubin is an ELF file.
void compile_and_check(const std::vector<std::pair<cg_cuda_template_id, cg_cuda_template_params>> &inst,
                       const char *name) {
  Env env;
  char err[256];
  std::string src;
  std::vector<std::string> entries;
  for (auto &[id, p] : inst) {
    char *s = cg_cuda_template_source(&env.a, id, &p, 1, err, sizeof err);
    ASSERT_NE(s, nullptr) << err;
    src += s;
    const cg_cuda_template *t = cg_cuda_template_info(id);
    for (int e = 0; e < t->n_entries; e++) {
      char n[128];
      ASSERT_TRUE(cg_cuda_entry_name((cg_cuda_entry)(t->first_entry + e), &p, n, sizeof n, err,
                                     sizeof err));
      entries.push_back(n);
    }
  }
  char *ptx = nullptr;
  void *cubin = nullptr;
  size_t ptx_len = 0, cubin_len = 0;
  auto t0 = std::chrono::steady_clock::now();
  dsc_status st = cg_nvrtc_compile(env.ctx, src.c_str(), name, 90, &ptx, &ptx_len, &cubin, &cubin_len);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(st, DSC_OK) << diags(env.ctx);
  EXPECT_EQ(dsc_error_count(env.ctx), 0) << diags(env.ctx);
  std::printf("  NVRTC %s: %zu entry points, %zu bytes of source, %.2f s\n", name, entries.size(),
              src.size(), secs);
  std::string p(ptx, ptx_len);
  for (auto &e : entries) EXPECT_NE(p.find(".entry " + e + "("), std::string::npos) << e;
  ASSERT_GE(cubin_len, 4u);
  EXPECT_EQ(std::memcmp(cubin, "\x7f" "ELF", 4), 0);
  free(ptx);
  free(cubin);
}
#endif

TEST(CudaTemplates, EveryElementwiseTemplateInstantiationCompilesForSm90) {
#ifndef DSC_HAVE_CUDA
  GTEST_SKIP() << "built without CUDA";
#else
  std::vector<std::pair<cg_cuda_template_id, cg_cuda_template_params>> inst;
  for (dsc_dtype dt : {DSC_F32, DSC_BF16, DSC_F16}) {
    for (dsc_dtype idx : {DSC_I32, DSC_I64}) inst.push_back({CG_TPL_SOFTMAX_CE, params(dt, idx)});
    inst.push_back({CG_TPL_LAYERNORM, params(dt)});
    inst.push_back({CG_TPL_ADAMW, params(dt)});
  }
  compile_and_check(inst, "templates_rows.cu");
#endif
}

TEST(CudaTemplates, EveryAttentionInstantiationCompilesForSm90) {
#ifndef DSC_HAVE_CUDA
  GTEST_SKIP() << "built without CUDA";
#else
  std::vector<std::pair<cg_cuda_template_id, cg_cuda_template_params>> inst;
  // Every dtype and every head-dim class (the GPT-2 64, the largest 128, one
  // that is not a multiple of 32); all 4 entries each. More would cost
  // ~1 s of NVRTC per instantiation.
  inst.push_back({CG_TPL_ATTENTION, params(DSC_F32, DSC_I32, 64)});
  inst.push_back({CG_TPL_ATTENTION, params(DSC_BF16, DSC_I32, 128)});
  inst.push_back({CG_TPL_ATTENTION, params(DSC_F16, DSC_I32, 64)});
  inst.push_back({CG_TPL_ATTENTION, params(DSC_F32, DSC_I32, 80)});
  compile_and_check(inst, "templates_attention.cu");
#endif
}

TEST(CudaTemplates, CompileErrorsComeBackAsDiagnostics) {
#ifndef DSC_HAVE_CUDA
  GTEST_SKIP() << "built without CUDA";
#else
  Env env;
  char err[256];
  cg_cuda_template_params p = params(DSC_F32);
  std::string src = cg_cuda_template_source(&env.a, CG_TPL_ADAMW, &p, 1, err, sizeof err);
  src += "DSC_ADAMW_INSTANTIATE(float, f32)\n";  // a second definition of the same entry
  char *ptx = nullptr;
  size_t n = 0;
  EXPECT_NE(cg_nvrtc_compile(env.ctx, src.c_str(), "dup.cu", 90, &ptx, &n, nullptr, nullptr), DSC_OK);
  EXPECT_NE(diags(env.ctx).find("dsc_adamw_f32"), std::string::npos) << diags(env.ctx);
  free(ptx);
#endif
}

// ---------------- the references (checked, for the later GPU test) ----------------

TEST(CudaReference, SoftmaxCrossEntropyBackwardIsTheGradientOfTheMeanLoss) {
  const int N = 3, V = 7;
  std::vector<float> x = randn(N * V, 1, -3, 3);
  std::vector<int64_t> tg = {2, 0, 6};
  std::vector<float> losses(N), lse(N), probs(N * V), dx(N * V);
  bool bad = true;
  double loss = ref_softmax_ce_fwd(x.data(), tg.data(), N, V, losses.data(), lse.data(), probs.data(), &bad);
  EXPECT_FALSE(bad);
  for (int n = 0; n < N; n++) {
    double s = 0;
    for (int i = 0; i < V; i++) s += probs[n * V + i];
    EXPECT_NEAR(s, 1.0, 1e-6);
    EXPECT_NEAR(losses[n], -std::log(probs[n * V + tg[n]]), 1e-5);
  }
  const float dloss = 1.7f;
  ref_softmax_ce_bwd(x.data(), tg.data(), lse.data(), dloss, N, V, dx.data());
  // Central differences of dloss * mean loss (h = 1e-2: error ~h^2).
  for (int j = 0; j < N * V; j++) {
    std::vector<float> xp = x, xm = x;
    xp[j] += 1e-2f, xm[j] -= 1e-2f;
    double lp = ref_softmax_ce_fwd(xp.data(), tg.data(), N, V, losses.data(), lse.data(), nullptr, &bad);
    double lm = ref_softmax_ce_fwd(xm.data(), tg.data(), N, V, losses.data(), lse.data(), nullptr, &bad);
    EXPECT_NEAR(dx[j], dloss * (lp - lm) / 2e-2, 2e-4) << j;
  }
  (void)loss;
  tg[1] = V;
  ref_softmax_ce_fwd(x.data(), tg.data(), N, V, losses.data(), lse.data(), nullptr, &bad);
  EXPECT_TRUE(bad);
  EXPECT_EQ(losses[1], 0.0f);
}

TEST(CudaReference, LayernormBackwardIsTheGradientOfTheForward) {
  const int N = 3, C = 6;
  std::vector<float> x = randn(N * C, 2), w = randn(C, 3, 0.5f, 1.5f), b = randn(C, 4);
  std::vector<float> r = randn(N * C, 5);  // loss = sum(y * r): dy = r
  std::vector<float> y(N * C), mean(N), rstd(N), dx(N * C), dw(C), db(C);
  ref_layernorm_fwd(x.data(), w.data(), b.data(), N, C, 1e-5f, y.data(), mean.data(), rstd.data());
  for (int n = 0; n < N; n++) {  // normalised rows: mean b, and unit variance before w
    double m = 0;
    for (int i = 0; i < C; i++) m += (y[n * C + i] - b[i]) / w[i];
    EXPECT_NEAR(m, 0.0, 1e-5);
  }
  ref_layernorm_bwd(r.data(), x.data(), w.data(), mean.data(), rstd.data(), N, C, dx.data(), dw.data(), db.data());
  auto loss = [&](const std::vector<float> &xx, const std::vector<float> &ww, const std::vector<float> &bb) {
    std::vector<float> yy(N * C), mm(N), rr(N);
    ref_layernorm_fwd(xx.data(), ww.data(), bb.data(), N, C, 1e-5f, yy.data(), mm.data(), rr.data());
    double s = 0;
    for (int i = 0; i < N * C; i++) s += (double)yy[i] * r[i];
    return s;
  };
  const float h = 1e-2f;
  for (int j = 0; j < N * C; j++) {
    std::vector<float> p = x, m = x;
    p[j] += h, m[j] -= h;
    EXPECT_NEAR(dx[j], (loss(p, w, b) - loss(m, w, b)) / (2 * h), 2e-3) << "dx " << j;
  }
  for (int j = 0; j < C; j++) {
    std::vector<float> p = w, m = w;
    p[j] += h, m[j] -= h;
    EXPECT_NEAR(dw[j], (loss(x, p, b) - loss(x, m, b)) / (2 * h), 2e-3) << "dw " << j;
    p = b, m = b;
    p[j] += h, m[j] -= h;
    EXPECT_NEAR(db[j], (loss(x, w, p) - loss(x, w, m)) / (2 * h), 2e-3) << "db " << j;
  }
}

TEST(CudaReference, AttentionForwardRespectsTheCausalMaskAndHeads) {
  const int B = 2, T = 4, H = 2, hd = 3, n = B * T * H * hd;
  std::vector<float> q = randn(n, 6), k = randn(n, 7), v = randn(n, 8), o(n), lse(B * H * T);
  ref_attention_fwd(q.data(), k.data(), v.data(), B, T, H, hd, true, o.data(), lse.data());
  // Query 0 sees only key 0: its output is v[0] in every head and batch.
  for (int b = 0; b < B; b++)
    for (int h = 0; h < H; h++) {
      for (int d = 0; d < hd; d++)
        EXPECT_NEAR(o[ref_att_at(b, 0, h, d, T, H, hd)], v[ref_att_at(b, 0, h, d, T, H, hd)], 1e-6);
      double dot = 0;  // lse of a single key is its scaled score
      for (int d = 0; d < hd; d++) dot += q[ref_att_at(b, 0, h, d, T, H, hd)] * k[ref_att_at(b, 0, h, d, T, H, hd)];
      EXPECT_NEAR(lse[(b * H + h) * T], dot / std::sqrt(3.0), 1e-6);
    }
  // Changing head 1's keys leaves head 0's output alone.
  std::vector<float> k2 = k, o2(n);
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++)
      for (int d = 0; d < hd; d++) k2[ref_att_at(b, t, 1, d, T, H, hd)] += 1.0f;
  ref_attention_fwd(q.data(), k2.data(), v.data(), B, T, H, hd, true, o2.data(), lse.data());
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++)
      for (int d = 0; d < hd; d++)
        EXPECT_EQ(o[ref_att_at(b, t, 0, d, T, H, hd)], o2[ref_att_at(b, t, 0, d, T, H, hd)]);
}

TEST(CudaReference, AttentionBackwardIsTheGradientOfTheForward) {
  const int B = 1, T = 4, H = 2, hd = 3, n = B * T * H * hd;
  for (bool causal : {true, false}) {
    std::vector<float> q = randn(n, 9), k = randn(n, 10), v = randn(n, 11), r = randn(n, 12);
    std::vector<float> o(n), lse(B * H * T), dq(n), dk(n), dv(n);
    ref_attention_fwd(q.data(), k.data(), v.data(), B, T, H, hd, causal, o.data(), lse.data());
    ref_attention_bwd(q.data(), k.data(), v.data(), o.data(), r.data(), lse.data(), B, T, H, hd,
                      causal, dq.data(), dk.data(), dv.data());
    auto loss = [&](const std::vector<float> &qq, const std::vector<float> &kk, const std::vector<float> &vv) {
      std::vector<float> oo(n), ll(B * H * T);
      ref_attention_fwd(qq.data(), kk.data(), vv.data(), B, T, H, hd, causal, oo.data(), ll.data());
      double s = 0;
      for (int i = 0; i < n; i++) s += (double)oo[i] * r[i];
      return s;
    };
    const float h = 1e-2f;
    for (int j = 0; j < n; j++) {
      std::vector<float> p = q, m = q;
      p[j] += h, m[j] -= h;
      EXPECT_NEAR(dq[j], (loss(p, k, v) - loss(m, k, v)) / (2 * h), 1e-3) << "dq " << j << causal;
      p = k, m = k;
      p[j] += h, m[j] -= h;
      EXPECT_NEAR(dk[j], (loss(q, p, v) - loss(q, m, v)) / (2 * h), 1e-3) << "dk " << j << causal;
      p = v, m = v;
      p[j] += h, m[j] -= h;
      EXPECT_NEAR(dv[j], (loss(q, k, p) - loss(q, k, m)) / (2 * h), 1e-3) << "dv " << j << causal;
    }
  }
}

TEST(CudaReference, AdamWFirstStepMovesEachWeightByLrTimesTheGradientSign) {
  const int n = 5;
  std::vector<float> w = randn(n, 13), g = randn(n, 14), m(n, 0.0f), v(n, 0.0f), copy(n);
  std::vector<float> w0 = w;
  const float lr = 0.01f, wd = 0.1f, scale = 0.5f;
  ref_adamw(w.data(), g.data(), m.data(), v.data(), n, lr, 0.9f, 0.95f, 1e-8f, wd, 1, scale, copy.data());
  for (int i = 0; i < n; i++) {
    // Step 1 from zero moments: mhat = g, vhat = g^2, so the update is
    // lr * g / (|g| + eps) after the decoupled decay.
    const double gs = (double)g[i] * scale;
    const double expect = w0[i] * (1 - lr * wd) - lr * gs / (std::fabs(gs) + 1e-8);
    EXPECT_NEAR(w[i], expect, 1e-6) << i;
    EXPECT_NEAR(m[i], 0.1 * gs, 1e-7);
    EXPECT_NEAR(v[i], 0.05 * gs * gs, 1e-7);
    EXPECT_EQ(copy[i], w[i]);
  }
}

// ---------------- cuBLASLt plans ----------------

#ifdef DSC_HAVE_CUDA
struct Operand {
  std::vector<float> data;
  cg_matrix mat;
};

// The dsc meaning of a cg_gemm on host buffers (the oracle).
void gemm_dsc(const cg_gemm &g, const std::vector<float> &a, const std::vector<float> &b, std::vector<float> &c) {
  for (int64_t b0 = 0; b0 < g.batch[0]; b0++)
    for (int64_t b1 = 0; b1 < g.batch[1]; b1++)
      for (int64_t i = 0; i < g.m; i++)
        for (int64_t j = 0; j < g.n; j++) {
          double s = 0;
          for (int64_t l = 0; l < g.k; l++)
            s += (double)a[g.a.offset + b0 * g.a.batch_stride[0] + b1 * g.a.batch_stride[1] + i * g.a.row_stride + l * g.a.col_stride] *
                 b[g.b.offset + b0 * g.b.batch_stride[0] + b1 * g.b.batch_stride[1] + l * g.b.row_stride + j * g.b.col_stride];
          float &dst = c[g.c.offset + b0 * g.c.batch_stride[0] + b1 * g.c.batch_stride[1] + i * g.c.row_stride + j * g.c.col_stride];
          dst = (float)(g.alpha * s + g.beta * dst);
        }
}

template <typename V>
V layout_attr(void *l, cublasLtMatrixLayoutAttribute_t attr) {
  V v{};
  size_t written = 0;
  EXPECT_EQ(cublasLtMatrixLayoutGetAttribute((cublasLtMatrixLayout_t)l, attr, &v, sizeof v, &written),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(written, sizeof v);
  return v;
}
template <typename V>
V desc_attr(void *d, cublasLtMatmulDescAttributes_t attr) {
  V v{};
  size_t written = 0;
  EXPECT_EQ(cublasLtMatmulDescGetAttribute((cublasLtMatmulDesc_t)d, attr, &v, sizeof v, &written),
            CUBLAS_STATUS_SUCCESS);
  return v;
}

// Runs the column-major matmul that the descriptors (read back from
// cuBLASLt, not from the plan's copies) describe, the way cublasLtMatmul
// would: D = alpha op(A) op(B) + beta C per batch and outer step.
void gemm_as_cublaslt(const rt_cublaslt_plan &p, const float *buf_a, const float *buf_b, float *buf_c) {
  const float *base[2] = {p.swapped ? buf_b : buf_a, p.swapped ? buf_a : buf_b};
  int32_t op[2] = {desc_attr<int32_t>(p.desc, CUBLASLT_MATMUL_DESC_TRANSA),
                   desc_attr<int32_t>(p.desc, CUBLASLT_MATMUL_DESC_TRANSB)};
  uint64_t rows[3], cols[3];
  int64_t ld[3], stride[3];
  int32_t count[3];
  for (int i = 0; i < 3; i++) {
    rows[i] = layout_attr<uint64_t>(p.layout[i], CUBLASLT_MATRIX_LAYOUT_ROWS);
    cols[i] = layout_attr<uint64_t>(p.layout[i], CUBLASLT_MATRIX_LAYOUT_COLS);
    ld[i] = layout_attr<int64_t>(p.layout[i], CUBLASLT_MATRIX_LAYOUT_LD);
    count[i] = layout_attr<int32_t>(p.layout[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT);
    stride[i] = layout_attr<int64_t>(p.layout[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET);
    EXPECT_GE(ld[i], (int64_t)rows[i]) << "cuBLASLt needs ld >= rows (column-major)";
  }
  EXPECT_EQ(count[0], count[2]);
  EXPECT_EQ(count[1], count[2]);
  const uint64_t M = rows[2], N = cols[2], K = op[0] == CUBLAS_OP_N ? cols[0] : rows[0];
  EXPECT_EQ(op[0] == CUBLAS_OP_N ? rows[0] : cols[0], M);
  EXPECT_EQ(op[1] == CUBLAS_OP_N ? rows[1] : cols[1], K);
  EXPECT_EQ(op[1] == CUBLAS_OP_N ? cols[1] : rows[1], N);
  for (int64_t o = 0; o < p.outer_count; o++)
    for (int32_t bi = 0; bi < count[2]; bi++) {
      const float *A = base[0] + p.offset[0] + o * p.outer_stride[0] + bi * stride[0];
      const float *B = base[1] + p.offset[1] + o * p.outer_stride[1] + bi * stride[1];
      float *C = buf_c + p.offset[2] + o * p.outer_stride[2] + bi * stride[2];
      for (uint64_t i = 0; i < M; i++)
        for (uint64_t j = 0; j < N; j++) {
          double s = 0;
          for (uint64_t l = 0; l < K; l++) {
            float av = op[0] == CUBLAS_OP_N ? A[i + l * ld[0]] : A[l + i * ld[0]];
            float bv = op[1] == CUBLAS_OP_N ? B[l + j * ld[1]] : B[j + l * ld[1]];
            s += (double)av * bv;
          }
          C[i + j * ld[2]] = (float)(p.alpha * s + p.beta * C[i + j * ld[2]]);
        }
    }
}

cg_matrix mat(int64_t off, int64_t bs0, int64_t bs1, int64_t rs, int64_t cs) {
  cg_matrix m;
  m.buffer = 0, m.offset = off, m.batch_stride[0] = bs0, m.batch_stride[1] = bs1;
  m.row_stride = rs, m.col_stride = cs;
  return m;
}

cg_gemm gemm(int64_t b0, int64_t b1, int64_t m, int64_t n, int64_t k, cg_matrix a, cg_matrix b, cg_matrix c) {
  cg_gemm g;
  g.batch[0] = b0, g.batch[1] = b1, g.m = m, g.n = n, g.k = k;
  g.a = a, g.b = b, g.c = c;
  g.alpha = 1.25, g.beta = 0.5;
  return g;
}

// Plans g, runs the described column-major matmul on random buffers and
// compares with the dsc meaning (f32: 1e-5 relative).
rt_cublaslt_plan check_plan(const cg_gemm &g, size_t na, size_t nb, size_t nc, bool keep = false) {
  Env env;
  rt_cublaslt_plan p;
  EXPECT_EQ(rt_cublaslt_plan_init(env.ctx, &g, DSC_F32, DSC_F32, RT_GEMM_F32, &p), DSC_OK) << diags(env.ctx);
  std::vector<float> a = randn(na, 20), b = randn(nb, 21), c = randn(nc, 22), c_ref = c;
  gemm_dsc(g, a, b, c_ref);
  gemm_as_cublaslt(p, a.data(), b.data(), c.data());
  for (size_t i = 0; i < nc; i++) EXPECT_NEAR(c[i], c_ref[i], 1e-5 * (1 + std::fabs(c_ref[i]))) << i;
  if (!keep) rt_cublaslt_plan_destroy(&p);
  return p;
}
#endif

TEST(CublasLt, RowMajorPlainGemmSwapsOperands) {
#ifndef DSC_HAVE_CUDA
  GTEST_SKIP() << "built without CUDA";
#else
  const int m = 3, n = 5, k = 4;
  rt_cublaslt_plan p = check_plan(gemm(1, 1, m, n, k, mat(0, 0, 0, k, 1), mat(0, 0, 0, n, 1), mat(0, 0, 0, n, 1)),
                                  m * k, k * n, m * n, true);
  EXPECT_TRUE(p.swapped);  // C^T = B^T A^T
  EXPECT_EQ(desc_attr<int32_t>(p.desc, CUBLASLT_MATMUL_DESC_TRANSA), CUBLAS_OP_N);
  EXPECT_EQ(desc_attr<int32_t>(p.desc, CUBLASLT_MATMUL_DESC_TRANSB), CUBLAS_OP_N);
  EXPECT_EQ(layout_attr<uint64_t>(p.layout[0], CUBLASLT_MATRIX_LAYOUT_ROWS), (uint64_t)n);
  EXPECT_EQ(layout_attr<int64_t>(p.layout[0], CUBLASLT_MATRIX_LAYOUT_LD), n);
  EXPECT_EQ(layout_attr<int64_t>(p.layout[1], CUBLASLT_MATRIX_LAYOUT_LD), k);
  EXPECT_EQ(layout_attr<int32_t>(p.layout[2], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT), 1);
  EXPECT_EQ(desc_attr<int32_t>(p.desc, CUBLASLT_MATMUL_DESC_COMPUTE_TYPE), CUBLAS_COMPUTE_32F);
  EXPECT_EQ(desc_attr<int32_t>(p.desc, CUBLASLT_MATMUL_DESC_SCALE_TYPE), CUDA_R_32F);
  rt_cublaslt_plan_destroy(&p);
  EXPECT_EQ(p.desc, nullptr);
#endif
}

TEST(CublasLt, TransposedOperandsBecomeOpT) {
#ifndef DSC_HAVE_CUDA
  GTEST_SKIP() << "built without CUDA";
#else
  const int m = 3, n = 5, k = 4;
  // A stored as [k, m] (A = X^T), B stored as [n, k] (B = Y^T): unit row strides.
  rt_cublaslt_plan p = check_plan(gemm(1, 1, m, n, k, mat(0, 0, 0, 1, m), mat(0, 0, 0, 1, k), mat(0, 0, 0, n, 1)),
                                  m * k, k * n, m * n, true);
  EXPECT_EQ(desc_attr<int32_t>(p.desc, CUBLASLT_MATMUL_DESC_TRANSA), CUBLAS_OP_T);
  EXPECT_EQ(desc_attr<int32_t>(p.desc, CUBLASLT_MATMUL_DESC_TRANSB), CUBLAS_OP_T);
  rt_cublaslt_plan_destroy(&p);
  // Only one transposed, and a column-major C (no swap).
  p = check_plan(gemm(1, 1, m, n, k, mat(0, 0, 0, k, 1), mat(0, 0, 0, 1, k), mat(0, 0, 0, 1, m)), m * k, k * n,
                 m * n, true);
  EXPECT_FALSE(p.swapped);
  EXPECT_EQ(desc_attr<int32_t>(p.desc, CUBLASLT_MATMUL_DESC_TRANSA), CUBLAS_OP_T);
  EXPECT_EQ(desc_attr<int32_t>(p.desc, CUBLASLT_MATMUL_DESC_TRANSB), CUBLAS_OP_N);
  rt_cublaslt_plan_destroy(&p);
#endif
}

TEST(CublasLt, TwoContiguousBatchDimsCollapseIntoOneStridedBatch) {
#ifndef DSC_HAVE_CUDA
  GTEST_SKIP() << "built without CUDA";
#else
  const int b0 = 2, b1 = 3, m = 3, n = 4, k = 5;
  rt_cublaslt_plan p = check_plan(gemm(b0, b1, m, n, k, mat(0, b1 * m * k, m * k, k, 1),
                                       mat(0, b1 * k * n, k * n, n, 1), mat(0, b1 * m * n, m * n, n, 1)),
                                  b0 * b1 * m * k, b0 * b1 * k * n, b0 * b1 * m * n, true);
  EXPECT_EQ(p.outer_count, 1);
  for (int i = 0; i < 3; i++)
    EXPECT_EQ(layout_attr<int32_t>(p.layout[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT), b0 * b1);
  EXPECT_EQ(layout_attr<int64_t>(p.layout[0], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET), k * n);  // dsc B
  EXPECT_EQ(layout_attr<int64_t>(p.layout[2], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET), m * n);
  rt_cublaslt_plan_destroy(&p);
#endif
}

TEST(CublasLt, BroadcastBatchKeepsAZeroStride) {
#ifndef DSC_HAVE_CUDA
  GTEST_SKIP() << "built without CUDA";
#else
  const int b0 = 2, b1 = 3, m = 3, n = 4, k = 5;
  // B (a weight) shared by every batch: stride 0 in both batch dims.
  rt_cublaslt_plan p = check_plan(gemm(b0, b1, m, n, k, mat(0, b1 * m * k, m * k, k, 1), mat(0, 0, 0, n, 1),
                                       mat(0, b1 * m * n, m * n, n, 1)),
                                  b0 * b1 * m * k, k * n, b0 * b1 * m * n, true);
  EXPECT_EQ(p.outer_count, 1);
  EXPECT_EQ(layout_attr<int64_t>(p.layout[0], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET), 0);
  EXPECT_EQ(layout_attr<int32_t>(p.layout[0], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT), b0 * b1);
  rt_cublaslt_plan_destroy(&p);
  // Broadcast over the outer dim only: strides (0, s) do not collapse.
  p = check_plan(gemm(b0, b1, m, n, k, mat(0, b1 * m * k, m * k, k, 1), mat(0, 0, k * n, n, 1),
                      mat(0, b1 * m * n, m * n, n, 1)),
                 b0 * b1 * m * k, b1 * k * n, b0 * b1 * m * n, true);
  EXPECT_EQ(p.outer_count, b0);
  EXPECT_EQ(p.batch_count, b1);
  EXPECT_EQ(layout_attr<int32_t>(p.layout[2], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT), b1);
  rt_cublaslt_plan_destroy(&p);
#endif
}

TEST(CublasLt, SlicedOperandsUseLeadingDimensionsAndOffsets) {
#ifndef DSC_HAVE_CUDA
  GTEST_SKIP() << "built without CUDA";
#else
  // Attention-style per-head views: q[b, t, h*hd + d] of a [B, T, 3C]
  // buffer, scores = q k^T for head h: A rows t (stride 3C), B = k^T
  // (unit row stride, column stride 3C), batch over (b, h).
  const int Bn = 2, T = 4, H = 3, hd = 2, C = H * hd, C3 = 3 * C;
  cg_gemm g = gemm(Bn, H, T, T, hd, mat(0, T * C3, hd, C3, 1), mat(C, T * C3, hd, 1, C3),
                   mat(0, H * T * T, T * T, T, 1));
  rt_cublaslt_plan p = check_plan(g, Bn * T * C3, Bn * T * C3, Bn * H * T * T, true);
  // (b, h) strides: T*C3 == H * hd? no: the batch dims do not collapse.
  EXPECT_EQ(p.outer_count, Bn);
  EXPECT_EQ(layout_attr<int64_t>(p.layout[1], CUBLASLT_MATRIX_LAYOUT_LD), C3);  // dsc A = q
  EXPECT_EQ(p.offset[0], C);                                                    // dsc B = k: after q
  rt_cublaslt_plan_destroy(&p);
  // A sliced row block with a gap between rows, writing into a wider C.
  const int m = 3, n = 2, k = 4;
  p = check_plan(gemm(1, 1, m, n, k, mat(3, 0, 0, k + 3, 1), mat(1, 0, 0, n + 1, 1), mat(2, 0, 0, n + 4, 1)),
                 3 + m * (k + 3), 1 + k * (n + 1), 2 + m * (n + 4), true);
  EXPECT_EQ(layout_attr<int64_t>(p.layout[2], CUBLASLT_MATRIX_LAYOUT_LD), n + 4);
  rt_cublaslt_plan_destroy(&p);
#endif
}

TEST(CublasLt, PrecisionsSetComputeAndDataTypes) {
#ifndef DSC_HAVE_CUDA
  GTEST_SKIP() << "built without CUDA";
#else
  Env env;
  cg_gemm g = gemm(1, 1, 8, 8, 8, mat(0, 0, 0, 8, 1), mat(0, 0, 0, 8, 1), mat(0, 0, 0, 8, 1));
  rt_cublaslt_plan p;
  ASSERT_EQ(rt_cublaslt_plan_init(env.ctx, &g, DSC_F32, DSC_F32, RT_GEMM_TF32, &p), DSC_OK);
  EXPECT_EQ(desc_attr<int32_t>(p.desc, CUBLASLT_MATMUL_DESC_COMPUTE_TYPE), CUBLAS_COMPUTE_32F_FAST_TF32);
  rt_cublaslt_plan_destroy(&p);
  ASSERT_EQ(rt_cublaslt_plan_init(env.ctx, &g, DSC_BF16, DSC_F32, RT_GEMM_BF16, &p), DSC_OK);
  EXPECT_EQ(desc_attr<int32_t>(p.desc, CUBLASLT_MATMUL_DESC_COMPUTE_TYPE), CUBLAS_COMPUTE_32F);
  EXPECT_EQ(layout_attr<uint32_t>(p.layout[0], CUBLASLT_MATRIX_LAYOUT_TYPE), (uint32_t)CUDA_R_16BF);
  EXPECT_EQ(layout_attr<uint32_t>(p.layout[2], CUBLASLT_MATRIX_LAYOUT_TYPE), (uint32_t)CUDA_R_32F);
  EXPECT_EQ(p.elem_size[0], 2u);
  rt_cublaslt_plan_destroy(&p);
  ASSERT_EQ(rt_cublaslt_plan_init(env.ctx, &g, DSC_F16, DSC_F16, RT_GEMM_F16, &p), DSC_OK);
  EXPECT_EQ(layout_attr<uint32_t>(p.layout[2], CUBLASLT_MATRIX_LAYOUT_TYPE), (uint32_t)CUDA_R_16F);
  rt_cublaslt_plan_destroy(&p);
  EXPECT_EQ(dsc_error_count(env.ctx), 0) << diags(env.ctx);
  // Mismatched dtypes are refused before any descriptor exists.
  EXPECT_NE(rt_cublaslt_plan_init(env.ctx, &g, DSC_BF16, DSC_F32, RT_GEMM_F32, &p), DSC_OK);
  EXPECT_EQ(p.desc, nullptr);
  EXPECT_NE(diags(env.ctx).find("bf16 inputs"), std::string::npos) << diags(env.ctx);
#endif
}

TEST(CublasLt, UnrepresentableOperandsAreReported) {
#ifndef DSC_HAVE_CUDA
  GTEST_SKIP() << "built without CUDA";
#else
  Env env;
  rt_cublaslt_plan p;
  // A with no unit stride (every other element of every other row).
  cg_gemm g = gemm(1, 1, 3, 3, 3, mat(0, 0, 0, 6, 2), mat(0, 0, 0, 3, 1), mat(0, 0, 0, 3, 1));
  EXPECT_NE(rt_cublaslt_plan_init(env.ctx, &g, DSC_F32, DSC_F32, RT_GEMM_F32, &p), DSC_OK);
  EXPECT_NE(diags(env.ctx).find("operand A"), std::string::npos) << diags(env.ctx);
  // Overlapping rows (row stride below the row length) of B.
  dsc_diag_clear(env.ctx);
  g = gemm(1, 1, 3, 3, 3, mat(0, 0, 0, 3, 1), mat(0, 0, 0, 2, 1), mat(0, 0, 0, 3, 1));
  EXPECT_NE(rt_cublaslt_plan_init(env.ctx, &g, DSC_F32, DSC_F32, RT_GEMM_F32, &p), DSC_OK);
  EXPECT_NE(diags(env.ctx).find("operand B"), std::string::npos) << diags(env.ctx);
  // Every batch writing the same C.
  dsc_diag_clear(env.ctx);
  g = gemm(1, 4, 3, 3, 3, mat(0, 0, 9, 3, 1), mat(0, 0, 9, 3, 1), mat(0, 0, 0, 3, 1));
  EXPECT_NE(rt_cublaslt_plan_init(env.ctx, &g, DSC_F32, DSC_F32, RT_GEMM_F32, &p), DSC_OK);
  EXPECT_NE(diags(env.ctx).find("zero batch stride"), std::string::npos) << diags(env.ctx);
  EXPECT_EQ(p.desc, nullptr);
  dsc_diag_clear(env.ctx);
  g = gemm(1, 1, 0, 3, 3, mat(0, 0, 0, 3, 1), mat(0, 0, 0, 3, 1), mat(0, 0, 0, 3, 1));
  EXPECT_NE(rt_cublaslt_plan_init(env.ctx, &g, DSC_F32, DSC_F32, RT_GEMM_F32, &p), DSC_OK);
#endif
}

}  // namespace
