// The optimizer pass and the training settings.
//
// Optimizer checks: each optimizer is re-implemented below with plain loops
// over doubles following PyTorch's formulas (torch.optim.AdamW, SGD, and
// Keller Jordan's Muon). Both run 5 steps on a small MLP: the interpreter
// runs graph "train_step" (f32, params and states updated through assign);
// the reference takes its gradients from the differentiated forward graph
// at its own (double) params. After every step the loss and grad_norm
// outputs, and after 5 steps every param and optimizer state, must satisfy
// max|a - r| / max|r| < 1e-5 over each tensor (kRelTol: f32 rounding of the
// step graph, about 1e-7 per op, against a double reference).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "dsc/dsc.h"
#include "ir/ir.h"
#include "passes/passes.h"
#include "tests/unit/test_util.h"

namespace {

constexpr double kRelTol = 1e-5;

// A small MLP with a wide (4x6) and a tall (6x3) weight, smooth (tanh), so
// that the gradients have no kinks; 1-D biases start non-zero so that weight
// decay on them would show.
const char kMlp[] = R"(
model mlp {
  param w1: f32[4, 6] = normal(0.5)
  param b1: f32[6] = normal(0.1)
  param w2: f32[6, 3] = normal(0.5)
  param b2: f32[3] = normal(0.1)
  fn forward(x: f32[B, 4], labels: i32[B]) -> f32 {
    h = tanh(matmul(x, w1) + b1)
    return cross_entropy(matmul(h, w2) + b2, labels)
  }
}
)";

dsc_module *compile(dsc_context *ctx, int64_t batch, const char *src = kMlp) {
  dsc_dim_binding b = {"B", batch};
  dsc_frontend_options o = {&b, 1, false};
  dsc_module *m = nullptr;
  EXPECT_EQ(dsc_compile_string(ctx, src, strlen(src), "mlp.dsm", &o, &m), DSC_OK) << diags(ctx);
  return m;
}

dsc_train_config default_config(dsc_context *ctx) {
  dsc_module *m = dsc_module_new(ctx, "empty");
  dsc_train_config c;
  EXPECT_EQ(dsc_train_config_from_module(m, &c), DSC_OK);
  dsc_module_free(m);
  return c;
}

double rel_err(const double *a, const std::vector<double> &r) {
  double num = 0, den = 0;
  for (size_t i = 0; i < r.size(); i++) {
    num = std::max(num, std::fabs(a[i] - r[i]));
    den = std::max(den, std::fabs(r[i]));
  }
  return den > 0 ? num / den : num;
}

typedef std::vector<double> Vec;

// Newton-Schulz as Muon does it, on a rows x cols matrix (row-major).
Vec newton_schulz(Vec x, int64_t rows, int64_t cols) {
  bool tall = rows > cols;
  auto transpose = [](const Vec &a, int64_t r, int64_t c) {
    Vec t(a.size());
    for (int64_t i = 0; i < r; i++)
      for (int64_t j = 0; j < c; j++) t[j * r + i] = a[i * c + j];
    return t;
  };
  if (tall) x = transpose(x, rows, cols), std::swap(rows, cols);
  auto matmul = [](const Vec &a, const Vec &b, int64_t n, int64_t k, int64_t m) {
    Vec c((size_t)(n * m), 0.0);
    for (int64_t i = 0; i < n; i++)
      for (int64_t l = 0; l < k; l++)
        for (int64_t j = 0; j < m; j++) c[i * m + j] += a[i * k + l] * b[l * m + j];
    return c;
  };
  const double a = 3.4445, b = -4.7750, c = 2.0315;
  for (int it = 0; it < 5; it++) {
    Vec xt = transpose(x, rows, cols);
    Vec A = matmul(x, xt, rows, cols, rows);
    Vec AA = matmul(A, A, rows, rows, rows);
    Vec P(A.size());
    for (size_t i = 0; i < A.size(); i++) P[i] = b * A[i] + c * AA[i];
    Vec PX = matmul(P, x, rows, rows, cols);
    for (size_t i = 0; i < x.size(); i++) x[i] = a * x[i] + PX[i];
  }
  if (tall) x = transpose(x, rows, cols);
  return x;
}

// The reference optimizer (doubles, PyTorch semantics).
struct RefOpt {
  dsc_train_config cfg;
  double step = 0;
  std::map<std::string, Vec> m, v, buf;
  std::map<std::string, Vec> last_ns;  // Muon: the last orthogonalised update

  void adamw(const std::string &n, Vec &p, const Vec &g, double lr, bool decay) {
    Vec &M = m[n], &V = v[n];
    M.resize(p.size()), V.resize(p.size());
    double t = step, b1 = cfg.opt.beta1, b2 = cfg.opt.beta2;
    double bc1 = 1 - std::pow(b1, t), bc2 = 1 - std::pow(b2, t);
    for (size_t i = 0; i < p.size(); i++) {
      M[i] = b1 * M[i] + (1 - b1) * g[i];
      V[i] = b2 * V[i] + (1 - b2) * g[i] * g[i];
      if (decay) p[i] *= 1 - lr * cfg.opt.weight_decay;
      p[i] -= lr * (M[i] / bc1) / (std::sqrt(V[i] / bc2) + cfg.opt.eps);
    }
  }
  void sgd(const std::string &n, Vec &p, Vec g, double lr, bool decay) {
    double mu = cfg.opt.momentum;
    if (decay)
      for (size_t i = 0; i < p.size(); i++) g[i] += cfg.opt.weight_decay * p[i];
    Vec u = g;
    if (mu > 0) {
      Vec &B = buf[n];
      if (B.empty())
        B = g;  // torch: the first step sets buf = g
      else
        for (size_t i = 0; i < p.size(); i++) B[i] = mu * B[i] + g[i];
      for (size_t i = 0; i < p.size(); i++) u[i] = cfg.opt.nesterov ? g[i] + mu * B[i] : B[i];
    }
    for (size_t i = 0; i < p.size(); i++) p[i] -= lr * u[i];
  }
  void muon(const std::string &n, Vec &p, const Vec &g, double lr, int64_t rows, int64_t cols) {
    double mu = cfg.opt.momentum;
    Vec &B = buf[n];
    B.resize(p.size());
    Vec u(p.size());
    double nrm = 0;
    for (size_t i = 0; i < p.size(); i++) {
      B[i] = mu * B[i] + g[i];
      u[i] = cfg.opt.nesterov ? g[i] + mu * B[i] : B[i];
      nrm += u[i] * u[i];
    }
    for (double &e : u) e /= std::sqrt(nrm) + 1e-7;
    Vec x = newton_schulz(u, rows, cols);
    last_ns[n] = x;
    double s = std::sqrt(std::max(1.0, (double)rows / (double)cols));
    for (size_t i = 0; i < p.size(); i++)
      p[i] = p[i] * (1 - lr * cfg.opt.weight_decay) - lr * s * x[i];
  }
};

// Runs train_step and the reference side by side.
struct Harness {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  dsc_module *step_m = nullptr, *grad_m = nullptr;
  dsc_params *P = nullptr, *RP = nullptr;
  dsc_train_config cfg;
  int64_t B, K;
  RefOpt ref;
  std::map<std::string, Vec> rp;  // reference params
  std::vector<std::string> names;
  std::vector<dsc_type> types;
  std::mt19937_64 rng{42};
  std::vector<double> losses, norms, ref_losses, ref_norms;
  std::vector<Vec> delayed;  // delayed update: the gradients not applied yet
  struct ZenFlowRef;
  struct ZenFlowRef {
    // ZenFlow by its definition (docs/memory.md "ZenFlow"), with W warm-up
    // steps, S = update_interval, R = select_interval, k = floor(ratio * n)
    // of a 2-D param's n rows (an embedding table's n columns): every step
    // past the warm-up updates the k rows of largest sum |g| (chosen at the
    // first such step and every R steps, moments then zeroed) by AdamW with
    // their own moments and count; the host sums all gradients and updates
    // every param with their mean every S steps (and before a new
    // selection); its result stands where the selective update does not.
    double t = 0, pending = 0, age = 0;
    std::map<std::string, Vec> acc, ms, vs;
    std::map<std::string, std::vector<int64_t>> sel;  // rows in rank order
    std::set<std::string> tables;                     // select columns

    void step(Harness &h, const std::vector<Vec> &grads, double lr) {
      const dsc_train_config &c = h.cfg;
      double W = (double)c.zenflow.warm_up, S = (double)c.zenflow.update_interval,
             R = (double)c.zenflow.select_interval;
      t += 1;
      double u = t - W;
      bool apply = u >= 1, select = apply && (u == 1 || age >= R);
      age = select ? 1 : apply ? age + 1 : 0;
      pending += 1;
      bool boundary = !apply || pending >= S || (apply && age >= R);
      std::map<std::string, Vec> before = h.rp, selective;
      for (size_t i = 0; i < h.names.size(); i++) {
        const std::string &n = h.names[i];
        const dsc_type &ty = h.types[i];
        Vec &a = acc[n];
        a.resize(grads[i].size());
        for (size_t e = 0; e < a.size(); e++) a[e] += grads[i][e];
        if (!apply) continue;
        bool decay = c.opt.weight_decay > 0 && (ty.rank >= 2 || c.opt.decay_1d);
        // a view of the param as [n rows, d]: element (r, q) at r * rs + q * qs
        int64_t rows = 1, d = (int64_t)grads[i].size(), rs = 0, qs = 1;
        bool cols = ty.rank == 2 && tables.count(n) > 0;
        if (ty.rank == 2) {
          rows = ty.dims[cols ? 1 : 0], d = ty.dims[cols ? 0 : 1];
          rs = cols ? 1 : ty.dims[1], qs = cols ? ty.dims[1] : 1;
        }
        int64_t k = ty.rank == 2 ? (int64_t)std::floor(c.zenflow.topk_ratio * (double)rows) : 1;
        if (k < 1) continue;
        if (select) {
          std::vector<double> imp((size_t)rows, 0.0);
          for (int64_t r = 0; r < rows; r++)
            for (int64_t q = 0; q < d; q++)
              imp[(size_t)r] += std::fabs(grads[i][(size_t)(r * rs + q * qs)]);
          std::vector<int64_t> order((size_t)rows);
          for (int64_t r = 0; r < rows; r++) order[(size_t)r] = r;
          std::stable_sort(order.begin(), order.end(),
                           [&](int64_t x, int64_t y) { return imp[(size_t)x] > imp[(size_t)y]; });
          order.resize((size_t)k);
          sel[n] = order;
          ms[n].assign((size_t)(k * d), 0.0);
          vs[n].assign((size_t)(k * d), 0.0);
        }
        Vec p = before[n], &M = ms[n], &V = vs[n];
        double b1 = c.opt.beta1, b2 = c.opt.beta2;
        double bc1 = 1 - std::pow(b1, u), bc2 = 1 - std::pow(b2, u);
        for (int64_t s = 0; s < k; s++)
          for (int64_t q = 0; q < d; q++) {
            // the moments: [k, d]; a table's [d, k] (its columns as columns)
            size_t e = (size_t)(sel[n][(size_t)s] * rs + q * qs),
                   mi = (size_t)(cols ? q * k + s : s * d + q);
            double g = grads[i][e];
            M[mi] = b1 * M[mi] + (1 - b1) * g;
            V[mi] = b2 * V[mi] + (1 - b2) * g * g;
            if (decay) p[e] *= 1 - lr * c.opt.weight_decay;
            p[e] -= lr * (M[mi] / bc1) / (std::sqrt(V[mi] / bc2) + c.opt.eps);
          }
        selective[n] = p;
      }
      if (boundary) {
        h.ref.step += 1;
        for (size_t i = 0; i < h.names.size(); i++) {
          const std::string &n = h.names[i];
          const dsc_type &ty = h.types[i];
          bool decay = c.opt.weight_decay > 0 && (ty.rank >= 2 || c.opt.decay_1d);
          Vec mean = acc[n];
          for (double &e : mean) e /= pending;
          h.ref.adamw(n, h.rp[n], mean, lr, decay);
          std::fill(acc[n].begin(), acc[n].end(), 0.0);
        }
        pending = 0;
      }
      // the selected rows (1-D params: all) are the device's
      for (auto &kv : selective) {
        const std::string &n = kv.first;
        size_t i = (size_t)(std::find(h.names.begin(), h.names.end(), n) - h.names.begin());
        const dsc_type &ty = h.types[i];
        if (ty.rank != 2) {
          h.rp[n] = kv.second;
          continue;
        }
        bool cols = tables.count(n) > 0;
        int64_t d = ty.dims[cols ? 0 : 1], rs = cols ? 1 : ty.dims[1], qs = cols ? ty.dims[1] : 1;
        for (int64_t r : sel[n])
          for (int64_t q = 0; q < d; q++)
            h.rp[n][(size_t)(r * rs + q * qs)] = kv.second[(size_t)(r * rs + q * qs)];
      }
    }
  } zenflow;

  Harness(dsc_train_config c, int64_t batch, const char *src = kMlp)
      : cfg(c), B(batch), K(c.grad_accum) {
    step_m = compile(ctx, B, src);
    grad_m = compile(ctx, B, src);
    dsc_pipeline_options po = {&cfg, nullptr, false, nullptr, true};
    EXPECT_EQ(dsc_run_pipeline(step_m, &po), DSC_OK) << diags(ctx);
    EXPECT_EQ(dsc_autodiff(grad_m, "forward"), DSC_OK) << diags(ctx);
    P = dsc_params_init(step_m, 7);
    RP = dsc_params_init(grad_m, 7);
    for (int i = 0; i < dsc_module_param_count(grad_m); i++) {
      names.push_back(dsc_module_param_name(grad_m, i));
      types.push_back(dsc_module_param_type(grad_m, i));
      dsc_tensor *t = dsc_params_get(RP, i);
      rp[names.back()] = Vec(t->data, t->data + dsc_type_numel(&t->type));
    }
    ref.cfg = cfg;
  }
  ~Harness() {
    dsc_params_free(P);
    dsc_params_free(RP);
    dsc_module_free(step_m);
    dsc_module_free(grad_m);
    dsc_context_free(ctx);
  }

  dsc_tensor *tensor(dsc_dtype dt, std::vector<int64_t> dims) {
    return dsc_tensor_new(ctx, dsc_type_make(dt, (int)dims.size(), dims.data()));
  }

  // One step: both sides on the same K*B rows.
  void step(double lr) {
    int64_t rows = K * B;
    dsc_tensor *x = tensor(DSC_F32, {rows, 4}), *lab = tensor(DSC_I32, {rows}),
               *lrt = tensor(DSC_F32, {});
    std::normal_distribution<double> nd(0, 1);
    for (int64_t i = 0; i < rows * 4; i++) x->data[i] = (double)(float)nd(rng);
    for (int64_t i = 0; i < rows; i++) lab->data[i] = (double)(rng() % 3);
    lrt->data[0] = (double)(float)lr;
    lr = lrt->data[0];
    const dsc_tensor *in[3] = {x, lab, lrt};
    dsc_tensor *out[2] = {nullptr, nullptr};
    ASSERT_EQ(dsc_interp_run_step(step_m, P, in, 3, out), DSC_OK) << diags(ctx);
    losses.push_back(out[0]->data[0]);
    norms.push_back(out[1]->data[0]);
    for (auto *t : out) dsc_tensor_free(ctx, t);

    // reference: average of K micro-batch gradients at the reference params
    for (size_t i = 0; i < names.size(); i++) {
      dsc_tensor *t = dsc_params_find(RP, names[i].c_str());
      std::copy(rp[names[i]].begin(), rp[names[i]].end(), t->data);
    }
    std::vector<Vec> grads(names.size());
    double loss = 0;
    dsc_graph *fg = dsc_module_find_graph(grad_m, "forward");
    int n_out = dsc_graph_output_count(fg);
    for (int64_t k = 0; k < K; k++) {
      dsc_tensor *mx = tensor(DSC_F32, {B, 4}), *ml = tensor(DSC_I32, {B});
      std::copy(x->data + k * B * 4, x->data + (k + 1) * B * 4, mx->data);
      std::copy(lab->data + k * B, lab->data + (k + 1) * B, ml->data);
      const dsc_tensor *gin[2] = {mx, ml};
      std::vector<dsc_tensor *> go(n_out);
      ASSERT_EQ(dsc_interp_run(fg, RP, gin, 2, go.data()), DSC_OK) << diags(ctx);
      loss += go[0]->data[0] / (double)K;
      for (size_t i = 0; i < names.size(); i++) {
        Vec &g = grads[i];
        g.resize(rp[names[i]].size());
        for (size_t e = 0; e < g.size(); e++) g[e] += go[i + 1]->data[e] / (double)K;
      }
      for (auto *t : go) dsc_tensor_free(ctx, t);
      dsc_tensor_free(ctx, mx);
      dsc_tensor_free(ctx, ml);
    }
    double norm = global_norm(grads);
    ref_losses.push_back(loss);
    ref_norms.push_back(norm);
    // the delayed parameter update: this step's gradients are kept, the
    // previous step's applied (none on the first step), clipped by their norm
    if (cfg.offload.delayed_update) {
      bool first = delayed.empty();
      std::swap(grads, delayed);
      if (first) return free_step(x, lab, lrt);
      norm = global_norm(grads);
    }
    if (cfg.clip > 0) {
      double f = cfg.clip / std::max(norm, cfg.clip);
      for (auto &g : grads)
        for (double &e : g) e *= f;
    }
    if (cfg.zenflow.enabled) {
      zenflow.step(*this, grads, lr);
      return free_step(x, lab, lrt);
    }
    ref.step += 1;
    for (size_t i = 0; i < names.size(); i++) {
      Vec &p = rp[names[i]];
      const dsc_type &t = types[i];
      bool decay = cfg.opt.weight_decay > 0 && (t.rank >= 2 || cfg.opt.decay_1d);
      if (cfg.opt.kind == DSC_OPT_SGD)
        ref.sgd(names[i], p, grads[i], lr, decay);
      else if (cfg.opt.kind == DSC_OPT_MUON && t.rank == 2)
        ref.muon(names[i], p, grads[i], lr, t.dims[0], t.dims[1]);
      else
        ref.adamw(names[i], p, grads[i],
                  cfg.opt.kind == DSC_OPT_MUON && cfg.opt.adam_lr > 0
                      ? lr * (cfg.opt.adam_lr / cfg.opt.lr)
                      : lr,
                  decay);
    }
    free_step(x, lab, lrt);
  }
  static double global_norm(const std::vector<Vec> &grads) {
    double sq = 0;
    for (auto &g : grads)
      for (double e : g) sq += e * e;
    return std::sqrt(sq);
  }
  void free_step(dsc_tensor *x, dsc_tensor *lab, dsc_tensor *lrt) {
    dsc_tensor_free(ctx, x);
    dsc_tensor_free(ctx, lab);
    dsc_tensor_free(ctx, lrt);
  }

  void expect_close(const char *name, const Vec &r) {
    dsc_tensor *t = dsc_params_find(P, name);
    ASSERT_NE(t, nullptr) << name;
    ASSERT_EQ((size_t)dsc_type_numel(&t->type), r.size()) << name;
    EXPECT_LT(rel_err(t->data, r), kRelTol) << name;
  }

  void run_and_compare(int steps = 5) {
    for (int s = 0; s < steps; s++) {
      step(0.01 * (1.0 + 0.25 * s));  // a varying lr: the input must be used
      if (::testing::Test::HasFatalFailure()) return;
    }
    for (int s = 0; s < steps; s++) {
      EXPECT_NEAR(losses[s], ref_losses[s], kRelTol * std::fabs(ref_losses[s])) << "step " << s;
      EXPECT_NEAR(norms[s], ref_norms[s], kRelTol * std::fabs(ref_norms[s])) << "step " << s;
    }
    for (auto &n : names) {
      expect_close(n.c_str(), rp[n]);
      if (ref.m.count(n)) expect_close(("opt.m." + n).c_str(), ref.m[n]);
      if (ref.v.count(n)) expect_close(("opt.v." + n).c_str(), ref.v[n]);
      if (ref.buf.count(n)) expect_close(("opt.momentum." + n).c_str(), ref.buf[n]);
    }
    for (size_t i = 0; i < delayed.size(); i++)
      expect_close(("opt.delayed." + names[i]).c_str(), delayed[i]);
    EXPECT_EQ(dsc_params_find(P, "opt.step")->data[0], ref.step);
    if (!cfg.zenflow.enabled) {
      EXPECT_EQ(ref.step, (double)(cfg.offload.delayed_update ? steps - 1 : steps));
    }
    for (auto &kv : zenflow.ms) {
      expect_close(("opt.zf.m." + kv.first).c_str(), kv.second);
      expect_close(("opt.zf.v." + kv.first).c_str(), zenflow.vs[kv.first]);
    }
  }
};

dsc_train_config adamw_config(dsc_context *ctx) {
  dsc_train_config c = default_config(ctx);
  c.opt.kind = DSC_OPT_ADAMW;
  c.opt.lr = 0.01;
  c.opt.beta1 = 0.9;
  c.opt.beta2 = 0.95;
  c.opt.weight_decay = 0.1;
  return c;
}

struct Ctx {
  dsc_context *c = dsc_context_new(nullptr, nullptr);
  ~Ctx() { dsc_context_free(c); }
};

TEST(Optimizer, AdamWMatchesReferenceWithDecayOn2DOnly) {
  Ctx c;
  Harness h(adamw_config(c.c), 4);
  h.run_and_compare();
  // the 1-D biases were not decayed: a reference that decays them differs
  EXPECT_GT(std::fabs(h.rp["b1"][0]), 0.0);
}

// ZeRO-Offload's delayed parameter update against its definition: step t
// computes its gradient at the params of before step t's update and applies
// step t-1's gradient (clipped by that gradient's norm, AdamW's step count
// and bias corrections advancing per applied update); step 1 applies
// nothing. The loss and norm outputs are each step's own.
TEST(Optimizer, DelayedParamUpdateAppliesThePreviousStepsGradient) {
  Ctx c;
  dsc_train_config cfg = adamw_config(c.c);
  cfg.offload.delayed_update = true;
  cfg.clip = 0.5;  // active: the norms here are about 1-3
  Harness h(cfg, 4);
  h.run_and_compare(6);
  // step 2 ran at the initial params too (step 1 updated nothing)
  dsc_train_config plain = adamw_config(c.c);
  plain.clip = 0.5;
  Harness p(plain, 4);
  p.run_and_compare(2);
  EXPECT_DOUBLE_EQ(h.losses[0], p.losses[0]);
  EXPECT_NE(h.losses[1], p.losses[1]); // the plain run's step 2 saw updated params
}

TEST(Optimizer, DelayedParamUpdateWithSgdMomentumAndGradAccum) {
  Ctx c;
  dsc_train_config cfg = default_config(c.c);
  cfg.opt.kind = DSC_OPT_SGD;
  cfg.opt.lr = 0.05;
  cfg.opt.momentum = 0.9;
  cfg.opt.weight_decay = 0.01;
  cfg.grad_accum = 2;
  cfg.offload.delayed_update = true;
  Harness h(cfg, 3);
  h.run_and_compare(5);
}

// ZenFlow against its definition (Harness::ZenFlowRef): a warm-up step,
// host updates every 2 steps, a new selection every 4, half of each
// weight's rows selected, clipping active, over 11 steps (3 selections).
dsc_train_config zenflow_config(dsc_context *ctx) {
  dsc_train_config cfg = adamw_config(ctx);
  cfg.offload.optimizer = DSC_OFFLOAD_HOST;
  cfg.zenflow.enabled = true;
  cfg.zenflow.topk_ratio = 0.5;
  cfg.zenflow.update_interval = 2;
  cfg.zenflow.select_interval = 4;
  cfg.zenflow.warm_up = 1;
  cfg.clip = 0.5;
  return cfg;
}

TEST(Optimizer, ZenFlowUpdatesTheSelectedRowsEveryStepAndTheRestFromTheHostsSums) {
  Ctx c;
  Harness h(zenflow_config(c.c), 4);
  h.run_and_compare(11);
  // host updates: the warm-up step, then after steps 3, 5 (the next selects), 7, 9, 11
  EXPECT_EQ(h.ref.step, 6.0);
  EXPECT_EQ(h.zenflow.sel["w1"].size(), 2u);  // of 4 rows
  EXPECT_EQ(h.zenflow.sel["w2"].size(), 3u);  // of 6
  // step 11 is a host update: no gradient is left summed
  EXPECT_EQ(h.zenflow.pending, 0.0);
  // a selection that differs from plain AdamW: the device rows moved each step
  dsc_train_config plain = adamw_config(c.c);
  plain.clip = 0.5;
  Harness p(plain, 4);
  p.run_and_compare(3);
  EXPECT_NE(h.losses[2], p.losses[2]);
}

// An embedding table selects columns; grad_accum 2 averages first; the
// update interval 3 leaves 2 gradients summed at the end.
TEST(Optimizer, ZenFlowSelectsAnEmbeddingTablesColumnsWithGradAccum) {
  static const char kEmb[] = R"(
model mlp {
  param w1: f32[4, 6] = normal(0.5)
  param e: f32[3, 6] = normal(0.5)
  param w2: f32[6, 3] = normal(0.5)
  param b2: f32[3] = normal(0.1)
  fn forward(x: f32[B, 4], labels: i32[B]) -> f32 {
    h = tanh(matmul(x, w1) + embedding(e, labels))
    return cross_entropy(matmul(h, w2) + b2, labels)
  }
}
)";
  Ctx c;
  dsc_train_config cfg = zenflow_config(c.c);
  cfg.grad_accum = 2;
  cfg.zenflow.topk_ratio = 0.34;  // w1: 1 of 4 rows, e: 2 of 6 columns, w2: 2 of 6 rows
  cfg.zenflow.update_interval = 3;
  cfg.zenflow.select_interval = 3;
  cfg.zenflow.warm_up = 0;
  Harness h(cfg, 3, kEmb);
  h.zenflow.tables.insert("e");
  h.run_and_compare(8);
  EXPECT_EQ(h.zenflow.sel["e"].size(), 2u);
  EXPECT_EQ(h.zenflow.pending, 2.0);
  EXPECT_EQ(h.ref.step, 2.0);
}

TEST(Optimizer, ZenFlowRefusesWhatItIsNotBuiltFor) {
  Ctx c;
  struct {
    void (*set)(dsc_train_config *);
    const char *says;
  } cases[] = {
      {[](dsc_train_config *k) { k->opt.kind = DSC_OPT_SGD; }, "updates with AdamW"},
      {[](dsc_train_config *k) { k->offload.optimizer = DSC_OFFLOAD_DISK; },
       "--offload-optimizer host"},
      {[](dsc_train_config *k) { k->zenflow.overlap_step = true; },
       "overlap_step = true is not implemented"},
      {[](dsc_train_config *k) { k->zenflow.topk_ratio = 1; },
       "topk_ratio must be in (0, 1), got 1"},
      {[](dsc_train_config *k) { k->zenflow.select_interval = 1; },
       "select_interval (1) must be at least update_interval (2)"},
      {[](dsc_train_config *k) { k->offload.delayed_update = true; }, "choose one"},
      {[](dsc_train_config *k) { k->world = 2, k->zero.stage = 2; },
       "ZeRO stage 1-3 with world > 1"},
  };
  for (auto &cs : cases) {
    dsc_context *ctx = dsc_context_new(nullptr, nullptr);
    dsc_module *m = compile(ctx, 2);
    dsc_train_config cfg = zenflow_config(ctx);
    cs.set(&cfg);
    dsc_pipeline_options po = {&cfg, nullptr, false, nullptr, true};
    EXPECT_EQ(dsc_run_pipeline(m, &po), DSC_ERR_USER) << cs.says;
    EXPECT_NE(diags(ctx).find(cs.says), std::string::npos) << diags(ctx);
    dsc_module_free(m);
    dsc_context_free(ctx);
  }
}

TEST(Optimizer, AdamWDecay1DWhenAsked) {
  Ctx c;
  dsc_train_config cfg = adamw_config(c.c);
  cfg.opt.decay_1d = true;
  Harness h(cfg, 4);
  h.run_and_compare();
}

TEST(Optimizer, DecayOf1DParamsIsVisible) {
  // The same run with and without decay_1d must end with different biases,
  // by more than the tolerance (else the two tests above could not tell).
  Ctx c;
  dsc_train_config cfg = adamw_config(c.c);
  Harness a(cfg, 4);
  cfg.opt.decay_1d = true;
  Harness b(cfg, 4);
  a.run_and_compare();
  b.run_and_compare();
  Vec pa = a.rp["b1"], pb = b.rp["b1"];
  EXPECT_GT(rel_err(pa.data(), pb), 10 * kRelTol);
}

TEST(Optimizer, ClippingActiveMatchesReference) {
  Ctx c;
  dsc_train_config cfg = adamw_config(c.c);
  cfg.opt.kind = DSC_OPT_SGD;  // sgd shows the clipped magnitude directly
  cfg.clip = 0.05;
  Harness h(cfg, 4);
  h.run_and_compare();
  for (double n : h.ref_norms) EXPECT_GT(n, cfg.clip) << "clipping must be active";
}

TEST(Optimizer, ClippingInactiveChangesNothing) {
  Ctx c;
  dsc_train_config cfg = adamw_config(c.c);
  cfg.opt.kind = DSC_OPT_SGD;
  cfg.clip = 1e3;
  Harness h(cfg, 4);
  cfg.clip = 0;
  Harness off(cfg, 4);
  h.run_and_compare();
  off.run_and_compare();
  for (double n : h.ref_norms) EXPECT_LT(n, 1e3);
  for (auto &n : h.names) {
    dsc_tensor *a = dsc_params_find(h.P, n.c_str()), *b = dsc_params_find(off.P, n.c_str());
    for (int64_t i = 0; i < dsc_type_numel(&a->type); i++) EXPECT_EQ(a->data[i], b->data[i]) << n;
  }
}

TEST(Optimizer, SgdMomentumMatchesReference) {
  Ctx c;
  dsc_train_config cfg = adamw_config(c.c);
  cfg.opt.kind = DSC_OPT_SGD;
  cfg.opt.momentum = 0.9;
  cfg.opt.weight_decay = 0.01;
  Harness h(cfg, 4);
  h.run_and_compare();
}

TEST(Optimizer, SgdNesterovMatchesReference) {
  Ctx c;
  dsc_train_config cfg = adamw_config(c.c);
  cfg.opt.kind = DSC_OPT_SGD;
  cfg.opt.momentum = 0.8;
  cfg.opt.nesterov = true;
  cfg.opt.weight_decay = 0;
  Harness h(cfg, 4);
  h.run_and_compare();
}

TEST(Optimizer, PlainSgdHasNoMomentumState) {
  Ctx c;
  dsc_train_config cfg = adamw_config(c.c);
  cfg.opt.kind = DSC_OPT_SGD;
  cfg.opt.momentum = 0;
  Harness h(cfg, 4);
  h.run_and_compare();
  EXPECT_LT(dsc_module_find_param(h.step_m, "opt.momentum.w1"), 0);
}

TEST(Optimizer, MuonMatchesReferenceAndOrthogonalises) {
  Ctx c;
  dsc_train_config cfg = adamw_config(c.c);
  cfg.opt.kind = DSC_OPT_MUON;
  cfg.opt.lr = 0.02;
  cfg.opt.momentum = 0.95;
  cfg.opt.nesterov = true;
  cfg.opt.weight_decay = 0.01;
  cfg.opt.adam_lr = 0.003;
  Harness h(cfg, 4);
  h.run_and_compare();
  // Muon states for the matrices, AdamW states for the biases
  EXPECT_GE(dsc_module_find_param(h.step_m, "opt.momentum.w1"), 0);
  EXPECT_GE(dsc_module_find_param(h.step_m, "opt.momentum.w2"), 0);
  EXPECT_LT(dsc_module_find_param(h.step_m, "opt.m.w1"), 0);
  EXPECT_GE(dsc_module_find_param(h.step_m, "opt.m.b1"), 0);
}

// Singular values of a small rows x cols matrix: eigenvalues of the Gram
// matrix by cyclic Jacobi, in doubles.
std::vector<double> singular_values(const Vec &x, int64_t rows, int64_t cols) {
  int64_t n = std::min(rows, cols);
  Vec a((size_t)(n * n), 0.0);
  for (int64_t i = 0; i < n; i++)
    for (int64_t j = 0; j < n; j++)
      for (int64_t k = 0; k < std::max(rows, cols); k++)
        a[i * n + j] +=
            rows <= cols ? x[i * cols + k] * x[j * cols + k] : x[k * cols + i] * x[k * cols + j];
  for (int sweep = 0; sweep < 100; sweep++)
    for (int64_t p = 0; p < n; p++)
      for (int64_t q = p + 1; q < n; q++) {
        double apq = a[p * n + q];
        if (std::fabs(apq) < 1e-300) continue;
        double th = 0.5 * std::atan2(2 * apq, a[q * n + q] - a[p * n + p]);
        double cs = std::cos(th), sn = std::sin(th);
        for (int64_t k = 0; k < n; k++) {  // rotate columns p, q
          double akp = a[k * n + p], akq = a[k * n + q];
          a[k * n + p] = cs * akp - sn * akq;
          a[k * n + q] = sn * akp + cs * akq;
        }
        for (int64_t k = 0; k < n; k++) {  // rotate rows p, q
          double apk = a[p * n + k], aqk = a[q * n + k];
          a[p * n + k] = cs * apk - sn * aqk;
          a[q * n + k] = sn * apk + cs * aqk;
        }
      }
  std::vector<double> s;
  for (int64_t i = 0; i < n; i++) s.push_back(std::sqrt(std::max(0.0, a[i * n + i])));
  return s;
}

TEST(Optimizer, MuonNewtonSchulzIsNearlyOrthogonal) {
  // One step without weight decay: X = (p0 - p1) / (lr * sqrt(max(1, r/c))).
  // Its singular values must lie in the band the quintic coefficients give
  // after 5 iterations (about [0.7, 1.2]; checked: [0.65, 1.25]), and X
  // must match the double reference within 1e-3 (f32 through 15 matmuls,
  // small singular values grow by up to 3.4445^5 per unit of error).
  Ctx c;
  dsc_train_config cfg = adamw_config(c.c);
  cfg.opt.kind = DSC_OPT_MUON;
  cfg.opt.weight_decay = 0;
  cfg.opt.momentum = 0.9;
  Harness h(cfg, 8);
  std::map<std::string, Vec> p0;
  for (const char *n : {"w1", "w2"}) {
    dsc_tensor *t = dsc_params_find(h.P, n);
    p0[n] = Vec(t->data, t->data + dsc_type_numel(&t->type));
  }
  h.step(0.01);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  double lr = (double)(float)0.01;
  for (const char *n : {"w1", "w2"}) {
    dsc_tensor *t = dsc_params_find(h.P, n);
    int64_t r = t->type.dims[0], cc = t->type.dims[1];
    double s = std::sqrt(std::max(1.0, (double)r / (double)cc));
    Vec x(p0[n].size());
    for (size_t i = 0; i < x.size(); i++) x[i] = (p0[n][i] - t->data[i]) / (lr * s);
    // w2's gradient has rank 2 (softmax gradients sum to zero over the
    // classes): Newton-Schulz keeps a zero singular value at zero.
    std::vector<double> in = singular_values(h.ref.buf[n], r, cc), out = singular_values(x, r, cc);
    std::sort(in.begin(), in.end());
    std::sort(out.begin(), out.end());
    size_t zeros = 0;
    while (zeros < in.size() && in[zeros] < 1e-6 * in.back()) zeros++;
    EXPECT_LT(zeros, in.size() - 1) << n;
    for (size_t i = 0; i < out.size(); i++) {
      if (i < zeros) {
        EXPECT_LT(out[i], 1e-3) << n;
        continue;
      }
      EXPECT_GT(out[i], 0.65) << n;
      EXPECT_LT(out[i], 1.25) << n;
    }
    EXPECT_LT(rel_err(x.data(), h.ref.last_ns[n]), 1e-3) << n;
    // and the input to Newton-Schulz was far from orthogonal
    EXPECT_GT(in.back() / in[zeros], 1.5) << n;
  }
}

TEST(Optimizer, MuonLeavesEmbeddingTablesToAdamW) {
  Ctx c;
  const char src[] = R"(
model emb {
  param table: f32[10, 4] = normal(0.5)
  param w: f32[4, 3] = normal(0.5)
  fn forward(ids: i32[B], labels: i32[B]) -> f32 {
    return cross_entropy(matmul(embedding(table, ids), w), labels)
  }
}
)";
  dsc_module *m = compile(c.c, 2, src);
  ASSERT_NE(m, nullptr);
  dsc_train_config cfg = adamw_config(c.c);
  cfg.opt.kind = DSC_OPT_MUON;
  dsc_pipeline_options po = {&cfg, nullptr, false, nullptr, true};
  ASSERT_EQ(dsc_run_pipeline(m, &po), DSC_OK) << diags(c.c);
  EXPECT_GE(dsc_module_find_param(m, "opt.m.table"), 0);
  EXPECT_LT(dsc_module_find_param(m, "opt.momentum.table"), 0);
  EXPECT_GE(dsc_module_find_param(m, "opt.momentum.w"), 0);
  dsc_module_free(m);
}

TEST(Optimizer, GradAccumMatchesReference) {
  Ctx c;
  dsc_train_config cfg = adamw_config(c.c);
  cfg.grad_accum = 3;
  cfg.clip = 0.5;
  Harness h(cfg, 2);
  h.run_and_compare();
}

TEST(Optimizer, GradAccumTwoEqualsOneBatchOfTwiceTheSize) {
  // The loss is a mean, so K = 2 micro-batches of B rows give the step of
  // one batch of 2B rows, up to f32 rounding (same tolerance).
  Ctx c;
  dsc_train_config cfg = adamw_config(c.c);
  cfg.grad_accum = 2;
  Harness acc(cfg, 4);
  cfg.grad_accum = 1;
  Harness one(cfg, 8);
  for (int s = 0; s < 5; s++) {
    acc.step(0.01);
    one.step(0.01);  // same seed: the same 8 rows
    ASSERT_FALSE(::testing::Test::HasFatalFailure());
    EXPECT_NEAR(acc.losses[s], one.losses[s], kRelTol * std::fabs(one.losses[s]));
    EXPECT_NEAR(acc.norms[s], one.norms[s], kRelTol * std::fabs(one.norms[s]));
  }
  for (auto &n : one.names) {
    for (const std::string &name : {n, "opt.m." + n, "opt.v." + n}) {
      dsc_tensor *a = dsc_params_find(acc.P, name.c_str()),
                 *b = dsc_params_find(one.P, name.c_str());
      Vec rb(b->data, b->data + dsc_type_numel(&b->type));
      EXPECT_LT(rel_err(a->data, rb), kRelTol) << name;
    }
  }
  // the loop: micro_step takes B rows, run twice; train_step only lr
  EXPECT_EQ(dsc_step_micro_batches(acc.step_m), 2);
  dsc_graph *g = dsc_module_find_graph(acc.step_m, "micro_step");
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(dsc_node_type(dsc_graph_input_at(g, 0)).dims[0], 4);
  EXPECT_EQ(dsc_graph_input_count(dsc_module_find_graph(acc.step_m, "train_step")), 1);
  EXPECT_EQ(dsc_step_micro_batches(one.step_m), 1);
  EXPECT_EQ(dsc_module_find_graph(one.step_m, "micro_step"), nullptr);
}

TEST(Optimizer, StepGraphShapeAndTextRoundTrip) {
  Ctx c;
  dsc_train_config cfg = adamw_config(c.c);
  cfg.grad_accum = 2;
  cfg.clip = 1.0;
  dsc_module *m = compile(c.c, 4);
  ASSERT_NE(m, nullptr);
  dsc_pipeline_options po = {&cfg, nullptr, false, nullptr, true};
  ASSERT_EQ(dsc_run_pipeline(m, &po), DSC_OK) << diags(c.c);
  EXPECT_EQ(dsc_module_find_graph(m, "forward"), nullptr);
  dsc_graph *g = dsc_module_find_graph(m, "train_step");
  ASSERT_NE(g, nullptr);
  // grad_accum 2: train_step(lr) reads the sums micro_step(x, labels, first) keeps
  ASSERT_EQ(dsc_graph_input_count(g), 1);
  EXPECT_STREQ(dsc_node_name(dsc_graph_input_at(g, 0)), "lr");
  ASSERT_EQ(dsc_graph_output_count(g), 2);
  dsc_graph *mg = dsc_module_find_graph(m, "micro_step");
  ASSERT_NE(mg, nullptr);
  ASSERT_EQ(dsc_graph_input_count(mg), 3);
  EXPECT_STREQ(dsc_node_name(dsc_graph_input_at(mg, 2)), "first");
  EXPECT_EQ(dsc_node_type(dsc_graph_input_at(mg, 0)).dims[0], 4);
  int sums = 0;
  for (int i = 0; i < dsc_graph_node_count(mg); i++)
    sums += dsc_node_op(dsc_graph_node(mg, i)) == DSC_OP_ASSIGN;
  EXPECT_EQ(sums, 1 + 4);  // the loss and each param's gradient
  EXPECT_STREQ(dsc_module_get_meta(m, "accumulate.steps"), "2");
  for (int i = 0; i < 2; i++) {
    dsc_type t = dsc_node_type(dsc_graph_output_at(g, i));
    EXPECT_EQ(t.rank, 0);
    EXPECT_EQ(t.dtype, DSC_F32);
  }
  int assigns = 0;
  for (int i = 0; i < dsc_graph_node_count(g); i++)
    assigns += dsc_node_op(dsc_graph_node(g, i)) == DSC_OP_ASSIGN;
  EXPECT_EQ(assigns, 1 + 4 * 3);  // opt.step, then m, v and the param for each
  char *text = dsc_module_print_string(m);
  ASSERT_NE(text, nullptr);
  dsc_module *back = nullptr;
  ASSERT_EQ(dsc_module_parse(c.c, text, strlen(text), "step.dsir", &back), DSC_OK) << diags(c.c);
  char *again = dsc_module_print_string(back);
  ASSERT_NE(again, nullptr);
  EXPECT_STREQ(text, again);
  dsc_string_free(c.c, text);
  dsc_string_free(c.c, again);
  dsc_module_free(back);
  dsc_module_free(m);
}

TEST(Optimizer, Errors) {
  Ctx c;
  dsc_train_config cfg = adamw_config(c.c);
  dsc_module *m = compile(c.c, 4);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(pass_optimizer_run(m, nullptr), DSC_ERR_USER);
  EXPECT_NE(diags(c.c).find("no training settings"), std::string::npos) << diags(c.c);
  dsc_diag_clear(c.c);
  cfg.grad_accum = 0;
  EXPECT_EQ(pass_optimizer_run(m, &cfg), DSC_ERR_USER);
  EXPECT_NE(diags(c.c).find("grad_accum"), std::string::npos) << diags(c.c);
  dsc_diag_clear(c.c);
  // the pass differentiates an undifferentiated forward itself
  cfg.grad_accum = 1;
  ASSERT_EQ(pass_optimizer_run(m, &cfg), DSC_OK) << diags(c.c);
  EXPECT_EQ(dsc_module_verify(m), DSC_OK) << diags(c.c);
  // no forward any more
  EXPECT_EQ(pass_optimizer_run(m, &cfg), DSC_ERR_USER);
  EXPECT_NE(diags(c.c).find("no graph 'forward'"), std::string::npos) << diags(c.c);
  dsc_module_free(m);

  // a scalar input cannot be split into micro-batches
  const char src[] = R"(
model s {
  param w: f32[3] = normal(0.5)
  fn forward(x: f32[3], y: f32) -> f32 { return sum(x * w) * y }
}
)";
  dsc_diag_clear(c.c);
  m = compile(c.c, 1, src);
  ASSERT_NE(m, nullptr);
  cfg.grad_accum = 2;
  EXPECT_EQ(pass_optimizer_run(m, &cfg), DSC_ERR_USER);
  EXPECT_NE(diags(c.c).find("needs a batch dim"), std::string::npos) << diags(c.c);
  EXPECT_EQ(dsc_module_find_graph(m, "train_step"), nullptr);
  dsc_module_free(m);
}

// ------------------------------------------------------------- settings

struct Meta {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  dsc_module *m = dsc_module_new(ctx, "t");
  dsc_train_config cfg;
  ~Meta() {
    dsc_module_free(m);
    dsc_context_free(ctx);
  }
  Meta &set(const char *k, const char *v) {
    EXPECT_EQ(dsc_module_set_meta(m, k, v), DSC_OK);
    return *this;
  }
  dsc_status parse() { return dsc_train_config_from_module(m, &cfg); }
  std::string err() { return diags(ctx); }
};

TEST(TrainConfig, Defaults) {
  Meta t;
  ASSERT_EQ(t.parse(), DSC_OK);
  const dsc_train_config &c = t.cfg;
  EXPECT_EQ(c.batch, 0);
  EXPECT_EQ(c.seq, 0);
  EXPECT_EQ(c.grad_accum, 1);
  EXPECT_EQ(c.steps, 1000);
  EXPECT_EQ(c.seed, 1337u);
  EXPECT_EQ(c.eval_every, 0);
  EXPECT_EQ(c.save_every, 0);
  EXPECT_EQ(c.log_every, 1);
  EXPECT_EQ(c.clip, 0);
  EXPECT_EQ(c.opt.kind, DSC_OPT_ADAMW);
  EXPECT_EQ(c.opt.lr, 1e-3);
  EXPECT_EQ(c.opt.beta1, 0.9);
  EXPECT_EQ(c.opt.beta2, 0.999);
  EXPECT_EQ(c.opt.eps, 1e-8);
  EXPECT_EQ(c.opt.weight_decay, 0);
  EXPECT_EQ(c.opt.momentum, 0.9);
  EXPECT_FALSE(c.opt.nesterov);
  EXPECT_FALSE(c.opt.decay_1d);
  EXPECT_EQ(c.opt.adam_lr, 0);
  EXPECT_EQ(c.sched.kind, DSC_SCHED_CONSTANT);
  EXPECT_EQ(c.sched.warmup, 0);
  EXPECT_EQ(c.sched.min_lr, 0);
  EXPECT_EQ(c.sched.decay_steps, 0);
}

TEST(TrainConfig, EverySettingKind) {
  Meta t;
  t.set("train.batch", "8").set("train.seq", "64").set("train.grad_accum", "4");
  t.set("train.steps", "200").set("train.seed", "7").set("train.eval_every", "50");
  t.set("train.save_every", "100").set("train.log_every", "10").set("train.clip", "1.0");
  t.set("train.optimizer",
        "adamw(lr = 0.0006, betas = (0.9, 0.95), eps = 1e-06, "
        "weight_decay = 0.1, decay_1d = true)");
  t.set("train.schedule", "cosine(warmup = 100, min_lr = 6e-05, decay_steps = 150)");
  t.set("train.precision", "bf16")
      .set("train.zero.stage", "3")
      .set("train.offload.optimizer", "cpu");
  ASSERT_EQ(t.parse(), DSC_OK) << t.err();
  const dsc_train_config &c = t.cfg;
  EXPECT_EQ(c.batch, 8);
  EXPECT_EQ(c.seq, 64);
  EXPECT_EQ(c.grad_accum, 4);
  EXPECT_EQ(c.steps, 200);
  EXPECT_EQ(c.seed, 7u);
  EXPECT_EQ(c.offload.optimizer, DSC_OFFLOAD_HOST);  // "cpu": DeepSpeed's name
  EXPECT_EQ(c.eval_every, 50);
  EXPECT_EQ(c.save_every, 100);
  EXPECT_EQ(c.log_every, 10);
  EXPECT_EQ(c.clip, 1.0);
  EXPECT_EQ(c.opt.kind, DSC_OPT_ADAMW);
  EXPECT_EQ(c.opt.lr, 0.0006);
  EXPECT_EQ(c.opt.beta1, 0.9);
  EXPECT_EQ(c.opt.beta2, 0.95);
  EXPECT_EQ(c.opt.eps, 1e-6);
  EXPECT_EQ(c.opt.weight_decay, 0.1);
  EXPECT_TRUE(c.opt.decay_1d);
  EXPECT_EQ(c.sched.kind, DSC_SCHED_COSINE);
  EXPECT_EQ(c.sched.warmup, 100);
  EXPECT_EQ(c.sched.min_lr, 6e-5);
  EXPECT_EQ(c.sched.decay_steps, 150);
}

TEST(TrainConfig, OptimizersAndSchedules) {
  {
    Meta t;
    t.set("train.optimizer", "sgd(lr = 0.1, momentum = 0.5, nesterov = true, weight_decay = 0.01)");
    t.set("train.schedule", "warmup_linear(warmup = 5)");
    ASSERT_EQ(t.parse(), DSC_OK) << t.err();
    EXPECT_EQ(t.cfg.opt.kind, DSC_OPT_SGD);
    EXPECT_EQ(t.cfg.opt.lr, 0.1);
    EXPECT_EQ(t.cfg.opt.momentum, 0.5);
    EXPECT_TRUE(t.cfg.opt.nesterov);
    EXPECT_EQ(t.cfg.opt.weight_decay, 0.01);
    EXPECT_EQ(t.cfg.sched.kind, DSC_SCHED_LINEAR);
    EXPECT_EQ(t.cfg.sched.warmup, 5);
  }
  {
    Meta t;
    t.set("train.optimizer", "muon(lr = 0.02, momentum = 0.95, adam_lr = 0.003)");
    t.set("train.schedule", "warmup_cosine");
    ASSERT_EQ(t.parse(), DSC_OK) << t.err();
    EXPECT_EQ(t.cfg.opt.kind, DSC_OPT_MUON);
    EXPECT_EQ(t.cfg.opt.adam_lr, 0.003);
    EXPECT_EQ(t.cfg.sched.kind, DSC_SCHED_COSINE);
  }
  {
    Meta t;
    t.set("train.optimizer", "adam").set("train.schedule", "linear()");
    ASSERT_EQ(t.parse(), DSC_OK) << t.err();
    EXPECT_EQ(t.cfg.opt.kind, DSC_OPT_ADAMW);
    EXPECT_EQ(t.cfg.sched.kind, DSC_SCHED_LINEAR);
  }
}

// DeepSpeed's OneCycle and LRRangeTest: DeepSpeed's defaults, the second
// half and its stairs the first's unless given.
TEST(TrainConfig, OneCycleAndLrRangeTest) {
  {
    Meta t;
    t.set("train.schedule", "one_cycle(min_lr = 1e-4, first_steps = 10, first_stairs = 2)");
    ASSERT_EQ(t.parse(), DSC_OK) << t.err();
    EXPECT_EQ(t.cfg.sched.kind, DSC_SCHED_ONE_CYCLE);
    EXPECT_EQ(t.cfg.sched.min_lr, 1e-4);
    EXPECT_EQ(t.cfg.sched.first_steps, 10);
    EXPECT_EQ(t.cfg.sched.second_steps, 10);
    EXPECT_EQ(t.cfg.sched.first_stairs, 2);
    EXPECT_EQ(t.cfg.sched.second_stairs, 2);
    EXPECT_EQ(t.cfg.sched.decay_step_size, 0);
    EXPECT_EQ(t.cfg.sched.decay_lr_rate, 0);
  }
  {
    Meta t;
    t.set("train.schedule",
          "one_cycle(min_lr = 0, second_steps = 0, second_stairs = 0, first_stairs = 3, "
          "decay_step_size = 5, decay_lr_rate = 0.5)");
    ASSERT_EQ(t.parse(), DSC_OK) << t.err();
    EXPECT_EQ(t.cfg.sched.first_steps, 2000);  // DeepSpeed's cycle_first_step_size
    EXPECT_EQ(t.cfg.sched.second_steps, 0);
    EXPECT_EQ(t.cfg.sched.first_stairs, 3);
    EXPECT_EQ(t.cfg.sched.second_stairs, 0);
    EXPECT_EQ(t.cfg.sched.decay_step_size, 5);
    EXPECT_EQ(t.cfg.sched.decay_lr_rate, 0.5);
  }
  {
    Meta t;
    t.set("train.schedule", "lr_range_test");
    ASSERT_EQ(t.parse(), DSC_OK) << t.err();
    EXPECT_EQ(t.cfg.sched.kind, DSC_SCHED_LR_RANGE_TEST);
    EXPECT_EQ(t.cfg.sched.step_size, 2000);
    EXPECT_EQ(t.cfg.sched.step_rate, 1.0);
    EXPECT_FALSE(t.cfg.sched.staircase);
  }
  {
    Meta t;
    t.set("train.schedule", "lr_range_test(step_size = 7, step_rate = 0.25, staircase = true)");
    ASSERT_EQ(t.parse(), DSC_OK) << t.err();
    EXPECT_EQ(t.cfg.sched.step_size, 7);
    EXPECT_EQ(t.cfg.sched.step_rate, 0.25);
    EXPECT_TRUE(t.cfg.sched.staircase);
  }
  struct Case {
    const char *value, *want;
  } bad[] = {
      {"one_cycle", "one_cycle needs min_lr (DeepSpeed's cycle_min_lr, which has no default)"},
      {"one_cycle(first_steps = 4)", "one_cycle needs min_lr"},
      {"one_cycle(min_lr = 0.1, first_steps = 0)",
       "'train.schedule.first_steps' must be a positive"},
      {"one_cycle(min_lr = 0.1, second_steps = -1)",
       "'train.schedule.second_steps' must be a non-negative"},
      {"one_cycle(min_lr = 0.1, first_stairs = 1.5)",
       "'train.schedule.first_stairs' must be a non-negative"},
      {"one_cycle(min_lr = 0.1, warmup = 3)", "'one_cycle' has no setting 'warmup'"},
      {"one_cycle(0.1)",
       "the settings of 'one_cycle' must be named, as in one_cycle(min_lr = ...)"},
      {"lr_range_test(step_size = 0)", "'train.schedule.step_size' must be a positive integer"},
      {"lr_range_test(staircase = 1)", "'train.schedule.staircase' must be true or false"},
      {"lr_range_test(min_lr = 0.1)", "'lr_range_test' has no setting 'min_lr'"},
  };
  for (const Case &k : bad) {
    Meta t;
    t.set("train.schedule", k.value);
    EXPECT_EQ(t.parse(), DSC_ERR_USER) << k.value;
    EXPECT_NE(t.err().find(k.want), std::string::npos) << k.value << ": " << t.err();
  }
}

TEST(TrainConfig, TopLevelLrAndWeightDecayOverrideTheOptimizers) {
  for (bool lr_first : {true, false}) {
    Meta t;
    if (lr_first) t.set("train.lr", "0.5").set("train.weight_decay", "0.25");
    t.set("train.optimizer", "adamw(lr = 0.001, weight_decay = 0.1)");
    if (!lr_first) t.set("train.lr", "0.5").set("train.weight_decay", "0.25");
    ASSERT_EQ(t.parse(), DSC_OK) << t.err();
    EXPECT_EQ(t.cfg.opt.lr, 0.5);
    EXPECT_EQ(t.cfg.opt.weight_decay, 0.25);
  }
}

TEST(TrainConfig, FromTheFrontendsTrainSection) {
  Ctx c;
  std::string src = std::string(kMlp) + R"(
train {
  batch = 4, steps = 30, grad_accum = 2
  optimizer = adamw(lr = 3e-4, betas = (0.8, 0.9), weight_decay = 0.05)
  schedule = cosine(warmup = 3, min_lr = 1e-5)
  clip = 1.0
  seed = 99
}
)";
  dsc_module *m = compile(c.c, 4, src.c_str());
  ASSERT_NE(m, nullptr);
  dsc_train_config cfg;
  ASSERT_EQ(dsc_train_config_from_module(m, &cfg), DSC_OK) << diags(c.c);
  EXPECT_EQ(cfg.batch, 4);
  EXPECT_EQ(cfg.steps, 30);
  EXPECT_EQ(cfg.grad_accum, 2);
  EXPECT_EQ(cfg.opt.lr, 3e-4);
  EXPECT_EQ(cfg.opt.beta1, 0.8);
  EXPECT_EQ(cfg.opt.beta2, 0.9);
  EXPECT_EQ(cfg.opt.weight_decay, 0.05);
  EXPECT_EQ(cfg.sched.kind, DSC_SCHED_COSINE);
  EXPECT_EQ(cfg.sched.warmup, 3);
  EXPECT_EQ(cfg.sched.min_lr, 1e-5);
  EXPECT_EQ(cfg.clip, 1.0);
  EXPECT_EQ(cfg.seed, 99u);
  dsc_module_free(m);
}

TEST(TrainConfig, BadValuesNameTheKey) {
  struct Case {
    const char *key, *value, *want;
  } cases[] = {
      {"train.batch", "0", "train.batch"},
      {"train.batch", "2.5", "positive integer"},
      {"train.steps", "-3", "train.steps"},
      {"train.seed", "x", "train.seed"},
      {"train.clip", "-1", "train.clip"},
      {"train.lr", "fast", "train.lr"},
      {"train.optimizer", "adagrad", "train.optimizer"},
      {"train.optimizer", "adamw(lr = 0.1", "train.optimizer"},
      {"train.optimizer", "adamw(0.1)", "must be named"},
      {"train.optimizer", "adamw(betas = 0.9)", "train.optimizer.betas"},
      {"train.optimizer", "adamw(betas = (0.9, 1.0))", "[0, 1)"},
      {"train.optimizer", "adamw(momentum = 0.9)", "no setting 'momentum'"},
      {"train.optimizer", "sgd(nesterov = 1)", "train.optimizer.nesterov"},
      {"train.optimizer", "sgd(momentum = 0, nesterov = true)", "nesterov needs momentum"},
      {"train.optimizer", "adamw(lr = 0.1) x", "unexpected text"},
      {"train.schedule", "step", "train.schedule"},
      {"train.schedule", "cosine(warmup = 2.5)", "train.schedule.warmup"},
      {"train.schedule", "constant(min_lr = 0.1)", "no setting 'min_lr'"},
      {"train.nonsense", "1", "unknown train setting 'train.nonsense'"},
  };
  for (const Case &k : cases) {
    Meta t;
    t.set(k.key, k.value);
    EXPECT_EQ(t.parse(), DSC_ERR_USER) << k.key << " = " << k.value;
    EXPECT_NE(t.err().find(k.want), std::string::npos)
        << k.key << " = " << k.value << ": " << t.err();
  }
}

// ------------------------------------------------------------- schedules

TEST(Schedule, WarmupThenConstant) {
  Ctx c;
  dsc_train_config cfg = default_config(c.c);
  cfg.opt.lr = 0.1;
  cfg.sched.warmup = 4;
  EXPECT_DOUBLE_EQ(dsc_lr_at(&cfg, 0), 0.025);
  EXPECT_DOUBLE_EQ(dsc_lr_at(&cfg, 2), 0.075);
  EXPECT_DOUBLE_EQ(dsc_lr_at(&cfg, 3), 0.1);  // last warmup step reaches lr
  EXPECT_DOUBLE_EQ(dsc_lr_at(&cfg, 4), 0.1);
  EXPECT_DOUBLE_EQ(dsc_lr_at(&cfg, 5000), 0.1);
  cfg.sched.warmup = 0;
  EXPECT_DOUBLE_EQ(dsc_lr_at(&cfg, 0), 0.1);
}

TEST(Schedule, CosineEdges) {
  Ctx c;
  dsc_train_config cfg = default_config(c.c);
  cfg.opt.lr = 1.0;
  cfg.sched.kind = DSC_SCHED_COSINE;
  cfg.sched.warmup = 10;
  cfg.sched.min_lr = 0.1;
  cfg.steps = 110;
  EXPECT_DOUBLE_EQ(dsc_lr_at(&cfg, 0), 0.1);
  EXPECT_DOUBLE_EQ(dsc_lr_at(&cfg, 9), 1.0);
  EXPECT_DOUBLE_EQ(dsc_lr_at(&cfg, 10), 1.0);   // decay starts at lr
  EXPECT_DOUBLE_EQ(dsc_lr_at(&cfg, 60), 0.55);  // half way: the mean of lr and min_lr
  EXPECT_NEAR(dsc_lr_at(&cfg, 109), 0.1 + 0.45 * (1 + std::cos(M_PI * 99 / 100)), 1e-15);
  EXPECT_DOUBLE_EQ(dsc_lr_at(&cfg, 110), 0.1);
  EXPECT_DOUBLE_EQ(dsc_lr_at(&cfg, 500), 0.1);
  cfg.sched.decay_steps = 30;  // decay ends before the run does
  EXPECT_DOUBLE_EQ(dsc_lr_at(&cfg, 20), 0.55);
  EXPECT_DOUBLE_EQ(dsc_lr_at(&cfg, 30), 0.1);
  EXPECT_DOUBLE_EQ(dsc_lr_at(&cfg, 100), 0.1);
}

TEST(Schedule, LinearEdges) {
  Ctx c;
  dsc_train_config cfg = default_config(c.c);
  cfg.opt.lr = 1.0;
  cfg.sched.kind = DSC_SCHED_LINEAR;
  cfg.sched.min_lr = 0.0;
  cfg.steps = 100;
  EXPECT_DOUBLE_EQ(dsc_lr_at(&cfg, 0), 1.0);
  EXPECT_DOUBLE_EQ(dsc_lr_at(&cfg, 25), 0.75);
  EXPECT_NEAR(dsc_lr_at(&cfg, 99), 0.01, 1e-15);
  EXPECT_DOUBLE_EQ(dsc_lr_at(&cfg, 100), 0.0);
  cfg.sched.warmup = 20;
  cfg.sched.min_lr = 0.2;
  EXPECT_DOUBLE_EQ(dsc_lr_at(&cfg, 19), 1.0);
  EXPECT_DOUBLE_EQ(dsc_lr_at(&cfg, 20), 1.0);
  EXPECT_DOUBLE_EQ(dsc_lr_at(&cfg, 60), 0.6);
  EXPECT_DOUBLE_EQ(dsc_lr_at(&cfg, 100), 0.2);
}

// ir_graph_phases (wall_clock_breakdown): the loss's ancestors are the
// forward, the rest of the gradient norm's the backward, the update the step;
// micro_step has no step; the phases read back from the module's text.
std::vector<unsigned char> phases(dsc_graph *g) {
  std::vector<unsigned char> ph((size_t)dsc_graph_node_count(g) + 1, 255);
  EXPECT_TRUE(ir_graph_phases(g, ph.data()));
  ph.pop_back();
  return ph;
}
// how many nodes of each op each phase has (the text form may renumber them)
std::map<std::pair<int, int>, int> phase_histogram(dsc_graph *g) {
  std::vector<unsigned char> ph = phases(g);
  std::map<std::pair<int, int>, int> h;
  for (int i = 0; i < dsc_graph_node_count(g); i++) h[{(int)dsc_node_op(dsc_graph_node(g, i)), ph[i]}]++;
  return h;
}

TEST(Optimizer, PhasesOfTheStep) {
  Ctx c;
  for (int64_t K : {1, 2}) {
    dsc_train_config cfg = adamw_config(c.c);
    cfg.grad_accum = K;
    cfg.clip = 1.0;
    dsc_module *m = compile(c.c, 4);
    ASSERT_NE(m, nullptr);
    dsc_pipeline_options po = {&cfg, nullptr, false, nullptr, true};
    ASSERT_EQ(dsc_run_pipeline(m, &po), DSC_OK) << diags(c.c);
    dsc_graph *g = dsc_module_find_graph(m, K == 1 ? "train_step" : "micro_step");
    ASSERT_NE(g, nullptr);
    std::vector<unsigned char> ph = phases(g);
    int matmuls[IR_PHASE_COUNT] = {0}, assigns[IR_PHASE_COUNT] = {0};
    for (int i = 0; i < dsc_graph_node_count(g); i++) {
      ASSERT_LT(ph[i], IR_PHASE_COUNT);
      dsc_op op = dsc_node_op(dsc_graph_node(g, i));
      matmuls[ph[i]] += op == DSC_OP_MATMUL;
      assigns[ph[i]] += op == DSC_OP_ASSIGN;
    }
    EXPECT_EQ(ph[dsc_graph_output_at(g, 0)->id], IR_PHASE_FORWARD);
    // the two forward matmuls; three in the backward (w2's input gradient,
    // both weights' gradients: x needs none)
    EXPECT_EQ(matmuls[IR_PHASE_FORWARD], 2) << "K " << K;
    EXPECT_EQ(matmuls[IR_PHASE_BACKWARD], 3) << "K " << K;
    EXPECT_EQ(matmuls[IR_PHASE_STEP], 0) << "K " << K;
    EXPECT_EQ(assigns[IR_PHASE_FORWARD], 0) << "K " << K;
    if (K == 1) {
      EXPECT_EQ(ph[dsc_graph_output_at(g, 1)->id], IR_PHASE_BACKWARD);
      EXPECT_EQ(assigns[IR_PHASE_BACKWARD], 0);
      EXPECT_EQ(assigns[IR_PHASE_STEP], 4 * 3 + 1);  // each param, its m and v; the step count
    } else {
      EXPECT_EQ(assigns[IR_PHASE_BACKWARD], 1 + 4);  // the loss's and each gradient's sum
      EXPECT_EQ(assigns[IR_PHASE_STEP], 0);
      // train_step: the update is the step, nothing is the forward but the loss's read
      std::vector<unsigned char> tp = phases(dsc_module_find_graph(m, "train_step"));
      EXPECT_EQ(std::count(tp.begin(), tp.end(), IR_PHASE_STEP) > 0, true);
    }
    // from the text form, the same phases
    char *text = dsc_module_print_string(m);
    ASSERT_NE(text, nullptr);
    dsc_module *back = nullptr;
    ASSERT_EQ(dsc_module_parse(c.c, text, strlen(text), "step.dsir", &back), DSC_OK) << diags(c.c);
    dsc_string_free(c.c, text);
    EXPECT_EQ(phase_histogram(dsc_module_find_graph(back, dsc_graph_name(g))), phase_histogram(g));
    dsc_module_free(back);
    dsc_module_free(m);
  }
  // any other graph is all forward
  dsc_module *f = compile(c.c, 4);
  std::vector<unsigned char> fp = phases(dsc_module_find_graph(f, "forward"));
  EXPECT_EQ(std::count(fp.begin(), fp.end(), IR_PHASE_FORWARD), (long)fp.size());
  dsc_module_free(f);
}

// OneCycle (DeepSpeed's lr_schedules.py): the lr of step s is the
// scheduler's at iteration s - 1, cycle_min_lr at step 0; the cycle rises
// over first_steps iterations, falls over second_steps, then decays.
TEST(Schedule, OneCycle) {
  Ctx c;
  dsc_train_config cfg = default_config(c.c);
  cfg.opt.lr = 1.0;  // cycle_max_lr
  cfg.sched.kind = DSC_SCHED_ONE_CYCLE;
  cfg.sched.min_lr = 0.2;
  cfg.sched.first_steps = cfg.sched.second_steps = 4;
  const double sym[] = {0.2, 0.4, 0.6, 0.8, 1.0, 0.8, 0.6, 0.4, 0.2, 0.2, 0.2};
  for (int s = 0; s < 11; s++) EXPECT_NEAR(dsc_lr_at(&cfg, s), sym[s], 1e-15) << "step " << s;
  // after the cycle: cycle_min_lr / (1 + rate x iterations past it / decay_step_size)
  cfg.sched.decay_step_size = 2, cfg.sched.decay_lr_rate = 0.5;
  EXPECT_DOUBLE_EQ(dsc_lr_at(&cfg, 8), 0.2);  // the cycle's last iteration
  EXPECT_DOUBLE_EQ(dsc_lr_at(&cfg, 9), 0.2 / 1.25);
  EXPECT_DOUBLE_EQ(dsc_lr_at(&cfg, 12), 0.2 / 2.0);
  cfg.sched.decay_lr_rate = 0;  // a rate of 0 is no decay
  EXPECT_DOUBLE_EQ(dsc_lr_at(&cfg, 12), 0.2);
  // stairs: 2 per half, counted from the integer step
  cfg.sched.first_stairs = cfg.sched.second_stairs = 2;
  const double stairs[] = {0.2, 0.2, 0.6, 0.6, 1.0, 0.6, 0.6, 0.2, 0.2};
  for (int s = 0; s < 9; s++) EXPECT_NEAR(dsc_lr_at(&cfg, s), stairs[s], 1e-15) << "step " << s;
  // asymmetric halves: up in 2, down in 6
  cfg.sched.first_stairs = cfg.sched.second_stairs = 0;
  cfg.sched.first_steps = 2, cfg.sched.second_steps = 6;
  EXPECT_NEAR(dsc_lr_at(&cfg, 1), 0.6, 1e-15);
  EXPECT_NEAR(dsc_lr_at(&cfg, 2), 1.0, 1e-15);
  EXPECT_NEAR(dsc_lr_at(&cfg, 5), 0.2 + 0.8 * 0.5, 1e-15);
  EXPECT_NEAR(dsc_lr_at(&cfg, 8), 0.2, 1e-15);
}

// LRRangeTest: lr x (1 + step_rate x (s / step_size)), floored with staircase.
TEST(Schedule, LrRangeTest) {
  Ctx c;
  dsc_train_config cfg = default_config(c.c);
  cfg.opt.lr = 0.01;  // lr_range_test_min_lr
  cfg.sched.kind = DSC_SCHED_LR_RANGE_TEST;
  cfg.sched.step_size = 3, cfg.sched.step_rate = 2.0;
  for (int s = 0; s < 10; s++) {
    EXPECT_DOUBLE_EQ(dsc_lr_at(&cfg, s), 0.01 * (1 + 2.0 * (s / 3.0))) << "step " << s;
  }
  cfg.sched.staircase = true;
  for (int s = 0; s < 10; s++) {
    EXPECT_DOUBLE_EQ(dsc_lr_at(&cfg, s), 0.01 * (1 + 2.0 * (s / 3))) << "step " << s;
  }
}

}  // namespace
