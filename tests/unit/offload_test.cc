// Offload (passes/offload.c, runtime/offload_io.c, the tiers of
// runtime/exec.c): the disk file's two slots, the pass's tier meta, and the
// executors with optimizer states on the host and disk tiers against the
// same step without offload.
#include <gtest/gtest.h>

#include <csignal>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <sys/resource.h>
#include <unistd.h>

#include "dsc/dsc.h"
#include "codegen/codegen.h"
#include "runtime/runtime.h"
#include "tests/unit/test_util.h"

namespace {

std::string tmp_path(const char *name) {
  const char *root = getenv("TMPDIR");
  return std::string(root ? root : "/tmp") + "/dsc-offload-test-" + std::to_string(getpid()) +
         "-" + name;
}

std::vector<float> random_floats(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-1.f, 1.f);
  std::vector<float> v(n);
  for (auto &x : v) x = d(rng) + 2.f;  // never zero
  return v;
}

TEST(OffloadIo, CommitWritesTheOtherSlotAndAFailedOneChangesNothing) {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  std::string path = tmp_path("io.bin");
  // two values, 3000 and 1000 floats (the first spans chunks only if large: fine)
  int64_t offs[2] = {0, 12032}, bytes[2] = {12000, 4000}, slot = 16064;
  rt_offload *o = rt_offload_open(ctx, path.c_str(), 2, offs, bytes, slot);
  ASSERT_NE(o, nullptr) << diags(ctx);
  std::vector<float> a0 = random_floats(3000, 1), a1 = random_floats(1000, 2);
  std::vector<float> b0 = random_floats(3000, 3), b1 = random_floats(1000, 4);
  std::vector<float> r0(3000), r1(1000);
  void *dst[2] = {r0.data(), r1.data()};
  char err[1200];
  EXPECT_FALSE(rt_offload_read(o, dst, err, sizeof err));  // nothing committed yet
  EXPECT_NE(std::string(err).find("no values written yet"), std::string::npos) << err;
  const void *a[2] = {a0.data(), a1.data()}, *b[2] = {b0.data(), b1.data()};
  ASSERT_TRUE(rt_offload_commit(o, a, err, sizeof err)) << err;
  ASSERT_TRUE(rt_offload_read(o, dst, err, sizeof err)) << err;
  EXPECT_EQ(r0, a0);
  EXPECT_EQ(r1, a1);
  ASSERT_TRUE(rt_offload_commit(o, b, err, sizeof err)) << err;
  ASSERT_TRUE(rt_offload_read(o, dst, err, sizeof err)) << err;
  EXPECT_EQ(r0, b0);
  EXPECT_EQ(r1, b1);
  EXPECT_EQ(rt_offload_generation(o), 2);
  EXPECT_EQ(access(path.c_str(), F_OK), 0);
  // The first commit writes slot 0 (so a disk too small for both slots
  // fails a step, not the start), the third one too: the next writes slot 1.
  ASSERT_TRUE(rt_offload_commit(o, b, err, sizeof err)) << err;
  EXPECT_EQ(rt_offload_generation(o), 3);
  // A commit that cannot write (the file may not grow past slot 0: a full
  // disk) fails naming the file, and the values stay those of the last one.
  ASSERT_EQ(truncate(path.c_str(), 4096 + slot), 0);
  struct rlimit old;
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old), 0);
  void (*prev)(int) = signal(SIGXFSZ, SIG_IGN);
  struct rlimit lim = old;
  lim.rlim_cur = (rlim_t)(4096 + slot);
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &lim), 0);
  const void *c[2] = {a0.data(), b1.data()};
  bool ok = rt_offload_commit(o, c, err, sizeof err);
  setrlimit(RLIMIT_FSIZE, &old);
  signal(SIGXFSZ, prev);
  EXPECT_FALSE(ok);
  EXPECT_NE(std::string(err).find(path + "': writing at offset"), std::string::npos) << err;
  ASSERT_TRUE(rt_offload_read(o, dst, err, sizeof err)) << err;
  EXPECT_EQ(r0, b0);
  EXPECT_EQ(r1, b1);
  EXPECT_EQ(rt_offload_generation(o), 3);
  // a commit needs every value (the other slot becomes the whole state)
  const void *partial[2] = {a0.data(), nullptr};
  EXPECT_FALSE(rt_offload_commit(o, partial, err, sizeof err));
  rt_offload_free(o);
  unlink(path.c_str());
  // an unusable directory is a clear error naming the file
  std::string bad = tmp_path("plain");
  FILE *f = fopen(bad.c_str(), "w");
  ASSERT_NE(f, nullptr);
  fclose(f);
  dsc_diag_clear(ctx);
  EXPECT_EQ(rt_offload_open(ctx, (bad + "/x.bin").c_str(), 2, offs, bytes, slot), nullptr);
  EXPECT_NE(diags(ctx).find("cannot create offload file '" + bad + "/x.bin': Not a directory"),
            std::string::npos)
      << diags(ctx);
  unlink(bad.c_str());
  dsc_context_free(ctx);
}

dsc_module *tiny_step(dsc_context *ctx, dsc_offload_tier opt, const char *stop_after) {
  test_tiny_options o = {};
  o.stop_after = stop_after;
  o.optimizer = opt;
  return test_tiny_step(ctx, &o);
}

TEST(OffloadPass, TiersTheOptimizerStatesAndPrintsThemBack) {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  dsc_module *m = tiny_step(ctx, DSC_OFFLOAD_HOST, "offload");
  ASSERT_NE(m, nullptr) << diags(ctx);
  int states = 0;
  for (int i = 0; i < dsc_module_param_count(m); i++) {
    std::string key = std::string("tier.") + dsc_module_param_name(m, i);
    const char *v = dsc_module_get_meta(m, key.c_str());
    if (dsc_module_param_is_state(m, i)) {
      states++;
      ASSERT_NE(v, nullptr) << key;
      EXPECT_STREQ(v, "host");
    } else {
      EXPECT_EQ(v, nullptr) << key;  // params stay on the device without --offload-param
    }
  }
  EXPECT_GT(states, 10);
  // the text IR keeps the tiers
  char *text = nullptr;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  ASSERT_EQ(dsc_module_print(m, f), DSC_OK);
  fclose(f);
  dsc_module *back = nullptr;
  ASSERT_EQ(dsc_module_parse(ctx, text, len, "offload.ir", &back), DSC_OK) << diags(ctx);
  for (int i = 0; i < dsc_module_param_count(m); i++) {
    std::string key = std::string("tier.") + dsc_module_param_name(m, i);
    const char *a = dsc_module_get_meta(m, key.c_str()), *b = dsc_module_get_meta(back, key.c_str());
    EXPECT_EQ(a == nullptr, b == nullptr) << key;
    if (a && b) {
      EXPECT_STREQ(a, b);
    }
  }
  free(text);
  dsc_module_free(back);
  dsc_module_free(m);
  // param offload needs stage 3 at world > 1
  dsc_module *p = nullptr;
  {
    dsc_train_config cfg;
    ASSERT_EQ(test_tiny_compile(ctx, nullptr, &p, &cfg), DSC_OK) << diags(ctx);
    cfg.offload.param = DSC_OFFLOAD_DISK;
    dsc_pipeline_options po;
    memset(&po, 0, sizeof po);
    po.train = &cfg;
    po.stop_after = "offload";
    dsc_diag_clear(ctx);
    EXPECT_EQ(dsc_run_pipeline(p, &po), DSC_ERR_USER);
    EXPECT_NE(diags(ctx).find("--offload-param disk needs ZeRO stage 3 at world > 1"),
              std::string::npos)
        << diags(ctx);
  }
  dsc_module_free(p);
  dsc_context_free(ctx);
}

// Runs 3 train steps on executor x (fresh inputs from seed 11) and returns
// the losses; the params after them in *out.
std::vector<double> three_steps(dsc_context *ctx, dsc_module *m, dsc_exec *x, dsc_params *out) {
  const dsc_graph *g = dsc_module_find_graph(m, "train_step");
  std::mt19937 rng(11);
  std::vector<double> losses;
  for (int step = 0; step < 3; step++) {
    dsc_tensor *in[3];
    for (int i = 0; i < 3; i++) in[i] = dsc_tensor_new(ctx, dsc_node_type(dsc_graph_input_at(g, i)));
    int64_t n = dsc_type_numel(&in[0]->type);
    for (int64_t j = 0; j < n; j++)
      in[0]->data[j] = (double)(rng() % 256), in[1]->data[j] = (double)(rng() % 256);
    in[2]->data[0] = (double)(float)3e-3;
    dsc_tensor *o[2] = {nullptr, nullptr};
    EXPECT_EQ(dsc_exec_run(x, "train_step", in, 3, o), DSC_OK) << diags(ctx);
    losses.push_back(o[0] ? o[0]->data[0] : -1);
    for (int k = 0; k < 2; k++) dsc_tensor_free(ctx, o[k]);
    for (int i = 0; i < 3; i++) dsc_tensor_free(ctx, in[i]);
  }
  EXPECT_EQ(dsc_exec_get_params(x, out), DSC_OK) << diags(ctx);
  return losses;
}

void expect_same_params(const dsc_params *a, const dsc_params *b, const char *what) {
  ASSERT_EQ(dsc_params_count(a), dsc_params_count(b));
  for (int p = 0; p < dsc_params_count(a); p++) {
    const dsc_tensor *x = dsc_params_get(a, p), *y = dsc_params_get(b, p);
    EXPECT_EQ(memcmp(x->data, y->data, sizeof(double) * (size_t)dsc_type_numel(&x->type)), 0)
        << what << ": param " << p;
  }
}

TEST(OffloadExec, HostAndDiskTiersTrainAsTheDevice) {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  std::vector<dsc_backend> backends = {DSC_BACKEND_INTERP};
  if (dsc_backend_available(DSC_BACKEND_CPU)) backends.push_back(DSC_BACKEND_CPU);
  for (dsc_backend be : backends) {
    const char *stop = be == DSC_BACKEND_INTERP ? "offload" : nullptr;
    dsc_exec_options xo = {be, 2, nullptr};
    std::vector<double> ref;
    dsc_params *ref_p = nullptr;
    dsc_module *ref_m = nullptr;
    for (dsc_offload_tier t : {DSC_OFFLOAD_NONE, DSC_OFFLOAD_HOST, DSC_OFFLOAD_DISK}) {
      SCOPED_TRACE(std::string(dsc_backend_name(be)) + " " + dsc_offload_name(t));
      dsc_module *m = tiny_step(ctx, t, stop);
      ASSERT_NE(m, nullptr) << diags(ctx);
      dsc_exec *x = nullptr;
      ASSERT_EQ(dsc_exec_new(m, &xo, &x), DSC_OK) << diags(ctx);
      int64_t dev, host, disk;
      dsc_exec_tier_bytes(x, &dev, &host, &disk);
      EXPECT_EQ(host > 0, t == DSC_OFFLOAD_HOST);
      EXPECT_EQ(disk > 0, t == DSC_OFFLOAD_DISK);
      dsc_params *p = dsc_params_init(m, 5);
      std::string file = tmp_path("exec.bin");
      if (t == DSC_OFFLOAD_DISK) {
        // the file comes first: without it the disk values have nowhere to go
        dsc_diag_clear(ctx);
        EXPECT_EQ(dsc_exec_set_params(x, p), DSC_ERR_USER);
        EXPECT_NE(diags(ctx).find("values on the disk tier but no offload file"),
                  std::string::npos)
            << diags(ctx);
        ASSERT_EQ(dsc_exec_set_offload_file(x, file.c_str()), DSC_OK) << diags(ctx);
      }
      ASSERT_EQ(dsc_exec_set_params(x, p), DSC_OK) << diags(ctx);
      dsc_params *after = dsc_params_init(m, 0);
      std::vector<double> losses = three_steps(ctx, m, x, after);
      if (t == DSC_OFFLOAD_NONE) {
        ref = losses;
        ref_p = after;
        after = nullptr;
      } else {
        ASSERT_EQ(losses.size(), ref.size());
        for (size_t i = 0; i < ref.size(); i++) EXPECT_EQ(losses[i], ref[i]) << "step " << i;
        expect_same_params(ref_p, after, dsc_offload_name(t));
      }
      if (t == DSC_OFFLOAD_DISK) {
        // the values are in the file, not only in memory: a file cut short
        // makes reading them back an error naming it
        ASSERT_EQ(truncate(file.c_str(), 4096), 0);
        dsc_params *q = dsc_params_init(m, 0);
        dsc_diag_clear(ctx);
        EXPECT_EQ(dsc_exec_get_params(x, q), DSC_ERR_USER);
        EXPECT_NE(diags(ctx).find("offload file '" + file + "': reading at offset"),
                  std::string::npos)
            << diags(ctx);
        dsc_params_free(q);
        unlink(file.c_str());
      }
      dsc_params_free(after);
      dsc_params_free(p);
      dsc_exec_free(x);
      if (t == DSC_OFFLOAD_NONE)
        ref_m = m;  // ref_p's module: params may not outlive it (ASan)
      else
        dsc_module_free(m);
    }
    dsc_params_free(ref_p);
    dsc_module_free(ref_m);
  }
  dsc_context_free(ctx);
}


// The disk tier's streaming (passes/offload_disk.c): after pass schedule no
// graph reads a disk value with `param` or writes it with `assign`; each is
// a tier_read/tier_write start/wait pair, the text IR prints and parses back
// byte-identically, and the verifier rejects a start read by anything but
// its wait.
TEST(OffloadDisk, StreamsDiskValuesThroughStartWaitPairs) {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  dsc_module *m = tiny_step(ctx, DSC_OFFLOAD_DISK, "schedule");
  ASSERT_NE(m, nullptr) << diags(ctx);
  char *text = dsc_module_print_string(m);
  ASSERT_NE(text, nullptr);
  std::string t(text);
  EXPECT_EQ(t.find("param {name = \"opt."), std::string::npos);
  EXPECT_EQ(t.find("assign {name = \"opt."), std::string::npos);
  size_t reads = 0, writes = 0;
  for (size_t at = 0; (at = t.find("tier_read_start {", at)) != std::string::npos; at++) reads++;
  for (size_t at = 0; (at = t.find("tier_write_start(", at)) != std::string::npos; at++) writes++;
  EXPECT_GT(reads, 20u);
  EXPECT_EQ(reads, writes);  // AdamW reads and writes every state once
  EXPECT_NE(t.find("offload.io_threads"), std::string::npos);
  dsc_module *back = nullptr;
  ASSERT_EQ(dsc_module_parse(ctx, text, strlen(text), "disk.ir", &back), DSC_OK) << diags(ctx);
  char *again = dsc_module_print_string(back);
  ASSERT_NE(again, nullptr);
  EXPECT_STREQ(again, text);
  free(again);
  dsc_module_free(back);
  // a kernel reading the data in flight is invalid
  std::string bad = t;
  size_t w = bad.find("tier_read_wait(");
  ASSERT_NE(w, std::string::npos);
  bad.replace(w, strlen("tier_read_wait"), "neg");
  back = nullptr;
  dsc_diag_clear(ctx);
  dsc_status st = dsc_module_parse(ctx, bad.c_str(), bad.size(), "bad.ir", &back);
  if (st == DSC_OK) st = dsc_module_verify(back);
  EXPECT_NE(st, DSC_OK);
  EXPECT_NE(diags(ctx).find("whose data is in flight"), std::string::npos) << diags(ctx);
  dsc_module_free(back);
  free(text);
  dsc_module_free(m);
  dsc_context_free(ctx);
}

// Streamed transfers (rt_offload_start/wait/end): reads see the active
// slot even after a write of the same value in the same run; end(true)
// copies the values the run did not write and flips; end(false) and a
// first commit missing a value change nothing.
TEST(OffloadIo, StreamedWritesLandOnlyWhenTheRunCommits) {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  std::string path = tmp_path("stream.bin");
  // value 0 spans several 4 MiB chunks, value 1 is small
  int64_t n0 = (9 << 20) / 4 + 3, n1 = 1000;
  int64_t offs[2] = {0, ((n0 * 4 + 63) / 64) * 64}, bytes[2] = {n0 * 4, n1 * 4};
  rt_offload *o = rt_offload_open(ctx, path.c_str(), 2, offs, bytes, offs[1] + bytes[1]);
  ASSERT_NE(o, nullptr) << diags(ctx);
  ASSERT_TRUE(rt_offload_set_threads(o, 3));
  EXPECT_FALSE(rt_offload_set_threads(o, 0));
  std::vector<float> a0 = random_floats((size_t)n0, 11), a1 = random_floats((size_t)n1, 12);
  std::vector<float> b0 = random_floats((size_t)n0, 13), r0((size_t)n0), r1((size_t)n1);
  char err[1200] = "";
  // a first commit needs every value
  rt_offload_begin(o);
  int id = rt_offload_start(o, 0, a0.data(), true, err, sizeof err);
  ASSERT_GE(id, 0) << err;
  EXPECT_TRUE(rt_offload_wait(o, id, err, sizeof err)) << err;
  EXPECT_FALSE(rt_offload_end(o, true, err, sizeof err));
  EXPECT_NE(std::string(err).find("needs every value"), std::string::npos) << err;
  EXPECT_EQ(rt_offload_generation(o), 0);
  rt_offload_begin(o);
  EXPECT_LT(rt_offload_start(o, 0, r0.data(), false, err, sizeof err), 0);  // nothing to read
  int w0 = rt_offload_start(o, 0, a0.data(), true, err, sizeof err);
  int w1 = rt_offload_start(o, 1, a1.data(), true, err, sizeof err);
  ASSERT_TRUE(w0 >= 0 && w1 >= 0) << err;
  ASSERT_TRUE(rt_offload_end(o, true, err, sizeof err)) << err;  // waits what is in flight
  EXPECT_EQ(rt_offload_generation(o), 1);
  // a run writing value 0 only: its reads see the old values
  rt_offload_begin(o);
  int w = rt_offload_start(o, 0, b0.data(), true, err, sizeof err);
  int r = rt_offload_start(o, 0, r0.data(), false, err, sizeof err);
  ASSERT_TRUE(w >= 0 && r >= 0) << err;
  ASSERT_TRUE(rt_offload_wait(o, r, err, sizeof err)) << err;
  EXPECT_EQ(r0, a0);
  ASSERT_TRUE(rt_offload_end(o, true, err, sizeof err)) << err;
  EXPECT_EQ(rt_offload_generation(o), 2);
  void *dst[2] = {r0.data(), r1.data()};
  ASSERT_TRUE(rt_offload_read(o, dst, err, sizeof err)) << err;
  EXPECT_EQ(r0, b0);
  EXPECT_EQ(r1, a1);  // copied over from the previous slot
  // a run that fails: nothing lands
  rt_offload_begin(o);
  ASSERT_GE(rt_offload_start(o, 1, b0.data(), true, err, sizeof err), 0) << err;
  EXPECT_TRUE(rt_offload_end(o, false, err, sizeof err));
  EXPECT_EQ(rt_offload_generation(o), 2);
  ASSERT_TRUE(rt_offload_read(o, dst, err, sizeof err)) << err;
  EXPECT_EQ(r0, b0);
  EXPECT_EQ(r1, a1);
  // a read past the end of a truncated file is an error naming it
  ASSERT_EQ(truncate(path.c_str(), 4096 + 100), 0);
  rt_offload_begin(o);
  r = rt_offload_start(o, 0, r0.data(), false, err, sizeof err);
  ASSERT_GE(r, 0) << err;
  EXPECT_FALSE(rt_offload_wait(o, r, err, sizeof err));
  EXPECT_NE(std::string(err).find(path + "': reading at offset"), std::string::npos) << err;
  EXPECT_FALSE(rt_offload_end(o, true, err, sizeof err));
  EXPECT_EQ(rt_offload_generation(o), 2);
  rt_offload_free(o);
  unlink(path.c_str());
  dsc_context_free(ctx);
}


// The lowering of the streamed disk values: each TIER_START has one
// TIER_WAIT later, its buffer is a WORK buffer live from the start through
// the wait, and no instruction touches a disk-tier PARAM buffer (they have no
// memory); the WORK arena holds the reads in flight, not every disk value.
TEST(OffloadDisk, LowersTransfersToWorkBuffersLiveFromStartToWait) {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  dsc_module *m = tiny_step(ctx, DSC_OFFLOAD_DISK, nullptr);
  ASSERT_NE(m, nullptr) << diags(ctx);
  dsc_graph *g = dsc_module_find_graph(m, "train_step");
  ASSERT_NE(g, nullptr);
  ir_arena arena;
  ir_arena_init(&arena, ctx);
  cg_program *p = nullptr;
  ASSERT_EQ(cg_lower_graph(g, &arena, &p), DSC_OK) << diags(ctx);
  ASSERT_GT(p->n_tier_ios, 20);
  std::vector<int> start(p->n_tier_ios, -1), wait(p->n_tier_ios, -1);
  int64_t disk_bytes = 0;
  for (int i = 0; i < p->n_instrs; i++) {
    const cg_instr *in = &p->instrs[i];
    if (in->kind != CG_INS_TIER_START && in->kind != CG_INS_TIER_WAIT) continue;
    ASSERT_GE(in->tier.id, 0);
    ASSERT_LT(in->tier.id, p->n_tier_ios);
    const cg_buffer *b = &p->buffers[in->src];
    EXPECT_NE(b->kind, CG_BUF_PARAM);
    EXPECT_LE(b->first_use, i);
    EXPECT_GE(b->last_use, i);
    if (in->kind == CG_INS_TIER_START) {
      EXPECT_EQ(start[in->tier.id], -1);
      start[in->tier.id] = i;
      if (!in->tier.write) disk_bytes += b->numel * (int64_t)dsc_dtype_size(b->dtype);
    } else {
      EXPECT_GT(i, start[in->tier.id]);
      EXPECT_EQ(wait[in->tier.id], -1);
      wait[in->tier.id] = i;
    }
  }
  for (int k = 0; k < p->n_tier_ios; k++) EXPECT_GE(wait[k], 0) << "transfer " << k;
  for (int i = 0; i < p->n_instrs; i++) {
    const cg_instr *in = &p->instrs[i];
    if (in->kind != CG_INS_LAUNCH) continue;
    for (int a = 0; a < in->n_args; a++) {
      const cg_buffer *b = &p->buffers[in->args[a]];
      EXPECT_FALSE(b->kind == CG_BUF_PARAM && b->tier == CG_TIER_DISK) << "instruction " << i;
    }
  }
  EXPECT_GT(disk_bytes, 500000);  // AdamW's m and v of gpt-tiny (plus the step)
  ir_arena_release(&arena);
  dsc_module_free(m);
  dsc_context_free(ctx);
}

}  // namespace
