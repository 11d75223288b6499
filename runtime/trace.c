/* Chrome traces (include/dsc/trace.h): a Trace Event Format JSON file
 * written event by event under a lock, completed by dsc_trace_close. */
#define _XOPEN_SOURCE 700 /* clock_gettime */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "dsc/trace.h"
#include "runtime/runtime.h"

#define TRACE_MAX_PID (1 << 20)

typedef struct {
  bool named; /* process and thread names written */
  int64_t comm_ns, wait_ns, n;
  int64_t host_busy_ns, host_wait_ns;
  int64_t async_ids; /* async spans written (their ids) */
} trace_rank;

struct dsc_trace {
  dsc_context *ctx;
  pthread_mutex_t lock;
  FILE *f;
  char *path;
  size_t path_size;
  int64_t events;
  bool write_failed;
  trace_rank *ranks; /* by pid */
  int n_ranks;
};

static const char *track_names[] = {"", "step", "compute", "comm", "wait", "copy", "host stream"};
#define LAST_TRACK DSC_TRACE_HOST

int64_t dsc_trace_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

const char *dsc_trace_format_bytes(char *buf, size_t n, int64_t bytes) {
  if (bytes >= 1000000000)
    snprintf(buf, n, "%.1f GB", (double)bytes * 1e-9);
  else if (bytes >= 1000000)
    snprintf(buf, n, "%.1f MB", (double)bytes * 1e-6);
  else if (bytes >= 1000)
    snprintf(buf, n, "%.1f KB", (double)bytes * 1e-3);
  else
    snprintf(buf, n, "%" PRId64 " B", bytes);
  return buf;
}

static void put_json_string(FILE *f, const char *s) {
  fputc('"', f);
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if (*p == '"' || *p == '\\')
      fprintf(f, "\\%c", *p);
    else if (*p < 0x20)
      fprintf(f, "\\u%04x", *p);
    else
      fputc(*p, f);
  }
  fputc('"', f);
}

/* Microseconds with nanosecond digits: Perfetto keeps them. */
static void put_us(FILE *f, int64_t ns) {
  fprintf(f, "%" PRId64 ".%03" PRId64, ns / 1000, ns % 1000);
}

dsc_status dsc_trace_open(dsc_context *ctx, const char *path, dsc_trace **out) {
  *out = NULL;
  struct stat sb;
  if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
    ir_error(ctx, rt_loc(path), "cannot write the trace: is a directory");
    return DSC_ERR_USER;
  }
  dsc_trace *t = ir_alloc(ctx, sizeof *t);
  if (!t) {
    ir_error(ctx, ir_no_loc, "out of memory");
    return DSC_ERR_INTERNAL;
  }
  memset(t, 0, sizeof *t);
  t->ctx = ctx;
  t->path_size = strlen(path) + 1;
  if (!(t->path = ir_alloc(ctx, t->path_size))) {
    ir_free(ctx, t, sizeof *t);
    ir_error(ctx, ir_no_loc, "out of memory");
    return DSC_ERR_INTERNAL;
  }
  memcpy(t->path, path, t->path_size);
  if (!(t->f = fopen(path, "w"))) {
    dsc_status st = rt_io_error(ctx, path, "cannot open the trace for writing");
    ir_free(ctx, t->path, t->path_size);
    ir_free(ctx, t, sizeof *t);
    return st;
  }
  /* Full buffering: an event costs a formatted write into memory. */
  setvbuf(t->f, NULL, _IOFBF, 1 << 20);
  pthread_mutex_init(&t->lock, NULL);
  fputs("{\"traceEvents\":[\n", t->f);
  *out = t;
  return DSC_OK;
}

const char *dsc_trace_path(const dsc_trace *t) { return t ? t->path : NULL; }

int64_t dsc_trace_event_count(dsc_trace *t) {
  if (!t) return 0;
  pthread_mutex_lock(&t->lock);
  int64_t n = t->events;
  pthread_mutex_unlock(&t->lock);
  return n;
}

/* The rank record of pid (grown as needed); NULL when out of memory.
 * Called with the lock held. */
static trace_rank *rank_of(dsc_trace *t, int pid) {
  if (pid >= t->n_ranks) {
    int n = t->n_ranks ? t->n_ranks : 4;
    while (n <= pid) n *= 2;
    trace_rank *r =
        ir_realloc(t->ctx, t->ranks, sizeof *r * (size_t)t->n_ranks, sizeof *r * (size_t)n);
    if (!r) return NULL;
    memset(r + t->n_ranks, 0, sizeof *r * (size_t)(n - t->n_ranks));
    t->ranks = r;
    t->n_ranks = n;
  }
  return &t->ranks[pid];
}

static void sep(dsc_trace *t) {
  if (t->events++ > 0) fputs(",\n", t->f);
}

/* Process and track names, before a rank's first event. */
static void name_rank(dsc_trace *t, int pid) {
  sep(t);
  fprintf(t->f,
          "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,"
          "\"args\":{\"name\":\"rank %d\"}}",
          pid, pid);
  sep(t);
  fprintf(t->f,
          "{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,"
          "\"args\":{\"sort_index\":%d}}",
          pid, pid);
  for (int k = DSC_TRACE_STEP; k <= LAST_TRACK; k++) {
    sep(t);
    fprintf(t->f,
            "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,"
            "\"args\":{\"name\":\"%s\"}}",
            pid, k, track_names[k]);
    sep(t);
    fprintf(t->f,
            "{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,"
            "\"args\":{\"sort_index\":%d}}",
            pid, k, k);
  }
}

void dsc_trace_span(dsc_trace *t, int pid, dsc_trace_track track, const char *cat, int64_t t0_ns,
                    int64_t t1_ns, const char *args_json, const char *name) {
  if (!t || pid < 0 || pid >= TRACE_MAX_PID || track < DSC_TRACE_STEP || track > LAST_TRACK)
    return;
  if (t1_ns < t0_ns) t1_ns = t0_ns;
  pthread_mutex_lock(&t->lock);
  trace_rank *r = rank_of(t, pid);
  if (r && !r->named) {
    name_rank(t, pid);
    r->named = true;
  }
  /* Collectives and transfers overlap one another on their track: a pair
   * of async events ("b"/"e", one id per span: rank << 32 | n, unique in a
   * merged file) is valid for any overlap, where complete events on one
   * thread must nest (Perfetto moves the others to overflow tracks). */
  bool async = r && (track == DSC_TRACE_COMM || track == DSC_TRACE_COPY);
  for (int end = 0; end < (async ? 2 : 1); end++) {
    sep(t);
    fputs("{\"name\":", t->f);
    put_json_string(t->f, name ? name : "?");
    fputs(",\"cat\":", t->f);
    put_json_string(t->f, cat ? cat : track_names[track]);
    fprintf(t->f, ",\"ph\":\"%s\",\"pid\":%d,\"tid\":%d,\"ts\":", async ? (end ? "e" : "b") : "X",
            pid, (int)track);
    put_us(t->f, end ? t1_ns : t0_ns);
    if (async)
      fprintf(t->f, ",\"id\":\"0x%" PRIx64 "\"",
              ((uint64_t)pid << 32) | (uint64_t)(r->async_ids & 0xffffffff));
    if (!async) {
      fputs(",\"dur\":", t->f);
      put_us(t->f, t1_ns - t0_ns);
    }
    if (args_json && !end) fprintf(t->f, ",\"args\":%s", args_json);
    fputc('}', t->f);
  }
  if (async) r->async_ids++;
  pthread_mutex_unlock(&t->lock);
}

void dsc_trace_spanf(dsc_trace *t, int pid, dsc_trace_track track, int64_t t0_ns, int64_t t1_ns,
                     const char *fmt, ...) {
  if (!t) return;
  char name[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(name, sizeof name, fmt, ap);
  va_end(ap);
  dsc_trace_span(t, pid, track, NULL, t0_ns, t1_ns, NULL, name);
}

void dsc_trace_add_overlap(dsc_trace *t, int pid, int64_t comm_ns, int64_t wait_ns, int64_t n) {
  if (!t || pid < 0 || pid >= TRACE_MAX_PID) return;
  pthread_mutex_lock(&t->lock);
  trace_rank *r = rank_of(t, pid);
  if (r) {
    r->comm_ns += comm_ns;
    r->wait_ns += wait_ns;
    r->n += n;
  }
  pthread_mutex_unlock(&t->lock);
}

void dsc_trace_add_host(dsc_trace *t, int pid, int64_t busy_ns, int64_t wait_ns) {
  if (!t || pid < 0 || pid >= TRACE_MAX_PID) return;
  pthread_mutex_lock(&t->lock);
  trace_rank *r = rank_of(t, pid);
  if (r) r->host_busy_ns += busy_ns, r->host_wait_ns += wait_ns;
  pthread_mutex_unlock(&t->lock);
}

static void overlap_locked(const dsc_trace *t, dsc_trace_overlap *o) {
  memset(o, 0, sizeof *o);
  for (int i = 0; i < t->n_ranks; i++) {
    const trace_rank *r = &t->ranks[i];
    o->host_busy_s += (double)r->host_busy_ns * 1e-9;
    o->host_wait_s += (double)r->host_wait_ns * 1e-9;
    if (r->n == 0) continue;
    o->comm_s += (double)r->comm_ns * 1e-9;
    o->wait_s += (double)r->wait_ns * 1e-9;
    o->collectives += r->n;
    o->ranks++;
  }
}

void dsc_trace_get_overlap(dsc_trace *t, dsc_trace_overlap *o) {
  if (!t) {
    memset(o, 0, sizeof *o);
    return;
  }
  pthread_mutex_lock(&t->lock);
  overlap_locked(t, o);
  pthread_mutex_unlock(&t->lock);
}

double dsc_trace_hidden_host_share(const dsc_trace_overlap *o) {
  if (!(o->host_busy_s > 0)) return -1;
  double h = 1 - o->host_wait_s / o->host_busy_s;
  return h < 0 ? 0 : h;
}

double dsc_trace_hidden_share(const dsc_trace_overlap *o) {
  if (o->collectives == 0 || !(o->comm_s > 0)) return -1;
  double h = 1 - o->wait_s / o->comm_s;
  return h < 0 ? 0 : h;
}

dsc_status dsc_trace_close(dsc_trace *t) {
  if (!t) return DSC_OK;
  dsc_context *ctx = t->ctx;
  dsc_trace_overlap o;
  overlap_locked(t, &o);
  FILE *f = t->f;
  fputs(
      "\n],\"displayTimeUnit\":\"ms\",\"otherData\":{\"producer\":\"dsc train\","
      "\"clock\":\"CLOCK_MONOTONIC\",\"ranks\":{",
      f);
  bool first = true;
  for (int i = 0; i < t->n_ranks; i++) {
    const trace_rank *r = &t->ranks[i];
    if (r->n == 0 && r->host_busy_ns == 0) continue;
    fprintf(f, "%s\"%d\":{\"collectives\":%" PRId64 ",\"comm_us\":%.3f,\"wait_us\":%.3f",
            first ? "" : ",", i, r->n, (double)r->comm_ns * 1e-3, (double)r->wait_ns * 1e-3);
    if (r->host_busy_ns > 0)
      fprintf(f, ",\"host_busy_us\":%.3f,\"host_wait_us\":%.3f", (double)r->host_busy_ns * 1e-3,
              (double)r->host_wait_ns * 1e-3);
    fputs("}", f);
    first = false;
  }
  fputs("}", f);
  double h = dsc_trace_hidden_share(&o);
  if (h >= 0) fprintf(f, ",\"hidden_comm_share\":%.6f", h);
  double hh = dsc_trace_hidden_host_share(&o);
  if (hh >= 0) fprintf(f, ",\"hidden_host_share\":%.6f", hh);
  fputs("}}\n", f);
  bool failed = ferror(f) != 0;
  int saved = errno;
  if (fclose(f) != 0) failed = true, saved = errno;
  dsc_status st = DSC_OK;
  if (failed) {
    errno = saved;
    st = rt_io_error(ctx, t->path, "writing the trace failed");
  }
  pthread_mutex_destroy(&t->lock);
  if (t->ranks) ir_free(ctx, t->ranks, sizeof *t->ranks * (size_t)t->n_ranks);
  ir_free(ctx, t->path, t->path_size);
  ir_free(ctx, t, sizeof *t);
  return st;
}
