// The .dsx container (program/dsx.c): round trip, and every truncation or
// corruption is a clear error, never a crash.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" {
#include "dsc/dsc.h"
#include "codegen/codegen.h"
#include "runtime/runtime.h"
}
#include "tests/unit/test_util.h"

namespace {

std::string tmp_path(const char *name) {
  return std::string(DSC_BINARY_DIR) + "/dsx_test_" + name + ".dsx";
}

std::vector<char> slurp(const std::string &p) {
  std::ifstream f(p, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(f), {});
}

void spit(const std::string &p, const std::vector<char> &b) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(b.data(), (std::streamsize)b.size());
}

TEST(Dsx, RoundTripsSections) {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  std::string big(100000, 'x');
  for (size_t i = 0; i < big.size(); i++) big[i] = (char)(i * 31 + 7);
  rt_dsx_section s[3] = {{(char *)"module.step", (void *)"module m\n", 9},
                         {(char *)"cpu.obj.train_step", big.data(), big.size()},
                         {(char *)"empty", (void *)"", 0}};
  std::string p = tmp_path("roundtrip");
  ASSERT_EQ(rt_dsx_write(ctx, p.c_str(), s, 3), DSC_OK) << diags(ctx);
  rt_dsx *d = nullptr;
  ASSERT_EQ(rt_dsx_read(ctx, p.c_str(), &d), DSC_OK) << diags(ctx);
  ASSERT_EQ(d->n, 3);
  const rt_dsx_section *m = rt_dsx_find(d, "module.step");
  ASSERT_NE(m, nullptr);
  EXPECT_STREQ((const char *)m->data, "module m\n");
  const rt_dsx_section *o = rt_dsx_find(d, "cpu.obj.train_step");
  ASSERT_NE(o, nullptr);
  EXPECT_EQ(std::string((const char *)o->data, o->size), big);
  EXPECT_EQ(rt_dsx_find(d, "empty")->size, 0u);
  EXPECT_EQ(rt_dsx_find(d, "nope"), nullptr);
  rt_dsx_free(ctx, d);
  EXPECT_EQ(dsc_diag_count(ctx), 0);
  dsc_context_free(ctx);
}

TEST(Dsx, TruncationsAndCorruptionsAreErrors) {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  std::string payload(3000, 'a');
  rt_dsx_section s[2] = {{(char *)"one", payload.data(), payload.size()},
                         {(char *)"two", (void *)"hello", 5}};
  std::string p = tmp_path("good"), q = tmp_path("bad");
  ASSERT_EQ(rt_dsx_write(ctx, p.c_str(), s, 2), DSC_OK);
  std::vector<char> good = slurp(p);
  // Every truncation point fails (stepping through header, table and data).
  for (size_t cut = 0; cut < good.size(); cut += cut < 200 ? 1 : 97) {
    spit(q, std::vector<char>(good.begin(), good.begin() + (long)cut));
    rt_dsx *d = nullptr;
    EXPECT_EQ(rt_dsx_read(ctx, q.c_str(), &d), DSC_ERR_USER) << "cut at " << cut;
    EXPECT_EQ(d, nullptr);
    EXPECT_NE(diags(ctx).find("bad.dsx"), std::string::npos) << diags(ctx);
    dsc_diag_clear(ctx);
  }
  // A flipped byte in a section is a checksum error naming the section.
  std::vector<char> flipped = good;
  flipped[flipped.size() - 3] ^= 1;  // inside "two"
  spit(q, flipped);
  rt_dsx *d = nullptr;
  EXPECT_EQ(rt_dsx_read(ctx, q.c_str(), &d), DSC_ERR_USER);
  EXPECT_NE(diags(ctx).find("section 'two' is corrupted"), std::string::npos) << diags(ctx);
  dsc_diag_clear(ctx);
  // Random garbage headers never crash.
  for (int seed = 0; seed < 200; seed++) {
    std::vector<char> g = good;
    unsigned x = (unsigned)seed * 2654435761u + 1;
    for (int k = 0; k < 4; k++) {
      x = x * 1103515245u + 12345u;
      g[16 + (x >> 8) % 64] = (char)(x >> 16);
    }
    spit(q, g);
    d = nullptr;
    dsc_status st = rt_dsx_read(ctx, q.c_str(), &d);
    if (st == DSC_OK) rt_dsx_free(ctx, d);
    dsc_diag_clear(ctx);
  }
  EXPECT_EQ(rt_dsx_read(ctx, (p + ".missing").c_str(), &d), DSC_ERR_USER);
  dsc_context_free(ctx);
  std::remove(p.c_str());
  std::remove(q.c_str());
}

// ---- program files (program/program_file.c, driver/program.c) ----

// A token model small enough to compile in well under a second under ASan.
const char kTinyModel[] =
    "model tiny {\n"
    "  param wte: f32[16, 8] = normal(0.5)\n"
    "  param w: f32[8, 16] = normal(0.5)\n"
    "  fn forward(tokens: i32[B, T], targets: i32[B, T]) -> f32 {\n"
    "    x = embedding(wte, tokens)\n"
    "    return cross_entropy(matmul(relu(x), w), targets)\n"
    "  }\n"
    "}\n"
    "train {\n"
    "  batch = 2, seq = 4, grad_accum = 1, steps = 10\n"
    "  optimizer = adamw(lr = 1e-2)\n"
    "}\n";

std::string tiny_model_path() {
  std::string p = std::string(DSC_BINARY_DIR) + "/dsx_test_tiny.dsm";
  std::ofstream(p) << kTinyModel;
  return p;
}

// The kernels of the tiny model's forward graph, lowered (arena-owned).
cg_program *lowered_forward(dsc_context *ctx, ir_arena *a, dsc_module **m) {
  std::string path = tiny_model_path();
  dsc_dim_binding dims[2] = {{"B", 2}, {"T", 4}};
  dsc_frontend_options fo = {dims, 2, false};
  if (dsc_compile_file(ctx, path.c_str(), &fo, m) != DSC_OK) return nullptr;
  if (dsc_run_codegen_passes(*m) != DSC_OK) return nullptr;
  cg_program *p = nullptr;
  if (cg_lower_graph(dsc_module_find_graph(*m, "forward"), a, &p) != DSC_OK) return nullptr;
  return p;
}

TEST(ProgramFile, PackedObjectsServeOnlyTheSameKernel) {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  ir_arena a;
  ir_arena_init(&a, ctx);
  dsc_module *m = nullptr;
  cg_program *p = lowered_forward(ctx, &a, &m);
  ASSERT_NE(p, nullptr) << diags(ctx);
  int n = p->n_kernels;
  ASSERT_GE(n, 2);
  std::vector<std::string> bytes;
  std::vector<void *> objs;
  std::vector<size_t> lens;
  for (int i = 0; i < n; i++) bytes.push_back("object of kernel " + std::to_string(i * 7 + 1));
  for (auto &b : bytes) objs.push_back(b.data()), lens.push_back(b.size());
  size_t len = 0;
  void *packed = rt_pack_kernel_objects(ctx, p->kernel_info, n, objs.data(), lens.data(), &len);
  ASSERT_NE(packed, nullptr);
  std::vector<const void *> got(n);
  std::vector<size_t> got_len(n);
  ASSERT_EQ(rt_unpack_kernel_objects(packed, len, p->kernel_info, n, got.data(), got_len.data()), n);
  for (int i = 0; i < n; i++)
    EXPECT_EQ(std::string((const char *)got[i], got_len[i]), bytes[i]) << "kernel " << i;
  // In another order, entry i no longer names kernel i: nothing is served
  // (a stale object would run the wrong code).
  std::vector<cg_kernel_info> rev(p->kernel_info, p->kernel_info + n);
  std::swap(rev[0], rev[1]);
  EXPECT_EQ(rt_unpack_kernel_objects(packed, len, rev.data(), n, got.data(), got_len.data()),
            n - 2);
  EXPECT_EQ(got[0], nullptr);
  EXPECT_EQ(got[1], nullptr);
  // Every truncation, and trailing bytes, are malformed, never a crash.
  for (size_t cut = 0; cut < len; cut++)
    EXPECT_EQ(rt_unpack_kernel_objects(packed, cut, p->kernel_info, n, got.data(), got_len.data()), -1)
        << "cut at " << cut;
  std::vector<char> longer((char *)packed, (char *)packed + len);
  longer.push_back(0);
  EXPECT_EQ(rt_unpack_kernel_objects(longer.data(), longer.size(), p->kernel_info, n, got.data(),
                                     got_len.data()),
            -1);
  ir_free(ctx, packed, len);
  dsc_module_free(m);
  ir_arena_release(&a);
  dsc_context_free(ctx);
}

#ifdef DSC_HAVE_LLVM
// Runs train_step once on fixed inputs; returns [loss, grad_norm].
std::vector<double> one_step(dsc_exec *x, dsc_module *m) {
  dsc_context *ctx = dsc_module_context(m);
  dsc_params *params = dsc_params_init(m, 3);
  EXPECT_EQ(dsc_exec_set_params(x, params), DSC_OK);
  dsc_params_free(params);
  const dsc_graph *g = dsc_module_find_graph(m, "train_step");
  dsc_tensor *in[3];
  for (int i = 0; i < 3; i++) in[i] = dsc_tensor_new(ctx, dsc_node_type(dsc_graph_input_at(g, i)));
  for (int j = 0; j < 8; j++) in[0]->data[j] = (j * 5 + 3) % 16, in[1]->data[j] = (j * 11 + 1) % 16;
  in[2]->data[0] = 0.01;
  dsc_tensor *out[3] = {nullptr, nullptr, nullptr};
  EXPECT_EQ(dsc_exec_run(x, "train_step", in, 3, out), DSC_OK) << diags(ctx);
  std::vector<double> r;
  for (int i = 0; i < 2; i++) r.push_back(out[i] ? out[i]->data[0] : NAN);
  for (int i = 0; i < 3; i++) dsc_tensor_free(ctx, in[i]), dsc_tensor_free(ctx, out[i]);
  return r;
}

// Replaces one meta line of a .dsx (the container's checksums stay valid).
void rewrite_meta(dsc_context *ctx, const std::string &from, const std::string &to,
                  const std::string &key, const std::string &value) {
  rt_dsx *d = nullptr;
  ASSERT_EQ(rt_dsx_read(ctx, from.c_str(), &d), DSC_OK);
  std::string meta((const char *)rt_dsx_find(d, "meta")->data), out;
  size_t pos = 0;
  while (pos < meta.size()) {
    size_t nl = meta.find('\n', pos);
    std::string line = meta.substr(pos, nl - pos);
    out += line.rfind(key + "=", 0) == 0 ? key + "=" + value : line;
    out += "\n";
    pos = nl + 1;
  }
  std::vector<rt_dsx_section> s(d->sections, d->sections + d->n);
  for (auto &sec : s)
    if (!strcmp(sec.name, "meta")) sec.data = out.data(), sec.size = out.size();
  ASSERT_EQ(rt_dsx_write(ctx, to.c_str(), s.data(), (int)s.size()), DSC_OK);
  rt_dsx_free(ctx, d);
}

TEST(ProgramFile, KernelsLoadOnThisHostAndRecompileElsewhere) {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  std::string model = tiny_model_path(), path = tmp_path("tiny"), other = tmp_path("other");
  dsc_compile_options co;
  memset(&co, 0, sizeof co);
  co.model_path = model.c_str();
  co.out_path = path.c_str();
  dsc_compile_summary sum;
  ASSERT_EQ(dsc_program_compile(ctx, &co, &sum), DSC_OK) << diags(ctx);
  EXPECT_EQ(sum.graphs, 2);
  EXPECT_GT(sum.kernels, 2);
  EXPECT_TRUE(dsc_program_is_file(path.c_str()));
  EXPECT_FALSE(dsc_program_is_file(model.c_str()));

  dsc_program *prog = nullptr;
  ASSERT_EQ(dsc_program_open(ctx, path.c_str(), &prog), DSC_OK) << diags(ctx);
  EXPECT_STREQ(dsc_program_meta(prog, "target"), "cpu");
  EXPECT_STREQ(dsc_program_meta(prog, "seq"), "4");
  char why[1200] = "";
  EXPECT_TRUE(dsc_program_cpu_usable(prog, why, sizeof why)) << why;
  dsc_module *m = nullptr;
  ASSERT_EQ(dsc_program_module(prog, "step", &m), DSC_OK) << diags(ctx);
  dsc_exec_options xo = {DSC_BACKEND_CPU, 1, nullptr};
  dsc_exec *loaded = nullptr, *compiled = nullptr;
  ASSERT_EQ(dsc_exec_new_with_program(m, &xo, prog, "step", &loaded), DSC_OK) << diags(ctx);
  int c = -1, pre = -1;
  dsc_exec_kernel_counts(loaded, &c, &pre);
  EXPECT_EQ(c, 0);
  EXPECT_GT(pre, 0);
  ASSERT_EQ(dsc_exec_new(m, &xo, &compiled), DSC_OK) << diags(ctx);
  dsc_exec_kernel_counts(compiled, &c, &pre);
  EXPECT_GT(c, 0);
  EXPECT_EQ(pre, 0);
  // The same kernels: the same bits.
  std::vector<double> a = one_step(loaded, m), b = one_step(compiled, m);
  EXPECT_EQ(a, b);
  EXPECT_TRUE(std::isfinite(a[0]) && a[0] > 0);
  dsc_exec_free(loaded);
  dsc_exec_free(compiled);
  dsc_program_free(prog);

  // Another CPU: the objects are not loaded (they would not fit), the
  // kernels compile from the IR, and the reason names the CPU.
  rewrite_meta(ctx, path, other, "host", "x86_64-pc-linux-gnu othercpu +avx llvm-14.0.6");
  ASSERT_EQ(dsc_program_open(ctx, other.c_str(), &prog), DSC_OK) << diags(ctx);
  EXPECT_FALSE(dsc_program_cpu_usable(prog, why, sizeof why));
  EXPECT_NE(std::string(why).find("CPU othercpu"), std::string::npos) << why;
  ASSERT_EQ(dsc_exec_new_with_program(m, &xo, prog, "step", &loaded), DSC_OK) << diags(ctx);
  dsc_exec_kernel_counts(loaded, &c, &pre);
  EXPECT_GT(c, 0);
  EXPECT_EQ(pre, 0);
  EXPECT_EQ(one_step(loaded, m), b);
  dsc_exec_free(loaded);
  dsc_program_free(prog);

  // Another dsc version: also recompiled, and said so.
  rewrite_meta(ctx, path, other, "dsc_version", "9.9.9");
  ASSERT_EQ(dsc_program_open(ctx, other.c_str(), &prog), DSC_OK);
  EXPECT_FALSE(dsc_program_cpu_usable(prog, why, sizeof why));
  EXPECT_NE(std::string(why).find("dsc 9.9.9"), std::string::npos) << why;
  dsc_program_free(prog);

  // A newer program format is refused with both numbers.
  rewrite_meta(ctx, path, other, "format", "2");
  EXPECT_EQ(dsc_program_open(ctx, other.c_str(), &prog), DSC_ERR_USER);
  EXPECT_EQ(prog, nullptr);
  EXPECT_NE(diags(ctx).find("program format 2, this dsc reads format 1"), std::string::npos)
      << diags(ctx);
  dsc_diag_clear(ctx);

  // A malformed kernel section (valid checksum) is an error, not a crash.
  rt_dsx *d = nullptr;
  ASSERT_EQ(rt_dsx_read(ctx, path.c_str(), &d), DSC_OK);
  std::vector<rt_dsx_section> s(d->sections, d->sections + d->n);
  for (auto &sec : s)
    if (!strcmp(sec.name, "cpu/step/train_step")) sec.size /= 2;
  ASSERT_EQ(rt_dsx_write(ctx, other.c_str(), s.data(), (int)s.size()), DSC_OK);
  rt_dsx_free(ctx, d);
  ASSERT_EQ(dsc_program_open(ctx, other.c_str(), &prog), DSC_OK);
  EXPECT_EQ(dsc_exec_new_with_program(m, &xo, prog, "step", &loaded), DSC_ERR_USER);
  EXPECT_NE(diags(ctx).find("section 'cpu/step/train_step' is malformed"), std::string::npos)
      << diags(ctx);
  dsc_program_free(prog);
  dsc_module_free(m);
  dsc_context_free(ctx);
  std::remove(path.c_str());
  std::remove(other.c_str());
}
#endif

}  // namespace
