/* Kernel iteration domains (ir/ir.h "ir/domain.c"): the affine index
 * analysis that fusion (passes/fuse.c) and the lowering (codegen/lower.c)
 * share, so that what the pass groups is exactly what the lowering can
 * express. It reads only IR types, so it lives with them. */
#include <stdlib.h>
#include <string.h>

#include "ir/ir.h"

/* ------------------------------------------------------------ domains */

void ir_domain_make(const dsc_type *full, uint32_t rmask, bool reduces, ir_domain *d) {
  memset(d, 0, sizeof *d);
  d->full = *full;
  d->reduces = reduces;
  int r = full->rank;
  if (!reduces) rmask = r > 0 ? 1u << (r - 1) : 0;
  d->rmask = rmask;
  d->rank = r;
  int v = 0;
  for (int j = 0; j < r; j++)
    if (!(rmask & (1u << j))) d->var_of[j] = v, d->dims[v++] = full->dims[j];
  d->n_outer = v;
  for (int j = 0; j < r; j++)
    if (rmask & (1u << j)) d->var_of[j] = v, d->dims[v++] = full->dims[j];
}

bool ir_reduction_mask(const ir_node *n, uint32_t *mask) {
  if (n->op != DSC_OP_SUM && n->op != DSC_OP_MEAN && n->op != DSC_OP_MAX) return false;
  int cnt;
  const int64_t *axes = ir_attr_ints(n, "axes", &cnt);
  if (cnt <= 0 || !axes) return false;
  uint32_t m = 0;
  for (int i = 0; i < cnt; i++) m |= 1u << axes[i];
  *mask = m;
  return true;
}

/* Same dims, whatever the dtypes: a kernel's members may differ in dtype
 * (a cast inside the group), its domain is a shape. */
static bool same_shape(const dsc_type *a, const dsc_type *b) {
  if (a->rank != b->rank) return false;
  for (int i = 0; i < a->rank; i++)
    if (a->dims[i] != b->dims[i]) return false;
  return true;
}

bool ir_group_domain(ir_node *const *members, int n, ir_domain *d) {
  const dsc_type *full = NULL;
  uint32_t rmask = 0;
  bool reduces = false;
  for (int i = 0; i < n; i++) {
    uint32_t m;
    if (!ir_reduction_mask(members[i], &m)) continue;
    const dsc_type *t = &members[i]->in[0]->type;
    if (reduces && (m != rmask || !same_shape(t, full))) return false;
    reduces = true, rmask = m, full = t;
  }
  if (!reduces) {
    if (n <= 0) return false;
    full = &members[0]->type;
    for (int i = 1; i < n; i++)
      if (!same_shape(&members[i]->type, full)) return false;
  }
  /* dtypes differ between members: the domain is a shape */
  dsc_type shape = *full;
  shape.dtype = DSC_F32;
  ir_domain_make(&shape, rmask, reduces, d);
  return true;
}

bool ir_natural_map(const ir_domain *d, const dsc_type *t, ir_affine *p, bool *full) {
  const dsc_type *D = &d->full;
  memset(p, 0, sizeof(ir_affine) * (size_t)(t->rank > 0 ? t->rank : 1));
  if (same_shape(t, D)) {
    for (int j = 0; j < t->rank; j++) p[j].c[d->var_of[j]] = 1;
    *full = true;
    return true;
  }
  if (!d->reduces) return false;
  *full = false;
  if (t->rank == D->rank) { /* keepdims form */
    for (int j = 0; j < t->rank; j++) {
      if (d->rmask & (1u << j)) {
        if (t->dims[j] != 1) return false;
      } else {
        if (t->dims[j] != D->dims[j]) return false;
        p[j].c[d->var_of[j]] = 1;
      }
    }
    return true;
  }
  int k = 0;
  for (int j = 0; j < D->rank; j++) {
    if (d->rmask & (1u << j)) continue;
    if (k >= t->rank || t->dims[k] != D->dims[j]) return false;
    p[k++].c[d->var_of[j]] = 1;
  }
  return k == t->rank;
}

bool ir_point_equal(const dsc_type *t, const ir_affine *a, const ir_affine *b) {
  for (int j = 0; j < t->rank; j++) {
    if (t->dims[j] == 1) continue;
    if (a[j].k != b[j].k) return false;
    for (int v = 0; v < DSC_MAX_RANK; v++)
      if (a[j].c[v] != b[j].c[v]) return false;
  }
  return true;
}

/* Numpy broadcasting of an operand of type in to the point of the result. */
static void bcast_point(const dsc_type *in, const dsc_type *out, const ir_affine *po,
                        ir_affine *pi) {
  int off = out->rank - in->rank;
  for (int j = 0; j < in->rank; j++) {
    if (in->dims[j] == 1)
      memset(&pi[j], 0, sizeof pi[j]);
    else
      pi[j] = po[j + off];
  }
}

static void aff_add_scaled(ir_affine *dst, const ir_affine *src, int64_t s) {
  dst->k += src->k * s;
  for (int v = 0; v < DSC_MAX_RANK; v++) dst->c[v] += src->c[v] * s;
}

/* reshape A -> B: the input point from the output point. Dims of size 1
 * are index 0; the other dims form runs with equal products, and a run is
 * affine when it has at most one input dim (splitting it into several
 * output dims is a weighted sum; merging several is div/mod: not affine). */
static bool reshape_point(const dsc_type *A, const dsc_type *B, const ir_affine *pb,
                          ir_affine *pa) {
  memset(pa, 0, sizeof(ir_affine) * (size_t)(A->rank > 0 ? A->rank : 1));
  int ia[DSC_MAX_RANK], ib[DSC_MAX_RANK], na = 0, nb = 0;
  for (int i = 0; i < A->rank; i++)
    if (A->dims[i] != 1) ia[na++] = i;
  for (int j = 0; j < B->rank; j++)
    if (B->dims[j] != 1) ib[nb++] = j;
  int i = 0, j = 0;
  while (i < na && j < nb) {
    int i0 = i, j0 = j;
    int64_t pa_ = A->dims[ia[i++]], pb_ = B->dims[ib[j++]];
    while (pa_ != pb_) {
      if (pa_ < pb_ && i < na)
        pa_ *= A->dims[ia[i++]];
      else if (pb_ < pa_ && j < nb)
        pb_ *= B->dims[ib[j++]];
      else
        return false;
    }
    if (i - i0 > 1) return false;
    int64_t s = 1;
    for (int b = j - 1; b >= j0; b--) {
      aff_add_scaled(&pa[ia[i0]], &pb[ib[b]], s);
      s *= B->dims[ib[b]];
    }
  }
  return i == na && j == nb;
}

bool ir_input_point(const ir_node *n, int i, const ir_domain *d, const ir_affine *pn,
                           ir_affine *pin) {
  const dsc_type *out = &n->type, *in = &n->in[i]->type;
  const ir_op_info *info = ir_op(n->op);
  uint32_t mask;
  if (info->cg == IR_CG_ELEMENTWISE || n->op == DSC_OP_BROADCAST) {
    bcast_point(in, out, pn, pin);
    return true;
  }
  switch (n->op) {
    case DSC_OP_PERMUTE: {
      int cnt;
      const int64_t *perm = ir_attr_ints(n, "perm", &cnt);
      for (int j = 0; j < cnt; j++) pin[perm[j]] = pn[j];
      return true;
    }
    case DSC_OP_SLICE: {
      int64_t axis = ir_attr_int(n, "axis");
      for (int j = 0; j < out->rank; j++) pin[j] = pn[j];
      pin[axis].k += ir_attr_int(n, "start");
      return true;
    }
    case DSC_OP_RESHAPE:
      return reshape_point(in, out, pn, pin);
    case DSC_OP_EMBEDDING:
      if (i != 1) return false; /* the table is read by a gather, not at a point */
      for (int j = 0; j < in->rank; j++) pin[j] = pn[j];
      return true;
    case DSC_OP_SUM:
    case DSC_OP_MEAN:
    case DSC_OP_MAX: {
      if (!ir_reduction_mask(n, &mask)) { /* no axes: identity */
        for (int j = 0; j < in->rank; j++) pin[j] = pn[j];
        return true;
      }
      if (!d || mask != d->rmask || !d->reduces || !same_shape(in, &d->full)) return false;
      bool keep = ir_attr_bool(n, "keepdims");
      int k = 0;
      for (int j = 0; j < in->rank; j++) {
        memset(&pin[j], 0, sizeof pin[j]);
        if (mask & (1u << j)) {
          pin[j].c[d->var_of[j]] = 1;
          if (keep) k++;
        } else {
          pin[j] = pn[k++];
        }
      }
      return true;
    }
    default:
      return false;
  }
}

bool ir_inlinable_op(const ir_node *n) {
  uint32_t mask;
  switch (n->op) {
    case DSC_OP_CONST:
    case DSC_OP_IOTA:
    case DSC_OP_BROADCAST:
    case DSC_OP_PERMUTE:
    case DSC_OP_SLICE:
      return true;
    case DSC_OP_RESHAPE: {
      ir_affine pb[DSC_MAX_RANK], pa[DSC_MAX_RANK];
      memset(pb, 0, sizeof pb);
      for (int j = 0; j < n->type.rank; j++) pb[j].c[j] = 1;
      return reshape_point(&n->in[0]->type, &n->type, pb, pa);
    }
    case DSC_OP_SUM:
    case DSC_OP_MEAN:
    case DSC_OP_MAX:
      return !ir_reduction_mask(n, &mask);
    default:
      return ir_op(n->op)->cg == IR_CG_ELEMENTWISE;
  }
}

bool ir_recomputed_gather(const ir_node *x) {
  return x->op == DSC_OP_EMBEDDING && x->n_in == 2 && !x->guard && !x->in[0]->guard &&
         !x->in[1]->guard;
}

static bool is_float_storage(dsc_dtype t) {
  return t == DSC_F32 || t == DSC_BF16 || t == DSC_F16 || t == DSC_F64;
}

bool ir_recomputed_cast(const ir_node *x) {
  /* a gradient stays a buffer: it is a model state the memory plan holds
   * (2 bytes a param in bf16) and what the ranks reduce */
  return x->op == DSC_OP_CAST && x->n_in == 1 && !x->guard && !x->in[0]->guard &&
         x->role != IR_ROLE_GRAD && is_float_storage(x->type.dtype) &&
         is_float_storage(x->in[0]->type.dtype);
}
