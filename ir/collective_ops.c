/* Collective ops as start/wait pairs: shape rules and interpreter kernels.
 * The interpreter's run loop (ir/interp.c) performs the communication: a
 * start's kernel is never called there (it needs the other ranks' data), and
 * a wait's kernel copies the completed data out of its start's tensor. */
#include <stdio.h>
#include <string.h>

#include "ir/ir.h"

/* The wait op that completes a start op, or -1 for any other op. */
static int wait_of(dsc_op op) {
  switch (op) {
    case DSC_OP_ALL_REDUCE_START:
      return DSC_OP_ALL_REDUCE_WAIT;
    case DSC_OP_REDUCE_SCATTER_START:
      return DSC_OP_REDUCE_SCATTER_WAIT;
    case DSC_OP_ALL_GATHER_START:
      return DSC_OP_ALL_GATHER_WAIT;
    case DSC_OP_BROADCAST_START:
      return DSC_OP_BROADCAST_WAIT;
    case DSC_OP_ALL_TO_ALL_START:
      return DSC_OP_ALL_TO_ALL_WAIT;
    default:
      return -1;
  }
}

bool ir_is_collective_start(dsc_op op) { return wait_of(op) >= 0; }

bool ir_is_collective_wait(dsc_op op) {
  return op == DSC_OP_ALL_REDUCE_WAIT || op == DSC_OP_REDUCE_SCATTER_WAIT ||
         op == DSC_OP_ALL_GATHER_WAIT || op == DSC_OP_BROADCAST_WAIT ||
         op == DSC_OP_ALL_TO_ALL_WAIT;
}

bool ir_find_in_flight_read(const ir_graph *g, const ir_node **reader, int *input, int *output) {
  for (int i = 0; i < g->n_nodes; i++) {
    const ir_node *nd = g->nodes[i];
    if (!nd || ir_is_collective_wait(nd->op)) continue;
    for (int j = 0; j < nd->n_in; j++)
      if (nd->in[j] && ir_is_collective_start(nd->in[j]->op)) {
        *reader = nd, *input = j, *output = -1;
        return true;
      }
  }
  for (int k = 0; k < g->n_outputs; k++)
    if (g->outputs[k] && ir_is_collective_start(g->outputs[k]->op)) {
      *reader = g->outputs[k], *input = -1, *output = k;
      return true;
    }
  return false;
}

/* The group attribute names the world or a mesh axis (dsc/mesh.h). */
static bool known_group(const ir_node *n, char *err, size_t errlen) {
  const char *group = ir_attr_str(n, "group");
  static const char *const groups[] = {"world", "dp", "ep", "sp", "tp"};
  for (size_t i = 0; i < sizeof groups / sizeof *groups; i++)
    if (group && strcmp(group, groups[i]) == 0) return true;
  return ir_fail(err, errlen, "group '%s' is not a communicator (world, dp, ep, sp, tp)",
                 group ? group : "");
}

/* Checks the attributes every start (and local_shard) has: world, group;
 * copies the input type to out. */
static bool start_common(const ir_node *n, dsc_type *out, char *err, size_t errlen) {
  int64_t world = ir_attr_int(n, "world");
  if (world < 1 || world > INT32_MAX)
    return ir_fail(err, errlen, "world must be in [1, %d], got %lld", INT32_MAX, (long long)world);
  *out = n->in[0]->type;
  return known_group(n, err, errlen);
}

static bool start_sum(const ir_node *n, dsc_type *out, char *err, size_t errlen) {
  if (!start_common(n, out, err, errlen)) return false;
  if (out->dtype == DSC_BOOL)
    return ir_fail(err, errlen, "sums need a numeric dtype, got %s", dsc_dtype_name(out->dtype));
  return true;
}

bool ir_shape_all_reduce_start(const ir_node *n, dsc_type *out, char *err, size_t errlen) {
  return start_sum(n, out, err, errlen);
}

bool ir_shape_reduce_scatter_start(const ir_node *n, dsc_type *out, char *err, size_t errlen) {
  if (!start_sum(n, out, err, errlen)) return false;
  int64_t world = ir_attr_int(n, "world");
  if (out->rank < 1) return ir_fail(err, errlen, "the input needs rank >= 1 (scatters dim 0)");
  if (out->dims[0] % world != 0)
    return ir_fail(err, errlen, "dim 0 (%lld) is not divisible by world %lld",
                   (long long)out->dims[0], (long long)world);
  out->dims[0] /= world;
  return true;
}

bool ir_shape_all_gather_start(const ir_node *n, dsc_type *out, char *err, size_t errlen) {
  if (!start_common(n, out, err, errlen)) return false;
  int64_t world = ir_attr_int(n, "world");
  if (out->rank < 1) return ir_fail(err, errlen, "the input needs rank >= 1 (gathers dim 0)");
  if (out->dims[0] > INT64_MAX / world)
    return ir_fail(err, errlen, "dim 0 (%lld) times world %lld overflows", (long long)out->dims[0],
                   (long long)world);
  out->dims[0] *= world;
  return true;
}

bool ir_shape_broadcast_start(const ir_node *n, dsc_type *out, char *err, size_t errlen) {
  if (!start_common(n, out, err, errlen)) return false;
  int64_t world = ir_attr_int(n, "world"), root = ir_attr_int(n, "root");
  if (root < 0 || root >= world)
    return ir_fail(err, errlen, "root %lld is not a rank of world %lld", (long long)root,
                   (long long)world);
  return true;
}

const char *ir_collective_group(const ir_node *n) {
  bool has = ir_is_collective_start(n->op) || n->op == DSC_OP_LOCAL_SHARD;
  const char *g = has ? ir_attr_str(n, "group") : NULL;
  return g && *g ? g : "world";
}

bool ir_shape_all_to_all_start(const ir_node *n, dsc_type *out, char *err, size_t errlen) {
  if (!start_common(n, out, err, errlen)) return false;
  int64_t world = ir_attr_int(n, "world");
  if (out->rank < 1) return ir_fail(err, errlen, "the input needs rank >= 1 (exchanges dim 0)");
  if (out->dims[0] % world != 0)
    return ir_fail(err, errlen, "dim 0 (%lld) is not divisible by world %lld",
                   (long long)out->dims[0], (long long)world);
  return true;
}

bool ir_shape_local_shard(const ir_node *n, dsc_type *out, char *err, size_t errlen) {
  if (!start_common(n, out, err, errlen)) return false;
  int64_t world = ir_attr_int(n, "world");
  if (out->rank != 1) return ir_fail(err, errlen, "the input must be a vector (rank 1), got rank %d", out->rank);
  out->dims[0] = out->dims[0] / world + (out->dims[0] % world != 0);
  return true;
}

bool ir_shape_collective_wait(const ir_node *n, dsc_type *out, char *err, size_t errlen) {
  const ir_node *s = n->in[0];
  if (wait_of(s->op) != (int)n->op) {
    const char *want = "?";
    for (int op = 0; op < DSC_OP_COUNT; op++)
      if (wait_of((dsc_op)op) == (int)n->op) want = dsc_op_name((dsc_op)op);
    return ir_fail(err, errlen, "the input must be the matching %s, got %s (%%%d)", want,
                   dsc_op_name(s->op), s->id);
  }
  *out = s->type;
  return true;
}

bool interp_collective_start(const dsc_node *n, const dsc_tensor *const *in, dsc_tensor *out,
                             char *err, size_t errlen) {
  IR_UNUSED(in), IR_UNUSED(out);
  return ir_fail(err, errlen, "%s needs the other ranks: run the graph with a communicator",
                 dsc_op_name(n->op));
}

/* The run loop (ir/interp.c) copies the chunk: only it knows the rank. */
bool interp_local_shard(const dsc_node *n, const dsc_tensor *const *in, dsc_tensor *out,
                        char *err, size_t errlen) {
  IR_UNUSED(in), IR_UNUSED(out);
  return ir_fail(err, errlen, "%s needs the rank: run the graph with a communicator",
                 dsc_op_name(n->op));
}

bool interp_collective_wait(const dsc_node *n, const dsc_tensor *const *in, dsc_tensor *out,
                            char *err, size_t errlen) {
  IR_UNUSED(n), IR_UNUSED(err), IR_UNUSED(errlen);
  memcpy(out->data, in[0]->data, sizeof(double) * (size_t)dsc_type_numel(&out->type));
  return true;
}
