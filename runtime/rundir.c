/* A run directory's writer lock and the leftovers of interrupted saves.
 *
 * One process writes a run directory at a time: it holds flock(LOCK_EX) on
 * RUN/.lock, which holds its pid so that a second writer can say whom it
 * is waiting for. The kernel drops the lock when the holder dies (kill -9
 * included), so a stale .lock file never blocks anyone; the file itself is
 * left in place (removing it would let two processes lock two different
 * files of the same name). */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/runtime.h"

struct rt_run_lock {
  dsc_context *ctx;
  int fd;
};

bool rt_remove_flat_dir(const char *dir) {
  /* O_NOFOLLOW: a symbolic link in a step's place is never followed into
   * another directory; unlinkat removes links themselves, not targets. */
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT;
  DIR *d = fdopendir(fd);
  if (!d) {
    close(fd);
    return false;
  }
  bool ok = true;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    if (unlinkat(dirfd(d), e->d_name, 0) != 0) ok = false;
  }
  closedir(d);
  return rmdir(dir) == 0 && ok;
}

/* The pid of a save's temporary name: ".step-N.tmp-PID" or ".latest.tmp-PID";
 * 0 when name is not one. */
static long temp_pid(const char *name, bool *is_dir) {
  const char *t = strstr(name, ".tmp-");
  if (!t || name[0] != '.') return 0;
  if (strncmp(name, ".step-", 6) == 0) {
    for (const char *p = name + 6; p < t; p++)
      if (*p < '0' || *p > '9') return 0;
    if (t == name + 6) return 0;
    *is_dir = true;
  } else if (t == name + 7 && strncmp(name, ".latest", 7) == 0) {
    *is_dir = false;
  } else {
    return 0;
  }
  char *end;
  errno = 0;
  long pid = strtol(t + 5, &end, 10);
  return errno || *end || pid <= 0 ? 0 : pid;
}

int rt_run_clean_stale(dsc_context *ctx, const char *dir, bool all) {
  DIR *d = opendir(dir);
  if (!d) return 0;
  int removed = 0;
  long self = (long)getpid();
  struct dirent *e;
  while ((e = readdir(d))) {
    bool is_dir = false;
    long pid = temp_pid(e->d_name, &is_dir);
    if (pid == 0 || pid == self) continue;
    /* Unlocked, only a process that is gone: a live one may be saving. */
    if (!all && !(kill((pid_t)pid, 0) != 0 && errno == ESRCH)) continue;
    size_t n = strlen(dir) + strlen(e->d_name) + 2;
    char *p = ir_alloc(ctx, n);
    if (!p) break;
    snprintf(p, n, "%s/%s", dir, e->d_name);
    struct stat sb;
    bool ok = lstat(p, &sb) == 0 &&
              (is_dir ? S_ISDIR(sb.st_mode) && rt_remove_flat_dir(p)
                      : S_ISLNK(sb.st_mode) && unlink(p) == 0);
    if (ok) {
      removed++;
      ir_diag(ctx, DSC_DIAG_NOTE, rt_loc(p),
              "removed what an interrupted save by process %ld left behind", pid);
    } else if (is_dir) {
      ir_diag(ctx, DSC_DIAG_WARNING, rt_loc(p),
              "could not remove what an interrupted save by process %ld left behind", pid);
    }
    ir_free(ctx, p, n);
  }
  closedir(d);
  return removed;
}

dsc_status rt_run_lock_take(dsc_context *ctx, const char *dir, rt_run_lock **out) {
  *out = NULL;
  size_t n = strlen(dir) + 8;
  char *path = ir_alloc(ctx, n);
  if (!path) {
    ir_error(ctx, rt_loc(dir), "out of memory");
    return DSC_ERR_INTERNAL;
  }
  snprintf(path, n, "%s/.lock", dir);
  dsc_status st = DSC_OK;
  int fd = open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC, 0666);
  struct stat sb = {0};
  if (fd < 0) {
    st = rt_io_error(ctx, path, "cannot create the run directory's lock file");
  } else if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
    ir_error(ctx, rt_loc(path), "the run directory's lock file is not a regular file (%s)",
             rt_file_kind((unsigned)sb.st_mode));
    st = DSC_ERR_USER;
  } else if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) {
      char buf[32] = {0};
      ssize_t got = pread(fd, buf, sizeof buf - 1, 0);
      long pid = got > 0 ? strtol(buf, NULL, 10) : 0;
      if (pid > 0)
        ir_error(ctx, rt_loc(dir), "run directory %s is in use by dsc (pid %ld)", dir, pid);
      else
        ir_error(ctx, rt_loc(dir), "run directory %s is in use by another dsc process", dir);
      st = DSC_ERR_USER;
    } else if (errno == ENOLCK || errno == EOPNOTSUPP || errno == ENOSYS) {
      /* A file system without locks: run as before, unprotected. */
      ir_diag(ctx, DSC_DIAG_WARNING, rt_loc(dir),
              "cannot lock the run directory (%s): nothing stops a second run writing here",
              strerror(errno));
    } else {
      st = rt_io_error(ctx, path, "cannot lock the run directory");
    }
  }
  if (st == DSC_OK) {
    char buf[32];
    int len = snprintf(buf, sizeof buf, "%ld\n", (long)getpid());
    if (ftruncate(fd, 0) != 0 || pwrite(fd, buf, (size_t)len, 0) != len)
      st = rt_io_error(ctx, path, "cannot write the lock file");
  }
  rt_run_lock *l = st == DSC_OK ? ir_alloc(ctx, sizeof *l) : NULL;
  if (st == DSC_OK && !l) {
    ir_error(ctx, rt_loc(dir), "out of memory");
    st = DSC_ERR_INTERNAL;
  }
  ir_free(ctx, path, n);
  if (st != DSC_OK) {
    if (fd >= 0) close(fd);
    return st;
  }
  l->ctx = ctx;
  l->fd = fd;
  *out = l;
  /* Holding the lock, no live writer owns a temporary here. */
  rt_run_clean_stale(ctx, dir, true);
  return DSC_OK;
}

dsc_status rt_run_lock_check(const rt_run_lock *l, const char *dir) {
  if (!l) return DSC_OK;
  size_t n = strlen(dir) + 8;
  char *path = ir_alloc(l->ctx, n);
  if (!path) {
    ir_error(l->ctx, rt_loc(dir), "out of memory");
    return DSC_ERR_INTERNAL;
  }
  snprintf(path, n, "%s/.lock", dir);
  struct stat held, now;
  bool same = fstat(l->fd, &held) == 0 && lstat(path, &now) == 0 && held.st_dev == now.st_dev &&
              held.st_ino == now.st_ino;
  ir_free(l->ctx, path, n);
  if (same) return DSC_OK;
  ir_error(l->ctx, rt_loc(dir),
           "the run directory was moved, removed or replaced while this run held it (its .lock is "
           "not this run's): not writing a checkpoint there");
  return DSC_ERR_USER;
}

void rt_run_lock_release(rt_run_lock *l) {
  if (!l) return;
  close(l->fd); /* drops the flock */
  ir_free(l->ctx, l, sizeof *l);
}
