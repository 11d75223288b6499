/* dsc public API: the shape of a device mesh.
 *
 * A job's ranks arranged in up to four named axes: dp (data parallel), ep
 * (expert parallel), sp (sequence parallel, Ulysses), tp (tensor parallel).
 * Ranks are numbered row-major over the axes in the order they are written,
 * the last axis fastest (as torch's DeviceMesh): for "dp=2,ep=2" rank 1 is
 * (dp 0, ep 1) and rank 2 is (dp 1, ep 0). The group of an axis is the set of
 * ranks that differ only in that axis' coordinate: ep groups {0, 1} and
 * {2, 3}, dp groups {0, 2} and {1, 3}. The communicators of a mesh are
 * dsc_mesh (dsc/comm.h); the shape alone is what planning needs. */
#ifndef DSC_MESH_H
#define DSC_MESH_H

#include "dsc/core.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DSC_MESH_MAX_AXES 4

typedef struct {
  int n_axes;
  char axis[DSC_MESH_MAX_AXES][4]; /* "dp", "ep", "sp", "tp" */
  int size[DSC_MESH_MAX_AXES];     /* >= 1 */
} dsc_mesh_shape;

/* Parses "dp=2,ep=2" for a job of `world` ranks. Each axis at most once,
 * sizes >= 1; an axis left out has size 1, except dp, which takes what the
 * others leave (world / their product, as the first axis). The sizes must
 * multiply to world. NULL or "" is dp=world. Errors (DSC_ERR_USER) quote the
 * spec and name the numbers: "--mesh ep=3: 3 does not divide the world of 4
 * ranks". */
dsc_status dsc_mesh_parse(dsc_context *ctx, const char *spec, int world, dsc_mesh_shape *out);
/* "dp=2,ep=2" (every axis, in order). */
void dsc_mesh_format(const dsc_mesh_shape *s, char *buf, size_t n);
/* The index of axis name, or -1. */
int dsc_mesh_axis(const dsc_mesh_shape *s, const char *name);
/* The size of axis name; 1 for an axis the mesh does not have. */
int dsc_mesh_size(const dsc_mesh_shape *s, const char *name);
/* The product of the sizes. */
int dsc_mesh_world(const dsc_mesh_shape *s);
/* Rank's coordinate along axis index a. */
int dsc_mesh_coord(const dsc_mesh_shape *s, int rank, int a);

#ifdef __cplusplus
}
#endif
#endif
