/* dsc public API: Chrome traces of training runs.
 *
 * A trace is one JSON file in the Trace Event Format (viewable in Perfetto,
 * ui.perfetto.dev, or chrome://tracing): {"traceEvents": [...], ...}. Each
 * rank is a process (pid = rank, named "rank R") with one thread per track
 * (dsc_trace_track, named by thread_name metadata). Events on the step,
 * compute and wait tracks are complete events ("ph": "X", ts and dur), which
 * nest; collectives (comm) and copies and transfers (copy), which overlap
 * one another, are async pairs ("ph": "b" at the start, "e" at the end,
 * with one "id" per span, unique across ranks: rank << 32 | n). Times are
 * microseconds of CLOCK_MONOTONIC, one clock for every thread and process
 * of a host, so the files of several processes (mpirun) can be merged as
 * they are.
 *
 * Events are written as they come (buffered), under a lock: the ranks of an
 * in-process run (threads) share one trace. dsc_trace_close completes the
 * JSON, so a run that fails midway still leaves a valid file as long as the
 * trace is closed (the CLI does so on every path, also before aborting an
 * MPI job).
 *
 * Communication overlap: executors report, per run of a program with
 * collectives, the union of the collectives' spans (start to the return of
 * the wait: the latest they can have completed) and the time they were
 * blocked in waits; hidden share = 1 - wait / comm (bench/trace_overlap.py
 * computes the same from the file's events of category "collective").
 *
 * Everything is a no-op on a NULL trace, so hooks cost one NULL check when
 * tracing is off. */
#ifndef DSC_TRACE_H
#define DSC_TRACE_H

#include <stdint.h>

#include "dsc/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dsc_trace dsc_trace;

/* The tracks (the tid of their events). */
typedef enum {
  DSC_TRACE_STEP = 1, /* one span per training step; validation runs */
  DSC_TRACE_COMPUTE,  /* kernel launches, GEMMs, embedding gradients; a whole
                       * graph run on the interpreter */
  DSC_TRACE_COMM,     /* each collective from its start to its completion */
  DSC_TRACE_WAIT,     /* the executor blocked in a collective's wait */
  DSC_TRACE_COPY,     /* copies, data loading, checkpoint writes */
  DSC_TRACE_HOST,     /* the host stream: host-placed work and tier copies
                       * running beside the executor (--offload-overlap) */
} dsc_trace_track;

/* Creates (truncates) path and writes the header. DSC_ERR_USER with a
 * diagnostic ("PATH: error: cannot open for writing: ...") when it cannot. */
dsc_status dsc_trace_open(dsc_context *ctx, const char *path, dsc_trace **out);
/* Completes the JSON (with the overlap figures in "otherData"), closes the
 * file and frees the trace; DSC_ERR_USER with a diagnostic on the open's
 * context if a write failed. NULL: DSC_OK. */
dsc_status dsc_trace_close(dsc_trace *t);
const char *dsc_trace_path(const dsc_trace *t);
int64_t dsc_trace_event_count(dsc_trace *t);

/* CLOCK_MONOTONIC in nanoseconds: the clock of every event. */
int64_t dsc_trace_now_ns(void);

/* A span [t0_ns, t1_ns] on track of rank pid (0 <= pid < 1 << 20; others
 * are ignored). cat: the event's category (NULL: the track's name);
 * args_json: a JSON object's text for "args" (NULL: none). Thread-safe. */
void dsc_trace_span(dsc_trace *t, int pid, dsc_trace_track track, const char *cat, int64_t t0_ns,
                    int64_t t1_ns, const char *args_json, const char *name);
/* dsc_trace_span with the track's category, no args and a formatted name. */
void dsc_trace_spanf(dsc_trace *t, int pid, dsc_trace_track track, int64_t t0_ns, int64_t t1_ns,
                     const char *fmt, ...) __attribute__((format(printf, 6, 7)));

/* One run's collectives on rank pid: comm_ns, the union of their spans;
 * wait_ns, the time blocked in their waits; n, how many. */
void dsc_trace_add_overlap(dsc_trace *t, int pid, int64_t comm_ns, int64_t wait_ns, int64_t n);
typedef struct {
  double comm_s, wait_s; /* summed over the ranks */
  int64_t collectives;   /* traced collectives (category "collective") */
  int ranks;             /* ranks that reported any */
  /* the host stream (dsc_trace_add_host), summed over the ranks: time its
   * work ran, and time the executor blocked waiting for it */
  double host_busy_s, host_wait_s;
} dsc_trace_overlap;
/* One run's host stream on rank pid: busy_ns running its work, wait_ns the
 * executor blocked on it. */
void dsc_trace_add_host(dsc_trace *t, int pid, int64_t busy_ns, int64_t wait_ns);
/* 1 - host_wait / host_busy: the share of the host stream's work hidden
 * behind the executor's; -1 when no host stream was traced. */
double dsc_trace_hidden_host_share(const dsc_trace_overlap *o);
void dsc_trace_get_overlap(dsc_trace *t, dsc_trace_overlap *out);
/* 1 - wait / comm, or -1 when no collective was traced. */
double dsc_trace_hidden_share(const dsc_trace_overlap *o);

/* "3.1 MB", "512 KB", "4 B" (decimal units), into buf. */
const char *dsc_trace_format_bytes(char *buf, size_t n, int64_t bytes);

#ifdef __cplusplus
}
#endif
#endif
