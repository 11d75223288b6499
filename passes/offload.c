/* Pass "offload" (issue 7 item 2; docs/memory.md "Offload"): moves values
 * of the step module off the device, ZeRO-Offload / ZeRO-Infinity style.
 *
 * Offload is a placement change (DESIGN.md): the graph computes the same
 * values, so the interpreter (which has no tiers) stays the reference, and
 * the pass only records where each value lives, as module meta
 * "tier.<name>" = "host" | "disk" (absent: the device), printed and parsed
 * back with the text IR like zero.c's "shard.<name>". The code generator
 * (codegen/program.c cg_state_layout_tiers) gives each tier its own arena
 * (host) or file slot with a staging arena (disk); the executors
 * (runtime/exec.c) read disk values before a run and write them after.
 *
 *   optimizer host|disk  every module state (opt.m.*, opt.v.*, momentum,
 *                        ZenFlow's host sums; host is implied by ZenFlow,
 *                        whose device states carry meta "place.<name>"),
 *                        the step count, fp16's loss-scale scalars). dsc's
 *                        f32 master weights are the params themselves (the
 *                        bf16 copies are transient), so they move with
 *                        --offload-param, not here.
 *   param host|disk      at ZeRO stage 3 (world > 1): every sharded param
 *                        (meta "shard.<name>"); params kept whole by
 *                        --persist-threshold stay on the device.
 *   auto                 (either class) only the values listed in
 *                        cfg->offload.values, with their tiers: the driver
 *                        chose them for the memory budget
 *                        (driver/offload_auto.c). */
#include <stdio.h>
#include <string.h>

#include "passes/passes.h"

static dsc_status set_tier(ir_module *m, const char *name, dsc_offload_tier t) {
  char key[600];
  if ((size_t)snprintf(key, sizeof key, "tier.%s", name) >= sizeof key) {
    ir_error(m->ctx, ir_no_loc, "offload: param name '%s' is too long", name);
    return DSC_ERR_USER;
  }
  return dsc_module_set_meta(m, key, dsc_offload_name(t));
}

/* Adaptive offload (auto): the tiers the driver chose value by value
 * (driver/offload_auto.c), each a state of an auto optimizer class or a
 * param shard of an auto param class. */
static dsc_status offload_values(ir_module *m, const dsc_train_config *cfg) {
  if (!cfg->offload.values && cfg->offload.n_values == 0) {
    ir_error(m->ctx, ir_no_loc,
             "offload: auto needs a memory budget to choose what to offload (dsc train and dsc "
             "plan: --memory-budget B); here give the tiers: none, host or disk");
    return DSC_ERR_USER;
  }
  for (int k = 0; k < cfg->offload.n_values; k++) {
    const dsc_offload_value *v = &cfg->offload.values[k];
    int i = dsc_module_find_param(m, v->name);
    char key[600];
    snprintf(key, sizeof key, "shard.%s", v->name);
    bool ok = i >= 0 && (v->tier == DSC_OFFLOAD_HOST || v->tier == DSC_OFFLOAD_DISK) &&
              (m->params[i].state ? cfg->offload.optimizer == DSC_OFFLOAD_AUTO
                                  : cfg->offload.param == DSC_OFFLOAD_AUTO &&
                                        dsc_module_get_meta(m, key) != NULL);
    if (!ok) {
      ir_error(m->ctx, ir_no_loc,
               "offload: auto cannot move '%s' to %s (it moves module states with "
               "--offload-optimizer auto and param shards with --offload-param auto, to host "
               "or disk)",
               v->name, dsc_offload_name(v->tier));
      return DSC_ERR_USER;
    }
    dsc_status s = set_tier(m, v->name, v->tier);
    if (s != DSC_OK) return s;
  }
  return DSC_OK;
}

dsc_status pass_offload_run(ir_module *m, const dsc_train_config *cfg) {
  if (!cfg) return DSC_OK;
  dsc_offload_tier opt = cfg->offload.optimizer, par = cfg->offload.param;
  if (cfg->zenflow.enabled && opt == DSC_OFFLOAD_NONE) /* ZenFlow's host part */
    opt = DSC_OFFLOAD_HOST;
  /* where there is host work (the host step, activation offload), the
   * lowering puts it and the tier copies on the executor's host stream
   * (codegen/lower.c mark_host_stream): "true" on a thread of its own
   * always, "auto" where a core is free for it */
  bool host_work = opt == DSC_OFFLOAD_HOST || cfg->remat == DSC_REMAT_OFFLOAD;
  if (host_work && cfg->offload.overlap != DSC_SWITCH_FALSE &&
      dsc_module_set_meta(m, "offload.overlap", dsc_switch_name(cfg->offload.overlap)) != DSC_OK)
    return DSC_ERR_INTERNAL;
  if (opt == DSC_OFFLOAD_NONE && par == DSC_OFFLOAD_NONE) return DSC_OK;
  if (!dsc_module_find_graph(m, "train_step")) {
    ir_error(m->ctx, ir_no_loc, "offload: the module has no graph 'train_step' (run pass "
                                "'optimizer' first)");
    return DSC_ERR_USER;
  }
  if (par != DSC_OFFLOAD_NONE) {
    /* the typed settings: pass zero, which ran before, shards at stage 3 */
    if (cfg->world <= 1 || cfg->zero.stage != 3) {
      ir_error(m->ctx, ir_no_loc,
               "--offload-param %s needs ZeRO stage 3 at world > 1 (the param shards are what "
               "is offloaded), got stage %lld at world %lld; use --zero-stage 3 with --ranks N, "
               "or --offload-optimizer",
               dsc_offload_name(par), (long long)cfg->zero.stage,
               (long long)(cfg->world > 1 ? cfg->world : 1));
      return DSC_ERR_USER;
    }
  }
  if (opt == DSC_OFFLOAD_AUTO || par == DSC_OFFLOAD_AUTO) {
    dsc_status s = offload_values(m, cfg);
    if (s != DSC_OK) return s;
  }
  for (int i = 0; i < m->n_params; i++) {
    const ir_param *p = &m->params[i];
    dsc_offload_tier t = DSC_OFFLOAD_NONE;
    char pinned[600];
    snprintf(pinned, sizeof pinned, "place.%s", p->name);
    if (p->state && dsc_module_get_meta(m, pinned)) /* kept on the device (ZenFlow) */
      continue;
    if (p->state)
      t = opt;
    else {
      char key[600];
      snprintf(key, sizeof key, "shard.%s", p->name);
      if (dsc_module_get_meta(m, key)) t = par;
    }
    if (t == DSC_OFFLOAD_NONE || t == DSC_OFFLOAD_AUTO) continue; /* auto: offload_values */
    dsc_status s = set_tier(m, p->name, t);
    if (s != DSC_OK) return s;
  }
  if (opt == DSC_OFFLOAD_HOST) { /* the optimizer step on the host (passes/offload_host.c) */
    dsc_status s = pass_offload_host_run(m, cfg);
    if (s != DSC_OK) return s;
  }
  return pass_offload_disk_run(m, cfg); /* disk values streamed (passes/offload_disk.c) */
}
