/* The communicators of a device mesh: one dsc_comm_split per axis. */
#include <string.h>

#include "runtime/runtime.h"

struct dsc_mesh {
  dsc_context *ctx;
  dsc_comm *world; /* the communicator it is attached to */
  dsc_mesh_shape shape;
  dsc_comm *group[DSC_MESH_MAX_AXES];
};

void dsc_mesh_free(dsc_mesh *m) {
  if (!m) return;
  if (m->world && m->world->mesh == m) m->world->mesh = NULL;
  for (int a = 0; a < m->shape.n_axes; a++) dsc_comm_free(m->group[a]);
  ir_free(m->ctx, m, sizeof *m);
}

dsc_status dsc_mesh_new(dsc_comm *world, const dsc_mesh_shape *shape, dsc_mesh **out) {
  *out = NULL;
  dsc_context *ctx = world->ctx;
  char spec[64];
  dsc_mesh_format(shape, spec, sizeof spec);
  if (shape->n_axes < 1 || shape->n_axes > DSC_MESH_MAX_AXES ||
      dsc_mesh_world(shape) != world->world) {
    ir_error(ctx, ir_no_loc, "mesh %s: the axes multiply to %d ranks, but the communicator has %d",
             spec, dsc_mesh_world(shape), world->world);
    return DSC_ERR_USER;
  }
  if (world->mesh) {
    ir_error(ctx, ir_no_loc,
             "mesh %s: the communicator already has a mesh (dsc_mesh_free it first)", spec);
    return DSC_ERR_USER;
  }
  dsc_mesh *m = ir_alloc(ctx, sizeof *m);
  if (!m) {
    ir_error(ctx, ir_no_loc, "mesh %s: out of memory", spec);
    return DSC_ERR_INTERNAL;
  }
  memset(m, 0, sizeof *m);
  m->ctx = ctx;
  m->shape = *shape;
  for (int a = 0; a < shape->n_axes; a++) {
    /* color: the rank's other coordinates, row-major; key: its coordinate on a. */
    int color = 0;
    for (int b = 0; b < shape->n_axes; b++)
      if (b != a) color = color * shape->size[b] + dsc_mesh_coord(shape, world->rank, b);
    dsc_status st = dsc_comm_split(world, color, dsc_mesh_coord(shape, world->rank, a),
                                   shape->axis[a], &m->group[a]);
    if (st != DSC_OK) {
      dsc_mesh_free(m);
      return st;
    }
  }
  m->world = world;
  world->mesh = m;
  *out = m;
  return DSC_OK;
}

dsc_comm *dsc_mesh_group(const dsc_mesh *m, const char *axis) {
  int a = dsc_mesh_axis(&m->shape, axis);
  return a < 0 ? NULL : m->group[a];
}

const dsc_mesh_shape *dsc_mesh_shape_of(const dsc_mesh *m) { return &m->shape; }

dsc_comm *dsc_comm_group(dsc_comm *c, const char *name) {
  if (!name || !*name || strcmp(name, "world") == 0) return c;
  return c->mesh ? dsc_mesh_group(c->mesh, name) : NULL;
}
