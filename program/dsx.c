/* The .dsx container: named sections with checksums, written atomically.
 *
 * Layout (little-endian):
 *   "DSCX" u32 version(1) u32 n_sections u32 reserved
 *   n_sections x { u64 offset, u64 length, u64 fnv1a64 of the bytes,
 *                  u32 name_length, u32 reserved, name bytes (no NUL) }
 *   section bytes (each at its offset, 64-byte aligned)
 * Everything is checked on reading (sizes against the file, names, each
 * section's checksum), so a truncated or corrupted file is an error that
 * names the file and the section, never a crash. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/runtime.h"

#define DSX_MAGIC "DSCX"
#define DSX_VERSION 1u
#define DSX_MAX_SECTIONS 4096u
#define DSX_MAX_NAME 256u

static uint64_t fnv1a64(const void *p, size_t n) {
  const unsigned char *b = p;
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
  return h;
}


static size_t entry_size(size_t name_len) { return 32 + name_len; }

dsc_status rt_dsx_write(dsc_context *ctx, const char *path, const rt_dsx_section *s, int n) {
  size_t header = 16;
  for (int i = 0; i < n; i++) {
    size_t len = strlen(s[i].name);
    if (len == 0 || len > DSX_MAX_NAME) {
      ir_error(ctx, rt_loc(path), "section name '%s' is empty or too long", s[i].name);
      return DSC_ERR_INTERNAL;
    }
    header += entry_size(len);
  }
  unsigned char *h = ir_alloc(ctx, header);
  if (!h) {
    ir_error(ctx, rt_loc(path), "out of memory");
    return DSC_ERR_INTERNAL;
  }
  memcpy(h, DSX_MAGIC, 4);
  rt_put_le32(h + 4, DSX_VERSION);
  rt_put_le32(h + 8, (uint32_t)n);
  rt_put_le32(h + 12, 0);
  uint64_t off = (header + 63) / 64 * 64;
  size_t pos = 16;
  for (int i = 0; i < n; i++) {
    size_t len = strlen(s[i].name);
    rt_put_le64(h + pos, off);
    rt_put_le64(h + pos + 8, s[i].size);
    rt_put_le64(h + pos + 16, fnv1a64(s[i].data, s[i].size));
    rt_put_le32(h + pos + 24, (uint32_t)len);
    rt_put_le32(h + pos + 28, 0);
    memcpy(h + pos + 32, s[i].name, len);
    pos += entry_size(len);
    off = (off + s[i].size + 63) / 64 * 64;
  }
  rt_atomic_file f;
  dsc_status st = rt_atomic_open(ctx, path, &f);
  if (st != DSC_OK) {
    ir_free(ctx, h, header);
    return st;
  }
  static const unsigned char zeros[64];
  uint64_t written = header;
  bool ok = rt_atomic_write(&f, h, header);
  ir_free(ctx, h, header);
  for (int i = 0; ok && i < n; i++) {
    uint64_t pad = (64 - written % 64) % 64;
    ok = rt_atomic_write(&f, zeros, (size_t)pad) && rt_atomic_write(&f, s[i].data, s[i].size);
    written += pad + s[i].size;
  }
  if (!ok) {
    rt_atomic_abort(&f);
    return DSC_ERR_USER;
  }
  return rt_atomic_commit(&f);
}

static dsc_status corrupt(dsc_context *ctx, const char *path, const char *what) {
  ir_error(ctx, rt_loc(path), "not a valid .dsx file: %s", what);
  return DSC_ERR_USER;
}

void rt_dsx_free(dsc_context *ctx, rt_dsx *d) {
  if (!d) return;
  for (int i = 0; i < d->n; i++) {
    if (d->sections[i].name) ir_free(ctx, d->sections[i].name, strlen(d->sections[i].name) + 1);
    if (d->sections[i].data) ir_free(ctx, d->sections[i].data, d->sections[i].size + 1);
  }
  if (d->sections) ir_free(ctx, d->sections, sizeof *d->sections * (size_t)d->cap);
  ir_free(ctx, d, sizeof *d);
}

typedef struct {
  uint64_t off, len;
  const char *name;
} dsx_span;

static int cmp_span(const void *a, const void *b) {
  const dsx_span *x = a, *y = b;
  return x->off != y->off ? (x->off > y->off) - (x->off < y->off)
                          : (x->len > y->len) - (x->len < y->len);
}
static int cmp_span_name(const void *a, const void *b) {
  return strcmp(((const dsx_span *)a)->name, ((const dsx_span *)b)->name);
}

/* Every section begins after the table (table_end bytes), none overlaps
 * another, and no name appears twice (lookups take the first). */
static dsc_status check_layout(dsc_context *ctx, const char *path, const rt_dsx *d,
                               const uint64_t *offs, uint64_t table_end) {
  dsx_span *sp = ir_alloc(ctx, sizeof *sp * (size_t)(d->n + 1));
  if (!sp) {
    ir_error(ctx, rt_loc(path), "out of memory");
    return DSC_ERR_INTERNAL;
  }
  for (int i = 0; i < d->n; i++)
    sp[i] = (dsx_span){offs[3 * i], offs[3 * i + 1], d->sections[i].name};
  dsc_status st = DSC_OK;
  qsort(sp, (size_t)d->n, sizeof *sp, cmp_span);
  for (int i = 0; i < d->n && st == DSC_OK; i++) {
    if (sp[i].len && sp[i].off < table_end) {
      ir_error(ctx, rt_loc(path),
               "not a valid .dsx file: section '%s' starts at byte %" PRIu64
               ", inside the section table (%" PRIu64 " bytes)",
               sp[i].name, sp[i].off, table_end);
      st = DSC_ERR_USER;
    } else if (i > 0 && sp[i].len && sp[i - 1].len && sp[i].off < sp[i - 1].off + sp[i - 1].len) {
      ir_error(ctx, rt_loc(path), "not a valid .dsx file: sections '%s' and '%s' overlap",
               sp[i - 1].name, sp[i].name);
      st = DSC_ERR_USER;
    }
  }
  qsort(sp, (size_t)d->n, sizeof *sp, cmp_span_name);
  for (int i = 1; i < d->n && st == DSC_OK; i++)
    if (strcmp(sp[i - 1].name, sp[i].name) == 0) {
      ir_error(ctx, rt_loc(path), "not a valid .dsx file: section '%s' appears twice", sp[i].name);
      st = DSC_ERR_USER;
    }
  ir_free(ctx, sp, sizeof *sp * (size_t)(d->n + 1));
  return st;
}

dsc_status rt_dsx_read(dsc_context *ctx, const char *path, rt_dsx **out) {
  *out = NULL;
  int fd;
  dsc_status ost = rt_open_regular(ctx, path, 0, &fd);
  if (ost != DSC_OK) return ost;
  struct stat sb;
  if (fstat(fd, &sb) != 0) {
    close(fd);
    return rt_io_error(ctx, path, "cannot stat");
  }
  uint64_t fsize = (uint64_t)sb.st_size;
  unsigned char hdr[16];
  dsc_status st = DSC_OK;
  rt_dsx *d = NULL;
  unsigned char *table = NULL;
  uint64_t *offs = NULL;
  uint32_t n = 0;
  size_t table_len = 0;
  if (fsize < 16 || !rt_pread_full(fd, hdr, 16, 0) || memcmp(hdr, DSX_MAGIC, 4) != 0) {
    st = corrupt(ctx, path, "no DSCX header (was it written by 'dsc compile'?)");
    goto done;
  }
  if (rt_get_le32(hdr + 4) != DSX_VERSION) {
    ir_error(ctx, rt_loc(path), "format version %" PRIu32 ", this dsc reads version %u",
             rt_get_le32(hdr + 4), DSX_VERSION);
    st = DSC_ERR_USER;
    goto done;
  }
  n = rt_get_le32(hdr + 8);
  if (n > DSX_MAX_SECTIONS) {
    st = corrupt(ctx, path, "too many sections");
    goto done;
  }
  /* The section table is bounded by the file size and the name limit. */
  table_len = (size_t)n * entry_size(DSX_MAX_NAME);
  if (table_len > fsize - 16) table_len = (size_t)(fsize - 16);
  table = ir_alloc(ctx, table_len + 1);
  d = ir_alloc(ctx, sizeof *d);
  if (!table || !d) {
    ir_error(ctx, rt_loc(path), "out of memory");
    st = DSC_ERR_INTERNAL;
    goto done;
  }
  memset(d, 0, sizeof *d);
  d->cap = (int)n + 1;
  d->sections = ir_alloc(ctx, sizeof *d->sections * (size_t)d->cap);
  if (!d->sections) {
    ir_error(ctx, rt_loc(path), "out of memory");
    st = DSC_ERR_INTERNAL;
    goto done;
  }
  memset(d->sections, 0, sizeof *d->sections * (size_t)d->cap);
  if (!rt_pread_full(fd, table, table_len, 16)) {
    st = corrupt(ctx, path, "truncated section table");
    goto done;
  }
  size_t pos = 0;
  offs = ir_alloc(ctx, sizeof(uint64_t) * 3 * ((size_t)n + 1)); /* off, len, sum */
  if (!offs) {
    ir_error(ctx, rt_loc(path), "out of memory");
    st = DSC_ERR_INTERNAL;
    goto done;
  }
  /* The table first, then the layout (sections after the table, apart,
   * uniquely named), then the bytes: overlapping sections must not turn
   * a small file into a large allocation. */
  for (uint32_t i = 0; i < n; i++) {
    if (pos + 32 > table_len) {
      st = corrupt(ctx, path, "truncated section table");
      goto done;
    }
    uint64_t off = rt_get_le64(table + pos), len = rt_get_le64(table + pos + 8), sum = rt_get_le64(table + pos + 16);
    uint32_t nl = rt_get_le32(table + pos + 24);
    if (nl == 0 || nl > DSX_MAX_NAME || pos + 32 + nl > table_len) {
      st = corrupt(ctx, path, "bad section name");
      goto done;
    }
    rt_dsx_section *s = &d->sections[d->n++];
    if (!(s->name = ir_alloc(ctx, nl + 1))) {
      st = DSC_ERR_INTERNAL;
      goto done;
    }
    memcpy(s->name, table + pos + 32, nl);
    s->name[nl] = 0;
    if (strlen(s->name) != nl) {
      st = corrupt(ctx, path, "bad section name");
      goto done;
    }
    pos += 32 + nl;
    if (off > fsize || len > fsize - off) {
      ir_error(ctx, rt_loc(path), "not a valid .dsx file: section '%s' runs past the end (truncated?)",
               s->name);
      st = DSC_ERR_USER;
      goto done;
    }
    offs[3 * i] = off, offs[3 * i + 1] = len, offs[3 * i + 2] = sum;
  }
  if ((st = check_layout(ctx, path, d, offs, 16 + pos)) != DSC_OK) goto done;
  for (int i = 0; i < d->n; i++) {
    rt_dsx_section *s = &d->sections[i];
    uint64_t off = offs[3 * i], len = offs[3 * i + 1], sum = offs[3 * i + 2];
    s->size = (size_t)len;
    if (!(s->data = ir_alloc(ctx, s->size + 1))) {
      ir_error(ctx, rt_loc(path), "out of memory reading section '%s'", s->name);
      st = DSC_ERR_INTERNAL;
      goto done;
    }
    ((char *)s->data)[s->size] = 0; /* text sections read as C strings */
    if (!rt_pread_full(fd, s->data, s->size, off) || fnv1a64(s->data, s->size) != sum) {
      ir_error(ctx, rt_loc(path), "not a valid .dsx file: section '%s' is corrupted (checksum)",
               s->name);
      st = DSC_ERR_USER;
      goto done;
    }
  }
done:
  if (offs) ir_free(ctx, offs, sizeof(uint64_t) * 3 * ((size_t)n + 1));
  if (table) ir_free(ctx, table, table_len + 1);
  close(fd);
  if (st != DSC_OK) {
    rt_dsx_free(ctx, d);
    return st;
  }
  *out = d;
  return DSC_OK;
}

const rt_dsx_section *rt_dsx_find(const rt_dsx *d, const char *name) {
  for (int i = 0; i < d->n; i++)
    if (strcmp(d->sections[i].name, name) == 0) return &d->sections[i];
  return NULL;
}
