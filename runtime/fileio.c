/* File helpers shared by the runtime's writers and readers: atomic
 * replacement (temporary file + fsync + rename + directory fsync) and full
 * positional reads. POSIX only. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/runtime.h"

dsc_loc rt_loc(const char *path) {
  dsc_loc l = {path, 0, 0};
  return l;
}

dsc_status rt_io_error(dsc_context *ctx, const char *path, const char *what) {
  ir_error(ctx, rt_loc(path), "%s: %s", what, strerror(errno));
  return DSC_ERR_USER;
}

char *rt_strdup(dsc_context *ctx, const char *s) {
  size_t n = strlen(s);
  char *d = ir_alloc(ctx, n + 1);
  if (d) memcpy(d, s, n + 1);
  return d;
}

char *rt_parent_dir(dsc_context *ctx, const char *path) {
  const char *slash = strrchr(path, '/');
  if (!slash) return rt_strdup(ctx, ".");
  size_t n = slash == path ? 1 : (size_t)(slash - path); /* "/x" -> "/" */
  char *d = ir_alloc(ctx, n + 1);
  if (!d) return NULL;
  memcpy(d, path, n);
  d[n] = 0;
  return d;
}

dsc_status rt_fsync_dir(dsc_context *ctx, const char *dir) {
  int fd = open(dir, O_RDONLY | O_DIRECTORY);
  if (fd < 0) return rt_io_error(ctx, dir, "cannot open directory");
  int r = fsync(fd);
  /* Some file systems cannot fsync a directory (EINVAL): nothing to make durable there. */
  if (r != 0 && errno != EINVAL) {
    dsc_status st = rt_io_error(ctx, dir, "cannot sync directory");
    close(fd);
    return st;
  }
  close(fd);
  return DSC_OK;
}

bool rt_pread_full(int fd, void *buf, size_t n, uint64_t offset) {
  unsigned char *p = buf;
  while (n > 0) {
    ssize_t got = pread(fd, p, n, (off_t)offset);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      if (got == 0) errno = EIO; /* the file shrank under us */
      return false;
    }
    p += got;
    n -= (size_t)got;
    offset += (uint64_t)got;
  }
  return true;
}

dsc_status rt_atomic_open(dsc_context *ctx, const char *path, rt_atomic_file *f) {
  memset(f, 0, sizeof *f);
  f->ctx = ctx;
  f->path = path;
  f->fd = -1;
  f->tmp_size = strlen(path) + 48;
  f->tmp = ir_alloc(ctx, f->tmp_size);
  if (!f->tmp) {
    ir_error(ctx, rt_loc(path), "out of memory");
    return DSC_ERR_INTERNAL;
  }
  /* O_EXCL with a pid + counter name: no clash with another writer, and no
   * mkstemp, whose 0600 mode would end up on the final file. */
  for (int k = 0; k < 1000; k++) {
    snprintf(f->tmp, f->tmp_size, "%s.tmp-%ld-%d", path, (long)getpid(), k);
    f->fd = open(f->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (f->fd >= 0 || errno != EEXIST) break;
  }
  if (f->fd < 0) {
    dsc_status st = rt_io_error(ctx, path, "cannot create a temporary file next to it");
    ir_free(ctx, f->tmp, f->tmp_size);
    f->tmp = NULL;
    f->failed = true;
    return st;
  }
  return DSC_OK;
}

bool rt_atomic_write(rt_atomic_file *f, const void *buf, size_t n) {
  if (f->failed) return false;
  const unsigned char *p = buf;
  while (n > 0) {
    ssize_t put = write(f->fd, p, n);
    if (put < 0 && errno == EINTR) continue;
    if (put <= 0) {
      if (put == 0) errno = EIO;
      rt_io_error(f->ctx, f->path, "write failed");
      f->failed = true;
      return false;
    }
    p += put;
    n -= (size_t)put;
  }
  return true;
}

void rt_atomic_abort(rt_atomic_file *f) {
  if (f->fd >= 0) close(f->fd);
  f->fd = -1;
  if (f->tmp) {
    unlink(f->tmp);
    ir_free(f->ctx, f->tmp, f->tmp_size);
    f->tmp = NULL;
  }
  f->failed = true;
}

dsc_status rt_atomic_commit(rt_atomic_file *f) {
  if (f->failed) {
    rt_atomic_abort(f);
    return DSC_ERR_USER;
  }
  dsc_status st = DSC_OK;
  if (fsync(f->fd) != 0) st = rt_io_error(f->ctx, f->path, "cannot sync");
  int fd = f->fd;
  f->fd = -1;
  if (close(fd) != 0 && st == DSC_OK) st = rt_io_error(f->ctx, f->path, "close failed");
  if (st == DSC_OK && rename(f->tmp, f->path) != 0)
    st = rt_io_error(f->ctx, f->path, "cannot rename the temporary file into place");
  if (st != DSC_OK) {
    rt_atomic_abort(f);
    return st;
  }
  ir_free(f->ctx, f->tmp, f->tmp_size);
  f->tmp = NULL;
  char *dir = rt_parent_dir(f->ctx, f->path);
  if (!dir) {
    ir_error(f->ctx, rt_loc(f->path), "out of memory");
    return DSC_ERR_INTERNAL;
  }
  st = rt_fsync_dir(f->ctx, dir);
  ir_free(f->ctx, dir, strlen(dir) + 1);
  return st;
}
