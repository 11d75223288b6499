// Lowering (codegen/lower.c) and the program evaluator (codegen/program_eval.c):
// every primitive op, fused and lowered, matches the interpreter on random
// inputs; f32 tolerance 1e-5 relative (kir_eval and the GEMM loops compute in
// double, the interpreter rounds to f32 after each op: a few ulp apart).
#include "lower_test_util.h"

#include <memory>

#include "dsc/frontend.h"
#include "dsc/train.h"

using namespace lowertest;

namespace {

constexpr double kTolF32 = 1e-5;

struct Fixture : ::testing::Test {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  dsc_module *m = dsc_module_new(ctx, "t");
  dsc_graph *g = dsc_graph_new(m, "g");
  std::mt19937 rng{1234};
  std::unique_ptr<Harness> h;  // owns the lowered program's arena
  ~Fixture() override {
    h.reset();
    dsc_module_free(m);
    dsc_context_free(ctx);
  }
  dsc_node *op(dsc_op o, std::vector<dsc_node *> in, std::vector<dsc_attr> attrs = {}) {
    dsc_node *n = dsc_build(g, o, in.data(), (int)in.size(), attrs.data(), (int)attrs.size());
    EXPECT_NE(n, nullptr) << diags(ctx);
    return n;
  }
  dsc_node *input(const char *name, dsc_type t) { return dsc_graph_input(g, name, t); }
  // A new empty module and graph (a test's next variant).
  void fresh() {
    h.reset();
    dsc_module_free(m);
    m = dsc_module_new(ctx, "t");
    g = dsc_graph_new(m, "g");
  }
  // Fuses, verifies, lowers and compares against the interpreter.
  Result check(std::vector<dsc_node *> outs, std::vector<dsc_tensor *> inputs, double tol = kTolF32) {
    EXPECT_EQ(dsc_graph_set_outputs(g, outs.data(), (int)outs.size()), DSC_OK);
    EXPECT_EQ(pass_fuse_graph(g), DSC_OK) << diags(ctx);
    EXPECT_EQ(dsc_module_verify(m), DSC_OK) << diags(ctx);
    h.reset(new Harness(ctx, m));
    Result r = h->run(g, inputs, tol);
    EXPECT_EQ(r.lower, DSC_OK) << diags(ctx);
    EXPECT_TRUE(r.eval_ok) << r.eval_err;
    return r;
  }
};

struct Lower : Fixture {};

TEST_F(Lower, UnaryOpsMatchInterpreter) {
  const dsc_op ops[] = {DSC_OP_NEG, DSC_OP_EXP, DSC_OP_LOG, DSC_OP_SQRT, DSC_OP_RSQRT,
                        DSC_OP_TANH, DSC_OP_RELU, DSC_OP_GELU, DSC_OP_SILU, DSC_OP_SIGMOID};
  dsc_type t = ty(DSC_F32, {3, 5});
  dsc_node *x = input("x", t), *xp = input("xp", t);
  std::vector<dsc_node *> outs;
  for (dsc_op o : ops) {
    bool pos = o == DSC_OP_LOG || o == DSC_OP_SQRT || o == DSC_OP_RSQRT;
    outs.push_back(op(o, {pos ? xp : x}));
  }
  outs.push_back(op(DSC_OP_POW, {xp}, {dsc_attr_float("exponent", 1.5)}));
  outs.push_back(op(DSC_OP_CAST, {x}, {dsc_attr_dtype("dtype", DSC_F64)}));
  outs.push_back(op(DSC_OP_CAST, {op(DSC_OP_MUL, {x, dsc_const(g, 4, ty(DSC_F32, {}))})},
                    {dsc_attr_dtype("dtype", DSC_I32)}));
  check(outs, {random_tensor(ctx, t, rng), random_tensor(ctx, t, rng, true)});
}

TEST_F(Lower, BinaryOpsBroadcastAndCompare) {
  dsc_node *a = input("a", ty(DSC_F32, {2, 3, 4})), *b = input("b", ty(DSC_F32, {3, 1}));
  dsc_node *c = input("c", ty(DSC_F32, {4}));
  std::vector<dsc_node *> outs = {op(DSC_OP_ADD, {a, b}), op(DSC_OP_SUB, {b, a}),
                                  op(DSC_OP_MUL, {a, c}), op(DSC_OP_DIV, {a, b}),
                                  op(DSC_OP_MAXIMUM, {a, c}), op(DSC_OP_LESS, {a, c}),
                                  op(DSC_OP_GREATER, {a, b}), op(DSC_OP_EQUAL, {b, b})};
  outs.push_back(op(DSC_OP_WHERE, {op(DSC_OP_LESS, {a, c}), a, b}));
  check(outs, {random_tensor(ctx, ty(DSC_F32, {2, 3, 4}), rng), random_tensor(ctx, ty(DSC_F32, {3, 1}), rng),
               random_tensor(ctx, ty(DSC_F32, {4}), rng)});
}

TEST_F(Lower, IntegerOps) {
  dsc_node *a = input("a", ty(DSC_I32, {4, 6})), *b = input("b", ty(DSC_I32, {6}));
  dsc_node *l = input("l", ty(DSC_I64, {4, 6}));
  std::vector<dsc_node *> outs = {op(DSC_OP_ADD, {a, b}), op(DSC_OP_DIV, {a, b}),
                                  op(DSC_OP_NEG, {a}), op(DSC_OP_RELU, {op(DSC_OP_SUB, {a, b})}),
                                  op(DSC_OP_SUM, {l}, {dsc_attr_ints("axes", std::vector<int64_t>{1}.data(), 1),
                                                       dsc_attr_bool("keepdims", 0)}),
                                  op(DSC_OP_CAST, {a}, {dsc_attr_dtype("dtype", DSC_F32)})};
  check(outs, {random_tensor(ctx, ty(DSC_I32, {4, 6}), rng, false, -50, 50),
               random_tensor(ctx, ty(DSC_I32, {6}), rng, false, 1, 9),
               random_tensor(ctx, ty(DSC_I64, {4, 6}), rng, false, -1000, 1000)});
}

TEST_F(Lower, ReductionsOverEveryAxisSet) {
  dsc_type t = ty(DSC_F32, {3, 4, 5});
  dsc_node *x = input("x", t);
  std::vector<dsc_node *> outs;
  const std::vector<std::vector<int64_t>> sets = {{}, {0}, {1}, {2}, {0, 1}, {0, 2}, {1, 2}, {0, 1, 2}};
  for (dsc_op o : {DSC_OP_SUM, DSC_OP_MEAN, DSC_OP_MAX})
    for (const auto &axes : sets)
      for (int keep = 0; keep < 2; keep++)
        outs.push_back(op(o, {x}, {dsc_attr_ints("axes", axes.data(), (int)axes.size()),
                                   dsc_attr_bool("keepdims", keep)}));
  // a reduction of an elementwise producer, read back by a consumer
  std::vector<int64_t> last = {2};
  dsc_node *e = op(DSC_OP_EXP, {x});
  dsc_node *s = op(DSC_OP_SUM, {e}, {dsc_attr_ints("axes", last.data(), 1), dsc_attr_bool("keepdims", 1)});
  outs.push_back(op(DSC_OP_DIV, {e, s}));
  check(outs, {random_tensor(ctx, t, rng)});
}

TEST_F(Lower, LayoutOpsAsOutputsAndInputs) {
  dsc_type t = ty(DSC_F32, {2, 3, 4});
  dsc_node *x = input("x", t);
  std::vector<int64_t> shp = {6, 4}, perm = {2, 0, 1}, bshape = {5, 2, 3, 4}, sp = {4, 6};
  dsc_node *rs = op(DSC_OP_RESHAPE, {x}, {dsc_attr_ints("shape", shp.data(), 2)});
  dsc_node *pm = op(DSC_OP_PERMUTE, {x}, {dsc_attr_ints("perm", perm.data(), 3)});
  dsc_node *sl = op(DSC_OP_SLICE, {x}, {dsc_attr_int("axis", 1), dsc_attr_int("start", 1), dsc_attr_int("end", 3)});
  dsc_node *bc = op(DSC_OP_BROADCAST, {x}, {dsc_attr_ints("shape", bshape.data(), 4)});
  // reshape of a permuted view: not expressible as strides, needs a copy
  dsc_node *rp = op(DSC_OP_RESHAPE, {pm}, {dsc_attr_ints("shape", sp.data(), 2)});
  dsc_node *cc = op(DSC_OP_CONCAT, {x, op(DSC_OP_EXP, {x}), sl}, {dsc_attr_int("axis", 1)});
  dsc_node *c0 = op(DSC_OP_CONCAT, {dsc_const(g, 2, ty(DSC_F32, {1, 3, 4})), x}, {dsc_attr_int("axis", 0)});
  std::vector<dsc_node *> outs = {rs, pm, sl, bc, rp, cc, c0, op(DSC_OP_EXP, {pm}),
                                  op(DSC_OP_ADD, {sl, sl}), op(DSC_OP_TANH, {rp})};
  check(outs, {random_tensor(ctx, t, rng)});
}

TEST_F(Lower, IotaAndConstInlined) {
  dsc_node *x = input("x", ty(DSC_F32, {4, 4}));
  dsc_node *i0 = op(DSC_OP_IOTA, {}, {dsc_attr_int("axis", 0), dsc_attr_dtype("dtype", DSC_I32),
                                      dsc_attr_ints("shape", std::vector<int64_t>{4, 4}.data(), 2)});
  dsc_node *i1 = op(DSC_OP_IOTA, {}, {dsc_attr_int("axis", 1), dsc_attr_dtype("dtype", DSC_I32),
                                      dsc_attr_ints("shape", std::vector<int64_t>{4, 4}.data(), 2)});
  dsc_node *mask = op(DSC_OP_GREATER, {i1, i0});
  dsc_node *ninf = dsc_const(g, -1e30, ty(DSC_F32, {}));
  check({op(DSC_OP_WHERE, {mask, ninf, x}), i0, mask}, {random_tensor(ctx, ty(DSC_F32, {4, 4}), rng)});
}

TEST_F(Lower, EmbeddingGatherAndOutOfRangeId) {
  dsc_node *tab = input("table", ty(DSC_F32, {7, 5}));
  dsc_node *ids = input("ids", ty(DSC_I32, {2, 3}));
  dsc_node *e = op(DSC_OP_EMBEDDING, {tab, ids});
  check({op(DSC_OP_MUL, {e, e})}, {random_tensor(ctx, ty(DSC_F32, {7, 5}), rng),
                                   random_tensor(ctx, ty(DSC_I32, {2, 3}), rng, false, 0, 7)});
}

TEST_F(Lower, EmbeddingOutOfRangeIdIsAnError) {
  dsc_node *tab = input("table", ty(DSC_F32, {7, 5}));
  dsc_node *ids = input("ids", ty(DSC_I32, {4}));
  dsc_node *e = op(DSC_OP_EMBEDDING, {tab, ids});
  dsc_graph_set_outputs(g, &e, 1);
  ASSERT_EQ(pass_fuse_graph(g), DSC_OK);
  Harness h(ctx, m);
  dsc_tensor *ti = random_tensor(ctx, ty(DSC_I32, {4}), rng, false, 0, 7);
  ti->data[2] = 7;  // == rows: out of range
  Result r = h.run(g, {random_tensor(ctx, ty(DSC_F32, {7, 5}), rng), ti}, kTolF32, false);
  ASSERT_EQ(r.lower, DSC_OK) << diags(ctx);
  EXPECT_FALSE(r.eval_ok);
  EXPECT_NE(r.eval_err.find("out of range"), std::string::npos) << r.eval_err;
}

TEST_F(Lower, EmbeddingGradScatterAdds) {
  dsc_node *ids = input("ids", ty(DSC_I64, {3, 4}));
  dsc_node *dy = input("dy", ty(DSC_F32, {3, 4, 5}));
  dsc_node *eg = op(DSC_OP_EMBEDDING_GRAD, {ids, op(DSC_OP_MUL, {dy, dy})}, {dsc_attr_int("rows", 6)});
  check({eg, op(DSC_OP_EXP, {eg})}, {random_tensor(ctx, ty(DSC_I64, {3, 4}), rng, false, 0, 6),
                                      random_tensor(ctx, ty(DSC_F32, {3, 4, 5}), rng)});
}

// A tied embedding's gradient, add(GEMM result, embedding_grad): the
// scatter-add accumulates into the GEMM's buffer in place (no zero-filled
// buffer, no add kernel) when nothing else reads the GEMM result and it lies
// in its buffer as it is; otherwise the plain scatter into zeros. Both match
// the interpreter (ids repeat: rows accumulate).
TEST_F(Lower, TiedEmbeddingGradAccumulatesIntoGemmInPlace) {
  for (int variant = 0; variant < 3; variant++) {
    fresh();
    std::vector<int64_t> t2 = {1, 0};
    dsc_node *ids = input("ids", ty(DSC_I64, {3, 4}));
    dsc_node *dy = input("dy", ty(DSC_F32, {3, 4, 5}));
    dsc_node *dl = input("dl", ty(DSC_F32, {12, 6}));
    dsc_node *hid = input("hid", ty(DSC_F32, {12, 5}));
    dsc_node *x;
    if (variant == 2)  // [5, 6] transposed: not the buffer's layout
      x = op(DSC_OP_PERMUTE, {op(DSC_OP_MATMUL, {op(DSC_OP_PERMUTE, {hid}, {dsc_attr_ints("perm", t2.data(), 2)}), dl})},
             {dsc_attr_ints("perm", t2.data(), 2)});
    else
      x = op(DSC_OP_MATMUL, {op(DSC_OP_PERMUTE, {dl}, {dsc_attr_ints("perm", t2.data(), 2)}), hid});
    dsc_node *eg = op(DSC_OP_EMBEDDING_GRAD, {ids, dy}, {dsc_attr_int("rows", 6)});
    dsc_node *gsum = op(DSC_OP_ADD, {x, eg});
    std::vector<int64_t> all = {0, 1};
    dsc_node *norm = op(DSC_OP_SUM, {op(DSC_OP_MUL, {gsum, gsum})},
                        {dsc_attr_ints("axes", all.data(), 2), dsc_attr_bool("keepdims", 0)});
    std::vector<dsc_node *> outs = {norm, op(DSC_OP_EXP, {gsum}), gsum};
    if (variant == 1) outs.push_back(x);  // the GEMM result is read twice
    Result r = check(outs, {random_tensor(ctx, ty(DSC_I64, {3, 4}), rng, false, 0, 6),
                            random_tensor(ctx, ty(DSC_F32, {3, 4, 5}), rng),
                            random_tensor(ctx, ty(DSC_F32, {12, 6}), rng),
                            random_tensor(ctx, ty(DSC_F32, {12, 5}), rng)});
    ASSERT_NE(r.prog, nullptr);
    int accumulating = 0, plain = 0;
    for (int i = 0; i < r.prog->n_instrs; i++) {
      const cg_instr *in = &r.prog->instrs[i];
      if (in->kind == CG_INS_EMBEDDING_GRAD) (in->accumulate ? accumulating : plain)++;
    }
    EXPECT_EQ(accumulating, variant == 0 ? 1 : 0) << "variant " << variant;
    EXPECT_EQ(plain, variant == 0 ? 0 : 1) << "variant " << variant;
  }
}

// set_rows(state, ids, rows) assigned to that state (the KV cache's write):
// the rows go into the state in place (no copy of it) when nothing reads
// the state after the write and the value is no output; else a copy is
// written (variant 3: a view of the state made before the write and read
// after it). Ids out of range write nothing, a later duplicate wins; the
// state and the outputs match the interpreter either way.
TEST_F(Lower, SetRowsWritesTheStateInPlaceWhenNothingReadsItAfter) {
  for (int variant = 0; variant < 4; variant++) {
    fresh();
    dsc_type st = ty(DSC_F32, {6, 5});
    dsc_init init = {DSC_INIT_NORMAL, 1.0, 0.0, NULL};
    ASSERT_EQ(dsc_module_add_state(m, "s", st, init), DSC_OK);
    dsc_node *ids = input("ids", ty(DSC_I32, {5}));
    dsc_node *rows = input("rows", ty(DSC_F32, {5, 5}));
    std::vector<int64_t> flat = {30};
    dsc_node *view = variant == 3 ? op(DSC_OP_RESHAPE, {dsc_param_ref(g, "s")},
                                       {dsc_attr_ints("shape", flat.data(), 1)})
                                  : nullptr;  // a view before the write, read after it
    dsc_node *v = op(DSC_OP_SET_ROWS, {dsc_param_ref(g, "s"), ids, op(DSC_OP_MUL, {rows, rows})});
    dsc_node *a = op(DSC_OP_ASSIGN, {v}, {dsc_attr_str("name", "s")});
    std::vector<int64_t> all = {0, 1};
    std::vector<dsc_node *> outs = {
        a, op(DSC_OP_SUM, {op(DSC_OP_EXP, {v})},
              {dsc_attr_ints("axes", all.data(), 2), dsc_attr_bool("keepdims", 0)})};
    if (variant == 1) outs.push_back(op(DSC_OP_NEG, {dsc_param_ref(g, "s")}));  // read after
    if (variant == 2) outs.push_back(v);                                        // an output
    if (variant == 3) outs.push_back(op(DSC_OP_NEG, {view}));
    dsc_tensor *ti = random_tensor(ctx, ty(DSC_I32, {5}), rng, false, 0, 6);
    const double id[5] = {4, -1, 1, 6, 4};  // out of range twice; row 4 twice (the last wins)
    for (int i = 0; i < 5; i++) ti->data[i] = id[i];
    Result r = check(outs, {ti, random_tensor(ctx, ty(DSC_F32, {5, 5}), rng)});
    ASSERT_NE(r.prog, nullptr);
    int copies = 0, sets = 0;
    for (int i = 0; i < r.prog->n_instrs; i++) {
      copies += r.prog->instrs[i].kind == CG_INS_COPY;
      sets += r.prog->instrs[i].kind == CG_INS_SET_ROWS;
    }
    EXPECT_EQ(sets, 1) << "variant " << variant;
    EXPECT_EQ(copies, variant == 0 ? 0 : 1) << "variant " << variant;
    ASSERT_EQ(r.prog->n_assigns, 1);
    EXPECT_EQ(r.prog->assigns[0].in_place, variant == 0) << "variant " << variant;
  }
}

TEST_F(Lower, MatmulPlainBatchedBroadcastTransposed) {
  dsc_node *a = input("a", ty(DSC_F32, {5, 3})), *b = input("b", ty(DSC_F32, {3, 4}));
  dsc_node *ba = input("ba", ty(DSC_F32, {2, 5, 3})), *bb = input("bb", ty(DSC_F32, {2, 3, 4}));
  dsc_node *h = input("h", ty(DSC_F32, {2, 3, 2, 5, 3}));
  std::vector<int64_t> t2 = {1, 0}, t3 = {0, 2, 1};
  std::vector<dsc_node *> outs = {
      op(DSC_OP_MATMUL, {a, b}),
      op(DSC_OP_MATMUL, {ba, bb}),
      op(DSC_OP_MATMUL, {ba, b}),                                     // broadcast b over the batch
      op(DSC_OP_MATMUL, {a, bb}),                                     // broadcast a
      op(DSC_OP_MATMUL, {op(DSC_OP_PERMUTE, {b}, {dsc_attr_ints("perm", t2.data(), 2)}),
                         op(DSC_OP_PERMUTE, {a}, {dsc_attr_ints("perm", t2.data(), 2)})}),  // both transposed
      op(DSC_OP_MATMUL, {op(DSC_OP_PERMUTE, {bb}, {dsc_attr_ints("perm", t3.data(), 3)}),
                         op(DSC_OP_PERMUTE, {ba}, {dsc_attr_ints("perm", t3.data(), 3)})}),
      op(DSC_OP_MATMUL, {h, bb}),                                     // 3 batch dims, broadcast
      op(DSC_OP_MATMUL, {op(DSC_OP_EXP, {a}), op(DSC_OP_SLICE, {bb}, {dsc_attr_int("axis", 2),
                                                                       dsc_attr_int("start", 1),
                                                                       dsc_attr_int("end", 3)})}),
  };
  Result r = check(outs, {random_tensor(ctx, ty(DSC_F32, {5, 3}), rng), random_tensor(ctx, ty(DSC_F32, {3, 4}), rng),
                          random_tensor(ctx, ty(DSC_F32, {2, 5, 3}), rng), random_tensor(ctx, ty(DSC_F32, {2, 3, 4}), rng),
                          random_tensor(ctx, ty(DSC_F32, {2, 3, 2, 5, 3}), rng)});
  ASSERT_NE(r.prog, nullptr);
  int transposed = 0;  // the permuted operands became swapped strides, not copies
  for (int i = 0; i < r.prog->n_instrs; i++) {
    const cg_instr *in = &r.prog->instrs[i];
    if (in->kind == CG_INS_GEMM && in->gemm.a.row_stride == 1 && in->gemm.a.col_stride > 1) transposed++;
  }
  EXPECT_GE(transposed, 2);
}

TEST_F(Lower, CompositeOpIsReportedNotLowered) {
  dsc_node *x = input("x", ty(DSC_F32, {2, 3}));
  dsc_node *s = op(DSC_OP_SOFTMAX, {x}, {dsc_attr_int("axis", 1)});
  dsc_graph_set_outputs(g, &s, 1);
  ASSERT_EQ(pass_fuse_graph(g), DSC_OK);
  ir_arena a;
  ir_arena_init(&a, ctx);
  cg_program *p = nullptr;
  EXPECT_EQ(cg_lower_graph(g, &a, &p), DSC_ERR_USER);
  EXPECT_NE(diags(ctx).find("op softmax has no code generation; run the decompose pass"), std::string::npos)
      << diags(ctx);
  ir_arena_release(&a);
}

TEST_F(Lower, WorkArenaReusesDeadBuffers) {
  dsc_type t = ty(DSC_F32, {64, 64});
  dsc_node *x = input("x", t), *w = input("w", t);
  dsc_node *y = x;
  for (int i = 0; i < 6; i++) y = op(DSC_OP_MATMUL, {op(DSC_OP_TANH, {y}), w});
  Result r = check({y}, {random_tensor(ctx, t, rng), random_tensor(ctx, t, rng)});
  ASSERT_NE(r.prog, nullptr);
  // 2 inputs + at most 2 live temporaries at any time (tanh result, matmul result)
  EXPECT_LE(r.prog->arena_bytes[CG_ARENA_WORK], 4 * 64 * 64 * 4);
  char *text = cg_program_print(&h->arena, r.prog);
  ASSERT_NE(text, nullptr);
  EXPECT_NE(std::string(text).find("gemm"), std::string::npos);
}

// A small MLP train step through the whole pipeline (f32, AdamW).
// One value assigned to two params: only one assign may take the kernel's
// store in place, the other must still see the value (a review found p1
// never updated, and a broken kernel when the value read both params).
TEST_F(Lower, OneValueAssignedToTwoParams) {
  for (int reads_params = 0; reads_params < 2; reads_params++) {
    fresh();
    dsc_type t = ty(DSC_F32, {4, 8});
    dsc_init init = {DSC_INIT_NORMAL, 1.0, 0.0, NULL};
    ASSERT_EQ(dsc_module_add_param(m, "p1", t, init), DSC_OK);
    ASSERT_EQ(dsc_module_add_param(m, "p2", t, init), DSC_OK);
    dsc_node *x = input("x", t);
    dsc_node *v = reads_params
                      ? op(DSC_OP_ADD, {op(DSC_OP_MUL, {dsc_param_ref(g, "p1"), x}), dsc_param_ref(g, "p2")})
                      : op(DSC_OP_MUL, {x, x});
    dsc_node *a1 = op(DSC_OP_ASSIGN, {v}, {dsc_attr_str("name", "p1")});
    dsc_node *a2 = op(DSC_OP_ASSIGN, {v}, {dsc_attr_str("name", "p2")});
    check({a1, a2}, {random_tensor(ctx, t, rng)});
  }
}

TEST(LowerPipeline, TinyGptTrainStepMatchesInterpreter) {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  dsc_dim_binding dims[] = {{"B", 2}, {"T", 8}};
  dsc_frontend_options fo = {dims, 2, false};
  dsc_module *m = nullptr;
  std::string path = std::string(DSC_SOURCE_DIR) + "/examples/gpt-tiny.dsm";
  ASSERT_EQ(dsc_compile_file(ctx, path.c_str(), &fo, &m), DSC_OK) << diags(ctx);
  dsc_train_config cfg;
  ASSERT_EQ(dsc_train_config_from_module(m, &cfg), DSC_OK);
  cfg.batch = 2, cfg.seq = 8;
  // Adam's first step is lr * g / (|g| + eps): with eps = 1e-8 it is sign(g),
  // which turns the rounding noise of gradients that are exactly zero in
  // exact arithmetic (the attention key bias) into +-lr. A larger eps keeps
  // the step a smooth function of the gradient, so the comparison measures
  // the program, not that amplification.
  cfg.opt.eps = 1e-3;
  dsc_pipeline_options po = {};
  po.train = &cfg;
  po.stop_after = "fuse";
  ASSERT_EQ(dsc_run_pipeline(m, &po), DSC_OK) << diags(ctx);
  dsc_graph *g = dsc_module_find_graph(m, "train_step");
  ASSERT_NE(g, nullptr);
  std::mt19937 rng(99);
  std::vector<dsc_tensor *> in = {random_tensor(ctx, ty(DSC_I32, {2, 8}), rng, false, 0, 256),
                                  random_tensor(ctx, ty(DSC_I32, {2, 8}), rng, false, 0, 256),
                                  dsc_tensor_new(ctx, ty(DSC_F32, {}))};
  in[2]->data[0] = 1e-3;
  {
  Harness h(ctx, m);
  // Tolerance 1e-5 relative: elementwise on the loss and the grad norm;
  // norm-wise (max abs error / max abs value) on every updated param and
  // optimizer state, whose small elements come from cancelling sums.
  h.normwise_params = true;
  Result r = h.run(g, in, 1e-5, true, 5);
  EXPECT_EQ(r.lower, DSC_OK) << diags(ctx);
  EXPECT_TRUE(r.eval_ok) << r.eval_err;
  if (r.prog) {
    int launches = 0, in_place = 0;
    for (int i = 0; i < r.prog->n_instrs; i++) launches += r.prog->instrs[i].kind == CG_INS_LAUNCH;
    for (int s = 0; s < r.prog->n_assigns; s++) in_place += r.prog->assigns[s].in_place;
    int groups = 0;
    for (int i = 0; i < dsc_graph_node_count(g); i++)
      groups = std::max(groups, dsc_graph_node(g, i)->group);
    printf("tiny GPT B=2 T=8: %d groups, %d launches, %d instructions, %d/%d assigns in place, "
           "WORK %lld bytes\n",
           groups, launches, r.prog->n_instrs, in_place, r.prog->n_assigns,
           (long long)r.prog->arena_bytes[CG_ARENA_WORK]);
    EXPECT_EQ(in_place, r.prog->n_assigns);
  }
  }
  dsc_module_free(m);
  dsc_context_free(ctx);
}

}  // namespace
