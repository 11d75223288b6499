/* runtime/: the layer's internal vocabulary, sectioned by source file.
 * The public view is include/dsc/runtime.h. */
#ifndef DSC_RUNTIME_INTERNAL_H
#define DSC_RUNTIME_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dsc/runtime.h"
#include "ir/ir.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ======================= runtime/fileio.c ======================= */
/* Diagnostics about a file read "path: error: ...". */
dsc_loc rt_loc(const char *path);
/* Reports errno's text for an operation on path; returns DSC_ERR_USER. */
dsc_status rt_io_error(dsc_context *ctx, const char *path, const char *what);

/* A file written under a temporary name in the destination's directory and
 * renamed over it only once everything is on disk. Any failure reports a
 * diagnostic once, removes the temporary and leaves the destination alone. */
typedef struct {
  dsc_context *ctx;
  const char *path; /* destination */
  char *tmp;        /* temporary path (context allocator) */
  size_t tmp_size;
  int fd;
  bool failed;
} rt_atomic_file;

dsc_status rt_atomic_open(dsc_context *ctx, const char *path, rt_atomic_file *f);
bool rt_atomic_write(rt_atomic_file *f, const void *buf, size_t n);
/* fsync, close, rename into place, fsync the directory. */
dsc_status rt_atomic_commit(rt_atomic_file *f);
void rt_atomic_abort(rt_atomic_file *f);
/* Makes a directory entry change (rename, create) durable. */
dsc_status rt_fsync_dir(dsc_context *ctx, const char *dir);
/* The directory holding path ("." when it has no slash), context-allocated;
 * free with ir_free(ctx, p, strlen(p) + 1). */
char *rt_parent_dir(dsc_context *ctx, const char *path);
/* Reads exactly n bytes at offset; false on a short read or an I/O error. */
bool rt_pread_full(int fd, void *buf, size_t n, uint64_t offset);
char *rt_strdup(dsc_context *ctx, const char *s); /* free: ir_free(ctx, s, strlen(s) + 1) */

/* ======================= runtime/data.c ======================= */
typedef struct dsc_loader rt_loader;
struct dsc_loader {
  dsc_context *ctx;
  char *path;
  uint16_t *tokens;
  int64_t n_tokens;
  int64_t B, T, windows;
  uint64_t seed;
  dsc_loader_mode mode;
  int64_t *order;      /* this epoch's window order (shuffle mode) */
  int64_t order_epoch; /* the epoch `order` was drawn for; -1: none */
  dsc_loader_pos pos;
};
/* Fills order[0..windows) with epoch's permutation of the window indices:
 * Fisher-Yates driven by xoshiro256** seeded from (seed, epoch). */
void rt_loader_permutation(uint64_t seed, int64_t epoch, int64_t *order, int64_t windows);

/* ======================= runtime/safetensors.c ======================= */
/* The safetensors dtype name of a dsc dtype ("F32", "BF16", "BOOL", ...). */
const char *rt_st_dtype_name(dsc_dtype dt);
bool rt_st_dtype_from_name(const char *name, dsc_dtype *out);
/* IEEE binary16 and bfloat16 bit patterns, rounded to nearest even directly
 * from the double (no double rounding through f32); NaN stays NaN. */
uint16_t rt_f16_bits(double x);
uint16_t rt_bf16_bits(double x);
double rt_f16_value(uint16_t bits);
double rt_bf16_value(uint16_t bits);
/* A library-owned tensor set: the public part first, then its arena. */
typedef struct {
  dsc_tensor_set pub;
  ir_arena arena; /* names, arrays, metadata strings */
} rt_tensor_set;
rt_tensor_set *rt_tensor_set_new(dsc_context *ctx, int n, int n_meta);

/* ======================= runtime/checkpoint.c ======================= */
typedef struct {
  dsc_checkpoint pub;
  ir_arena arena; /* dir and extra key/values */
} rt_checkpoint;

#ifdef __cplusplus
}
#endif
#endif
