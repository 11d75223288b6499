/* A run's requests against this host, checked before the work that would
 * exhaust it (runtime/limits.c holds the machine's figures): the unrolled
 * grad_accum's IR, the planned arenas of the ranks in this process, the
 * number of in-process ranks. Each failure is DSC_ERR_USER with numbers. */
#include <inttypes.h>
#include <string.h>

#include "driver/driver.h"
#include "runtime/runtime.h"

/* Nodes of the step graph per node of the forward graph and micro-step:
 * forward, backward (about twice), decomposed composites, accumulation;
 * and the bytes each costs through the passes and lowering. Measured on
 * GPT-2 at grad_accum 64: 552 MB peak RSS for 185k estimated nodes
 * (362 forward nodes x 8 x 64), 3 KB each
 * (docs/training.md "Interrupts and limits"). */
enum { STEP_NODES_PER_FWD_NODE = 8, BYTES_PER_STEP_NODE = 3072 };
#define MAX_STEP_NODES ((int64_t)1 << 28) /* node ids are ints; far beyond any real step */

dsc_status drv_check_unroll(dsc_context *ctx, const dsc_module *m, int64_t grad_accum) {
  const dsc_graph *g = dsc_module_find_graph(m, "forward");
  if (!g || grad_accum <= 1) return DSC_OK;
  int64_t fwd = dsc_graph_node_count(g);
  int64_t per_step = fwd * STEP_NODES_PER_FWD_NODE;
  if (per_step <= 0) return DSC_OK;
  int64_t avail = rt_host_memory(NULL);
  int64_t by_mem = avail > 0 ? avail / BYTES_PER_STEP_NODE / per_step : INT64_MAX;
  int64_t by_ids = MAX_STEP_NODES / per_step;
  int64_t max_k = by_mem < by_ids ? by_mem : by_ids;
  if (grad_accum <= max_k) return DSC_OK;
  double nodes = (double)per_step * (double)grad_accum;
  ir_error(ctx, ir_no_loc,
           "grad_accum %" PRId64 " is too large to compile here: gradient accumulation is "
           "unrolled in the IR (one copy of the forward and backward graphs per micro-step), "
           "about %.3g nodes (%" PRId64 " forward nodes x %d x %" PRId64 "), %.3g GiB while "
           "compiling, against %.2f GiB available; at most grad_accum %" PRId64
           " here: use a larger --batch with fewer micro-steps",
           grad_accum, nodes, fwd, STEP_NODES_PER_FWD_NODE, grad_accum,
           nodes * BYTES_PER_STEP_NODE / (1024.0 * 1024 * 1024),
           (double)avail / (1024.0 * 1024 * 1024), max_k > 0 ? max_k : 1);
  return DSC_ERR_USER;
}

dsc_status drv_check_ranks_here(dsc_context *ctx, const dsc_comm *comm) {
  if (!comm || strcmp(dsc_comm_backend(comm), "inproc") != 0) return DSC_OK;
  return rt_check_inproc_ranks(ctx, dsc_comm_world(comm));
}

dsc_status drv_check_step_memory(dsc_context *ctx, const cg_memplan *p, const dsc_comm *comm) {
  /* in-process ranks share this host's memory: each holds its arenas */
  int64_t ranks = comm && strcmp(dsc_comm_backend(comm), "inproc") == 0 ? dsc_comm_world(comm) : 1;
  int64_t per_rank = p->peak + p->host_arena + p->host_work;
  char what[96];
  if (ranks > 1)
    snprintf(what, sizeof what, "planning the step's arenas (%" PRId64 " ranks x %" PRId64
             " bytes in this process)", ranks, per_rank);
  else
    snprintf(what, sizeof what, "planning the step's arenas");
  return rt_check_host_memory(ctx, what, per_rank > INT64_MAX / ranks ? INT64_MAX : per_rank * ranks);
}
