/* dsc public API: core vocabulary shared by every layer.
 *
 * A dsc_context owns an allocator and a list of diagnostics. There is no
 * global state: two contexts can live in one process. Every fallible call
 * returns a dsc_status; details are in the context's diagnostics. */
#ifndef DSC_CORE_H
#define DSC_CORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  DSC_OK = 0,
  DSC_ERR_USER = 1,     /* bad input: model file, shapes, arguments */
  DSC_ERR_INTERNAL = 2, /* a bug in dsc, or the host failed (out of memory) */
  DSC_ERR_INTERRUPTED = 3, /* the context's interrupt callback asked to stop */
} dsc_status;

/* Lua-style allocator: nsize == 0 frees ptr; otherwise (re)allocates.
 * Returns NULL on failure (never aborts). */
typedef void *(*dsc_alloc_fn)(void *ud, void *ptr, size_t osize, size_t nsize);

typedef struct dsc_context dsc_context;

/* NULL alloc selects malloc/realloc/free. */
dsc_context *dsc_context_new(dsc_alloc_fn alloc, void *ud);
void dsc_context_free(dsc_context *ctx);

/* ---- interrupts ----
 * Long calls (loading, the pass pipeline, lowering, JIT compiling, memory
 * planning) poll fn(ud) between units of work; when it returns nonzero they
 * stop, leave files as they were and return DSC_ERR_INTERRUPTED with an
 * "interrupted while ..." error. Typically fn reads a volatile sig_atomic_t
 * that a signal handler sets; the library keeps no global state of its own.
 * fn NULL (the default) never interrupts. Rank contexts made by the
 * in-process communicator inherit it. */
typedef int (*dsc_interrupt_fn)(void *ud);
void dsc_context_set_interrupt(dsc_context *ctx, dsc_interrupt_fn fn, void *ud);

/* ---- progress ----
 * Long steps (compiling kernels) call fn(ud, what, done, total) from the
 * calling thread as units finish: what names the step ("compiling 612
 * kernels"), done goes from 0 to total (the last call has done == total).
 * A command-line tool prints a progress line with it; NULL (the default)
 * reports nothing. */
typedef void (*dsc_progress_fn)(void *ud, const char *what, int64_t done, int64_t total);
void dsc_context_set_progress(dsc_context *ctx, dsc_progress_fn fn, void *ud);

/* ---- diagnostics ---- */
typedef enum { DSC_DIAG_ERROR, DSC_DIAG_WARNING, DSC_DIAG_NOTE } dsc_severity;

typedef struct {
  const char *file; /* NULL when the diagnostic has no source location */
  int line, col;    /* 1-based; 0 when unknown */
} dsc_loc;

typedef struct {
  dsc_severity severity;
  dsc_loc loc;
  const char *message;
} dsc_diag;

int dsc_diag_count(const dsc_context *ctx);
int dsc_error_count(const dsc_context *ctx);
const dsc_diag *dsc_diag_get(const dsc_context *ctx, int i);
void dsc_diag_clear(dsc_context *ctx);
/* Prints every diagnostic as `file:line:col: error: message`, followed by
 * the source line and a caret when the source text is known. */
void dsc_diag_print(const dsc_context *ctx, FILE *out);
/* Optional callback invoked for each new diagnostic (e.g. to print at once). */
typedef void (*dsc_diag_fn)(void *ud, const dsc_diag *d);
void dsc_set_diag_callback(dsc_context *ctx, dsc_diag_fn fn, void *ud);

/* ---- dtypes and tensor types ---- */
typedef enum {
  DSC_F32,
  DSC_F64,
  DSC_BF16,
  DSC_F16,
  DSC_I32,
  DSC_I64,
  DSC_BOOL,
  DSC_DTYPE_COUNT
} dsc_dtype;

#define DSC_MAX_RANK 8

typedef struct {
  dsc_dtype dtype;
  int rank;
  int64_t dims[DSC_MAX_RANK];
} dsc_type;

const char *dsc_dtype_name(dsc_dtype dt);
/* Returns 0 and sets *out when name is a dtype name ("f32", ...). */
int dsc_dtype_from_name(const char *name, dsc_dtype *out);
size_t dsc_dtype_size(dsc_dtype dt);
int dsc_dtype_is_float(dsc_dtype dt);
int64_t dsc_type_numel(const dsc_type *t);
/* For shapes from files: 0 when a dim is negative, the rank is out of range
 * or the product of the nonzero dims (so every stride too) passes
 * INT64_MAX; else 1 with the element count in *out. */
int dsc_type_numel_checked(const dsc_type *t, int64_t *out);
int dsc_type_equal(const dsc_type *a, const dsc_type *b);
dsc_type dsc_type_make(dsc_dtype dt, int rank, const int64_t *dims);
/* Writes e.g. "f32[4,64]" (scalars: "f32[]"); returns snprintf's count. */
int dsc_type_format(const dsc_type *t, char *buf, size_t n);

#ifdef __cplusplus
}
#endif
#endif
