/* Storage conversions (program/program.h): one element of a buffer as a
 * double, for the reference evaluator and every executor. */
#include <math.h>
#include <stdint.h>

#include "program/program.h"

double cg_load_elem(dsc_dtype dtype, const void *p) {
  switch (dtype) {
    case DSC_F32: return *(const float *)p;
    case DSC_F64: return *(const double *)p;
    case DSC_BF16: return ir_bf16_value(*(const uint16_t *)p);
    case DSC_F16: return ir_f16_value(*(const uint16_t *)p);
    case DSC_I32: return *(const int32_t *)p;
    case DSC_I64: return (double)*(const int64_t *)p;
    case DSC_BOOL: return *(const uint8_t *)p ? 1.0 : 0.0;
    default: return 0.0;
  }
}

int64_t cg_trunc_int(double v, int bits) {
  if (isnan(v)) return 0;
  double t = trunc(v);
  if (bits == 32) {
    if (t >= 2147483648.0 || t < -2147483648.0) t = fmod(t, 4294967296.0);
    int64_t i = (int64_t)t;
    return (int32_t)(uint32_t)i;
  }
  if (t >= 9223372036854775808.0 || t < -9223372036854775808.0) return INT64_MIN;
  return (int64_t)t;
}

void cg_store_elem(dsc_dtype dtype, void *p, double v) {
  switch (dtype) {
    case DSC_F32: *(float *)p = (float)v; break;
    case DSC_F64: *(double *)p = v; break;
    case DSC_BF16: *(uint16_t *)p = ir_bf16_bits(v); break;
    case DSC_F16: *(uint16_t *)p = ir_f16_bits(v); break;
    case DSC_I32: *(int32_t *)p = (int32_t)cg_trunc_int(v, 32); break;
    case DSC_I64: *(int64_t *)p = cg_trunc_int(v, 64); break;
    case DSC_BOOL: *(uint8_t *)p = v != 0; break;
    default: break;
  }
}
