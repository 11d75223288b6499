// Kernel IR: construction, validation, printing, hashing and the reference
// evaluator (codegen/kir.c, codegen/kir_eval.c).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

extern "C" {
#include "codegen/codegen.h"
}

namespace {

struct Arena {
  dsc_context *ctx = dsc_context_new(nullptr, nullptr);
  ir_arena a;
  Arena() { ir_arena_init(&a, ctx); }
  ~Arena() {
    ir_arena_release(&a);
    dsc_context_free(ctx);
  }
};

kir_access acc(int arg, int64_t offset, std::initializer_list<int64_t> strides) {
  kir_access x;
  memset(&x, 0, sizeof x);
  x.arg = arg;
  x.offset = offset;
  int d = 0;
  for (int64_t s : strides) x.stride[d++] = s;
  return x;
}

// softmax over the last dim of x[R, C] into y: max, sum of exp, store.
struct Softmax {
  kir_arg args[2];
  dsc_dtype slots[2] = {DSC_F32, DSC_F32};
  kir_stage stages[3];
  kir_kernel k;
  Softmax(ir_arena *a, int64_t R, int64_t C, dsc_dtype out = DSC_F32) {
    args[0] = {DSC_F32, R * C, true, false};
    args[1] = {out, R * C, false, true};
    kir_expr *x = kir_load(a, DSC_F32, acc(0, 0, {C, 1}));
    kir_expr *e = kir_un(a, KIR_EXP, kir_bin(a, KIR_SUB, x, kir_scalar(a, DSC_F32, 0)));
    memset(stages, 0, sizeof stages);
    stages[0].kind = KIR_STAGE_REDUCE;
    stages[0].reduce = KIR_REDUCE_MAX;
    stages[0].slot = 0;
    stages[0].expr = x;
    stages[1].kind = KIR_STAGE_REDUCE;
    stages[1].reduce = KIR_REDUCE_SUM;
    stages[1].slot = 1;
    stages[1].expr = e;
    stages[2].kind = KIR_STAGE_STORE;
    stages[2].over_inner = true;
    stages[2].dst = acc(1, 0, {C, 1});
    stages[2].expr = kir_bin(a, KIR_DIV, e, kir_scalar(a, DSC_F32, 1));
    memset(&k, 0, sizeof k);
    k.name = "softmax";
    k.rank = 2;
    k.n_outer = 1;
    k.dims[0] = R;
    k.dims[1] = C;
    k.n_args = 2;
    k.args = args;
    k.n_slots = 2;
    k.slot_types = slots;
    k.n_stages = 3;
    k.stages = stages;
  }
};

TEST(Kir, SoftmaxKernelValidatesPrintsAndEvaluates) {
  Arena A;
  const int64_t R = 5, C = 37;
  Softmax s(&A.a, R, C);
  char err[256] = "";
  ASSERT_TRUE(kir_validate(&s.k, err, sizeof err)) << err;
  const char *text = kir_print(&A.a, &s.k);
  ASSERT_NE(text, nullptr);
  EXPECT_NE(strstr(text, "reduce max"), nullptr) << text;
  EXPECT_NE(strstr(text, "store over inner a1[0 + 37*i0 + 1*i1]"), nullptr) << text;
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0, 3);
  std::vector<float> x(R * C), y(R * C);
  for (auto &v : x) v = nd(rng);
  void *args[2] = {x.data(), y.data()};
  ASSERT_TRUE(kir_eval(&s.k, args));
  for (int64_t r = 0; r < R; r++) {
    double m = -INFINITY, sum = 0;
    for (int64_t c = 0; c < C; c++) m = std::max(m, (double)x[r * C + c]);
    for (int64_t c = 0; c < C; c++) sum += std::exp((double)x[r * C + c] - m);
    for (int64_t c = 0; c < C; c++) {
      double want = std::exp((double)x[r * C + c] - m) / sum;
      EXPECT_NEAR(y[r * C + c], want, 1e-6 * want + 1e-9);  // f32 per-op rounding
    }
  }
}

TEST(Kir, ValidateRejectsOutOfBoundsAndUseBeforeDefinition) {
  Arena A;
  char err[256];
  Softmax s(&A.a, 4, 8);
  s.args[1].numel = 31;  // one element short
  EXPECT_FALSE(kir_validate(&s.k, err, sizeof err));
  EXPECT_NE(strstr(err, "outside its 31 elements"), nullptr) << err;
  Softmax t(&A.a, 4, 8);
  std::swap(t.stages[0], t.stages[1]);  // sum of exp(x - s0) before s0 exists
  EXPECT_FALSE(kir_validate(&t.k, err, sizeof err));
  EXPECT_NE(strstr(err, "slot 0 used before it is computed"), nullptr) << err;
  Softmax u(&A.a, 4, 8);
  u.stages[2].over_inner = false;  // a once-per-row store cannot move with the column
  EXPECT_FALSE(kir_validate(&u.k, err, sizeof err));
  EXPECT_NE(strstr(err, "moves with inner dim 1"), nullptr) << err;
}

TEST(Kir, HashIsStableAndSensitive) {
  Arena A;
  Softmax s1(&A.a, 4, 8), s2(&A.a, 4, 8), s3(&A.a, 4, 9);
  EXPECT_EQ(kir_hash(&s1.k), kir_hash(&s2.k));
  EXPECT_NE(kir_hash(&s1.k), kir_hash(&s3.k));
  s2.stages[1].reduce = KIR_REDUCE_MAX;
  EXPECT_NE(kir_hash(&s1.k), kir_hash(&s2.k));
}

TEST(Kir, GatherOutOfRangeSetsStatusAndSkipsTheStore) {
  Arena A;
  // y[i, j] = table[ids[i], j] with table [3, 4]
  int32_t ids[3] = {2, 0, 3};
  float table[12], y[12];
  for (int i = 0; i < 12; i++) table[i] = (float)i + 0.5f, y[i] = -1;
  kir_arg args[3] = {{DSC_I32, 3, true, false}, {DSC_F32, 12, true, false},
                     {DSC_F32, 12, false, true}};
  kir_access g = acc(1, 0, {0, 1});
  g.gather = kir_load(&A.a, DSC_I32, acc(0, 0, {1, 0}));
  g.gather_stride = 4;
  g.gather_bound = 3;
  kir_stage st;
  memset(&st, 0, sizeof st);
  st.kind = KIR_STAGE_STORE;
  st.over_inner = true;
  st.dst = acc(2, 0, {4, 1});
  st.expr = kir_load(&A.a, DSC_F32, g);
  kir_kernel k;
  memset(&k, 0, sizeof k);
  k.name = "gather";
  k.rank = 2;
  k.n_outer = 1;
  k.dims[0] = 3;
  k.dims[1] = 4;
  k.n_args = 3;
  k.args = args;
  k.n_stages = 1;
  k.stages = &st;
  char err[256] = "";
  ASSERT_TRUE(kir_validate(&k, err, sizeof err)) << err;
  void *ptrs[3] = {ids, table, y};
  EXPECT_FALSE(kir_eval(&k, ptrs));  // id 3 is out of range
  EXPECT_EQ(y[0], 8.5f);
  EXPECT_EQ(y[4], 0.5f);
  EXPECT_EQ(y[8], 0.0f);  // out of range loads 0 (stored: the store's own access is in range)
  ids[2] = 1;
  EXPECT_TRUE(kir_eval(&k, ptrs));
  EXPECT_EQ(y[8], 4.5f);
}

TEST(Kir, HalfConversionsRoundToNearestEven) {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0, 100);
  for (int i = 0; i < 10000; i++) {
    float x = nd(rng) * (i % 7 == 0 ? 1e-6f : 1.0f);
    // Storing through cg_store_elem and loading back gives the interpreter's rounding.
    uint16_t h;
    cg_store_elem(DSC_BF16, &h, x);
    EXPECT_EQ(cg_load_elem(DSC_BF16, &h), (double)ir_bf16_round(x)) << x;
    cg_store_elem(DSC_F16, &h, x);
    EXPECT_EQ(cg_load_elem(DSC_F16, &h), (double)ir_f16_round(x)) << x;
  }
  EXPECT_TRUE(std::isinf(ir_f16_value(ir_f16_bits(70000.0))));
  EXPECT_TRUE(std::isnan(ir_bf16_value(ir_bf16_bits(NAN))));
  EXPECT_EQ(ir_f16_value(ir_f16_bits(-0.0)), 0.0);
}

}  // namespace
