/* The build steps of a run (driver/driver.h "driver/build.c"): compile a
 * model file, check its forward signature, run the training pipeline on the
 * step module, check the step's signature, plan its memory. dsc train, dsc
 * plan, dsc compile, dsc sample, offload auto and the auto-configuration all
 * build through here, so that each builds exactly the graphs the others
 * build, and the driver's files call down into this one, never across. */
#include <inttypes.h>
#include <string.h>
#include <unistd.h>

#include "driver/driver.h"

/* ------------------------------------------------------------ model facts */

int64_t dsc_model_vocab(const dsc_graph *g) {
  if (!g || dsc_graph_input_count(g) < 1) return -1;
  const dsc_node *first = dsc_graph_input_at(g, 0);
  int64_t emb = -1, ce = -1;
  for (int i = 0; i < dsc_graph_node_count(g); i++) {
    const dsc_node *n = dsc_graph_node(g, i);
    if (dsc_node_op(n) == DSC_OP_EMBEDDING && dsc_node_input(n, 1) == first) {
      int64_t rows = dsc_node_type(dsc_node_input(n, 0)).dims[0];
      if (emb < 0 || rows < emb) emb = rows;
    }
    if (dsc_node_op(n) == DSC_OP_CROSS_ENTROPY &&
        dsc_node_op(dsc_node_input(n, 1)) == DSC_OP_INPUT) {
      dsc_type lt = dsc_node_type(dsc_node_input(n, 0));
      int64_t classes = lt.dims[lt.rank - 1];
      if (ce < 0 || classes < ce) ce = classes;
    }
  }
  if (emb > 0 && ce > 0) return emb < ce ? emb : ce;
  return emb > 0 ? emb : ce;
}

int64_t dsc_model_context(const dsc_graph *g) {
  if (!g) return -1;
  for (int i = 0; i < dsc_graph_node_count(g); i++) {
    const dsc_node *n = dsc_graph_node(g, i);
    if (dsc_node_op(n) == DSC_OP_EMBEDDING && dsc_node_op(dsc_node_input(n, 1)) == DSC_OP_IOTA)
      return dsc_node_type(dsc_node_input(n, 0)).dims[0];
  }
  return -1;
}

/* ------------------------------------------------------ the modules of a run */

dsc_status drv_compile_model(dsc_context *ctx, const char *path, int64_t B, int64_t T, bool eval,
                             dsc_module **out) {
  dsc_dim_binding dims[2];
  int n = 0;
  if (B > 0) dims[n++] = (dsc_dim_binding){"B", B};
  if (T > 0) dims[n++] = (dsc_dim_binding){"T", T};
  dsc_frontend_options fo = {dims, n, eval};
  return dsc_compile_file(ctx, path, &fo, out);
}

/* The forward graph of a token model: forward(tokens: int[B, T], targets:
 * int[B, T]) -> scalar loss. */
dsc_status drv_check_forward(dsc_context *ctx, const char *path, const dsc_graph *g) {
  if (!g) {
    ir_error(ctx, rt_loc(path), "the model has no graph 'forward'");
    return DSC_ERR_USER;
  }
  int n_in = dsc_graph_input_count(g);
  if (n_in == 3) { /* the seed the frontend adds for dropout */
    dsc_node *s = dsc_graph_input_at(g, 2);
    dsc_type st = dsc_node_type(s);
    if (strcmp(dsc_node_name(s), DSC_DROPOUT_SEED) == 0 && st.dtype == DSC_I64 && st.rank == 1 &&
        st.dims[0] == 1)
      n_in = 2;
  }
  bool ok = n_in == 2 && dsc_graph_output_count(g) == 1;
  for (int i = 0; ok && i < 2; i++) {
    dsc_type ty = dsc_node_type(dsc_graph_input_at(g, i));
    dsc_type t0 = dsc_node_type(dsc_graph_input_at(g, 0));
    ok = (ty.dtype == DSC_I32 || ty.dtype == DSC_I64) && ty.rank == 2 && dsc_type_equal(&ty, &t0);
  }
  if (ok) {
    dsc_type lt = dsc_node_type(dsc_graph_output_at(g, 0));
    ok = lt.rank == 0 && dsc_dtype_is_float(lt.dtype);
  }
  if (!ok) {
    ir_error(ctx, rt_loc(path),
             "dsc train needs a token model: forward(tokens: i32[B, T], targets: i32[B, T]) "
             "returning a scalar loss");
    return DSC_ERR_USER;
  }
  return DSC_OK;
}

bool drv_is_program(const char *path) {
  size_t n = strlen(path);
  return dsc_program_is_file(path) || (n >= 4 && strcmp(path + n - 4, ".dsx") == 0);
}

/* The step module at (B, T), its forward checked, the facts read. */
static dsc_status check_step_model(dsc_context *ctx, const char *path, int64_t B, int64_t T,
                                   dsc_module **m, drv_model_facts *f) {
  dsc_status st = drv_compile_model(ctx, path, B, T, false, m);
  if (st != DSC_OK) return st;
  dsc_graph *fg = dsc_module_find_graph(*m, "forward");
  if ((st = drv_check_forward(ctx, path, fg)) != DSC_OK) return st;
  dsc_type in_t = dsc_node_type(dsc_graph_input_at(fg, 0));
  f->B = in_t.dims[0];
  f->T = in_t.dims[1];
  f->vocab = dsc_model_vocab(fg);
  if (f->vocab <= 0) {
    ir_error(ctx, rt_loc(path),
             "cannot tell the vocabulary: the first input of 'forward' indexes no embedding and "
             "no cross_entropy takes an input as targets");
    return DSC_ERR_USER;
  }
  /* Positions beyond the position table would fail at the first step. */
  int64_t context = dsc_model_context(fg);
  if (context > 0 && f->T > context) {
    ir_error(ctx, rt_loc(path),
             "sequence length %" PRId64 " is longer than the model's context of %" PRId64
             " positions (its position table); use --seq %" PRId64 " or less",
             f->T, context, context);
    return DSC_ERR_USER;
  }
  return DSC_OK;
}

dsc_status drv_compile_step(dsc_context *ctx, const char *path, int64_t B, int64_t T, int64_t sp,
                            dsc_module **m, drv_model_facts *f) {
  dsc_status st = check_step_model(ctx, path, B, T, m, f);
  f->T_rank = f->T;
  if (st != DSC_OK || sp <= 1) return st;
  /* sequence parallel: the step holds this rank's part of the sequence */
  if (f->T % sp != 0) {
    ir_error(ctx, ir_no_loc,
             "--mesh sp=%" PRId64 ": the sequence length %" PRId64 " is not divisible by %" PRId64
             " (each rank holds seq / sp positions)",
             sp, f->T, sp);
    return DSC_ERR_USER;
  }
  dsc_module_free(*m);
  *m = NULL;
  f->T_rank = f->T / sp;
  return drv_compile_model(ctx, path, f->B, f->T_rank, false, m);
}

dsc_status drv_build_graphs(dsc_context *ctx, const char *path, dsc_module *m,
                            const dsc_train_config *cfg, dsc_backend backend, bool want_fwd,
                            dsc_module **fwd) {
  dsc_status st = DSC_OK;
  /* The forward module shares the step module's param values: executors
   * and the interpreter look params up by name. */
  if (want_fwd && (st = drv_compile_model(ctx, path, cfg->batch, cfg->seq, true, fwd)) != DSC_OK)
    return st;
  /* the schedule pass's time estimates for offloaded activations
   * (passes/prefetch.c): this host's calibrated rates when --auto or
   * dsc_calibrate measured them, else the pass's defaults; dsc plan and dsc
   * train read the same file (and no other run reads it) */
  dsc_train_config c = *cfg;
  dsc_rates r;
  bool timed_returns = c.remat == DSC_REMAT_OFFLOAD && c.offload.overlap != DSC_SWITCH_FALSE;
  if (timed_returns && c.gemm_gflops <= 0 && c.copy_gbps <= 0 && dsc_calibrate_cached(NULL, &r))
    c.gemm_gflops = r.compute_gflops, c.mem_gbps = c.copy_gbps = r.host_gbps; /* CPU: memcpy */
  dsc_pipeline_options po;
  memset(&po, 0, sizeof po);
  po.train = &c;
  /* The interpreter runs composite ops itself; compiled backends need the
   * codegen passes (decompose, fuse) too. */
  /* the interpreter: up to the micro-batch loop (decompose and fuse are for codegen) */
  if (backend == DSC_BACKEND_INTERP) po.stop_after = "accumulate";
  if ((st = dsc_run_pipeline(m, &po)) != DSC_OK) return st;
  if (want_fwd && backend != DSC_BACKEND_INTERP) st = dsc_run_codegen_passes(*fwd);
  return st;
}

dsc_status drv_mesh(dsc_context *ctx, const char *spec, int64_t world, dsc_mesh_shape *shape,
                    drv_mesh_axes *axes) {
  *axes = (drv_mesh_axes){1, 1, 1};
  if (world > INT32_MAX) {
    ir_error(ctx, ir_no_loc, "--mesh: a world of %" PRId64 " ranks is over 2^31-1", world);
    return DSC_ERR_USER;
  }
  dsc_status st = dsc_mesh_parse(ctx, spec, (int)world, shape);
  if (st != DSC_OK) return st;
  axes->sp = dsc_mesh_size(shape, "sp");
  axes->ep = dsc_mesh_size(shape, "ep");
  axes->tp = dsc_mesh_size(shape, "tp");
  return DSC_OK;
}

dsc_type drv_step_input_type(const dsc_module *m, int i) {
  const dsc_graph *micro = dsc_module_find_graph(m, "micro_step");
  const dsc_graph *g = micro ? micro : dsc_module_find_graph(m, "train_step");
  dsc_type t = dsc_node_type(dsc_graph_input_at(g, i));
  if (micro && t.rank >= 1) t.dims[0] *= dsc_step_micro_batches(m);
  return t;
}

bool drv_step_has_seed(const dsc_module *m) {
  const dsc_graph *micro = dsc_module_find_graph(m, "micro_step");
  const dsc_graph *g = micro ? micro : dsc_module_find_graph(m, "train_step");
  if (!g || dsc_graph_input_count(g) != 4) return false;
  const char *name = dsc_node_name(dsc_graph_input_at(g, 2));
  return name && strcmp(name, DSC_DROPOUT_SEED) == 0;
}

/* train_step(tokens[rows, T], targets[rows, T][, dropout_seed[K]], lr) ->
 * (loss, grad_norm[, skipped]), or with grad_accum K > 1
 * micro_step(tokens[rows/K, T], targets[rows/K, T][, dropout_seed[1]],
 * first) -> (loss) and train_step(lr) -> the same. */
dsc_status drv_check_step(dsc_context *ctx, const dsc_module *m, int64_t rows, int64_t T) {
  const dsc_graph *g = dsc_module_find_graph(m, "train_step");
  const dsc_graph *micro = dsc_module_find_graph(m, "micro_step");
  int n_data = micro ? dsc_graph_input_count(micro) - 1 : g ? dsc_graph_input_count(g) - 1 : 0;
  int seeds = drv_step_has_seed(m);
  if (seeds) {
    dsc_type st = drv_step_input_type(m, 2);
    seeds = st.dtype == DSC_I64 && st.rank == 1 && st.dims[0] == dsc_step_micro_batches(m);
    if (!seeds) n_data = -1;
  }
  bool shape_ok = g && n_data == 2 + seeds && dsc_graph_output_count(g) >= 2 &&
                  dsc_graph_output_count(g) <= 3 &&
                  dsc_graph_input_count(g) == (micro ? 1 : 3 + seeds) &&
                  (!micro || dsc_graph_output_count(micro) == 1);
  for (int i = 0; shape_ok && i < 2; i++) {
    dsc_type ty = drv_step_input_type(m, i);
    shape_ok = ty.rank == 2 && ty.dims[0] == rows && ty.dims[1] == T;
  }
  if (shape_ok) {
    dsc_type lt = dsc_node_type(dsc_graph_input_at(g, dsc_graph_input_count(g) - 1));
    shape_ok = lt.rank == 0 && lt.dtype == DSC_F32;
  }
  if (!shape_ok) {
    ir_error(ctx, ir_no_loc,
             "trainer: the pipeline did not produce train_step(tokens[B*K, T], targets[B*K, T], "
             "lr: f32[]) -> (loss, grad_norm), or with grad_accum K > 1 micro_step(tokens[B, T], "
             "targets[B, T], first: f32[]) -> (loss) and train_step(lr: f32[])");
    return DSC_ERR_INTERNAL;
  }
  return DSC_OK;
}

static int64_t sgemm_scratch(const cg_gemm *g) { return rt_sgemm_scratch_floats(g); }

int drv_default_threads(int threads) {
  if (threads > 0) return threads;
  long n = sysconf(_SC_NPROCESSORS_ONLN); /* runtime/exec.c's default */
  return n < 1 ? 1 : (int)n;
}

dsc_status drv_plan_step(dsc_context *ctx, const dsc_module *m, int threads, cg_memplan *out) {
  return drv_plan_step_work(ctx, m, threads, out, NULL);
}

/* Plans one program of the step; *prog stays in arena a. */
static dsc_status plan_graph(const dsc_graph *g, ir_arena *a, int threads, cg_memplan *out,
                             cg_program **prog) {
  cg_memplan_options o = {drv_default_threads(threads), NULL};
#ifdef DSC_HAVE_LLVM
  if (rt_sgemm_supported()) o.gemm_scratch_floats = sgemm_scratch; /* runtime/gemm_cpu.c */
#else
  (void)sgemm_scratch;
#endif
  return cg_memplan_graph(g, a, &o, out, prog);
}

/* With grad_accum K > 1 the step is K runs of micro_step, then train_step:
 * the executor's one WORK arena is the larger program's, so the plan is
 * that program's (both share the STATE arena); the work is K x micro_step's
 * then train_step's (dsc_step_work's repeat). */
dsc_status drv_plan_step_work(dsc_context *ctx, const dsc_module *m, int threads, cg_memplan *out,
                              dsc_step_work *work) {
  const dsc_graph *g = dsc_module_find_graph(m, "train_step");
  const dsc_graph *micro = dsc_module_find_graph(m, "micro_step");
  if (!g) {
    ir_error(ctx, ir_no_loc, "memory plan: the module has no graph 'train_step'");
    return DSC_ERR_INTERNAL;
  }
  ir_arena a;
  ir_arena_init(&a, ctx);
  cg_program *prog = NULL, *mprog = NULL;
  cg_memplan mp;
  dsc_status st = plan_graph(g, &a, threads, out, &prog);
  if (st == DSC_OK && micro) st = plan_graph(micro, &a, threads, &mp, &mprog);
  if (st == DSC_OK && micro) {
    int64_t held = mp.grads_held > out->grads_held ? mp.grads_held : out->grads_held;
    if (mp.work_arena + mp.gemm_scratch > out->work_arena + out->gemm_scratch) *out = mp;
    out->grads_held = held;
  }
  /* the cost model's summary of the program (driver/autocfg.c) */
  if (st == DSC_OK && work) {
    dsc_step_work mw;
    memset(&mw, 0, sizeof mw);
    st = drv_step_work(ctx, prog, out->world, work);
    if (st == DSC_OK && micro) st = drv_step_work(ctx, mprog, out->world, &mw);
    if (st == DSC_OK && micro) st = drv_step_work_repeat(ctx, &mw, dsc_step_micro_batches(m), work);
    dsc_step_work_free(&mw);
  }
  ir_arena_release(&a);
  return st;
}
