/* --auto for dsc plan and dsc train (include/dsc/autocfg.h): the flags, the
 * rates (calibration, cache, overrides) and the report of the search. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dsc/autocfg.h"
#include "tools/cli.h"

int cli_auto_flag(const char *cmd, int argc, char **argv, int *i, cli_auto *a) {
  const char *f = argv[*i];
  bool has_val = *i + 1 < argc;
  if (strcmp(f, "--auto") == 0) {
    a->on = true;
    return 1;
  }
  if (strcmp(f, "--recalibrate") == 0) {
    a->recalibrate = true;
    return 1;
  }
  if (strcmp(f, "--offload-dir") == 0) {
    if (!has_val || !argv[*i + 1][0]) return cli_usage_error(cmd, "--offload-dir needs a directory"), -1;
    a->offload_dir = argv[++*i];
    return 1;
  }
  if (strcmp(f, "--max-plans") == 0) {
    int64_t v;
    if (!has_val || !cli_parse_i64(argv[*i + 1], &v) || v < 1 || v > DSC_AUTOCFG_MAX)
      return cli_usage_error(cmd, "--max-plans needs an integer in [1, %d]", DSC_AUTOCFG_MAX), -1;
    a->max_plans = (int)v;
    ++*i;
    return 1;
  }
  double *dst = strcmp(f, "--compute-gflops") == 0 ? &a->rates.compute_gflops
                : strcmp(f, "--link-gbps") == 0    ? &a->rates.link_gbps
                : strcmp(f, "--host-gbps") == 0    ? &a->rates.host_gbps
                : strcmp(f, "--disk-gbps") == 0    ? &a->rates.disk_gbps
                                                   : NULL;
  if (!dst) return 0;
  char *end = NULL;
  double v = has_val ? strtod(argv[*i + 1], &end) : 0;
  if (!has_val || !*argv[*i + 1] || *end || !(v > 0) || !isfinite(v) || v > 1e9)
    return cli_usage_error(cmd, "%s needs a positive number (GFLOP/s or GB/s)", f), -1;
  *dst = v;
  ++*i;
  return 1;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The rates: flags where given, the rest calibrated (or the host's cache).
 * *how: a few words for the report. */
static dsc_status auto_rates(dsc_context *ctx, const cli_auto *a, const dsc_plan_options *b,
                             dsc_rates *r, char *how, size_t n) {
  *r = a->rates;
  if (r->compute_gflops > 0 && r->link_gbps > 0 && r->host_gbps > 0 && r->disk_gbps > 0) {
    snprintf(how, n, "from the flags");
    return DSC_OK;
  }
  dsc_calibrate_options co;
  memset(&co, 0, sizeof co);
  co.threads = b->threads;
  co.disk_dir = b->offload_dir;
  co.recalibrate = a->recalibrate;
  dsc_rates m;
  bool cached = false;
  double t0 = now_s();
  dsc_status st = dsc_calibrate(ctx, &co, &m, &cached);
  if (st != DSC_OK) return st;
  char path[4096];
  bool have_path = dsc_calibrate_cache_path(&co, path, sizeof path);
  if (cached)
    snprintf(how, n, "calibrated earlier: %s; --recalibrate measures again", path);
  else
    snprintf(how, n, "calibrated in %.1f s%s%s", now_s() - t0, have_path ? ", cached in " : "",
             have_path ? path : "");
  if (!(r->compute_gflops > 0)) r->compute_gflops = m.compute_gflops;
  if (!(r->link_gbps > 0)) r->link_gbps = m.link_gbps;
  if (!(r->host_gbps > 0)) r->host_gbps = m.host_gbps;
  if (!(r->disk_gbps > 0)) r->disk_gbps = m.disk_gbps;
  if (a->rates.compute_gflops > 0 || a->rates.link_gbps > 0 || a->rates.host_gbps > 0 ||
      a->rates.disk_gbps > 0) {
    size_t k = strlen(how);
    snprintf(how + k, n - k, "; flags override some");
  }
  return DSC_OK;
}

static void human(char *buf, size_t n, int64_t b) {
  const char *unit[] = {"KiB", "MiB", "GiB", "TiB"};
  if (b < 1024) {
    snprintf(buf, n, "%" PRId64 " B", b);
    return;
  }
  double v = (double)b / 1024;
  int u = 0;
  while (v >= 1024 && u < 3) v /= 1024, u++;
  snprintf(buf, n, "%.2f %s", v, unit[u]);
}

/* s as a JSON string */
static void json_str(const char *s) {
  putchar('"');
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\')
      printf("\\%c", c);
    else if (c < 0x20)
      printf("\\u%04x", c);
    else
      putchar(c);
  }
  putchar('"');
}

/* The candidate's activation checkpointing as its flag value. */
static const char *remat_text(const dsc_run_knobs *k, char *buf, size_t n) {
  if (k->remat == DSC_REMAT_BLOCKS && k->remat_every > 1)
    snprintf(buf, n, "blocks:%" PRId64, k->remat_every);
  else
    snprintf(buf, n, "%s", dsc_remat_name(k->remat));
  return buf;
}

static void json_cand(const dsc_autocfg_candidate *c, int64_t world) {
  const dsc_run_knobs *k = &c->knobs;
  char flags[256], act[32];
  dsc_autocfg_flags(c, world, flags, sizeof flags);
  printf("{\"flags\": ");
  json_str(flags);
  printf(", \"zero_stage\": %" PRId64
         ", \"offload_optimizer\": \"%s\", \"offload_param\": \"%s\", "
         "\"checkpoint_activations\": ",
         world > 1 ? k->zero_stage : 0, dsc_offload_name(k->offload_optimizer),
         dsc_offload_name(k->offload_param));
  json_str(remat_text(k, act, sizeof act));
  printf(", ");
  if (k->has_bucket_bytes)
    printf("\"bucket_bytes\": %" PRId64 ", ", k->bucket_bytes);
  else
    printf("\"bucket_bytes\": null, ");
  if (k->has_prefetch_bytes)
    printf("\"prefetch_bytes\": %" PRId64 ", ", k->prefetch_bytes);
  else
    printf("\"prefetch_bytes\": null, ");
  printf("\"fits\": %s, \"peak\": %" PRId64 ", \"host_bytes\": %" PRId64 ", \"disk_bytes\": %" PRId64
         ", \"step_s\": %.6g, \"compute_s\": %.6g, \"comm_s\": %.6g, \"exposed_comm_s\": %.6g, "
         "\"offload_s\": %.6g}",
         c->fits ? "true" : "false", c->plan.rank.peak, c->plan.host_bytes, c->plan.disk_bytes,
         c->cost.step_s, c->cost.compute_s, c->cost.comm_s, c->cost.exposed_comm_s,
         c->cost.offload_s);
}

static void print_json(const dsc_autocfg_options *o, const dsc_autocfg_result *r, const char *how) {
  int64_t world = o->base.world > 1 ? o->base.world : 1;
  printf("{\"model\": ");
  json_str(o->base.model_path);
  printf(", \"world\": %" PRId64 ", \"memory_budget\": %" PRId64
         ", \"host_memory_budget\": %" PRId64 ", \"planned\": %d, \"fit\": %d, ",
         world, o->memory_budget, o->host_memory_budget, r->n_planned, r->n_fit);
  printf("\"rates\": {\"compute_gflops\": %.6g, \"link_gbps\": %.6g, \"host_gbps\": %.6g, "
         "\"disk_gbps\": %.6g, \"source\": ",
         o->rates.compute_gflops, o->rates.link_gbps, o->rates.host_gbps, o->rates.disk_gbps);
  json_str(how);
  printf("}, \"chosen\": ");
  if (r->n_fit > 0)
    json_cand(&r->cand[0], world);
  else
    printf("null");
  printf(", \"candidates\": [");
  for (int i = 0; i < r->n; i++) {
    if (i) printf(", ");
    json_cand(&r->cand[i], world);
  }
  printf("]}\n");
}

static void print_text(FILE *out, const dsc_autocfg_options *o, const dsc_autocfg_result *r,
                       const char *how) {
  int64_t world = o->base.world > 1 ? o->base.world : 1;
  char b[32], flags[256];
  human(b, sizeof b, o->memory_budget);
  fprintf(out, "auto: %d configurations planned for %s at world %" PRId64 ", budget %s per rank",
          r->n_planned, o->base.model_path, world, b);
  if (o->host_memory_budget > 0) {
    human(b, sizeof b, o->host_memory_budget);
    fprintf(out, " (host %s)", b);
  }
  fprintf(out, ": %d fit\n", r->n_fit);
  fprintf(out,
          "rates: compute %.1f GFLOP/s, link %.2f GB/s, host %.2f GB/s, disk %.2f GB/s (%s)\n",
          o->rates.compute_gflops, o->rates.link_gbps, o->rates.host_gbps, o->rates.disk_gbps,
          how);
  if (r->n_fit > 0) {
    const dsc_autocfg_candidate *c = &r->cand[0];
    const dsc_plan_figures *f = &c->plan.rank;
    dsc_autocfg_flags(c, world, flags, sizeof flags);
    fprintf(out, "chosen: %s\n", flags);
    fprintf(out,
            "  predicted step %.3f ms: compute %.3f ms + exposed communication %.3f ms (of "
            "%.3f ms) + offload %.3f ms\n",
            c->cost.step_s * 1e3, c->cost.compute_s * 1e3, c->cost.exposed_comm_s * 1e3,
            c->cost.comm_s * 1e3, c->cost.offload_s * 1e3);
    human(b, sizeof b, f->peak);
    fprintf(out, "  peak %s per rank (", b);
    const char *name[6] = {"params", "grads", "optimizer", "activations", "workspace", "comm"};
    int64_t v[6] = {f->params, f->grads, f->optimizer, f->activations, f->workspace, f->comm};
    for (int k = 0; k < 6; k++) {
      human(b, sizeof b, v[k]);
      fprintf(out, "%s %s%s", name[k], b, k < 5 ? ", " : ")");
    }
    if (c->plan.host_bytes || c->plan.disk_bytes) {
      char h[32], d[32];
      human(h, sizeof h, c->plan.host_bytes);
      human(d, sizeof d, c->plan.disk_bytes);
      fprintf(out, "; host %s, disk %s", h, d);
    }
    fprintf(out, "\n");
  }
  fprintf(out, "\n  %-3s %-6s %-9s %-6s %-11s %-10s %-10s %11s %9s %9s  %s\n", "#", "stage",
          "optimizer", "param", "activations", "bucket", "prefetch", "peak", "step ms",
          "comm ms", "fits");
  for (int i = 0; i < r->n && i < 12; i++) {
    const dsc_autocfg_candidate *c = &r->cand[i];
    const dsc_run_knobs *k = &c->knobs;
    char bk[32] = "model", pf[32] = "model", act[32];
    if (k->has_bucket_bytes) human(bk, sizeof bk, k->bucket_bytes);
    if (k->has_prefetch_bytes) human(pf, sizeof pf, k->prefetch_bytes);
    human(b, sizeof b, c->plan.rank.peak);
    fprintf(out, "  %-3d %-6d %-9s %-6s %-11s %-10s %-10s %11s %9.3f %9.3f  %s\n", i + 1,
            world > 1 ? (int)k->zero_stage : 0, dsc_offload_name(k->offload_optimizer),
            dsc_offload_name(k->offload_param), remat_text(k, act, sizeof act), bk, pf, b,
            c->cost.step_s * 1e3, c->cost.exposed_comm_s * 1e3, c->fits ? "yes" : "no");
  }
  if (r->n > 12) fprintf(out, "  (%d more; --json lists all)\n", r->n - 12);
  fprintf(out, "  (step ms: predicted; comm ms: exposed communication)\n");
}

int cli_auto_run(const char *cmd, dsc_context *ctx, const cli_auto *a, dsc_autocfg_options *ao,
                 bool json, FILE *out, dsc_autocfg_result *res) {
  char how[4300];
  if (!ao->base.offload_dir) ao->base.offload_dir = a->offload_dir;
  dsc_status st = auto_rates(ctx, a, &ao->base, &ao->rates, how, sizeof how);
  if (st != DSC_OK) {
    dsc_diag_print(ctx, stderr);
    return cli_exit_code(st);
  }
  dsc_diag_print(ctx, stderr); /* a cache warning */
  dsc_diag_clear(ctx);
  /* dsc plan's and dsc train's --host-memory-budget */
  if (ao->host_memory_budget <= 0) ao->host_memory_budget = ao->base.host_memory_budget;
  ao->max_plans = a->max_plans;
  st = dsc_autocfg_search(ctx, ao, res);
  if (st == DSC_OK || res->n > 0) {
    if (json)
      print_json(ao, res, how);
    else
      print_text(out, ao, res, how);
    fflush(out);
  }
  if (st != DSC_OK) {
    dsc_diag_print(ctx, stderr);
    return cli_exit_code(st);
  }
  (void)cmd;
  return CLI_EXIT_OK;
}
