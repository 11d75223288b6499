/* dtypes, tensor types, broadcasting, number formatting. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir/ir.h"

static const struct {
  const char *name;
  size_t size;
  bool is_float;
} dtypes[DSC_DTYPE_COUNT] = {
    [DSC_F32] = {"f32", 4, true},  [DSC_F64] = {"f64", 8, true},  [DSC_BF16] = {"bf16", 2, true},
    [DSC_F16] = {"f16", 2, true},  [DSC_I32] = {"i32", 4, false}, [DSC_I64] = {"i64", 8, false},
    [DSC_BOOL] = {"bool", 1, false},
};

const char *dsc_dtype_name(dsc_dtype dt) {
  return (unsigned)dt < DSC_DTYPE_COUNT ? dtypes[dt].name : "?";
}

int dsc_dtype_from_name(const char *name, dsc_dtype *out) {
  for (int i = 0; i < DSC_DTYPE_COUNT; i++)
    if (strcmp(name, dtypes[i].name) == 0) {
      *out = (dsc_dtype)i;
      return 0;
    }
  return -1;
}

size_t dsc_dtype_size(dsc_dtype dt) { return (unsigned)dt < DSC_DTYPE_COUNT ? dtypes[dt].size : 0; }
int dsc_dtype_is_float(dsc_dtype dt) { return (unsigned)dt < DSC_DTYPE_COUNT && dtypes[dt].is_float; }

int64_t dsc_type_numel(const dsc_type *t) {
  int64_t n = 1;
  for (int i = 0; i < t->rank; i++) n *= t->dims[i];
  return n;
}

int dsc_type_numel_checked(const dsc_type *t, int64_t *out) {
  if (t->rank < 0 || t->rank > DSC_MAX_RANK) return 0;
  int64_t n = 1, nonzero = 1;
  for (int i = 0; i < t->rank; i++) {
    int64_t d = t->dims[i];
    if (d < 0) return 0;
    if (d == 0) {
      n = 0;
      continue;
    }
    if (nonzero > INT64_MAX / d) return 0;
    nonzero *= d;
  }
  *out = n ? nonzero : 0;
  return 1;
}

int dsc_type_equal(const dsc_type *a, const dsc_type *b) {
  if (a->dtype != b->dtype || a->rank != b->rank) return 0;
  for (int i = 0; i < a->rank; i++)
    if (a->dims[i] != b->dims[i]) return 0;
  return 1;
}

dsc_type dsc_type_make(dsc_dtype dt, int rank, const int64_t *dims) {
  dsc_type t;
  memset(&t, 0, sizeof t);
  t.dtype = dt;
  t.rank = rank < 0 ? 0 : rank > DSC_MAX_RANK ? DSC_MAX_RANK : rank;
  for (int i = 0; i < t.rank; i++) t.dims[i] = dims[i];
  return t;
}

int dsc_type_format(const dsc_type *t, char *buf, size_t n) {
  size_t off = 0;
  int w = snprintf(buf, n, "%s[", dsc_dtype_name(t->dtype));
  if (w < 0) return w;
  off = (size_t)w;
  for (int i = 0; i < t->rank; i++) {
    w = snprintf(off < n ? buf + off : NULL, off < n ? n - off : 0, i ? ",%lld" : "%lld",
                 (long long)t->dims[i]);
    if (w < 0) return w;
    off += (size_t)w;
  }
  w = snprintf(off < n ? buf + off : NULL, off < n ? n - off : 0, "]");
  return w < 0 ? w : (int)(off + (size_t)w);
}

bool ir_broadcast_shapes(const dsc_type *a, const dsc_type *b, dsc_type *out) {
  int rank = a->rank > b->rank ? a->rank : b->rank;
  dsc_type r;
  memset(&r, 0, sizeof r);
  r.dtype = a->dtype;
  r.rank = rank;
  for (int i = 0; i < rank; i++) {
    int ia = a->rank - rank + i, ib = b->rank - rank + i;
    int64_t da = ia >= 0 ? a->dims[ia] : 1, db = ib >= 0 ? b->dims[ib] : 1;
    if (da != db && da != 1 && db != 1) return false;
    r.dims[i] = da == 1 ? db : da;
  }
  *out = r;
  return true;
}

int ir_format_double(double v, char *buf, size_t n) {
  if (isnan(v)) return snprintf(buf, n, "nan");
  if (isinf(v)) return snprintf(buf, n, v < 0 ? "-inf" : "inf");
  for (int prec = 1; prec <= 17; prec++) {
    char tmp[64];
    snprintf(tmp, sizeof tmp, "%.*g", prec, v);
    if (strtod(tmp, NULL) == v) {
      /* keep a marker that this is a float: "1" -> "1.0" */
      if (!strpbrk(tmp, ".eEn")) return snprintf(buf, n, "%s.0", tmp);
      return snprintf(buf, n, "%s", tmp);
    }
  }
  return snprintf(buf, n, "%.17g", v);
}

bool ir_fail(char *err, size_t errlen, const char *fmt, ...) {
  if (err && errlen) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
  }
  return false;
}

/* ---------------- 16-bit floats (one rounding from double, as the interpreter) ---------------- */

/* Rounds |x| (finite, > 0) to a binary float with `mant` fraction bits and
 * exponents [emin, emax], to nearest even, and returns its bit pattern
 * without sign. Works on the double directly: ldexp scalings are exact and
 * rint rounds to nearest even in the default rounding mode. */
static uint32_t round_bits(double a, int mant, int emin, int emax) {
  uint32_t inf = (uint32_t)(emax - emin + 2) << mant; /* all-ones exponent */
  if (a < ldexp(1.0, emin)) {                         /* subnormal (or rounds up to normal) */
    double m = rint(ldexp(a, mant - emin));
    return (uint32_t)m; /* m == 2^mant encodes the smallest normal, as it should */
  }
  int e;
  frexp(a, &e);
  e -= 1; /* a in [2^e, 2^(e+1)) */
  if (e > emax) return inf;
  double m = rint(ldexp(a, mant - e)); /* in [2^mant, 2^(mant+1)] */
  if (m == ldexp(1.0, mant + 1)) {
    m = ldexp(1.0, mant);
    e++;
  }
  if (e > emax) return inf;
  return ((uint32_t)(e - emin + 1) << mant) | ((uint32_t)m - (1u << mant));
}

static uint16_t small_float_bits(double x, int mant, int emin, int emax, uint16_t nan) {
  uint16_t sign = signbit(x) ? 0x8000 : 0;
  if (isnan(x)) return sign | nan;
  double a = fabs(x);
  if (a == 0) return sign;
  if (isinf(a)) return sign | (uint16_t)((uint32_t)(emax - emin + 2) << mant);
  return sign | (uint16_t)round_bits(a, mant, emin, emax);
}

uint16_t ir_f16_bits(double x) { return small_float_bits(x, 10, -14, 15, 0x7e00); }
uint16_t ir_bf16_bits(double x) { return small_float_bits(x, 7, -126, 127, 0x7fc0); }

static double small_float_value(uint16_t bits, int mant, int ebits, int emin) {
  double sign = bits & 0x8000 ? -1.0 : 1.0;
  int e = (bits >> mant) & ((1 << ebits) - 1);
  uint32_t m = bits & ((1u << mant) - 1);
  if (e == (1 << ebits) - 1) return m ? NAN : sign * INFINITY;
  if (e == 0) return sign * ldexp((double)m, emin - mant);
  return sign * ldexp((double)(m | (1u << mant)), e - 1 + emin - mant);
}

double ir_f16_value(uint16_t bits) { return small_float_value(bits, 10, 5, -14); }
double ir_bf16_value(uint16_t bits) { return small_float_value(bits, 7, 8, -126); }
