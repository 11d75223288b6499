/* The fusion pass: partitions a graph's computations into groups, each of
 * which codegen/lower.c turns into ONE kernel (kernel IR: outer dims x inner
 * dims, a sequence of REDUCE / LET / STORE stages).
 *
 * The rules, exactly as implemented:
 *  1. Kinds of nodes.
 *     - Standalone (never in a group): sources input and param; matmul,
 *       embedding_grad, assign, concat (lowered to one copy kernel per
 *       input into slices of one buffer), collective start/wait ops and any
 *       composite op (softmax, layernorm, ...: the lowering reports them,
 *       the decompose pass removes them).
 *     - Inlinable (never in a group, recomputed by every kernel that reads
 *       them): const and iota, and elementwise ops, broadcast, permute,
 *       slice, reshape (when its index map is affine) and sum/mean/max over
 *       no axes whose inputs are all inlinable (masks, index grids).
 *     - Groupable: every other elementwise op (class IR_CG_ELEMENTWISE),
 *       sum/mean/max, embedding (gather) and the views broadcast, permute,
 *       slice, reshape.
 *  2. Each groupable node starts as its own group; the pass visits the
 *     nodes in order and merges a node's group with the group of each
 *     groupable input (in input order) when the merged group is valid:
 *     - a view merges only with the group of its input, and nothing merges
 *       with a view that is alone in its group: such a view stays a free
 *       view (the lowering folds it into strides, e.g. matmul operands);
 *     - an embedding merges only through its ids (the table is a buffer);
 *       a gather of a gradient's rows (ZenFlow's selected rows) stays
 *       alone: in the update's group it would keep the whole gradient
 *       alive until the update; a gather read only through permutes
 *       (ZenFlow's table columns scattered back) stays out of groups and
 *       each reader's kernel recomputes it at its own point
 *       (ir_recomputed_gather; not when its table is itself recomputed
 *       or inlined): stored, each element of a transposed read would
 *       come from another row;
 *     - a cast between float dtypes of a stored buffer (a matmul's result,
 *       a param, a collective's, a lone reduction's, a tied embedding's
 *       gradient add(head dW, embedding_grad)), where it, its input
 *       and its readers run in one place, stays out of groups too and each
 *       reader converts the buffer itself (ir_recomputed_cast): a bf16
 *       gradient read in f32 by the norm and by the update is read twice
 *       in bf16 instead of written and read twice as an f32 copy;
 *     - a cast that is a gradient (a bias's f32 sum rounded to bf16) stays
 *       alone: stored in its dtype, it is the model state that the memory
 *       plan counts and the ranks reduce; its readers convert it;
 *     - a reduction whose axes do not include the last axis (bias
 *       gradients: sum over [0,1] of [B,T,C]) stays alone: outer = kept
 *       dims, inner = reduced dims;
 *     - domain: all reductions of the group reduce the same input shape S
 *       over the same axes R (then the domain is S's other dims as outer x
 *       R as inner), or the group has no reduction and all members have one
 *       shape S (the domain is S; its last dim is the inner one);
 *     - every member is full (its shape is S) or, in a reducing group,
 *       reduced (S without R, or with R's dims as 1: outer-only values);
 *     - every edge inside the group reads the producer at its natural
 *       point (ir_input_point == ir_natural_map), so a value
 *       is never needed at two different points;
 *     - when R is every dim of S (a reduction to a scalar: one outer
 *       index, so one thread), no full member reads a reduced one: the
 *       consumers of a global sum (gradient clipping) are other groups;
 *     - members have the same guard (passes/guard.c): a kernel runs or is
 *       skipped whole;
 *     - no path leaves the group and comes back (the group stays convex,
 *       so it can run as one instruction); the search walks back from the
 *       group's outside inputs and gives up (no merge) after 8192 nodes.
 *     So softmax over the last axis is one kernel (REDUCE max, REDUCE sum
 *     of exp, STORE), a layernorm forward one kernel, each layernorm
 *     backward's row part one kernel, an elementwise chain one kernel, the
 *     AdamW update of one param (p, g, m, v -> p, m, v) one kernel with
 *     three STORE stages, a sum of squares to a scalar one kernel with no
 *     outer dims. Matmuls, embedding_grads, assigns and collectives split
 *     groups.
 *  3. A group member used outside its group (or a graph output) is stored;
 *     other members are recomputed inside the kernel (expression DAGs).
 *     The lowering decides this from the groups alone.
 *  4. Groups of one view are dissolved (free views). Group ids are numbered
 *     1, 2, ... by first member; the nodes are reordered (a topological
 *     sort over groups and ungrouped nodes, smallest original position
 *     first) so that each group is contiguous. Groups with only scalar
 *     results (sums of squares for gradient clipping), views and inlined
 *     values go first among the ready ones: they run right after their
 *     inputs are produced, while those are still in cache. Deterministic. */
#include <stdlib.h>
#include <string.h>

#include "passes/passes.h"

/* ------------------------------------------------------------ the pass */

enum { K_NONE, K_INLINE, K_GROUP, K_ALONE, K_RECOMPUTE };

typedef struct {
  ir_graph *g;
  int n;
  unsigned char *kind;
  int *parent;  /* union-find over node ids (groupable nodes only) */
  int *next;    /* member lists: root -> ... -> -1 */
  int *tail;    /* valid at roots */
  int *size;    /* valid at roots */
  int *minpos;  /* valid at roots */
  int *maxpos;  /* valid at roots */
  int *mark;    /* scratch stamps */
  int stamp;
  bool strict;  /* convexity over whole groups (see union_valid) */
  int *stack;
  ir_node **tmp; /* members of a candidate union */
  ir_affine *pts;
  bool *only_permuted; /* per node: every reader is a permute (not an output) */
  bool *same_place;    /* per node: its readers and (one) input are where it is */
} fuse_state;

static bool is_view(dsc_op op) {
  return op == DSC_OP_BROADCAST || op == DSC_OP_PERMUTE || op == DSC_OP_SLICE ||
         op == DSC_OP_RESHAPE;
}

/* An embedding whose table is a gradient, or a view of one (ZenFlow's
 * selected rows or, of a transposed table, columns). */
static bool gathers_a_gradient(const ir_node *x) {
  const ir_node *t = x->in[0];
  while (is_view(t->op) && t->n_in == 1) t = t->in[0];
  return t->role == IR_ROLE_GRAD;
}

static int find(fuse_state *s, int x) {
  while (s->parent[x] != x) x = s->parent[x] = s->parent[s->parent[x]];
  return x;
}

static bool groupable(const ir_node *n) {
  if (is_view(n->op) || n->op == DSC_OP_EMBEDDING) return true;
  if (n->op == DSC_OP_SUM || n->op == DSC_OP_MEAN || n->op == DSC_OP_MAX) return true;
  return ir_op(n->op)->cg == IR_CG_ELEMENTWISE;
}

/* The convexity walk of union_valid: visits p's whole unit (p alone, or
 * every member of p's group), unless the unit ends before position lo or
 * was visited (stamp vst). False when p is in the union (stamp st): a path
 * leaves the union and comes back. */
static bool walk_push(fuse_state *s, ir_node *p, int st, int vst, int lo, int *sp) {
  if (s->mark[p->id] == st) return false;
  if (s->mark[p->id] == vst) return true;
  bool grouped = s->strict && (s->kind[p->id] == K_GROUP || s->kind[p->id] == K_ALONE);
  int r = grouped ? find(s, p->id) : p->id;
  if (s->maxpos[r] < lo) return true;
  if (!grouped || s->size[r] == 1) {
    s->mark[p->id] = vst;
    s->stack[(*sp)++] = p->id;
    return true;
  }
  for (int x = r; x >= 0; x = s->next[x]) {
    if (s->mark[x] == st) return false;
    if (s->mark[x] == vst) continue;
    s->mark[x] = vst;
    s->stack[(*sp)++] = x;
  }
  return true;
}

/* Is the union of groups ra and rb (roots) a valid group? */
static bool union_valid(fuse_state *s, int ra, int rb) {
  int cnt = 0;
  for (int r = 0; r < 2; r++)
    for (int x = r ? rb : ra; x >= 0; x = s->next[x]) s->tmp[cnt++] = s->g->nodes[x];
  ir_domain d;
  if (!ir_group_domain(s->tmp, cnt, &d)) return false;
  /* membership stamp */
  int st = ++s->stamp;
  for (int i = 0; i < cnt; i++) s->mark[s->tmp[i]->id] = st;
  for (int i = 0; i < cnt; i++) {
    ir_node *n = s->tmp[i];
    bool full;
    ir_affine pn[DSC_MAX_RANK], pin[DSC_MAX_RANK], nat[DSC_MAX_RANK];
    if (!ir_natural_map(&d, &n->type, pn, &full)) return false;
    uint32_t mask;
    if (ir_reduction_mask(n, &mask) && full && d.rmask != 0) return false;
    bool n_full = full;
    for (int j = 0; j < n->n_in; j++) {
      ir_node *p = n->in[j];
      if (s->mark[p->id] != st) continue;
      if (!ir_input_point(n, j, &d, pn, pin)) return false;
      if (!ir_natural_map(&d, &p->type, nat, &full)) return false;
      if (!ir_point_equal(&p->type, pin, nat)) return false;
      /* a reduction to a scalar has one outer index (one thread): values
       * over the whole domain that read its result go to another kernel */
      if (d.n_outer == 0 && d.reduces && n_full && !full) return false;
    }
  }
  /* convexity: no path from a member through non-members back to a
   * member. Walk back from the non-member inputs of members; a unit whose
   * members all come before the union's first member cannot depend on it.
   * Node by node this misses one case: two groups that are each convex can
   * still need each other (a1 -> b1 and b2 -> a2), and then no order runs
   * their kernels. The strict walk treats another group as one unit
   * (reaching a member reaches all of its inputs); it costs far more on
   * large graphs, so the pass uses it only when the node-level groups
   * cannot be ordered (pass_fuse_graph). */
  int lo = s->minpos[ra] < s->minpos[rb] ? s->minpos[ra] : s->minpos[rb];
  int vst = ++s->stamp, sp = 0;
  int budget = 8192; /* bounds the pass's time: a deeper search rejects the merge */
  for (int i = 0; i < cnt; i++) {
    ir_node *n = s->tmp[i];
    for (int j = 0; j < n->n_in; j++)
      if (s->mark[n->in[j]->id] != st && !walk_push(s, n->in[j], st, vst, lo, &sp)) return false;
  }
  while (sp > 0) {
    if (--budget < 0) return false;
    ir_node *x = s->g->nodes[s->stack[--sp]];
    if (s->kind[x->id] == K_INLINE) continue; /* depends on inlinables only */
    for (int j = 0; j < x->n_in; j++)
      if (!walk_push(s, x->in[j], st, vst, lo, &sp)) return false;
  }
  return true;
}

static void merge(fuse_state *s, int ra, int rb) {
  if (s->size[ra] < s->size[rb]) {
    int t = ra;
    ra = rb, rb = t;
  }
  s->parent[rb] = ra;
  s->next[s->tail[ra]] = rb;
  s->tail[ra] = s->tail[rb];
  s->size[ra] += s->size[rb];
  if (s->minpos[rb] < s->minpos[ra]) s->minpos[ra] = s->minpos[rb];
  if (s->maxpos[rb] > s->maxpos[ra]) s->maxpos[ra] = s->maxpos[rb];
}

/* A min-heap of units by (key, unit), for the reordering. */
static bool unit_less(const int *key, int a, int b) {
  return key[a] < key[b] || (key[a] == key[b] && a < b);
}

static void heap_push(const int *key, int *h, int *n, int v) {
  int i = (*n)++;
  h[i] = v;
  while (i > 0 && unit_less(key, h[i], h[(i - 1) / 2])) {
    int p = (i - 1) / 2, t = h[p];
    h[p] = h[i], h[i] = t, i = p;
  }
}

static int heap_pop(const int *key, int *h, int *n) {
  int top = h[0];
  h[0] = h[--(*n)];
  for (int i = 0;;) {
    int l = 2 * i + 1, r = l + 1, m = i;
    if (l < *n && unit_less(key, h[l], h[m])) m = l;
    if (r < *n && unit_less(key, h[r], h[m])) m = r;
    if (m == i) break;
    int t = h[m];
    h[m] = h[i], h[i] = t, i = m;
  }
  return top;
}

/* Reorders g->nodes so that each group is contiguous: Kahn's algorithm over
 * units (a group, or one ungrouped node), keyed by the unit's first
 * original position; an ungrouped node without inputs (a param read) by its
 * first reader's, so that a source placed late does not hold its reader
 * back while everything else that is ready, such as later all_gathers,
 * goes first; some units as soon as they are ready (below). unit[id] = the
 * key node id of the node's unit. */
static bool reorder(fuse_state *s, const int *unit) {
  ir_graph *g = s->g;
  int n = s->n;
  size_t isz = sizeof(int) * (size_t)(n ? n : 1);
  ir_arena *a = &g->module->arena;
  int *indeg = ir_arena_alloc(a, isz), *heap = ir_arena_alloc(a, isz), *key = ir_arena_alloc(a, isz);
  int *uhead = ir_arena_alloc(a, isz), *unxt = ir_arena_alloc(a, isz);
  ir_node **order = ir_arena_alloc(a, sizeof(ir_node *) * (size_t)(n ? n : 1));
  /* consumer lists as (unit -> consumer node) edges via per-node lists */
  int n_edges = 0;
  for (int i = 0; i < n; i++) n_edges += g->nodes[i]->n_in;
  int *ehead = ir_arena_alloc(a, isz), *enext = ir_arena_alloc(a, sizeof(int) * (size_t)(n_edges + 1));
  int *edst = ir_arena_alloc(a, sizeof(int) * (size_t)(n_edges + 1));
  if (!indeg || !heap || !key || !uhead || !unxt || !order || !ehead || !enext || !edst)
    return false;
  for (int i = 0; i < n; i++) key[i] = i;
  for (int i = 0; i < n; i++) {
    ir_node *x = g->nodes[i];
    for (int j = 0; j < x->n_in; j++) {
      int src = x->in[j]->id;
      if (g->nodes[src]->n_in == 0 && unit[src] == src && unit[i] < key[src]) key[src] = unit[i];
    }
  }
  for (int i = 0; i < n; i++) ehead[i] = uhead[i] = -1;
  /* members of each unit in original order */
  for (int i = n - 1; i >= 0; i--) {
    int u = unit[i];
    unxt[i] = uhead[u];
    uhead[u] = i;
  }
  int e = 0;
  for (int i = 0; i < n; i++) {
    ir_node *x = g->nodes[i];
    for (int j = 0; j < x->n_in; j++) {
      int pu = unit[x->in[j]->id], cu = unit[i];
      if (pu == cu) continue;
      edst[e] = cu;
      enext[e] = ehead[pu];
      ehead[pu] = e++;
      indeg[cu]++;
    }
  }
  /* Units run as soon as their inputs are ready (key u - n < 0, before
   * every other unit) when that costs nothing and may save a pass over
   * memory: a group whose results are all scalars (a gradient's sum of
   * squares for clipping then reads the gradient right after its producer
   * wrote it, while it is still in cache, instead of after the whole
   * backward), and free views and inlined values (so that they never hold
   * such a group back). */
  bool *asap = ir_arena_alloc(a, (size_t)(n ? n : 1));
  if (!asap) return false;
  for (int i = 0; i < n; i++) {
    const ir_node *x = g->nodes[i];
    asap[i] = x->group != 0 || s->kind[i] == K_INLINE || (x->n_in > 0 && is_view(x->op));
  }
  for (int i = 0; i < n; i++) {
    const ir_node *x = g->nodes[i];
    for (int j = 0; j < x->n_in; j++) {
      const ir_node *p = x->in[j];
      if (unit[p->id] != unit[i] && p->group != 0 && p->type.rank > 0) asap[unit[p->id]] = false;
    }
  }
  for (int o = 0; o < g->n_outputs; o++)
    if (g->outputs[o]->type.rank > 0) asap[unit[g->outputs[o]->id]] = false;
  int hn = 0, k = 0;
  for (int i = 0; i < n; i++)
    if (asap[i]) key[i] = i - n; /* before every other unit, in their order */
  for (int i = 0; i < n; i++)
    if (unit[i] == i && indeg[i] == 0) heap_push(key, heap, &hn, i);
  while (hn > 0) {
    int u = heap_pop(key, heap, &hn);
    for (int m = uhead[u]; m >= 0; m = unxt[m]) order[k++] = g->nodes[m];
    for (int x = ehead[u]; x >= 0; x = enext[x])
      if (--indeg[edst[x]] == 0) heap_push(key, heap, &hn, edst[x]);
  }
  if (k != n) return false; /* a cycle: a bug in the convexity check */
  for (int i = 0; i < n; i++) {
    g->nodes[i] = order[i];
    order[i]->id = i;
  }
  return true;
}

/* Whether gather x's table (through views) is itself recomputed or
 * inlined: a table is read as a buffer, which the lowering would then
 * materialize in the middle of the reader's kernel; such a gather is
 * stored instead. */
static bool recomputed_table(const fuse_state *s, const ir_node *x) {
  const ir_node *t = x->in[0];
  while (is_view(t->op) && t->n_in == 1) t = t->in[0];
  return s->kind[t->id] == K_RECOMPUTE || s->kind[t->id] == K_INLINE;
}

/* A tied embedding's gradient, add(head's weight gradient, embedding_grad):
 * the lowering scatter-adds into the GEMM's buffer (codegen/lower.c,
 * embedding_grad_base), or else stores the add alone; a buffer either way. */
static bool tied_embedding_grad(const ir_node *x) {
  return x->op == DSC_OP_ADD && x->n_in == 2 &&
         (x->in[0]->op == DSC_OP_EMBEDDING_GRAD || x->in[1]->op == DSC_OP_EMBEDDING_GRAD);
}

/* Partitions the nodes into groups (rules 1-2 of the header); false when
 * interrupted (the context's callback). */
static bool partition(fuse_state *s) {
  ir_graph *g = s->g;
  int n = s->n;
  bool *only_permuted = s->only_permuted;
  memset(only_permuted, 1, (size_t)(n ? n : 1));
  for (int i = 0; i < n; i++)
    for (int j = 0; j < g->nodes[i]->n_in; j++)
      if (g->nodes[i]->op != DSC_OP_PERMUTE) only_permuted[g->nodes[i]->in[j]->id] = false;
  for (int k = 0; k < g->n_outputs; k++) only_permuted[g->outputs[k]->id] = false;
  /* casts read where they and their input live (a recomputed load must
   * not cross between host and device) */
  bool *same_place = s->same_place;
  memset(same_place, 1, (size_t)(n ? n : 1));
  for (int i = 0; i < n; i++) {
    const ir_node *x = g->nodes[i];
    for (int j = 0; j < x->n_in; j++)
      if (x->in[j]->place != x->place) same_place[x->in[j]->id] = false;
    if (x->n_in == 1 && x->in[0]->place != x->place) same_place[i] = false;
  }
  for (int i = 0; i < n; i++) {
    ir_node *x = g->nodes[i];
    x->group = 0;
    s->parent[i] = i, s->next[i] = -1, s->tail[i] = i, s->size[i] = 1;
    s->minpos[i] = s->maxpos[i] = i;
    bool all_inline = true;
    for (int j = 0; j < x->n_in; j++) all_inline = all_inline && s->kind[x->in[j]->id] == K_INLINE;
    uint32_t mask;
    if (x->op == DSC_OP_CONST || x->op == DSC_OP_IOTA)
      s->kind[i] = K_INLINE;
    else if (x->n_in > 0 && all_inline && ir_inlinable_op(x))
      s->kind[i] = K_INLINE;
    else if (ir_reduction_mask(x, &mask) && !(mask & (1u << (x->in[0]->type.rank - 1))))
      s->kind[i] = K_ALONE;
    else if (x->op == DSC_OP_EMBEDDING && gathers_a_gradient(x))
      s->kind[i] = K_ALONE; /* rows of a gradient (ZenFlow): gathered right after it */
    else if (x->op == DSC_OP_CAST && x->role == IR_ROLE_GRAD)
      s->kind[i] = K_ALONE; /* a gradient rounded to bf16: stored as such (a model state) */
    else if (only_permuted[i] && ir_recomputed_gather(x) && !recomputed_table(s, x))
      s->kind[i] = K_RECOMPUTE;
    else if (ir_recomputed_cast(x) && same_place[i] &&
             (s->kind[x->in[0]->id] == K_NONE || s->kind[x->in[0]->id] == K_ALONE ||
              tied_embedding_grad(x->in[0])))
      s->kind[i] = K_RECOMPUTE; /* a stored buffer's conversion: each reader converts */
    else if (groupable(x))
      s->kind[i] = K_GROUP;
    else
      s->kind[i] = K_NONE;
  }
  for (int i = 0; i < n; i++) {
    ir_node *x = g->nodes[i];
    if (ir_check_interrupt(g->module->ctx, "fusing graph '%s'", g->name)) /* cheap; merges are not */
      return false;
    if (s->kind[i] != K_GROUP) continue;
    for (int j = 0; j < x->n_in; j++) {
      ir_node *p = x->in[j];
      if (s->kind[p->id] != K_GROUP) continue;
      if (x->op == DSC_OP_EMBEDDING && j == 0) continue;
      if (p->place != x->place) continue; /* a kernel runs on the host or the device */
      if (p->guard != x->guard || p->guard_if != x->guard_if) continue; /* runs or is skipped whole */
      int rp = find(s, p->id), rx = find(s, i);
      if (rp == rx) continue;
      /* a lone view is a free view: nothing merges into it */
      if (is_view(p->op) && s->size[rp] == 1) continue;
      if (union_valid(s, rx, rp)) merge(s, rx, rp);
    }
  }
  return true;
}

/* Numbers the groups by first member, dissolves lone views, and reorders
 * the nodes (rule 4); returns the number of groups, -1 when the groups
 * cannot be ordered. */
static int number_and_reorder(fuse_state *s, int *unit) {
  ir_graph *g = s->g;
  int n = s->n;
  /* number groups by first member; dissolve lone views */
  int next_id = 0;
  int *gid = s->stack; /* reuse: root -> group id */
  for (int i = 0; i < n; i++) gid[i] = 0;
  for (int i = 0; i < n; i++) {
    unit[i] = i;
    if (s->kind[i] != K_GROUP && s->kind[i] != K_ALONE) continue;
    int r = find(s, i);
    if (s->size[r] == 1 && is_view(g->nodes[i]->op)) continue;
    if (!gid[r]) gid[r] = ++next_id;
    g->nodes[i]->group = gid[r];
    unit[i] = s->minpos[r];
  }
  return reorder(s, unit) ? next_id : -1;
}

dsc_status pass_fuse_graph(ir_graph *g) {
  ir_module *m = g->module;
  ir_arena *a = &m->arena;
  fuse_state s;
  memset(&s, 0, sizeof s);
  s.g = g;
  s.n = g->n_nodes;
  int n = s.n;
  size_t isz = sizeof(int) * (size_t)(n ? n : 1);
  s.kind = ir_arena_alloc(a, (size_t)(n ? n : 1));
  s.parent = ir_arena_alloc(a, isz);
  s.next = ir_arena_alloc(a, isz);
  s.tail = ir_arena_alloc(a, isz);
  s.size = ir_arena_alloc(a, isz);
  s.minpos = ir_arena_alloc(a, isz);
  s.maxpos = ir_arena_alloc(a, isz);
  s.mark = ir_arena_alloc(a, isz);
  s.stack = ir_arena_alloc(a, isz);
  s.tmp = ir_arena_alloc(a, sizeof(ir_node *) * (size_t)(n ? n : 1));
  s.only_permuted = ir_arena_alloc(a, (size_t)(n ? n : 1));
  s.same_place = ir_arena_alloc(a, (size_t)(n ? n : 1));
  int *unit = ir_arena_alloc(a, isz);
  if (!s.kind || !s.parent || !s.next || !s.tail || !s.size || !s.minpos || !s.maxpos || !s.mark ||
      !s.stack || !s.tmp || !s.only_permuted || !s.same_place || !unit) {
    ir_error(m->ctx, ir_no_loc, "fuse: out of memory");
    return DSC_ERR_INTERNAL;
  }
  for (int i = 0; i < n; i++)
    if (g->nodes[i]->id != i) {
      ir_error(m->ctx, ir_no_loc, "fuse: graph '%s' has inconsistent node ids", g->name);
      return DSC_ERR_INTERNAL;
    }
  if (!partition(&s)) return DSC_ERR_INTERRUPTED;
  int next_id = number_and_reorder(&s, unit);
  if (next_id < 0) {
    s.strict = true; /* node-level convexity let two groups need each other */
    if (!partition(&s)) return DSC_ERR_INTERRUPTED;
    if ((next_id = number_and_reorder(&s, unit)) < 0) {
      ir_error(m->ctx, ir_no_loc, "fuse: could not order the groups of graph '%s' (a cycle)",
               g->name);
      return DSC_ERR_INTERNAL;
    }
  }
  /* renumber so that ids increase along the new node order */
  int *ren = ir_arena_alloc(a, sizeof(int) * (size_t)(next_id + 1));
  if (!ren) {
    ir_error(m->ctx, ir_no_loc, "fuse: out of memory");
    return DSC_ERR_INTERNAL;
  }
  int k = 0;
  for (int i = 0; i < n; i++) {
    int gr = g->nodes[i]->group;
    if (gr && !ren[gr]) ren[gr] = ++k;
  }
  for (int i = 0; i < n; i++)
    if (g->nodes[i]->group) g->nodes[i]->group = ren[g->nodes[i]->group];
  pass_guard_settle(g); /* a guard the new order puts after its node is dropped */
  return DSC_OK;
}

dsc_status pass_fuse_run(ir_module *m) {
  for (int i = 0; i < m->n_graphs; i++) {
    dsc_status st = pass_fuse_graph(m->graphs[i]);
    if (st != DSC_OK) return st;
  }
  return DSC_OK;
}
