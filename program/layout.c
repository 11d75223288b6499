/* The layout of a module's params and states (program/program.h): one
 * STATE arena for every graph of the module, and per offload tier an arena
 * of its own. */
#include <string.h>

#include "program/program.h"

bool cg_state_layout(const ir_module *m, int64_t *offsets, int64_t *total) {
  int64_t off = 0;
  for (int i = 0; i < m->n_params; i++) {
    int64_t numel = dsc_type_numel(&m->params[i].type);
    int64_t size = (int64_t)dsc_dtype_size(m->params[i].type.dtype);
    if (numel < 0 || (numel > 0 && size > (INT64_MAX / 2 - off) / numel)) return false;
    offsets[i] = off;
    off += (numel * size + 63) & ~(int64_t)63;
  }
  *total = off;
  return true;
}

int cg_param_tier(const ir_module *m, int i) {
  char key[600];
  if ((size_t)snprintf(key, sizeof key, "tier.%s", m->params[i].name) >= sizeof key) return -1;
  const char *v = dsc_module_get_meta(m, key);
  if (!v || strcmp(v, "none") == 0 || strcmp(v, "device") == 0) return CG_TIER_DEVICE;
  if (strcmp(v, "host") == 0) return CG_TIER_HOST;
  if (strcmp(v, "disk") == 0) return CG_TIER_DISK;
  return -1;
}

bool cg_state_layout_tiers(const ir_module *m, int64_t *offsets, int *tiers, int64_t *totals) {
  for (int t = 0; t < CG_TIER_COUNT; t++) totals[t] = 0;
  for (int i = 0; i < m->n_params; i++) {
    int t = cg_param_tier(m, i);
    if (t < 0) return false;
    int64_t numel = dsc_type_numel(&m->params[i].type);
    int64_t size = (int64_t)dsc_dtype_size(m->params[i].type.dtype);
    if (numel < 0 || (numel > 0 && size > (INT64_MAX / 4 - totals[t]) / numel)) return false;
    if (tiers) tiers[i] = t;
    offsets[i] = totals[t];
    totals[t] += (numel * size + 63) & ~(int64_t)63;
  }
  return true;
}
