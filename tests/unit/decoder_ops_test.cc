// The ops of modern decoders (issue: the Llama family): rope, grouped-query
// attention with kv_heads and scale, sin and cos. The interpreter is checked
// here against formulas written out as transformers writes them
// (modeling_llama.py: rotate_half, repeat_kv, eager attention); the
// decomposition against the interpreter is Decompose.Rope* and
// Decompose.AttentionGrouped*, the gradients AutodiffGrad.Rope and
// AutodiffGrad.Attention*, the cpu and cuda backends cli.llama_tiny.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "dsc/dsc.h"
#include "ir/ir.h"
#include "tests/unit/test_util.h"

namespace {

struct Graph {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  dsc_module *m = dsc_module_new(ctx, "t");
  dsc_graph *g = dsc_graph_new(m, "g");
  std::vector<dsc_tensor *> in;
  std::mt19937_64 rng{11};
  ~Graph() {
    for (dsc_tensor *t : in) dsc_tensor_free(ctx, t);
    dsc_module_free(m);
    dsc_context_free(ctx);
  }
  dsc_node *input(const char *name, dsc_dtype dt, std::vector<int64_t> dims, double lo, double hi,
                  bool integer = false) {
    dsc_type t = dsc_type_make(dt, (int)dims.size(), dims.data());
    dsc_tensor *x = dsc_tensor_new(ctx, t);
    std::uniform_real_distribution<double> u(lo, hi);
    for (int64_t i = 0; i < dsc_type_numel(&t); i++)
      x->data[i] = integer ? std::floor(u(rng)) : u(rng);
    in.push_back(x);
    return dsc_graph_input(g, name, t);
  }
  // Runs g with outputs outs; the caller frees the results.
  std::vector<dsc_tensor *> run(std::vector<dsc_node *> outs) {
    EXPECT_EQ(dsc_graph_set_outputs(g, outs.data(), (int)outs.size()), DSC_OK) << diags(ctx);
    std::vector<const dsc_tensor *> ins(in.begin(), in.end());
    std::vector<dsc_tensor *> r(outs.size(), nullptr);
    EXPECT_EQ(dsc_interp_run(g, nullptr, ins.data(), (int)ins.size(), r.data()), DSC_OK)
        << diags(ctx);
    return r;
  }
};

// transformers' Llama: inv_freq_i = theta^(-2i/hd), emb = cat(freqs, freqs),
// q_embed = q cos(emb) + rotate_half(q) sin(emb), rotate_half(x) =
// cat(-x2, x1); GPT-J's interleaved form rotates (x[2i], x[2i+1]).
TEST(DecoderOps, RopeIsTransformersRotateHalfAndGptJInterleaved) {
  for (bool inter : {false, true}) {
    Graph t;
    const int64_t B = 2, T = 5, H = 3, hd = 8, C = H * hd;
    const double theta = 10000.0;
    dsc_node *x = t.input("x", DSC_F64, {B, T, C}, -2, 2);
    dsc_node *p = t.input("p", DSC_I32, {B, T}, 0, 300, true);
    std::vector<dsc_tensor *> r = t.run({dsc_rope(t.g, x, p, H, theta, inter)});
    ASSERT_EQ(r.size(), 1u);
    ASSERT_NE(r[0], nullptr);
    const double *xv = t.in[0]->data, *pv = t.in[1]->data;
    double worst = 0;
    for (int64_t b = 0; b < B; b++)
      for (int64_t s = 0; s < T; s++)
        for (int64_t h = 0; h < H; h++)
          for (int64_t j = 0; j < hd; j++) {
            const double *row = xv + (b * T + s) * C + h * hd;
            double want;
            if (!inter) {
              int64_t i = j % (hd / 2);
              double a = pv[b * T + s] / std::pow(theta, 2.0 * (double)i / (double)hd);
              double rot = j < hd / 2 ? -row[j + hd / 2] : row[j - hd / 2];
              want = row[j] * std::cos(a) + rot * std::sin(a);
            } else {
              int64_t i = j / 2;
              double a = pv[b * T + s] / std::pow(theta, 2.0 * (double)i / (double)hd);
              double rot = j % 2 == 0 ? -row[j + 1] : row[j - 1];
              want = row[j] * std::cos(a) + rot * std::sin(a);
            }
            double got = r[0]->data[(b * T + s) * C + h * hd + j];
            worst = std::fmax(worst, std::fabs(got - want));
          }
    EXPECT_LT(worst, 1e-12) << (inter ? "interleaved" : "rotate-half");
    dsc_tensor_free(t.ctx, r[0]);
  }
}

// attention(q, k, v, heads = 6, kv_heads = 2) equals multi-head attention
// on k and v with each key/value head repeated for its 3 query heads
// (transformers' repeat_kv: query head h reads key/value head h / 3).
// Llama 3.1's scaled frequencies as transformers' _compute_llama3_parameters
// writes them (wavelength 2 pi / f against original_context / low and /
// high freq factor; between them (1 - s) f / factor + s f with s =
// (original_context / wavelength - low) / (high - low)), here over a head
// of 32 whose 16 frequencies fall in all three bands; the rotation is
// rope's at those frequencies.
TEST(DecoderOps, RopeLlama3ScalingIsTransformersFrequencies) {
  const int64_t T = 7, H = 1, hd = 32, half = hd / 2;
  const double theta = 10000.0, factor = 8, lo = 1, hi = 4, old = 256;
  Graph t;
  dsc_node *x = t.input("x", DSC_F64, {T, H * hd}, -2, 2);
  dsc_node *p = t.input("p", DSC_I64, {T}, 0, 5000, true);
  dsc_rope_scaling sc = {factor, lo, hi, (int64_t)old};
  std::vector<dsc_tensor *> r = t.run({dsc_rope_scaled(t.g, x, p, H, theta, false, &sc)});
  ASSERT_EQ(r.size(), 1u);
  int bands[3] = {0, 0, 0};
  double worst = 0;
  for (int64_t i = 0; i < half; i++) {
    double f = 1.0 / std::pow(theta, (double)(2 * i) / (double)hd), wl = 2 * M_PI / f, g;
    if (wl < old / hi) {
      g = f, bands[0]++;
    } else if (wl > old / lo) {
      g = f / factor, bands[2]++;
    } else {
      double s = (old / wl - lo) / (hi - lo);
      g = (1 - s) * f / factor + s * f, bands[1]++;
    }
    for (int64_t s = 0; s < T; s++) {
      const double *row = t.in[0]->data + s * hd;
      double a = t.in[1]->data[s] * g;
      double y0 = row[i] * std::cos(a) - row[i + half] * std::sin(a);
      double y1 = row[i + half] * std::cos(a) + row[i] * std::sin(a);
      worst = std::fmax(worst, std::fabs(r[0]->data[s * hd + i] - y0));
      worst = std::fmax(worst, std::fabs(r[0]->data[s * hd + i + half] - y1));
    }
  }
  EXPECT_GT(bands[0], 0);
  EXPECT_GT(bands[1], 0);
  EXPECT_GT(bands[2], 0);
  EXPECT_LE(worst, 1e-9);
  dsc_tensor_free(t.ctx, r[0]);
}

TEST(DecoderOps, GroupedQueryAttentionIsRepeatedKeyValueHeads) {
  for (bool causal : {true, false}) {
    Graph t;
    const int64_t B = 2, T = 4, S = 6, H = 6, KVH = 2, hd = 3, G = H / KVH;
    dsc_node *q = t.input("q", DSC_F64, {B, T, H * hd}, -1.5, 1.5);
    dsc_node *k = t.input("k", DSC_F64, {B, S, KVH * hd}, -1.5, 1.5);
    dsc_node *v = t.input("v", DSC_F64, {B, S, KVH * hd}, -1, 1);
    // repeat_kv written as inputs: kr[b, s, h hd + j] = k[b, s, (h / G) hd + j]
    dsc_node *kr = t.input("kr", DSC_F64, {B, S, H * hd}, 0, 0);
    dsc_node *vr = t.input("vr", DSC_F64, {B, S, H * hd}, 0, 0);
    for (int64_t b = 0; b < B; b++)
      for (int64_t s = 0; s < S; s++)
        for (int64_t h = 0; h < H; h++)
          for (int64_t j = 0; j < hd; j++) {
            int64_t to = (b * S + s) * H * hd + h * hd + j,
                    from = (b * S + s) * KVH * hd + (h / G) * hd + j;
            t.in[3]->data[to] = t.in[1]->data[from];
            t.in[4]->data[to] = t.in[2]->data[from];
          }
    dsc_node *gqa = dsc_attention(t.g, q, k, v, H, KVH, causal, 0.4);
    dsc_node *mha = dsc_attention(t.g, q, kr, vr, H, H, causal, 0.4);
    std::vector<dsc_tensor *> r = t.run({gqa, mha});
    ASSERT_EQ(r.size(), 2u);
    test_diff d = test_compare(r[0]->data, r[1]->data, B * T * H * hd);
    EXPECT_TRUE(d.nonzero);
    EXPECT_LE(d.err, 1e-14) << (causal ? "causal" : "full");
    for (dsc_tensor *x : r) dsc_tensor_free(t.ctx, x);
  }
}

// Causal with S > T: the queries are the last T of S positions, so query t
// sees keys 0 .. t + S - T; the key after that must not matter.
// Mistral's sliding window, as transformers masks it: query i sees key j
// when j <= i and i - j < window (here with more keys than queries, the
// queries being the last T); against a softmax written out over the keys
// that survive.
TEST(DecoderOps, SlidingWindowAttentionSeesTheLastWindowKeys) {
  const int64_t B = 2, T = 5, S = 7, H = 2, KVH = 1, hd = 3, W = 3;
  Graph t;
  dsc_node *q = t.input("q", DSC_F64, {B, T, H * hd}, -1, 1);
  dsc_node *k = t.input("k", DSC_F64, {B, S, KVH * hd}, -1, 1);
  dsc_node *v = t.input("v", DSC_F64, {B, S, KVH * hd}, -1, 1);
  double scale = 0.7;
  std::vector<dsc_tensor *> r =
      t.run({dsc_attention_windowed(t.g, q, k, v, H, KVH, true, scale, W)});
  ASSERT_EQ(r.size(), 1u);
  const double *qv = t.in[0]->data, *kv = t.in[1]->data, *vv = t.in[2]->data;
  double worst = 0;
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < H; h++)
      for (int64_t i = 0; i < T; i++) {
        int64_t qi = i + S - T;  // the query's position among the keys
        std::vector<double> w(S, 0.0);
        double mx = -INFINITY, den = 0;
        for (int64_t j = 0; j < S; j++) {
          if (j > qi || qi - j >= W) continue;
          double d = 0;
          for (int64_t c = 0; c < hd; c++)
            d += qv[(b * T + i) * H * hd + h * hd + c] * kv[(b * S + j) * KVH * hd + c];
          w[j] = d * scale;
          mx = std::fmax(mx, w[j]);
        }
        for (int64_t j = 0; j < S; j++)
          if (j <= qi && qi - j < W)
            den += (w[j] = std::exp(w[j] - mx));
          else
            w[j] = 0;
        for (int64_t c = 0; c < hd; c++) {
          double o = 0;
          for (int64_t j = 0; j < S; j++) o += w[j] / den * vv[(b * S + j) * KVH * hd + c];
          worst = std::fmax(worst, std::fabs(o - r[0]->data[(b * T + i) * H * hd + h * hd + c]));
        }
      }
  EXPECT_LE(worst, 1e-12);
  dsc_tensor_free(t.ctx, r[0]);
}

TEST(DecoderOps, CausalAttentionWithMoreKeysSeesThePast) {
  Graph t;
  const int64_t T = 3, S = 5, C = 4;
  dsc_node *q = t.input("q", DSC_F64, {1, T, C}, -1, 1);
  dsc_node *k = t.input("k", DSC_F64, {1, S, C}, -1, 1);
  dsc_node *v = t.input("v", DSC_F64, {1, S, C}, -1, 1);
  t.in[2]->data[(S - 1) * C] = 1e30;  // the last key's value: only the last query sees it
  std::vector<dsc_tensor *> r = t.run({dsc_attention(t.g, q, k, v, 2, 2, true, 0)});
  ASSERT_EQ(r.size(), 1u);
  for (int64_t i = 0; i < (T - 1) * C; i++) EXPECT_LT(std::fabs(r[0]->data[i]), 10.0) << i;
  EXPECT_GT(std::fabs(r[0]->data[(T - 1) * C]), 1e20);
  dsc_tensor_free(t.ctx, r[0]);
}

std::string compile_error(const std::string &body) {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  std::string text =
      "model m {\n  fn forward(x: f32[2, 4, 12], y: f32[2, 4, 4], p: f32[4]) {\n"
      "    return " +
      body + "\n  }\n}\n";
  dsc_module *m = nullptr;
  dsc_status st = dsc_compile_string(ctx, text.data(), text.size(), "m.dsm", nullptr, &m);
  std::string d = st == DSC_OK ? std::string("compiled") : diags(ctx);
  dsc_module_free(m);
  dsc_context_free(ctx);
  return d;
}

TEST(DecoderOps, BuiltinErrorsNameTheArgument) {
  const struct {
    const char *call, *message;
  } cases[] = {
      {"attention(x, y, y, heads = 3, kv_heads = 2)",
       "'kv_heads' must be positive and divide heads = 3, got 2"},
      {"attention(x, y, y, heads = 3, kv_heads = 0)",
       "'kv_heads' must be positive and divide heads = 3, got 0"},
      {"attention(x, y, y, heads = 6, kv_heads = 3)",
       "attention: k and v f32[2,4,4] must have kv_heads x head dim = 3 x 2 = 6 channels"},
      {"attention(x, x, x, heads = 3, scale = -1)", "'scale' must be positive, got -1"},
      {"rope(x, heads = 2, theta = 1)", "'theta' must be above 1, got 1"},
      {"rope(x, heads = 0)", "'heads' must be positive, got 0"},
      {"rope(x, heads = 4)",
       "rope: heads 4 must split the channel dim 12 of f32[2,4,12] into heads of an even size"},
      {"rope(x, heads = 2, positions = p)", "rope: positions must be i32 or i64, got f32[4]"},
      {"rope(x, heads = 2, interleaved = 1)", "argument 'interleaved' of 'rope' must be"},
      {"sin(x, x)", "'sin' takes 1 argument, got 2"},
      {"rope(x, heads = 2, factor = 0.5)", "'factor' must be at least 1 (1: no scaling), got 0.5"},
      {"rope(x, heads = 2, factor = 8, low_freq_factor = 1, high_freq_factor = 4)",
       "'rope' with factor 8 needs 'original_context' too (Llama 3.1's scaling)"},
      {"rope(x, heads = 2, low_freq_factor = 1)",
       "'low_freq_factor' scales the frequencies only with a 'factor' above 1"},
      {"rope(x, heads = 2, factor = 8, low_freq_factor = 4, high_freq_factor = 4, "
       "original_context = 64)",
       "'high_freq_factor' must be above 'low_freq_factor' > 0, got 4 and 4"},
      {"rope(x, heads = 2, factor = 8, low_freq_factor = 1, high_freq_factor = 4, "
       "original_context = 0)",
       "'original_context' must be positive, got 0"},
      {"attention(x, x, x, heads = 3, window = -1)",
       "'window' must be 0 (none) or positive with causal = true, got -1"},
      {"attention(x, x, x, heads = 3, causal = false, window = 2)",
       "'window' must be 0 (none) or positive with causal = true, got 2 and causal = false"},
      {"dropout(x, p = 1)", "'p' must be in [0, 1), got 1"},
      {"dropout(x, p = -0.1)", "'p' must be in [0, 1), got -0.1"},
      {"dropout(x)", "'dropout'"},
      {"dropout(x < x, p = 0.1)", "'dropout' needs a float tensor, got bool"},
  };
  for (const auto &c : cases) {
    std::string d = compile_error(c.call);
    EXPECT_NE(d.find(c.message), std::string::npos) << c.call << ": " << d;
  }
  EXPECT_EQ(compile_error("attention(x, y, y, heads = 6, kv_heads = 2) + rope(x, heads = 3)"),
            "compiled");
}

// dropout(x, p): an element drops when rand24(seed, stream 2^40 + i) falls
// under round(p 2^24), the rest are x / (1 - p) rounded to f32; over 2^16
// elements the dropped share is p within 5 standard deviations, for a seed
// near 0 and one near 2^53; streams and seeds give different masks, the
// same pair the same mask.
TEST(DecoderOps, DropoutDropsAShareOfPAndScalesTheRest) {
  const int64_t N = 1 << 16;
  for (double p : {0.1, 0.5, 0.9})
    for (double seed : {3.0, 9007199254740991.0}) {
      Graph t;
      dsc_node *x = t.input("x", DSC_F32, {N}, 0.5, 2.0);
      for (int64_t i = 0; i < N; i++) t.in[0]->data[i] = (double)(float)t.in[0]->data[i];
      dsc_node *s = t.input("seed", DSC_I64, {1}, 0, 1, true);
      t.in[1]->data[0] = seed;
      std::vector<dsc_tensor *> r =
          t.run({dsc_dropout(t.g, x, s, p, 0), dsc_dropout(t.g, x, s, p, 1),
                 dsc_dropout(t.g, x, s, p, 0)});
      ASSERT_EQ(r.size(), 3u);
      float scale = (float)(1.0 / (1.0 - p));
      int64_t dropped = 0, differ = 0, bad = 0;
      for (int64_t i = 0; i < N; i++) {
        double y = r[0]->data[i], xi = t.in[0]->data[i];
        bool drop = ir_rand24((int64_t)seed, i) < ir_dropout_threshold(p);
        dropped += y == 0;
        bad += drop ? y != 0 : y != (double)(float)(xi * (double)scale);
        differ += (r[1]->data[i] == 0) != (y == 0);
        EXPECT_EQ(r[2]->data[i], y);
      }
      double sd = std::sqrt(p * (1 - p) * (double)N);
      EXPECT_NEAR((double)dropped, p * (double)N, 5 * sd) << "p " << p << " seed " << seed;
      EXPECT_EQ(bad, 0);
      // two independent masks disagree on 2p(1-p) of the elements
      EXPECT_NEAR((double)differ, 2 * p * (1 - p) * (double)N, 10 * sd);
      for (dsc_tensor *o : r) dsc_tensor_free(t.ctx, o);
    }
}

// The frontend gives each dropout instance (a block's loop unrolls one per
// layer) its own stream and the graph one "dropout_seed" input, i64[1],
// after the model's own; an evaluation compile (opts.eval) or p = 0 leaves
// no dropout and no seed.
TEST(DecoderOps, DropoutStreamsSeedInputAndEval) {
  const char *text =
      "model m {\n  block h[3] {\n    param w: f32[4] = ones\n"
      "    fn forward(x: [2, 4]) -> [2, 4] { return dropout(x * w, p = 0.25) }\n  }\n"
      "  fn forward(x: f32[2, 4]) {\n    for l in h { x = l.forward(x) }\n"
      "    return sum(dropout(x, p = 0.0) + dropout(x, p = 0.5))\n  }\n}\n";
  for (bool eval : {false, true}) {
    dsc_context *ctx = dsc_context_new(nullptr, nullptr);
    dsc_frontend_options o = {nullptr, 0, eval};
    dsc_module *m = nullptr;
    ASSERT_EQ(dsc_compile_string(ctx, text, strlen(text), "m.dsm", &o, &m), DSC_OK) << diags(ctx);
    const dsc_graph *g = dsc_module_find_graph(m, "forward");
    std::vector<int64_t> streams;
    for (int i = 0; i < dsc_graph_node_count(g); i++) {
      const dsc_node *n = dsc_graph_node(g, i);
      if (dsc_node_op(n) != DSC_OP_DROPOUT) continue;
      streams.push_back(dsc_node_attr(n, "stream")->u.i);
      EXPECT_EQ(dsc_node_input(n, 1), dsc_graph_input_at(g, 1));
    }
    if (eval) {
      EXPECT_TRUE(streams.empty());
      EXPECT_EQ(dsc_graph_input_count(g), 1);
    } else {
      EXPECT_EQ(streams, (std::vector<int64_t>{0, 1, 2, 3}));
      ASSERT_EQ(dsc_graph_input_count(g), 2);
      dsc_type st = dsc_node_type(dsc_graph_input_at(g, 1));
      EXPECT_STREQ(dsc_node_name(dsc_graph_input_at(g, 1)), "dropout_seed");
      EXPECT_TRUE(st.dtype == DSC_I64 && st.rank == 1 && st.dims[0] == 1);
    }
    dsc_module_free(m);
    dsc_context_free(ctx);
  }
}

TEST(DecoderOps, SinAndCosFoldAndEvaluate) {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  const char *text =
      "model m {\n  const c = sin(0.5) + cos(0.25)\n"
      "  fn forward(x: f64[3]) { return sin(x) * cos(x) + c }\n}\n";
  dsc_module *m = nullptr;
  ASSERT_EQ(dsc_compile_string(ctx, text, strlen(text), "m.dsm", nullptr, &m), DSC_OK)
      << diags(ctx);
  const dsc_graph *g = dsc_module_find_graph(m, "forward");
  dsc_tensor *x = dsc_tensor_new(ctx, dsc_node_type(dsc_graph_input_at(g, 0)));
  const double xs[3] = {-2.0, 0.3, 7.5};
  for (int i = 0; i < 3; i++) x->data[i] = xs[i];
  dsc_tensor *y = nullptr;
  ASSERT_EQ(dsc_interp_run(g, nullptr, &x, 1, &y), DSC_OK) << diags(ctx);
  for (int i = 0; i < 3; i++)
    EXPECT_NEAR(y->data[i], std::sin(xs[i]) * std::cos(xs[i]) + std::sin(0.5) + std::cos(0.25),
                1e-15);
  dsc_tensor_free(ctx, x);
  dsc_tensor_free(ctx, y);
  dsc_module_free(m);
  dsc_context_free(ctx);
}

}  // namespace
