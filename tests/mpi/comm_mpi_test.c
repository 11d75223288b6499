/* The MPI communication backend at any world size (ctest runs -np 2 and 4):
 * every collective against a reference each rank computes itself from the
 * same deterministic inputs. Prints what failed; exit 0 on success, 1 on a
 * failure. With the argument "timeout": rank 1 never joins a barrier, rank 0
 * must report the named timeout and end the job with dsc_comm_abort.
 * "stopped": rank 1 stops itself (SIGSTOP: its sockets stay open) before a
 * barrier; rank 0 times out, a second request is abandoned at once, and the
 * abort must end the stopped rank too. "init_stopped": rank 1 stops before
 * MPI_Init; rank 0's start-up watchdog must end the job. */
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dsc/dsc.h"

static int failures;
static int rank_, world_;

#define CHECK(cond, ...)                                         \
  do {                                                           \
    if (!(cond)) {                                               \
      fprintf(stderr, "rank %d: FAIL line %d: ", rank_, __LINE__); \
      fprintf(stderr, __VA_ARGS__);                              \
      fprintf(stderr, "\n");                                     \
      failures++;                                                \
    }                                                            \
  } while (0)

/* A value in [-1, -0.25] u [0.25, 1] drawn from (salt, rank, i): never zero. */
static double value(uint64_t salt, int rank, int64_t i) {
  uint64_t z = salt * 0x9E3779B97F4A7C15ull + (uint64_t)rank * 0xBF58476D1CE4E5B9ull +
               (uint64_t)i * 0x94D049BB133111EBull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  double u = (double)(z >> 11) / 9007199254740992.0; /* [0, 1) */
  double m = 0.25 + 0.75 * u;
  return (z & 1) ? m : -m;
}

static void ok_or_print(dsc_context *ctx, dsc_status st, const char *what) {
  if (st != DSC_OK) {
    dsc_diag_print(ctx, stderr);
    dsc_diag_clear(ctx);
  }
  CHECK(st == DSC_OK, "%s failed", what);
}

/* Reduction over ranks of value(salt, r, i), summed in rank order. */
static double ref_sum(uint64_t salt, int64_t i) {
  double s = 0;
  for (int r = 0; r < world_; r++) s += value(salt, r, i);
  return s;
}

static void test_all_reduce(dsc_comm *c, dsc_context *ctx) {
  const int64_t n = 1000;
  double *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
  float *xf = malloc(n * sizeof *xf), *yf = malloc(n * sizeof *yf);
  int32_t *xi = malloc(n * sizeof *xi), *yi = malloc(n * sizeof *yi);
  for (int64_t i = 0; i < n; i++) {
    x[i] = value(1, rank_, i);
    xf[i] = (float)value(2, rank_, i);
    xi[i] = (int32_t)(value(3, rank_, i) * 1000);
  }
  ok_or_print(ctx, dsc_comm_all_reduce(c, x, y, n, DSC_F64, DSC_COMM_SUM, 1), "all_reduce f64");
  for (int64_t i = 0; i < n; i++)
    CHECK(fabs(y[i] - ref_sum(1, i)) <= 1e-13 * world_, "all_reduce f64 [%lld]: %.17g vs %.17g",
          (long long)i, y[i], ref_sum(1, i));
  ok_or_print(ctx, dsc_comm_all_reduce(c, x, x, n, DSC_F64, DSC_COMM_MEAN, 2), "all_reduce mean");
  for (int64_t i = 0; i < n; i++)
    CHECK(fabs(x[i] - ref_sum(1, i) / world_) <= 1e-13, "in-place mean f64 [%lld]", (long long)i);
  ok_or_print(ctx, dsc_comm_all_reduce(c, xf, yf, n, DSC_F32, DSC_COMM_SUM, 3), "all_reduce f32");
  for (int64_t i = 0; i < n; i++) {
    double ref = 0;
    for (int r = 0; r < world_; r++) ref += (float)value(2, r, i);
    CHECK(fabs(yf[i] - ref) <= 1e-5 * world_, "all_reduce f32 [%lld]", (long long)i); /* f32 */
  }
  ok_or_print(ctx, dsc_comm_all_reduce(c, xi, yi, n, DSC_I32, DSC_COMM_SUM, 4), "all_reduce i32");
  for (int64_t i = 0; i < n; i++) {
    int32_t ref = 0;
    for (int r = 0; r < world_; r++) ref += (int32_t)(value(3, r, i) * 1000);
    CHECK(yi[i] == ref, "all_reduce i32 [%lld]: %d vs %d", (long long)i, yi[i], ref);
  }
  free(x), free(y), free(xf), free(yf), free(xi), free(yi);
}

static void test_reduce_scatter(dsc_comm *c, dsc_context *ctx) {
  const int64_t chunk = 37, n = chunk * world_;
  double *x = malloc(n * sizeof *x), *y = malloc(chunk * sizeof *y);
  for (int64_t i = 0; i < n; i++) x[i] = value(5, rank_, i);
  ok_or_print(ctx, dsc_comm_reduce_scatter(c, x, y, n, DSC_F64, DSC_COMM_SUM, 5), "reduce_scatter");
  for (int64_t i = 0; i < chunk; i++) {
    double ref = ref_sum(5, rank_ * chunk + i);
    CHECK(fabs(y[i] - ref) <= 1e-13 * world_, "reduce_scatter [%lld]", (long long)i);
  }
  ok_or_print(ctx, dsc_comm_reduce_scatter(c, x, x, n, DSC_F64, DSC_COMM_MEAN, 6),
              "reduce_scatter in place");
  for (int64_t i = 0; i < chunk; i++) {
    double ref = ref_sum(5, rank_ * chunk + i) / world_;
    CHECK(fabs(x[i] - ref) <= 1e-13, "reduce_scatter mean in place [%lld]", (long long)i);
  }
  /* Bad arguments fail on the calling rank only, before MPI sees them. */
  dsc_status st = dsc_comm_reduce_scatter(c, x, y, n + 1, DSC_F64, DSC_COMM_SUM, 7);
  CHECK(st == DSC_ERR_USER, "indivisible reduce_scatter accepted");
  CHECK(dsc_diag_count(ctx) == 1 && strstr(dsc_diag_get(ctx, 0)->message, "does not divide"),
        "indivisible reduce_scatter: wrong message");
  dsc_diag_clear(ctx);
  free(x), free(y);
}

static void test_gather_broadcast(dsc_comm *c, dsc_context *ctx) {
  const int64_t n = 13;
  int64_t *x = malloc(n * sizeof *x), *y = malloc(n * world_ * sizeof *y);
  for (int64_t i = 0; i < n; i++) x[i] = (int64_t)(value(8, rank_, i) * 1e15);
  ok_or_print(ctx, dsc_comm_all_gather(c, x, y, n, DSC_I64, 8), "all_gather");
  for (int r = 0; r < world_; r++)
    for (int64_t i = 0; i < n; i++)
      CHECK(y[r * n + i] == (int64_t)(value(8, r, i) * 1e15), "all_gather [%d][%lld]", r,
            (long long)i);
  double b[100];
  int root = world_ - 1;
  for (int i = 0; i < 100; i++) b[i] = value(9, rank_, i);
  ok_or_print(ctx, dsc_comm_broadcast(c, b, 100, DSC_F64, root, 9), "broadcast");
  for (int i = 0; i < 100; i++) CHECK(b[i] == value(9, root, i), "broadcast [%d]", i);
  free(x), free(y);
}

static void test_async(dsc_comm *c, dsc_context *ctx) {
  double a[64], ra[64], g[8], rg[8 * 64];
  for (int i = 0; i < 64; i++) a[i] = value(10, rank_, i);
  for (int i = 0; i < 8; i++) g[i] = value(11, rank_, i);
  dsc_comm_request *r1, *r2, *r3;
  ok_or_print(ctx, dsc_comm_all_reduce_start(c, a, ra, 64, DSC_F64, DSC_COMM_SUM, 10, &r1), "s1");
  ok_or_print(ctx, dsc_comm_all_gather_start(c, g, rg, 8, DSC_F64, 10, &r2), "s2");
  ok_or_print(ctx, dsc_comm_barrier_start(c, 10, &r3), "s3");
  ok_or_print(ctx, dsc_comm_wait(r1), "w1");
  ok_or_print(ctx, dsc_comm_wait(r2), "w2");
  ok_or_print(ctx, dsc_comm_wait(r3), "w3");
  for (int i = 0; i < 64; i++) CHECK(fabs(ra[i] - ref_sum(10, i)) <= 1e-13 * world_, "async ar");
  for (int r = 0; r < world_; r++)
    for (int i = 0; i < 8; i++) CHECK(rg[r * 8 + i] == value(11, r, i), "async gather");
}

/* all_to_all (also in place) and all_to_all_v with counts that differ per
 * pair, some empty, and gaps between the ranges. */
static double a2a_elem(int from, int to, int64_t i) {
  return 1 + from * 1000 + to * 100000 + (double)i * 0.5;
}

static void test_all_to_all(dsc_comm *c, dsc_context *ctx) {
  const int64_t n = 5;
  int w = world_;
  double *x = malloc((size_t)(n * w) * sizeof *x), *y = malloc((size_t)(n * w) * sizeof *y);
  for (int j = 0; j < w; j++)
    for (int64_t i = 0; i < n; i++) x[j * n + i] = a2a_elem(rank_, j, i);
  ok_or_print(ctx, dsc_comm_all_to_all(c, x, y, n, DSC_F64, 12), "all_to_all");
  for (int q = 0; q < w; q++)
    for (int64_t i = 0; i < n; i++)
      CHECK(y[q * n + i] == a2a_elem(q, rank_, i), "all_to_all [%d][%lld]", q, (long long)i);
  ok_or_print(ctx, dsc_comm_all_to_all(c, x, x, n, DSC_F64, 13), "all_to_all in place");
  for (int q = 0; q < w; q++)
    for (int64_t i = 0; i < n; i++)
      CHECK(x[q * n + i] == a2a_elem(q, rank_, i), "all_to_all in place [%d]", q);
  int64_t *sc = malloc(4 * (size_t)w * sizeof *sc), *sd = sc + w, *rc = sc + 2 * w,
          *rd = sc + 3 * w, at = 0;
  for (int j = w - 1; j >= 0; j--) /* reversed, a gap of 1 */
    sc[j] = (rank_ * 3 + j * 2) % 4, sd[j] = at, at += sc[j] + 1;
  float *vs = malloc((size_t)at * sizeof *vs);
  for (int j = 0; j < w; j++)
    for (int64_t i = 0; i < sc[j]; i++) vs[sd[j] + i] = (float)a2a_elem(rank_, j, i);
  at = 0;
  for (int q = 0; q < w; q++) rc[q] = (q * 3 + rank_ * 2) % 4, rd[q] = at, at += rc[q] + 2;
  float *vr = malloc((size_t)at * sizeof *vr);
  ok_or_print(ctx, dsc_comm_all_to_all_v(c, vs, sc, sd, vr, rc, rd, DSC_F32, 14), "all_to_all_v");
  for (int q = 0; q < w; q++)
    for (int64_t i = 0; i < rc[q]; i++)
      CHECK(vr[rd[q] + i] == (float)a2a_elem(q, rank_, i), "all_to_all_v [%d][%lld]", q,
            (long long)i);
  free(x), free(y), free(sc), free(vs), free(vr);
}

/* Groups by parity with keys reversed, a group of a group, and a mesh. */
static void test_groups(dsc_comm *c, dsc_context *ctx) {
  dsc_comm *g = NULL;
  ok_or_print(ctx, dsc_comm_split(c, rank_ % 2, -rank_, "parity", &g), "split");
  if (!g) return;
  int n = (world_ - rank_ % 2 + 1) / 2, gr = dsc_comm_rank(g);
  CHECK(dsc_comm_world(g) == n, "group size %d, expected %d", dsc_comm_world(g), n);
  CHECK(strcmp(dsc_comm_name(g), "parity") == 0, "group name");
  /* key -rank: the highest rank of the parity first */
  int top = world_ - 1 - ((world_ - 1 - rank_) % 2);
  for (int i = 0; i < n; i++)
    CHECK(dsc_comm_world_rank(g, i) == top - 2 * i, "group rank %d is world %d", i,
          dsc_comm_world_rank(g, i));
  double x = rank_, y = 0, want = 0;
  for (int i = 0; i < n; i++) want += top - 2 * i;
  ok_or_print(ctx, dsc_comm_all_reduce(g, &x, &y, 1, DSC_F64, DSC_COMM_SUM, 20), "group ar");
  CHECK(y == want, "group sum %g, expected %g", y, want);
  double *s = malloc((size_t)n * sizeof *s), *v = malloc((size_t)n * sizeof *v);
  for (int j = 0; j < n; j++) s[j] = a2a_elem(rank_, dsc_comm_world_rank(g, j), 0);
  ok_or_print(ctx, dsc_comm_all_to_all(g, s, v, 1, DSC_F64, 21), "group a2a");
  for (int q = 0; q < n; q++)
    CHECK(v[q] == a2a_elem(dsc_comm_world_rank(g, q), rank_, 0), "group a2a [%d]", q);
  dsc_comm *sub = NULL; /* group rank 0 joins none */
  ok_or_print(ctx, dsc_comm_split(g, gr == 0 ? -1 : 0, gr, "sub", &sub), "split of a group");
  CHECK((sub == NULL) == (gr == 0), "sub-group membership");
  if (sub) {
    double one = 1, cnt = 0;
    ok_or_print(ctx, dsc_comm_all_reduce(sub, &one, &cnt, 1, DSC_F64, DSC_COMM_SUM, 22), "sub ar");
    CHECK(cnt == n - 1, "sub-group of %g, expected %d", cnt, n - 1);
  }
  dsc_comm_free(sub);
  dsc_comm_free(g);
  free(s), free(v);
  if (world_ % 2 != 0) return;
  dsc_mesh_shape shape;
  ok_or_print(ctx, dsc_mesh_parse(ctx, "ep=2", world_, &shape), "mesh parse");
  dsc_mesh *m = NULL;
  ok_or_print(ctx, dsc_mesh_new(c, &shape, &m), "mesh");
  if (!m) return;
  dsc_comm *ep = dsc_mesh_group(m, "ep"), *dp = dsc_mesh_group(m, "dp");
  CHECK(dsc_comm_world(ep) == 2 && dsc_comm_world(dp) == world_ / 2, "mesh group sizes");
  CHECK(dsc_comm_world_rank(ep, 0) == rank_ - rank_ % 2, "ep group of rank %d", rank_);
  for (int i = 0; i < world_ / 2; i++)
    CHECK(dsc_comm_world_rank(dp, i) == 2 * i + rank_ % 2, "dp group rank %d", i);
  dsc_mesh_free(m);
}

/* Rank 0 after rank 1 stopped: the named timeout, then the next wait gives
 * up at once (not after another timeout), then the abort. */
static int stopped_peer(dsc_comm *c, dsc_context *ctx) {
  double x = 1, y = 0;
  dsc_comm_request *bar = NULL, *ar = NULL;
  ok_or_print(ctx, dsc_comm_barrier_start(c, 7, &bar), "barrier start");
  ok_or_print(ctx, dsc_comm_all_reduce_start(c, &x, &y, 1, DSC_F64, DSC_COMM_SUM, 8, &ar),
              "all_reduce start");
  if (!bar || !ar) return 1;
  CHECK(dsc_comm_wait(bar) != DSC_OK, "barrier with a stopped peer succeeded");
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  CHECK(dsc_comm_wait(ar) != DSC_OK, "all_reduce with a stopped peer succeeded");
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
  CHECK(s < 0.25, "the second wait took %.2f s on a broken communicator", s);
  dsc_diag_print(ctx, stderr); /* "... timed out after 0.5 s", "... abandoned: ..." */
  fflush(stderr);
  dsc_comm_abort(c, "a collective timed out");
  return 1; /* not reached */
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "";
  const char *env_rank = getenv("OMPI_COMM_WORLD_RANK");
  if (strcmp(mode, "init_stopped") == 0 && env_rank && strcmp(env_rank, "1") == 0)
    raise(SIGSTOP); /* rank 0's MPI_Init waits for this one forever, but for the watchdog */
  dsc_context *ctx = dsc_context_new(NULL, NULL);
  dsc_comm *c = NULL;
  if (dsc_comm_mpi_new(ctx, &c) != DSC_OK) {
    dsc_diag_print(ctx, stderr);
    return 1;
  }
  rank_ = dsc_comm_rank(c);
  world_ = dsc_comm_world(c);
  CHECK(strcmp(dsc_comm_backend(c), "mpi") == 0, "backend name");
  /* mpirun on one machine: every rank on this node */
  CHECK(dsc_comm_local_rank(c) == rank_ && dsc_comm_local_world(c) == world_, "local rank");
  if (strcmp(mode, "init_stopped") == 0) {
    fprintf(stderr, "FAIL: rank %d: MPI started although rank 1 is stopped\n", rank_);
    return 1;
  }
  if (strcmp(mode, "stopped") == 0) {
    dsc_comm_set_timeout(c, 0.5);
    ok_or_print(ctx, dsc_comm_barrier(c, 6), "first barrier");
    if (rank_ == 1) {
      raise(SIGSTOP); /* only SIGKILL (or SIGCONT) gets this process going again */
      return 1;
    }
    return stopped_peer(c, ctx);
  }
  if (argc > 1 && strcmp(argv[1], "timeout") == 0) {
    dsc_comm_set_timeout(c, 0.5);
    ok_or_print(ctx, dsc_comm_barrier(c, 6), "first barrier");
    if (rank_ == 1) {
      sleep(30); /* never joins; MPI_Abort from rank 0 must end this process */
      return 1;
    }
    dsc_status st = dsc_comm_barrier(c, 7);
    dsc_diag_print(ctx, stderr); /* "rank 0: barrier #1 (step 7) timed out after 0.5 s ..." */
    if (st == DSC_OK) return 1;
    dsc_comm_abort(c, "a collective timed out");
    return 1; /* not reached */
  }
  test_all_reduce(c, ctx);
  test_reduce_scatter(c, ctx);
  test_gather_broadcast(c, ctx);
  test_async(c, ctx);
  test_all_to_all(c, ctx);
  test_groups(c, ctx);
  ok_or_print(ctx, dsc_comm_barrier(c, 11), "barrier");
  CHECK(!dsc_comm_broken(c), "communicator broken");
  if (rank_ == 0) printf("comm_mpi_test: world %d: %s\n", world_, failures ? "FAILED" : "ok");
  dsc_comm_free(c);
  dsc_context_free(ctx);
  return failures ? 1 : 0;
}
