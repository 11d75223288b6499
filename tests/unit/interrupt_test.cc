// The context's interrupt callback (dsc_context_set_interrupt): long calls
// poll it between units of work and stop with DSC_ERR_INTERRUPTED and one
// "interrupted while ..." error; in-process rank contexts inherit it.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <string>
#include <unistd.h>

#include "dsc/dsc.h"
#include "ir/ir.h"

namespace {

const char kModel[] = R"(
model tiny {
  param w: f32[3, 2] = normal(0.5)
  param b: f32[2] = zeros
  fn forward(x: f32[B, 3], labels: i32[B]) -> f32 {
    return cross_entropy(matmul(x, w) + b, labels)
  }
}
)";

// Says "stop" from its `after`-th call on (after < 0: never); counts calls.
struct Flag {
  std::atomic<int> calls{0};
  int after = -1;
};
int poll(void *ud) {
  Flag *f = static_cast<Flag *>(ud);
  int n = f->calls++;
  return f->after >= 0 && n >= f->after;
}

std::string errors(const dsc_context *ctx) {
  std::string s;
  for (int i = 0; i < dsc_diag_count(ctx); i++)
    if (dsc_diag_get(ctx, i)->severity == DSC_DIAG_ERROR)
      s += std::string(dsc_diag_get(ctx, i)->message) + "\n";
  return s;
}

struct Fixture {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  dsc_module *m = nullptr;
  dsc_train_config cfg;
  Fixture() {
    dsc_dim_binding b = {"B", 2};
    dsc_frontend_options o = {&b, 1, false};
    EXPECT_EQ(dsc_compile_string(ctx, kModel, strlen(kModel), "tiny.dsm", &o, &m), DSC_OK);
    EXPECT_EQ(dsc_train_config_from_module(m, &cfg), DSC_OK);
  }
  ~Fixture() {
    dsc_module_free(m);
    dsc_context_free(ctx);
  }
  dsc_status pipeline() {
    dsc_pipeline_options po;
    memset(&po, 0, sizeof po);
    po.train = &cfg;
    return dsc_run_pipeline(m, &po);
  }
};

TEST(Interrupt, NoCallbackOrNeverRunsThePipeline) {
  Fixture f;
  Flag flag;
  dsc_context_set_interrupt(f.ctx, poll, &flag);
  EXPECT_EQ(f.pipeline(), DSC_OK) << errors(f.ctx);
  EXPECT_GE(flag.calls.load(), dsc_pass_count()); // polled before every pass at least
}

TEST(Interrupt, StopsThePipelineWithOneError) {
  for (int after : {0, 3}) {
    Fixture f;
    Flag flag;
    flag.after = after;
    dsc_context_set_interrupt(f.ctx, poll, &flag);
    EXPECT_EQ(f.pipeline(), DSC_ERR_INTERRUPTED) << "after " << after;
    EXPECT_EQ(dsc_error_count(f.ctx), 1) << errors(f.ctx);
    EXPECT_NE(errors(f.ctx).find("interrupted while "), std::string::npos) << errors(f.ctx);
  }
}

TEST(Interrupt, StopsReadingASafetensorsFile) {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  const int64_t dims[1] = {4};
  dsc_type t = dsc_type_make(DSC_F32, 1, dims);
  dsc_tensor *ts[3] = {dsc_tensor_new(ctx, t), dsc_tensor_new(ctx, t), dsc_tensor_new(ctx, t)};
  const char *names[3] = {"a", "b", "c"};
  for (dsc_tensor *x : ts)
    for (int i = 0; i < 4; i++) x->data[i] = i;
  dsc_tensor_set s = {3, names, ts, 0, nullptr};
  char path[] = "/tmp/dsc_interrupt_XXXXXX";
  int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  close(fd);
  ASSERT_EQ(dsc_safetensors_write(ctx, path, &s), DSC_OK) << errors(ctx);
  Flag flag;
  flag.after = 2; // the header's first two entries, then stop
  dsc_context_set_interrupt(ctx, poll, &flag);
  dsc_tensor_set *got = nullptr;
  EXPECT_EQ(dsc_safetensors_read(ctx, path, &got), DSC_ERR_INTERRUPTED);
  EXPECT_EQ(got, nullptr);
  EXPECT_NE(errors(ctx).find(std::string("interrupted while reading ") + path), std::string::npos)
      << errors(ctx);
  dsc_context_set_interrupt(ctx, nullptr, nullptr); // off again: the file reads whole
  dsc_diag_clear(ctx);
  ASSERT_EQ(dsc_safetensors_read(ctx, path, &got), DSC_OK) << errors(ctx);
  EXPECT_EQ(got->n, 3);
  dsc_tensor_set_free(ctx, got);
  for (dsc_tensor *x : ts) dsc_tensor_free(ctx, x);
  remove(path);
  dsc_context_free(ctx);
}

dsc_status rank_polls(dsc_comm *comm, void *) {
  return ir_check_interrupt(dsc_comm_context(comm), "rank %d's work", dsc_comm_rank(comm));
}

TEST(Interrupt, InProcessRanksInheritTheCallback) {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  Flag flag;
  flag.after = 0;
  dsc_context_set_interrupt(ctx, poll, &flag);
  EXPECT_EQ(dsc_comm_inproc_run(ctx, 2, rank_polls, nullptr), DSC_ERR_INTERRUPTED);
  EXPECT_NE(errors(ctx).find("interrupted while rank "), std::string::npos) << errors(ctx);
  EXPECT_GE(flag.calls.load(), 1);
  dsc_context_free(ctx);
}

} // namespace
