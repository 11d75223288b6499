// Pass kv_cache (passes/kv_cache.c): the inference graphs with a paged KV
// cache give, at every position, the logits of the full forward over the
// whole prefix (the interpreter's, f64 over the f32 model), on the
// interpreter and compiled; with prompt chunks, one-token steps, idle
// slots, a slot reused for a new sequence, and the blocks of the pool
// handed out in a shuffled order (a new one each round, so a sequence lands
// on blocks another slot wrote before); and greedy generation through the
// cache picks the same tokens as recomputing the whole window each time.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

extern "C" {
#include "codegen/codegen.h"
}
#include "dsc/dsc.h"
#include "passes/passes.h"
#include "tests/unit/test_util.h"

namespace {

const std::string kGpt = std::string(DSC_SOURCE_DIR) + "/examples/gpt-tiny.dsm";
const std::string kLlama = std::string(DSC_SOURCE_DIR) + "/examples/llama-tiny.dsm";
constexpr int64_t kV = 256;
constexpr int64_t kBlock = 4;  // positions per block of the tests' pools

struct Ctx {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  std::vector<dsc_module *> mods;
  ~Ctx() {
    for (dsc_module *m : mods) dsc_module_free(m);
    dsc_context_free(ctx);
  }
  dsc_module *forward(const std::string &path, int64_t B, int64_t T) {
    dsc_dim_binding dims[2] = {{"B", B}, {"T", T}};
    dsc_frontend_options fo = {dims, 2, true};
    dsc_module *m = nullptr;
    EXPECT_EQ(dsc_compile_file(ctx, path.c_str(), &fo, &m), DSC_OK) << diags(ctx);
    if (m) mods.push_back(m);
    return m;
  }
};

// The inference module of `path`: prefill at [B, chunk], decode at [B, 1],
// a pool of `pool` rows; each seeing the whole context, and again as
// "prefill.half" and "decode.half" seeing its first half.
dsc_module *inference(Ctx *c, const std::string &path, int64_t B, int64_t chunk, int64_t context,
                      int64_t pool) {
  dsc_module *m = dsc_module_new(c->ctx, "infer");
  c->mods.push_back(m);
  dsc_module *p = c->forward(path, B, chunk), *d = c->forward(path, B, 1);
  if (!p || !d) return nullptr;
  EXPECT_EQ(pass_kv_cache_graph(m, dsc_module_find_graph(p, "forward"), "prefill", context, context,
                                pool),
            DSC_OK)
      << diags(c->ctx);
  EXPECT_EQ(
      pass_kv_cache_graph(m, dsc_module_find_graph(d, "forward"), "decode", context, context, pool),
      DSC_OK)
      << diags(c->ctx);
  EXPECT_EQ(pass_kv_cache_graph(m, dsc_module_find_graph(p, "forward"), "prefill.half", context,
                                context / 2, pool),
            DSC_OK)
      << diags(c->ctx);
  EXPECT_EQ(pass_kv_cache_graph(m, dsc_module_find_graph(d, "forward"), "decode.half", context,
                                context / 2, pool),
            DSC_OK)
      << diags(c->ctx);
  EXPECT_EQ(dsc_module_verify(m), DSC_OK) << diags(c->ctx);
  return m;
}

// Full-forward logits [B, T, V] of tokens under params p (the interpreter;
// full's forward made a logits graph).
std::vector<double> full_logits(Ctx *c, dsc_module *full, const dsc_params *p,
                                const std::vector<int> &tokens) {
  dsc_graph *g = dsc_module_find_graph(full, "forward");
  dsc_tensor *tok = dsc_tensor_new(c->ctx, dsc_node_type(dsc_graph_input_at(g, 0)));
  dsc_tensor *tgt = dsc_tensor_new(c->ctx, dsc_node_type(dsc_graph_input_at(g, 1)));
  for (size_t i = 0; i < tokens.size(); i++) tok->data[i] = tokens[i];
  const dsc_tensor *in[2] = {tok, tgt};
  dsc_tensor *out = nullptr;
  EXPECT_EQ(dsc_interp_run(g, p, in, 2, &out), DSC_OK) << diags(c->ctx);
  std::vector<double> r;
  if (out) r.assign(out->data, out->data + dsc_type_numel(&out->type));
  dsc_tensor_free(c->ctx, out);
  dsc_tensor_free(c->ctx, tok);
  dsc_tensor_free(c->ctx, tgt);
  return r;
}

// Runs the graphs as driver/infer.c does, with its own block tables: the
// i-th block of slot b (i < used) is block perm[b * used + i] of the pool;
// the graphs of half the context when every slot's tokens lie in it.
struct Engine {
  Ctx *c;
  dsc_exec *e = nullptr;
  dsc_tensor *in[2][2][5] = {};  // [prefill, decode][whole, half]
  int64_t B, chunk, used, half_runs = 0;
  std::vector<int64_t> perm;
  Engine(Ctx *cx, dsc_module *m, dsc_backend be, const dsc_params *p, int64_t B_, int64_t chunk_,
         int64_t used_)
      : c(cx), B(B_), chunk(chunk_), used(used_) {
    shuffle(1);
    if (be != DSC_BACKEND_INTERP) {
      EXPECT_EQ(dsc_run_codegen_passes(m), DSC_OK) << diags(c->ctx);
    }
    dsc_exec_options o = {be, 2, "off"};
    EXPECT_EQ(dsc_exec_new(m, &o, &e), DSC_OK) << diags(c->ctx);
    if (e) {
      EXPECT_EQ(dsc_exec_load_params(e, p), DSC_OK) << diags(c->ctx);
    }
    const char *names[2][2] = {{"prefill", "prefill.half"}, {"decode", "decode.half"}};
    for (int g = 0; g < 2; g++)
      for (int h = 0; h < 2; h++)
        for (int i = 0; i < 5; i++)
          in[g][h][i] = dsc_tensor_new(
              c->ctx, dsc_node_type(dsc_graph_input_at(dsc_module_find_graph(m, names[g][h]), i)));
  }
  ~Engine() {
    for (auto &g : in)
      for (auto &h : g)
        for (dsc_tensor *t : h) dsc_tensor_free(c->ctx, t);
    dsc_exec_free(e);
  }
  void shuffle(unsigned seed) {
    perm.resize(B * used);
    for (size_t i = 0; i < perm.size(); i++) perm[i] = (int64_t)i;
    std::shuffle(perm.begin(), perm.end(), std::mt19937(seed));
  }
  // n[b] tokens of slot b at pos[b]; idle slots (n 0) get position `context`
  // (nothing written). Returns logits [B, V].
  std::vector<double> step(const std::vector<int64_t> &n, const std::vector<int64_t> &pos,
                           const std::vector<std::vector<int>> &toks, int64_t context) {
    bool pre = std::any_of(n.begin(), n.end(), [](int64_t k) { return k > 1; });
    bool half = true;
    for (int64_t b = 0; b < B; b++) half &= n[b] == 0 || pos[b] + n[b] <= context / 2;
    int g = pre ? 0 : 1;
    int64_t t = pre ? chunk : 1, S = half ? context / 2 : context;
    dsc_tensor **x = in[g][half];
    for (int64_t b = 0; b < B; b++) {
      for (int64_t j = 0; j < t; j++) x[0]->data[b * t + j] = j < n[b] ? toks[b][pos[b] + j] : 0;
      x[1]->data[b] = n[b] ? pos[b] : context;
      x[2]->data[b] = n[b] ? n[b] - 1 : 0;
    }
    double *rows = x[3]->data, *dest = x[4]->data;
    for (int64_t r = 0; r < B * t; r++) dest[r] = -1;
    for (int64_t b = 0; b < B; b++) {
      for (int64_t s = 0; s < S; s++)
        rows[b * S + s] =
            s / kBlock < used ? (double)(perm[b * used + s / kBlock] * kBlock + s % kBlock) : 0;
      for (int64_t j = 0; j < n[b]; j++) dest[b * t + j] = rows[b * S + pos[b] + j];
    }
    dsc_tensor *out = nullptr;
    const dsc_tensor *ins[5] = {x[0], x[1], x[2], x[3], x[4]};
    std::string name = std::string(pre ? "prefill" : "decode") + (half ? ".half" : "");
    half_runs += half;
    EXPECT_EQ(dsc_exec_run(e, name.c_str(), ins, 5, &out), DSC_OK) << diags(c->ctx);
    std::vector<double> r;
    if (out) r.assign(out->data, out->data + dsc_type_numel(&out->type));
    dsc_tensor_free(c->ctx, out);
    return r;
  }
};

// Slot 0 takes its prompt (12 tokens) in chunks of 5, then one token a
// step; slot 1 starts 3 steps later, one token a step. Twice: the second
// round starts new sequences at position 0 over what the first left, on
// blocks shuffled again. The pool holds the 24 positions of each sequence,
// less than the context of 32 for each slot.
void check_positions(const std::string &path, dsc_backend be, double tol) {
  Ctx c;
  const int64_t B = 2, T = 24, chunk = 5, context = 32;
  dsc_module *full = c.forward(path, B, T);
  ASSERT_NE(full, nullptr);
  dsc_params *p = dsc_params_init(full, 11);
  ASSERT_EQ(dsc_make_logits_graph(dsc_module_find_graph(full, "forward")), DSC_OK);
  const int64_t used = T / kBlock;
  dsc_module *m = inference(&c, path, B, chunk, context, B * used * kBlock);
  ASSERT_NE(m, nullptr);
  Engine eng(&c, m, be, p, B, chunk, used);
  ASSERT_NE(eng.e, nullptr);
  std::mt19937 rng(5);
  for (int round = 0; round < 2; round++) {
    eng.shuffle(7 + round);
    std::vector<int> flat(B * T);
    for (int &x : flat) x = (int)(rng() % kV);
    std::vector<std::vector<int>> toks = {std::vector<int>(flat.begin(), flat.begin() + T),
                                          std::vector<int>(flat.begin() + T, flat.end())};
    std::vector<double> L = full_logits(&c, full, p, flat);
    ASSERT_EQ(L.size(), (size_t)(B * T * kV));
    std::vector<int64_t> done = {0, 0};
    for (int s = 0; done[0] < T || done[1] < T; s++) {
      std::vector<int64_t> n(B, 0);
      n[0] = done[0] >= T ? 0 : done[0] < 12 ? std::min<int64_t>(chunk, 12 - done[0]) : 1;
      n[1] = s < 3 || done[1] >= T ? 0 : 1;
      std::vector<double> out = eng.step(n, done, toks, context);
      ASSERT_EQ(out.size(), (size_t)(B * kV));
      for (int64_t b = 0; b < B; b++) {
        if (!n[b]) continue;
        int64_t at = done[b] + n[b] - 1;
        const double *want = &L[(b * T + at) * kV];
        double err = 0, mag = 0;
        for (int64_t v = 0; v < kV; v++) {
          err = std::max(err, std::fabs(out[b * kV + v] - want[v]));
          mag = std::max(mag, std::fabs(want[v]));
        }
        EXPECT_LE(err, tol * (1 + mag))
            << path << " round " << round << " slot " << b << " position " << at;
        done[b] += n[b];
      }
    }
  }
  EXPECT_GT(eng.half_runs, 10) << "the graphs of half the context ran";
  dsc_params_free(p);
}

TEST(KvCache, GptLogitsEqualTheFullForwardOnTheInterpreter) {
  check_positions(kGpt, DSC_BACKEND_INTERP, 1e-5);
}
TEST(KvCache, LlamaLogitsEqualTheFullForwardOnTheInterpreter) {
  check_positions(kLlama, DSC_BACKEND_INTERP, 1e-5);
}
TEST(KvCache, GptLogitsEqualTheFullForwardCompiled) {
  check_positions(kGpt, DSC_BACKEND_CPU, 1e-4);
}
TEST(KvCache, LlamaLogitsEqualTheFullForwardCompiled) {
  check_positions(kLlama, DSC_BACKEND_CPU, 1e-4);
}

// llama-tiny with a sliding window of 5 keys (Mistral's sliding_window):
// positions more than 4 back are masked in the cache too.
TEST(KvCache, SlidingWindowLogitsEqualTheFullForward) {
  std::ifstream in(kLlama);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string text = ss.str();
  const std::string from = "causal = true)", to = "causal = true, window = 5)";
  size_t at = text.find(from);
  ASSERT_NE(at, std::string::npos);
  text.replace(at, from.size(), to);
  std::string path = std::string(DSC_BINARY_DIR) + "/kv_cache_window_test.dsm";
  std::ofstream(path) << text;
  check_positions(path, DSC_BACKEND_INTERP, 1e-5);
  check_positions(path, DSC_BACKEND_CPU, 1e-4);
}

int64_t argmax(const double *v, int64_t n) { return std::max_element(v, v + n) - v; }

// Greedy, f32, compiled: the cache against the whole window run each time.
void check_greedy(const std::string &path) {
  Ctx c;
  const int64_t T = 32, prompt = 7, chunk = 4;
  dsc_module *full = c.forward(path, 1, T);
  ASSERT_NE(full, nullptr);
  dsc_params *p = dsc_params_init(full, 3);
  ASSERT_EQ(dsc_make_logits_graph(dsc_module_find_graph(full, "forward")), DSC_OK);
  ASSERT_EQ(dsc_run_codegen_passes(full), DSC_OK) << diags(c.ctx);
  dsc_exec_options o = {DSC_BACKEND_CPU, 2, "off"};
  dsc_exec *fe = nullptr;
  ASSERT_EQ(dsc_exec_new(full, &o, &fe), DSC_OK) << diags(c.ctx);
  ASSERT_EQ(dsc_exec_set_params(fe, p), DSC_OK) << diags(c.ctx);
  dsc_graph *fg = dsc_module_find_graph(full, "forward");
  dsc_tensor *tok = dsc_tensor_new(c.ctx, dsc_node_type(dsc_graph_input_at(fg, 0)));
  dsc_tensor *tgt = dsc_tensor_new(c.ctx, dsc_node_type(dsc_graph_input_at(fg, 1)));
  std::vector<int> seq = {10, 200, 33, 47, 99, 150, 7};
  while ((int64_t)seq.size() < T) {  // the whole window, each time
    for (size_t i = 0; i < seq.size(); i++) tok->data[i] = seq[i];
    const dsc_tensor *in[2] = {tok, tgt};
    dsc_tensor *out = nullptr;
    ASSERT_EQ(dsc_exec_run(fe, "forward", in, 2, &out), DSC_OK) << diags(c.ctx);
    seq.push_back((int)argmax(out->data + (seq.size() - 1) * kV, kV));
    dsc_tensor_free(c.ctx, out);
  }
  dsc_tensor_free(c.ctx, tok);
  dsc_tensor_free(c.ctx, tgt);
  dsc_exec_free(fe);

  dsc_module *m = inference(&c, path, 1, chunk, T, T);
  ASSERT_NE(m, nullptr);
  Engine eng(&c, m, DSC_BACKEND_CPU, p, 1, chunk, T / kBlock);
  std::vector<std::vector<int>> toks = {std::vector<int>(seq.begin(), seq.begin() + prompt)};
  toks[0].resize(T);
  std::vector<int64_t> done = {0};
  while (done[0] < T - 1) {
    int64_t k = done[0] < prompt ? std::min<int64_t>(chunk, prompt - done[0]) : 1;
    std::vector<double> out = eng.step({k}, done, toks, T);
    done[0] += k;
    if (done[0] >= prompt) toks[0][done[0]] = (int)argmax(out.data(), kV);
  }
  for (int64_t i = prompt; i < T; i++)
    EXPECT_EQ(toks[0][i], seq[i]) << path << ": token " << i << " differs";
  dsc_params_free(p);
}

TEST(KvCache, GptGreedyTokensEqualFullRecomputation) { check_greedy(kGpt); }
TEST(KvCache, LlamaGreedyTokensEqualFullRecomputation) { check_greedy(kLlama); }

// Every kernel of the prefill and decode graphs compiles with NVRTC for
// sm_90 (no GPU needed): the graphs are plain IR, so the CUDA printer takes
// them as it takes a training step.
void check_nvrtc(const std::string &path) {
#ifndef DSC_HAVE_CUDA
  GTEST_SKIP() << "built without the CUDA toolkit";
#else
  Ctx c;
  dsc_module *m = inference(&c, path, 2, 8, 64, 2 * 64);
  ASSERT_NE(m, nullptr);
  ASSERT_EQ(dsc_run_codegen_passes(m), DSC_OK) << diags(c.ctx);
  for (const char *name : {"prefill", "decode"}) {
    ir_arena a;
    ir_arena_init(&a, c.ctx);
    cg_program *p = nullptr;
    ASSERT_EQ(cg_lower_graph(dsc_module_find_graph(m, name), &a, &p), DSC_OK) << diags(c.ctx);
    ASSERT_GT(p->n_kernels, 0);
    char *src = cg_cuda_program_source(&a, p->kernels, p->n_kernels);
    ASSERT_NE(src, nullptr) << diags(c.ctx);
    char *ptx = nullptr;
    void *cubin = nullptr;
    size_t ptx_len = 0, cubin_len = 0;
    EXPECT_EQ(cg_nvrtc_compile(c.ctx, src, "kv_cache.cu", 90, &ptx, &ptx_len, &cubin, &cubin_len),
              DSC_OK)
        << path << " " << name << ": " << diags(c.ctx).substr(0, 20000);
    std::string text(ptx ? ptx : "");
    for (int i = 0; i < p->n_kernels; i++)
      EXPECT_NE(text.find(std::string(".visible .entry ") + p->kernels[i]->name + "("),
                std::string::npos)
          << name << ": " << p->kernels[i]->name;
    free(ptx);
    free(cubin);
    ir_arena_release(&a);
  }
#endif
}

TEST(KvCache, GptKernelsCompileWithNvrtc) { check_nvrtc(kGpt); }
TEST(KvCache, LlamaKernelsCompileWithNvrtc) { check_nvrtc(kLlama); }

// What the pass refuses, naming why.
TEST(KvCache, RefusesAModelWithoutItsLoss) {
  Ctx c;
  dsc_module *f = c.forward(kGpt, 1, 4);
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(dsc_make_logits_graph(dsc_module_find_graph(f, "forward")), DSC_OK);
  dsc_module *m = dsc_module_new(c.ctx, "infer");
  c.mods.push_back(m);
  EXPECT_EQ(pass_kv_cache_graph(m, dsc_module_find_graph(f, "forward"), "decode", 8, 8, 8),
            DSC_ERR_USER);
  EXPECT_NE(diags(c.ctx).find("cross_entropy"), std::string::npos) << diags(c.ctx);
}

TEST(KvCache, RefusesACacheShorterThanItsRows) {
  Ctx c;
  dsc_module *f = c.forward(kGpt, 1, 8);
  ASSERT_NE(f, nullptr);
  dsc_module *m = dsc_module_new(c.ctx, "infer");
  c.mods.push_back(m);
  EXPECT_EQ(pass_kv_cache_graph(m, dsc_module_find_graph(f, "forward"), "prefill", 4, 4, 4),
            DSC_ERR_USER);
  EXPECT_NE(diags(c.ctx).find("cannot take rows of 8"), std::string::npos) << diags(c.ctx);
}

}  // namespace
