/* dsc plan: the memory one rank needs, before launching (include/dsc/memplan.h).
 * A table of the categories for ZeRO stages 0-3 side by side with the ZeRO
 * paper's model-state formulas, or (--json) one object for one stage. */
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsc/memplan.h"
#include "tools/cli.h"

static const char plan_help[] =
    "usage: dsc plan MODEL.dsm [--world N] [--zero-stage S] [--json | --bytes] [options]\n"
    "\n"
    "Prints the memory one rank needs to train MODEL on N ranks, by category, before\n"
    "anything runs: the step graph is built exactly as 'dsc train' builds it (same\n"
    "pipeline and settings) and lowered; its arenas are the ones the CPU runtime\n"
    "allocates. Nothing of the model is allocated, so any model and world plans here.\n"
    "  params       trainable params as the rank holds them (shards when sharded)\n"
    "  grads        the gradients the optimizer update reads, live at the peak\n"
    "  optimizer    every optimizer state (Adam's m and v, step counters)\n"
    "  activations  inputs and forward values kept for the backward pass, at the peak\n"
    "  workspace    other temporaries at the peak, arena alignment and fragmentation,\n"
    "               the GEMM packing scratch\n"
    "  comm         collective buffers (all-reduce results, gathered params) at the peak\n"
    "  peak         their sum: STATE arena + WORK arena + GEMM scratch\n"
    "Without --zero-stage: a table for stages 0, 1, 2 and 3 with the ZeRO paper's\n"
    "formulas next to the model states (params + grads + optimizer).\n"
    "  --world N         ranks (default 1)\n"
    "  --mesh dp=D,sp=S  the ranks as a mesh, as dsc train's --mesh: with sp the\n"
    "                    step holds seq / S positions per rank (Ulysses); with tp\n"
    "                    1/P of the heads and hidden units (tensor parallelism)\n"
    "  --zero-stage S    one stage (0-3); with --json the stage of the object\n"
    "                    (default: the model's train.zero.stage)\n"
    "  --json            one JSON object: {\"param_count\", \"world\", \"stage\",\n"
    "                    \"precision\", \"master_weights\", \"bytes_per_param\": {\"P\", \"G\",\n"
    "                    \"K\"} (the formulas' bytes per param; K -1: none),\n"
    "                    \"ranks\": [{\"rank\", \"params\", \"grads\",\n"
    "                    \"optimizer\", \"activations\", \"workspace\", \"comm\", \"peak\",\n"
    "                    \"grads_held\", \"model_states\"}]} (bytes; model_states =\n"
    "                    params + grads_held + optimizer, the table's rows)\n"
    "  --batch B, --seq T, --grad-accum K, --global-batch G, --precision P\n"
    "                    as dsc train (the model's train section otherwise)\n"
    "  --bucket-bytes N, --prefetch-bytes N, --persist-threshold N, --unshard-bytes N,\n"
    "  --reduce-each-micro-batch B\n"
    "                    the ZeRO schedule, as dsc train (they change what is live)\n"
    "  --checkpoint-activations P  none, selective, block, blocks:K or offload, as dsc train\n"
    "  --deepspeed FILE  a DeepSpeed config, as dsc train (its batch triple, optimizer,\n"
    "                    precision, ZeRO and offload keys; the flags above override it);\n"
    "                    the table then shows DeepSpeed's memory estimators beside it\n"
    "  --print-config    print every setting of the plan and where it came from\n"
    "                    (as dsc train --print-config); no plan\n"
    "  --memory-budget B bytes one rank may use (e.g. 16GiB): says which stages fit;\n"
    "                    exit 1 when none of those planned does\n"
    "  --offload-optimizer T, --offload-param T  none, host or disk, as dsc train:\n"
    "                    the rows host and disk are what one rank holds there, and the\n"
    "                    device figures above them drop by as much; auto: only the\n"
    "                    values --memory-budget requires (listed under the table)\n"
    "  --offload-prefetch-bytes N  disk tier: reads started ahead of their use, at\n"
    "                    most N bytes in flight (default 64MiB; docs/memory.md)\n"
    "  --offload-io-threads N  disk tier: IO threads per rank (1-64, default 4)\n"
    "  --delayed-param-update true|false  as dsc train: one more gradient's bytes\n"
    "                    in the optimizer states\n"
    "  --offload-overlap true|false|auto  as dsc train: true and auto hold the\n"
    "                    host stream's host buffers to the step's end (the host\n"
    "                    work arena)\n"
    "  --zenflow true|false  as dsc train: the host's gradient sums, and the\n"
    "                    selected columns' moments on the device\n"
    "  --host-memory-budget B  host memory per rank for the offloaded values: a plan\n"
    "                    over it does not fit (exit 1), as with --memory-budget\n"
    "  --threads N       CPU threads the GEMM scratch is sized for (default: one per core)\n"
    "  --bytes           the table in bytes instead of KiB/MiB/GiB\n" CLI_AUTO_HELP
    "Exit codes: 0 success, 1 bad input (model, flags), 2 internal error.\n";

static bool exact_bytes; /* --bytes */
static int64_t host_budget; /* --host-memory-budget; 0: none */
static int64_t budget;   /* --memory-budget; 0: none */

static void human(char *buf, size_t n, int64_t b) {
  const char *unit[] = {"KiB", "MiB", "GiB", "TiB"};
  if (b < 1024 || exact_bytes) {
    snprintf(buf, n, "%" PRId64 " B", b);
    return;
  }
  double v = (double)b / 1024;
  int u = 0;
  while (v >= 1024 && u < 3) v /= 1024, u++;
  snprintf(buf, n, "%.2f %s", v, unit[u]);
}

/* Which of the n plans fit the memory budget, and by how much each misses
 * it, with the categories of what does not fit. */
static void budget_verdict(const dsc_memory_plan *p, int n, FILE *out) {
  char b[32], peak[32], over[32];
  human(b, sizeof b, budget);
  fprintf(out, "\nmemory budget %s per rank:\n", b);
  for (int i = 0; i < n; i++) {
    const dsc_plan_figures *r = &p[i].rank;
    human(peak, sizeof peak, r->peak);
    if (r->peak <= budget) {
      human(over, sizeof over, budget - r->peak);
      fprintf(out, "  stage %" PRId64 ": fits (peak %s, %s to spare)\n", p[i].stage, peak, over);
      continue;
    }
    human(over, sizeof over, r->peak - budget);
    fprintf(out, "  stage %" PRId64 ": does not fit: peak %s is %s over;", p[i].stage, peak, over);
    const char *name[6] = {"params", "grads", "optimizer", "activations", "workspace", "comm"};
    int64_t v[6] = {r->params, r->grads, r->optimizer, r->activations, r->workspace, r->comm};
    for (int k = 0; k < 6; k++) {
      human(b, sizeof b, v[k]);
      fprintf(out, " %s %s%s", name[k], b, k < 5 ? "," : "\n");
    }
  }
}

/* The first error of ctx, without location (a table cell's note). */
static const char *first_error(const dsc_context *ctx) {
  for (int i = 0; i < dsc_diag_count(ctx); i++) {
    const dsc_diag *d = dsc_diag_get(ctx, i);
    if (d->severity == DSC_DIAG_ERROR) return d->message;
  }
  return "failed";
}

/* The ZeRO paper's model-state bytes per rank at a stage: params P,
 * grads G, optimizer K bytes per parameter in f32 (Rajbhandari et al.,
 * section 5: Pos = (P+G)Psi + K Psi/N, Pos+g = P Psi + (G+K) Psi/N,
 * Pos+g+p = (P+G+K) Psi/N). */
static double zero_formula(int stage, double psi, double n, const dsc_memory_plan *p) {
  double P = p->p_bytes, G = p->g_bytes, K = p->k_bytes;
  switch (stage) {
    case 0:
      return (P + G + K) * psi;
    case 1:
      return (P + G) * psi + K * psi / n;
    case 2:
      return P * psi + (G + K) * psi / n;
    default:
      return (P + G + K) * psi / n;
  }
}

static const char *formula_text(int stage, bool master) {
  static const char *t[2][4] = {
      {"(4+4+K)Psi", "(4+4)Psi+K*Psi/N", "4Psi+(4+K)Psi/N", "(4+4+K)Psi/N"},
      {"(2+2+K)Psi", "(2+2)Psi+K*Psi/N", "2Psi+(2+K)Psi/N", "(2+2+K)Psi/N"}};
  return t[master][stage];
}

/* --host-memory-budget: the offloaded bytes of the planned stage (or of
 * every stage that plans) against the budget; true when one fits. */
static bool host_verdict(const dsc_plan_options *o, dsc_context *ctx) {
  bool any = false;
  for (int s = 0; s < 4; s++) {
    if (o->knobs.has_zero_stage && s != o->knobs.zero_stage) continue;
    dsc_plan_options so = *o;
    so.knobs.has_zero_stage = true, so.knobs.zero_stage = s;
    dsc_memory_plan p;
    dsc_diag_clear(ctx);
    if (dsc_plan_memory(ctx, &so, &p) != DSC_OK) continue;
    char h[32], b[32], over[32];
    human(h, sizeof h, p.host_bytes), human(b, sizeof b, host_budget);
    if (p.host_bytes <= host_budget) {
      any = true;
      fprintf(stderr, "  stage %d: host memory %s fits the host budget of %s\n", s, h, b);
    } else {
      human(over, sizeof over, p.host_bytes - host_budget);
      fprintf(stderr,
              "  stage %d: does not fit: host memory %s is %s over the host budget of %s "
              "(offloaded to disk, values take host memory only while a step runs)\n",
              s, h, over, b);
    }
  }
  dsc_diag_clear(ctx);
  return any;
}

/* Offload auto: which values moved off the device, and why (stage: the
 * column, or -1 for a lone plan). */
static void print_offload_auto(const dsc_memory_plan *p, int stage) {
  if (!p->offload_auto) return;
  char a[32], b[32], h[32], d[32];
  human(a, sizeof a, p->peak_no_offload), human(b, sizeof b, budget);
  if (stage >= 0) printf("stage %d: ", stage);
  if (p->n_offloaded == 0) {
    printf("offload auto: nothing offloaded: the device peak without offload, %s, fits the "
           "budget of %s\n", a, b);
    return;
  }
  human(h, sizeof h, p->offloaded_host), human(d, sizeof d, p->offloaded_disk);
  printf("offload auto: the device peak without offload, %s, is over the budget of %s: %d of "
         "%d values moved (host %s, disk %s; %d plans), furthest next use from the peak "
         "instruction first, then the largest:\n",
         a, b, p->n_offloaded, p->auto_candidates, h, d, p->auto_plans);
  for (int i = 0; i < p->n_offloaded && i < DSC_PLAN_OFFLOADED_MAX; i++) {
    const dsc_plan_offloaded *v = &p->offloaded[i];
    human(a, sizeof a, v->bytes);
    printf("  %-40s %-5s %12s  next use %" PRId64 " instructions after the peak\n", v->name,
           dsc_offload_name((dsc_offload_tier)v->tier), a, v->next_use);
  }
  if (p->n_offloaded > DSC_PLAN_OFFLOADED_MAX)
    printf("  (%d more)\n", p->n_offloaded - DSC_PLAN_OFFLOADED_MAX);
}

/* Each stage's collectives per step: group, kind, how many, one rank's bytes. */
static void print_collectives(const dsc_memory_plan *plans, const bool *ok) {
  bool any = false;
  for (int s = 0; s < 4; s++) any |= ok[s] && plans[s].n_collectives > 0;
  if (!any) return;
  printf("collectives per step (group kind x count: one rank's input bytes):\n");
  for (int s = 0; s < 4; s++) {
    if (!ok[s] || plans[s].n_collectives == 0) continue;
    printf("  stage %d:", s);
    for (int i = 0; i < plans[s].n_collectives; i++) {
      const dsc_plan_collective *c = &plans[s].collectives[i];
      char b[32];
      human(b, sizeof b, c->bytes);
      printf("%s %s %s x %" PRId64 ": %s", i ? "," : "", c->group, c->kind, c->count, b);
    }
    printf("\n");
  }
}

static void print_json(const dsc_memory_plan *p) {
  printf("{\"param_count\": %" PRId64 ", \"world\": %" PRId64 ", \"stage\": %" PRId64
         ", \"precision\": \"%s\", \"master_weights\": %s, \"bytes_per_param\": {\"P\": "
         "%d, \"G\": %d, \"K\": %d}, \"ranks\": [",
         p->param_count, p->world, p->stage, dsc_precision_name(p->precision),
         p->master_weights ? "true" : "false", p->p_bytes, p->g_bytes, p->k_bytes);
  const dsc_plan_figures *f = &p->rank;
  for (int64_t r = 0; r < p->world; r++)
    printf("%s{\"rank\": %" PRId64 ", \"params\": %" PRId64 ", \"grads\": %" PRId64
           ", \"optimizer\": %" PRId64 ", \"activations\": %" PRId64 ", \"workspace\": %" PRId64
           ", \"comm\": %" PRId64 ", \"peak\": %" PRId64 ", \"grads_held\": %" PRId64
           ", \"model_states\": %" PRId64 ", \"host\": %" PRId64 ", \"disk\": %" PRId64
           ", \"host_work\": %" PRId64 "}",
           r ? ", " : "", r, f->params, f->grads, f->optimizer, f->activations, f->workspace,
           f->comm, f->peak, p->grads_held, f->params + p->grads_held + f->optimizer,
           p->host_bytes, p->disk_bytes, p->host_work);
  printf("], \"collectives\": [");
  for (int i = 0; i < p->n_collectives; i++)
    printf("%s{\"group\": \"%s\", \"kind\": \"%s\", \"count\": %" PRId64 ", \"bytes\": %" PRId64
           "}",
           i ? ", " : "", p->collectives[i].group, p->collectives[i].kind, p->collectives[i].count,
           p->collectives[i].bytes);
  printf("]");
  if (p->offload_auto) {
    printf(", \"offload_auto\": {\"peak_no_offload\": %" PRId64 ", \"candidates\": %d, "
           "\"moved\": %d, \"host\": %" PRId64 ", \"disk\": %" PRId64 ", \"plans\": %d, "
           "\"values\": [",
           p->peak_no_offload, p->auto_candidates, p->n_offloaded, p->offloaded_host,
           p->offloaded_disk, p->auto_plans);
    for (int i = 0; i < p->n_offloaded && i < DSC_PLAN_OFFLOADED_MAX; i++)
      printf("%s{\"name\": \"%s\", \"tier\": \"%s\", \"bytes\": %" PRId64
             ", \"next_use\": %" PRId64 "}",
             i ? ", " : "", p->offloaded[i].name,
             dsc_offload_name((dsc_offload_tier)p->offloaded[i].tier), p->offloaded[i].bytes,
             p->offloaded[i].next_use);
    printf("]}");
  }
  printf("}\n");
}

static void print_table(const char *model, const dsc_memory_plan *plans, const bool *ok,
                        char errs[4][600]) {
  const dsc_memory_plan *p0 = &plans[0];
  char b[64];
  printf("memory plan of %s: %" PRId64 " trainable params (Psi), world N = %" PRId64
         ", %s, batch %" PRId64 " x seq %" PRId64 " x grad_accum %" PRId64 " per rank\n",
         model, p0->param_count, p0->world, dsc_precision_name(p0->precision), p0->batch, p0->seq,
         p0->grad_accum);
  if (p0->sp > 1)
    printf("sequence parallel over sp = %" PRId64 " ranks: each holds %" PRId64 " of the %" PRId64
           " positions of its sequences (Ulysses)\n",
           p0->sp, p0->seq / p0->sp, p0->seq);
  if (p0->tp > 1)
    printf("tensor parallel over tp = %" PRId64 " ranks: each computes 1/%" PRId64
           " of every attention's heads and MLP's hidden units; norms, embeddings and the "
           "output layer whole\n",
           p0->tp, p0->tp);
  printf("bytes per rank (rank 0; every rank runs the same program and holds the same bytes%s)\n",
         p0->world > 1 ? ", shards padded to a multiple of N" : "");
  printf("\n%-16s", "");
  for (int s = 0; s < 4; s++)
    printf("%18s", s == 0 ? "stage 0" : s == 1 ? "stage 1" : s == 2 ? "stage 2" : "stage 3");
  printf("\n");
  struct {
    const char *name;
    size_t off;
  } rows[] = {
      {"params", offsetof(dsc_memory_plan, rank.params)},
      {"grads", offsetof(dsc_memory_plan, rank.grads)},
      {"optimizer", offsetof(dsc_memory_plan, rank.optimizer)},
      {"activations", offsetof(dsc_memory_plan, rank.activations)},
      {"workspace", offsetof(dsc_memory_plan, rank.workspace)},
      {"comm", offsetof(dsc_memory_plan, rank.comm)},
      {"peak", offsetof(dsc_memory_plan, rank.peak)},
      {"  STATE arena", offsetof(dsc_memory_plan, state_arena)},
      {"  WORK arena", offsetof(dsc_memory_plan, work_arena)},
      {"  GEMM scratch", offsetof(dsc_memory_plan, gemm_scratch)},
      {"host (offload)", offsetof(dsc_memory_plan, host_bytes)},
      {"  host work", offsetof(dsc_memory_plan, host_work)},
      {"disk (offload)", offsetof(dsc_memory_plan, disk_bytes)},
      {"grads held", offsetof(dsc_memory_plan, grads_held)},
  };
  for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
    printf("%-16s", rows[r].name);
    for (int s = 0; s < 4; s++) {
      if (!ok[s]) {
        printf("%18s", "-");
        continue;
      }
      human(b, sizeof b, *(const int64_t *)((const char *)&plans[s] + rows[r].off));
      printf("%18s", b);
    }
    printf("\n");
  }
  /* model states against the formulas */
  printf("%-16s", "model states");
  for (int s = 0; s < 4; s++) {
    if (!ok[s]) {
      printf("%18s", "-");
      continue;
    }
    const dsc_plan_figures *f = &plans[s].rank;
    human(b, sizeof b, f->params + plans[s].grads_held + f->optimizer);
    printf("%18s", b);
  }
  printf("\n");
  int k = p0->k_bytes;
  if (k >= 0) {
    printf("%-16s", "  ZeRO formula");
    for (int s = 0; s < 4; s++) printf("%18s", formula_text(s, p0->master_weights));
    printf("\n%-16s", "");
    for (int s = 0; s < 4; s++) {
      human(b, sizeof b,
            (int64_t)(zero_formula(s, (double)p0->param_count, (double)p0->world, p0) + 0.5));
      printf("%18s", b);
    }
    printf("\n");
    if (p0->master_weights)
      printf("\nK = %d (optimizer state bytes per param: the f32 master weights and the "
             "moments; the params\nand gradients are %s, 2 bytes each, as the paper counts "
             "mixed precision). ",
             k, dsc_precision_name(p0->precision));
    else if (p0->precision != DSC_PRECISION_F32)
      printf("\nK = %d (optimizer state bytes per param, f32). master_weights false: the f32 "
             "params are the\nmaster weights and the gradients f32, so the paper's "
             "(2+2+4+K)Psi appear as (4+4+K)Psi;\nthe %s param copies are transient "
             "(activations/workspace). ",
             k, dsc_precision_name(p0->precision));
    else
      printf("\nK = %d (optimizer state bytes per param, f32). ", k);
    printf(
        "grads: the gradient bytes live at the peak\n"
        "instruction; grads held: the most live at once (all of them at the update). Model\n"
        "states = params + grads held + optimizer; optimizer also holds the scalar states\n"
        "(opt.step: 4 bytes).\n");
  } else {
    printf("\n(no ZeRO formula for this optimizer: its state bytes per param differ by param)\n");
  }
  for (int s = 0; s < 4; s++)
    if (ok[s] && plans[s].sharded)
      printf("stage %d: shard padding: rank 0 holds %" PRId64 " B of params and %" PRId64
             " B of optimizer states as zeros, rank %" PRId64 " %" PRId64 " B and %" PRId64 " B\n",
             s, plans[s].pad_params[0], plans[s].pad_states[0], plans[s].world - 1,
             plans[s].pad_params[1], plans[s].pad_states[1]);
  if (p0->gemm_scratch > 0)
    printf("GEMM scratch: the f32 GEMMs' packing buffers for %d threads (--threads)\n",
           p0->threads);
  for (int s = 0; s < 4; s++)
    if (ok[s]) print_offload_auto(&plans[s], s);
  print_collectives(plans, ok);
  for (int s = 0; s < 4; s++)
    if (!ok[s]) printf("stage %d: %s\n", s, errs[s]);
  if (p0->world == 1) printf("at world 1 every stage runs as stage 0 (nothing to shard)\n");
}

/* --deepspeed: DeepSpeed's estimate_zero2/3_model_states_mem_needs for the
 * same model and world (one node of N GPUs), each row beside dsc's exact
 * plan with the same offload, and the terms that differ. */
static int deepspeed_estimates(const dsc_plan_options *o, dsc_context *ctx) {
  static const struct {
    int stage;
    bool opt, param, zero_init;
  } rows[] = {{2, true, false, true},  {2, false, false, true}, {3, true, true, true},
              {3, true, true, false},  {3, true, false, true},  {3, true, false, false},
              {3, false, false, true}, {3, false, false, false}};
  int64_t n = o->world > 1 ? o->world : 1;
  dsc_memory_plan p;
  char a[32], b[32], c[32], d[32], e[32];
  bool head = false;
  for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
    dsc_plan_options so = *o;
    so.knobs.has_zero_stage = true, so.knobs.zero_stage = rows[r].stage;
    so.knobs.has_offload_optimizer = so.knobs.has_offload_param = true;
    so.knobs.offload_optimizer = rows[r].opt ? DSC_OFFLOAD_HOST : DSC_OFFLOAD_NONE;
    so.knobs.offload_param = rows[r].param ? DSC_OFFLOAD_HOST : DSC_OFFLOAD_NONE;
    dsc_diag_clear(ctx);
    dsc_status st = dsc_plan_memory(ctx, &so, &p);
    if (st != DSC_OK) {
      /* param offload plans at world > 1 only: DeepSpeed's row alone */
      if (n > 1 || !rows[r].param) return dsc_diag_print(ctx, stderr), cli_exit_code(st);
      p.rank.params = p.grads_held = p.rank.optimizer = p.rank.peak = p.host_bytes = -1;
    }
    if (!head) {
      human(a, sizeof a, p.largest_param * 4);
      printf("\nDeepSpeed's estimators (deepspeed.runtime.zero: estimate_zero2/3_model_states_"
             "mem_needs) for Psi = %" PRId64 "\nand the largest layer %s (%" PRId64
             " params, 4 bytes each: %s) on 1 node x %" PRId64 " GPUs,\nadditional_buffer_factor "
             "1.5, beside dsc's exact plan with the same offload:\n\n",
             p.param_count, p.largest_name, p.largest_param, a, n);
      printf("%-6s %-14s %-17s %-9s | %12s %12s | %13s %12s %12s\n", "stage", "offload_param",
             "offload_optimizer", "zero_init", "DS per CPU", "DS per GPU", "dsc host/node",
             "dsc states", "dsc peak");
      head = true;
    }
    dsc_deepspeed_estimate de = dsc_deepspeed_estimate_zero(
        rows[r].stage, p.param_count, p.largest_param, n, 1, rows[r].opt, rows[r].param,
        rows[r].zero_init, 1.5);
    human(a, sizeof a, de.cpu), human(b, sizeof b, de.gpu);
    bool have = p.rank.peak >= 0;
    if (have) {
      human(c, sizeof c, p.host_bytes * n); /* every rank of the node holds as much */
      human(d, sizeof d, p.rank.params + p.grads_held + p.rank.optimizer);
      human(e, sizeof e, p.rank.peak);
    }
    printf("%-6d %-14s %-17s %-9s | %12s %12s | %13s %12s %12s\n", rows[r].stage,
           rows[r].stage == 2 ? "-" : rows[r].param ? "cpu" : "none", rows[r].opt ? "cpu" : "none",
           rows[r].stage == 2 ? "-" : rows[r].zero_init ? "1" : "0", a, b, have ? c : "-",
           have ? d : "-", have ? e : "(world 1)");
  }
  printf(
      "\nThe terms that differ: DeepSpeed's per GPU is model states alone (fp16 params and\n"
      "gradients 2 + 2 Psi where not sharded, 16 Psi/N of fp32 master, moments and gradient\n"
      "partition, and at stage 3 the largest layer's params gathered in fp32, 4 bytes each);\n"
      "dsc states are the same model states as its plan holds them ((2+2+12) Psi sharded by\n"
      "the stage, the reduced gradient kept in bf16: 14 not 16 Psi/N), and dsc peak adds\n"
      "what DeepSpeed's estimate leaves out: activations, workspace, the gathered params and\n"
      "collective buffers. DeepSpeed's per CPU multiplies its counts by the buffer factor 1.5\n"
      "(zero_init 0: every GPU of the node loads an fp32 copy of the model; dsc initialises\n"
      "each shard where it lives, as zero_init 1); dsc host/node is the host tier it plans,\n"
      "to the byte, for the node's N ranks; dsc states and peak are per rank (per GPU).\n");
  return CLI_EXIT_OK;
}

/* --auto: the search (tools/cmd_auto.c) instead of the table */
static int plan_auto(const dsc_plan_options *o, const cli_auto *au, bool json) {
  if (budget <= 0)
    return cli_usage_error("plan", "--auto needs --memory-budget B (bytes one rank may use)"),
           CLI_EXIT_USER;
  dsc_context *ctx = dsc_context_new(NULL, NULL);
  dsc_autocfg_result *res = malloc(sizeof *res);
  if (!ctx || !res) {
    free(res);
    dsc_context_free(ctx);
    return fputs("dsc: out of memory\n", stderr), CLI_EXIT_INTERNAL;
  }
  dsc_autocfg_options ao;
  memset(&ao, 0, sizeof ao);
  ao.base = *o;
  ao.memory_budget = budget;
  int code = cli_auto_run("plan", ctx, au, &ao, json, stdout, res);
  free(res);
  dsc_context_free(ctx);
  return code;
}

int cli_plan(int argc, char **argv) {
  dsc_plan_options o;
  memset(&o, 0, sizeof o);
  o.world = 1;
  bool json = false, print_config = false;
  cli_auto au;
  memset(&au, 0, sizeof au);
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    int64_t v = 0;
    int auto_k, knob_k;
    bool has_val = i + 1 < argc;
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      fputs(plan_help, stdout);
      return CLI_EXIT_OK;
    } else if (strcmp(a, "--json") == 0) {
      json = true;
    } else if (strcmp(a, "--print-config") == 0) {
      print_config = true;
    } else if (strcmp(a, "--deepspeed") == 0 || strcmp(a, "--config") == 0 ||
               strcmp(a, "--deepspeed_config") == 0) {
      if (!has_val || !argv[i + 1][0])
        return cli_usage_error("plan", "%s needs a ds_config.json file", a), CLI_EXIT_USER;
      o.ds_config = argv[++i];
    } else if (strcmp(a, "--bytes") == 0) {
      exact_bytes = true;
    } else if (strcmp(a, "--mesh") == 0) {
      if (!has_val)
        return cli_usage_error("plan", "--mesh needs axes such as dp=2,sp=4"), CLI_EXIT_USER;
      o.mesh = argv[++i];
    } else if (strcmp(a, "--precision") == 0) {
      dsc_precision pr;
      if (!has_val || dsc_precision_from_name(argv[i + 1], &pr) != 0)
        return cli_usage_error("plan", "--precision needs one of f32, bf16, fp16"), CLI_EXIT_USER;
      o.precision = argv[++i];
    } else if ((knob_k = cli_knob_flag("plan", argc, argv, &i, &o.knobs)) != 0) {
      if (knob_k < 0) return CLI_EXIT_USER;
    } else if (strcmp(a, "--world") == 0 || strcmp(a, "--batch") == 0 || strcmp(a, "--seq") == 0 ||
               strcmp(a, "--grad-accum") == 0 || strcmp(a, "--threads") == 0) {
      int64_t hi = strcmp(a, "--world") == 0     ? 65536
                   : strcmp(a, "--threads") == 0 ? 1024
                                                 : ((int64_t)1 << 40);
      if (!has_val || !cli_parse_i64(argv[i + 1], &v) || v < 1 || v > hi)
        return cli_usage_error("plan", "%s needs an integer in [1, %" PRId64 "], got '%s'", a, hi,
                               has_val ? argv[i + 1] : ""),
               CLI_EXIT_USER;
      i++;
      if (strcmp(a, "--world") == 0)
        o.world = v;
      else if (strcmp(a, "--batch") == 0)
        o.batch = v;
      else if (strcmp(a, "--seq") == 0)
        o.seq = v;
      else if (strcmp(a, "--grad-accum") == 0)
        o.grad_accum = v;
      else
        o.threads = (int)v;
    } else if (strcmp(a, "--host-memory-budget") == 0) {
      if (!has_val || !cli_parse_bytes(argv[i + 1], &host_budget) || host_budget <= 0)
        return cli_usage_error("plan", "--host-memory-budget needs a byte count such as 64GiB"),
               CLI_EXIT_USER;
      o.host_memory_budget = host_budget;
      i++;
    } else if (strcmp(a, "--memory-budget") == 0) {
      if (!has_val || !cli_parse_bytes(argv[i + 1], &budget) || budget <= 0)
        return cli_usage_error("plan", "--memory-budget needs a byte count such as 16GiB"),
               CLI_EXIT_USER;
      i++;
    } else if ((auto_k = cli_auto_flag("plan", argc, argv, &i, &au)) != 0) {
      if (auto_k < 0) return CLI_EXIT_USER;
    } else if (a[0] == '-' && a[1]) {
      return cli_usage_error("plan", "unknown option '%s'", a), CLI_EXIT_USER;
    } else if (o.model_path) {
      return cli_usage_error("plan", "one model file at a time"), CLI_EXIT_USER;
    } else {
      o.model_path = a;
    }
  }
  if (!o.model_path) return cli_usage_error("plan", "missing model file"), CLI_EXIT_USER;
  if (print_config) { /* the settings a plan is of: as dsc train resolves them */
    dsc_trainer_options to;
    memset(&to, 0, sizeof to);
    to.model_path = o.model_path, to.batch = o.batch, to.seq = o.seq, to.grad_accum = o.grad_accum;
    to.precision = o.precision, to.knobs = o.knobs, to.ds_config = o.ds_config;
    to.offload_dir = o.offload_dir, to.save_every = to.eval_every = -1;
    dsc_context *pctx = dsc_context_new(NULL, NULL);
    if (!pctx) return fputs("dsc: out of memory\n", stderr), CLI_EXIT_INTERNAL;
    dsc_status st = dsc_trainer_print_config(pctx, &to, (int)(o.world > 1 ? o.world : 1), stdout);
    dsc_diag_print(pctx, stderr);
    dsc_context_free(pctx);
    return cli_exit_code(st);
  }
  o.memory_budget = budget; /* offload auto fits it */
  if (!o.offload_dir) o.offload_dir = au.offload_dir;
  if (au.on) return plan_auto(&o, &au, json);

  dsc_context *ctx = dsc_context_new(NULL, NULL);
  if (!ctx) return fputs("dsc: out of memory\n", stderr), CLI_EXIT_INTERNAL;
  cli_catch_signals(ctx); /* Ctrl-C stops the build of the graphs (exit 130) */
  int code = CLI_EXIT_OK;
  bool fits_any = false;
  if (json || o.knobs.has_zero_stage) {
    dsc_memory_plan p;
    dsc_status st = dsc_plan_memory(ctx, &o, &p);
    dsc_diag_print(ctx, stderr);
    if (st != DSC_OK) {
      code = cli_exit_code(st);
    } else if (json) {
      print_json(&p);
      fits_any = p.rank.peak <= budget;
      if (budget > 0 && !fits_any) budget_verdict(&p, 1, stderr);
    } else {
      fits_any = p.rank.peak <= budget;
      /* one stage: its column alone */
      dsc_memory_plan plans[4];
      bool ok[4] = {false, false, false, false};
      char errs[4][600];
      for (int s = 0; s < 4; s++) {
        plans[s] = p;
        snprintf(errs[s], sizeof errs[s], "not planned (--zero-stage %" PRId64 ")",
                 o.knobs.zero_stage);
      }
      ok[o.knobs.zero_stage] = true;
      if (o.knobs.zero_stage != 0) plans[0] = p; /* the header's facts */
      print_table(o.model_path, plans, ok, errs);
      if (budget > 0) budget_verdict(&p, 1, stdout);
    }
  } else {
    dsc_memory_plan plans[4];
    bool ok[4];
    char errs[4][600];
    for (int s = 0; s < 4 && code == CLI_EXIT_OK; s++) {
      dsc_plan_options so = o;
      so.knobs.has_zero_stage = true, so.knobs.zero_stage = s;
      dsc_diag_clear(ctx);
      dsc_status st = dsc_plan_memory(ctx, &so, &plans[s]);
      ok[s] = st == DSC_OK;
      errs[s][0] = 0;
      if (ok[s]) continue;
      /* the model itself is at fault: say so and stop (param offload plans
       * at stage 3 only) */
      bool param_offload = o.knobs.has_offload_param && o.knobs.offload_param != DSC_OFFLOAD_NONE;
      if ((s == 0 && !param_offload) || st == DSC_ERR_INTERRUPTED || cli_signal) {
        dsc_diag_print(ctx, stderr);
        code = cli_exit_code(st);
      } else {
        snprintf(errs[s], sizeof errs[s], "%s", first_error(ctx));
      }
    }
    /* the header's facts from the first stage that planned (param offload: 3) */
    for (int s = 1; code == CLI_EXIT_OK && !ok[0] && s < 4; s++)
      if (ok[s]) {
        plans[0] = plans[s];
        break;
      }
    if (code == CLI_EXIT_OK) print_table(o.model_path, plans, ok, errs);
    if (code == CLI_EXIT_OK && budget > 0) {
      int n = 0;
      for (int s = 0; s < 4; s++)
        if (ok[s]) plans[n++] = plans[s], fits_any |= plans[s].rank.peak <= budget;
      budget_verdict(plans, n, stdout);
    }
  }
  if (code == CLI_EXIT_OK && !json && o.ds_config) code = deepspeed_estimates(&o, ctx);
  if (code == CLI_EXIT_OK && budget > 0 && !fits_any) code = CLI_EXIT_USER;
  if (code == CLI_EXIT_OK && host_budget > 0 && !host_verdict(&o, ctx)) code = CLI_EXIT_USER;
  dsc_context_free(ctx);
  return code;
}
