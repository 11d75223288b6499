// NCCL for the cuda backend's collectives (runtime/nccl_api.c, the
// collective hunks of runtime/exec_cuda.c), where there is no GPU: the
// library opens through the candidate paths (the toolkit's lib64 here), a
// bad $DSC_LIBNCCL or a library that is not NCCL is a clear message naming
// what was tried, ncclGetUniqueId works without a GPU where NCCL allows it,
// a lowered world-2 program with every collective kind passes the NCCL
// check (and malformed ones are refused naming the instruction), and a
// program with collectives on `--backend cuda` reaches the driver check
// instead of the old "collectives are not implemented" refusal. The runs on
// GPUs are the "collectives" group of tests/gpu/gpu_check.c.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "dsc/dsc.h"

extern "C" {
#include "codegen/codegen.h"
#include "runtime/nccl_api.h"
}
#include "tests/unit/comm_test_util.h"

namespace {

using comm_test::op1;
using comm_test::op2;
using comm_test::start;
using comm_test::T;
using comm_test::coll_module;

struct Env {  // sets a variable for one test, restores it after
  std::string name, old;
  bool had;
  Env(const char *n, const char *v) : name(n) {
    const char *o = getenv(n);
    had = o != nullptr;
    if (had) old = o;
    if (v)
      setenv(n, v, 1);
    else
      unsetenv(n);
  }
  ~Env() {
    if (had)
      setenv(name.c_str(), old.c_str(), 1);
    else
      unsetenv(name.c_str());
  }
};

TEST(NcclApi, LoadsThroughTheCandidatePaths) {
  Env unset("DSC_LIBNCCL", nullptr);
  char why[2400] = "";
  const rt_nccl_api *a = rt_nccl_api_get(why, sizeof why);
  if (!a) GTEST_SKIP() << "no NCCL on this machine: " << why;
  EXPECT_GE(a->version, 21000) << a->path;  // 2.10+: bf16 and ncclAvg
  EXPECT_NE(a->path[0], 0);
  // cached: the same table again
  EXPECT_EQ(rt_nccl_api_get(why, sizeof why), a);
}

TEST(NcclApi, BadLibraryIsAClearMessage) {
  rt_nccl_api t;
  char why[2400] = "";
  EXPECT_FALSE(rt_nccl_api_open("/nonexistent/dir/libnccl.so.2", &t, why, sizeof why));
  EXPECT_NE(std::string(why).find("/nonexistent/dir/libnccl.so.2"), std::string::npos) << why;
  // a library that loads but is not NCCL
  EXPECT_FALSE(rt_nccl_api_open("libm.so.6", &t, why, sizeof why));
  EXPECT_NE(std::string(why).find("has no ncclGetVersion (not NCCL"), std::string::npos) << why;
  EXPECT_EQ(t.AllReduce, nullptr);
  // $DSC_LIBNCCL is tried alone, and named
  {
    Env bad("DSC_LIBNCCL", "/nonexistent/libnccl-bad.so");
    EXPECT_FALSE(rt_nccl_api_find(&t, why, sizeof why));
    std::string w = why;
    EXPECT_NE(w.find("NCCL could not be loaded"), std::string::npos) << w;
    EXPECT_NE(w.find("$DSC_LIBNCCL=/nonexistent/libnccl-bad.so"), std::string::npos) << w;
  }
  Env unset("DSC_LIBNCCL", nullptr);
  if (!rt_nccl_api_find(&t, why, sizeof why)) GTEST_SKIP() << "no NCCL here: " << why;
  EXPECT_NE(t.AllReduce, nullptr);
}

TEST(NcclApi, ErrorTextNamesTheResult) {
  char buf[300];
  rt_nccl_error_text(nullptr, 5, buf, sizeof buf);
  EXPECT_EQ(std::string(buf), "ncclInvalidUsage: (no description)");
  rt_nccl_error_text(nullptr, 42, buf, sizeof buf);
  EXPECT_EQ(std::string(buf), "NCCL error 42");
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  EXPECT_TRUE(rt_nccl_check(nullptr, ctx, 0, "ncclAllReduce(x)"));
  EXPECT_EQ(dsc_diag_count(ctx), 0);
  EXPECT_FALSE(rt_nccl_check(nullptr, ctx, 2, "ncclAllReduce(%d x f32)", 7));
  EXPECT_NE(diags(ctx).find("ncclAllReduce(7 x f32): ncclSystemError"), std::string::npos)
      << diags(ctx);
  dsc_context_free(ctx);
}

TEST(NcclApi, DtypesNcclHas) {
  int d = -1;
  const dsc_dtype dts[6] = {DSC_F32, DSC_BF16, DSC_F16, DSC_F64, DSC_I32, DSC_I64};
  const int want[6] = {RT_NCCL_FLOAT32, RT_NCCL_BFLOAT16, RT_NCCL_FLOAT16,
                       RT_NCCL_FLOAT64, RT_NCCL_INT32,    RT_NCCL_INT64};
  for (int i = 0; i < 6; i++) {
    EXPECT_TRUE(rt_nccl_dtype(dts[i], &d)) << dsc_dtype_name(dts[i]);
    EXPECT_EQ(d, want[i]) << dsc_dtype_name(dts[i]);
  }
}

TEST(NcclApi, UniqueIdWithoutGpu) {
  Env unset("DSC_LIBNCCL", nullptr);
  char why[2400] = "";
  const rt_nccl_api *a = rt_nccl_api_get(why, sizeof why);
  if (!a) GTEST_SKIP() << "no NCCL on this machine: " << why;
  rt_nccl_unique_id id, zero;
  memset(&id, 0, sizeof id);
  memset(&zero, 0, sizeof zero);
  rt_nccl_result r = a->GetUniqueId(&id);
  if (r != RT_NCCL_SUCCESS) {
    rt_nccl_error_text(a, r, why, sizeof why);
    GTEST_SKIP() << "ncclGetUniqueId needs more than this machine has: " << why;
  }
  EXPECT_NE(memcmp(&id, &zero, sizeof id), 0);
}

TEST(NcclProgram, EveryCollectiveKindPassesTheCheck) {
  Env unset("DSC_LIBNCCL", nullptr);
  char why[2400];
  if (!rt_nccl_api_get(why, sizeof why)) GTEST_SKIP() << "no NCCL here: " << why;
  for (dsc_dtype dt : {DSC_F32, DSC_BF16, DSC_F64, DSC_I32}) {
    dsc_context *ctx = dsc_context_new(nullptr, nullptr);
    dsc_module *m = coll_module(ctx, 2, dt);
    ASSERT_NE(m, nullptr) << diags(ctx);
    ir_arena a;
    ir_arena_init(&a, ctx);
    cg_program *p = nullptr;
    ASSERT_EQ(cg_lower_graph(dsc_module_find_graph(m, "step"), &a, &p), DSC_OK) << diags(ctx);
    EXPECT_EQ(p->n_collectives, 5);
    EXPECT_TRUE(cg_program_verify(ctx, p, nullptr)) << diags(ctx);
    EXPECT_TRUE(rt_nccl_check_program(ctx, p)) << diags(ctx);
    // malformed: an id that does not exist, named with its instruction (the
    // structure is cg_program_verify's, which the cuda executor runs first)
    int s = -1;
    for (int i = 0; i < p->n_instrs && s < 0; i++)
      if (p->instrs[i].kind == CG_INS_COLLECTIVE_START) s = i;
    ASSERT_GE(s, 0);
    cg_instr keep = p->instrs[s];
    p->instrs[s].coll.id = p->n_collectives;
    EXPECT_FALSE(cg_program_verify(ctx, p, nullptr));
    EXPECT_NE(diags(ctx).find("instruction " + std::to_string(s) + ": collective 5 does not exist"),
              std::string::npos)
        << diags(ctx);
    // a reduction NCCL has no op for
    p->instrs[s] = keep;
    p->instrs[s].coll.kind = CG_COLL_ALL_REDUCE;
    p->instrs[s].coll.op = 7;
    dsc_diag_clear(ctx);
    EXPECT_FALSE(rt_nccl_check_program(ctx, p));
    EXPECT_NE(diags(ctx).find("(op 7) cannot run on NCCL"), std::string::npos) << diags(ctx);
    ir_arena_release(&a);
    dsc_module_free(m);
    dsc_context_free(ctx);
  }
}

TEST(NcclProgram, CudaBackendNoLongerRefusesCollectives) {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  dsc_module *m = coll_module(ctx, 2, DSC_F32);
  ASSERT_NE(m, nullptr) << diags(ctx);
  dsc_exec_options o = {DSC_BACKEND_CUDA, 0, nullptr};
  dsc_exec *x = nullptr;
  dsc_status st = dsc_exec_new(m, &o, &x);
  std::string d = diags(ctx);
  if (st == DSC_OK) {
    // a machine with a GPU: the executor was made (the runs are gpu_check's)
    dsc_exec_free(x);
  } else {
    EXPECT_EQ(st, DSC_ERR_USER);
    EXPECT_EQ(d.find("not implemented"), std::string::npos) << d;
#ifdef DSC_HAVE_CUDA
    EXPECT_TRUE(d.find("no CUDA driver") != std::string::npos ||
                d.find("no CUDA device") != std::string::npos)
        << d;
#else
    EXPECT_NE(d.find("cuda"), std::string::npos) << d;
#endif
  }
  dsc_module_free(m);
  dsc_context_free(ctx);
}

}  // namespace
