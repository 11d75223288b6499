/* The interpreter's collectives (ir/ir.h ir_collectives) over a dsc_comm,
 * and the public dsc_interp_run_with (include/dsc/interp.h) that joins the
 * two: ir/ declares what it needs, the runtime provides it. */
#include "runtime/runtime.h"

static int coll_world(void *c) { return dsc_comm_world(c); }
static int coll_rank(void *c) { return dsc_comm_rank(c); }
static dsc_context *coll_context(void *c) { return dsc_comm_context(c); }
static bool coll_broken(void *c) { return dsc_comm_broken(c); }
static void coll_abort(void *c, const char *why) { dsc_comm_abort(c, why); }

static dsc_status coll_start(void *c, ir_coll_kind kind, const double *send, double *recv,
                             int64_t count, int root, int64_t tag, void **req) {
  dsc_comm_request *r = NULL;
  dsc_status st = DSC_ERR_INTERNAL;
  switch (kind) {
    case IR_COLL_ALL_REDUCE:
      st = dsc_comm_all_reduce_start(c, send, recv, count, DSC_F64, DSC_COMM_SUM, tag, &r);
      break;
    case IR_COLL_REDUCE_SCATTER:
      st = dsc_comm_reduce_scatter_start(c, send, recv, count, DSC_F64, DSC_COMM_SUM, tag, &r);
      break;
    case IR_COLL_ALL_GATHER:
      st = dsc_comm_all_gather_start(c, send, recv, count, DSC_F64, tag, &r);
      break;
    case IR_COLL_BROADCAST:
      st = dsc_comm_broadcast_start(c, recv, count, DSC_F64, root, tag, &r);
      break;
    case IR_COLL_ALL_TO_ALL:
      st = dsc_comm_all_to_all_start(c, send, recv, count, DSC_F64, tag, &r);
      break;
  }
  *req = r;
  return st;
}

static dsc_status coll_wait(void *req) { return dsc_comm_wait(req); }
static void *coll_group(void *c, const char *name) { return dsc_comm_group(c, name); }

const ir_collectives rt_interp_collectives = {
    coll_world, coll_rank, coll_context, coll_broken, coll_abort, coll_start, coll_wait, coll_group,
};

dsc_status dsc_interp_run_with(const dsc_graph *g, const dsc_params *params,
                               const dsc_tensor *const *inputs, int n_inputs, dsc_tensor **outputs,
                               const dsc_interp_options *opts) {
  dsc_comm *comm = opts ? opts->comm : NULL;
  return ir_interp_run(g, params, inputs, n_inputs, outputs, comm ? &rt_interp_collectives : NULL,
                       comm);
}
