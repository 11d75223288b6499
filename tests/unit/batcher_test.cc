// Continuous batching (driver/batcher.c): requests that share the engine's
// steps (admitted while others run, prompts in chunks beside single-token
// steps, greedy, sampled with a seed, top-k and top-p) each get exactly the
// tokens they get alone, also when the KV cache's pool is too small for
// all of them at once and the youngest are preempted and run again; a
// cancelled request frees its slot and blocks for the queue; a stop token
// ends a request; a request that cannot fit is refused with its reason.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "dsc/dsc.h"
#include "tests/unit/test_util.h"

namespace {

const std::string kGpt = std::string(DSC_SOURCE_DIR) + "/examples/gpt-tiny.dsm";
const std::string kLlama = std::string(DSC_SOURCE_DIR) + "/examples/llama-tiny.dsm";

// A checkpoint of `model` with its initial weights (seed 7), removed at the end.
struct Checkpoint {
  std::string dir;
  Checkpoint(const std::string &model, const char *tag)
      : dir(std::string(DSC_BINARY_DIR) + "/batcher_test_" + tag + "_" + std::to_string(getpid())) {
    dsc_context *ctx = dsc_context_new(nullptr, nullptr);
    dsc_dim_binding dims[2] = {{"B", 1}, {"T", 8}};
    dsc_frontend_options fo = {dims, 2, true};
    dsc_module *m = nullptr;
    EXPECT_EQ(dsc_compile_file(ctx, model.c_str(), &fo, &m), DSC_OK) << diags(ctx);
    if (m) {
      dsc_params *p = dsc_params_init(m, 7);
      int n = dsc_module_param_count(m);
      std::vector<const char *> names(n);
      std::vector<dsc_tensor *> tensors(n);
      for (int i = 0; i < n; i++)
        names[i] = dsc_module_param_name(m, i), tensors[i] = dsc_params_get(p, i);
      dsc_tensor_set set = {n, names.data(), tensors.data(), 0, nullptr};
      dsc_kv extra[1] = {{"model", model.c_str()}};
      dsc_checkpoint_state state{};
      state.rng[0] = 1;  // any state but all zero
      state.extra = extra, state.n_extra = 1;
      EXPECT_EQ(dsc_checkpoint_save(ctx, dir.c_str(), &set, nullptr, &state, 0), DSC_OK)
          << diags(ctx);
      dsc_params_free(p);
      dsc_module_free(m);
    }
    dsc_context_free(ctx);
  }
  ~Checkpoint() { std::filesystem::remove_all(dir); }
};

struct Req {
  std::vector<int64_t> prompt;
  dsc_request_options o;
  int64_t at_step;  // submitted before this step of the shared run
};

struct Batched {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  dsc_infer *e = nullptr;
  dsc_batcher *b = nullptr;
  Batched(const std::string &ck, dsc_backend be, int64_t slots, int64_t chunk, int64_t context,
          int64_t cache_tokens = 0, int64_t block = 0) {
    dsc_exec_options xo = {be, 2, "off"};
    dsc_infer_options io = {ck.c_str(), nullptr, &xo, slots, chunk, context, block, cache_tokens};
    EXPECT_EQ(dsc_infer_open(ctx, &io, &e), DSC_OK) << diags(ctx);
    if (e) {
      EXPECT_EQ(dsc_batcher_new(ctx, e, &b), DSC_OK) << diags(ctx);
    }
  }
  ~Batched() {
    dsc_batcher_free(b);
    dsc_infer_free(e);
    dsc_context_free(ctx);
  }
  int64_t submit(const Req &r) {
    int64_t id = 0;
    char why[256] = "";
    EXPECT_EQ(dsc_batcher_submit(b, r.prompt.data(), (int64_t)r.prompt.size(), &r.o, &id, why,
                                 sizeof why),
              DSC_OK)
        << why;
    return id;
  }
  std::vector<int64_t> output(int64_t id, dsc_finish *f = nullptr) {
    int64_t n = 0;
    dsc_finish fin;
    const int64_t *t = dsc_batcher_output(b, id, &n, &fin);
    if (f) *f = fin;
    return std::vector<int64_t>(t, t + n);
  }
  // Runs the requests, each submitted before its step; returns their tokens.
  std::vector<std::vector<int64_t>> run(const std::vector<Req> &reqs) {
    std::vector<int64_t> ids(reqs.size(), 0);
    for (int64_t step = 0; step < 10000; step++) {
      bool pending = false;
      for (size_t i = 0; i < reqs.size(); i++) {
        if (reqs[i].at_step == step) ids[i] = submit(reqs[i]);
        pending |= reqs[i].at_step > step;
      }
      if (!pending && dsc_batcher_idle(b)) break;
      EXPECT_EQ(dsc_batcher_step(b), DSC_OK) << diags(ctx);
    }
    std::vector<std::vector<int64_t>> out;
    for (int64_t id : ids) {
      dsc_finish f;
      out.push_back(output(id, &f));
      EXPECT_EQ(f, DSC_FINISH_LENGTH);
      dsc_batcher_release(b, id);
    }
    return out;
  }
};

std::vector<Req> mixed_requests(int n, int64_t context, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::vector<Req> r;
  for (int i = 0; i < n; i++) {
    Req q;
    int64_t len = 1 + (int64_t)(g() % 20), gen = 1 + (int64_t)(g() % 12);
    if (len + gen > context) gen = context - len;
    for (int64_t j = 0; j < len; j++) q.prompt.push_back(32 + (int64_t)(g() % 90));
    double temps[4] = {0, 0.8, 1.0, 1.3};
    q.o.how = {temps[i % 4], i % 3 == 1 ? 5 : 0, i % 5 == 2 ? 0.9 : 1.0};
    q.o.seed = g();
    q.o.max_tokens = gen;
    q.at_step = (i % 3) * (i / 3);  // some at once, others while the first run
    r.push_back(q);
  }
  return r;
}

// cache_tokens > 0: a pool of that many positions in blocks of 4 for the
// shared run, too few for four sequences at their longest.
void check_alone(const std::string &model, dsc_backend be, int64_t cache_tokens = 0) {
  Checkpoint guard(model, be == DSC_BACKEND_INTERP ? "interp" : "cpu");
  const std::string &ck = guard.dir;
  const int64_t context = 40;
  std::vector<Req> reqs = mixed_requests(14, context, 11);
  std::vector<std::vector<int64_t>> together;
  {
    Batched shared(ck, be, 4, 5, context, cache_tokens, cache_tokens ? 4 : 0);
    ASSERT_TRUE(shared.b);
    int warmed = 0;  // each graph once, writing nothing: the answers stay
    ASSERT_EQ(dsc_infer_warm_up(shared.e, &warmed), DSC_OK) << diags(shared.ctx);
    EXPECT_EQ(warmed, 6);  // prefill and decode at 4, 2 and 1 rows; one span (40 < 2 x 64)
    together = shared.run(reqs);
    dsc_batcher_stats s;
    dsc_batcher_get_stats(shared.b, &s);
    int64_t block, blocks, free_blocks;
    dsc_infer_cache(shared.e, &block, &blocks, &free_blocks);
    EXPECT_EQ(free_blocks, blocks) << "every block back in the pool";
    EXPECT_EQ(s.blocks_used, 0);
    if (cache_tokens) {
      EXPECT_EQ(s.positions, cache_tokens);
      EXPECT_GT(s.preempted, 0) << "the pool was meant to run short";
    } else {
      EXPECT_EQ(s.preempted, 0);
    }
  }
  Batched alone(ck, be, 1, 5, context);
  ASSERT_TRUE(alone.b);
  for (size_t i = 0; i < reqs.size(); i++) {
    Req r = reqs[i];
    r.at_step = 0;
    std::vector<std::vector<int64_t>> one = alone.run({r});
    EXPECT_EQ((int64_t)together[i].size(), r.o.max_tokens) << i;
    EXPECT_EQ(together[i], one[0]) << "request " << i << " (prompt " << r.prompt.size()
                                   << ", temperature " << r.o.how.temperature << ")";
  }
  dsc_batcher_stats s;
  dsc_batcher_get_stats(alone.b, &s);
  EXPECT_EQ(s.submitted, (int64_t)reqs.size());
  EXPECT_EQ(s.queued + s.running, 0);
}

TEST(Batcher, GptRequestsTogetherGetTheirTokensAloneOnTheInterpreter) {
  check_alone(kGpt, DSC_BACKEND_INTERP);
}
TEST(Batcher, LlamaRequestsTogetherGetTheirTokensAloneOnTheInterpreter) {
  check_alone(kLlama, DSC_BACKEND_INTERP);
}
TEST(Batcher, GptRequestsTogetherGetTheirTokensAloneCompiled) {
  if (!dsc_backend_available(DSC_BACKEND_CPU)) GTEST_SKIP() << "no LLVM CPU backend in this build";
  check_alone(kGpt, DSC_BACKEND_CPU);
}

// 48 positions for 4 slots of up to 31 positions each: sequences wait and
// run again, and still get their tokens.
TEST(Batcher, RequestsPreemptedForCacheBlocksGetTheirTokensAloneCompiled) {
  if (!dsc_backend_available(DSC_BACKEND_CPU)) GTEST_SKIP() << "no LLVM CPU backend in this build";
  check_alone(kGpt, DSC_BACKEND_CPU, 48);
}
TEST(Batcher, LlamaRequestsPreemptedForCacheBlocksGetTheirTokensAloneOnTheInterpreter) {
  check_alone(kLlama, DSC_BACKEND_INTERP, 48);
}

TEST(Batcher, CancelFreesTheSlotAndStopTokensEnd) {
  Checkpoint guard(kGpt, "cancel");
  const std::string &ck = guard.dir;
  Batched x(ck, DSC_BACKEND_INTERP, 1, 4, 32);
  ASSERT_TRUE(x.b);
  Req a{{65, 66, 67}, {{0, 0, 1}, 1, 20}, 0}, c{{70, 71}, {{1.0, 0, 1}, 1, 3}, 0};
  int64_t ia = x.submit(a), ic = x.submit(c);
  ASSERT_EQ(dsc_batcher_step(x.b), DSC_OK);
  dsc_batcher_stats s;
  dsc_batcher_get_stats(x.b, &s);
  EXPECT_EQ(s.running, 1);
  EXPECT_EQ(s.queued, 1);
  EXPECT_EQ(s.positions_used, 3);  // the prompt; the token drawn is not in the cache yet
  EXPECT_EQ(s.blocks_used, 1);     // of 16 positions
  EXPECT_EQ(s.blocks, 2);          // the context (32) of the one slot
  EXPECT_EQ(x.output(ia).size(), 1u);
  dsc_batcher_cancel(x.b, ia);
  EXPECT_EQ(dsc_infer_held(x.e, 0), 0);
  dsc_finish f;
  x.output(ia, &f);
  EXPECT_EQ(f, DSC_FINISH_CANCELLED);
  for (int i = 0; i < 3; i++) ASSERT_EQ(dsc_batcher_step(x.b), DSC_OK);
  EXPECT_EQ(x.output(ic, &f).size(), 3u);
  EXPECT_EQ(f, DSC_FINISH_LENGTH);
  EXPECT_TRUE(dsc_batcher_idle(x.b));
  // the first of c's (sampled) tokens not drawn before becomes a stop
  // token: c again ends there, without it
  std::vector<int64_t> full = x.output(ic);
  size_t j = 1;
  while (j < full.size() && std::count(full.begin(), full.begin() + j, full[j])) j++;
  ASSERT_LT(j, full.size()) << "seed 1 drew the same token three times";
  dsc_batcher_set_stop(x.b, full[j], true);
  int64_t ic2 = x.submit(c);
  for (int i = 0; i < 3 && !dsc_batcher_idle(x.b); i++) ASSERT_EQ(dsc_batcher_step(x.b), DSC_OK);
  std::vector<int64_t> cut = x.output(ic2, &f);
  EXPECT_EQ(f, DSC_FINISH_STOP);
  EXPECT_EQ(cut, std::vector<int64_t>(full.begin(), full.begin() + j));
  dsc_batcher_release(x.b, ic);
  dsc_batcher_release(x.b, ic2);
  dsc_batcher_release(x.b, ia);
}

TEST(Batcher, ARequestCancelledWhileTheEngineRunsIsSkipped) {
  Checkpoint guard(kGpt, "midrun");
  Batched x(guard.dir, DSC_BACKEND_INTERP, 2, 4, 32);
  ASSERT_TRUE(x.b);
  Req a{{65, 66}, {{0, 0, 1}, 1, 5}, 0};
  int64_t ia = x.submit(a), ib = x.submit(a);
  ASSERT_TRUE(dsc_batcher_step_begin(x.b));
  dsc_batcher_release(x.b, ia);  // as a connection thread may, while the engine runs
  int64_t ic = x.submit(a);      // queued: no slot is handed out during the run
  ASSERT_EQ(dsc_batcher_step_run(x.b), DSC_OK);
  dsc_batcher_step_end(x.b);
  dsc_finish f;
  EXPECT_EQ(x.output(ib).size(), 1u);
  EXPECT_EQ(x.output(ia, &f).size(), 0u);
  EXPECT_EQ(f, DSC_FINISH_CANCELLED);  // forgotten
  EXPECT_EQ(x.output(ic).size(), 0u);
  while (!dsc_batcher_idle(x.b)) ASSERT_EQ(dsc_batcher_step(x.b), DSC_OK);
  EXPECT_EQ(x.output(ic), x.output(ib));  // c took a's slot and got b's tokens
}

TEST(Batcher, RefusesWhatCannotFit) {
  Checkpoint guard(kGpt, "refuse");
  const std::string &ck = guard.dir;
  Batched x(ck, DSC_BACKEND_INTERP, 1, 4, 16);
  ASSERT_TRUE(x.b);
  std::vector<int64_t> p(12, 65);
  dsc_request_options o = {{0, 0, 1}, 0, 5};
  int64_t id = 0;
  char why[256];
  EXPECT_EQ(dsc_batcher_submit(x.b, p.data(), 12, &o, &id, why, sizeof why), DSC_ERR_USER);
  EXPECT_NE(std::string(why).find("context is 16 tokens, but 17 were asked for"), std::string::npos)
      << why;
  EXPECT_EQ(dsc_batcher_submit(x.b, p.data(), 0, &o, &id, why, sizeof why), DSC_ERR_USER);
  EXPECT_NE(std::string(why).find("empty"), std::string::npos) << why;
  p[3] = 256;
  o.max_tokens = 2;
  EXPECT_EQ(dsc_batcher_submit(x.b, p.data(), 12, &o, &id, why, sizeof why), DSC_ERR_USER);
  EXPECT_NE(std::string(why).find("outside the vocabulary"), std::string::npos) << why;
  EXPECT_TRUE(dsc_batcher_idle(x.b));
  // a pool of 8 positions (blocks of 4): 12 + 2 - 1 positions do not fit it
  Batched small(ck, DSC_BACKEND_INTERP, 2, 4, 16, 8, 4);
  ASSERT_TRUE(small.b);
  p[3] = 65;
  EXPECT_EQ(dsc_batcher_submit(small.b, p.data(), 12, &o, &id, why, sizeof why), DSC_ERR_USER);
  EXPECT_NE(std::string(why).find("KV cache holds 8 positions (2 blocks of 4), but this request "
                                  "needs 13"),
            std::string::npos)
      << why;
  EXPECT_EQ(dsc_batcher_submit(small.b, p.data(), 7, &o, &id, why, sizeof why), DSC_OK) << why;
}

// The engine itself: a step the pool cannot hold fails and changes nothing.
TEST(Batcher, AnEngineStepBeyondThePoolFailsWhole) {
  Checkpoint guard(kGpt, "pool");
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  dsc_exec_options xo = {DSC_BACKEND_INTERP, 1, "off"};
  dsc_infer_options io = {guard.dir.c_str(), nullptr, &xo, 2, 4, 16, 4, 12};
  dsc_infer *e = nullptr;
  ASSERT_EQ(dsc_infer_open(ctx, &io, &e), DSC_OK) << diags(ctx);
  std::vector<int64_t> n = {4, 4}, pos = {0, 0}, tok(8, 65);
  std::vector<double> logits(2 * dsc_infer_vocab(e));
  ASSERT_EQ(dsc_infer_step(e, n.data(), pos.data(), tok.data(), logits.data()), DSC_OK);
  EXPECT_EQ(dsc_infer_held(e, 0), 1);
  EXPECT_EQ(dsc_infer_held(e, 1), 1);
  pos = {4, 4};  // two more blocks; one is free
  EXPECT_EQ(dsc_infer_step(e, n.data(), pos.data(), tok.data(), logits.data()), DSC_ERR_USER);
  EXPECT_NE(
      diags(ctx).find("KV cache is full: this step needs 2 more blocks of 4 positions, 1 of 3"),
      std::string::npos)
      << diags(ctx);
  EXPECT_EQ(dsc_infer_held(e, 0), 1);
  n = {4, 0};  // slot 0 alone fits
  ASSERT_EQ(dsc_infer_step(e, n.data(), pos.data(), tok.data(), logits.data()), DSC_OK);
  EXPECT_EQ(dsc_infer_held(e, 0), 2);
  pos = {0, 0}, n = {1, 0};  // slot 0 starts again: its second block goes back
  ASSERT_EQ(dsc_infer_step(e, n.data(), pos.data(), tok.data(), logits.data()), DSC_OK);
  EXPECT_EQ(dsc_infer_held(e, 0), 1);
  dsc_infer_release(e, 1);
  int64_t block, blocks, free_blocks;
  dsc_infer_cache(e, &block, &blocks, &free_blocks);
  EXPECT_EQ(block, 4);
  EXPECT_EQ(blocks, 3);
  EXPECT_EQ(free_blocks, 2);
  dsc_infer_free(e);
  dsc_context_free(ctx);
}

}  // namespace
