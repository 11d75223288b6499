/* The shape of a device mesh (dsc/mesh.h): parsing and coordinates. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsc/mesh.h"
#include "ir/ir.h"

static const char *const known_axes[] = {"dp", "ep", "sp", "tp"};

int dsc_mesh_axis(const dsc_mesh_shape *s, const char *name) {
  for (int a = 0; a < s->n_axes; a++)
    if (name && strcmp(s->axis[a], name) == 0) return a;
  return -1;
}

int dsc_mesh_size(const dsc_mesh_shape *s, const char *name) {
  int a = dsc_mesh_axis(s, name);
  return a < 0 ? 1 : s->size[a];
}

int dsc_mesh_world(const dsc_mesh_shape *s) {
  int w = 1;
  for (int a = 0; a < s->n_axes; a++) w *= s->size[a];
  return w;
}

int dsc_mesh_coord(const dsc_mesh_shape *s, int rank, int a) {
  int stride = 1;
  for (int b = s->n_axes - 1; b > a; b--) stride *= s->size[b];
  return rank / stride % s->size[a];
}

void dsc_mesh_format(const dsc_mesh_shape *s, char *buf, size_t n) {
  size_t k = 0;
  if (n) buf[0] = 0;
  for (int a = 0; a < s->n_axes && k < n; a++)
    k += (size_t)snprintf(buf + k, n - k, "%s%s=%d", a ? "," : "", s->axis[a], s->size[a]);
}

static bool known(const char *name, size_t len) {
  for (size_t i = 0; i < sizeof known_axes / sizeof *known_axes; i++)
    if (strlen(known_axes[i]) == len && strncmp(known_axes[i], name, len) == 0) return true;
  return false;
}

dsc_status dsc_mesh_parse(dsc_context *ctx, const char *spec, int world, dsc_mesh_shape *out) {
  memset(out, 0, sizeof *out);
  const char *shown = spec ? spec : "";
  if (world < 1) {
    ir_error(ctx, ir_no_loc, "--mesh %s: the world must have at least one rank, got %d", shown,
             world);
    return DSC_ERR_USER;
  }
  dsc_mesh_shape s;
  memset(&s, 0, sizeof s);
  for (const char *p = spec ? spec : ""; *p;) {
    const char *eq = strchr(p, '='), *end = strchr(p, ',');
    if (!end) end = p + strlen(p);
    if (!eq || eq > end) {
      ir_error(ctx, ir_no_loc, "--mesh %s: expected axis=size (e.g. dp=2,ep=2), got '%.*s'", shown,
               (int)(end - p), p);
      return DSC_ERR_USER;
    }
    size_t len = (size_t)(eq - p);
    if (!known(p, len)) {
      ir_error(ctx, ir_no_loc, "--mesh %s: unknown axis '%.*s' (the axes are dp, ep, sp, tp)",
               shown, (int)len, p);
      return DSC_ERR_USER;
    }
    char name[4] = {0};
    memcpy(name, p, len);
    if (dsc_mesh_axis(&s, name) >= 0) {
      ir_error(ctx, ir_no_loc, "--mesh %s: axis %s is given twice", shown, name);
      return DSC_ERR_USER;
    }
    char *num_end;
    long v = strtol(eq + 1, &num_end, 10);
    if (num_end != end || eq + 1 == end || v < 1 || v > 1 << 20) {
      ir_error(ctx, ir_no_loc, "--mesh %s: the size of %s must be a whole number >= 1, got '%.*s'",
               shown, name, (int)(end - eq - 1), eq + 1);
      return DSC_ERR_USER;
    }
    memcpy(s.axis[s.n_axes], name, sizeof name);
    s.size[s.n_axes++] = (int)v;
    p = *end ? end + 1 : end;
    if (*end && !*p) {
      ir_error(ctx, ir_no_loc, "--mesh %s: a trailing comma", shown);
      return DSC_ERR_USER;
    }
  }
  int given = dsc_mesh_world(&s);
  if (dsc_mesh_axis(&s, "dp") < 0) {
    if (world % given != 0) {
      ir_error(ctx, ir_no_loc,
               "--mesh %s: the axes multiply to %d, which does not divide the world of %d ranks",
               shown, given, world);
      return DSC_ERR_USER;
    }
    /* dp first: the data-parallel copies are the outermost, slowest axis. */
    memmove(&s.axis[1], &s.axis[0], sizeof s.axis[0] * (size_t)s.n_axes);
    memmove(&s.size[1], &s.size[0], sizeof s.size[0] * (size_t)s.n_axes);
    memcpy(s.axis[0], "dp", 3);
    s.size[0] = world / given;
    s.n_axes++;
  } else if (given != world) {
    ir_error(ctx, ir_no_loc, "--mesh %s: the axes multiply to %d ranks, but the job has %d", shown,
             given, world);
    return DSC_ERR_USER;
  }
  *out = s;
  return DSC_OK;
}
