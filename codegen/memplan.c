/* The memory plan: what one rank's training step needs, in bytes, by
 * category, before anything is allocated or run.
 *
 * Where it lives. The issue names passes/memplan.c, but the static placement
 * of every buffer (liveness intervals, first-fit offsets, the STATE and WORK
 * arena sizes) is done by the lowering, codegen/lower.c (place_work), and
 * passes must not know codegen (docs: "passes know nothing of codegen").
 * So the plan is a reading of a lowered cg_program, here in codegen.
 *
 * Exactness. The plan lowers the graph with cg_lower_graph, the same call
 * the CPU executor makes (runtime/exec.c), and the runtime allocates exactly
 * p->arena_bytes[STATE] and p->arena_bytes[WORK] (runtime/exec_cpu.c:
 * alloc_aligned of those sizes). So the arena figures here ARE the runtime's
 * arenas, not an estimate. Graph inputs are WORK buffers (placed like the
 * temporaries), so they are inside the WORK arena. Outside the arenas the CPU
 * runtime allocates the packing scratch of its f32/bf16 GEMM (runtime/sgemm.c):
 * one slot per thread of the largest rt_sgemm_scratch_floats over the
 * program's f32 and bf16 GEMMs, plus 64 bytes of alignment (runtime/gemm_cpu.c); the plan adds it
 * to workspace when the caller passes that function (this layer cannot call
 * the runtime). Not counted: oneDNN's own scratchpads of bf16/f16 GEMMs, the
 * per-run staging of inputs and outputs, thread stacks, code.
 *
 * Categories (they add up to peak = STATE arena + WORK arena + GEMM scratch):
 *   params      bytes of the trainable params (STATE), as this rank holds them
 *               (a shard [S] when sharded: S = ceil(numel / world), zero-padded)
 *   optimizer   bytes of every module state (STATE): opt.m.*, opt.v.*,
 *               opt.momentum.*, opt.step, fp16's loss-scale scalars; but
 *               the accumulation states acc.* (grad_accum > 1, pass
 *               accumulate) are grads
 *   grads, activations, comm, workspace: the WORK buffers live at the
 *               instruction where the WORK arena's live bytes peak, by the
 *               value they hold (first match):
 *     grads       a value with role IR_ROLE_GRAD (the gradients the update
 *                 reads: the optimizer and zero passes mark them)
 *     comm        the src or dst of a collective (all-reduce results, gathered
 *                 params, reduce-scatter inputs) not counted as grads
 *     activations graph inputs and values the loss is computed from (forward
 *                 values kept for the backward pass)
 *     workspace   everything else (backward temporaries, optimizer temporaries),
 *                 plus the 64-byte alignment gaps of both arenas, the WORK
 *                 arena's fragmentation (arena size - live bytes at the peak)
 *                 and the GEMM packing scratch. */
#include <stdlib.h>
#include <string.h>

#include "codegen/codegen.h"

static int64_t align64(int64_t x) { return (x + 63) & ~(int64_t)63; }

static int64_t buf_bytes(const cg_buffer *b) {
  return (int64_t)dsc_dtype_size(b->dtype) * b->numel;
}

/* The full shape's element count of a sharded param from meta
 * "shard.<name>" = "<world> <d0>x<d1>x..."; -1 when not sharded or malformed. */
static int64_t shard_full_numel(const ir_module *m, const char *name, int64_t *world) {
  char key[512];
  snprintf(key, sizeof key, "shard.%s", name);
  const char *v = dsc_module_get_meta(m, key);
  if (!v) return -1;
  char *end;
  long long w = strtoll(v, &end, 10);
  if (w < 1 || *end != ' ') return -1;
  int64_t n = 1;
  const char *s = end + 1;
  for (;;) {
    long long d = strtoll(s, &end, 10);
    if (end == s || d < 1 || n > INT64_MAX / d) return -1;
    n *= d;
    if (*end == 0) break;
    if (*end != 'x') return -1;
    s = end + 1;
  }
  if (world) *world = w;
  return n;
}

static int64_t meta_i64(const ir_module *m, const char *key, int64_t dflt) {
  const char *v = dsc_module_get_meta(m, key);
  if (!v || !*v) return dflt;
  char *end;
  long long x = strtoll(v, &end, 10);
  return *end ? dflt : x;
}

int64_t cg_memplan_shard_padding(const ir_module *m, int64_t rank, bool states) {
  int64_t pad = 0;
  for (int i = 0; i < m->n_params; i++) {
    const ir_param *pr = &m->params[i];
    if (pr->state != states) continue;
    int64_t world = 1, full = shard_full_numel(m, pr->name, &world);
    if (full < 0) continue;
    int64_t S = dsc_type_numel(&pr->type), lo = rank * S;
    int64_t real = full - lo;
    if (real < 0) real = 0;
    if (real > S) real = S;
    pad += (S - real) * (int64_t)dsc_dtype_size(pr->type.dtype);
  }
  return pad;
}

static dsc_status oom(dsc_context *ctx) {
  ir_error(ctx, ir_no_loc, "memory plan: out of memory");
  return DSC_ERR_INTERNAL;
}

dsc_status cg_memplan_program(const ir_graph *g, const cg_program *p, const cg_memplan_options *o,
                              cg_memplan *out) {
  const ir_module *m = g->module;
  dsc_context *ctx = m->ctx;
  memset(out, 0, sizeof *out);
  out->world = meta_i64(m, "zero.world", 1);
  out->stage = meta_i64(m, "zero.stage", 0);

  /* STATE: params and states, exact bytes; the alignment gaps go to workspace. */
  int64_t state_exact = 0, acc_bytes = 0;
  for (int i = 0; i < m->n_params; i++) {
    const ir_param *pr = &m->params[i];
    int64_t numel = dsc_type_numel(&pr->type);
    int64_t bytes = numel * (int64_t)dsc_dtype_size(pr->type.dtype);
    int64_t full = shard_full_numel(m, pr->name, NULL);
    if (cg_param_tier(m, i) != CG_TIER_DEVICE) {
      /* offloaded (passes/offload.c): counted in host_bytes / disk_bytes */
      /* disk values are streamed (passes/offload_disk.c): no host bytes of
       * their own, their in-flight buffers are WORK buffers */
      bool disk = cg_param_tier(m, i) == CG_TIER_DISK;
      if (pr->state)
        out->host_optimizer += disk ? 0 : bytes, out->state_elems += numel;
      else
        out->host_params += disk ? 0 : bytes, out->param_elems += numel,
            out->param_count += full >= 0 ? full : numel;
      if (full >= 0) out->sharded = true;
      continue;
    }
    state_exact += bytes;
    if (dsc_step_is_sum(m, i)) {
      out->bytes[CG_MEM_GRADS] += bytes; /* pass accumulate's sums of the micro-batches */
      acc_bytes += bytes;
    } else if (pr->state) {
      out->bytes[CG_MEM_OPTIMIZER] += bytes;
      out->state_elems += numel;
    } else {
      out->bytes[CG_MEM_PARAMS] += bytes;
      out->param_elems += numel;
      out->param_count += full >= 0 ? full : numel;
    }
    if (shard_full_numel(m, pr->name, NULL) >= 0) out->sharded = true;
  }
  out->state_arena = p->arena_bytes[CG_ARENA_STATE];
  out->host_arena = p->tier_bytes[CG_TIER_HOST];
  out->disk_staging = 0; /* the disk tier streams through WORK buffers (no staging arena) */
  /* host-placed temporaries (passes/offload_host.c): the host work arena */
  out->host_work = p->host_work_bytes;
  out->host_bytes = out->host_arena + out->disk_staging + out->host_work;
  /* runtime/offload_io.c's file: a 4 KiB header, then two slots */
  out->disk_bytes = p->tier_bytes[CG_TIER_DISK] > 0 ? 4096 + 2 * p->tier_bytes[CG_TIER_DISK] : 0;
  out->work_arena = p->arena_bytes[CG_ARENA_WORK];
  out->padding = out->state_arena - state_exact;

  /* Live WORK bytes per instruction (as placed: 64-byte aligned, at least
   * 64), by a difference array over [first_use, last_use]; instruction
   * n_instrs stands for the outputs and assigns read after the last one. */
  int ni = out->n_instrs = p->n_instrs;
  int64_t *delta = calloc((size_t)ni + 2, sizeof *delta);
  bool *is_grad = calloc((size_t)p->n_buffers + 1, 1);
  bool *is_comm = calloc((size_t)p->n_buffers + 1, 1);
  bool *is_act = calloc((size_t)p->n_buffers + 1, 1);
  bool *anc = calloc((size_t)g->n_nodes + 1, 1);
  const ir_node **stack = calloc((size_t)g->n_nodes + 1, sizeof *stack);
  if (!delta || !is_grad || !is_comm || !is_act || !anc || !stack) {
    free(delta), free(is_grad), free(is_comm), free(is_act), free(anc), free(stack);
    return oom(ctx);
  }
  for (int b = 0; b < p->n_buffers; b++) {
    const cg_buffer *cb = &p->buffers[b];
    if (cb->kind == CG_BUF_PARAM || cb->first_use < 0 || cb->tier == CG_TIER_HOST) continue;
    int64_t sz = align64(buf_bytes(cb));
    if (sz == 0) sz = 64;
    int lo = cb->first_use, hi = cb->last_use < lo ? lo : cb->last_use;
    if (hi > ni) hi = ni;
    delta[lo] += sz;
    delta[hi + 1] -= sz;
  }
  int64_t live = 0, best = -1;
  for (int i = 0; i <= ni; i++) {
    live += delta[i];
    if (live > best) best = live, out->peak_instr = i;
  }

  /* What each buffer holds. */
  for (int i = 0; i < ni; i++) {
    const cg_instr *in = &p->instrs[i];
    if (in->kind != CG_INS_COLLECTIVE_START && in->kind != CG_INS_COLLECTIVE_WAIT) continue;
    if (in->src >= 0 && in->src < p->n_buffers) is_comm[in->src] = true;
    if (in->dst >= 0 && in->dst < p->n_buffers) is_comm[in->dst] = true;
  }
  bool have_nodes = p->node_buffer && p->n_nodes == g->n_nodes;
  if (have_nodes) {
    for (int i = 0; i < g->n_nodes; i++) {
      const ir_node *x = g->nodes[i];
      if (x->role != IR_ROLE_GRAD) continue;
      /* a gradient that is a reshape/permute view lives in its input's buffer */
      while (p->node_buffer[x->id] < 0 && (x->op == DSC_OP_RESHAPE || x->op == DSC_OP_PERMUTE))
        x = x->in[0];
      int b = p->node_buffer[x->id];
      if (b >= 0 && b < p->n_buffers) is_grad[b] = true;
    }
    /* the loss's ancestors: the forward values */
    int sp = 0;
    if (g->n_outputs > 0) anc[g->outputs[0]->id] = true, stack[sp++] = g->outputs[0];
    while (sp > 0) {
      const ir_node *x = stack[--sp];
      int b = p->node_buffer[x->id];
      if (b >= 0 && b < p->n_buffers) is_act[b] = true;
      for (int j = 0; j < x->n_in; j++)
        if (!anc[x->in[j]->id]) anc[x->in[j]->id] = true, stack[sp++] = x->in[j];
    }
  }

  /* The most gradient bytes live at once. */
  memset(delta, 0, sizeof *delta * ((size_t)ni + 2));
  for (int b = 0; b < p->n_buffers; b++) {
    const cg_buffer *cb = &p->buffers[b];
    if (!is_grad[b] || cb->kind == CG_BUF_PARAM || cb->first_use < 0 || cb->tier == CG_TIER_HOST)
      continue;
    int lo = cb->first_use, hi = cb->last_use < lo ? lo : cb->last_use;
    if (hi > ni) hi = ni;
    delta[lo] += buf_bytes(cb);
    delta[hi + 1] -= buf_bytes(cb);
  }
  live = 0;
  for (int i = 0; i <= ni; i++) {
    live += delta[i];
    if (live > out->grads_held) out->grads_held = live;
  }
  out->grads_held += acc_bytes; /* held through the whole step */

  /* Classification at the peak, exact bytes. */
  int64_t live_exact = 0;
  for (int b = 0; b < p->n_buffers; b++) {
    const cg_buffer *cb = &p->buffers[b];
    if (cb->kind == CG_BUF_PARAM || cb->first_use < 0 || cb->tier == CG_TIER_HOST) continue;
    int hi = cb->last_use < cb->first_use ? cb->first_use : cb->last_use;
    if (cb->first_use > out->peak_instr || hi < out->peak_instr) continue;
    int64_t sz = buf_bytes(cb);
    live_exact += sz;
    cg_mem_kind k = is_grad[b]                              ? CG_MEM_GRADS
                    : is_comm[b]                            ? CG_MEM_COMM
                    : cb->kind == CG_BUF_INPUT || is_act[b] ? CG_MEM_ACTIVATIONS
                                                            : CG_MEM_WORKSPACE;
    out->bytes[k] += sz;
  }
  out->work_live = live_exact;
  out->padding += out->work_arena - live_exact;
  free(delta), free(is_grad), free(is_comm), free(is_act), free(anc), free(stack);

  /* The packing scratch of the f32 and bf16 GEMMs (runtime/gemm_cpu.c
   * plan_dsc_sgemm, runtime/sgemm.c rt_sgemm_dtypes_supported). */
  if (o && o->gemm_scratch_floats) {
    int64_t need = 0;
    for (int i = 0; i < ni; i++) {
      const cg_instr *in = &p->instrs[i];
      if (in->kind != CG_INS_GEMM) continue;
      dsc_dtype ab = p->buffers[in->gemm.a.buffer].dtype, c = p->buffers[in->gemm.c.buffer].dtype;
      if ((ab != DSC_F32 && ab != DSC_BF16) || (c != DSC_F32 && c != DSC_BF16)) continue;
      int64_t f = o->gemm_scratch_floats(&in->gemm);
      if (f > need) need = f;
    }
    int threads = o->threads > 0 ? o->threads : 1;
    if (need > 0) out->gemm_scratch = need * (int64_t)sizeof(float) * threads + 64;
  }
  out->bytes[CG_MEM_WORKSPACE] += out->padding + out->gemm_scratch;
  out->peak = out->state_arena + out->work_arena + out->gemm_scratch;
  return DSC_OK;
}

dsc_status cg_memplan_graph(const ir_graph *g, ir_arena *a, const cg_memplan_options *o,
                            cg_memplan *out, cg_program **prog) {
  cg_program *p = NULL;
  dsc_status st = cg_lower_graph(g, a, &p);
  if (st != DSC_OK) return st;
  if (prog) *prog = p;
  return cg_memplan_program(g, p, o, out);
}

const char *cg_mem_kind_name(cg_mem_kind k) {
  static const char *names[CG_MEM_COUNT] = {"params",      "grads",     "optimizer",
                                            "activations", "workspace", "comm"};
  return k >= 0 && k < CG_MEM_COUNT ? names[k] : "?";
}
