/* NCCL opened with dlopen (runtime/nccl_api.h says why). */
#include <dlfcn.h>
#include <glob.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsc/comm.h"
#include "runtime/nccl_api.h"

static const struct {
  const char *name;
  size_t offset;
} symbols[] = {
#define SYM(field) {"nccl" #field, offsetof(rt_nccl_api, field)}
    SYM(GetVersion), SYM(GetUniqueId),    SYM(CommInitRank),      SYM(CommDestroy), SYM(CommAbort),
    SYM(AllReduce),  SYM(ReduceScatter),  SYM(AllGather),         SYM(Broadcast),   SYM(GroupStart),
    SYM(GroupEnd),   SYM(GetErrorString), SYM(CommGetAsyncError), SYM(Send),        SYM(Recv),
#undef SYM
};

bool rt_nccl_api_open(const char *path, rt_nccl_api *out, char *why, size_t n) {
  memset(out, 0, sizeof *out);
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char *e = dlerror();
    snprintf(why, n, "%s", e ? e : path);
    return false;
  }
  for (size_t i = 0; i < sizeof symbols / sizeof symbols[0]; i++) {
    void *f = dlsym(h, symbols[i].name);
    if (!f) {
      snprintf(why, n, "%s has no %s (not NCCL, or one too old)", path, symbols[i].name);
      dlclose(h);
      memset(out, 0, sizeof *out);
      return false;
    }
    /* POSIX guarantees data and function pointers convert via dlsym */
    memcpy((char *)out + symbols[i].offset, &f, sizeof f);
  }
  int v = 0;
  if (out->GetVersion(&v) != RT_NCCL_SUCCESS) v = 0;
  out->version = v;
  snprintf(out->path, sizeof out->path, "%s", path);
  return true;
}

static pthread_mutex_t api_lock = PTHREAD_MUTEX_INITIALIZER;
static rt_nccl_api api_table;
static bool api_ok;

/* Appends "; <text>" (or "<text>" first) to the list of attempts. */
static void note(char *buf, size_t n, size_t *len, const char *text) {
  if (*len >= n) return;
  int w = snprintf(buf + *len, n - *len, "%s%s", *len ? "; " : "", text);
  if (w > 0) *len += (size_t)w;
}

static rt_nccl_api *load_into; /* the table load_any fills (under api_lock) */

static bool try_path(const char *path, char *tried, size_t n, size_t *len) {
  char why[600];
  if (rt_nccl_api_open(path, load_into, why, sizeof why)) return true;
  note(tried, n, len, why);
  return false;
}

/* The nvidia-nccl wheel's library under root/python3.X/{site,dist}-packages. */
static bool try_wheels(const char *root, char *tried, size_t n, size_t *len) {
  static const char *const kinds[] = {"site-packages", "dist-packages"};
  for (int k = 0; k < 2; k++) {
    char pat[1024];
    snprintf(pat, sizeof pat, "%s/python3*/%s/nvidia/nccl/lib/libnccl.so.2", root, kinds[k]);
    glob_t g;
    if (glob(pat, 0, NULL, &g) != 0) continue;
    bool ok = false;
    for (size_t i = 0; i < g.gl_pathc && !ok; i++) ok = try_path(g.gl_pathv[i], tried, n, len);
    globfree(&g);
    if (ok) return true;
  }
  return false;
}

static bool load_any(char *tried, size_t n) {
  size_t len = 0;
  tried[0] = 0;
  const char *env = getenv("DSC_LIBNCCL");
  if (env && env[0]) {
    /* an explicit choice is never silently replaced by another library */
    char why[700];
    if (rt_nccl_api_open(env, load_into, why, sizeof why)) return true;
    snprintf(tried, n, "$DSC_LIBNCCL=%s: %s", env, why);
    return false;
  }
  if (try_path("libnccl.so.2", tried, n, &len)) return true;
  char path[1024];
  const char *cuda_home = getenv("CUDA_HOME");
  if (cuda_home && cuda_home[0]) {
    snprintf(path, sizeof path, "%s/lib64/libnccl.so.2", cuda_home);
    if (try_path(path, tried, n, &len)) return true;
  }
  if (try_path("/usr/local/cuda/lib64/libnccl.so.2", tried, n, &len)) return true;
  const char *venv = getenv("VIRTUAL_ENV");
  if (venv && venv[0]) {
    snprintf(path, sizeof path, "%s/lib", venv);
    if (try_wheels(path, tried, n, &len)) return true;
  }
  if (try_wheels("/opt/torch/.venv/lib", tried, n, &len) ||
      try_wheels("/usr/local/lib", tried, n, &len) || try_wheels("/usr/lib", tried, n, &len))
    return true;
  const char *home = getenv("HOME");
  if (home && home[0]) {
    snprintf(path, sizeof path, "%s/.local/lib", home);
    if (try_wheels(path, tried, n, &len)) return true;
  }
  note(tried, n, &len, "no nvidia/nccl/lib/libnccl.so.2 in the python site-packages searched");
  return false;
}

static bool find_locked(rt_nccl_api *out, char *why, size_t n) {
  char tried[2048];
  load_into = out;
  bool ok = load_any(tried, sizeof tried);
  if (!ok && why)
    snprintf(why, n, "NCCL could not be loaded (set DSC_LIBNCCL to libnccl.so.2): tried %s",
             tried);
  return ok;
}

bool rt_nccl_api_find(rt_nccl_api *out, char *why, size_t n) {
  pthread_mutex_lock(&api_lock);
  bool ok = find_locked(out, why, n);
  pthread_mutex_unlock(&api_lock);
  return ok;
}

const rt_nccl_api *rt_nccl_api_get(char *why, size_t n) {
  pthread_mutex_lock(&api_lock);
  if (!api_ok) api_ok = find_locked(&api_table, why, n);
  const rt_nccl_api *r = api_ok ? &api_table : NULL;
  pthread_mutex_unlock(&api_lock);
  return r;
}

void rt_nccl_error_text(const rt_nccl_api *api, rt_nccl_result r, char *buf, size_t n) {
  static const char *const names[] = {"ncclSuccess",       "ncclUnhandledCudaError",
                                      "ncclSystemError",   "ncclInternalError",
                                      "ncclInvalidArgument", "ncclInvalidUsage",
                                      "ncclRemoteError",   "ncclInProgress"};
  const char *text = api ? api->GetErrorString(r) : NULL;
  if (r >= 0 && r < (int)(sizeof names / sizeof names[0]))
    snprintf(buf, n, "%s: %s", names[r], text ? text : "(no description)");
  else
    snprintf(buf, n, "NCCL error %d%s%s", r, text ? ": " : "", text ? text : "");
}

bool rt_nccl_check(const rt_nccl_api *api, dsc_context *ctx, rt_nccl_result r,
                   const char *what_fmt, ...) {
  if (r == RT_NCCL_SUCCESS) return true;
  char what[400], text[300];
  va_list ap;
  va_start(ap, what_fmt);
  vsnprintf(what, sizeof what, what_fmt, ap);
  va_end(ap);
  rt_nccl_error_text(api, r, text, sizeof text);
  ir_error(ctx, ir_no_loc, "%s: %s", what, text);
  return false;
}

bool rt_nccl_dtype(dsc_dtype dt, int *out) {
  switch (dt) {
    case DSC_F32: *out = RT_NCCL_FLOAT32; return true;
    case DSC_F64: *out = RT_NCCL_FLOAT64; return true;
    case DSC_BF16: *out = RT_NCCL_BFLOAT16; return true;
    case DSC_F16: *out = RT_NCCL_FLOAT16; return true;
    case DSC_I32: *out = RT_NCCL_INT32; return true;
    case DSC_I64: *out = RT_NCCL_INT64; return true;
    case DSC_BOOL: *out = RT_NCCL_UINT8; return dsc_dtype_size(DSC_BOOL) == 1;
    default: return false;
  }
}

static bool fail(dsc_context *ctx, const cg_program *p, int i, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static bool fail(dsc_context *ctx, const cg_program *p, int i, const char *fmt, ...) {
  char msg[1200];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  ir_error(ctx, ir_no_loc, "backend cuda: program '%s': instruction %d: %s",
           p->graph_name ? p->graph_name : "?", i, msg);
  return false;
}

bool rt_nccl_check_program(dsc_context *ctx, const cg_program *p) {
  int first = -1;
  for (int i = 0; i < p->n_instrs; i++) {
    const cg_instr *in = &p->instrs[i];
    if (in->kind != CG_INS_COLLECTIVE_START) continue;
    const cg_collective *c = &in->coll;
    int nd = 0;
    if (first < 0) first = i;
    if (!rt_nccl_dtype(c->dtype, &nd))
      return fail(ctx, p, i, "NCCL has no %s data type", dsc_dtype_name(c->dtype));
    if ((c->kind == CG_COLL_ALL_REDUCE || c->kind == CG_COLL_REDUCE_SCATTER) &&
        (c->dtype == DSC_BOOL || (c->op != DSC_COMM_SUM && c->op != DSC_COMM_MEAN)))
      return fail(ctx, p, i, "a %s reduction (op %d) cannot run on NCCL", dsc_dtype_name(c->dtype),
                  c->op);
  }
  if (first < 0) return true;
  char why[2400];
  const rt_nccl_api *api = rt_nccl_api_get(why, sizeof why);
  if (!api)
    return fail(ctx, p, first, "the program has collective ops (%s); %s",
                p->instrs[first].op ? p->instrs[first].op : "collective start",
                why);
  for (int i = 0; i < p->n_instrs; i++) {
    const cg_instr *in = &p->instrs[i];
    if (in->kind == CG_INS_COLLECTIVE_START && in->coll.op == DSC_COMM_MEAN &&
        (in->coll.kind == CG_COLL_ALL_REDUCE || in->coll.kind == CG_COLL_REDUCE_SCATTER) &&
        api->version < 21000)
      return fail(ctx, p, i, "a mean reduction needs NCCL >= 2.10 (ncclAvg); %s is version %d",
                  api->path, api->version);
  }
  return true;
}
