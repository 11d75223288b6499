// The CUDA executor (runtime/exec_cuda.c, runtime/cuda_api.c) where there is
// no GPU: `--backend cuda` fails cleanly with the no-driver message (the
// ASan build checks that nothing leaks on that path), and the executor's
// compile step (separate from the device) NVRTC-compiles every kernel of the
// tiny GPT's training step, and its own helper kernels, for sm_90, through
// the on-disk cubin cache. The GPU runs are tests/gpu/gpu_check.c.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "dsc/dsc.h"

extern "C" {
#include "codegen/codegen.h"
#include "runtime/cuda_api.h"
}
#include "tests/unit/test_util.h"

namespace {

// The tiny GPT's train step at B=2, T=16, through the whole pipeline (fused).
dsc_module *tiny_step(dsc_context *ctx) { return test_tiny_step(ctx, nullptr); }

bool have_gpu() {
  char why[512];
  return rt_cuda_probe(why, sizeof why, nullptr);
}

#ifdef DSC_HAVE_CUDA
std::string scratch_dir(const char *name) {
  const char *tmp = getenv("TMPDIR");
  std::string d = std::string(tmp && tmp[0] ? tmp : "/tmp") + "/dsc_cuda_exec_test_" +
                  std::to_string((long)getpid()) + "_" + name;
  std::string cmd = "rm -rf '" + d + "'";
  EXPECT_EQ(system(cmd.c_str()), 0);
  return d;
}

void remove_dir(const std::string &d) {
  std::string cmd = "rm -rf '" + d + "'";
  EXPECT_EQ(system(cmd.c_str()), 0);
}
#endif

TEST(CudaExec, BackendIsBuiltInWhenTheToolkitIs) {
#ifdef DSC_HAVE_CUDA
  EXPECT_TRUE(dsc_backend_available(DSC_BACKEND_CUDA));
#else
  EXPECT_FALSE(dsc_backend_available(DSC_BACKEND_CUDA));
#endif
}

TEST(CudaExec, NoDriverIsAClearUserError) {
  if (have_gpu()) GTEST_SKIP() << "a CUDA device is present: gpu_check covers this machine";
  char why[512];
  EXPECT_FALSE(rt_cuda_probe(why, sizeof why, nullptr));
#ifdef DSC_HAVE_CUDA
  EXPECT_NE(std::string(why).find("no CUDA"), std::string::npos) << why;
#endif
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  dsc_module *m = tiny_step(ctx);
  ASSERT_NE(m, nullptr) << diags(ctx);
  dsc_exec_options o = {DSC_BACKEND_CUDA, 0, nullptr};
  for (int attempt = 0; attempt < 2; attempt++) {  // the driver is looked up once: same answer
    dsc_diag_clear(ctx);
    dsc_exec *x = nullptr;
    EXPECT_EQ(dsc_exec_new(m, &o, &x), DSC_ERR_USER);
    EXPECT_EQ(x, nullptr);
    std::string d = diags(ctx);
#ifdef DSC_HAVE_CUDA
    EXPECT_NE(d.find("backend cuda: no CUDA driver ("), std::string::npos) << d;
#else
    EXPECT_NE(d.find("backend cuda"), std::string::npos) << d;
#endif
    EXPECT_EQ(dsc_diag_count(ctx), 1) << d;  // one message, not a cascade
  }
  dsc_module_free(m);
  dsc_context_free(ctx);
}

#ifdef DSC_HAVE_CUDA
// The executor checks its Programs (cg_program_verify, then what cuBLASLt
// and its helper kernels lack) before it looks for a device, so a program
// it cannot run is refused by name on any machine: an f64 matmul.
TEST(CudaExec, ProgramsItCannotRunAreRefusedBeforeADevice) {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  dsc_module *m = dsc_module_new(ctx, "m");
  dsc_graph *g = dsc_graph_new(m, "step");
  int64_t dims[2] = {4, 4};
  dsc_node *x = dsc_graph_input(g, "x", dsc_type_make(DSC_F64, 2, dims));
  dsc_node *in[2] = {x, x};
  dsc_node *y = dsc_build(g, DSC_OP_MATMUL, in, 2, nullptr, 0);
  ASSERT_NE(y, nullptr) << diags(ctx);
  ASSERT_EQ(dsc_graph_set_outputs(g, &y, 1), DSC_OK) << diags(ctx);
  ASSERT_EQ(dsc_run_codegen_passes(m), DSC_OK) << diags(ctx);
  ir_arena arena;
  ir_arena_init(&arena, ctx);
  cg_program *p = nullptr;
  ASSERT_EQ(cg_lower_graph(g, &arena, &p), DSC_OK) << diags(ctx);
  cg_kernel_objects objs = {nullptr, nullptr, 0, nullptr};
  cg_compiled_module c = {};
  c.target = CG_TARGET_CUDA;
  c.cuda_arch = 90;
  c.n_programs = 1;
  c.programs = &p;
  c.kernels = &objs;
  rt_cuda_exec *e = nullptr;
  EXPECT_EQ(rt_cuda_exec_new(m, &c, &e), DSC_ERR_USER);
  EXPECT_EQ(e, nullptr);
  EXPECT_NE(diags(ctx).find("backend cuda: program 'step': instruction 0: matmul: cuBLASLt has no "
                            "f64 x f64 -> f64 matmul (f32, bf16, f16 only)"),
            std::string::npos)
      << diags(ctx);
  ir_arena_release(&arena);
  dsc_module_free(m);
  dsc_context_free(ctx);
}

bool is_elf(const void *p, size_t n) { return n > 4 && memcmp(p, "\x7f" "ELF", 4) == 0; }

// Every program of the fused train step compiles for sm_90 in one NVRTC
// program per graph; the second compile comes from the cache, byte for byte;
// a corrupt cache entry is recompiled, not loaded.
TEST(CudaExec, StepKernelsCompileForSm90ThroughTheCache) {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  dsc_module *m = tiny_step(ctx);
  ASSERT_NE(m, nullptr) << diags(ctx);
  std::string cache = scratch_dir("cache");
  ir_arena arena;
  ir_arena_init(&arena, ctx);
  int total_kernels = 0, programs = 0;
  for (int gi = 0; gi < dsc_module_graph_count(m); gi++) {
    cg_program *p = nullptr;
    ASSERT_EQ(cg_lower_graph(dsc_module_graph(m, gi), &arena, &p), DSC_OK) << diags(ctx);
    total_kernels += p->n_kernels;
    void *cubin = nullptr;
    size_t len = 0;
    bool cached = true;
    ASSERT_EQ(cg_cuda_compile_program(ctx, &arena, p, 90, cache.c_str(), &cubin, &len, &cached),
              DSC_OK)
        << diags(ctx);
    if (p->n_kernels == 0) {
      EXPECT_EQ(cubin, nullptr);
      continue;
    }
    programs++;
    EXPECT_FALSE(cached);
    ASSERT_TRUE(is_elf(cubin, len)) << "graph " << p->graph_name;
    // every kernel's entry point is in the cubin (its name in the symbol table)
    std::string bytes((const char *)cubin, len);
    for (int k = 0; k < p->n_kernels; k++)
      EXPECT_NE(bytes.find(p->kernels[k]->name), std::string::npos) << p->kernels[k]->name;
    void *again = nullptr;
    size_t len2 = 0;
    ASSERT_EQ(cg_cuda_compile_program(ctx, &arena, p, 90, cache.c_str(), &again, &len2, &cached),
              DSC_OK)
        << diags(ctx);
    EXPECT_TRUE(cached);
    ASSERT_EQ(len2, len);
    EXPECT_EQ(memcmp(again, cubin, len), 0);
    free(again);
    free(cubin);
  }
  EXPECT_GE(programs, 1);
  EXPECT_GT(total_kernels, 10);
  // Corrupt every cache entry (flip its last byte): recompiled, not loaded.
  std::string cmd = "for f in '" + cache +
                    "'/*.cubin; do python3 -c \"import sys; p=sys.argv[1]; b=bytearray(open(p,'rb')"
                    ".read()); b[-1]^=0xff; open(p,'wb').write(b)\" \"$f\"; done";
  ASSERT_EQ(system(cmd.c_str()), 0);
  cg_program *p = nullptr;
  int gi = 0;
  while (gi < dsc_module_graph_count(m)) {
    ASSERT_EQ(cg_lower_graph(dsc_module_graph(m, gi), &arena, &p), DSC_OK);
    if (p->n_kernels > 0) break;
    gi++;
  }
  void *cubin = nullptr;
  size_t len = 0;
  bool cached = true;
  ASSERT_EQ(cg_cuda_compile_program(ctx, &arena, p, 90, cache.c_str(), &cubin, &len, &cached),
            DSC_OK);
  EXPECT_FALSE(cached);
  EXPECT_TRUE(is_elf(cubin, len));
  free(cubin);
  ir_arena_release(&arena);
  remove_dir(cache);
  dsc_module_free(m);
  dsc_context_free(ctx);
}

TEST(CudaExec, HelperKernelsCompileAndBadArchIsAnError) {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  void *cubin = nullptr;
  size_t len = 0;
  bool cached = true;
  ASSERT_EQ(cg_cuda_compile_helpers(ctx, 90, nullptr, &cubin, &len, &cached), DSC_OK)
      << diags(ctx);
  EXPECT_FALSE(cached);
  ASSERT_TRUE(is_elf(cubin, len));
  std::string bytes((const char *)cubin, len);
  for (const char *name :
       {"dsc_embgrad_f32_f32_i32", "dsc_embgrad_bf16_f32_i64", "dsc_embgrad_f64_f64_i32",
        "dsc_set_rows_i32", "dsc_set_rows_i64", "dsc_f32_to_bf16", "dsc_f16_to_f32"})
    EXPECT_NE(bytes.find(name), std::string::npos) << name;
  free(cubin);
  EXPECT_EQ(dsc_diag_count(ctx), 0) << diags(ctx);  // no NVRTC warnings either
  cubin = nullptr;
  EXPECT_NE(cg_cuda_compile_helpers(ctx, 5, nullptr, &cubin, &len, &cached), DSC_OK);
  EXPECT_EQ(cubin, nullptr);
  EXPECT_NE(diags(ctx).find("sm_5"), std::string::npos) << diags(ctx);
  dsc_context_free(ctx);
}

TEST(CudaExec, FormatsBytesForMessages) {
  char b[32];
  rt_format_bytes(b, sizeof b, 12);
  EXPECT_STREQ(b, "12 bytes");
  rt_format_bytes(b, sizeof b, (int64_t)1288490189);  // 1.2 GiB
  EXPECT_STREQ(b, "1.2 GiB");
  rt_format_bytes(b, sizeof b, (int64_t)32 << 20);
  EXPECT_STREQ(b, "32 MiB");
}
#endif

}  // namespace
