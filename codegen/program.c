/* A readable listing of a Program (for dumps and test failures), and the
 * executors' kernel table of a lowered program. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "codegen/codegen.h"

typedef struct {
  ir_arena *a;
  char *buf;
  size_t len, cap;
  bool failed;
} sbuf;

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...) {
  if (b->failed) return;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (n < 0) {
    b->failed = true;
    return;
  }
  if (b->len + (size_t)n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 1024;
    while (cap < b->len + (size_t)n + 1) cap *= 2;
    char *nb = ir_arena_alloc(b->a, cap);
    if (!nb) {
      b->failed = true;
      return;
    }
    if (b->len) memcpy(nb, b->buf, b->len);
    b->buf = nb;
    b->cap = cap;
  }
  va_start(ap, fmt);
  vsnprintf(b->buf + b->len, (size_t)n + 1, fmt, ap);
  va_end(ap);
  b->len += (size_t)n;
}

static void matrix(sbuf *b, const char *name, const cg_matrix *m) {
  sb_printf(b, " %s=b%d+%lld[%lld,%lld;%lld,%lld]", name, m->buffer, (long long)m->offset,
            (long long)m->batch_stride[0], (long long)m->batch_stride[1], (long long)m->row_stride,
            (long long)m->col_stride);
}

char *cg_program_print(ir_arena *a, const cg_program *p) {
  sbuf b = {.a = a};
  static const char *kinds[] = {"param", "input", "temp"};
  sb_printf(&b, "program %s: state %lld bytes, work %lld bytes\n", p->graph_name ? p->graph_name : "?",
            (long long)p->arena_bytes[CG_ARENA_STATE], (long long)p->arena_bytes[CG_ARENA_WORK]);
  for (int i = 0; i < p->n_buffers; i++) {
    const cg_buffer *x = &p->buffers[i];
    if (x->kind == CG_BUF_TEMP && x->first_use < 0) continue; /* dropped (written in place) */
    sb_printf(&b, "  b%d: %s %d %s[%lld] @%s+%lld live [%d, %d]\n", i, kinds[x->kind], x->index,
              dsc_dtype_name(x->dtype), (long long)x->numel,
              x->kind == CG_BUF_PARAM ? "state" : "work", (long long)x->offset, x->first_use,
              x->last_use);
  }
  for (int i = 0; i < p->n_instrs; i++) {
    const cg_instr *in = &p->instrs[i];
    sb_printf(&b, "  %d: %s", i, in->host_stream ? "host " : "");
    if (in->guarded) sb_printf(&b, "%s b%d: ", in->guard_if ? "when" : "unless", in->guard);
    switch (in->kind) {
      case CG_INS_LAUNCH:
        sb_printf(&b, "launch %s(", p->kernels[in->kernel]->name);
        for (int j = 0; j < in->n_args; j++) sb_printf(&b, "%sb%d", j ? ", " : "", in->args[j]);
        sb_printf(&b, ")\n");
        break;
      case CG_INS_GEMM: {
        const cg_gemm *g = &in->gemm;
        sb_printf(&b, "gemm batch=[%lld,%lld] m=%lld n=%lld k=%lld", (long long)g->batch[0],
                  (long long)g->batch[1], (long long)g->m, (long long)g->n, (long long)g->k);
        matrix(&b, "a", &g->a);
        matrix(&b, "b", &g->b);
        matrix(&b, "c", &g->c);
        sb_printf(&b, "\n");
        break;
      }
      case CG_INS_EMBEDDING_GRAD:
        sb_printf(&b, "embedding_grad b%d %s ids b%d (%lld), src b%d, rows %lld cols %lld\n", in->dst,
                  in->accumulate ? "+=" : "<-", in->ids, (long long)in->n_ids, in->src,
                  (long long)in->rows, (long long)in->cols);
        break;
      case CG_INS_SET_ROWS:
        sb_printf(&b, "set_rows b%d ids b%d (%lld), src b%d, rows %lld cols %lld\n", in->dst,
                  in->ids, (long long)in->n_ids, in->src, (long long)in->rows, (long long)in->cols);
        break;
      case CG_INS_COPY:
        sb_printf(&b, "copy b%d+%lld <- b%d+%lld%s (%lld)\n", in->dst, (long long)in->dst_offset,
                  in->src, (long long)in->src_offset, in->src_rank_chunk ? "+rank*numel" : "",
                  (long long)in->numel);
        break;
      case CG_INS_COLLECTIVE_START:
      case CG_INS_COLLECTIVE_WAIT: {
        const cg_collective *c = &in->coll;
        const char *name = cg_coll_kind_name(c->kind);
        if (in->kind == CG_INS_COLLECTIVE_WAIT) {
          sb_printf(&b, "%s_wait #%d b%d\n", name, c->id, in->dst);
          break;
        }
        sb_printf(&b, "%s_start #%d b%d <- b%d %s count=%lld world=%lld tag=%lld", name, c->id,
                  in->dst, in->src, dsc_dtype_name(c->dtype), (long long)c->count,
                  (long long)c->world, (long long)c->tag);
        if (c->kind == CG_COLL_BROADCAST) sb_printf(&b, " root=%d", c->root);
        if (c->group[0]) sb_printf(&b, " group=%s", c->group);
        sb_printf(&b, "\n");
        break;
      }
      case CG_INS_TIER_START:
      case CG_INS_TIER_WAIT:
        sb_printf(&b, "tier_%s_%s #%d b%d param %d\n", in->tier.write ? "write" : "read",
                  in->kind == CG_INS_TIER_START ? "start" : "wait", in->tier.id, in->src,
                  in->tier.param);
        break;
    }
  }
  for (int i = 0; i < p->n_outputs; i++)
    sb_printf(&b, "  output %d: b%d+%lld\n", i, p->outputs[i].buffer, (long long)p->outputs[i].offset);
  for (int i = 0; i < p->n_assigns; i++) {
    const cg_assign *as = &p->assigns[i];
    sb_printf(&b, "  assign param %d <- b%d%s", as->param, as->buffer,
              as->in_place ? " (in place)" : "");
    if (as->guarded) sb_printf(&b, " %s b%d", as->guard_if ? "when" : "unless", as->guard);
    sb_printf(&b, "\n");
  }
  for (int i = 0; i < p->n_kernels; i++) {
    char *k = kir_print(a, p->kernels[i]);
    sb_printf(&b, "%s", k ? k : "  (kernel listing failed)\n");
  }
  return b.failed ? NULL : b.buf;
}

dsc_status cg_program_kernel_table(ir_arena *a, cg_program *p) {
  p->kernel_info = ir_arena_alloc(a, sizeof(cg_kernel_info) * (size_t)(p->n_kernels + 1));
  if (!p->kernel_info) return DSC_ERR_INTERNAL;
  for (int i = 0; i < p->n_kernels; i++) {
    const kir_kernel *k = p->kernels[i];
    cg_kernel_info *ki = &p->kernel_info[i];
    cg_kernel_arg *args = ir_arena_alloc(a, sizeof *args * (size_t)(k->n_args + 1));
    if (!args) return DSC_ERR_INTERNAL;
    for (int j = 0; j < k->n_args; j++)
      args[j] =
          (cg_kernel_arg){k->args[j].dtype, k->args[j].numel, k->args[j].read, k->args[j].written};
    int64_t outer = 1, inner = 1;
    for (int d = 0; d < k->rank; d++) {
      if (d < k->n_outer)
        outer *= k->dims[d];
      else
        inner *= k->dims[d];
    }
    int64_t work = inner * (k->n_stages > 0 ? k->n_stages : 1);
    *ki = (cg_kernel_info){k->name, kir_hash(k), k->n_args, args, outer, work > 0 ? work : 1,
                            k->distinct_args};
  }
  return DSC_OK;
}
