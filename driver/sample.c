/* Drawing a token from logits (include/dsc/infer.h): greedy, temperature,
 * top-k and top-p (nucleus), as transformers' generate filters them. */
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "driver/driver.h"
#include "dsc/infer.h"

/* k-th largest (0-based) of v[0..n) by quickselect; reorders v. */
static double kth_largest(double *v, int64_t n, int64_t k) {
  int64_t lo = 0, hi = n - 1;
  while (lo < hi) {
    double pivot = v[lo + (hi - lo) / 2];
    int64_t i = lo, j = hi;
    while (i <= j) {
      while (v[i] > pivot) i++;
      while (v[j] < pivot) j--;
      if (i <= j) {
        double tmp = v[i];
        v[i] = v[j];
        v[j] = tmp;
        i++, j--;
      }
    }
    if (k <= j)
      hi = j;
    else if (k >= i)
      lo = i;
    else
      return v[k];
  }
  return v[k];
}

typedef struct {
  double logit;
  int64_t id;
} cand;

static int by_logit_desc(const void *pa, const void *pb) {
  const cand *a = pa, *b = pb;
  if (a->logit != b->logit) return a->logit > b->logit ? -1 : 1;
  return a->id < b->id ? -1 : a->id > b->id;
}

/* in[i]: token i is a candidate after top-k (ties at the k-th value taken in
 * index order); then, for top_p < 1, only the most likely candidates whose
 * probabilities first reach top_p (at least one). False: no memory. */
static bool candidates(const double *logits, int64_t V, double mx, const dsc_sampling *p,
                       bool *in) {
  double thr = -INFINITY;
  int64_t ties = V;
  if (p->top_k > 0 && p->top_k < V) {
    double *tmp = malloc(sizeof(double) * (size_t)V);
    if (!tmp) return false;
    memcpy(tmp, logits, sizeof(double) * (size_t)V);
    thr = kth_largest(tmp, V, p->top_k - 1);
    free(tmp);
    int64_t above = 0;
    for (int64_t i = 0; i < V; i++) above += logits[i] > thr;
    ties = p->top_k - above;
  }
  int64_t n = 0;
  for (int64_t i = 0; i < V; i++) {
    in[i] = logits[i] > thr || (logits[i] == thr && ties-- > 0);
    n += in[i];
  }
  if (!(p->top_p > 0 && p->top_p < 1)) return true;
  cand *c = malloc(sizeof *c * (size_t)n);
  if (!c) return false;
  double sum = 0;
  for (int64_t i = 0, j = 0; i < V; i++)
    if (in[i]) {
      c[j++] = (cand){logits[i], i};
      sum += exp((logits[i] - mx) / p->temperature);
    }
  qsort(c, (size_t)n, sizeof *c, by_logit_desc);
  double acc = 0;
  int64_t keep = 0;
  while (keep < n && (keep == 0 || acc < p->top_p * sum))
    acc += exp((c[keep++].logit - mx) / p->temperature);
  for (int64_t j = keep; j < n; j++) in[c[j].id] = false;
  free(c);
  return true;
}

int64_t dsc_sample_logits(const double *logits, int64_t V, const dsc_sampling *p,
                          uint64_t rng_state[4]) {
  if (V <= 0) return -1;
  int64_t best = 0;
  for (int64_t i = 1; i < V; i++)
    if (logits[i] > logits[best]) best = i;
  if (!(p->temperature > 0) || p->top_k == 1) return best;
  double mx = logits[best];
  bool *in = malloc(sizeof(bool) * (size_t)V);
  if (!in || !candidates(logits, V, mx, p, in)) {
    free(in);
    return best; /* no memory for the selection: greedy */
  }
  double sum = 0;
  for (int64_t i = 0; i < V; i++)
    if (in[i]) sum += exp((logits[i] - mx) / p->temperature);
  ir_rng r;
  memcpy(r.s, rng_state, sizeof r.s);
  double u = ir_rng_uniform(&r) * sum, acc = 0;
  memcpy(rng_state, r.s, sizeof r.s);
  /* the draw walks the candidates in index order */
  int64_t pick = best;
  for (int64_t i = 0; i < V; i++) {
    if (!in[i]) continue;
    acc += exp((logits[i] - mx) / p->temperature);
    pick = i; /* rounding may leave u at the very end: the last candidate */
    if (u < acc) break;
  }
  free(in);
  return pick;
}
