/* The builtin functions of the model language (docs/language.md): their
 * signatures and how each call becomes IR. An elementwise op's builtin is
 * its row in the op table (include/dsc/ops.def: the signature, the scalar
 * function that folds numbers); the others are the table below, one
 * lowering function each. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "frontend/frontend.h"

/* ---------------------------------------------------------- elementwise ops */

/* Argument k is attribute a of the op: its value into *out (and, for a
 * float, into *p, the scalar function's parameter). */
static bool attr_arg(fe_state *st, fe_frame *fr, fe_binding *b, int k, const ir_op_info *oi,
                     int a, dsc_attr *out, double *p) {
  const char *key = oi->attr_keys[a];
  switch (oi->attr_kinds[a]) {
    case DSC_ATTR_FLOAT:
      if (!fe_arg_num(st, fr, b, k, p)) return false;
      *out = dsc_attr_float(key, *p);
      return true;
    case DSC_ATTR_INT: {
      int64_t i;
      if (!fe_arg_int(st, fr, b, k, &i)) return false;
      *out = dsc_attr_int(key, i);
      return true;
    }
    case DSC_ATTR_BOOL: {
      bool v;
      if (!fe_arg_bool(st, fr, b, k, &v)) return false;
      *out = dsc_attr_bool(key, v);
      return true;
    }
    case DSC_ATTR_DTYPE: {
      dsc_dtype dt;
      if (!fe_arg_dtype(st, fr, b, k, &dt)) return false;
      *out = dsc_attr_dtype(key, dt);
      return true;
    }
    default:
      ERR(b->slot_loc[k], "internal: attribute '%s' of '%s' cannot be a builtin argument", key,
          oi->name);
      return false;
  }
}

/* Numbers alone: the op's scalar function. An op on integers (IR_OPF_INT)
 * keeps integers integers, exactly while they are within 2^53. */
static fe_value fold_elementwise(fe_state *st, const fe_builtin *bi, const fe_value *v, int n,
                                 double p, dsc_loc loc) {
  const ir_op_info *oi = ir_op(bi->op);
  const double exact = 9007199254740992.0; /* 2^53 */
  double x[3] = {0, 0, 0};
  bool ints = (oi->flags & IR_OPF_INT) != 0;
  for (int i = 0; i < n; i++) {
    x[i] = num(&v[i]);
    ints = ints && v[i].is_int;
  }
  double r = oi->scalar(x, p);
  if (ints) {
    bool ok = fabs(r) <= exact;
    for (int i = 0; i < n; i++) ok = ok && fabs(x[i]) <= exact;
    if (!ok) return ERR(loc, "integer overflow in a constant expression"), verr;
    return vint((int64_t)r);
  }
  if (!isfinite(r)) {
    ERR(loc, "'%s' of this number is not finite", bi->name);
    return verr;
  }
  return vfloat(r);
}

/* "'a' and 'b'": the arguments that may be numbers (for a message). */
static void value_params(const fe_builtin *bi, const fe_binding *b, char *buf, size_t n) {
  int cnt = 0, len = 0;
  buf[0] = 0;
  for (int k = 0; k < b->n_params; k++) cnt += bi->attr[k] < 0 && !(bi->tensor_only >> k & 1);
  for (int k = 0, i = 0; k < b->n_params && len >= 0 && (size_t)len < n; k++) {
    if (bi->attr[k] >= 0 || bi->tensor_only >> k & 1) continue;
    const char *sep = i == 0 ? "" : i == cnt - 1 ? " and " : ", ";
    len += snprintf(buf + len, n - (size_t)len, "%s'%s'", sep, b->params[k]);
    i++;
  }
}

/* An elementwise op's call: its inputs are tensors or numbers (those marked
 * tensor-only in the signature: tensors), its attributes are the other
 * arguments. Numbers alone fold; beside a tensor they become constants of
 * its dtype. */
static fe_value lower_elementwise(fe_state *st, fe_frame *fr, const fe_builtin *bi, fe_binding *b,
                                  dsc_loc loc) {
  const ir_op_info *oi = ir_op(bi->op);
  fe_value v[3];
  int slot[3], n_in = 0, like = -1;
  for (int k = 0; k < b->n_params && n_in < 3; k++) {
    if (bi->attr[k] >= 0) continue;
    bool tensor_only = bi->tensor_only >> k & 1;
    v[n_in] = tensor_only ? fe_arg_tensor(st, fr, b, k) : fe_ev(st, fr, b->slots[k]);
    slot[n_in++] = k;
  }
  for (int i = 0; i < n_in; i++)
    if (v[i].kind == V_ERR) return verr;
  dsc_attr attrs[IR_MAX_OP_ATTRS];
  double p = 0;
  for (int k = 0; k < b->n_params; k++)
    if (bi->attr[k] >= 0 && !attr_arg(st, fr, b, k, oi, bi->attr[k], &attrs[bi->attr[k]], &p))
      return verr;
  bool all_num = true;
  for (int i = 0; i < n_in; i++) {
    if (v[i].kind != V_NUM && v[i].kind != V_TENSOR) {
      ERR(b->slot_loc[slot[i]], "argument '%s' of '%s' must be a tensor or a number, not %s",
          b->params[slot[i]], bi->name, fe_kind_name(&v[i]));
      return verr;
    }
    all_num = all_num && v[i].kind == V_NUM;
    if (like < 0 && v[i].kind == V_TENSOR && !(bi->tensor_only >> slot[i] & 1)) like = i;
  }
  if (all_num) return fold_elementwise(st, bi, v, n_in, p, loc);
  dsc_node *in[3];
  for (int i = 0; i < n_in; i++) {
    if (v[i].kind == V_NUM) {
      if (like < 0) {
        char names[96];
        value_params(bi, b, names, sizeof names);
        ERR(loc, "'%s' needs at least one of %s to be a tensor (for its dtype)", bi->name, names);
        return verr;
      }
      v[i] = fe_materialize(st, fr, &v[i], dsc_node_type(v[like].node).dtype, b->slot_loc[slot[i]]);
      if (v[i].kind == V_ERR) return verr;
    }
    in[i] = v[i].node;
  }
  fe_at(st, loc);
  return fe_tensor(st, dsc_build(st->g, bi->op, in, n_in, attrs, oi->n_attrs), loc);
}

/* Reads an op's builtin signature ("x p=exponent", "cond:t a b": names in
 * order; ":t" a tensor only; "=key" the op's attribute key) into *out. */
static bool builtin_of_op(dsc_op op, fe_builtin *out) {
  const ir_op_info *oi = ir_op(op);
  memset(out, 0, sizeof *out);
  out->name = oi->name;
  out->lower = lower_elementwise;
  out->op = op;
  for (const char *s = oi->builtin; *s;) {
    while (*s == ' ') s++;
    if (!*s) break;
    size_t len = strcspn(s, " :=");
    int k = out->n_req++;
    if (k >= 6 || len >= sizeof out->names[k]) return false;
    memcpy(out->names[k], s, len);
    out->params[k] = out->names[k];
    out->attr[k] = -1;
    s += len;
    if (*s == ':' && s[1] == 't') out->tensor_only |= 1u << k, s += 2;
    if (*s == '=') {
      size_t klen = strcspn(++s, " ");
      for (int a = 0; a < oi->n_attrs; a++)
        if (strlen(oi->attr_keys[a]) == klen && strncmp(oi->attr_keys[a], s, klen) == 0)
          out->attr[k] = a;
      if (out->attr[k] < 0) return false;
      s += klen;
    }
  }
  return true;
}

/* ------------------------------------------------------ structural builtins */

static fe_value lower_reduce(fe_state *st, fe_frame *fr, const fe_builtin *bi, fe_binding *b,
                             dsc_loc loc) {
  int64_t ints[DSC_MAX_RANK];
  int n = 0;
  fe_value x = fe_arg_tensor(st, fr, b, 0);
  if (x.kind == V_ERR) return verr;
  int rank = dsc_node_type(x.node).rank;
  bool keep = false;
  if (b->slots[2] && !fe_arg_bool(st, fr, b, 2, &keep)) return verr;
  if (b->slots[1]) {
    if (!fe_arg_ints(st, fr, b, 1, true, ints, &n)) return verr;
    for (int i = 0; i < n; i++)
      if (!fe_norm_axis(st, b, 1, &ints[i], rank)) return verr;
    for (int i = 1; i < n; i++) /* sort (insertion) and reject repeats */
      for (int j = i; j > 0 && ints[j - 1] > ints[j]; j--) {
        int64_t t = ints[j];
        ints[j] = ints[j - 1];
        ints[j - 1] = t;
      }
    for (int i = 1; i < n; i++)
      if (ints[i] == ints[i - 1]) {
        ERR(b->slot_loc[1], "axis %lld is listed twice", (long long)ints[i]);
        return verr;
      }
  } else {
    for (n = 0; n < rank; n++) ints[n] = n;
  }
  fe_at(st, loc);
  return fe_tensor(st, dsc_reduce(st->g, bi->op, x.node, ints, n, keep), loc);
}

static fe_value lower_binary(fe_state *st, fe_frame *fr, const fe_builtin *bi, fe_binding *b,
                             dsc_loc loc) {
  fe_value x = fe_arg_tensor(st, fr, b, 0);
  fe_value y = fe_arg_tensor(st, fr, b, 1);
  if (x.kind == V_ERR || y.kind == V_ERR) return verr;
  fe_at(st, loc);
  return fe_tensor(st, dsc_binary(st->g, bi->op, x.node, y.node), loc);
}

static fe_value lower_transpose(fe_state *st, fe_frame *fr, const fe_builtin *bi, fe_binding *b,
                                dsc_loc loc) {
  IR_UNUSED(bi);
  int64_t ints[DSC_MAX_RANK];
  fe_value x = fe_arg_tensor(st, fr, b, 0);
  if (x.kind == V_ERR) return verr;
  int rank = dsc_node_type(x.node).rank;
  int64_t i = rank - 2, j = rank - 1;
  if (!b->slots[1] != !b->slots[2]) {
    ERR(loc, "'transpose' takes both axes i and j, or neither");
    return verr;
  }
  if (b->slots[1]) {
    if (!fe_arg_int(st, fr, b, 1, &i) || !fe_arg_int(st, fr, b, 2, &j)) return verr;
    if (!fe_norm_axis(st, b, 1, &i, rank) || !fe_norm_axis(st, b, 2, &j, rank)) return verr;
  } else if (rank < 2) {
    char t[64];
    ERR(b->slot_loc[0], "'transpose' needs a tensor of rank 2 or more, got %s",
        fe_fmt_type(dsc_node_type(x.node), t, sizeof t));
    return verr;
  }
  for (int k = 0; k < rank; k++) ints[k] = k;
  ints[i] = j;
  ints[j] = i;
  fe_at(st, loc);
  return fe_tensor(st, dsc_permute(st->g, x.node, ints, rank), loc);
}

/* Arguments 0 (a tensor) and 1 (a list of integers) of permute, reshape
 * and broadcast. */
static bool tensor_and_list(fe_state *st, fe_frame *fr, fe_binding *b, fe_value *x, int64_t *ints,
                            int *n) {
  *x = fe_arg_tensor(st, fr, b, 0);
  return x->kind != V_ERR && fe_arg_ints(st, fr, b, 1, false, ints, n);
}

static fe_value lower_permute(fe_state *st, fe_frame *fr, const fe_builtin *bi, fe_binding *b,
                              dsc_loc loc) {
  IR_UNUSED(bi);
  int64_t ints[DSC_MAX_RANK];
  int n = 0;
  fe_value x;
  if (!tensor_and_list(st, fr, b, &x, ints, &n)) return verr;
  int rank = dsc_node_type(x.node).rank;
  for (int k = 0; k < n; k++) /* each axis as written, like transpose */
    if (!fe_norm_axis(st, b, 1, &ints[k], rank)) return verr;
  fe_at(st, loc);
  return fe_tensor(st, dsc_permute(st->g, x.node, ints, n), loc);
}

static fe_value lower_reshape(fe_state *st, fe_frame *fr, const fe_builtin *bi, fe_binding *b,
                              dsc_loc loc) {
  IR_UNUSED(bi);
  int64_t ints[DSC_MAX_RANK];
  int n = 0;
  fe_value x;
  if (!tensor_and_list(st, fr, b, &x, ints, &n)) return verr;
  dsc_type t = dsc_node_type(x.node);
  int64_t total = dsc_type_numel(&t), known = 1;
  int infer = -1;
  for (int k = 0; k < n; k++) {
    if (ints[k] == -1) {
      if (infer >= 0) {
        ERR(b->slot_loc[1], "'reshape' can infer only one dimension (-1)");
        return verr;
      }
      infer = k;
    } else if (ints[k] <= 0) {
      ERR(b->slot_loc[1], "dimension %d of the new shape must be positive or -1, got %lld", k,
          (long long)ints[k]);
      return verr;
    } else if (__builtin_mul_overflow(known, ints[k], &known) || known > FE_MAX_NUMEL) {
      ERR(b->slot_loc[1], "the new shape has too many elements");
      return verr;
    }
  }
  char tb[96];
  if (infer >= 0) {
    if (total % known != 0) {
      ERR(loc, "cannot reshape %s (%lld elements) into a shape with a multiple of %lld",
          fe_fmt_type(t, tb, sizeof tb), (long long)total, (long long)known);
      return verr;
    }
    ints[infer] = total / known;
  }
  fe_at(st, loc);
  return fe_tensor(st, dsc_reshape(st->g, x.node, ints, n), loc);
}

static fe_value lower_slice(fe_state *st, fe_frame *fr, const fe_builtin *bi, fe_binding *b,
                            dsc_loc loc) {
  IR_UNUSED(bi);
  int64_t axis, start, end;
  fe_value x = fe_arg_tensor(st, fr, b, 0);
  if (x.kind == V_ERR || !fe_arg_int(st, fr, b, 1, &axis) || !fe_arg_int(st, fr, b, 2, &start) ||
      !fe_arg_int(st, fr, b, 3, &end))
    return verr;
  dsc_type t = dsc_node_type(x.node);
  if (!fe_norm_axis(st, b, 1, &axis, t.rank)) return verr;
  int64_t d = t.dims[axis], s0 = start, e0 = end;
  if (start < 0) start += d;
  if (end < 0) end += d;
  if (start < 0 || start >= d || end <= start || end > d) {
    ERR(loc, "slice [%lld, %lld) is empty or out of range for axis %lld of size %lld",
        (long long)s0, (long long)e0, (long long)axis, (long long)d);
    return verr;
  }
  dsc_attr a[3] = {dsc_attr_int("axis", axis), dsc_attr_int("start", start),
                   dsc_attr_int("end", end)};
  fe_at(st, loc);
  return fe_tensor(st, dsc_build(st->g, DSC_OP_SLICE, &x.node, 1, a, 3), loc);
}

static fe_value lower_concat(fe_state *st, fe_frame *fr, const fe_builtin *bi, fe_binding *b,
                             dsc_loc loc) {
  IR_UNUSED(bi);
  fe_value l = fe_ev(st, fr, b->slots[0]);
  if (l.kind == V_ERR) return verr;
  if (l.kind != V_LIST || l.n == 0) {
    ERR(b->slot_loc[0], "argument 'xs' of 'concat' must be a non-empty list of tensors");
    return verr;
  }
  dsc_node **in = st_alloc(st, sizeof(dsc_node *) * (size_t)l.n);
  if (!in) return verr;
  for (int k = 0; k < l.n; k++) {
    if (l.items[k].kind == V_ERR) return verr;
    if (l.items[k].kind != V_TENSOR) {
      ERR(b->slot_loc[0], "entry %d of the list given to 'concat' is %s, not a tensor", k,
          fe_kind_name(&l.items[k]));
      return verr;
    }
    in[k] = l.items[k].node;
  }
  int64_t axis = -1;
  if (b->slots[1] && !fe_arg_int(st, fr, b, 1, &axis)) return verr;
  if (!fe_norm_axis(st, b, b->slots[1] ? 1 : 0, &axis, dsc_node_type(in[0]).rank)) return verr;
  dsc_attr a = dsc_attr_int("axis", axis);
  fe_at(st, loc);
  return fe_tensor(st, dsc_build(st->g, DSC_OP_CONCAT, in, l.n, &a, 1), loc);
}

static fe_value lower_broadcast(fe_state *st, fe_frame *fr, const fe_builtin *bi, fe_binding *b,
                                dsc_loc loc) {
  IR_UNUSED(bi);
  int64_t ints[DSC_MAX_RANK];
  int n = 0;
  fe_value x;
  if (!tensor_and_list(st, fr, b, &x, ints, &n)) return verr;
  if (!fe_check_shape(st, b->slot_loc[1], ints, n)) return verr;
  dsc_attr a = dsc_attr_ints("shape", ints, n);
  fe_at(st, loc);
  return fe_tensor(st, dsc_build(st->g, DSC_OP_BROADCAST, &x.node, 1, &a, 1), loc);
}

static fe_value lower_iota(fe_state *st, fe_frame *fr, const fe_builtin *bi, fe_binding *b,
                           dsc_loc loc) {
  int64_t len;
  dsc_dtype dt = DSC_I32;
  if (!fe_arg_int(st, fr, b, 0, &len)) return verr;
  if (b->slots[1] && !fe_arg_dtype(st, fr, b, 1, &dt)) return verr;
  if (len <= 0 || len > FE_MAX_NUMEL) {
    ERR(b->slot_loc[0], "'iota' needs a positive length up to 2^40, got %lld", (long long)len);
    return verr;
  }
  if (!fe_need_graph(st, fr, bi->name, loc)) return verr;
  dsc_attr a[3] = {dsc_attr_int("axis", 0), dsc_attr_dtype("dtype", dt),
                   dsc_attr_ints("shape", &len, 1)};
  fe_at(st, loc);
  return fe_tensor(st, dsc_build(st->g, DSC_OP_IOTA, NULL, 0, a, 3), loc);
}

static fe_value fill_or_full(fe_state *st, fe_frame *fr, const fe_builtin *bi, fe_binding *b,
                             dsc_loc loc, bool full) {
  int64_t ints[DSC_MAX_RANK];
  int n = 0;
  dsc_dtype dt = DSC_F32;
  fe_value value = vint((int64_t)bi->value);
  int kdt = full ? 2 : 1;
  if (!fe_arg_ints(st, fr, b, 0, true, ints, &n)) return verr;
  if (full) {
    value = fe_ev(st, fr, b->slots[1]);
    if (value.kind == V_ERR) return verr;
    if (value.kind != V_NUM) {
      ERR(b->slot_loc[1], "argument 'value' of 'full' must be a number, not %s",
          fe_kind_name(&value));
      return verr;
    }
  }
  if (b->slots[kdt] && !fe_arg_dtype(st, fr, b, kdt, &dt)) return verr;
  if (full &&
      !fe_check_fits(st, &value, dt, "the tensor 'full' creates", b->slot_loc[1]))
    return verr;
  if (!fe_check_shape(st, b->slot_loc[0], ints, n) || !fe_need_graph(st, fr, bi->name, loc))
    return verr;
  fe_at(st, loc);
  return fe_tensor(st, dsc_const(st->g, num(&value), dsc_type_make(dt, n, ints)), loc);
}

static fe_value lower_fill(fe_state *st, fe_frame *fr, const fe_builtin *bi, fe_binding *b,
                           dsc_loc loc) {
  return fill_or_full(st, fr, bi, b, loc, false);
}

static fe_value lower_full(fe_state *st, fe_frame *fr, const fe_builtin *bi, fe_binding *b,
                           dsc_loc loc) {
  return fill_or_full(st, fr, bi, b, loc, true);
}

static fe_value lower_softmax(fe_state *st, fe_frame *fr, const fe_builtin *bi, fe_binding *b,
                              dsc_loc loc) {
  int64_t axis = -1;
  fe_value x = fe_arg_tensor(st, fr, b, 0);
  if (x.kind == V_ERR) return verr;
  if (b->slots[1] && !fe_arg_int(st, fr, b, 1, &axis)) return verr;
  if (!fe_norm_axis(st, b, b->slots[1] ? 1 : 0, &axis, dsc_node_type(x.node).rank)) return verr;
  dsc_attr a = dsc_attr_int("axis", axis);
  fe_at(st, loc);
  return fe_tensor(st, dsc_build(st->g, bi->op, &x.node, 1, &a, 1), loc);
}

static fe_value lower_norm(fe_state *st, fe_frame *fr, const fe_builtin *bi, fe_binding *b,
                           dsc_loc loc) {
  int nt = bi->n_req;
  double eps = bi->value;
  dsc_node *in[3];
  for (int k = 0; k < nt; k++) {
    fe_value v = fe_arg_tensor(st, fr, b, k);
    if (v.kind == V_ERR) return verr;
    in[k] = v.node;
  }
  if (b->slots[nt] && !fe_arg_num(st, fr, b, nt, &eps)) return verr;
  if (!(eps > 0)) {
    ERR(b->slot_loc[nt], "'eps' must be positive");
    return verr;
  }
  dsc_attr a = dsc_attr_float("eps", eps);
  fe_at(st, loc);
  return fe_tensor(st, dsc_build(st->g, bi->op, in, nt, &a, 1), loc);
}

/* attention(q, k, v, heads, causal = true, kv_heads = heads, scale = 1/sqrt(hd),
 *           window = 0): window > 0, Mistral's sliding window */
static fe_value lower_attention(fe_state *st, fe_frame *fr, const fe_builtin *bi, fe_binding *b,
                                dsc_loc loc) {
  IR_UNUSED(bi);
  fe_value x = fe_arg_tensor(st, fr, b, 0);
  fe_value y = fe_arg_tensor(st, fr, b, 1);
  fe_value z = fe_arg_tensor(st, fr, b, 2);
  int64_t heads, kv_heads;
  bool causal = true;
  double scale = 0;
  if (x.kind == V_ERR || y.kind == V_ERR || z.kind == V_ERR || !fe_arg_int(st, fr, b, 3, &heads))
    return verr;
  if (b->slots[4] && !fe_arg_bool(st, fr, b, 4, &causal)) return verr;
  kv_heads = heads;
  if (b->slots[5] && !fe_arg_int(st, fr, b, 5, &kv_heads)) return verr;
  if (b->slots[6] && !fe_arg_num(st, fr, b, 6, &scale)) return verr;
  int64_t window = 0;
  if (b->slots[7] && !fe_arg_int(st, fr, b, 7, &window)) return verr;
  if (window < 0 || (window > 0 && !causal)) {
    ERR(b->slot_loc[7], "'window' must be 0 (none) or positive with causal = true, got %lld%s",
        (long long)window, causal ? "" : " and causal = false");
    return verr;
  }
  if (heads <= 0) {
    ERR(b->slot_loc[3], "'heads' must be positive, got %lld", (long long)heads);
    return verr;
  }
  if (kv_heads <= 0 || heads % kv_heads != 0) {
    ERR(b->slot_loc[5], "'kv_heads' must be positive and divide heads = %lld, got %lld",
        (long long)heads, (long long)kv_heads);
    return verr;
  }
  if (b->slots[6] && !(scale > 0 && isfinite(scale))) {
    ERR(b->slot_loc[6], "'scale' must be positive, got %g", scale);
    return verr;
  }
  fe_at(st, loc);
  return fe_tensor(
      st,
      dsc_attention_windowed(st->g, x.node, y.node, z.node, heads, kv_heads, causal, scale, window),
      loc);
}

/* rope(x, heads, theta = 10000, positions = iota(T), interleaved = false,
 *      factor = 1, low_freq_factor, high_freq_factor, original_context):
 * the last four are Llama 3.1's frequency scaling (transformers'
 * rope_scaling of rope_type "llama3"), all given when factor > 1 */
static fe_value lower_rope(fe_state *st, fe_frame *fr, const fe_builtin *bi, fe_binding *b,
                           dsc_loc loc) {
  IR_UNUSED(bi);
  fe_value x = fe_arg_tensor(st, fr, b, 0);
  int64_t heads;
  double theta = 10000.0;
  bool inter = false;
  if (x.kind == V_ERR || !fe_arg_int(st, fr, b, 1, &heads)) return verr;
  if (b->slots[2] && !fe_arg_num(st, fr, b, 2, &theta)) return verr;
  if (b->slots[4] && !fe_arg_bool(st, fr, b, 4, &inter)) return verr;
  if (heads <= 0) {
    ERR(b->slot_loc[1], "'heads' must be positive, got %lld", (long long)heads);
    return verr;
  }
  if (!(theta > 1 && isfinite(theta))) {
    ERR(b->slot_loc[2], "'theta' must be above 1, got %g", theta);
    return verr;
  }
  dsc_rope_scaling sc = {1, 0, 0, 0};
  if (b->slots[5] && !fe_arg_num(st, fr, b, 5, &sc.factor)) return verr;
  if (!(sc.factor >= 1 && isfinite(sc.factor))) {
    ERR(b->slot_loc[5], "'factor' must be at least 1 (1: no scaling), got %g", sc.factor);
    return verr;
  }
  for (int k = 6; k <= 8; k++) {
    if (sc.factor > 1 && !b->slots[k]) {
      ERR(b->slot_loc[5], "'rope' with factor %g needs '%s' too (Llama 3.1's scaling)", sc.factor,
          b->params[k]);
      return verr;
    }
    if (sc.factor == 1 && b->slots[k]) {
      ERR(b->slot_loc[k], "'%s' scales the frequencies only with a 'factor' above 1", b->params[k]);
      return verr;
    }
  }
  if (sc.factor > 1) {
    if (!fe_arg_num(st, fr, b, 6, &sc.low_freq_factor) ||
        !fe_arg_num(st, fr, b, 7, &sc.high_freq_factor) ||
        !fe_arg_int(st, fr, b, 8, &sc.original_context))
      return verr;
    if (!(sc.low_freq_factor > 0 && sc.high_freq_factor > sc.low_freq_factor &&
          isfinite(sc.high_freq_factor))) {
      ERR(b->slot_loc[7], "'high_freq_factor' must be above 'low_freq_factor' > 0, got %g and %g",
          sc.high_freq_factor, sc.low_freq_factor);
      return verr;
    }
    if (sc.original_context <= 0) {
      ERR(b->slot_loc[8], "'original_context' must be positive, got %lld",
          (long long)sc.original_context);
      return verr;
    }
  }
  dsc_type xt = dsc_node_type(x.node);
  dsc_node *pos;
  if (b->slots[3]) {
    fe_value p = fe_arg_tensor(st, fr, b, 3);
    if (p.kind == V_ERR) return verr;
    pos = p.node;
  } else { /* positions 0 .. T-1 */
    if (xt.rank < 2) {
      ERR(b->slot_loc[0], "'rope' needs x of rank >= 2 [..., T, C], got rank %d", xt.rank);
      return verr;
    }
    fe_at(st, loc);
    int64_t T = xt.dims[xt.rank - 2];
    dsc_attr a[3] = {dsc_attr_int("axis", 0), dsc_attr_dtype("dtype", DSC_I32),
                     dsc_attr_ints("shape", &T, 1)};
    pos = dsc_build(st->g, DSC_OP_IOTA, NULL, 0, a, 3);
  }
  fe_at(st, loc);
  return fe_tensor(st, dsc_rope_scaled(st->g, x.node, pos, heads, theta, inter, &sc), loc);
}

/* dropout(x, p): each instance (a block's loop unrolls into several) its own
 * stream; the seed is the graph input DSC_DROPOUT_SEED, made on first use.
 * Evaluation modules (opts->eval) and p = 0 leave x as it is. */
static fe_value lower_dropout(fe_state *st, fe_frame *fr, const fe_builtin *bi, fe_binding *b,
                              dsc_loc loc) {
  IR_UNUSED(bi);
  fe_value x = fe_arg_tensor(st, fr, b, 0);
  double p;
  if (x.kind == V_ERR || !fe_arg_num(st, fr, b, 1, &p)) return verr;
  if (!(p >= 0 && p < 1)) {
    ERR(b->slot_loc[1], "'p' must be in [0, 1), got %g", p);
    return verr;
  }
  if (!dsc_dtype_is_float(dsc_node_type(x.node).dtype)) {
    ERR(b->slot_loc[0], "'dropout' needs a float tensor, got %s",
        dsc_dtype_name(dsc_node_type(x.node).dtype));
    return verr;
  }
  if (p == 0 || (st->opts && st->opts->eval)) return x;
  if (st->dropout_streams >= IR_DROPOUT_MAX_STREAMS) {
    ERR(loc, "more than %d dropouts in one model", IR_DROPOUT_MAX_STREAMS);
    return verr;
  }
  if (!st->dropout_seed) {
    for (int i = 0; i < dsc_graph_input_count(st->g); i++)
      if (strcmp(dsc_node_name(dsc_graph_input_at(st->g, i)), DSC_DROPOUT_SEED) == 0) {
        ERR(loc, "'dropout' adds the graph input '" DSC_DROPOUT_SEED
                 "': the model's forward "
                 "already has an argument of that name");
        return verr;
      }
    int64_t one = 1;
    fe_at(st, loc);
    if (!(st->dropout_seed =
              dsc_graph_input(st->g, DSC_DROPOUT_SEED, dsc_type_make(DSC_I64, 1, &one)))) {
      st->oom = true;
      return verr;
    }
  }
  fe_at(st, loc);
  return fe_tensor(st, dsc_dropout(st->g, x.node, st->dropout_seed, p, st->dropout_streams++), loc);
}

/* name, lowering, op, required arguments, value (fill or eps default), parameters */
#define B(nm, fn, o, req, val, ...) \
  {.name = nm, .lower = fn, .op = o, .n_req = req, .value = val, .params = {__VA_ARGS__}}
static const fe_builtin builtins[] = {
    B("sum", lower_reduce, DSC_OP_SUM, 1, 0, "x", "axis", "keepdims"),
    B("mean", lower_reduce, DSC_OP_MEAN, 1, 0, "x", "axis", "keepdims"),
    B("max", lower_reduce, DSC_OP_MAX, 1, 0, "x", "axis", "keepdims"),
    B("matmul", lower_binary, DSC_OP_MATMUL, 2, 0, "a", "b"),
    B("transpose", lower_transpose, DSC_OP_PERMUTE, 1, 0, "x", "i", "j"),
    B("permute", lower_permute, DSC_OP_PERMUTE, 2, 0, "x", "perm"),
    B("reshape", lower_reshape, DSC_OP_RESHAPE, 2, 0, "x", "shape"),
    B("slice", lower_slice, DSC_OP_SLICE, 4, 0, "x", "axis", "start", "end"),
    B("concat", lower_concat, DSC_OP_CONCAT, 1, 0, "xs", "axis"),
    B("broadcast", lower_broadcast, DSC_OP_BROADCAST, 2, 0, "x", "shape"),
    B("embedding", lower_binary, DSC_OP_EMBEDDING, 2, 0, "table", "ids"),
    B("iota", lower_iota, DSC_OP_IOTA, 1, 0, "n", "dtype"),
    B("zeros", lower_fill, DSC_OP_CONST, 1, 0.0, "shape", "dtype"),
    B("ones", lower_fill, DSC_OP_CONST, 1, 1.0, "shape", "dtype"),
    B("full", lower_full, DSC_OP_CONST, 2, 0, "shape", "value", "dtype"),
    B("softmax", lower_softmax, DSC_OP_SOFTMAX, 1, 0, "x", "axis"),
    B("log_softmax", lower_softmax, DSC_OP_LOG_SOFTMAX, 1, 0, "x", "axis"),
    B("layernorm", lower_norm, DSC_OP_LAYERNORM, 3, 1e-5, "x", "w", "b", "eps"),
    B("rmsnorm", lower_norm, DSC_OP_RMSNORM, 2, 1e-6, "x", "w", "eps"),
    B("attention", lower_attention, DSC_OP_ATTENTION, 4, 0, "q", "k", "v", "heads", "causal",
      "kv_heads", "scale", "window"),
    B("rope", lower_rope, DSC_OP_ROPE, 2, 0, "x", "heads", "theta", "positions", "interleaved",
      "factor", "low_freq_factor", "high_freq_factor", "original_context"),
    B("dropout", lower_dropout, DSC_OP_DROPOUT, 2, 0, "x", "p"),
    B("cross_entropy", lower_binary, DSC_OP_CROSS_ENTROPY, 2, 0, "logits", "targets"),
};
#undef B
#define N_BUILTINS ((int)(sizeof builtins / sizeof builtins[0]))

/* ---------------------------------------------------------------- lookup */

bool fe_find_builtin(const char *name, fe_builtin *out) {
  for (int i = 0; i < N_BUILTINS; i++)
    if (strcmp(builtins[i].name, name) == 0) {
      *out = builtins[i];
      return true;
    }
  for (int op = 0; op < DSC_OP_COUNT; op++) {
    const ir_op_info *oi = ir_op((dsc_op)op);
    if (oi->builtin[0] && strcmp(oi->name, name) == 0) return builtin_of_op((dsc_op)op, out);
  }
  return false;
}

int fe_builtin_names(const char **out, int max) {
  int n = 0;
  for (int op = 0; op < DSC_OP_COUNT && n < max; op++)
    if (ir_op((dsc_op)op)->builtin[0]) out[n++] = ir_op((dsc_op)op)->name;
  for (int i = 0; i < N_BUILTINS && n < max; i++) out[n++] = builtins[i].name;
  return n;
}

fe_value fe_call_builtin(fe_state *st, fe_frame *fr, const fe_builtin *bi, const fe_expr *call) {
  fe_binding b;
  memset(&b, 0, sizeof b);
  b.fname = bi->name;
  b.params = bi->params;
  int max_params = (int)(sizeof bi->params / sizeof bi->params[0]);
  while (b.n_params < max_params && bi->params[b.n_params]) b.n_params++;
  b.n_req = bi->n_req;
  if (!fe_bind_args(st, call, &b)) return verr;
  return bi->lower(st, fr, bi, &b, call->loc);
}
