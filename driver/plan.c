/* dsc_plan_memory (include/dsc/memplan.h): the modules `dsc train` builds
 * (driver/build.c: drv_compile_step and drv_build_graphs, the same
 * settings), lowered and read by codegen/memplan.c. Nothing is allocated for
 * the model's values and nothing runs, so a plan for 64 ranks of GPT-2 takes
 * the time of one compile on any machine. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "codegen/codegen.h"
#include "driver/driver.h"
#include "dsc/autocfg.h"
#include "dsc/memplan.h"

/* Graph g's collective starts, `times` per step, into the plan's table. */
static void count_collectives(const dsc_graph *g, int64_t times, dsc_memory_plan *out) {
  for (int i = 0; g && i < g->n_nodes; i++) {
    const ir_node *x = g->nodes[i];
    if (!ir_is_collective_start(x->op)) continue;
    const char *group = ir_collective_group(x), *name = ir_op(x->op)->name;
    char kind[16];
    snprintf(kind, sizeof kind, "%.*s", (int)(strlen(name) - strlen("_start")), name);
    int k = 0;
    while (k < out->n_collectives && (strcmp(out->collectives[k].group, group) != 0 ||
                                      strcmp(out->collectives[k].kind, kind) != 0))
      k++;
    if (k == DSC_PLAN_COLL_MAX) continue; /* more pairs than the ops and groups make */
    dsc_plan_collective *c = &out->collectives[k];
    if (k == out->n_collectives) {
      out->n_collectives++;
      snprintf(c->group, sizeof c->group, "%s", group);
      snprintf(c->kind, sizeof c->kind, "%s", kind);
    }
    const dsc_type *t = &x->in[0]->type;
    c->count += times;
    c->bytes += times * dsc_type_numel(t) * (int64_t)dsc_dtype_size(t->dtype);
  }
}

static dsc_status plan_inner(dsc_context *ctx, const dsc_plan_options *o, dsc_module **m,
                             dsc_memory_plan *out, dsc_step_work *work) {
  if (!o->model_path) {
    ir_error(ctx, ir_no_loc, "plan: a model file is required");
    return DSC_ERR_USER;
  }
  if (drv_is_program(o->model_path)) {
    ir_error(ctx, rt_loc(o->model_path),
             "is a compiled program (.dsx); dsc plan takes the model file (.dsm)");
    return DSC_ERR_USER;
  }
  int64_t world = o->world > 1 ? o->world : 1;
  if (o->batch < 0 || o->seq < 0 || o->grad_accum < 0 || world > INT32_MAX) {
    ir_error(ctx, ir_no_loc,
             "plan: batch, seq and grad_accum must not be negative, world at most 2^31-1");
    return DSC_ERR_USER;
  }
  /* a ds_config: DeepSpeed's batch triple before the compile, its other
   * settings over the train section after it (as dsc train) */
  int64_t B = o->batch, K = o->grad_accum;
  drv_ds_config ds;
  ir_arena arena;
  ir_arena_init(&arena, ctx);
  dsc_status st = DSC_OK;
  if (o->ds_config && (st = drv_ds_config_read(ctx, o->ds_config, &arena, &ds)) == DSC_OK) {
    int64_t micro, accum;
    st = drv_ds_config_batch(ctx, &ds, world, o->batch, o->grad_accum, &micro, &accum);
    if (B <= 0 && micro > 0) B = micro;
    if (K <= 0 && accum > 0) K = accum;
  }
  drv_model_facts f;
  dsc_mesh_shape shape;
  drv_mesh_axes axes = {1, 1, 1};
  if (st == DSC_OK) st = drv_mesh(ctx, o->mesh, world, &shape, &axes);
  if (st == DSC_OK) st = drv_compile_step(ctx, o->model_path, B, o->seq, axes.sp, m, &f);
  if (st == DSC_OK && o->ds_config) st = drv_ds_config_apply(ctx, &ds, *m);
  bool has_dir = o->offload_dir != NULL || (o->ds_config && st == DSC_OK && ds.offload_dir);
  ir_arena_release(&arena);
  if (st != DSC_OK) return st;
  dsc_train_config cfg;
  if ((st = dsc_train_config_from_module(*m, &cfg)) != DSC_OK) return st;
  cfg.batch = f.B, cfg.seq = f.T;
  drv_run_settings rs = {.who = "plan",
                         .B = f.B,
                         .world = world,
                         .mesh = axes,
                         .grad_accum = K,
                         .precision = o->precision,
                         .knobs = &o->knobs};
  if ((st = drv_apply_run_settings(ctx, &rs, &cfg)) != DSC_OK) return st;
  /* offload auto: the values the budget requires (driver/offload_auto.c) */
  drv_offload_budget ob = {o->memory_budget, o->host_memory_budget, has_dir,
                           o->threads, o->offload_auto_lenient};
  drv_offload_report rep;
  st = drv_offload_auto(ctx, o->model_path, &cfg, &ob, &rep);
  if (st == DSC_OK) st = drv_build_graphs(ctx, o->model_path, *m, &cfg, DSC_BACKEND_CPU, false, NULL);
  drv_offload_report_to_plan(&rep, out);
  drv_offload_report_free(&rep);
  cfg.offload.values = NULL;
  if (st != DSC_OK || (st = drv_check_step(ctx, *m, f.B * cfg.grad_accum, f.T_rank)) != DSC_OK)
    return st;
  cg_memplan p;
  if ((st = drv_plan_step_work(ctx, *m, o->threads, &p, work)) != DSC_OK) return st;
  out->rank = (dsc_plan_figures){p.bytes[CG_MEM_PARAMS],
                                 p.bytes[CG_MEM_GRADS],
                                 p.bytes[CG_MEM_OPTIMIZER],
                                 p.bytes[CG_MEM_ACTIVATIONS],
                                 p.bytes[CG_MEM_WORKSPACE],
                                 p.bytes[CG_MEM_COMM],
                                 p.peak};
  count_collectives(dsc_module_find_graph(*m, "micro_step"), cfg.grad_accum, out);
  count_collectives(dsc_module_find_graph(*m, "train_step"), 1, out);
  out->param_count = p.param_count;
  out->grads_held = p.grads_held;
  out->world = world;
  out->sp = axes.sp;
  out->tp = axes.tp;
  out->stage = cfg.zero.stage;
  out->precision = cfg.precision;
  out->optimizer = cfg.opt.kind;
  out->master_weights = cfg.master_weights && cfg.precision != DSC_PRECISION_F32;
  out->p_bytes = out->g_bytes = out->master_weights ? 2 : 4;
  out->k_bytes = cfg.opt.kind == DSC_OPT_ADAMW ? 8
                 : cfg.opt.kind == DSC_OPT_SGD ? (cfg.opt.momentum > 0 ? 4 : 0)
                                               : -1;
  if (out->k_bytes >= 0 && out->master_weights) out->k_bytes += 4; /* the f32 master */
  if (out->k_bytes >= 0 && cfg.offload.delayed_update) /* the f32 gradient kept */
    out->k_bytes += 4;
  if (out->k_bytes >= 0 && cfg.zenflow.enabled) /* the host's f32 gradient sums */
    out->k_bytes += 4;
  out->batch = cfg.batch, out->seq = cfg.seq, out->grad_accum = cfg.grad_accum;
  out->state_arena = p.state_arena, out->work_arena = p.work_arena;
  out->gemm_scratch = p.gemm_scratch, out->padding = p.padding;
  out->threads = drv_default_threads(o->threads);
  out->peak_instr = p.peak_instr, out->n_instrs = p.n_instrs;
  out->sharded = p.sharded;
  out->host_bytes = p.host_bytes, out->disk_bytes = p.disk_bytes;
  out->host_work = p.host_work;
  out->largest_param = 0;
  out->largest_name[0] = 0;
  for (int i = 0; i < dsc_module_param_count(*m); i++) {
    dsc_type full;
    int64_t w;
    if (dsc_module_param_is_state(*m, i) || dsc_module_param_shard(*m, i, &full, &w) < 0) continue;
    if (dsc_type_numel(&full) > out->largest_param) {
      out->largest_param = dsc_type_numel(&full);
      snprintf(out->largest_name, sizeof out->largest_name, "%s", dsc_module_param_name(*m, i));
    }
  }
  int64_t ranks[2] = {0, world - 1};
  for (int i = 0; i < 2; i++) {
    out->pad_params[i] = cg_memplan_shard_padding(*m, ranks[i], false);
    out->pad_states[i] = cg_memplan_shard_padding(*m, ranks[i], true);
  }
  return DSC_OK;
}

dsc_deepspeed_estimate dsc_deepspeed_estimate_zero(int stage, int64_t psi, int64_t largest,
                                                    int64_t gpus_per_node, int64_t nodes,
                                                    bool cpu_offload, bool cpu_offload_params,
                                                    bool zero_init, double buffer_factor) {
  double P = (double)psi, gpus = (double)(nodes * gpus_per_node), per_node = (double)gpus_per_node;
  double cpu, gpu;
  if (stage == 2) {
    /* fp16 params 2 Psi; without offload also fp16 grads 2 Psi and 16 Psi / N
     * of fp32 master, moments and gradient partition */
    gpu = cpu_offload ? 2 * P : 4 * P + floor(16 * P / gpus);
    cpu = cpu_offload ? P * fmax(4 * gpus, 16) * buffer_factor : P * 4 * per_node * buffer_factor;
  } else {
    double layer = 4.0 * (double)largest, nf = 1.0 / (double)nodes;
    if (cpu_offload && cpu_offload_params) {
      gpu = layer;
      cpu = zero_init ? P * 18 * nf * buffer_factor : P * fmax(4 * per_node, 18 * nf) * buffer_factor;
    } else if (cpu_offload) {
      gpu = layer + floor(2 * P / gpus);
      cpu = zero_init ? P * 16 * nf * buffer_factor : P * fmax(4 * per_node, 16 * nf) * buffer_factor;
    } else {
      gpu = layer + floor(18 * P / gpus);
      cpu = zero_init ? (double)largest * 4 * per_node * buffer_factor : P * 4 * per_node * buffer_factor;
    }
  }
  dsc_deepspeed_estimate e = {(int64_t)cpu, (int64_t)gpu};
  return e;
}

dsc_status dsc_plan_memory(dsc_context *ctx, const dsc_plan_options *o, dsc_memory_plan *out) {
  return dsc_plan_memory_work(ctx, o, out, NULL);
}

dsc_status dsc_plan_memory_work(dsc_context *ctx, const dsc_plan_options *o,
                                dsc_memory_plan *out, dsc_step_work *work) {
  memset(out, 0, sizeof *out);
  if (work) memset(work, 0, sizeof *work);
  dsc_module *m = NULL;
  dsc_status st = plan_inner(ctx, o, &m, out, work);
  dsc_module_free(m);
  if (st != DSC_OK && work) dsc_step_work_free(work);
  return st;
}
