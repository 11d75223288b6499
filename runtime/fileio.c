/* File helpers shared by the runtime's writers and readers: atomic
 * replacement (temporary file + fsync + rename + directory fsync), opening
 * inputs only when they are regular files, and full positional reads.
 * POSIX only. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
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
  /* Trailing slashes name the same directory: "r/step-1/" is in "r". */
  size_t end = strlen(path);
  while (end > 1 && path[end - 1] == '/') end--;
  size_t slash = end;
  while (slash > 0 && path[slash - 1] != '/') slash--;
  if (slash == 0) return rt_strdup(ctx, ".");
  size_t n = slash - 1; /* drop the separator and any run of them */
  while (n > 0 && path[n - 1] == '/') n--;
  if (n == 0) n = 1; /* "/x" -> "/" */
  char *d = ir_alloc(ctx, n + 1);
  if (!d) return NULL;
  memcpy(d, path, n);
  d[n] = 0;
  return d;
}

const char *rt_file_kind(unsigned mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "a special file";
}

int rt_open_regular_fd(const char *path, int flags, const char **kind) {
  *kind = NULL;
  /* O_NONBLOCK: opening a FIFO for reading returns at once instead of
   * waiting for a writer; O_NOCTTY: a terminal never becomes ours. */
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC | flags);
  if (fd < 0) return -1;
  struct stat sb;
  if (fstat(fd, &sb) != 0) {
    int e = errno;
    close(fd);
    errno = e;
    return -1;
  }
  if (!S_ISREG(sb.st_mode)) {
    *kind = rt_file_kind((unsigned)sb.st_mode);
    close(fd);
    errno = EINVAL;
    return -1;
  }
  int fl = fcntl(fd, F_GETFL);
  if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
    int e = errno;
    close(fd);
    errno = e;
    return -1;
  }
  return fd;
}

dsc_status rt_open_regular(dsc_context *ctx, const char *path, int flags, int *fd) {
  const char *kind;
  *fd = rt_open_regular_fd(path, flags, &kind);
  if (*fd >= 0) return DSC_OK;
  if (!kind) return rt_io_error(ctx, path, "cannot open");
  ir_error(ctx, rt_loc(path), "not a regular file (%s)", kind);
  return DSC_ERR_USER;
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

/* What an output path names: a regular file (or a link to one: the file
 * it names is replaced, the link kept), nothing, a character device or a
 * FIFO (written straight into), or something refused. */
static dsc_status atomic_target(rt_atomic_file *f) {
  struct stat sb;
  if (stat(f->path, &sb) != 0) {
    if (errno == ENOENT) return DSC_OK;
    return rt_io_error(f->ctx, f->path, "cannot write");
  }
  if (S_ISCHR(sb.st_mode) || S_ISFIFO(sb.st_mode)) {
    f->direct = true;
    return DSC_OK;
  }
  if (!S_ISREG(sb.st_mode)) {
    ir_error(f->ctx, rt_loc(f->path),
             "cannot write here: it is %s (outputs replace a regular file, or stream into a "
             "character device or a FIFO)",
             rt_file_kind((unsigned)sb.st_mode));
    return DSC_ERR_USER;
  }
  struct stat lsb;
  if (lstat(f->path, &lsb) == 0 && S_ISLNK(lsb.st_mode)) {
    char *real = realpath(f->path, NULL);
    if (!real) return rt_io_error(f->ctx, f->path, "cannot resolve the link");
    f->dest = rt_strdup(f->ctx, real);
    free(real);
    if (!f->dest) {
      ir_error(f->ctx, rt_loc(f->path), "out of memory");
      return DSC_ERR_INTERNAL;
    }
  }
  return DSC_OK;
}

static void free_dest(rt_atomic_file *f) {
  if (f->dest && f->dest != f->path) ir_free(f->ctx, (char *)f->dest, strlen(f->dest) + 1);
  f->dest = NULL;
}

dsc_status rt_atomic_open(dsc_context *ctx, const char *path, rt_atomic_file *f) {
  memset(f, 0, sizeof *f);
  f->ctx = ctx;
  f->path = path;
  f->fd = -1;
  dsc_status st = atomic_target(f);
  if (st != DSC_OK) {
    free_dest(f);
    f->failed = true;
    return st;
  }
  if (f->direct) {
    /* A device or a pipe: no rename (it would put a regular file in its
     * place); a FIFO waits for its reader here, as a shell's > would. */
    f->fd = open(path, O_WRONLY | O_NOCTTY | O_CLOEXEC);
    if (f->fd < 0) {
      f->failed = true;
      return rt_io_error(ctx, path, "cannot open for writing");
    }
    return DSC_OK;
  }
  if (!f->dest) f->dest = path;
  f->tmp_size = strlen(f->dest) + 48;
  f->tmp = ir_alloc(ctx, f->tmp_size);
  if (!f->tmp) {
    free_dest(f);
    ir_error(ctx, rt_loc(path), "out of memory");
    return DSC_ERR_INTERNAL;
  }
  /* O_EXCL with a pid + counter name: no clash with another writer, and no
   * mkstemp, whose 0600 mode would end up on the final file. */
  for (int k = 0; k < 1000; k++) {
    snprintf(f->tmp, f->tmp_size, "%s.tmp-%ld-%d", f->dest, (long)getpid(), k);
    f->fd = open(f->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (f->fd >= 0 || errno != EEXIST) break;
  }
  if (f->fd < 0) {
    st = rt_io_error(ctx, path, "cannot create a temporary file next to it");
    ir_free(ctx, f->tmp, f->tmp_size);
    f->tmp = NULL;
    free_dest(f);
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
  free_dest(f);
  f->failed = true;
}

dsc_status rt_atomic_commit(rt_atomic_file *f) {
  if (f->failed) {
    rt_atomic_abort(f);
    return DSC_ERR_USER;
  }
  dsc_status st = DSC_OK;
  /* A device or a pipe may not sync (EINVAL, EROFS): nothing to make durable. */
  if (fsync(f->fd) != 0 && !(f->direct && (errno == EINVAL || errno == EROFS)))
    st = rt_io_error(f->ctx, f->path, "cannot sync");
  int fd = f->fd;
  f->fd = -1;
  if (close(fd) != 0 && st == DSC_OK) st = rt_io_error(f->ctx, f->path, "close failed");
  if (f->direct) {
    f->failed = st != DSC_OK;
    return st;
  }
  if (st == DSC_OK && rename(f->tmp, f->dest) != 0)
    st = rt_io_error(f->ctx, f->path, "cannot rename the temporary file into place");
  if (st != DSC_OK) {
    rt_atomic_abort(f);
    return st;
  }
  ir_free(f->ctx, f->tmp, f->tmp_size);
  f->tmp = NULL;
  char *dir = rt_parent_dir(f->ctx, f->dest);
  free_dest(f);
  if (!dir) {
    ir_error(f->ctx, rt_loc(f->path), "out of memory");
    return DSC_ERR_INTERNAL;
  }
  st = rt_fsync_dir(f->ctx, dir);
  ir_free(f->ctx, dir, strlen(dir) + 1);
  return st;
}

dsc_status rt_read_small(dsc_context *ctx, const char *path, uint64_t max, char **text,
                         size_t *len) {
  *text = NULL, *len = 0;
  int fd;
  dsc_status st = rt_open_regular(ctx, path, 0, &fd);
  if (st != DSC_OK) return st;
  struct stat sb;
  if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || (uint64_t)sb.st_size > max) {
    ir_error(ctx, rt_loc(path), "not a regular file of at most %" PRIu64 " bytes", max);
    close(fd);
    return DSC_ERR_USER;
  }
  size_t n = (size_t)sb.st_size;
  char *t = ir_alloc(ctx, n + 1);
  if (!t) {
    close(fd);
    ir_error(ctx, rt_loc(path), "out of memory");
    return DSC_ERR_INTERNAL;
  }
  bool ok = rt_pread_full(fd, t, n, 0);
  close(fd);
  if (!ok) {
    ir_free(ctx, t, n + 1);
    return rt_io_error(ctx, path, "read failed");
  }
  t[n] = 0;
  *text = t, *len = n;
  return DSC_OK;
}

dsc_status dsc_file_copy(dsc_context *ctx, const char *src, const char *dst) {
  char *text;
  size_t len;
  dsc_status st = rt_read_small(ctx, src, (uint64_t)1 << 26, &text, &len);
  if (st != DSC_OK) return st;
  rt_atomic_file f;
  if ((st = rt_atomic_open(ctx, dst, &f)) == DSC_OK) {
    rt_atomic_write(&f, text, len);
    st = rt_atomic_commit(&f);
  }
  ir_free(ctx, text, len + 1);
  return st;
}
