// Shared by fuse_test.cc and lower_test.cc: runs a fused graph both through
// the interpreter and through cg_lower_graph + cg_program_eval, and compares.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "codegen/codegen.h"
#include "dsc/interp.h"
#include "passes/passes.h"
#include "tests/unit/test_util.h"

namespace lowertest {

inline double load_el(const void *base, dsc_dtype t, int64_t i) {
  switch (t) {
    case DSC_F32: return ((const float *)base)[i];
    case DSC_F64: return ((const double *)base)[i];
    case DSC_BF16:
      return ir_bf16_value(((const uint16_t *)base)[i]);
    case DSC_I32: return ((const int32_t *)base)[i];
    case DSC_I64: return (double)((const int64_t *)base)[i];
    case DSC_BOOL: return ((const uint8_t *)base)[i] != 0;
    default: ADD_FAILURE() << "dtype not supported by the test helper"; return 0;
  }
}

inline void store_el(void *base, dsc_dtype t, int64_t i, double v) {
  switch (t) {
    case DSC_F32: ((float *)base)[i] = (float)v; break;
    case DSC_F64: ((double *)base)[i] = v; break;
    case DSC_BF16:
      ((uint16_t *)base)[i] = ir_bf16_bits(v);
      break;
    case DSC_I32: ((int32_t *)base)[i] = (int32_t)v; break;
    case DSC_I64: ((int64_t *)base)[i] = (int64_t)v; break;
    case DSC_BOOL: ((uint8_t *)base)[i] = v != 0; break;
    default: ADD_FAILURE() << "dtype not supported by the test helper"; break;
  }
}

// Random tensor, never zero: floats uniform in +-[0.1, 1] (positive when
// `positive`), integers uniform in [lo, hi).
inline dsc_tensor *random_tensor(dsc_context *ctx, dsc_type t, std::mt19937 &rng, bool positive = false,
                                 int64_t lo = 0, int64_t hi = 4) {
  dsc_tensor *x = dsc_tensor_new(ctx, t);
  int64_t n = dsc_type_numel(&t);
  std::uniform_real_distribution<double> u(0.1, 1.0);
  std::uniform_int_distribution<int64_t> ui(lo, hi - 1);
  for (int64_t i = 0; i < n; i++) {
    double v;
    if (dsc_dtype_is_float(t.dtype))
      v = (float)(positive || (rng() & 1) ? u(rng) : -u(rng));
    else if (t.dtype == DSC_BOOL)
      v = (double)(rng() & 1);
    else
      v = (double)ui(rng);
    x->data[i] = v;
  }
  return x;
}

// |got - want| <= tol * max(|want|, floor): relative error with a floor for
// values near zero (floor = 1e-3 of the tensor's largest magnitude).
// With normwise: max |got - want| <= tol * max |want| over the tensor.
inline void expect_close(const std::vector<double> &got, const dsc_tensor *want, double tol,
                         const std::string &what, bool normwise = false) {
  int64_t n = dsc_type_numel(&want->type);
  ASSERT_EQ((int64_t)got.size(), n) << what;
  double scale = 0;
  for (int64_t i = 0; i < n; i++) scale = std::fmax(scale, std::fabs(want->data[i]));
  if (normwise) {
    double worst = 0;
    int64_t at = 0;
    for (int64_t i = 0; i < n; i++)
      if (std::fabs(got[i] - want->data[i]) > worst) worst = std::fabs(got[i] - want->data[i]), at = i;
    EXPECT_LE(worst, tol * scale) << what << ": worst element " << at << " program " << got[at]
                                  << " interpreter " << want->data[at] << " (max " << scale << ")";
    return;
  }
  int bad = 0;
  for (int64_t i = 0; i < n && bad < 5; i++) {
    double w = want->data[i], g = got[i];
    double den = std::fmax(std::fabs(w), 1e-3 * scale);
    if (std::isinf(w) && g == w) continue;
    if (!(std::fabs(g - w) <= tol * den) && !(w == 0 && g == 0)) {
      ADD_FAILURE() << what << " element " << i << ": program " << g << " interpreter " << w;
      bad++;
    }
  }
}

struct Result {
  dsc_status lower = DSC_ERR_INTERNAL;
  bool eval_ok = false;
  std::string eval_err;
  cg_program *prog = nullptr;
};

// Lowers g (already fused), runs program and interpreter on the same
// inputs and params (seeded), and compares outputs and params (tolerance
// tol, relative). Inputs are consumed (freed).
class Harness {
 public:
  dsc_context *ctx;
  dsc_module *m;
  ir_arena arena;
  Harness(dsc_context *c, dsc_module *mod) : ctx(c), m(mod) { ir_arena_init(&arena, c); }
  ~Harness() { ir_arena_release(&arena); }

  bool normwise_params = false;  // compare params and states norm-wise
  Result run(dsc_graph *g, std::vector<dsc_tensor *> inputs, double tol, bool compare = true,
             uint64_t seed = 7) {
    Result r;
    r.lower = cg_lower_graph(g, &arena, &r.prog);
    if (r.lower != DSC_OK) {
      for (auto *t : inputs) dsc_tensor_free(ctx, t);
      return r;
    }
    cg_program *p = r.prog;
    dsc_params *pi = dsc_params_init(m, seed), *pp = dsc_params_init(m, seed);
    std::vector<unsigned char> state((size_t)p->arena_bytes[CG_ARENA_STATE] + 64),
        work((size_t)p->arena_bytes[CG_ARENA_WORK] + 64);
    // garbage in WORK: a program must not read what it did not write
    for (size_t i = 0; i < work.size(); i++) work[i] = (unsigned char)(i * 131 + 7);
    for (int b = 0; b < p->n_buffers; b++) {
      const cg_buffer *x = &p->buffers[b];
      if (x->kind == CG_BUF_PARAM) {
        dsc_tensor *t = dsc_params_get(pp, x->index);
        for (int64_t i = 0; i < x->numel; i++) store_el(&state[(size_t)x->offset], x->dtype, i, t->data[i]);
      } else if (x->kind == CG_BUF_INPUT) {
        for (int64_t i = 0; i < x->numel; i++)
          store_el(&work[(size_t)x->offset], x->dtype, i, inputs[(size_t)x->index]->data[i]);
      }
    }
    char err[512];
    r.eval_ok = cg_program_eval(p, state.data(), work.data(), err, sizeof err);
    r.eval_err = err;
    std::vector<dsc_tensor *> outs((size_t)dsc_graph_output_count(g) + 1, nullptr);
    dsc_status ist = dsc_interp_run(g, pi, inputs.data(), (int)inputs.size(), outs.data());
    if (compare && r.eval_ok) {
      EXPECT_EQ(ist, DSC_OK);
      if (ist == DSC_OK) {
        for (int o = 0; o < p->n_outputs; o++) {
          const cg_output *out = &p->outputs[o];
          const cg_buffer *x = &p->buffers[out->buffer];
          unsigned char *base = x->kind == CG_BUF_PARAM ? state.data() : work.data();
          std::vector<double> got((size_t)dsc_type_numel(&out->type));
          for (size_t i = 0; i < got.size(); i++)
            got[i] = load_el(base + x->offset, x->dtype, out->offset + (int64_t)i);
          expect_close(got, outs[(size_t)o], tol, "output " + std::to_string(o));
        }
        // assigns not done in place: the runtime's job after the run
        std::vector<std::vector<double>> pending;
        for (int s = 0; s < p->n_assigns; s++) {
          const cg_assign *as = &p->assigns[s];
          if (as->in_place) continue;
          const cg_buffer *x = &p->buffers[as->buffer];
          unsigned char *base = x->kind == CG_BUF_PARAM ? state.data() : work.data();
          std::vector<double> v((size_t)x->numel);
          for (size_t i = 0; i < v.size(); i++) v[i] = load_el(base + x->offset, x->dtype, (int64_t)i);
          pending.push_back(v);
        }
        size_t k = 0;
        for (int s = 0; s < p->n_assigns; s++) {
          const cg_assign *as = &p->assigns[s];
          if (as->in_place) continue;
          const cg_buffer *pb = nullptr;
          for (int b = 0; b < p->n_buffers; b++)
            if (p->buffers[b].kind == CG_BUF_PARAM && p->buffers[b].index == as->param) pb = &p->buffers[b];
          for (size_t i = 0; i < pending[k].size(); i++)
            store_el(&state[(size_t)pb->offset], pb->dtype, (int64_t)i, pending[k][i]);
          k++;
        }
        for (int b = 0; b < p->n_buffers; b++) {
          const cg_buffer *x = &p->buffers[b];
          if (x->kind != CG_BUF_PARAM) continue;
          std::vector<double> got((size_t)x->numel);
          for (size_t i = 0; i < got.size(); i++) got[i] = load_el(&state[(size_t)x->offset], x->dtype, (int64_t)i);
          expect_close(got, dsc_params_get(pi, x->index), tol,
                       std::string("param ") + dsc_module_param_name(m, x->index), normwise_params);
        }
      }
    }
    for (auto *t : outs)
      if (t) dsc_tensor_free(ctx, t);
    for (auto *t : inputs) dsc_tensor_free(ctx, t);
    dsc_params_free(pi);
    dsc_params_free(pp);
    return r;
  }
};

inline dsc_type ty(dsc_dtype dt, std::vector<int64_t> dims) {
  return dsc_type_make(dt, (int)dims.size(), dims.data());
}

}  // namespace lowertest
