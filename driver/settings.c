/* drv_apply_run_settings (driver/driver.h): the run settings dsc train,
 * dsc plan and dsc compile apply over the model's train section, once, so
 * that a plan is of the step the trainer builds. */
#include <inttypes.h>

#include "driver/driver.h"

dsc_status drv_apply_run_settings(dsc_context *ctx, const drv_run_settings *s,
                                  dsc_train_config *cfg) {
  const char *who = s->who ? s->who : "trainer";
  if (s->grad_accum > 0) cfg->grad_accum = s->grad_accum;
  if (s->precision && dsc_precision_from_name(s->precision, &cfg->precision) != 0) {
    ir_error(ctx, ir_no_loc, "%s: precision '%s' is not one of f32, bf16, fp16", who,
             s->precision);
    return DSC_ERR_USER;
  }
  /* Data parallelism: the world, the knobs (ZeRO's, remat, offload, the
   * global batch: range-checked by the settings table), and grad_accum from
   * a global batch (DeepSpeed's train_batch_size = micro x accum x world). */
  cfg->world = s->world > 1 ? s->world : 1;
  cfg->sp = s->mesh.sp > 1 ? s->mesh.sp : 1;
  cfg->ep = s->mesh.ep > 1 ? s->mesh.ep : 1;
  cfg->tp = s->mesh.tp > 1 ? s->mesh.tp : 1;
  static const dsc_run_knobs none;
  dsc_status st = dsc_run_knobs_apply(ctx, who, s->knobs ? s->knobs : &none, cfg);
  if (st != DSC_OK) return st;
  /* sequence- and tensor-parallel ranks share sequences: the batch is over
   * the others */
  int64_t data = cfg->world / (cfg->sp * cfg->tp);
  const char *ranks = data < cfg->world ? "data ranks" : "world";
  if (cfg->global_batch > 0) {
    int64_t per = s->B * data, G = cfg->global_batch;
    if (G % per != 0) {
      ir_error(ctx, ir_no_loc,
               "%s: the global batch of %" PRId64 " sequences is not divisible by batch %" PRId64
               " x %s %" PRId64 " = %" PRId64 " (global batch = batch x grad_accum x %s)",
               who, G, s->B, ranks, data, per, ranks);
      return DSC_ERR_USER;
    }
    if (s->grad_accum > 0 && s->grad_accum != G / per) {
      ir_error(ctx, ir_no_loc,
               "%s: global batch %" PRId64 " is not batch %" PRId64 " x grad_accum %" PRId64
               " x %s %" PRId64 " = %" PRId64 "; give one of --grad-accum and --global-batch",
               who, G, s->B, s->grad_accum, ranks, data, s->B * s->grad_accum * data);
      return DSC_ERR_USER;
    }
    cfg->grad_accum = G / per;
  }
  if (s->B > 0 && s->B > INT64_MAX / cfg->grad_accum) {
    ir_error(ctx, ir_no_loc, "%s: batch * grad_accum overflows", who);
    return DSC_ERR_USER;
  }
  return DSC_OK;
}
