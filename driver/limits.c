/* A run's requests against this host, checked before the work that would
 * exhaust it (runtime/limits.c holds the machine's figures): the planned
 * arenas of the ranks in this process, the number of in-process ranks. Each failure is DSC_ERR_USER with numbers. */
#include <inttypes.h>
#include <string.h>

#include "driver/driver.h"
#include "runtime/runtime.h"

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
