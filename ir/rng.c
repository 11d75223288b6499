/* Deterministic random numbers: parameter initialisation, and the counter-
 * based bits of dropout (ir_rand24, at the end).
 *
 * Same seed, same weights: the integer part is exact everywhere; normals go
 * through libm's sqrt, log and cos, so a different libm may change the last
 * bit of a normal before it is rounded to the param's dtype.
 *   stream seed   = splitmix64(seed ^ fnv1a64(param name))  (dsc_params_init)
 *   state s[0..3] = four successive splitmix64 outputs from the stream seed
 *                   (ir_rng_seed)
 *   next          = xoshiro256** (Blackman and Vigna)
 *   uniform       = (next >> 11) * 2^-53, in [0, 1)
 *   normal        = sqrt(-2 ln(1 - u1)) * cos(2 pi u2) (Box-Muller, one normal
 *                   per two uniforms; 1 - u1 is in (0, 1] so the log is finite). */
#include <math.h>

#include "ir/ir.h"

uint64_t ir_fnv1a64(const char *s) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    h ^= *p;
    h *= 0x100000001b3ULL;
  }
  return h;
}

uint64_t ir_splitmix64(uint64_t *x) {
  uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

void ir_rng_seed(ir_rng *r, uint64_t seed) {
  uint64_t x = seed;
  for (int i = 0; i < 4; i++) r->s[i] = ir_splitmix64(&x);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t ir_rng_next(ir_rng *r) {
  uint64_t *s = r->s;
  uint64_t result = rotl(s[1] * 5, 7) * 9;
  uint64_t t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl(s[3], 45);
  return result;
}

double ir_rng_uniform(ir_rng *r) { return (double)(ir_rng_next(r) >> 11) * 0x1.0p-53; }

/* splitmix64's output function (Steele, Lea, Flood: "Fast splittable
 * pseudorandom number generators"): a bijection of 64-bit words whose
 * outputs over a Weyl sequence pass BigCrush. */
static uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

/* rand24(seed, c) = top 24 bits of mix64(mix64(seed) + c * gamma): element c
 * of the Weyl sequence that splitmix64 would walk from the mixed seed, so the
 * counters of one seed never collide and two seeds' sequences are unrelated.
 * Every operation is on unsigned 64-bit words (wrapping); kernels spell
 * the same steps (codegen/llvm.c, codegen/cuda.c's prelude). */
int64_t ir_rand24(int64_t seed, int64_t counter) {
  uint64_t z = mix64((uint64_t)seed) + (uint64_t)counter * 0x9e3779b97f4a7c15ULL;
  return (int64_t)(mix64(z) >> (64 - IR_RAND24_BITS));
}

dsc_node *dsc_dropout(dsc_graph *g, dsc_node *x, dsc_node *seed, double p, int64_t stream) {
  dsc_attr a[2] = {dsc_attr_float("p", p), dsc_attr_int("stream", stream)};
  dsc_node *in[2] = {x, seed};
  return dsc_build(g, DSC_OP_DROPOUT, in, 2, a, 2);
}

int64_t ir_dropout_threshold(double p) { return (int64_t)nearbyint(ldexp(p, IR_RAND24_BITS)); }

double ir_rng_normal(ir_rng *r) {
  double u1 = 1.0 - ir_rng_uniform(r); /* (0, 1] */
  double u2 = ir_rng_uniform(r);
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586476925286766559 * u2);
}
