/* program/: the contract between code generation and execution, sectioned
 * by source file: the .dsx container and the program files built on it.
 * codegen/ writes programs, runtime/ reads them. */
#ifndef DSC_PROGRAM_H
#define DSC_PROGRAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "codegen/codegen.h"
#include "dsc/exec.h"
#include "ir/ir.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ======================= program/dsx.c =======================
 * The .dsx container of compiled programs: named sections, each with a
 * checksum, written atomically; reading checks everything against the file. */
/* Little-endian integers in file formats (.dsx and its sections). */
static inline void rt_put_le32(unsigned char *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static inline void rt_put_le64(unsigned char *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static inline uint32_t rt_get_le32(const unsigned char *p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}
static inline uint64_t rt_get_le64(const unsigned char *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}
typedef struct {
  char *name; /* writer: const text; reader: owned */
  void *data; /* reader: owned, NUL-terminated past size */
  size_t size;
} rt_dsx_section;
typedef struct {
  rt_dsx_section *sections;
  int n, cap;
} rt_dsx;
dsc_status rt_dsx_write(dsc_context *ctx, const char *path, const rt_dsx_section *s, int n);
dsc_status rt_dsx_read(dsc_context *ctx, const char *path, rt_dsx **out);
void rt_dsx_free(dsc_context *ctx, rt_dsx *d);
const rt_dsx_section *rt_dsx_find(const rt_dsx *d, const char *name);

/* ======================= program/program_file.c =======================
 * Program files (include/dsc/exec.h dsc_program_*). One graph's CPU kernel
 * objects form one section: packed from kernels k[0..n) with their objects;
 * unpacking sets objs[i]/lens[i] (pointers into data) for each kernel i
 * whose name and kir_hash equal the file's entry i, NULL for the others.
 * Returns the number found, or -1 when the section is malformed. */
void *rt_pack_kernel_objects(dsc_context *ctx, kir_kernel *const *k, int n,
                             void *const *objs, const size_t *lens, size_t *out_len);
int rt_unpack_kernel_objects(const void *data, size_t size, kir_kernel *const *k, int n,
                             const void **objs, size_t *lens);
const rt_dsx *rt_program_dsx(const dsc_program *p);
/* Whether p holds cpu kernels from this dsc version for host (cg_llvm_host). */
bool rt_program_cpu_fits(const dsc_program *p, const char *host);
/* cg_llvm_host of a JIT for this process's host (false if LLVM fails). */
bool rt_llvm_host(dsc_context *ctx, char *buf, size_t len);

#ifdef __cplusplus
}
#endif
#endif
