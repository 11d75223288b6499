// Text IR (print/parse), verifier and DOT export.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "ir/ir.h"
#include "tests/unit/test_util.h"

namespace {

// Allocator that checks every free/realloc passes the size that was
// allocated, counts outstanding bytes, and can fail after N allocations.
struct TrackingAlloc {
  std::unordered_map<void *, size_t> live;
  size_t outstanding = 0;
  long fail_after = -1;  // -1: never fail
  long allocs = 0;
  int size_mismatches = 0;

  static void *fn(void *ud, void *ptr, size_t osize, size_t nsize) {
    auto *t = static_cast<TrackingAlloc *>(ud);
    if (ptr) {
      auto it = t->live.find(ptr);
      if (it == t->live.end() || it->second != osize) t->size_mismatches++;
    }
    if (nsize == 0) {
      if (ptr) {
        t->outstanding -= t->live[ptr];
        t->live.erase(ptr);
        free(ptr);
      }
      return nullptr;
    }
    if (t->fail_after >= 0 && t->allocs >= t->fail_after) return nullptr;
    t->allocs++;
    void *p = realloc(ptr, nsize);
    if (!p) return nullptr;
    if (ptr) {
      t->outstanding -= t->live[ptr];
      t->live.erase(ptr);
    }
    t->live[p] = nsize;
    t->outstanding += nsize;
    return p;
  }
};

dsc_type T(dsc_dtype dt, std::vector<int64_t> dims) {
  return dsc_type_make(dt, (int)dims.size(), dims.data());
}

std::string Print(const dsc_module *m) {
  char *s = dsc_module_print_string(m);
  EXPECT_NE(s, nullptr);
  if (!s) return "";
  std::string r(s);
  dsc_string_free(dsc_module_context(m), s);
  return r;
}

// Parses text; on success returns the module, else nullptr.
dsc_module *Parse(dsc_context *ctx, const std::string &text, const char *file = "t.ir") {
  dsc_module *m = nullptr;
  dsc_status st = dsc_module_parse(ctx, text.data(), text.size(), file, &m);
  if (st != DSC_OK) {
    EXPECT_EQ(m, nullptr);
    return nullptr;
  }
  return m;
}

dsc_node *Build(dsc_graph *g, dsc_op op, std::vector<dsc_node *> in, std::vector<dsc_attr> attrs) {
  return dsc_build(g, op, in.data(), (int)in.size(), attrs.data(), (int)attrs.size());
}

// A module that uses every op, every attribute kind, every init kind,
// metadata with escapes, several graphs and outputs, scalars and names
// that need quoting.
dsc_module *BuildEverything(dsc_context *ctx) {
  dsc_module *m = dsc_module_new(ctx, "every.op");
  EXPECT_EQ(dsc_module_set_meta(m, "train.batch", "8"), DSC_OK);
  EXPECT_EQ(dsc_module_set_meta(m, "train.optimizer", "adamw(lr = 0.0006, betas = (0.9, 0.95))"),
            DSC_OK);
  EXPECT_EQ(dsc_module_set_meta(m, "esc \"q\"", "back\\slash\nnew\ttab\x01!"), DSC_OK);
  dsc_init normal{DSC_INIT_NORMAL, 0.02, 0.0, NULL}, ones{DSC_INIT_ONES, 0, 0, NULL},
      zeros{DSC_INIT_ZEROS, 0, 0, NULL}, cst{DSC_INIT_CONST, 0.5, 0, NULL}, uni{DSC_INIT_UNIFORM, -0.1, 0.1, NULL};
  EXPECT_EQ(dsc_module_add_param(m, "wte", T(DSC_F32, {10, 4}), normal), DSC_OK);
  EXPECT_EQ(dsc_module_add_param(m, "h.0.ln1_w", T(DSC_F32, {4}), ones), DSC_OK);
  EXPECT_EQ(dsc_module_add_param(m, "h.0.ln1_b", T(DSC_F32, {4}), zeros), DSC_OK);
  EXPECT_EQ(dsc_module_add_param(m, "p", T(DSC_F32, {3}), cst), DSC_OK);
  EXPECT_EQ(dsc_module_add_param(m, "q", T(DSC_F32, {3}), uni), DSC_OK);
  EXPECT_EQ(dsc_module_add_param(m, "odd \"name\"\\", T(DSC_F64, {}), zeros), DSC_OK);

  dsc_graph *g = dsc_graph_new(m, "forward");
  dsc_node *x = dsc_graph_input(g, "x", T(DSC_F32, {2, 3, 4}));
  dsc_node *ids = dsc_graph_input(g, "ids", T(DSC_I32, {2, 3}));
  dsc_node *wte = dsc_param_ref(g, "wte");
  dsc_node *lw = dsc_param_ref(g, "h.0.ln1_w");
  dsc_node *lb = dsc_param_ref(g, "h.0.ln1_b");
  dsc_node *odd = dsc_param_ref(g, "odd \"name\"\\");
  dsc_node *half = dsc_const(g, 0.5, T(DSC_F32, {}));
  int64_t shp[] = {2, 3, 4};
  dsc_node *iota = Build(
      g, DSC_OP_IOTA, {},
      {dsc_attr_int("axis", 2), dsc_attr_dtype("dtype", DSC_F32), dsc_attr_ints("shape", shp, 3)});
  std::vector<dsc_node *> outs;
  for (dsc_op op : {DSC_OP_ADD, DSC_OP_SUB, DSC_OP_MUL, DSC_OP_DIV, DSC_OP_MAXIMUM})
    outs.push_back(dsc_binary(g, op, x, iota));
  dsc_node *scaled = dsc_binary(g, DSC_OP_MUL, x, half);
  dsc_node *lt = dsc_binary(g, DSC_OP_LESS, x, iota);
  dsc_node *gt = dsc_binary(g, DSC_OP_GREATER, x, iota);
  dsc_node *eq = dsc_binary(g, DSC_OP_EQUAL, lt, gt);
  outs.push_back(Build(g, DSC_OP_WHERE, {eq, x, scaled}, {}));
  for (dsc_op op :
       {DSC_OP_NEG, DSC_OP_EXP, DSC_OP_LOG, DSC_OP_SQRT, DSC_OP_RSQRT, DSC_OP_TANH, DSC_OP_RELU,
        DSC_OP_GELU, DSC_OP_SILU, DSC_OP_SIGMOID, DSC_OP_SOFTPLUS, DSC_OP_SIN, DSC_OP_COS})
    outs.push_back(dsc_unary(g, op, x));
  outs.push_back(Build(g, DSC_OP_POW, {x}, {dsc_attr_float("exponent", 2.5)}));
  outs.push_back(dsc_cast(g, x, DSC_F64));
  int64_t axes01[] = {0, 1};
  outs.push_back(dsc_reduce(g, DSC_OP_SUM, x, axes01, 2, 1));
  outs.push_back(dsc_reduce(g, DSC_OP_MEAN, x, axes01 + 1, 1, 0));
  outs.push_back(dsc_reduce(g, DSC_OP_MAX, x, nullptr, 0, 0));
  int64_t rs[] = {6, 4}, perm[] = {2, 0, 1}, bshape[] = {5, 2, 3, 4};
  outs.push_back(dsc_reshape(g, x, rs, 2));
  outs.push_back(dsc_permute(g, x, perm, 3));
  outs.push_back(
      Build(g, DSC_OP_SLICE, {x},
            {dsc_attr_int("axis", 1), dsc_attr_int("start", 1), dsc_attr_int("end", 3)}));
  outs.push_back(Build(g, DSC_OP_CONCAT, {x, x, scaled}, {dsc_attr_int("axis", 2)}));
  outs.push_back(Build(g, DSC_OP_BROADCAST, {x}, {dsc_attr_ints("shape", bshape, 4)}));
  dsc_node *emb = Build(g, DSC_OP_EMBEDDING, {wte, ids}, {});
  outs.push_back(emb);
  int64_t tp[] = {0, 2, 1};
  outs.push_back(dsc_matmul(g, x, dsc_permute(g, x, tp, 3)));
  outs.push_back(Build(g, DSC_OP_SOFTMAX, {x}, {dsc_attr_int("axis", 2)}));
  outs.push_back(Build(g, DSC_OP_LOG_SOFTMAX, {x}, {dsc_attr_int("axis", 0)}));
  outs.push_back(Build(g, DSC_OP_LAYERNORM, {emb, lw, lb}, {dsc_attr_float("eps", 1e-5)}));
  outs.push_back(Build(g, DSC_OP_RMSNORM, {emb, lw}, {dsc_attr_float("eps", 1e-6)}));
  outs.push_back(dsc_attention(g, emb, emb, emb, 2, 2, true, 0));
  outs.push_back(dsc_rope(g, emb, ids, 2, 10000, false));
  dsc_rope_scaling llama3 = {8.0, 1.0, 4.0, 8192};
  outs.push_back(dsc_rope_scaled(g, emb, ids, 2, 500000, true, &llama3));
  outs.push_back(Build(g, DSC_OP_CROSS_ENTROPY, {emb, ids}, {}));
  outs.push_back(odd);
  // floats that are hard to print: negative zero, tiny, huge, inf, nan
  for (double v : {-0.0, 1e-300, 5e-324, 1.7976931348623157e308, 0.1, 1.0 / 3.0, (double)INFINITY,
                   -(double)INFINITY, (double)NAN})
    outs.push_back(dsc_const(g, v, T(DSC_F64, {2})));
  outs.push_back(dsc_const(g, -7, T(DSC_I64, {1, 1})));
  for (dsc_node *o : outs) EXPECT_NE(o, nullptr);
  EXPECT_EQ(dsc_graph_set_outputs(g, outs.data(), (int)outs.size()), DSC_OK);

  // A second graph: a quoted graph name, an input name that is not an
  // identifier, two scalar outputs, a bool constant.
  dsc_graph *g2 = dsc_graph_new(m, "second graph");
  dsc_node *a = dsc_graph_input(g2, "0 weird\"in", T(DSC_F32, {}));
  dsc_node *b = dsc_graph_input(g2, "b", T(DSC_F32, {}));
  dsc_node *s = dsc_binary(g2, DSC_OP_ADD, a, b);
  dsc_node *flag = dsc_const(g2, 1, T(DSC_BOOL, {}));
  dsc_node *two[] = {s, flag, a};
  EXPECT_EQ(dsc_graph_set_outputs(g2, two, 3), DSC_OK);
  return m;
}

}  // namespace

TEST(IrText, RoundTripEveryOpAttrInitAndName) {
  TrackingAlloc ta;
  dsc_context *ctx = dsc_context_new(TrackingAlloc::fn, &ta);
  dsc_module *m = BuildEverything(ctx);
  ASSERT_EQ(dsc_error_count(ctx), 0) << diags(ctx);
  ASSERT_EQ(dsc_module_verify(m), DSC_OK) << diags(ctx);
  std::string s1 = Print(m);
  dsc_module *m2 = Parse(ctx, s1);
  ASSERT_NE(m2, nullptr) << diags(ctx) << s1;
  std::string s2 = Print(m2);
  EXPECT_EQ(s1, s2);
  // The parsed module has the same structure and values.
  EXPECT_STREQ(dsc_module_name(m2), "every.op");
  EXPECT_STREQ(dsc_module_get_meta(m2, "esc \"q\""), "back\\slash\nnew\ttab\x01!");
  ASSERT_EQ(dsc_module_param_count(m2), 6);
  EXPECT_EQ(dsc_module_param_init(m2, 4).kind, DSC_INIT_UNIFORM);
  EXPECT_EQ(dsc_module_param_init(m2, 4).a, -0.1);
  EXPECT_EQ(dsc_module_find_param(m2, "odd \"name\"\\"), 5);
  ASSERT_EQ(dsc_module_graph_count(m2), 2);
  dsc_graph *g = dsc_module_graph(m2, 0), *g0 = dsc_module_graph(m, 0);
  ASSERT_EQ(dsc_graph_node_count(g), dsc_graph_node_count(g0));
  ASSERT_EQ(dsc_graph_output_count(g), dsc_graph_output_count(g0));
  for (int i = 0; i < dsc_graph_node_count(g); i++) {
    dsc_node *a = dsc_graph_node(g0, i), *b = dsc_graph_node(g, i);
    EXPECT_EQ(dsc_node_op(a), dsc_node_op(b));
    dsc_type ta2 = dsc_node_type(a), tb = dsc_node_type(b);
    EXPECT_TRUE(dsc_type_equal(&ta2, &tb));
    const dsc_attr *va = dsc_node_attr(a, "value"), *vb = dsc_node_attr(b, "value");
    if (va) {  // bitwise equal floats (covers -0.0 and nan)
      ASSERT_NE(vb, nullptr);
      if (std::isnan(va->u.f))
        EXPECT_TRUE(std::isnan(vb->u.f));
      else
        EXPECT_EQ(std::memcmp(&va->u.f, &vb->u.f, sizeof(double)), 0) << va->u.f;
    }
  }
  dsc_graph *h = dsc_module_find_graph(m2, "second graph");
  ASSERT_NE(h, nullptr);
  EXPECT_STREQ(dsc_node_name(dsc_graph_input_at(h, 0)), "0 weird\"in");
  EXPECT_EQ(dsc_graph_output_count(h), 3);
  // Some lines of the canonical form, exactly.
  EXPECT_NE(s1.find("module every.op\n\nmeta \"train.batch\" = \"8\"\n"), std::string::npos) << s1;
  EXPECT_NE(s1.find("meta \"esc \\\"q\\\"\" = \"back\\\\slash\\nnew\\ttab\\x01!\"\n"),
            std::string::npos);
  EXPECT_NE(s1.find("\nparam wte: f32[10,4] = normal(0.02, 0.0)\n"), std::string::npos);
  EXPECT_NE(s1.find("param q: f32[3] = uniform(-0.1, 0.1)\n"), std::string::npos);
  EXPECT_NE(s1.find("param p: f32[3] = const(0.5)\n"), std::string::npos);
  EXPECT_NE(s1.find("param \"odd \\\"name\\\"\\\\\": f64[] = zeros\n\ngraph forward("),
            std::string::npos);
  EXPECT_NE(s1.find("graph forward(%x: f32[2,3,4], %ids: i32[2,3]) {\n  %0 = param {name = "
                    "\"wte\"} : f32[10,4]\n"),
            std::string::npos);
  EXPECT_NE(s1.find(" = sum(%x) {axes = [0,1], keepdims = true} : f32[1,1,4]\n"),
            std::string::npos);
  EXPECT_NE(s1.find(" = max(%x) {axes = [], keepdims = false} : f32[2,3,4]\n"), std::string::npos);
  EXPECT_NE(s1.find(" = attention(%"), std::string::npos);
  EXPECT_NE(s1.find("{heads = 2, kv_heads = 2, causal = true, scale = 0.7071067811865475, "
                    "window = 0} : f32[2,3,4]\n"),
            std::string::npos);
  EXPECT_NE(s1.find(" = rope(%"), std::string::npos);
  EXPECT_NE(s1.find("{heads = 2, theta = 1e+04, interleaved = false, factor = 1.0, "
                    "low_freq_factor = 0.0, high_freq_factor = 0.0, original_context = 0} : "
                    "f32[2,3,4]\n"),
            std::string::npos);
  EXPECT_NE(s1.find("{heads = 2, theta = 5e+05, interleaved = true, factor = 8.0, "
                    "low_freq_factor = 1.0, high_freq_factor = 4.0, original_context = 8192} : "
                    "f32[2,3,4]\n"),
            std::string::npos);
  EXPECT_NE(s1.find("{value = -0.0, dtype = f64, shape = [2]}"), std::string::npos);
  EXPECT_NE(s1.find("{value = nan, dtype = f64, shape = [2]}"), std::string::npos);
  EXPECT_NE(s1.find("{value = -inf, dtype = f64, shape = [2]}"), std::string::npos);
  EXPECT_NE(s1.find("{value = -7.0, dtype = i64, shape = [1,1]}"), std::string::npos);
  EXPECT_NE(s1.find("\n}\n\ngraph \"second graph\"(%\"0 weird\\\"in\": f32[], %b: f32[]) {\n"),
            std::string::npos);
  EXPECT_NE(s1.find("  return %0, %1, %\"0 weird\\\"in\"\n}\n"), std::string::npos);
  EXPECT_EQ(s1.substr(s1.size() - 3), "\n}\n");
  dsc_module_free(m2);
  dsc_module_free(m);
  dsc_context_free(ctx);
  EXPECT_EQ(ta.outstanding, 0u);
  EXPECT_EQ(ta.size_mismatches, 0);
}

static const char kExample[] =
    "module gpt_tiny\n"
    "\n"
    "meta \"train.batch\" = \"8\"\n"
    "meta \"train.optimizer\" = \"adamw(lr = 0.0006, betas = (0.9, 0.95))\"\n"
    "\n"
    "param wte: f32[256,64] = normal(0.02, 0.0)\n"
    "param h.0.ln1_w: f32[64] = ones\n"
    "param h.0.ln1_b: f32[64] = zeros\n"
    "param p: f32[3] = const(0.5)\n"
    "param q: f32[3] = uniform(-0.1, 0.1)\n"
    "\n"
    "graph forward(%tokens: i32[4,64], %targets: i32[4,64]) {\n"
    "  %0 = param {name = \"wte\"} : f32[256,64]\n"
    "  %1 = embedding(%0, %tokens) : f32[4,64,64]\n"
    "  %2 = const {value = 0.5, dtype = f32, shape = []} : f32[]\n"
    "  %3 = mul(%1, %2) : f32[4,64,64]\n"
    "  %4 = sum(%3) {axes = [0,1,2], keepdims = false} : f32[]\n"
    "  return %4\n"
    "}\n";

TEST(IrText, ParsesAndReprintsTheReferenceExampleByteForByte) {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  dsc_module *m = Parse(ctx, kExample);
  ASSERT_NE(m, nullptr) << diags(ctx);
  EXPECT_EQ(Print(m), kExample);
  // Node locations point at each node's line in the text.
  dsc_graph *g = dsc_module_graph(m, 0);
  dsc_node *n = dsc_graph_node(g, 5);  // after the two inputs: %3 = mul
  EXPECT_EQ(dsc_node_op(n), DSC_OP_MUL);
  EXPECT_EQ(n->loc.line, 16);
  EXPECT_EQ(n->loc.col, 3);
  EXPECT_STREQ(n->loc.file, "t.ir");
  // FILE output is the same text.
  FILE *f = tmpfile();
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(dsc_module_print(m, f), DSC_OK);
  std::string got(ftell(f), '\0');
  rewind(f);
  ASSERT_EQ(fread(&got[0], 1, got.size(), f), got.size());
  fclose(f);
  EXPECT_EQ(got, kExample);
  dsc_module_free(m);
  dsc_context_free(ctx);
}

TEST(IrText, AcceptsCommentsWhitespaceAnyNamesAndAttributeOrder) {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  const char *text =
      "// leading comment\n"
      "module   m   // trailing comment\n"
      "param w : f32 [ 4 ] = const ( 2 )\n"
      "graph g ( %in.put : f32[4] ,%\"quoted name\":f32[4]) {\n"
      "  %w = param{name=\"w\"}:f32[4]\n"
      "  %sum.1 = add(%in.put,\n"
      "               %\"quoted name\") : f32[4]   // spans two lines\n"
      "  %77 = sum(%sum.1) {keepdims = true, axes = [0]} : f32[1]\n"
      "  %p = pow(%w) {exponent = 2} : f32[4]\n"
      "  return %77,%p\n"
      "}\n";
  dsc_module *m = Parse(ctx, text);
  ASSERT_NE(m, nullptr) << diags(ctx);
  EXPECT_EQ(Print(m),
            "module m\n\nparam w: f32[4] = const(2.0)\n\n"
            "graph g(%in.put: f32[4], %\"quoted name\": f32[4]) {\n"
            "  %0 = param {name = \"w\"} : f32[4]\n"
            "  %1 = add(%in.put, %\"quoted name\") : f32[4]\n"
            "  %2 = sum(%1) {axes = [0], keepdims = true} : f32[1]\n"
            "  %3 = pow(%0) {exponent = 2.0} : f32[4]\n"
            "  return %2, %3\n"
            "}\n");
  dsc_module_free(m);
  // A module with no sections at all.
  m = Parse(ctx, "module empty");
  ASSERT_NE(m, nullptr) << diags(ctx);
  EXPECT_EQ(Print(m), "module empty\n");
  dsc_module_free(m);
  dsc_context_free(ctx);
}

namespace {
struct BadCase {
  const char *what;
  std::string text;
  std::string needle;  // the offending token (first occurrence); empty: use line/col
  int line, col;
  const char *message;  // substring of the first error's message
};

// line:col of the first occurrence of needle in text.
void LocOf(const std::string &text, const std::string &needle, int *line, int *col) {
  size_t pos = text.find(needle);
  ASSERT_NE(pos, std::string::npos) << needle;
  *line = 1;
  *col = 1;
  for (size_t i = 0; i < pos; i++) {
    if (text[i] == '\n') {
      ++*line;
      *col = 1;
    } else {
      ++*col;
    }
  }
}

const std::string kHead = "module m\n\nparam w: f32[4] = ones\n\ngraph g(%x: f32[4]) {\n";
}  // namespace

TEST(IrText, ParseErrorsHaveExactLocationAndMessage) {
  std::vector<BadCase> cases = {
      {"undefined value", kHead + "  %0 = add(%x, %nope) : f32[4]\n  return %0\n}\n", "%nope", 0, 0,
       "use of undefined value %nope"},
      {"redefinition", kHead + "  %0 = neg(%x) : f32[4]\n  %0 = exp(%x) : f32[4]\n  return %0\n}\n",
       "%0 = exp", 0, 0, "redefinition of value %0"},
      {"input redefined", kHead + "  %x = neg(%x) : f32[4]\n  return %x\n}\n", "%x = neg", 0, 0,
       "redefinition of value %x"},
      {"unknown op", kHead + "  %0 = frobnicate(%x) : f32[4]\n  return %0\n}\n", "frobnicate", 0, 0,
       "unknown op 'frobnicate'"},
      {"wrong attr kind",
       kHead + "  %0 = sum(%x) {axes = 1, keepdims = false} : f32[4]\n  return %0\n}\n",
       "1, keepdims", 0, 0, "attribute 'axes' of 'sum' must be an ints list"},
      {"bool attr given a number",
       kHead + "  %0 = sum(%x) {axes = [0], keepdims = 0} : f32[]\n  return %0\n}\n", "0} :", 0, 0,
       "attribute 'keepdims' of 'sum' must be a bool"},
      {"unknown attribute", kHead + "  %0 = neg(%x) {alpha = 1.0} : f32[4]\n  return %0\n}\n",
       "alpha", 0, 0, "op 'neg' has no attribute 'alpha'"},
      {"missing attribute", kHead + "  %0 = sum(%x) {axes = [0]} : f32[]\n  return %0\n}\n",
       "{axes", 0, 0, "op 'sum' needs attribute 'keepdims'"},
      {"wrong arity", kHead + "  %0 = add(%x) : f32[4]\n  return %0\n}\n", "add", 0, 0,
       "op 'add' takes 2 input(s), got 1"},
      {"type mismatch vs inference", kHead + "  %0 = add(%x, %x) : f32[5]\n  return %0\n}\n",
       "%0 = add", 0, 0, "add: declared type f32[5] differs from the inferred type f32[4]"},
      {"shape rule rejects", kHead + "  %0 = exp(%i) : i32[4]\n  return %0\n}\n", "", 0, 0, ""},
      {"unknown param", kHead + "  %0 = param {name = \"nope\"} : f32[4]\n  return %0\n}\n",
       "%0 = param", 0, 0, "param: unknown parameter 'nope'"},
      {"missing return", kHead + "  %0 = neg(%x) : f32[4]\n}\n", "}\n", 0, 0,
       "graph 'g' has no return statement"},
      {"truncated file", kHead + "  %0 = neg(%x) : f32[4]\n", "", 7, 1,
       "unexpected end of input in graph 'g'"},
      {"truncated in a type", kHead + "  %0 = neg(%x) : f32[4", "", 6, 23,
       "expected ',' or ']', got end of input"},
      {"truncated in a string", kHead + "  %0 = param {name = \"w", "\"w", 0, 0,
       "unterminated string"},
      {"garbage bytes", "module m\n\x01\xff\xfegarbage\n", "\x01", 0, 0, "unexpected byte 0x01"},
      {"unknown dtype", kHead + "  %0 = neg(%x) : f33[4]\n  return %0\n}\n", "f33", 0, 0,
       "unknown dtype 'f33'"},
      {"bad number", kHead + "  %0 = pow(%x) {exponent = 1.2.3} : f32[4]\n  return %0\n}\n",
       "1.2.3", 0, 0, "invalid number '1.2.3'"},
      {"bad dimension", "module m\nparam w: f32[4x] = ones\n", "4x", 0, 0, "invalid number '4x'"},
      {"integer out of range", "module m\nparam w: f32[99999999999999999999] = ones\n", "999", 0, 0,
       "integer '99999999999999999999' is out of range"},
      {"zero dimension", "module m\nparam w: f32[4,0] = ones\n", "0]", 0, 0,
       "dimension 0 is not positive"},
      {"rank above 8", "module m\nparam w: f32[1,1,1,1,1,1,1,1,1] = ones\n", "1] =", 0, 0,
       "too many dimensions"},
      {"missing module", "param w: f32[4] = ones\n", "param", 0, 0,
       "expected 'module', got 'param'"},
      {"duplicate param", "module m\nparam w: f32[4] = ones\nparam w: f32[4] = zeros\n",
       "w: f32[4] = zeros", 0, 0, "parameter 'w' is declared twice"},
      {"duplicate meta key", "module m\nmeta \"k\" = \"1\"\nmeta \"k\" = \"2\"\n", "\"k\" = \"2\"",
       0, 0, "meta key \"k\" is given twice"},
      {"bad init", "module m\nparam w: f32[4] = gaussian(1.0)\n", "gaussian", 0, 0,
       "expected an initializer"},
      {"bad escape", "module m\nmeta \"k\" = \"a\\qb\"\n", "\\q", 0, 0,
       "unknown escape sequence in string"},
      {"input op in body", kHead + "  %0 = input : f32[4]\n  return %0\n}\n", "input :", 0, 0,
       "graph inputs are declared in the graph's signature"},
      {"statement after return", kHead + "  return %x\n  %0 = neg(%x) : f32[4]\n}\n", "%0 = neg", 0,
       0, "expected '}' after the return statement"},
      {"duplicate graph", kHead + "  return %x\n}\ngraph g(%y: f32[1]) {\n  return %y\n}\n", "g(%y",
       0, 0, "graph 'g' is defined twice"},
  };
  // The "shape rule rejects" case needs an i32 input: build it here.
  cases[10].text = "module m\ngraph g(%i: i32[4]) {\n  %0 = exp(%i) : i32[4]\n  return %0\n}\n";
  cases[10].needle = "%0 = exp";
  cases[10].message = "exp: ";
  for (const BadCase &c : cases) {
    SCOPED_TRACE(c.what);
    TrackingAlloc ta;
    dsc_context *ctx = dsc_context_new(TrackingAlloc::fn, &ta);
    dsc_module *m = reinterpret_cast<dsc_module *>(0x1);
    dsc_status st = dsc_module_parse(ctx, c.text.data(), c.text.size(), "bad.ir", &m);
    EXPECT_EQ(st, DSC_ERR_USER);
    EXPECT_EQ(m, nullptr);
    ASSERT_GE(dsc_error_count(ctx), 1);
    const dsc_diag *d = dsc_diag_get(ctx, 0);
    int line = c.line, col = c.col;
    if (!c.needle.empty()) LocOf(c.text, c.needle, &line, &col);
    ASSERT_NE(d->loc.file, nullptr);
    EXPECT_STREQ(d->loc.file, "bad.ir");
    EXPECT_EQ(d->loc.line, line) << diags(ctx);
    EXPECT_EQ(d->loc.col, col) << diags(ctx);
    EXPECT_NE(std::string(d->message).find(c.message), std::string::npos) << diags(ctx);
    // The caret printer finds the line.
    FILE *f = tmpfile();
    dsc_diag_print(ctx, f);
    long sz = ftell(f);
    EXPECT_GT(sz, 0);
    fclose(f);
    dsc_context_free(ctx);
    EXPECT_EQ(ta.outstanding, 0u);
    EXPECT_EQ(ta.size_mismatches, 0);
  }
}

TEST(IrText, KeepsGoingAfterAnErrorInANodeLine) {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  std::string text = kHead +
                     "  %0 = add(%x, %nope) : f32[4]\n"  // line 6: undefined value
                     "  %1 = neg(%0) : f32[4]\n"         // uses the failed %0: no new error
                     "  %2 = frobnicate(%x) : f32[4]\n"  // line 8: unknown op
                     "  %3 = neg(%x) : f33[4]\n"         // line 9: unknown dtype
                     "  %4 = neg(%x) : f32[4]\n"         // fine
                     "  return %4\n"
                     "}\n"
                     "param v: f32[0] = ones\n";  // line 13: bad dimension
  EXPECT_EQ(Parse(ctx, text), nullptr);
  EXPECT_EQ(diags(ctx),
            "t.ir:6:16: use of undefined value %nope\n"
            "t.ir:8:8: unknown op 'frobnicate'\n"
            "t.ir:9:18: unknown dtype 'f33'\n"
            "t.ir:13:14: dimension 0 is not positive\n");
  dsc_context_free(ctx);
}

TEST(IrText, VerifierReportsEveryTypeErrorOfParsedText) {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  std::string text = kHead +
                     "  %0 = neg(%x) : f32[3]\n"
                     "  %1 = exp(%x) : f64[4]\n"
                     "  %2 = param {name = \"v\"} : f32[4]\n"
                     "  return %0, %1, %2\n}\n";
  EXPECT_EQ(Parse(ctx, text), nullptr);
  EXPECT_EQ(diags(ctx),
            "t.ir:6:3: neg: declared type f32[3] differs from the inferred type f32[4]\n"
            "t.ir:7:3: exp: declared type f64[4] differs from the inferred type f32[4]\n"
            "t.ir:8:3: param: unknown parameter 'v'\n");
  dsc_context_free(ctx);
}

TEST(IrText, CaretPointsAtTheOffendingToken) {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  EXPECT_EQ(Parse(ctx, kHead + "  %0 = neg(%x) : f33[4]\n  return %0\n}\n", "c.ir"), nullptr);
  char *buf = nullptr;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  dsc_diag_print(ctx, f);
  fclose(f);
  EXPECT_EQ(std::string(buf, len),
            "c.ir:6:18: error: unknown dtype 'f33'\n"
            "    %0 = neg(%x) : f33[4]\n" +
                std::string(19, ' ') + "^\n");
  free(buf);
  dsc_context_free(ctx);
}

// Every prefix of a valid text, and many random corruptions of it, parse
// or fail cleanly: no crash, no leak, sizes passed correctly to the allocator.
TEST(IrText, TruncatedAndCorruptedInputFailsCleanly) {
  std::string text = kExample;
  std::mt19937 rng(1234);
  auto check = [](const std::string &t) {
    TrackingAlloc ta;
    dsc_context *ctx = dsc_context_new(TrackingAlloc::fn, &ta);
    dsc_module *m = nullptr;
    dsc_status st = dsc_module_parse(ctx, t.data(), t.size(), "fuzz.ir", &m);
    if (st == DSC_OK) {
      EXPECT_NE(m, nullptr);
      char *s = dsc_module_print_string(m);
      EXPECT_NE(s, nullptr);
      dsc_string_free(ctx, s);
      dsc_module_free(m);
    } else {
      EXPECT_EQ(m, nullptr);
      EXPECT_GE(dsc_error_count(ctx), 1) << t;
    }
    dsc_context_free(ctx);
    EXPECT_EQ(ta.outstanding, 0u);
    EXPECT_EQ(ta.size_mismatches, 0);
    return st;
  };
  // Prefixes that end inside the graph are incomplete; earlier ones may be
  // complete modules (a module line, some params).
  size_t graph_at = text.find("graph");
  for (size_t n = 0; n + 1 < text.size(); n++) {
    dsc_status st = check(text.substr(0, n));
    if (n > graph_at) {
      EXPECT_EQ(st, DSC_ERR_USER) << n;
    }
  }
  const char alphabet[] =
      "%{}()[],=:\"\\/ \n0123456789.-eE\x00\x80\xff"
      "abcf";
  for (int i = 0; i < 1500; i++) {
    std::string t = text;
    int edits = 1 + (int)(rng() % 4);
    for (int e = 0; e < edits; e++) {
      size_t pos = rng() % t.size();
      char c = alphabet[rng() % (sizeof alphabet - 1)];
      switch (rng() % 3) {
        case 0:
          t[pos] = c;
          break;
        case 1:
          t.insert(t.begin() + pos, c);
          break;
        default:
          t.erase(pos, 1 + rng() % 8);
          break;
      }
      if (t.empty()) t = "x";
    }
    check(t);
  }
  std::string bin(4096, '\0');
  for (char &c : bin) c = (char)(rng() & 0xff);
  EXPECT_EQ(check(bin), DSC_ERR_USER);
  EXPECT_EQ(check(""), DSC_ERR_USER);
  // Many errors stop after a bounded number of diagnostics.
  std::string many = "module m\n";
  for (int i = 0; i < 500; i++) many += "bogus line\n";
  TrackingAlloc ta;
  dsc_context *ctx = dsc_context_new(TrackingAlloc::fn, &ta);
  EXPECT_EQ(Parse(ctx, many), nullptr);
  EXPECT_LE(dsc_error_count(ctx), 30);
  dsc_context_free(ctx);
}

// Allocation failure at every point of parse and print: a status, never
// a crash or leak.
TEST(IrText, AllocationFailuresAreReportedAndLeakNothing) {
  int completed = 0;
  for (long n = 0; n < 400 && !completed; n++) {
    TrackingAlloc ta;
    dsc_context *ctx = dsc_context_new(TrackingAlloc::fn, &ta);
    ASSERT_NE(ctx, nullptr);
    ta.fail_after = ta.allocs + n;
    dsc_module *m = nullptr;
    dsc_status st = dsc_module_parse(ctx, kExample, strlen(kExample), "oom.ir", &m);
    if (st == DSC_OK) {
      char *s = dsc_module_print_string(m);
      if (s) {
        EXPECT_EQ(std::string(s), kExample);
        dsc_string_free(ctx, s);
        completed = 1;
      }
      dsc_module_free(m);
    } else {
      EXPECT_EQ(m, nullptr);
    }
    ta.fail_after = -1;
    dsc_context_free(ctx);
    EXPECT_EQ(ta.outstanding, 0u) << n;
    EXPECT_EQ(ta.size_mismatches, 0) << n;
  }
  EXPECT_EQ(completed, 1);
}

// ---------------- verifier on IR built with ir_node_new_raw ----------------

namespace {
struct RawFixture {
  dsc_context *ctx;
  dsc_module *m;
  dsc_graph *g;
  dsc_node *x;
  RawFixture() {
    ctx = dsc_context_new(nullptr, nullptr);
    m = dsc_module_new(ctx, "raw");
    dsc_init ones{DSC_INIT_ONES, 0, 0, NULL};
    dsc_module_add_param(m, "w", T(DSC_F32, {2, 3}), ones);
    g = dsc_graph_new(m, "g");
    x = dsc_graph_input(g, "x", T(DSC_F32, {2, 3}));
  }
  ~RawFixture() {
    dsc_module_free(m);
    dsc_context_free(ctx);
  }
};
}  // namespace

TEST(IrVerify, AcceptsAWellFormedRawGraph) {
  RawFixture f;
  dsc_node *in[] = {f.x, f.x};
  dsc_node *a = ir_node_new_raw(f.g, DSC_OP_ADD, T(DSC_F32, {2, 3}), in, 2, nullptr, 0);
  dsc_graph_set_outputs(f.g, &a, 1);
  EXPECT_EQ(dsc_module_verify(f.m), DSC_OK) << diags(f.ctx);
}

TEST(IrVerify, RejectsWrongTypeUnknownParamAndUseBeforeDef) {
  RawFixture f;
  dsc_node *in[] = {f.x, f.x};
  // %0: wrong declared type (broadcast gives f32[2,3])
  dsc_node *a = ir_node_new_raw(f.g, DSC_OP_ADD, T(DSC_F32, {3}), in, 2, nullptr, 0);
  // %1: a param that does not exist
  dsc_attr name = dsc_attr_str("name", "nope");
  ir_node_new_raw(f.g, DSC_OP_PARAM, T(DSC_F32, {2, 3}), nullptr, 0, &name, 1);
  // %2 uses %3, defined after it
  dsc_node *b = ir_node_new_raw(f.g, DSC_OP_NEG, T(DSC_F32, {2, 3}), &f.x, 1, nullptr, 0);
  dsc_node *c = ir_node_new_raw(f.g, DSC_OP_EXP, T(DSC_F32, {2, 3}), &f.x, 1, nullptr, 0);
  b->in[0] = c;
  // %4 has a dimension that is not positive
  dsc_type bad = T(DSC_F32, {2, 3});
  bad.dims[1] = 0;
  ir_node_new_raw(f.g, DSC_OP_NEG, bad, &f.x, 1, nullptr, 0);
  dsc_graph_set_outputs(f.g, &a, 1);
  EXPECT_EQ(dsc_module_verify(f.m), DSC_ERR_USER);
  EXPECT_EQ(diags(f.ctx),
            "graph g, %0 (add): declared type f32[3] differs from the inferred type f32[2,3]\n"
            "graph g, %1 (param): unknown parameter 'nope'\n"
            "graph g, %2 (neg): input 0 is used before it is defined\n"
            "graph g, %4 (neg): type f32[2,0] has a dimension that is not positive\n");
}

TEST(IrVerify, RejectsBadAttributes) {
  RawFixture f;
  int64_t ax[] = {0};
  // sum with attributes out of order, a wrong kind, an unknown key, a missing key
  dsc_attr swapped[] = {dsc_attr_bool("keepdims", 0), dsc_attr_ints("axes", ax, 1)};
  ir_node_new_raw(f.g, DSC_OP_SUM, T(DSC_F32, {3}), &f.x, 1, swapped, 2);
  dsc_attr kind[] = {dsc_attr_int("axes", 0), dsc_attr_bool("keepdims", 0)};
  ir_node_new_raw(f.g, DSC_OP_SUM, T(DSC_F32, {3}), &f.x, 1, kind, 2);
  dsc_attr extra = dsc_attr_float("alpha", 1.0);
  ir_node_new_raw(f.g, DSC_OP_NEG, T(DSC_F32, {2, 3}), &f.x, 1, &extra, 1);
  dsc_attr missing = dsc_attr_ints("axes", ax, 1);
  dsc_node *last = ir_node_new_raw(f.g, DSC_OP_SUM, T(DSC_F32, {3}), &f.x, 1, &missing, 1);
  // a wrong arity, with a source location
  dsc_node *in3[] = {f.x, f.x, f.x};
  dsc_node *ar = ir_node_new_raw(f.g, DSC_OP_ADD, T(DSC_F32, {2, 3}), in3, 3, nullptr, 0);
  ar->loc = dsc_loc{"src.dsm", 7, 9};
  dsc_graph_set_outputs(f.g, &last, 1);
  EXPECT_EQ(dsc_module_verify(f.m), DSC_ERR_USER);
  EXPECT_EQ(diags(f.ctx),
            "graph g, %0 (sum): attribute 'keepdims' is out of order (the order is: axes:ints "
            "keepdims:bool)\n"
            "graph g, %0 (sum): attribute 'axes' is out of order (the order is: axes:ints "
            "keepdims:bool)\n"
            "graph g, %1 (sum): attribute 'axes' must be ints, not int\n"
            "graph g, %2 (neg): unknown attribute 'alpha' (the op takes: none)\n"
            "graph g, %3 (sum): missing attribute 'keepdims' (bool)\n"
            "src.dsm:7:9: add: takes 2 input(s), got 3\n");
}

TEST(IrVerify, RejectsBadGraphsAndParams) {
  RawFixture f;
  // duplicate and invalid params (bypassing dsc_module_add_param's check)
  dsc_init z{DSC_INIT_ZEROS, 0, 0, NULL};
  dsc_module_add_param(f.m, "w2", T(DSC_F32, {1}), z);
  f.m->params[1].name = f.m->params[0].name;
  f.m->params[1].type.rank = 9;
  // an input node that is not among the graph's inputs
  ir_node_new_raw(f.g, DSC_OP_INPUT, T(DSC_F32, {1}), nullptr, 0, nullptr, 0);
  // a graph without outputs, and one whose output is a node of another graph
  dsc_graph *h = dsc_graph_new(f.m, "h");
  dsc_graph_set_outputs(h, &f.x, 1);
  EXPECT_EQ(dsc_module_verify(f.m), DSC_ERR_USER);
  EXPECT_EQ(diags(f.ctx),
            "parameter 'w': type <invalid type: dtype 0, rank 9> has a rank outside [0, 8]\n"
            "parameter 'w' is declared twice\n"
            "graph g, %0 (input): input node is not one of the graph's inputs\n"
            "graph g, %0 (input): input node has no name\n"
            "graph 'g' has no outputs\n"
            "graph 'h': output 0 is not a node of the graph\n");
}

// ---------------- DOT ----------------

TEST(IrDot, EmitsClustersNodesAndEdges) {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  std::string text = kExample;
  text.replace(text.find("gpt_tiny"), 8, "\"gpt \\\"tiny\\\"\"");
  dsc_module *m = Parse(ctx, text);
  ASSERT_NE(m, nullptr) << diags(ctx);
  char *buf = nullptr;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  ASSERT_EQ(dsc_module_print_dot(m, f), DSC_OK);
  fclose(f);
  std::string dot(buf, len);
  free(buf);
  EXPECT_EQ(dot.rfind("digraph \"gpt \\\"tiny\\\"\" {\n", 0), 0u) << dot;
  EXPECT_EQ(dot.substr(dot.size() - 2), "}\n");
  EXPECT_NE(dot.find("subgraph \"cluster_0\" {\n    label=\"forward\";"), std::string::npos);
  EXPECT_NE(dot.find("g0_n0 [shape=invhouse, label=\"%tokens\\ni32[4,64]\"];"), std::string::npos)
      << dot;
  EXPECT_NE(dot.find("g0_n2 [shape=cylinder, label=\"%0 = param\\nname=\\\"wte\\\"\\nf32[256,64]"),
            std::string::npos)
      << dot;
  EXPECT_NE(dot.find("label=\"%4 = sum\\naxes=[0,1,2], keepdims=false\\nf32[]\""),
            std::string::npos);
  // edges: embedding <- param, tokens; mul <- embedding, const; sum <- mul; return <- sum
  for (const char *e : {"g0_n2 -> g0_n3;", "g0_n0 -> g0_n3;", "g0_n3 -> g0_n5;", "g0_n4 -> g0_n5;",
                        "g0_n5 -> g0_n6;", "g0_n6 -> g0_ret;"})
    EXPECT_NE(dot.find(e), std::string::npos) << e;
  size_t edges = 0;
  for (size_t p = dot.find("->"); p != std::string::npos; p = dot.find("->", p + 2)) edges++;
  EXPECT_EQ(edges, 6u);
  // braces and unescaped quotes balance
  int depth = 0, quotes = 0;
  for (size_t i = 0; i < dot.size(); i++) {
    if (dot[i] == '\\') {
      i++;
      continue;
    }
    if (dot[i] == '"') quotes++;
    if (quotes % 2 == 0 && dot[i] == '{') depth++;
    if (quotes % 2 == 0 && dot[i] == '}') depth--;
    EXPECT_GE(depth, 0);
  }
  EXPECT_EQ(depth, 0);
  EXPECT_EQ(quotes % 2, 0);
  dsc_module_free(m);
  dsc_context_free(ctx);
}
