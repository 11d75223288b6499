// Tests of the model language: lexer and parser (through small programs),
// lowering into the IR, the examples, and the diagnostics of every file in
// tests/malformed/.
#include <gtest/gtest.h>

#include <dirent.h>
#include <sys/stat.h>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "dsc/frontend.h"
#include "ir/ir.h"
#include "tests/unit/test_util.h"

namespace {

std::string Src(const std::string &rel) { return std::string(DSC_SOURCE_DIR) + "/" + rel; }

// Compiles text; on success returns the module (caller frees), else nullptr.
struct Compiled {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  dsc_module *m = nullptr;
  dsc_status status = DSC_OK;
  ~Compiled() {
    dsc_module_free(m);
    dsc_context_free(ctx);
  }
};

void CompileText(Compiled &c, const std::string &text, std::vector<dsc_dim_binding> dims = {}) {
  dsc_frontend_options o = {dims.data(), (int)dims.size(), false};
  c.status = dsc_compile_string(c.ctx, text.data(), text.size(), "test.dsm", &o, &c.m);
}

// The graph's nodes of one op, in order.
std::vector<dsc_node *> NodesOf(dsc_module *m, dsc_op op) {
  std::vector<dsc_node *> r;
  dsc_graph *g = dsc_module_find_graph(m, "forward");
  for (int i = 0; g && i < dsc_graph_node_count(g); i++)
    if (dsc_node_op(dsc_graph_node(g, i)) == op) r.push_back(dsc_graph_node(g, i));
  return r;
}

std::string TypeStr(dsc_type t) {
  char b[128];
  dsc_type_format(&t, b, sizeof b);
  return b;
}

// A model whose forward returns `expr` for x: f32[4, 6].
std::string WithBody(const std::string &body, const std::string &decls = "") {
  return "model m {\n" + decls + "\n  fn forward(x: f32[4, 6]) {\n" + body + "\n  }\n}\n";
}

}  // namespace

// ---------------------------------------------------------------- parsing

TEST(FrontendParse, CommentsAndSeparators) {
  Compiled c;
  CompileText(c,
              "// line comment\n"
              "/* block\n   comment */ const a = 1; const b = 2, e = 3\n"
              "model m { const k = 4; param w: f32[a + b + e + k] = zeros, param v: f32[2] = ones\n"
              "  fn forward(x: f32[10]) -> f32[10] { y = x * 2; return y + w }\n"
              "}\n");
  ASSERT_EQ(c.status, DSC_OK) << diags(c.ctx);
  EXPECT_EQ(dsc_module_param_count(c.m), 2);
  EXPECT_EQ(TypeStr(dsc_module_param_type(c.m, 0)), "f32[10]");
}

TEST(FrontendParse, NewlinesInsideBracketsAndAfterOperators) {
  Compiled c;
  CompileText(c, WithBody("    y = matmul(x,\n      transpose(x)) +\n      1.0\n    return sum(y,\n"
                          "      axis = [0,\n 1])"));
  ASSERT_EQ(c.status, DSC_OK) << diags(c.ctx);
  EXPECT_EQ(NodesOf(c.m, DSC_OP_MATMUL).size(), 1u);
}

TEST(FrontendParse, PrecedenceAndConstantFolding) {
  // Each const is used as a dim so that its folded value is visible in a type.
  Compiled c;
  CompileText(
      c,
      "model m {\n"
      "  const a = 2 + 3 * 4, b = (2 + 3) * 4, e = 20 - 6 - 4, f = 17 % 5\n"
      "  const g = 12 / 4, h = -3 + 5, i = 2 * -3 + 10, j = 1000000 * 1000000 / 1000000000000\n"
      "  param p: f32[a, b, e, f, g, h, i, j] = zeros\n"
      "  fn forward(x: f32[2]) { return x * (7 / 2) }\n"
      "}\n");
  ASSERT_EQ(c.status, DSC_OK) << diags(c.ctx);
  EXPECT_EQ(TypeStr(dsc_module_param_type(c.m, 0)), "f32[14,20,10,2,3,2,4,1]");
  // 7 / 2 does not divide: a float constant 3.5, materialised as f32
  auto consts = NodesOf(c.m, DSC_OP_CONST);
  ASSERT_EQ(consts.size(), 1u);
  EXPECT_EQ(dsc_node_attr(consts[0], "value")->u.f, 3.5);
  EXPECT_EQ(TypeStr(dsc_node_type(consts[0])), "f32[]");
}

TEST(FrontendParse, FloatLiteralsAndScalarOperands) {
  Compiled c;
  CompileText(c, WithBody("    return 1.0 - x * 0.5 + 6e-4 / x"));
  ASSERT_EQ(c.status, DSC_OK) << diags(c.ctx);
  auto consts = NodesOf(c.m, DSC_OP_CONST);
  ASSERT_EQ(consts.size(), 3u);
  EXPECT_EQ(dsc_node_attr(consts[0], "value")->u.f, 0.5);  // x * 0.5 is evaluated first
  EXPECT_EQ(dsc_node_attr(consts[1], "value")->u.f, 1.0);
  EXPECT_EQ(dsc_node_attr(consts[2], "value")->u.f, 6e-4);
  // 1.0 - (x * 0.5): sub's first input is the constant
  auto subs = NodesOf(c.m, DSC_OP_SUB);
  ASSERT_EQ(subs.size(), 1u);
  EXPECT_EQ(dsc_node_input(subs[0], 0), consts[1]);
}

TEST(FrontendParse, ComparisonsAndWhere) {
  Compiled c;
  CompileText(c, WithBody("    m1 = x > 0.0\n    m2 = x < 1.0\n    m3 = x == x\n"
                          "    return where(m1, x, 0.0) + where(m2, x, x) + where(m3, 1.0, x)"));
  ASSERT_EQ(c.status, DSC_OK) << diags(c.ctx);
  EXPECT_EQ(NodesOf(c.m, DSC_OP_GREATER).size(), 1u);
  EXPECT_EQ(NodesOf(c.m, DSC_OP_LESS).size(), 1u);
  EXPECT_EQ(NodesOf(c.m, DSC_OP_EQUAL).size(), 1u);
  auto w = NodesOf(c.m, DSC_OP_WHERE);
  ASSERT_EQ(w.size(), 3u);
  EXPECT_EQ(dsc_node_type(dsc_node_input(w[0], 0)).dtype, DSC_BOOL);
}

TEST(FrontendParse, SizeLiteralsInTrainSection) {
  Compiled c;
  CompileText(
      c,
      "model m { fn forward(x: f32[2]) { return x } }\n"
      "train {\n  batch = 4\n  zero { stage = 3, bucket = 25MB, persist_threshold = 512KB,\n"
      "         prefetch_bytes = 2GiB, overlap = true }\n}\n");
  ASSERT_EQ(c.status, DSC_OK) << diags(c.ctx);
  EXPECT_STREQ(dsc_module_get_meta(c.m, "train.zero.bucket"), "25000000");
  EXPECT_STREQ(dsc_module_get_meta(c.m, "train.zero.persist_threshold"), "512000");
  EXPECT_STREQ(dsc_module_get_meta(c.m, "train.zero.prefetch_bytes"), "2147483648");
  EXPECT_STREQ(dsc_module_get_meta(c.m, "train.zero.overlap"), "true");
  EXPECT_STREQ(dsc_module_get_meta(c.m, "train.zero.stage"), "3");
}

TEST(FrontendParse, CallsKeywordsListsAndReductions) {
  Compiled c;
  CompileText(c, WithBody("    s = sum(x, axis = [-1, 0], keepdims = true)\n"
                          "    r = reshape(x, [2, -1])\n"
                          "    t = transpose(x)\n"
                          "    p = permute(r, [1, 0])\n"
                          "    k = slice(x, -1, -4, 6)\n"
                          "    cc = concat([k, k], axis = 0)\n"
                          "    return mean(s) + mean(r) + mean(t) + mean(p) + mean(cc)"));
  ASSERT_EQ(c.status, DSC_OK) << diags(c.ctx);
  auto sums = NodesOf(c.m, DSC_OP_SUM);
  ASSERT_EQ(sums.size(), 1u);
  const dsc_attr *axes = dsc_node_attr(sums[0], "axes");
  ASSERT_EQ(axes->u.ints.n, 2);  // normalised and sorted
  EXPECT_EQ(axes->u.ints.v[0], 0);
  EXPECT_EQ(axes->u.ints.v[1], 1);
  EXPECT_EQ(TypeStr(dsc_node_type(sums[0])), "f32[1,1]");
  EXPECT_EQ(TypeStr(dsc_node_type(NodesOf(c.m, DSC_OP_RESHAPE)[0])), "f32[2,12]");
  auto perms = NodesOf(c.m, DSC_OP_PERMUTE);
  ASSERT_EQ(perms.size(), 2u);
  EXPECT_EQ(TypeStr(dsc_node_type(perms[0])), "f32[6,4]");
  auto sl = NodesOf(c.m, DSC_OP_SLICE);
  ASSERT_EQ(sl.size(), 1u);
  EXPECT_EQ(dsc_node_attr(sl[0], "start")->u.i, 2);
  EXPECT_EQ(dsc_node_attr(sl[0], "end")->u.i, 6);
  EXPECT_EQ(TypeStr(dsc_node_type(NodesOf(c.m, DSC_OP_CONCAT)[0])), "f32[8,4]");
}

TEST(FrontendParse, BlocksMembersAndLoops) {
  Compiled c;
  CompileText(c,
              "model m {\n"
              "  block h[3] {\n"
              "    param w: f32[4] = const(0.5)\n"
              "    fn scale(x) { return x * w }\n"
              "    fn forward(x: [4]) -> [4] { return scale(x) + 1.0 }\n"
              "  }\n"
              "  fn forward(x: f32[4]) {\n"
              "    for l in h { x = l.forward(x) }\n"
              "    return x + h[0].w + h[-1].forward(x)\n"
              "  }\n"
              "}\n");
  ASSERT_EQ(c.status, DSC_OK) << diags(c.ctx);
  ASSERT_EQ(dsc_module_param_count(c.m), 3);
  EXPECT_STREQ(dsc_module_param_name(c.m, 2), "h.2.w");
  EXPECT_EQ(dsc_module_param_init(c.m, 1).kind, DSC_INIT_CONST);
  EXPECT_EQ(dsc_module_param_init(c.m, 1).a, 0.5);
  // one param read per instance (cached), four inlined forwards
  EXPECT_EQ(NodesOf(c.m, DSC_OP_PARAM).size(), 3u);
  EXPECT_EQ(NodesOf(c.m, DSC_OP_MUL).size(), 4u);
}

TEST(FrontendParse, ImportBringsConstsAndFunctions) {
  std::string dir = std::string(DSC_BINARY_DIR) + "/testtmp/fe_import";
  mkdir((std::string(DSC_BINARY_DIR) + "/testtmp").c_str(), 0755);
  mkdir(dir.c_str(), 0755);
  mkdir((dir + "/lib").c_str(), 0755);
  FILE *f = fopen((dir + "/lib/util.dsm").c_str(), "w");
  ASSERT_TRUE(f);
  fputs("const width = 6\nfn twice(x) { return x * 2 }\n", f);
  fclose(f);
  f = fopen((dir + "/main.dsm").c_str(), "w");
  ASSERT_TRUE(f);
  fputs(
      "import \"lib/util.dsm\"\nmodel m {\n  param w: f32[width] = ones\n"
      "  fn forward(x: f32[width]) { return twice(x) + w }\n}\n",
      f);
  fclose(f);
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  dsc_module *m = nullptr;
  ASSERT_EQ(dsc_compile_file(ctx, (dir + "/main.dsm").c_str(), nullptr, &m), DSC_OK) << diags(ctx);
  EXPECT_EQ(TypeStr(dsc_module_param_type(m, 0)), "f32[6]");
  dsc_module_free(m);
  dsc_context_free(ctx);
}

// --------------------------------------------------------------- lowering

TEST(FrontendLower, GptTinyParamsInitsAndMeta) {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  dsc_module *m = nullptr;
  ASSERT_EQ(dsc_compile_file(ctx, Src("examples/gpt-tiny.dsm").c_str(), nullptr, &m), DSC_OK)
      << diags(ctx);
  EXPECT_STREQ(dsc_module_name(m), "gpt_tiny");
  // wte, wpe, 2 x 12 block params, lnf_w, lnf_b, in declaration order
  ASSERT_EQ(dsc_module_param_count(m), 28);
  EXPECT_STREQ(dsc_module_param_name(m, 0), "wte");
  EXPECT_EQ(TypeStr(dsc_module_param_type(m, 0)), "f32[256,64]");
  EXPECT_EQ(dsc_module_param_init(m, 0).kind, DSC_INIT_NORMAL);
  EXPECT_EQ(dsc_module_param_init(m, 0).a, 0.02);
  EXPECT_EQ(dsc_module_param_init(m, 0).b, 0.0);
  EXPECT_STREQ(dsc_module_param_name(m, 2), "h.0.ln1_w");
  EXPECT_EQ(dsc_module_param_init(m, 2).kind, DSC_INIT_ONES);
  EXPECT_STREQ(dsc_module_param_name(m, 4), "h.0.attn_w");
  EXPECT_EQ(TypeStr(dsc_module_param_type(m, 4)), "f32[64,192]");
  EXPECT_STREQ(dsc_module_param_name(m, 6), "h.0.attn_proj_w");
  // proj_std = 0.02 / sqrt(2 * layers) with layers = 2
  EXPECT_DOUBLE_EQ(dsc_module_param_init(m, 6).a, 0.02 / std::sqrt(4.0));
  EXPECT_STREQ(dsc_module_param_name(m, 14), "h.1.ln1_w");
  EXPECT_STREQ(dsc_module_param_name(m, 27), "lnf_b");
  EXPECT_EQ(dsc_module_param_init(m, 27).kind, DSC_INIT_ZEROS);
  EXPECT_STREQ(dsc_module_get_meta(m, "train.batch"), "8");
  EXPECT_STREQ(dsc_module_get_meta(m, "train.seq"), "64");
  EXPECT_STREQ(dsc_module_get_meta(m, "train.clip"), "1.0");
  EXPECT_STREQ(dsc_module_get_meta(m, "train.optimizer"),
               "adamw(lr = 0.003, betas = (0.9, 0.95), weight_decay = 0.1)");
  EXPECT_STREQ(dsc_module_get_meta(m, "train.schedule"), "cosine(warmup = 50, min_lr = 0.0003)");
  // B and T come from the train section
  dsc_graph *g = dsc_module_find_graph(m, "forward");
  ASSERT_NE(g, nullptr);
  ASSERT_EQ(dsc_graph_input_count(g), 2);
  EXPECT_STREQ(dsc_node_name(dsc_graph_input_at(g, 0)), "tokens");
  EXPECT_EQ(TypeStr(dsc_node_type(dsc_graph_input_at(g, 0))), "i32[8,64]");
  ASSERT_EQ(dsc_graph_output_count(g), 1);
  EXPECT_EQ(TypeStr(dsc_node_type(dsc_graph_output_at(g, 0))), "f32[]");
  EXPECT_EQ(NodesOf(m, DSC_OP_ATTENTION).size(), 2u);
  EXPECT_EQ(dsc_module_verify(m), DSC_OK);
  dsc_module_free(m);
  dsc_context_free(ctx);
}

TEST(FrontendLower, DimsFromOptionsOverrideTrainSection) {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  dsc_module *m = nullptr;
  dsc_dim_binding dims[2] = {{"B", 2}, {"T", 16}};
  dsc_frontend_options o = {dims, 2, false};
  ASSERT_EQ(dsc_compile_file(ctx, Src("examples/gpt-tiny.dsm").c_str(), &o, &m), DSC_OK)
      << diags(ctx);
  dsc_graph *g = dsc_module_find_graph(m, "forward");
  EXPECT_EQ(TypeStr(dsc_node_type(dsc_graph_input_at(g, 1))), "i32[2,16]");
  // iota(T) follows the binding
  auto iotas = NodesOf(m, DSC_OP_IOTA);
  ASSERT_EQ(iotas.size(), 1u);
  EXPECT_EQ(TypeStr(dsc_node_type(iotas[0])), "i32[16]");
  dsc_module_free(m);
  dsc_context_free(ctx);
}

TEST(FrontendLower, Gpt2Has124MParameters) {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  dsc_module *m = nullptr;
  dsc_dim_binding dims[2] = {{"B", 1}, {"T", 8}};  // small graph; params do not depend on it
  dsc_frontend_options o = {dims, 2, false};
  ASSERT_EQ(dsc_compile_file(ctx, Src("examples/gpt2.dsm").c_str(), &o, &m), DSC_OK) << diags(ctx);
  // V = 50304, C = 1024, d = 768, L = 12:
  //   wte V*d = 38,633,472; wpe C*d = 786,432; lnf 2d = 1,536
  //   per layer: ln1, ln2 4d; attn d*3d + 3d; proj d*d + d; fc d*4d + 4d; fc_proj 4d*d + d
  //            = 12*d*d + 13*d = 7,077,888 + 9,984 = 7,087,872; x 12 = 85,054,464
  //   total 38,633,472 + 786,432 + 85,054,464 + 1,536 = 124,475,904
  const int64_t V = 50304, C = 1024, d = 768, L = 12;
  const int64_t expected = V * d + C * d + L * (12 * d * d + 13 * d) + 2 * d;
  EXPECT_EQ(expected, 124475904);
  EXPECT_EQ(dsc_module_param_numel(m), expected);
  EXPECT_EQ(dsc_module_param_count(m), 2 + 12 * 12 + 2);
  EXPECT_STREQ(dsc_module_get_meta(m, "train.zero.bucket"), "25000000");
  dsc_module_free(m);
  dsc_context_free(ctx);
}

TEST(FrontendLower, EveryExampleCompiles) {
  int n = 0;
  DIR *dir = opendir(Src("examples").c_str());
  ASSERT_NE(dir, nullptr);
  while (dirent *e = readdir(dir)) {
    std::string name = e->d_name;
    if (name.size() < 5 || name.substr(name.size() - 4) != ".dsm") continue;
    n++;
    dsc_context *ctx = dsc_context_new(nullptr, nullptr);
    dsc_module *m = nullptr;
    EXPECT_EQ(dsc_compile_file(ctx, Src("examples/" + name).c_str(), nullptr, &m), DSC_OK)
        << name << "\n"
        << diags(ctx);
    EXPECT_EQ(dsc_diag_count(ctx), 0) << name << "\n" << diags(ctx);
    dsc_module_free(m);
    dsc_context_free(ctx);
  }
  closedir(dir);
  EXPECT_GE(n, 3);
}

TEST(FrontendLower, ShapeErrorsPointAtTheExpression) {
  Compiled c;
  CompileText(c, WithBody("    y = x * 2.0\n    z = y +\n      transpose(x)\n    return z"));
  EXPECT_EQ(c.status, DSC_ERR_USER);
  ASSERT_GE(dsc_error_count(c.ctx), 1);
  const dsc_diag *d = dsc_diag_get(c.ctx, 0);
  EXPECT_EQ(d->loc.line, 5);  // the '+' of `y +`
  EXPECT_EQ(d->loc.col, 11);
  EXPECT_NE(std::string(d->message).find("add:"), std::string::npos) << d->message;
}

// A 5000-link chain of constants (a0 = a1 + 1, ..., a4999 = 1) used to overflow the stack
// through ev/lookup/const_value; now it is cut at FE_MAX_CONST_DEPTH with one clean error.
TEST(FrontendLower, LongConstantChainIsAnErrorNotACrash) {
  std::string text = "model m {\n  const ";
  const int n = 5000;
  for (int i = 0; i < n - 1; i++)
    text += "a" + std::to_string(i) + " = a" + std::to_string(i + 1) + " + 1,\n    ";
  text += "a" + std::to_string(n - 1) + " = 1\n";
  text += "  param w: f32[a0] = zeros\n  fn forward(x: f32[4]) { return x }\n}\n";
  char path[] = "/tmp/dsc_const_chain_XXXXXX";
  int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  FILE *f = fdopen(fd, "wb");
  ASSERT_TRUE(f);
  fwrite(text.data(), 1, text.size(), f);
  fclose(f);
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  dsc_module *m = nullptr;
  EXPECT_EQ(dsc_compile_file(ctx, path, nullptr, &m), DSC_ERR_USER);
  remove(path);
  EXPECT_EQ(m, nullptr);
  ASSERT_GE(dsc_error_count(ctx), 1);
  EXPECT_EQ(dsc_error_count(ctx), 1) << diags(ctx);  // reported once, not once per 256 links
  const dsc_diag *d = dsc_diag_get(ctx, 0);
  // a0 is evaluated at depth 0, so a256 is the first constant past the limit; the error is
  // at its use in the definition of a255 (line 2 + 255, after "a255 = ")
  EXPECT_EQ(std::string(d->message),
            "constant 'a256': definitions nested too deeply (more than 256 levels of constants "
            "defined through other constants)");
  EXPECT_EQ(d->loc.line, 2 + 255);
  EXPECT_EQ(d->loc.col, 12);
  dsc_context_free(ctx);

  // at the limit itself the chain is fine: 256 links evaluate to 256
  Compiled c;
  std::string ok = "model m {\n  const ";
  for (int i = 0; i < 255; i++)
    ok += "b" + std::to_string(i) + " = b" + std::to_string(i + 1) + " + 1, ";
  ok += "b255 = 1\n  param w: f32[b0] = zeros\n  fn forward(x: f32[4]) { return x }\n}\n";
  CompileText(c, ok);
  ASSERT_EQ(c.status, DSC_OK) << diags(c.ctx);
  EXPECT_EQ(TypeStr(dsc_module_param_type(c.m, 0)), "f32[256]");
}

// Deep expressions inside a chain of constants multiply: 8 constants of 200 nested additions
// each are 1600 levels of evaluation, past FE_MAX_EVAL_DEPTH: one clean error (the ASan
// build, with its large frames, overflowed the stack here before the limit).
TEST(FrontendLower, DeepExpressionsInConstantChainsAreBounded) {
  std::string text = "model m {\n";
  for (int k = 0; k < 8; k++) {
    std::string e = k < 7 ? "a" + std::to_string(k + 1) : "1";
    for (int d = 0; d < 200; d++) e = "(1 + " + e + ")";
    text += "  const a" + std::to_string(k) + " = " + e + "\n";
  }
  text += "  fn forward(x: f32[4]) { return x * a0 }\n}\n";
  Compiled c;
  CompileText(c, text);
  EXPECT_EQ(c.status, DSC_ERR_USER);
  ASSERT_EQ(dsc_error_count(c.ctx), 1) << diags(c.ctx);
  EXPECT_NE(std::string(dsc_diag_get(c.ctx, 0)->message).find("evaluation nested too deeply"),
            std::string::npos)
      << diags(c.ctx);
}

// The edges of the shared range check: the largest values that fit are accepted and stored
// exactly; one past them is rejected (tests/malformed/sem_*range*.dsm).
TEST(FrontendLower, NumbersAtTheEdgeOfTheirDtypeAreAccepted) {
  Compiled c;
  CompileText(c,
              "model m {\n"
              "  param c: i32[2] = const(-2147483648)\n"
              "  param k: bool[2] = const(1)\n"
              "  param h: f16[2] = const(65504)\n"
              "  fn forward(x: i32[4], y: i64[4], z: f16[4], w: f32[4, 6]) {\n"
              "    a = x + 2147483647\n"
              "    b = y - 9007199254740992\n"
              "    e = z * 65504.0\n"
              "    f = full([4], 3.0, dtype = i32)\n"
              "    g = full([2], 1, dtype = bool)\n"
              "    return sum(permute(w, [-1, 0]))\n"
              "  }\n"
              "}\n");
  ASSERT_EQ(c.status, DSC_OK) << diags(c.ctx);
  EXPECT_EQ(dsc_module_param_init(c.m, 0).a, -2147483648.0);
  EXPECT_EQ(dsc_module_param_init(c.m, 1).a, 1.0);
  EXPECT_EQ(dsc_module_param_init(c.m, 2).a, 65504.0);
  auto consts = NodesOf(c.m, DSC_OP_CONST);
  ASSERT_EQ(consts.size(), 5u);
  const double want[] = {2147483647.0, 9007199254740992.0, 65504.0, 3.0, 1.0};
  const char *types[] = {"i32[]", "i64[]", "f16[]", "i32[4]", "bool[2]"};
  for (int i = 0; i < 5; i++) {
    EXPECT_EQ(dsc_node_attr(consts[i], "value")->u.f, want[i]) << i;
    EXPECT_EQ(TypeStr(dsc_node_type(consts[i])), types[i]) << i;
  }
  auto perms = NodesOf(c.m, DSC_OP_PERMUTE);
  ASSERT_EQ(perms.size(), 1u);
  EXPECT_EQ(TypeStr(dsc_node_type(perms[0])), "f32[6,4]");  // [-1, 0] is [1, 0]
}

// Allocation failures at every point of a compilation: a clean DSC_ERR_INTERNAL
// (never a crash or leak, which the sanitizer build checks), until enough
// allocations succeed.
namespace {
struct FailingAlloc {
  long left;
};
void *failing_alloc(void *ud, void *ptr, size_t, size_t nsize) {
  FailingAlloc *f = (FailingAlloc *)ud;
  if (nsize == 0) {
    free(ptr);
    return nullptr;
  }
  if (f->left-- <= 0) return nullptr;
  return realloc(ptr, nsize);
}
}  // namespace

TEST(FrontendLower, OutOfMemoryAtEveryAllocation) {
  std::string text =
      "model m {\n  block h[2] { param w: f32[4] = ones\n fn forward(x) { return x * w } }\n"
      "  fn forward(x: f32[B, 4]) {\n    for l in h { x = l.forward(x) }\n"
      "    return sum(x)\n  }\n}\ntrain { batch = 2, optimizer = adamw(lr = 1e-3) }\n";
  bool succeeded = false;
  int failures = 0;
  for (long limit = 1; limit < 5000 && !succeeded; limit++) {
    FailingAlloc fa{limit};
    dsc_context *ctx = dsc_context_new(failing_alloc, &fa);
    if (!ctx) continue;
    dsc_module *m = nullptr;
    dsc_status s = dsc_compile_string(ctx, text.data(), text.size(), "oom.dsm", nullptr, &m);
    if (s == DSC_OK) {
      succeeded = true;
      EXPECT_EQ(dsc_module_param_count(m), 2);
    } else {
      failures++;
      EXPECT_EQ(s, DSC_ERR_INTERNAL) << "limit " << limit << "\n" << diags(ctx);
      EXPECT_EQ(m, nullptr);
    }
    dsc_module_free(m);
    dsc_context_free(ctx);
  }
  EXPECT_TRUE(succeeded);
  EXPECT_GT(failures, 5);  // context, arenas, flex, sources, module: each one was failed
}

// ------------------------------------------------------- malformed programs

namespace {
struct Expect {
  const char *file;  // in tests/malformed/
  int line, col;     // of the diagnostic (the file it names may be an imported one)
  const char *message;
  const char *diag_file;  // the file the diagnostic names, when not `file`
};

const Expect kMalformed[] = {
    // lexical
    {"lex_bad_char.dsm", 3, 14, "unexpected character '@'", nullptr},
    {"lex_unterminated_comment.dsm", 4, 1, "unterminated comment", nullptr},
    {"lex_unterminated_string.dsm", 1, 8, "unterminated string", nullptr},
    {"lex_malformed_number.dsm", 2, 13, "malformed number '12abc'", nullptr},
    {"lex_huge_integer.dsm", 2, 13, "integer '99999999999999999999999' is too large", nullptr},
    {"lex_float_out_of_range.dsm", 2, 13, "number '1e999' is out of range", nullptr},
    {"lex_binary_garbage.dsm", 1, 1, "unexpected byte 0x7f", nullptr},
    // syntax, recovery, nesting, degenerate files
    {"syn_missing_bracket.dsm", 2, 18, "expected ']' before '='", nullptr},
    {"syn_missing_paren.dsm", 2, 24, "expected ')' before '{'", nullptr},
    {"syn_unexpected_return.dsm", 2, 3, "unexpected 'return'", nullptr},
    {"syn_recovery.dsm", 4, 14, "unexpected ')'", nullptr},
    {"syn_recovery.dsm", 5, 13, "unexpected '*'", nullptr},
    {"syn_recovery.dsm", 7, 3, "unexpected '}'", nullptr},
    {"syn_truncated.dsm", 5, 1, "unexpected end of file", nullptr},
    {"syn_deep_brackets.dsm", 3, 266, "nesting too deep", nullptr},
    {"syn_deep_unary.dsm", 3, 1976, "nesting too deep", nullptr},
    {"syn_long_chain.dsm", 3, 1034, "expression nested too deeply", nullptr},
    {"empty.dsm", 1, 1, "no model defined", nullptr},
    {"only_comments.dsm", 1, 1, "no model defined", nullptr},
    // names and declarations
    {"sem_undefined_name.dsm", 4, 16, "undefined name 'wieght'; did you mean 'weight'?", nullptr},
    {"sem_unknown_function.dsm", 5, 12, "unknown function 'layernrom'; did you mean 'layernorm'?",
     nullptr},
    {"sem_redefinition.dsm", 4, 9, "redefinition of 'w'", nullptr},
    {"sem_redefinition.dsm", 5, 9, "redefinition of 'd'", nullptr},
    {"sem_misplaced_decl.dsm", 1, 1, "'param' is not allowed at the top level", nullptr},
    {"sem_two_models.dsm", 4, 7, "a file defines one model", nullptr},
    {"sem_missing_model.dsm", 1, 1, "no model defined", nullptr},
    {"sem_missing_forward.dsm", 1, 7, "model 'm' has no 'fn forward'", nullptr},
    {"sem_const_cycle.dsm", 2, 24, "constant 'a' depends on itself", nullptr},
    {"sem_param_in_const.dsm", 3, 13, "parameter 'w' cannot be used in a constant expression",
     nullptr},
    {"sem_unknown_dtype.dsm", 2, 12, "unknown dtype 'f33'; did you mean 'f32'?", nullptr},
    // types, shapes and dims
    {"sem_dtype_mismatch.dsm", 3, 14, "add: dtypes differ", nullptr},
    {"sem_shape_mismatch.dsm", 4, 9, "matmul:", nullptr},
    {"sem_unbound_dim.dsm", 2, 24, "dimension 'K' is not bound (use --batch/--seq or --dim K=N)",
     nullptr},
    {"sem_unbound_batch.dsm", 2, 21, "dimension 'B' is not bound", nullptr},
    {"sem_nonpositive_dim.dsm", 3, 21, "dimension 1 of parameter 'w' must be positive, got 0",
     nullptr},
    {"sem_too_many_elements.dsm", 2, 34, "too many elements", nullptr},
    {"sem_block_count.dsm", 2, 11, "must have between 1 and 4096 instances, got 5000", nullptr},
    {"sem_integer_overflow.dsm", 2, 27, "integer overflow", nullptr},
    {"sem_division_by_zero.dsm", 2, 33, "division by zero", nullptr},
    {"sem_int_tensor_float.dsm", 3, 18, "the number 0.5 is not an integer", nullptr},
    {"sem_number_range.dsm", 3, 13,
     "3000000000 does not fit in i32, the dtype of the tensor it is combined with", nullptr},
    {"sem_number_range.dsm", 4, 13, "1e+39 does not fit in f32", nullptr},
    {"sem_number_range.dsm", 5, 13, "65520 does not fit in f16", nullptr},
    {"sem_number_range.dsm", 6, 20, "-2147483649 does not fit in i32", nullptr},
    {"sem_full_range.dsm", 3, 19, "3000000000 does not fit in i32, the dtype of the tensor 'full'",
     nullptr},
    {"sem_full_range.dsm", 4, 19, "the number 0.5 is not an integer, but the tensor 'full' creates",
     nullptr},
    {"sem_full_range.dsm", 5, 19, "2 is not 0 or 1, but the tensor 'full' creates is bool",
     nullptr},
    {"sem_i64_precision.dsm", 3, 18,
     "9007199254740993 does not fit in an i64 constant, the dtype of the tensor it is combined "
     "with: constants are stored as doubles, exact only up to 2^53",
     nullptr},
    {"sem_permute_axis.dsm", 3, 23, "axis -3 is out of range for a tensor of rank 2", nullptr},
    {"sem_slice_range.dsm", 3, 12, "slice [4, 8) is empty or out of range", nullptr},
    {"sem_block_index.dsm", 7, 14, "index 2 is out of range for block 'h'", nullptr},
    {"sem_for_not_block.dsm", 4, 14, "'for' loops over a block, but 'w' is a tensor", nullptr},
    // calls and functions
    {"sem_builtin_arity.dsm", 3, 23, "'exp' takes 1 argument, got 2", nullptr},
    {"sem_unknown_keyword.dsm", 3, 23,
     "'softmax' has no argument named 'axes'; did you mean 'axis'?", nullptr},
    {"sem_wrong_arg_kind.dsm", 3, 19,
     "argument 'axis' of 'sum' must be an integer or a list of integers, not a tensor", nullptr},
    {"sem_missing_argument.dsm", 3, 12, "missing argument 'end' in call to 'slice'", nullptr},
    {"sem_fn_arity.dsm", 4, 22, "'double' takes 1 argument, got 2", nullptr},
    {"sem_arg_type.dsm", 4, 17, "argument 'x' of 'proj': expected f32[4,8], got f32[4,4]", nullptr},
    {"sem_return_type.dsm", 3, 14, "'forward' returns f32[4], but its declared type is f32[]",
     nullptr},
    {"sem_recursion.dsm", 2, 18, "recursive call to 'f'", nullptr},
    {"sem_no_return.dsm", 2, 6, "function 'helper' ends without 'return'", nullptr},
    {"sem_unreachable.dsm", 4, 5, "unreachable statement after 'return'", nullptr},
    {"sem_untyped_entry.dsm", 2, 14, "argument 'x' of the model's 'forward' needs a type", nullptr},
    {"sem_bad_init.dsm", 2, 21, "bad initializer 'normall'", nullptr},
    {"sem_bad_init_args.dsm", 2, 21, "'uniform' needs finite lo < hi", nullptr},
    {"sem_init_dtype.dsm", 2, 21, "'normal' initializes only float parameters, but 'w' is i32",
     nullptr},
    {"sem_init_dtype.dsm", 3, 27, "the number 2.7 is not an integer, but parameter 'c' is i32",
     nullptr},
    {"sem_init_dtype.dsm", 4, 22, "'uniform' initializes only float parameters, but 'b' is bool",
     nullptr},
    {"sem_init_dtype.dsm", 5, 28, "2 is not 0 or 1, but parameter 'd' is bool", nullptr},
    {"sem_init_dtype.dsm", 6, 27, "100000 does not fit in f16, the dtype of parameter 'e'",
     nullptr},
    {"sem_fn_duplicate_arg.dsm", 2, 14, "argument 'a' is declared twice", nullptr},
    {"sem_fn_duplicate_arg.dsm", 3, 25, "argument 'x' is declared twice", nullptr},
    {"sem_work_limit.dsm", 7, 20, "unrolls to more than 1000000 operations", nullptr},
    // the train section
    {"train_unknown_key.dsm", 5, 3, "unknown train setting 'bach'; did you mean 'batch'?", nullptr},
    {"train_unknown_key.dsm", 6, 21,
     "unknown train setting 'overlpa' in 'zero'; did you mean 'overlap'?", nullptr},
    {"train_bad_values.dsm", 5, 11, "'batch' must be a positive integer", nullptr},
    {"train_bad_values.dsm", 6, 15, "'precision' must be f32, bf16 or fp16", nullptr},
    {"train_bad_values.dsm", 7, 18, "'stage' must be 0, 1, 2 or 3", nullptr},
    {"train_bad_values.dsm", 8, 25, "must be one of none, cpu, host, nvme, disk", nullptr},
    {"train_bad_optimizer.dsm", 5, 15, "'adamw' has no setting 'beta'; did you mean 'betas'?",
     nullptr},
    {"train_bad_optimizer.dsm", 6, 14, "unknown schedule 'cosinus'; did you mean 'cosine'?",
     nullptr},
    // imports
    {"import_missing.dsm", 1, 8, "cannot import", nullptr},
    {"import_cycle.dsm", 2, 8, "import cycle", "lib/cycle_b.dsm"},
    {"import_model_in_lib.dsm", 3, 1, "'model' is not allowed in an imported file",
     "lib/has_model.dsm"},
};

bool EndsWith(const std::string &s, const std::string &suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
}  // namespace

TEST(FrontendMalformed, EachFileReportsItsDiagnostics) {
  std::set<std::string> files;
  for (const Expect &e : kMalformed) files.insert(e.file);
  EXPECT_GE(files.size(), 35u);
  for (const std::string &name : files) {
    SCOPED_TRACE(name);
    dsc_context *ctx = dsc_context_new(nullptr, nullptr);
    dsc_module *m = nullptr;
    std::string path = Src("tests/malformed/" + name);
    EXPECT_EQ(dsc_compile_file(ctx, path.c_str(), nullptr, &m), DSC_ERR_USER) << diags(ctx);
    EXPECT_EQ(m, nullptr);
    bool first = true;
    for (const Expect &e : kMalformed) {
      if (name != e.file) continue;
      const char *want_file = e.diag_file ? e.diag_file : e.file;
      bool found = false;
      for (int i = 0; i < dsc_diag_count(ctx) && !found; i++) {
        const dsc_diag *d = dsc_diag_get(ctx, i);
        found = d->severity == DSC_DIAG_ERROR && d->loc.file && EndsWith(d->loc.file, want_file) &&
                d->loc.line == e.line && d->loc.col == e.col &&
                std::string(d->message).find(e.message) != std::string::npos;
      }
      EXPECT_TRUE(found) << "expected " << e.line << ":" << e.col << ": " << e.message << "\ngot:\n"
                         << diags(ctx);
      if (first) {  // the first expectation is the first error reported
        const dsc_diag *d = dsc_diag_get(ctx, 0);
        ASSERT_NE(d, nullptr);
        EXPECT_EQ(d->loc.line, e.line) << diags(ctx);
        EXPECT_EQ(d->loc.col, e.col) << diags(ctx);
        first = false;
      }
    }
    dsc_context_free(ctx);
  }
}

TEST(FrontendMalformed, EveryCorpusFileHasAnExpectation) {
  std::set<std::string> listed;
  for (const Expect &e : kMalformed) listed.insert(e.file);
  DIR *dir = opendir(Src("tests/malformed").c_str());
  ASSERT_NE(dir, nullptr);
  while (dirent *e = readdir(dir)) {
    std::string name = e->d_name;
    if (EndsWith(name, ".dsm")) {
      EXPECT_TRUE(listed.count(name)) << name << " has no expectation";
    }
  }
  closedir(dir);
}

TEST(FrontendMalformed, RecoveryReportsSeveralErrors) {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  dsc_module *m = nullptr;
  EXPECT_EQ(dsc_compile_file(ctx, Src("tests/malformed/syn_recovery.dsm").c_str(), nullptr, &m),
            DSC_ERR_USER);
  EXPECT_GE(dsc_error_count(ctx), 3) << diags(ctx);
  EXPECT_LE(dsc_error_count(ctx), 4) << diags(ctx);  // no long cascade
  dsc_context_free(ctx);
}

TEST(FrontendMalformed, GarbageIsBoundedAndNeverCrashes) {
  // pseudo-random bytes, and every prefix of a real model
  unsigned x = 12345;
  for (int round = 0; round < 50; round++) {
    std::string text(1 + round * 37, '\0');
    for (char &ch : text) {
      x = x * 1103515245u + 12345u;
      ch = (char)(x >> 16);
    }
    Compiled c;
    CompileText(c, text);
    EXPECT_EQ(c.status, DSC_ERR_USER);
    EXPECT_LE(dsc_error_count(c.ctx), 2 * 20 + 2);  // capped per file
  }
  FILE *f = fopen(Src("examples/gpt-tiny.dsm").c_str(), "rb");
  ASSERT_TRUE(f);
  std::string full;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) full.append(buf, n);
  fclose(f);
  for (size_t cut = 0; cut < full.size(); cut += 7) {
    dsc_context *ctx = dsc_context_new(nullptr, nullptr);
    dsc_module *m = nullptr;
    std::string path = Src("examples/cut.dsm");  // imports resolve next to the example
    dsc_status s = dsc_compile_string(ctx, full.data(), cut, path.c_str(), nullptr, &m);
    EXPECT_EQ(s, DSC_ERR_USER) << "cut at " << cut;
    dsc_module_free(m);
    dsc_context_free(ctx);
  }
}
