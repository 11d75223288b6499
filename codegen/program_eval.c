/* The Program's reference evaluator: kir_eval for kernels, plain loops for
 * GEMMs (double accumulation), scatter-adds and copies, on host arenas. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen/codegen.h"

static double load(const void *base, dsc_dtype t, int64_t i) {
  switch (t) {
    case DSC_F32: return ((const float *)base)[i];
    case DSC_F64: return ((const double *)base)[i];
    case DSC_I32: return ((const int32_t *)base)[i];
    case DSC_I64: return (double)((const int64_t *)base)[i];
    case DSC_BOOL: return ((const uint8_t *)base)[i] != 0;
    case DSC_BF16: {
      uint32_t u = (uint32_t)((const uint16_t *)base)[i] << 16;
      float f;
      memcpy(&f, &u, 4);
      return f;
    }
    case DSC_F16: {
      uint16_t h = ((const uint16_t *)base)[i];
      int e = (h >> 10) & 31, m = h & 1023;
      double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(m + 1024, e - 25);
      return h & 0x8000 ? -v : v;
    }
    default: return 0;
  }
}

static void store(void *base, dsc_dtype t, int64_t i, double v) {
  switch (t) {
    case DSC_F32: ((float *)base)[i] = (float)v; break;
    case DSC_F64: ((double *)base)[i] = v; break;
    case DSC_I32: ((int32_t *)base)[i] = (int32_t)v; break;
    case DSC_I64: ((int64_t *)base)[i] = (int64_t)v; break;
    case DSC_BOOL: ((uint8_t *)base)[i] = v != 0; break;
    case DSC_BF16: {
      float f = ir_bf16_round((float)v);
      uint32_t u;
      memcpy(&u, &f, 4);
      ((uint16_t *)base)[i] = (uint16_t)(u >> 16);
      break;
    }
    case DSC_F16: {
      float f = ir_f16_round((float)v);
      uint16_t s = signbit(f) ? 0x8000 : 0;
      double a = fabs(f);
      uint16_t h;
      if (isnan(f)) h = 0x7e00;
      else if (a >= 65520.0) h = 0x7c00;
      else if (a < ldexp(1, -14)) h = (uint16_t)lrint(a * ldexp(1, 24));
      else {
        int e;
        double fr = frexp(a, &e); /* a = fr * 2^e, fr in [0.5, 1) */
        h = (uint16_t)(((e + 14) << 10) | ((int)lrint(fr * 2048) - 1024));
      }
      ((uint16_t *)base)[i] = s | h;
      break;
    }
    default: break;
  }
}

static void *buffer_base(const cg_program *p, void *state, void *work, int b) {
  const cg_buffer *x = &p->buffers[b];
  return (char *)(x->kind == CG_BUF_PARAM ? state : work) + x->offset;
}

bool cg_program_eval(const cg_program *p, void *state, void *work, char *err, size_t errlen) {
  if (errlen) err[0] = 0;
  for (int i = 0; i < p->n_instrs; i++) {
    const cg_instr *in = &p->instrs[i];
    switch (in->kind) {
      case CG_INS_LAUNCH: {
        const kir_kernel *k = p->kernels[in->kernel];
        void *args[64], **ap = args;
        if (in->n_args > 64 && !(ap = malloc(sizeof(void *) * (size_t)in->n_args))) {
          snprintf(err, errlen, "out of memory");
          return false;
        }
        for (int a = 0; a < in->n_args; a++) ap[a] = buffer_base(p, state, work, in->args[a]);
        bool ok = kir_eval(k, ap);
        if (ap != args) free(ap);
        if (!ok) {
          snprintf(err, errlen, "kernel %s: an index is out of range (a gather's id)", k->name);
          return false;
        }
        break;
      }
      case CG_INS_GEMM: {
        const cg_gemm *g = &in->gemm;
        dsc_dtype ta = p->buffers[g->a.buffer].dtype, tb = p->buffers[g->b.buffer].dtype,
                  tc = p->buffers[g->c.buffer].dtype;
        void *A = buffer_base(p, state, work, g->a.buffer), *B = buffer_base(p, state, work, g->b.buffer),
             *C = buffer_base(p, state, work, g->c.buffer);
        for (int64_t b0 = 0; b0 < g->batch[0]; b0++)
          for (int64_t b1 = 0; b1 < g->batch[1]; b1++) {
            int64_t oa = g->a.offset + b0 * g->a.batch_stride[0] + b1 * g->a.batch_stride[1];
            int64_t ob = g->b.offset + b0 * g->b.batch_stride[0] + b1 * g->b.batch_stride[1];
            int64_t oc = g->c.offset + b0 * g->c.batch_stride[0] + b1 * g->c.batch_stride[1];
            for (int64_t r = 0; r < g->m; r++)
              for (int64_t c = 0; c < g->n; c++) {
                double acc = 0;
                for (int64_t x = 0; x < g->k; x++)
                  acc += load(A, ta, oa + r * g->a.row_stride + x * g->a.col_stride) *
                         load(B, tb, ob + x * g->b.row_stride + c * g->b.col_stride);
                int64_t ci = oc + r * g->c.row_stride + c * g->c.col_stride;
                double prev = g->beta != 0 ? g->beta * load(C, tc, ci) : 0;
                store(C, tc, ci, g->alpha * acc + prev);
              }
          }
        break;
      }
      case CG_INS_EMBEDDING_GRAD: {
        dsc_dtype ti = p->buffers[in->ids].dtype, ts = p->buffers[in->src].dtype,
                  td = p->buffers[in->dst].dtype;
        void *I = buffer_base(p, state, work, in->ids), *S = buffer_base(p, state, work, in->src),
             *D = buffer_base(p, state, work, in->dst);
        if (!in->accumulate)
          for (int64_t x = 0; x < in->rows * in->cols; x++) store(D, td, x, 0);
        for (int64_t r = 0; r < in->n_ids; r++) {
          double id = load(I, ti, r);
          if (!(id >= 0 && id < (double)in->rows)) {
            snprintf(err, errlen, "embedding_grad: id %lld at position %lld is out of range [0, %lld)",
                     (long long)id, (long long)r, (long long)in->rows);
            return false;
          }
          for (int64_t c = 0; c < in->cols; c++) {
            int64_t di = (int64_t)id * in->cols + c;
            store(D, td, di, load(D, td, di) + load(S, ts, r * in->cols + c));
          }
        }
        break;
      }
      case CG_INS_SET_ROWS: {
        size_t es = dsc_dtype_size(p->buffers[in->dst].dtype);
        dsc_dtype ti = p->buffers[in->ids].dtype;
        void *I = buffer_base(p, state, work, in->ids);
        char *S = buffer_base(p, state, work, in->src), *D = buffer_base(p, state, work, in->dst);
        for (int64_t r = 0; r < in->n_ids; r++) {
          double id = load(I, ti, r);
          if (id >= 0 && id < (double)in->rows)
            memcpy(D + (size_t)((int64_t)id * in->cols) * es, S + (size_t)(r * in->cols) * es,
                   (size_t)in->cols * es);
        }
        break;
      }
      case CG_INS_COPY: {
        const cg_buffer *s = &p->buffers[in->src];
        if (in->src_rank_chunk && in->coll.world != 1) { /* rank 0 of 1: its chunk is at 0 */
          snprintf(err, errlen,
                   "instruction %d: a local_shard of world %lld needs a communicator (the "
                   "reference evaluator runs one rank)",
                   i, (long long)in->coll.world);
          return false;
        }
        size_t es = dsc_dtype_size(s->dtype);
        memmove((char *)buffer_base(p, state, work, in->dst) + in->dst_offset * (int64_t)es,
                (char *)buffer_base(p, state, work, in->src) + in->src_offset * (int64_t)es,
                (size_t)in->numel * es);
        break;
      }
      case CG_INS_COLLECTIVE_START: {
        /* One rank only: with world 1 every collective is a copy (a sum over
         * one rank, its own chunk, its own gather, the root's data). More
         * ranks need a communicator: the CPU executor's job. */
        const cg_collective *c = &in->coll;
        if (c->world != 1) {
          snprintf(err, errlen,
                   "instruction %d: a collective of world %lld needs a communicator (the "
                   "reference evaluator runs one rank)",
                   i, (long long)c->world);
          return false;
        }
        if (in->src != in->dst && c->kind != CG_COLL_BROADCAST)
          memmove(buffer_base(p, state, work, in->dst), buffer_base(p, state, work, in->src),
                  (size_t)c->count * dsc_dtype_size(c->dtype)); /* all_to_all: world 1, 1 chunk */
        break;
      }
      case CG_INS_COLLECTIVE_WAIT:
        break;
      case CG_INS_TIER_START:
      case CG_INS_TIER_WAIT:
        snprintf(err, errlen,
                 "instruction %d: a disk tier transfer needs the executor's offload file (the "
                 "reference evaluator has none)",
                 i);
        return false;
    }
  }
  return true;
}
