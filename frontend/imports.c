/* Imports: reading model files and loading the files they import. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "frontend/frontend.h"

/* --------------------------------------------------------------- imports */

/* Only regular files: a directory, FIFO or device could block or never end. */
FILE *fe_open_regular(dsc_context *ctx, const char *path, dsc_loc loc, const char *verb) {
  struct stat sb;
  if (stat(path, &sb) != 0) {
    ir_error(ctx, loc, "cannot %s '%s': %s", verb, path, strerror(errno));
    return NULL;
  }
  if (!S_ISREG(sb.st_mode)) {
    ir_error(ctx, loc, "cannot %s '%s': not a regular file", verb, path);
    return NULL;
  }
  FILE *f = fopen(path, "rb");
  if (!f) ir_error(ctx, loc, "cannot %s '%s': %s", verb, path, strerror(errno));
  return f;
}

static bool read_file(fe_state *st, const char *path, dsc_loc loc, char **text, size_t *len) {
  FILE *f = fe_open_regular(st->ctx, path, loc, "import");
  if (!f) return false;
  size_t cap = 4096, n = 0;
  char *buf = ir_arena_alloc(&st->arena, cap + 1);
  while (buf) {
    size_t r = fread(buf + n, 1, cap - n, f);
    n += r;
    if (n < cap) break;
    if (cap >= FE_MAX_FILE_BYTES) {
      fclose(f);
      ERR(loc, "'%s' is too large (more than %d bytes)", path, FE_MAX_FILE_BYTES);
      return false;
    }
    char *nb = ir_arena_alloc(&st->arena, cap * 2 + 1);
    if (nb) memcpy(nb, buf, n);
    buf = nb;
    cap *= 2;
  }
  bool err = ferror(f) != 0;
  fclose(f);
  if (!buf) {
    st->oom = true;
    return false;
  }
  if (err) {
    ERR(loc, "cannot read '%s'", path);
    return false;
  }
  buf[n] = 0;
  *text = buf;
  *len = n;
  return true;
}


fe_file *fe_add_file(fe_state *st, const char *path, const char *text, size_t len) {
  fe_file *f = st_alloc(st, sizeof *f);
  if (!f) return NULL;
  f->path = ir_arena_strdup(&st->arena, path);
  char real[4096];
  const char *key = realpath(path, real) ? real : path;
  f->key = ir_arena_strdup(&st->arena, key);
  f->text = text;
  f->len = len;
  if (!f->path || !f->key || !st_push(st, &st->files, f)) {
    st->oom = true;
    return NULL;
  }
  /* Locations in the module outlive this arena: use the context's name. */
  if (!(f->path = ir_diag_add_source(st->ctx, f->path, text, len))) {
    st->oom = true;
    return NULL;
  }
  if (!fe_parse(st->ctx, &st->arena, f)) {
    st->oom = true;
    return NULL;
  }
  return f;
}

static void import_one(fe_state *st, fe_file *from, fe_decl *d) {
  char path[4096];
  const char *slash = strrchr(from->path, '/');
  if (d->name[0] == '/' || !slash)
    snprintf(path, sizeof path, "%s", d->name);
  else
    snprintf(path, sizeof path, "%.*s/%s", (int)(slash - from->path), from->path, d->name);
  char real[4096];
  const char *key = realpath(path, real) ? real : path;
  for (int i = 0; i < st->import_depth; i++)
    if (strcmp(st->import_stack[i]->key, key) == 0) {
      char chain[1024] = "";
      for (int j = i; j < st->import_depth; j++) {
        size_t l = strlen(chain);
        snprintf(chain + l, sizeof chain - l, "%.200s -> ", st->import_stack[j]->path);
      }
      size_t l = strlen(chain);
      snprintf(chain + l, sizeof chain - l, "%.200s", path);
      ERR(d->name_loc, "import cycle: %s", chain);
      return;
    }
  for (int i = 0; i < st->files.n; i++)
    if (strcmp(((fe_file *)st->files.items[i])->key, key) == 0) return; /* already loaded */
  if (st->import_depth >= 32) {
    ERR(d->name_loc, "imports nested too deeply (more than 32 files)");
    return;
  }
  char *text;
  size_t len;
  if (!read_file(st, path, d->name_loc, &text, &len)) return;
  fe_file *f = fe_add_file(st, path, text, len);
  if (f) fe_load_imports(st, f);
}

void fe_load_imports(fe_state *st, fe_file *file) {
  if (st->import_depth >= 32) return;
  st->import_stack[st->import_depth++] = file;
  for (int i = 0; i < file->decls.n && !st->oom; i++) {
    fe_decl *d = file->decls.items[i];
    if (d->kind == FE_D_IMPORT) import_one(st, file, d);
  }
  st->import_depth--;
}
