/* dsc public API: auto-configuration (issue 7 item 4; docs/memory.md
 * "Auto-configuration").
 *
 * dsc_autocfg_search plans candidate configurations of a training run (ZeRO
 * stage, offload of optimizer states and params, activation checkpointing,
 * bucket and prefetch sizes) with dsc_plan_memory, keeps those whose
 * per-rank device peak fits a budget, and ranks them by a predicted step
 * time: a cost model of the lowered step program (driver/autocfg.c) over
 * rates measured by a short calibration run (driver/calibrate.c) or given
 * by the user. */
#ifndef DSC_AUTOCFG_H
#define DSC_AUTOCFG_H

#include "dsc/core.h"
#include "dsc/memplan.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Rates of one rank. GB/s are 10^9 bytes per second (not gigabits). */
typedef struct {
  double compute_gflops; /* dense f32 GEMM rate, GFLOP/s */
  double link_gbps;      /* collective bandwidth per rank (ring bus bandwidth), GB/s */
  double host_gbps;      /* device <-> host copies (CPU runs: memcpy), GB/s */
  double disk_gbps;      /* offload-dir write+read, GB/s */
  double coll_latency_us; /* fixed cost of one collective (0: the default, 10 us) */
} dsc_rates;

/* ---- calibration (driver/calibrate.c) ---- */
typedef struct {
  int threads;            /* GEMM threads (0: one per core) */
  const char *disk_dir;   /* where the disk test file goes (NULL: $TMPDIR or /tmp) */
  const char *cache_path; /* NULL: $DSC_CACHE_DIR/calibration-HOST.txt, else
                           * ~/.cache/dsc/calibration-HOST.txt */
  bool recalibrate;       /* measure even when the cache has this host's rates */
  bool no_cache;          /* neither read nor write a cache file */
} dsc_calibrate_options;

/* Measures the four rates (about 1-2 s): an f32 GEMM 512x768x768 on the CPU
 * backend's GEMM (runtime/gemm_cpu.c, sgemm.c where supported), memcpy of
 * 64 MiB, a 32 MiB temp file written, fsync'd and read back, and all-reduces
 * of 8 MiB between two in-process ranks (runtime/comm_inproc.c). Reads the
 * host's cached rates instead unless recalibrate; writes the cache after
 * measuring (a cache that cannot be written is a warning). *from_cache says
 * which. Errors (the disk test failing) are diagnostics on ctx. */
dsc_status dsc_calibrate(dsc_context *ctx, const dsc_calibrate_options *o, dsc_rates *out,
                         bool *from_cache);
/* The host's cached rates only (no measuring): false when there are none
 * for this host and thread count. */
bool dsc_calibrate_cached(const dsc_calibrate_options *o, dsc_rates *out);
/* The cache file of this host (o->cache_path if set), in buf. False when no
 * directory is known (neither DSC_CACHE_DIR nor HOME). */
bool dsc_calibrate_cache_path(const dsc_calibrate_options *o, char *buf, size_t n);

/* ---- the cost model (driver/autocfg.c) ----
 * A step program is summarised as a list of events in program order:
 * compute work (FLOPs), collective starts (bytes the ring sends per rank)
 * and waits. dsc_plan_memory_work fills it while planning. */
typedef enum { DSC_EV_COMPUTE, DSC_EV_START, DSC_EV_WAIT } dsc_event_kind;
typedef enum {
  DSC_COLL_ALL_REDUCE,
  DSC_COLL_REDUCE_SCATTER,
  DSC_COLL_ALL_GATHER,
  DSC_COLL_BROADCAST,
  DSC_COLL_ALL_TO_ALL,
  DSC_COLL_KINDS
} dsc_coll_kind;
typedef struct {
  dsc_event_kind kind;
  double flops;      /* COMPUTE */
  int coll;          /* START, WAIT: the collective's id (0..n_coll-1) */
  double link_bytes; /* START: bytes one rank sends (dsc_ring_bytes) */
} dsc_step_event;

typedef struct {
  double gemm_flops;   /* sum of 2*m*n*k*batch over the GEMMs */
  double kernel_flops; /* elementwise work: domain points x ops per kernel stage, copies */
  double coll_bytes[DSC_COLL_KINDS]; /* payload bytes per dsc_coll_kind (dsc_ring_bytes' B) */
  double link_bytes[DSC_COLL_KINDS]; /* bytes one rank sends per kind (ring formulas) */
  int64_t coll_count[DSC_COLL_KINDS];
  int n_events, n_coll;
  dsc_step_event *events; /* malloc'd; dsc_step_work_free */
  /* gradient accumulation: events [0, repeat_events) are one micro-batch,
   * replayed `repeat` times before the rest (0 or 1: no repeat) */
  int repeat_events;
  int64_t repeat;
} dsc_step_work;
void dsc_step_work_free(dsc_step_work *w);

/* Bytes one rank sends in a ring collective of `payload` bytes over `world`
 * ranks (payload: the all-reduced tensor; the reduce-scatter's input; the
 * all-gather's output; the broadcast tensor; the all-to-all's input, all of
 * its chunks):
 *   all_reduce 2(N-1)/N B, reduce_scatter (N-1)/N B, all_gather (N-1)/N B,
 *   broadcast B (pipelined), all_to_all (N-1)/N B (every chunk but its
 *   own, straight to its rank); 0 at world 1. */
double dsc_ring_bytes(dsc_coll_kind k, double payload, int64_t world);

/* Predicted time of one optimizer step (seconds) and its parts. */
typedef struct {
  double compute_s; /* (gemm + kernel flops) / compute rate */
  double comm_s;    /* every collective's time, as if nothing overlapped */
  double exposed_comm_s; /* what the compute waits for (the schedule simulation) */
  double offload_s; /* exposed host and disk transfers */
  double step_s;    /* compute_s + exposed_comm_s + offload_s */
} dsc_step_cost;

/* The cost of a planned step. Communication: the events are replayed with
 * one compute stream and one communication stream; a collective starts when
 * issued and the previous one finished (collectives run in start order, as
 * on one NCCL stream) and takes latency + link_bytes / link rate; a wait
 * stalls compute until its collective finished. What compute waits is the
 * exposed communication, so prefetch (early starts) and bucketing (fewer
 * latencies, later starts) count as the schedule placed them. Offload: every
 * byte held on the host is read and written once per step (2 x host_bytes
 * over host_gbps; ZeRO-Offload's gradients out, updated params and states
 * back), on disk likewise (2 x disk_bytes over disk_gbps); half of each is
 * assumed hidden behind compute (prefetched reads, asynchronous writes),
 * at most all of the compute time. */
void dsc_step_cost_eval(const dsc_step_work *w, const dsc_rates *r, int64_t host_bytes,
                        int64_t disk_bytes, dsc_step_cost *out);

/* dsc_plan_memory that also summarises the lowered step (work may be NULL). */
dsc_status dsc_plan_memory_work(dsc_context *ctx, const dsc_plan_options *o,
                                dsc_memory_plan *out, dsc_step_work *work);

/* ---- the search (driver/autocfg.c) ---- */
typedef struct {
  /* the run: model, world, batch, precision, ... Where a choice is set in
   * base.knobs it is fixed (not searched): has_zero_stage, has_remat,
   * has_offload_optimizer, has_offload_param, has_bucket_bytes,
   * has_prefetch_bytes. offload_dir enables the disk tier. */
  dsc_plan_options base;
  int64_t memory_budget;      /* device bytes per rank (> 0) */
  int64_t host_memory_budget; /* host bytes per rank for offload (0: no limit) */
  dsc_rates rates;
  int max_plans; /* bound on dsc_plan_memory calls (0: 40) */
} dsc_autocfg_options;

typedef struct {
  /* base.knobs with the choices set: zero_stage, offload_optimizer and
   * offload_param (none, auto, host, disk), remat (none, selective, blocks;
   * or fixed), bucket_bytes and prefetch_bytes (else the model's) */
  dsc_run_knobs knobs;
  bool fits;
  dsc_memory_plan plan;
  dsc_step_cost cost;
} dsc_autocfg_candidate;

#define DSC_AUTOCFG_MAX 64
typedef struct {
  int n_planned;    /* dsc_plan_memory calls */
  int n;            /* candidates planned, ranked: fitting ones by step time, then the rest */
  int n_fit;        /* the first n_fit fit */
  dsc_autocfg_candidate cand[DSC_AUTOCFG_MAX];
  int smallest;     /* index of the smallest device peak planned (-1: none planned) */
} dsc_autocfg_result;

/* Searches; DSC_OK with cand[0] the choice when one fits. DSC_ERR_USER
 * with a diagnostic naming the smallest peak found and what it would take
 * when none fits (the result still holds what was planned). */
dsc_status dsc_autocfg_search(dsc_context *ctx, const dsc_autocfg_options *o,
                              dsc_autocfg_result *out);

/* The candidate as dsc train flags ("--zero-stage 3 --offload-optimizer
 * host ..."), in buf. */
void dsc_autocfg_flags(const dsc_autocfg_candidate *c, int64_t world, char *buf, size_t n);

#ifdef __cplusplus
}
#endif
#endif
