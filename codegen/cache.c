/* The kernel cache (codegen/codegen.h "codegen/cache.c"), one for both
 * targets: compiled objects on disk as DIR/<key>.<ext> (LLVM objects "o",
 * cubins "cubin"), each a header (magic, key, length, FNV-1a of the
 * payload) and the payload. A file that is absent, short, for another key
 * or corrupt is a miss; writes go to a temporary name renamed into place,
 * and a failed write only costs a recompile. */
#include <stdio.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "codegen/codegen.h"

typedef struct {
  char magic[8];
  uint64_t key, len, sum;
} cache_header;

uint64_t cg_fnv1a(uint64_t h, const void *p, size_t n) {
  const unsigned char *s = p;
  for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 0x100000001b3ull;
  return h;
}

static char *cache_path(dsc_context *ctx, const char *dir, uint64_t key, const char *ext,
                        const char *suffix, size_t *size) {
  *size = strlen(dir) + strlen(ext) + strlen(suffix) + 32;
  char *p = ir_alloc(ctx, *size);
  if (p) snprintf(p, *size, "%s/%016llx.%s%s", dir, (unsigned long long)key, ext, suffix);
  return p;
}

void *cg_cache_read(dsc_context *ctx, const char *dir, uint64_t key, const char *ext,
                    const char *magic, uint64_t max_len, size_t *len) {
  size_t ps;
  char *path = cache_path(ctx, dir, key, ext, "", &ps);
  if (!path) return NULL;
  /* O_NONBLOCK: a FIFO in the cache directory is skipped, never waited on
   * (the flag does nothing to a regular file's reads). */
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  ir_free(ctx, path, ps);
  struct stat sb;
  FILE *f = fd >= 0 && fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) ? fdopen(fd, "rb") : NULL;
  if (!f) {
    if (fd >= 0) close(fd);
    return NULL;
  }
  cache_header h;
  void *data = NULL;
  if (fread(&h, sizeof h, 1, f) != 1 || memcmp(h.magic, magic, 8) != 0 || h.key != key ||
      h.len == 0 || h.len > max_len)
    goto fail;
  data = malloc((size_t)h.len);
  if (!data || fread(data, 1, (size_t)h.len, f) != (size_t)h.len || fgetc(f) != EOF) goto fail;
  if (cg_fnv1a(CG_FNV_INIT, data, (size_t)h.len) != h.sum) goto fail;
  fclose(f);
  *len = (size_t)h.len;
  return data;
fail:
  free(data);
  fclose(f);
  return NULL;
}

/* dir and its missing parents (~/.cache may not exist on a new machine). */
static void make_dirs(dsc_context *ctx, const char *dir) {
  if (mkdir(dir, 0777) == 0) return;
  size_t n = strlen(dir) + 1;
  char *p = ir_alloc(ctx, n);
  if (!p) return;
  memcpy(p, dir, n);
  for (char *s = p + 1; *s; s++)
    if (*s == '/') {
      *s = 0;
      mkdir(p, 0777);
      *s = '/';
    }
  mkdir(p, 0777);
  ir_free(ctx, p, n);
}

void cg_cache_write(dsc_context *ctx, const char *dir, uint64_t key, const char *ext,
                    const char *magic, const void *data, size_t len) {
  make_dirs(ctx, dir); /* EEXIST is fine; other failures show at fopen */
  char suffix[48];
  static unsigned counter;
  snprintf(suffix, sizeof suffix, ".tmp%ld.%u", (long)getpid(),
           __atomic_fetch_add(&counter, 1, __ATOMIC_RELAXED));
  size_t ts, ps;
  char *tmp = cache_path(ctx, dir, key, ext, suffix, &ts);
  char *path = cache_path(ctx, dir, key, ext, "", &ps);
  if (tmp && path) {
    cache_header h;
    memcpy(h.magic, magic, 8);
    h.key = key;
    h.len = len;
    h.sum = cg_fnv1a(CG_FNV_INIT, data, len);
    FILE *f = fopen(tmp, "wb");
    if (f) {
      bool ok = fwrite(&h, sizeof h, 1, f) == 1 && fwrite(data, 1, len, f) == len;
      ok = (fclose(f) == 0) && ok;
      if (!ok || rename(tmp, path) != 0) remove(tmp);
    }
  }
  if (tmp) ir_free(ctx, tmp, ts);
  if (path) ir_free(ctx, path, ps);
}
