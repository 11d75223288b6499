/* Program files (.dsx, include/dsc/exec.h): the reading side, and the
 * packing of one graph's CPU kernel objects into a section.
 *
 * The container (runtime/dsx.c) checks sizes and checksums; this file
 * checks what the sections mean: the format version, the meta lines, and
 * that a packed kernel still is the kernel the module lowers to (name and
 * kir_hash), so a stale object is recompiled instead of run. */
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dsc/exec.h"
#include "runtime/runtime.h"

#define MAX_META 64

struct dsc_program {
  dsc_context *ctx;
  char *path;
  rt_dsx *dsx;
  int n_meta;
  const char *keys[MAX_META], *values[MAX_META]; /* into the meta section's copy */
  char *meta_text;                               /* ctx-allocated, meta_len + 1 */
  size_t meta_len;
};

bool dsc_program_is_file(const char *path) {
  const char *kind; /* a FIFO is no program: never wait on it */
  int fd = rt_open_regular_fd(path, 0, &kind);
  if (fd < 0) return false;
  char magic[4];
  bool yes = rt_pread_full(fd, magic, 4, 0) && memcmp(magic, "DSCX", 4) == 0;
  close(fd);
  return yes;
}

void dsc_program_free(dsc_program *p) {
  if (!p) return;
  rt_dsx_free(p->ctx, p->dsx);
  if (p->path) ir_free(p->ctx, p->path, strlen(p->path) + 1);
  if (p->meta_text) ir_free(p->ctx, p->meta_text, p->meta_len + 1);
  ir_free(p->ctx, p, sizeof *p);
}

/* "key=value" lines; the copy is cut into NUL-terminated pieces in place. */
static bool parse_meta(dsc_program *p, const rt_dsx_section *s) {
  p->meta_len = s->size;
  if (!(p->meta_text = ir_alloc(p->ctx, s->size + 1))) return false;
  memcpy(p->meta_text, s->data, s->size);
  p->meta_text[s->size] = 0;
  if (strlen(p->meta_text) != s->size) return false; /* a NUL inside */
  for (char *line = p->meta_text; *line;) {
    char *nl = strchr(line, '\n'), *eq = strchr(line, '=');
    if (!nl || !eq || eq > nl || eq == line || p->n_meta == MAX_META) return false;
    *nl = 0, *eq = 0;
    p->keys[p->n_meta] = line;
    p->values[p->n_meta++] = eq + 1;
    line = nl + 1;
  }
  return true;
}

dsc_status dsc_program_open(dsc_context *ctx, const char *path, dsc_program **out) {
  *out = NULL;
  dsc_program *p = ir_alloc(ctx, sizeof *p);
  if (!p) {
    ir_error(ctx, rt_loc(path), "out of memory");
    return DSC_ERR_INTERNAL;
  }
  memset(p, 0, sizeof *p);
  p->ctx = ctx;
  dsc_status st = DSC_OK;
  if (!(p->path = rt_strdup(ctx, path))) {
    ir_error(ctx, rt_loc(path), "out of memory");
    st = DSC_ERR_INTERNAL;
  }
  if (st == DSC_OK && !dsc_program_is_file(path) && access(path, R_OK) == 0) {
    ir_error(ctx, rt_loc(path),
             "not a compiled program (no .dsx header): write one with 'dsc compile MODEL.dsm'");
    st = DSC_ERR_USER;
  }
  if (st == DSC_OK) st = rt_dsx_read(ctx, path, &p->dsx);
  const rt_dsx_section *meta = st == DSC_OK ? rt_dsx_find(p->dsx, "meta") : NULL;
  if (st == DSC_OK && (!meta || !parse_meta(p, meta))) {
    ir_error(ctx, rt_loc(path), "not a valid .dsx file: %s",
             meta ? "malformed meta section" : "no meta section");
    st = DSC_ERR_USER;
  }
  if (st == DSC_OK) {
    const char *f = dsc_program_meta(p, "format");
    if (!f || strcmp(f, "1") != 0) {
      ir_error(ctx, rt_loc(path),
               "program format %s, this dsc reads format %d (recompile it with 'dsc compile')",
               f ? f : "(none)", DSC_PROGRAM_FORMAT);
      st = DSC_ERR_USER;
    }
  }
  if (st != DSC_OK) {
    dsc_program_free(p);
    return st;
  }
  *out = p;
  return DSC_OK;
}

const char *dsc_program_path(const dsc_program *p) { return p->path; }

const char *dsc_program_meta(const dsc_program *p, const char *key) {
  for (int i = 0; i < p->n_meta; i++)
    if (strcmp(p->keys[i], key) == 0) return p->values[i];
  return NULL;
}

dsc_status dsc_program_meta_i64(const dsc_program *p, const char *key, int64_t *out) {
  const char *s = dsc_program_meta(p, key);
  char *end = NULL;
  long long v = s ? strtoll(s, &end, 10) : 0;
  if (!s || !*s || *end || v <= 0) {
    ir_error(p->ctx, rt_loc(p->path), "not a valid .dsx file: meta '%s' is %s", key,
             s ? "not a positive integer" : "missing");
    return DSC_ERR_USER;
  }
  *out = v;
  return DSC_OK;
}

dsc_status dsc_program_module(const dsc_program *p, const char *name, dsc_module **out) {
  *out = NULL;
  char sec[128];
  snprintf(sec, sizeof sec, "module.%s", name);
  const rt_dsx_section *s = rt_dsx_find(p->dsx, sec);
  if (!s) {
    ir_error(p->ctx, rt_loc(p->path), "not a valid .dsx file: no section '%s'", sec);
    return DSC_ERR_USER;
  }
  /* Diagnostics point into the section: "FILE.dsx:module.step:LINE:COL". */
  size_t n = strlen(p->path) + strlen(sec) + 2;
  char *file = ir_alloc(p->ctx, n);
  if (!file) return DSC_ERR_INTERNAL;
  snprintf(file, n, "%s:%s", p->path, sec);
  dsc_status st = dsc_module_parse(p->ctx, s->data, s->size, file, out);
  ir_free(p->ctx, file, n);
  return st;
}

int dsc_program_section_count(const dsc_program *p) { return p->dsx->n; }
const char *dsc_program_section_name(const dsc_program *p, int i) {
  return p->dsx->sections[i].name;
}
size_t dsc_program_section_size(const dsc_program *p, int i) { return p->dsx->sections[i].size; }

const rt_dsx *rt_program_dsx(const dsc_program *p) { return p->dsx; }
dsc_context *rt_program_context(const dsc_program *p) { return p->ctx; }

bool rt_program_cpu_fits(const dsc_program *p, const char *host) {
  const char *target = dsc_program_meta(p, "target"), *ver = dsc_program_meta(p, "dsc_version");
  const char *there = dsc_program_meta(p, "host");
  return target && strcmp(target, "cpu") == 0 && ver && strcmp(ver, DSC_VERSION) == 0 && there &&
         strcmp(there, host) == 0;
}

/* ---------------------------------------------------------------- packing */


/* "DSKO" u32 n, then per kernel: u64 kir_hash, u64 object length, u32 name
 * length, u32 0, the name, the object. */
void *rt_pack_kernel_objects(dsc_context *ctx, const cg_kernel_info *k, int n, void *const *objs,
                             const size_t *lens, size_t *out_len) {
  size_t total = 8;
  for (int i = 0; i < n; i++) total += 24 + strlen(k[i].name) + lens[i];
  unsigned char *b = ir_alloc(ctx, total);
  if (!b) return NULL;
  memcpy(b, "DSKO", 4);
  rt_put_le32(b + 4, (uint32_t)n);
  size_t pos = 8;
  for (int i = 0; i < n; i++) {
    size_t nl = strlen(k[i].name);
    rt_put_le64(b + pos, k[i].hash);
    rt_put_le64(b + pos + 8, lens[i]);
    rt_put_le32(b + pos + 16, (uint32_t)nl);
    rt_put_le32(b + pos + 20, 0);
    memcpy(b + pos + 24, k[i].name, nl);
    memcpy(b + pos + 24 + nl, objs[i], lens[i]);
    pos += 24 + nl + lens[i];
  }
  *out_len = total;
  return b;
}

int rt_unpack_kernel_objects(const void *data, size_t size, const cg_kernel_info *k, int n,
                             const void **objs, size_t *lens) {
  const unsigned char *b = data;
  for (int i = 0; i < n; i++) objs[i] = NULL, lens[i] = 0;
  if (size < 8 || memcmp(b, "DSKO", 4) != 0) return -1;
  uint32_t count = rt_get_le32(b + 4);
  size_t pos = 8;
  int found = 0;
  for (uint32_t i = 0; i < count; i++) {
    if (size - pos < 24) return -1;
    uint64_t hash = rt_get_le64(b + pos), len = rt_get_le64(b + pos + 8);
    uint32_t nl = rt_get_le32(b + pos + 16);
    if (nl > size - pos - 24 || len > size - pos - 24 - nl) return -1;
    const char *name = (const char *)b + pos + 24;
    /* Kernel i of the file serves kernel i of the lowering only if it is
     * the same kernel: same name, same kir_hash. */
    if (i < (uint32_t)n && strlen(k[i].name) == nl && memcmp(k[i].name, name, nl) == 0 &&
        k[i].hash == hash && len > 0) {
      objs[i] = b + pos + 24 + nl;
      lens[i] = (size_t)len;
      found++;
    }
    pos += 24 + nl + (size_t)len;
  }
  return pos == size ? found : -1;
}
