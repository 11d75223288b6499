// The Mixture-of-Experts layer of examples/lib/moe.dsm against its
// definition computed here (DeepSpeed's top1gating / top2gating: choices by
// gate, slots in token order with second choices after every first choice,
// drops past the capacity, top-2 gates normalised over the kept ones), at
// capacities that drop tokens and at the no-drop capacity; the losses.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "dsc/dsc.h"
#include "tests/unit/test_util.h"

namespace {

const int S = 12, D = 4, E = 3, F = 5;

// forward: the layer's output, or (losses) its weighted losses.
std::string model_text(int top2, int capacity, bool losses) {
  return R"(
import "lib/moe.dsm"
model moe_layer {
  const d = 4, experts = 3, ffn = 5, tokens = 12, top2 = )" +
         std::to_string(top2) + ", capacity = " + std::to_string(capacity) + R"(
  param router: f64[d, experts] = normal(1.0)
  param fc_w: f64[experts, d, ffn] = normal(0.5)
  param fc_b: f64[experts, 1, ffn] = normal(0.5)
  param fc_proj_w: f64[experts, ffn, d] = normal(0.5)
  param fc_proj_b: f64[experts, 1, d] = normal(0.5)
  fn layer(x: f64[tokens, d]) -> f64[tokens, d] {
    c1 = moe_choice(x, router, tokens, experts, top2, capacity, f64, 0)
    c2 = moe_choice(x, router, tokens, experts, top2, capacity, f64, 1)
    out = moe_expert_mlp(moe_dispatch(x, c1, c2, tokens, experts, capacity, f64), fc_w, fc_b,
                         fc_proj_w, fc_proj_b)
    return moe_combine(out, c1, c2, moe_weights(x, router, c1, c2, top2), tokens, experts,
                       capacity, f64)
  }
  fn losses(x: f64[tokens, d]) -> f64 {
    return 10.0 * moe_balance_loss(x, router, experts, f64) + moe_z_loss(x, router)
  }
  fn forward(x: f64[tokens, d]) -> )" +
         (losses ? "f64 { return losses(x) }" : "f64[tokens, d] { return layer(x) }") + R"(
}
)";
}

double gelu(double v) {
  return 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
}

struct Ref {
  std::vector<double> y;  // [S, D]
  int dropped = 0;        // choices that found no slot
  double balance = 0, z = 0;
};

// The definition, from the params p (in the module's order) and x.
Ref reference(const dsc_params *p, const double *x, int top2, int capacity) {
  const double *wg = dsc_params_find(p, "router")->data, *w1 = dsc_params_find(p, "fc_w")->data,
               *b1 = dsc_params_find(p, "fc_b")->data, *w2 = dsc_params_find(p, "fc_proj_w")->data,
               *b2 = dsc_params_find(p, "fc_proj_b")->data;
  std::vector<std::vector<double>> g(S, std::vector<double>(E)), logit = g;
  std::vector<int> first(S), second(S, -1);
  for (int s = 0; s < S; s++) {
    double mx = -1e300, sum = 0;
    for (int e = 0; e < E; e++) {
      double l = 0;
      for (int k = 0; k < D; k++) l += x[s * D + k] * wg[k * E + e];
      logit[s][e] = l, mx = std::max(mx, l);
    }
    for (int e = 0; e < E; e++) sum += (g[s][e] = std::exp(logit[s][e] - mx));
    for (int e = 0; e < E; e++) g[s][e] /= sum;
    first[s] = (int)(std::max_element(g[s].begin(), g[s].end()) - g[s].begin());
    if (top2) {
      double best = -1;
      for (int e = 0; e < E; e++)
        if (e != first[s] && g[s][e] > best) best = g[s][e], second[s] = e;
    }
  }
  // Slots: first choices in token order, then second choices after all first ones.
  std::vector<int> used(E, 0), loc1(S), loc2(S, -1);
  for (int s = 0; s < S; s++) loc1[s] = used[first[s]]++;
  for (int s = 0; s < S; s++)
    if (second[s] >= 0) loc2[s] = used[second[s]]++;
  Ref r;
  r.y.assign(S * D, 0.0);
  for (int s = 0; s < S; s++) {
    bool k1 = loc1[s] < capacity, k2 = second[s] >= 0 && loc2[s] < capacity;
    r.dropped += !k1 + (second[s] >= 0 && !k2);
    double g1 = k1 ? g[s][first[s]] : 0, g2 = k2 ? g[s][second[s]] : 0;
    double denom = top2 ? std::max(g1 + g2, 1e-12) : 1.0;
    for (int c = 0; c < 2; c++) {
      int e = c ? second[s] : first[s];
      double w = (c ? g2 : g1) / denom;
      if (e < 0 || w == 0) continue;
      std::vector<double> h(F);
      for (int f = 0; f < F; f++) {
        double v = b1[e * F + f];
        for (int k = 0; k < D; k++) v += x[s * D + k] * w1[(e * D + k) * F + f];
        h[f] = gelu(v);
      }
      for (int k = 0; k < D; k++) {
        double v = b2[e * D + k];
        for (int f = 0; f < F; f++) v += h[f] * w2[(e * F + f) * D + k];
        r.y[s * D + k] += w * v;
      }
    }
  }
  // Balance: E * sum_e (share of first choices of e) * (mean gate of e); z: mean lse^2.
  for (int e = 0; e < E; e++) {
    double share = 0, mean = 0;
    for (int s = 0; s < S; s++) share += first[s] == e, mean += g[s][e];
    r.balance += (share / S) * (mean / S);
  }
  r.balance *= E;
  for (int s = 0; s < S; s++) {
    double mx = *std::max_element(logit[s].begin(), logit[s].end()), sum = 0;
    for (int e = 0; e < E; e++) sum += std::exp(logit[s][e] - mx);
    double lse = mx + std::log(sum);
    r.z += lse * lse / S;
  }
  return r;
}

struct Case {
  int top2, capacity;
  bool drops;  // the reference must drop some choice (the case tests dropping)
  // a router of zeros: every gate ties, and each choice is the first of
  // the equal largest gates (argmax's), as the reference's max_element
  bool tied = false;
};

class MoeLayer : public ::testing::TestWithParam<Case> {};

TEST_P(MoeLayer, EqualsItsDefinition) {
  const Case c = GetParam();
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  std::string file = std::string(DSC_SOURCE_DIR) + "/examples/moe_layer.dsm";
  dsc_module *m = nullptr, *ml = nullptr;
  for (bool losses : {false, true}) {
    std::string text = model_text(c.top2, c.capacity, losses);
    ASSERT_EQ(dsc_compile_string(ctx, text.c_str(), text.size(), file.c_str(), nullptr,
                                 losses ? &ml : &m),
              DSC_OK)
        << diags(ctx);
  }
  dsc_params *p = dsc_params_init(m, 7);
  if (c.tied) {
    dsc_tensor *router = dsc_params_find(p, "router");
    for (int64_t i = 0; i < dsc_type_numel(&router->type); i++) router->data[i] = 0;
  }
  std::mt19937_64 rng(5);
  std::normal_distribution<double> n01;
  dsc_tensor *x = dsc_tensor_new(ctx, dsc_type_make(DSC_F64, 2, std::vector<int64_t>{S, D}.data()));
  for (int i = 0; i < S * D; i++) x->data[i] = n01(rng);
  Ref want = reference(p, x->data, c.top2, c.capacity);
  EXPECT_EQ(want.dropped > 0, c.drops) << want.dropped << " choices dropped";
  const dsc_tensor *in[1] = {x};
  dsc_tensor *y = nullptr, *l = nullptr;
  ASSERT_EQ(dsc_interp_run(dsc_module_find_graph(m, "forward"), p, in, 1, &y), DSC_OK)
      << diags(ctx);
  for (int i = 0; i < S * D; i++)
    EXPECT_NEAR(y->data[i], want.y[i], 1e-12 * (1 + std::fabs(want.y[i]))) << "element " << i;
  ASSERT_EQ(dsc_interp_run(dsc_module_find_graph(ml, "forward"), p, in, 1, &l), DSC_OK)
      << diags(ctx);
  EXPECT_NEAR(l->data[0], 10 * want.balance + want.z, 1e-12 * (10 * want.balance + want.z));
  dsc_tensor_free(ctx, y);
  dsc_tensor_free(ctx, l);
  dsc_tensor_free(ctx, x);
  dsc_params_free(p);
  dsc_module_free(m);
  dsc_module_free(ml);
  dsc_context_free(ctx);
}

// 12 tokens over 3 experts: capacity 3 drops (top-1 needs 4 per expert when
// balanced, top-2 8); 12 (top-1) and 24 (top-2) never drop.
INSTANTIATE_TEST_SUITE_P(Capacities, MoeLayer,
                         ::testing::Values(Case{0, 3, true}, Case{0, 12, false}, Case{1, 3, true},
                                           Case{1, 5, true}, Case{1, 24, false},
                                           Case{0, 12, false, true}, Case{1, 24, false, true}));

}  // namespace
