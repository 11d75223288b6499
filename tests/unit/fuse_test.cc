// The fusion pass (passes/fuse.c): group structure, determinism, the text
// round trip of groups, and the AdamW update as one in-place kernel.
#include <algorithm>
#include <map>
#include <memory>
#include <set>

#include "dsc/frontend.h"
#include "dsc/train.h"
#include "lower_test_util.h"

using namespace lowertest;

namespace {

struct Fuse : ::testing::Test {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  dsc_module *m = dsc_module_new(ctx, "t");
  dsc_graph *g = dsc_graph_new(m, "g");
  std::mt19937 rng{77};
  std::unique_ptr<Harness> h;
  ~Fuse() override {
    h.reset();
    dsc_module_free(m);
    dsc_context_free(ctx);
  }
  dsc_node *op(dsc_op o, std::vector<dsc_node *> in, std::vector<dsc_attr> attrs = {}) {
    dsc_node *n = dsc_build(g, o, in.data(), (int)in.size(), attrs.data(), (int)attrs.size());
    EXPECT_NE(n, nullptr) << diags(ctx);
    return n;
  }
  dsc_node *reduce(dsc_op o, dsc_node *x, std::vector<int64_t> axes, bool keep) {
    return op(o, {x}, {dsc_attr_ints("axes", axes.data(), (int)axes.size()), dsc_attr_bool("keepdims", keep)});
  }
  void fuse(std::vector<dsc_node *> outs) {
    ASSERT_EQ(dsc_graph_set_outputs(g, outs.data(), (int)outs.size()), DSC_OK);
    ASSERT_EQ(pass_fuse_graph(g), DSC_OK) << diags(ctx);
    ASSERT_EQ(dsc_module_verify(m), DSC_OK) << diags(ctx);
  }
  Result lower_and_check(std::vector<dsc_tensor *> in) {
    h.reset(new Harness(ctx, m));
    Result r = h->run(g, in, 1e-5);
    EXPECT_EQ(r.lower, DSC_OK) << diags(ctx);
    EXPECT_TRUE(r.eval_ok) << r.eval_err;
    return r;
  }
  int groups() {
    std::set<int> s;
    for (int i = 0; i < g->n_nodes; i++)
      if (g->nodes[i]->group) s.insert(g->nodes[i]->group);
    return (int)s.size();
  }
  // Lowers a graph of inputs t [V, D], i1 i32[3], i2 i32[4] against the
  // interpreter, with indices in range.
  void lower_gathers(int64_t V, int64_t D);
  const kir_kernel *only_kernel(const Result &r) {
    EXPECT_NE(r.prog, nullptr);
    if (!r.prog) return nullptr;
    EXPECT_EQ(r.prog->n_kernels, 1);
    return r.prog->n_kernels ? r.prog->kernels[0] : nullptr;
  }
};

TEST_F(Fuse, SoftmaxByHandIsOneKernelOfThreeStages) {
  dsc_type t = ty(DSC_F32, {6, 10});
  dsc_node *x = dsc_graph_input(g, "x", t);
  dsc_node *mx = reduce(DSC_OP_MAX, x, {1}, true);
  dsc_node *e = op(DSC_OP_EXP, {op(DSC_OP_SUB, {x, mx})});
  dsc_node *s = reduce(DSC_OP_SUM, e, {1}, true);
  dsc_node *y = op(DSC_OP_DIV, {e, s});
  fuse({y});
  EXPECT_EQ(groups(), 1);
  for (dsc_node *n : {mx, e, s, y}) EXPECT_EQ(n->group, 1);
  Result r = lower_and_check({random_tensor(ctx, t, rng)});
  const kir_kernel *k = only_kernel(r);
  ASSERT_NE(k, nullptr);
  ASSERT_EQ(k->n_stages, 3);
  EXPECT_EQ(k->stages[0].kind, KIR_STAGE_REDUCE);
  EXPECT_EQ(k->stages[0].reduce, KIR_REDUCE_MAX);
  EXPECT_EQ(k->stages[1].kind, KIR_STAGE_REDUCE);
  EXPECT_EQ(k->stages[1].reduce, KIR_REDUCE_SUM);
  EXPECT_EQ(k->stages[2].kind, KIR_STAGE_STORE);
  EXPECT_EQ(k->n_outer, 1);
  EXPECT_EQ(k->rank, 2);
}

TEST_F(Fuse, LayernormForwardIsOneKernel) {
  dsc_type t = ty(DSC_F32, {4, 16});
  dsc_node *x = dsc_graph_input(g, "x", t), *w = dsc_graph_input(g, "w", ty(DSC_F32, {16}));
  dsc_node *mu = reduce(DSC_OP_MEAN, x, {1}, true);
  dsc_node *xc = op(DSC_OP_SUB, {x, mu});
  dsc_node *var = reduce(DSC_OP_MEAN, op(DSC_OP_MUL, {xc, xc}), {1}, true);
  dsc_node *rs = op(DSC_OP_RSQRT, {op(DSC_OP_ADD, {var, dsc_const(g, 1e-5, ty(DSC_F32, {}))})});
  dsc_node *y = op(DSC_OP_MUL, {op(DSC_OP_MUL, {xc, rs}), w});
  fuse({y});
  EXPECT_EQ(groups(), 1);
  Result r = lower_and_check({random_tensor(ctx, t, rng), random_tensor(ctx, ty(DSC_F32, {16}), rng)});
  const kir_kernel *k = only_kernel(r);
  ASSERT_NE(k, nullptr);
  // REDUCE mean, REDUCE var, LET rsqrt, STORE
  ASSERT_EQ(k->n_stages, 4);
  EXPECT_EQ(k->stages[2].kind, KIR_STAGE_LET);
}

TEST_F(Fuse, ElementwiseChainIsOneGroup) {
  dsc_type t = ty(DSC_F32, {3, 7});
  dsc_node *x = dsc_graph_input(g, "x", t), *b = dsc_graph_input(g, "b", ty(DSC_F32, {7}));
  dsc_node *y = op(DSC_OP_TANH, {op(DSC_OP_MUL, {op(DSC_OP_ADD, {x, b}), x})});
  y = op(DSC_OP_GELU, {op(DSC_OP_SUB, {y, dsc_const(g, 0.5, ty(DSC_F32, {}))})});
  fuse({y});
  EXPECT_EQ(groups(), 1);
  Result r = lower_and_check({random_tensor(ctx, t, rng), random_tensor(ctx, ty(DSC_F32, {7}), rng)});
  const kir_kernel *k = only_kernel(r);
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(k->n_stages, 1);  // intermediates recomputed, never stored
}

TEST_F(Fuse, MatmulSplitsGroups) {
  dsc_node *x = dsc_graph_input(g, "x", ty(DSC_F32, {4, 5})), *w = dsc_graph_input(g, "w", ty(DSC_F32, {5, 3}));
  dsc_node *a = op(DSC_OP_EXP, {x});
  dsc_node *mm = op(DSC_OP_MATMUL, {a, w});
  dsc_node *z = op(DSC_OP_TANH, {mm});
  dsc_node *u = op(DSC_OP_ADD, {z, dsc_const(g, 1, ty(DSC_F32, {}))});
  fuse({u});
  EXPECT_EQ(groups(), 2);
  EXPECT_EQ(mm->group, 0);
  EXPECT_NE(a->group, z->group);
  EXPECT_EQ(z->group, u->group);
  // nodes of a group are contiguous and the graph order stays topological
  for (int i = 0; i < g->n_nodes; i++) {
    EXPECT_EQ(g->nodes[i]->id, i);
    for (int j = 0; j < g->nodes[i]->n_in; j++) EXPECT_LT(g->nodes[i]->in[j]->id, i);
  }
  lower_and_check({random_tensor(ctx, ty(DSC_F32, {4, 5}), rng), random_tensor(ctx, ty(DSC_F32, {5, 3}), rng)});
}

TEST_F(Fuse, BiasGradReductionIsItsOwnGroup) {
  dsc_type t = ty(DSC_F32, {2, 3, 8});
  dsc_node *x = dsc_graph_input(g, "x", t), *y = dsc_graph_input(g, "y", t);
  dsc_node *p = op(DSC_OP_MUL, {x, y});
  dsc_node *s = reduce(DSC_OP_SUM, p, {0, 1}, false);
  dsc_node *q = op(DSC_OP_NEG, {s});
  fuse({q, p});
  EXPECT_NE(s->group, 0);
  EXPECT_NE(s->group, p->group);
  EXPECT_NE(s->group, q->group);
  Result r = lower_and_check({random_tensor(ctx, t, rng), random_tensor(ctx, t, rng)});
  ASSERT_NE(r.prog, nullptr);
  bool found = false;  // outer = kept dims [8], inner = reduced dims [2, 3]
  for (int i = 0; i < r.prog->n_kernels; i++) {
    const kir_kernel *k = r.prog->kernels[i];
    if (k->n_stages >= 1 && k->stages[0].kind == KIR_STAGE_REDUCE) {
      found = true;
      EXPECT_EQ(k->n_outer, 1);
      EXPECT_EQ(k->dims[0], 8);
      EXPECT_EQ(k->rank, 3);
    }
  }
  EXPECT_TRUE(found);
}

TEST_F(Fuse, ScalarSumOfSquaresHasNoOuterDims) {
  dsc_type t = ty(DSC_F32, {5, 6});
  dsc_node *x = dsc_graph_input(g, "x", t);
  dsc_node *s = op(DSC_OP_SQRT, {reduce(DSC_OP_SUM, op(DSC_OP_MUL, {x, x}), {0, 1}, false)});
  fuse({s});
  EXPECT_EQ(groups(), 1);
  const kir_kernel *k = only_kernel(lower_and_check({random_tensor(ctx, t, rng)}));
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(k->n_outer, 0);
}

// A group with only scalar results (a gradient's sum of squares for
// clipping) runs as soon as its input is ready, right after the matmul that
// produced it, not where it was built (after more work); other groups keep
// their order. Results still match the interpreter.
TEST_F(Fuse, ScalarResultGroupRunsRightAfterItsInput) {
  dsc_type t = ty(DSC_F32, {8, 8});
  dsc_node *x = dsc_graph_input(g, "x", t), *w = dsc_graph_input(g, "w", t);
  dsc_node *grad = op(DSC_OP_MATMUL, {x, w});
  dsc_node *y = grad;
  for (int i = 0; i < 3; i++) y = op(DSC_OP_MATMUL, {op(DSC_OP_TANH, {y}), w});  // later work
  std::vector<int64_t> perm = {1, 0};
  dsc_node *gt = op(DSC_OP_PERMUTE, {grad}, {dsc_attr_ints("perm", perm.data(), 2)});  // a view, built late
  dsc_node *norm = reduce(DSC_OP_SUM, op(DSC_OP_MUL, {gt, gt}), {0, 1}, false);
  dsc_node *upd = op(DSC_OP_MUL, {grad, op(DSC_OP_BROADCAST, {norm}, {dsc_attr_ints("shape", t.dims, 2)})});
  fuse({y, upd});
  auto pos = [&](const dsc_node *n) { return n->id; };
  EXPECT_EQ(pos(norm), pos(grad) + 3) << "grad, permute, mul, sum";
  EXPECT_LT(pos(norm), pos(y));
  EXPECT_GT(pos(upd), pos(y)) << "a group with a tensor result keeps its place";
  lower_and_check({random_tensor(ctx, t, rng), random_tensor(ctx, t, rng)});
}

// ZenFlow's table columns scattered back: a gather of rows read only
// through a permute. Stored, the reader would take each element from
// another row of it; so it stays out of groups and the reader's kernel
// recomputes it at its own point: one kernel, no [D, V] buffer.
TEST_F(Fuse, AGatherReadOnlyTransposedIsRecomputedInItsReadersKernel) {
  const int64_t k = 4, V = 10, D = 6;
  dsc_node *xn = dsc_graph_input(g, "xn", ty(DSC_F32, {k, V}));
  dsc_node *pos = dsc_graph_input(g, "pos", ty(DSC_I32, {D}));
  dsc_node *keep = dsc_graph_input(g, "keep", ty(DSC_BOOL, {1, D}));
  dsc_node *old = dsc_graph_input(g, "old", ty(DSC_F32, {V, D}));
  dsc_node *back = op(DSC_OP_EMBEDDING, {xn, pos});  // [D, V]
  int64_t perm[2] = {1, 0};
  dsc_node *t = dsc_permute(g, back, perm, 2);
  dsc_node *res = op(DSC_OP_WHERE, {keep, t, old});
  fuse({res});
  EXPECT_EQ(back->group, 0);
  EXPECT_EQ(t->group, 0);
  EXPECT_NE(res->group, 0);
  dsc_tensor *p = dsc_tensor_new(ctx, ty(DSC_I32, {D})), *c = dsc_tensor_new(ctx, ty(DSC_BOOL, {1, D}));
  for (int64_t d = 0; d < D; d++) p->data[d] = (double)((d * 3) % k), c->data[d] = d % 2;
  Result r = lower_and_check({random_tensor(ctx, ty(DSC_F32, {k, V}), rng), p, c,
                              random_tensor(ctx, ty(DSC_F32, {V, D}), rng)});
  ASSERT_NE(r.prog, nullptr);
  EXPECT_EQ(r.prog->n_kernels, 1);  // the where's, gathering as it goes
  for (int b = 0; b < r.prog->n_buffers; b++)
    EXPECT_FALSE(r.prog->buffers[b].kind == CG_BUF_TEMP && r.prog->buffers[b].first_use >= 0 &&
                 r.prog->buffers[b].numel == D * V && r.prog->outputs[0].buffer != b)
        << "buffer " << b << " holds the gather";
}

// A recomputed gather read through a permute as another gather's table:
// a table is a buffer, so the lowering materializes the inner gather
// before the outer kernel; the values are the interpreter's.
TEST_F(Fuse, ARecomputedGatherReadAsAnotherGathersTableIsMaterialized) {
  const int64_t V = 5, D = 7;
  dsc_node *t = dsc_graph_input(g, "t", ty(DSC_F32, {V, D}));
  dsc_node *i1 = dsc_graph_input(g, "i1", ty(DSC_I32, {3}));
  dsc_node *i2 = dsc_graph_input(g, "i2", ty(DSC_I32, {4}));
  dsc_node *inner = op(DSC_OP_EMBEDDING, {t, i1});  // [3, D]
  int64_t perm[2] = {1, 0};
  dsc_node *outer = op(DSC_OP_EMBEDDING, {dsc_permute(g, inner, perm, 2), i2});  // [4, 3]
  fuse({op(DSC_OP_EXP, {outer})});
  EXPECT_EQ(inner->group, 0);
  lower_gathers(V, D);
}

// The same with the outer gather read only through a permute too: it is
// not recomputed (its table would be materialized while its reader's
// kernel is being built), so it is stored.
TEST_F(Fuse, AGatherOfARecomputedGatherIsStored) {
  const int64_t V = 5, D = 7;
  dsc_node *t = dsc_graph_input(g, "t", ty(DSC_F32, {V, D}));
  dsc_node *i1 = dsc_graph_input(g, "i1", ty(DSC_I32, {3}));
  dsc_node *i2 = dsc_graph_input(g, "i2", ty(DSC_I32, {4}));
  dsc_node *inner = op(DSC_OP_EMBEDDING, {t, i1});  // [3, D]
  int64_t perm[2] = {1, 0};
  dsc_node *outer = op(DSC_OP_EMBEDDING, {dsc_permute(g, inner, perm, 2), i2});  // [4, 3]
  fuse({op(DSC_OP_EXP, {dsc_permute(g, outer, perm, 2)})});
  EXPECT_EQ(inner->group, 0);
  EXPECT_NE(outer->group, 0);
  lower_gathers(V, D);
}

void Fuse::lower_gathers(int64_t V, int64_t D) {
  dsc_tensor *a = dsc_tensor_new(ctx, ty(DSC_I32, {3})), *b = dsc_tensor_new(ctx, ty(DSC_I32, {4}));
  for (int i = 0; i < 3; i++) a->data[i] = (double)((i * 2) % V);
  for (int i = 0; i < 4; i++) b->data[i] = (double)((i * 3) % D);
  lower_and_check({random_tensor(ctx, ty(DSC_F32, {V, D}), rng), a, b});
}

TEST_F(Fuse, IsDeterministicAndRoundTripsThroughText) {
  dsc_type t = ty(DSC_F32, {4, 8});
  dsc_node *x = dsc_graph_input(g, "x", t), *w = dsc_graph_input(g, "w", ty(DSC_F32, {8, 8}));
  dsc_node *mx = reduce(DSC_OP_MAX, x, {1}, true);
  dsc_node *e = op(DSC_OP_EXP, {op(DSC_OP_SUB, {x, mx})});
  dsc_node *y = op(DSC_OP_DIV, {e, reduce(DSC_OP_SUM, e, {1}, true)});
  dsc_node *z = op(DSC_OP_RELU, {op(DSC_OP_MATMUL, {y, w})});
  fuse({z});
  char *a = dsc_module_print_string(m);
  ASSERT_NE(a, nullptr);
  EXPECT_NE(std::string(a).find(" group 2"), std::string::npos) << a;
  ASSERT_EQ(pass_fuse_graph(g), DSC_OK);  // again: same result
  char *b = dsc_module_print_string(m);
  EXPECT_STREQ(a, b);
  dsc_module *m2 = nullptr;
  ASSERT_EQ(dsc_module_parse(ctx, a, strlen(a), "fused.dsir", &m2), DSC_OK) << diags(ctx);
  char *c = dsc_module_print_string(m2);
  EXPECT_STREQ(a, c);
  dsc_string_free(ctx, a), dsc_string_free(ctx, b), dsc_string_free(ctx, c);
  dsc_module_free(m2);
}

TEST_F(Fuse, BadGroupNumberIsAParseError) {
  const char *text = "module t\n\ngraph g(%x: f32[2]) {\n  %0 = exp(%x) : f32[2] group 0\n  return %0\n}\n";
  dsc_module *m2 = nullptr;
  EXPECT_NE(dsc_module_parse(ctx, text, strlen(text), "bad.dsir", &m2), DSC_OK);
  EXPECT_NE(diags(ctx).find("group number"), std::string::npos) << diags(ctx);
  dsc_module_free(m2);
}

// The AdamW update of the tiny GPT's largest param (wte, [256, 64]) is one
// group: it stores the new param and both moments, and the program writes
// all three in place into the STATE arena.
// The AdamW update of gpt-tiny's largest param as one kernel writing its
// states in place: p, m, v in f32; with bf16 master weights also the f32
// master and the param's bf16 rounding (a cast inside the update's group:
// once fused apart, the rounding read the whole master back), and the bf16
// gradients of the matmul weights are converted by their readers (the norm
// and the update), never stored as f32 copies.
void adamw_update_is_one_in_place_kernel(const char *precision) {
  SCOPED_TRACE(precision);
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  dsc_dim_binding dims[] = {{"B", 1}, {"T", 4}};
  dsc_frontend_options fo = {dims, 2, false};
  dsc_module *m = nullptr;
  std::string path = std::string(DSC_SOURCE_DIR) + "/examples/gpt-tiny.dsm";
  ASSERT_EQ(dsc_compile_file(ctx, path.c_str(), &fo, &m), DSC_OK) << diags(ctx);
  dsc_train_config cfg;
  ASSERT_EQ(dsc_train_config_from_module(m, &cfg), DSC_OK);
  cfg.batch = 1, cfg.seq = 4;
  ASSERT_EQ(dsc_precision_from_name(precision, &cfg.precision), 0);
  bool bf16 = cfg.precision == DSC_PRECISION_BF16;
  dsc_pipeline_options po = {};
  po.train = &cfg;
  ASSERT_EQ(dsc_run_pipeline(m, &po), DSC_OK) << diags(ctx);
  dsc_graph *g = dsc_module_find_graph(m, "train_step");
  ASSERT_NE(g, nullptr);
  int largest = 0;
  for (int i = 0; i < dsc_module_param_count(m); i++) {
    dsc_type t = dsc_module_param_type(m, i), best = dsc_module_param_type(m, largest);
    if (!dsc_module_param_is_state(m, i) && dsc_type_numel(&t) > dsc_type_numel(&best)) largest = i;
  }
  std::string name = dsc_module_param_name(m, largest);
  std::set<std::string> targets = {name, "opt.m." + name, "opt.v." + name};
  if (bf16) targets.insert("opt.master." + name);
  const int n_targets = (int)targets.size();
  std::set<int> grp;
  int matmul_casts = 0;
  for (int i = 0; i < g->n_nodes; i++) {
    const dsc_node *n = g->nodes[i];
    if (n->op == DSC_OP_ASSIGN && targets.count(ir_attr_str(n, "name"))) grp.insert(n->in[0]->group);
    if (n->op != DSC_OP_CAST || n->type.dtype != DSC_F32) continue;
    const dsc_node *src = n->in[0];
    bool tied =
        src->op == DSC_OP_ADD && src->n_in == 2 &&
        (src->in[0]->op == DSC_OP_EMBEDDING_GRAD || src->in[1]->op == DSC_OP_EMBEDDING_GRAD);
    if (src->op == DSC_OP_MATMUL || tied) {
      matmul_casts++;
      EXPECT_EQ(n->group, 0) << "the f32 reading of a bf16 matmul result at node " << i
                             << " is stored by a kernel";
    }
  }
  EXPECT_EQ(matmul_casts > 0, bf16);
  ASSERT_EQ(grp.size(), 1u) << name;
  EXPECT_NE(*grp.begin(), 0);
  ir_arena a;
  ir_arena_init(&a, ctx);
  cg_program *p = nullptr;
  ASSERT_EQ(cg_lower_graph(g, &a, &p), DSC_OK) << diags(ctx);
  int kernel_instr = -1, n_in_place = 0;
  for (int s = 0; s < p->n_assigns; s++) {
    if (!targets.count(dsc_module_param_name(m, p->assigns[s].param))) continue;
    EXPECT_TRUE(p->assigns[s].in_place) << dsc_module_param_name(m, p->assigns[s].param);
    n_in_place += p->assigns[s].in_place;
  }
  EXPECT_EQ(n_in_place, n_targets);
  for (int i = 0; i < p->n_instrs; i++) {
    const cg_instr *in = &p->instrs[i];
    if (in->kind != CG_INS_LAUNCH) continue;
    int written = 0;
    for (int j = 0; j < in->n_args; j++) {
      const cg_buffer *b = &p->buffers[in->args[j]];
      if (b->kind == CG_BUF_PARAM && targets.count(dsc_module_param_name(m, b->index)) &&
          p->kernels[in->kernel]->args[j].written)
        written++;
    }
    if (written) {
      EXPECT_EQ(written, n_targets);
      EXPECT_EQ(kernel_instr, -1) << "two kernels write the update";
      kernel_instr = i;
      const kir_kernel *k = p->kernels[in->kernel];
      int stores = 0;
      for (int s = 0; s < k->n_stages; s++) stores += k->stages[s].kind == KIR_STAGE_STORE;
      EXPECT_EQ(stores, n_targets);
    }
  }
  EXPECT_GE(kernel_instr, 0);
  ir_arena_release(&a);
  dsc_module_free(m);
  dsc_context_free(ctx);
}

TEST(FusePipeline, AdamwUpdateOfLargestParamIsOneInPlaceKernel) {
  adamw_update_is_one_in_place_kernel("f32");
  adamw_update_is_one_in_place_kernel("bf16");
}

// A cast inside an elementwise chain joins its group (a kernel's members
// may differ in dtype; the domain is their common shape), and a cast of a
// stored buffer (here an input; in training a matmul's bf16 result) read by
// two kernels is converted by each of them, never stored as an f32 copy.
TEST_F(Fuse, CastsJoinTheirChainAndABufferCastIsRecomputed) {
  dsc_type t = ty(DSC_F32, {6, 8}), tb = ty(DSC_BF16, {6, 8});
  dsc_node *x = dsc_graph_input(g, "x", t), *xb = dsc_graph_input(g, "xb", tb);
  dsc_node *y = op(DSC_OP_MUL, {op(DSC_OP_ADD, {x, x}), x});  // 2x^2: one rounding
  dsc_node *yl = dsc_cast(g, y, DSC_BF16);
  dsc_node *up = dsc_cast(g, xb, DSC_F32);
  dsc_node *s = reduce(DSC_OP_SUM, op(DSC_OP_MUL, {up, up}), {1}, true);  // a norm's rows
  dsc_node *z = op(DSC_OP_TANH, {op(DSC_OP_SUB, {up, x})});               // another reader
  fuse({yl, s, z});
  EXPECT_NE(y->group, 0);
  EXPECT_EQ(yl->group, y->group);
  EXPECT_EQ(up->group, 0);
  EXPECT_NE(s->group, 0);
  EXPECT_NE(z->group, 0);
  EXPECT_NE(s->group, z->group);
  dsc_tensor *xbv = random_tensor(ctx, tb, rng);
  for (int64_t i = 0; i < 48; i++) xbv->data[i] = ir_bf16_value(ir_bf16_bits(xbv->data[i]));
  Result r = lower_and_check({random_tensor(ctx, t, rng), xbv});
  ASSERT_NE(r.prog, nullptr);
  for (int b = 0; b < r.prog->n_buffers; b++)  // no f32 copy of xb
    EXPECT_FALSE(r.prog->buffers[b].kind == CG_BUF_TEMP && r.prog->buffers[b].dtype == DSC_F32 &&
                 r.prog->buffers[b].numel == 48 && r.prog->buffers[b].first_use >= 0 &&
                 r.prog->outputs[2].buffer != b)
        << "buffer " << b << " holds the f32 copy";
}

}  // namespace
