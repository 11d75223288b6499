/* program/verify.c: the one check of a Program before an executor trusts it.
 * A Program may come from a .dsx file someone else wrote, so every index,
 * range and pairing is checked here, against the arenas the executor will
 * give it, before anything is allocated or launched: an executor then only
 * adds what its backend cannot do (a GEMM dtype its library lacks, a kernel
 * it has no code for). Each problem is one diagnostic naming the program and
 * the instruction. */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "program/program.h"

typedef struct {
  dsc_context *ctx;
  const cg_program *p;
  const cg_verify_limits *lim;
} verifier;

static bool bad(const verifier *v, int ins, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static bool bad(const verifier *v, int ins, const char *fmt, ...) {
  char msg[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  const char *name = v->p->graph_name ? v->p->graph_name : "?";
  char where[32] = "", backend[48] = "";
  if (ins >= 0) snprintf(where, sizeof where, "instruction %d: ", ins);
  if (v->lim && v->lim->backend) snprintf(backend, sizeof backend, "backend %s: ", v->lim->backend);
  ir_error(v->ctx, ir_no_loc, "%sprogram '%s': %s%s", backend, name, where, msg);
  return false;
}

int64_t cg_gemm_extent(const cg_gemm *g, int which) {
  const cg_matrix *x = which == 0 ? &g->a : which == 1 ? &g->b : &g->c;
  int64_t rows = which == 1 ? g->k : g->m, cols = which == 0 ? g->k : g->n;
  int64_t n[4] = {g->batch[0], g->batch[1], rows, cols};
  int64_t stride[4] = {x->batch_stride[0], x->batch_stride[1], x->row_stride, x->col_stride};
  /* INT64_MAX (past any buffer) when a term overflows or is negative */
  int64_t end = x->offset, term;
  if (end < 0) return INT64_MAX;
  for (int d = 0; d < 4; d++) {
    if (n[d] < 1 || stride[d] < 0 || __builtin_mul_overflow(n[d] - 1, stride[d], &term) ||
        __builtin_add_overflow(end, term, &end))
      return INT64_MAX;
  }
  return end == INT64_MAX ? INT64_MAX : end + 1;
}

bool cg_buffer_streamed(const cg_program *p, int b, const cg_verify_limits *lim) {
  const cg_buffer *cb = &p->buffers[b];
  return cb->kind == CG_BUF_PARAM && cb->tier == CG_TIER_DISK &&
         (!lim || lim->tier_bytes[CG_TIER_DISK] == 0);
}

static bool exists(const verifier *v, int b) { return b >= 0 && b < v->p->n_buffers; }
static int64_t numel(const verifier *v, int b) { return v->p->buffers[b].numel; }

/* An instruction's operand: a buffer that exists and has memory. */
static bool operand(const verifier *v, int i, int b, const char *what) {
  if (!exists(v, b)) return bad(v, i, "%s: buffer %d does not exist", what, b);
  if (cg_buffer_streamed(v->p, b, v->lim))
    return bad(v, i, "%s: buffer %d is on the disk tier (streamed, no memory)", what, b);
  return true;
}

int cg_param_buffer(const cg_program *p, int param) {
  for (int b = 0; b < p->n_buffers; b++)
    if (p->buffers[b].kind == CG_BUF_PARAM && p->buffers[b].index == param) return b;
  return -1;
}

static bool check_buffers(const verifier *v) {
  const cg_program *p = v->p;
  const cg_verify_limits *lim = v->lim;
  if (p->arena_bytes[CG_ARENA_WORK] < 0) return bad(v, -1, "negative WORK arena size");
  if (p->host_work_bytes < 0) return bad(v, -1, "negative host work arena size");
  for (int b = 0; b < p->n_buffers; b++) {
    const cg_buffer *cb = &p->buffers[b];
    if (cb->dtype < 0 || cb->dtype >= DSC_DTYPE_COUNT || cb->numel < 0 || cb->offset < 0 ||
        (unsigned)cb->kind > CG_BUF_TEMP)
      return bad(v, -1, "buffer %d is malformed", b);
    bool host_temp = cb->kind == CG_BUF_TEMP && cb->tier == CG_TIER_HOST; /* host work arena */
    if (cb->tier < 0 || cb->tier >= CG_TIER_COUNT ||
        (cb->tier > 0 && cb->kind != CG_BUF_PARAM && !host_temp))
      return bad(v, -1, "buffer %d has a bad tier %d", b, cb->tier);
    if (!lim) continue;
    if (cb->tier > 0 && !lim->offload)
      return bad(v, -1,
                 "buffer %d is on the %s tier; this backend keeps every buffer on the device", b,
                 cb->tier == CG_TIER_HOST ? "host" : "disk");
    if (cg_buffer_streamed(p, b, lim)) continue; /* no memory; no instruction may address it */
    int64_t size = (int64_t)dsc_dtype_size(cb->dtype);
    int64_t limit = host_temp                  ? p->host_work_bytes
                    : cb->kind != CG_BUF_PARAM ? p->arena_bytes[CG_ARENA_WORK]
                                               : lim->tier_bytes[cb->tier];
    if (cb->offset % size != 0 || cb->numel > (limit - cb->offset) / size)
      return bad(v, -1,
                 "buffer %d (%" PRId64 " %s elements at byte %" PRId64
                 ") lies outside its arena (%" PRId64 " bytes)",
                 b, cb->numel, dsc_dtype_name(cb->dtype), cb->offset, limit);
  }
  return true;
}

static bool check_launch(const verifier *v, int i, const cg_instr *in) {
  const cg_program *p = v->p;
  if (in->kernel < 0 || in->kernel >= p->n_kernels)
    return bad(v, i, "kernel %d does not exist", in->kernel);
  const cg_kernel_info *k = &p->kernel_info[in->kernel];
  if (in->n_args != k->n_args)
    return bad(v, i, "kernel '%s' takes %d arguments, not %d", k->name, k->n_args, in->n_args);
  for (int a = 0; a < k->n_args; a++) {
    int b = in->args[a];
    char what[32];
    snprintf(what, sizeof what, "argument %d", a);
    if (!operand(v, i, b, what)) return false;
    if (p->buffers[b].dtype != k->args[a].dtype || k->args[a].numel > numel(v, b))
      return bad(v, i, "argument %d of kernel '%s' does not fit buffer %d", a, k->name, b);
  }
  return true;
}

static bool check_gemm(const verifier *v, int i, const cg_gemm *g) {
  int bs[3] = {g->a.buffer, g->b.buffer, g->c.buffer};
  for (int w = 0; w < 3; w++) {
    if (!operand(v, i, bs[w], "GEMM operand")) return false;
    if (g->m > 0 && g->n > 0 && g->k > 0 && g->batch[0] > 0 && g->batch[1] > 0 &&
        cg_gemm_extent(g, w) > numel(v, bs[w]))
      return bad(v, i, "GEMM operand %c reaches past buffer %d", "ABC"[w], bs[w]);
  }
  if (v->p->buffers[bs[0]].dtype != v->p->buffers[bs[1]].dtype)
    return bad(v, i, "GEMM operands A and B have different dtypes");
  return true;
}

/* embedding_grad and set_rows: ids, src rows and a dst matrix */
static bool check_embedding_grad(const verifier *v, int i, const cg_instr *in) {
  const char *what = in->kind == CG_INS_SET_ROWS ? "set_rows" : "embedding gradient";
  if (!operand(v, i, in->ids, what) || !operand(v, i, in->src, what) ||
      !operand(v, i, in->dst, what))
    return false;
  dsc_dtype it = v->p->buffers[in->ids].dtype;
  if (it != DSC_I32 && it != DSC_I64) return bad(v, i, "%s: ids not i32/i64", what);
  if (!dsc_dtype_is_float(v->p->buffers[in->src].dtype) ||
      !dsc_dtype_is_float(v->p->buffers[in->dst].dtype))
    return bad(v, i, "%s: src and dst must have float dtypes", what);
  if (in->kind == CG_INS_SET_ROWS && v->p->buffers[in->src].dtype != v->p->buffers[in->dst].dtype)
    return bad(v, i, "set_rows: src and dst have different dtypes");
  if (in->n_ids < 0 || in->rows < 0 || in->cols < 0 || in->n_ids > numel(v, in->ids) ||
      (in->cols > 0 &&
       (in->n_ids > numel(v, in->src) / in->cols || in->rows > numel(v, in->dst) / in->cols)))
    return bad(v, i, "%s: sizes do not fit the buffers", what);
  return true;
}

static bool check_collective(const verifier *v, int i, const cg_instr *in) {
  const cg_collective *c = &in->coll;
  if (c->id < 0 || c->id >= v->p->n_collectives)
    return bad(v, i, "collective %d does not exist (%d in the program)", c->id,
               v->p->n_collectives);
  if (!operand(v, i, in->src, "collective") || !operand(v, i, in->dst, "collective")) return false;
  if (v->p->buffers[in->src].dtype != c->dtype || v->p->buffers[in->dst].dtype != c->dtype)
    return bad(v, i, "collective: the buffers are not %s", dsc_dtype_name(c->dtype));
  if (c->world < 1 || c->world > INT32_MAX || c->count < 0 ||
      (unsigned)c->kind > CG_COLL_ALL_TO_ALL || memchr(c->group, 0, sizeof c->group) == NULL ||
      (c->kind == CG_COLL_BROADCAST && (c->root < 0 || c->root >= c->world)))
    return bad(v, i, "collective: malformed (world, count, kind, root or group)");
  int64_t send = c->kind == CG_COLL_BROADCAST ? 0 : c->count, recv = c->count;
  if (c->kind == CG_COLL_REDUCE_SCATTER) {
    if (c->count % c->world != 0)
      return bad(v, i, "reduce_scatter: count %" PRId64 " is not divisible by world %" PRId64,
                 c->count, c->world);
    recv = c->count / c->world;
  }
  if (c->kind == CG_COLL_ALL_GATHER || c->kind == CG_COLL_ALL_TO_ALL) {
    if (c->count > INT64_MAX / c->world) return bad(v, i, "collective: count overflows");
    recv = c->count * c->world;
    if (c->kind == CG_COLL_ALL_TO_ALL) send = recv;
  }
  if (send > numel(v, in->src) || recv > numel(v, in->dst))
    return bad(v, i,
               "collective: %" PRId64 "/%" PRId64 " elements do not fit its buffers (%" PRId64
               "/%" PRId64 ")",
               send, recv, numel(v, in->src), numel(v, in->dst));
  return true;
}

static bool check_copy(const verifier *v, int i, const cg_instr *in) {
  if (!operand(v, i, in->src, "copy") || !operand(v, i, in->dst, "copy")) return false;
  if (v->p->buffers[in->src].dtype != v->p->buffers[in->dst].dtype)
    return bad(v, i, "copy: dtypes differ");
  if (in->src_rank_chunk &&
      (in->coll.world < 1 || in->coll.world > INT32_MAX || in->numel < 0 || in->src_len < 0 ||
       in->src_offset < 0 || in->src_len > numel(v, in->src) - in->src_offset ||
       in->numel < in->src_len / in->coll.world + (in->src_len % in->coll.world != 0)))
    return bad(v, i, "copy: malformed rank chunk (world %" PRId64 ", %" PRId64 " of %" PRId64 ")",
               in->coll.world, in->numel, in->src_len);
  if (in->numel < 0 || in->src_offset < 0 || in->dst_offset < 0 ||
      (!in->src_rank_chunk && in->src_offset > numel(v, in->src) - in->numel) ||
      in->dst_offset > numel(v, in->dst) - in->numel)
    return bad(v, i, "copy: range outside the buffers");
  return true;
}

static bool check_tier_io(const verifier *v, int i, const cg_instr *in) {
  const cg_tier_io *t = &in->tier;
  if (v->lim && !v->lim->offload) return bad(v, i, "disk transfer: this backend has no disk tier");
  if (t->id < 0 || t->id >= v->p->n_tier_ios)
    return bad(v, i, "disk transfer %d does not exist (%d in the program)", t->id,
               v->p->n_tier_ios);
  if (!operand(v, i, in->src, "disk transfer")) return false;
  int pb = cg_param_buffer(v->p, t->param);
  if (pb < 0 || v->p->buffers[pb].tier != CG_TIER_DISK ||
      v->p->buffers[pb].dtype != v->p->buffers[in->src].dtype || numel(v, in->src) < numel(v, pb))
    return bad(v, i, "disk transfer: param %d is not a disk value of its buffer's size", t->param);
  return true;
}

/* Asynchronous pairs (collectives, disk transfers): each id started once,
 * then waited once, so a run never leaves a request behind and the
 * buffers' liveness covers start..wait. */
static bool check_pairs(const verifier *v, cg_ins_kind start, cg_ins_kind wait, int count,
                        const char *what) {
  const cg_program *p = v->p;
  if (count < 0) return bad(v, -1, "negative %s count", what);
  char *seen = ir_alloc(v->ctx, (size_t)count + 1);
  if (!seen) return bad(v, -1, "out of memory checking the %ss", what);
  memset(seen, 0, (size_t)count + 1);
  bool ok = true;
  for (int i = 0; i < p->n_instrs && ok; i++) {
    const cg_instr *in = &p->instrs[i];
    if (in->kind != start && in->kind != wait) continue;
    int id =
        in->kind == CG_INS_TIER_START || in->kind == CG_INS_TIER_WAIT ? in->tier.id : in->coll.id;
    int want = in->kind == start ? 0 : 1;
    if (seen[id] != want)
      ok = bad(v, i, "%s %d is %s", what, id,
               want ? "waited before its start or twice" : "started twice");
    seen[id]++;
  }
  for (int c = 0; ok && c < count; c++)
    if (seen[c] != 2) ok = bad(v, -1, "%s %d has no %s", what, c, seen[c] ? "wait" : "start");
  ir_free(v->ctx, seen, (size_t)count + 1);
  return ok;
}

/* A guard (cg_instr.guarded): a bool buffer with memory; and never on a
 * collective or a disk transfer, whose starts and waits are paired across
 * ranks and instructions. */
static bool check_guard(const verifier *v, int i, cg_ins_kind kind, int guard) {
  if (!operand(v, i, guard, "guard")) return false;
  if (v->p->buffers[guard].dtype != DSC_BOOL || numel(v, guard) < 1)
    return bad(v, i, "guard: buffer %d is not a bool", guard);
  if (kind == CG_INS_COLLECTIVE_START || kind == CG_INS_COLLECTIVE_WAIT ||
      kind == CG_INS_TIER_START || kind == CG_INS_TIER_WAIT)
    return bad(v, i, "guard on a collective or disk transfer (always run: paired)");
  return true;
}

static bool check_results(const verifier *v) {
  const cg_program *p = v->p;
  for (int o = 0; o < p->n_outputs; o++) {
    const cg_output *out = &p->outputs[o];
    int64_t n = 0;
    if (!exists(v, out->buffer) || cg_buffer_streamed(p, out->buffer, v->lim) || out->offset < 0 ||
        p->buffers[out->buffer].dtype != out->type.dtype ||
        !dsc_type_numel_checked(&out->type, &n) || out->offset > numel(v, out->buffer) - n)
      return bad(v, -1, "output %d does not fit its buffer", o);
  }
  for (int a = 0; a < p->n_assigns; a++) {
    const cg_assign *as = &p->assigns[a];
    int pb = cg_param_buffer(p, as->param);
    if (pb < 0 || !exists(v, as->buffer) || p->buffers[as->buffer].dtype != p->buffers[pb].dtype ||
        numel(v, as->buffer) < numel(v, pb))
      return bad(v, -1, "assign %d (param %d) does not match its buffers", a, as->param);
    if (cg_buffer_streamed(p, pb, v->lim) || cg_buffer_streamed(p, as->buffer, v->lim))
      return bad(v, -1, "assign %d: param %d is on the disk tier (streamed)", a, as->param);
    if (as->guarded && !check_guard(v, -1, CG_INS_COPY, as->guard)) return false;
    if (as->in_place) continue;
    /* Every param read sees the old value; an output that is the assigned
     * slot itself would see the new one, so the lowering must not do that. */
    for (int o = 0; o < p->n_outputs; o++)
      if (p->outputs[o].buffer == pb)
        return bad(v, -1, "output %d reads param %d, which assign %d overwrites", o, as->param, a);
  }
  return true;
}

bool cg_program_verify(dsc_context *ctx, const cg_program *p, const cg_verify_limits *lim) {
  verifier v = {ctx, p, lim};
  if (p->n_buffers < 0 || p->n_kernels < 0 || p->n_instrs < 0 || p->n_outputs < 0 ||
      p->n_assigns < 0 || (p->n_buffers > 0 && !p->buffers) ||
      (p->n_kernels > 0 && !p->kernel_info) || (p->n_instrs > 0 && !p->instrs) ||
      (p->n_outputs > 0 && !p->outputs) || (p->n_assigns > 0 && !p->assigns))
    return bad(&v, -1, "malformed counts");
  if (!check_buffers(&v)) return false;
  for (int i = 0; i < p->n_instrs; i++) {
    const cg_instr *in = &p->instrs[i];
    bool ok;
    switch (in->kind) {
      case CG_INS_LAUNCH:
        ok = check_launch(&v, i, in);
        break;
      case CG_INS_GEMM:
        ok = check_gemm(&v, i, &in->gemm);
        break;
      case CG_INS_EMBEDDING_GRAD:
      case CG_INS_SET_ROWS:
        ok = check_embedding_grad(&v, i, in);
        break;
      case CG_INS_COLLECTIVE_START:
      case CG_INS_COLLECTIVE_WAIT:
        ok = check_collective(&v, i, in);
        break;
      case CG_INS_COPY:
        ok = check_copy(&v, i, in);
        break;
      case CG_INS_TIER_START:
      case CG_INS_TIER_WAIT:
        ok = check_tier_io(&v, i, in);
        break;
      default:
        ok = bad(&v, i, "unknown instruction kind %d", (int)in->kind);
        break;
    }
    if (ok && in->guarded) ok = check_guard(&v, i, in->kind, in->guard);
    if (!ok) return false;
  }
  return check_pairs(&v, CG_INS_COLLECTIVE_START, CG_INS_COLLECTIVE_WAIT, p->n_collectives,
                     "collective") &&
         check_pairs(&v, CG_INS_TIER_START, CG_INS_TIER_WAIT, p->n_tier_ios, "disk transfer") &&
         check_results(&v);
}
