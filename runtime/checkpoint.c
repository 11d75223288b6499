/* Checkpoint directories:
 *   OUT/step-000123/model.safetensors      parameters
 *   OUT/step-000123/optimizer.safetensors  optimizer state (possibly empty)
 *   OUT/step-000123/state.json             step, RNG, loader position, extras
 *   OUT/latest -> step-000123              (relative symlink)
 * A save builds the step directory under a temporary name (every file
 * fsync'ed), renames it into place, fsyncs OUT, then points `latest` at it
 * through a temporary symlink renamed over the old one. A crash or failure at
 * any point leaves the previous checkpoint and `latest` as they were.
 *
 * Under ZeRO (dsc_checkpoint_save_sharded) every rank also writes its chunks
 * of the sharded params and states:
 *   OUT/step-000123/shard-00002-of-00004.safetensors
 * (tensors named as the params, [S] each; metadata "full.<name>" = the full
 * shape "d0xd1...", "set.<name>" = model | optimizer), and state.json
 * records "zero_world". Loading assembles the full tensors from every
 * shard, so a checkpoint resumes at any world size and stage. */
#define _GNU_SOURCE /* renameat2 (atomic exchange when a step is saved again) */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/runtime.h"

#define STATE_FORMAT "dsc-checkpoint"
#define STATE_VERSION 1
#define MAX_STATE_BYTES (16u << 20)

/* "%s/%s" in the context's allocator; free with free_path. */
static char *join(dsc_context *ctx, const char *a, const char *b) {
  size_t n = strlen(a) + strlen(b) + 2;
  char *p = ir_alloc(ctx, n);
  if (p) snprintf(p, n, "%s/%s", a, b);
  return p;
}
static void free_path(dsc_context *ctx, char *p) {
  if (p) ir_free(ctx, p, strlen(p) + 1);
}

static dsc_status oom(dsc_context *ctx, const char *path) {
  ir_error(ctx, rt_loc(path), "out of memory");
  return DSC_ERR_INTERNAL;
}

/* mkdir -p */
static dsc_status make_dirs(dsc_context *ctx, const char *dir) {
  char *p = rt_strdup(ctx, dir);
  if (!p) return oom(ctx, dir);
  dsc_status st = DSC_OK;
  for (char *s = p + 1;; s++) {
    if (*s == '/' || *s == 0) {
      char c = *s;
      *s = 0;
      if (mkdir(p, 0777) != 0 && errno != EEXIST) {
        st = rt_io_error(ctx, p, "cannot create directory");
        *s = c;
        break;
      }
      *s = c;
      if (!c) break;
    }
  }
  free_path(ctx, p);
  struct stat sb;
  if (st == DSC_OK && (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))) {
    ir_error(ctx, rt_loc(dir), "not a directory");
    st = DSC_ERR_USER;
  }
  return st;
}

/* Removes a step directory: its plain files, then the directory itself. */
static bool remove_step_dir(dsc_context *ctx, const char *dir) {
  (void)ctx;
  return rt_remove_flat_dir(dir);
}

static void put_u64_hex(char *buf, uint64_t v) { snprintf(buf, 17, "%016" PRIx64, v); }

static dsc_status write_state(dsc_context *ctx, const char *path, const dsc_checkpoint_state *s) {
  cJSON *root = cJSON_CreateObject();
  bool ok = root != NULL;
  ok = ok && cJSON_AddStringToObject(root, "format", STATE_FORMAT);
  ok = ok && cJSON_AddNumberToObject(root, "version", STATE_VERSION);
  ok = ok && cJSON_AddNumberToObject(root, "step", (double)s->step);
  cJSON *rng = ok ? cJSON_AddArrayToObject(root, "rng") : NULL;
  ok = ok && rng;
  for (int i = 0; ok && i < 4; i++) {
    char hex[17]; /* hex strings: JSON numbers cannot hold 64-bit words exactly */
    put_u64_hex(hex, s->rng[i]);
    cJSON *x = cJSON_CreateString(hex);
    ok = x && cJSON_AddItemToArray(rng, x);
  }
  cJSON *ld = ok ? cJSON_AddObjectToObject(root, "loader") : NULL;
  ok = ok && ld && cJSON_AddNumberToObject(ld, "epoch", (double)s->loader.epoch) &&
       cJSON_AddNumberToObject(ld, "index", (double)s->loader.index);
  cJSON *ex = ok ? cJSON_AddObjectToObject(root, "extra") : NULL;
  ok = ok && ex;
  for (int i = 0; ok && i < s->n_extra; i++)
    ok = cJSON_AddStringToObject(ex, s->extra[i].key, s->extra[i].value) != NULL;
  dsc_status st = ok ? rt_write_json(ctx, path, root) : oom(ctx, path);
  cJSON_Delete(root);
  return st;
}

typedef struct {
  int64_t step;
  char *name;
} step_entry;

static int cmp_step(const void *a, const void *b) {
  const step_entry *x = a, *y = b;
  return x->step < y->step ? -1 : x->step > y->step;
}

/* "step-" followed by digits only; -1 otherwise. */
static int64_t parse_step_name(const char *name) {
  if (strncmp(name, "step-", 5) != 0 || !name[5]) return -1;
  int64_t v = 0;
  for (const char *p = name + 5; *p; p++) {
    if (*p < '0' || *p > '9' || v > (INT64_MAX - 9) / 10) return -1;
    v = v * 10 + (*p - '0');
  }
  return v;
}

/* Keeps the newest `keep` step directories (by step number) and always the
 * one just written; failures to remove are warnings (the new checkpoint is
 * safe either way). */
static void prune(dsc_context *ctx, const char *out_dir, const char *keep_name, int keep) {
  DIR *d = opendir(out_dir);
  if (!d) return;
  step_entry *list = NULL;
  int n = 0, cap = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    int64_t step = parse_step_name(e->d_name);
    if (step < 0) continue;
    /* Only real directories of this run: a link named like a step (or
     * anything else) is not ours to delete. */
    struct stat sb;
    if (fstatat(dirfd(d), e->d_name, &sb, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISDIR(sb.st_mode))
      continue;
    if (n == cap) {
      int nc = cap ? cap * 2 : 16;
      step_entry *nl = ir_realloc(ctx, list, sizeof *list * (size_t)cap, sizeof *list * (size_t)nc);
      if (!nl) break;
      list = nl;
      cap = nc;
    }
    list[n].step = step;
    list[n].name = rt_strdup(ctx, e->d_name);
    if (list[n].name) n++;
  }
  closedir(d);
  if (n > 0) qsort(list, (size_t)n, sizeof *list, cmp_step);
  for (int i = 0; i < n; i++) {
    if (i < n - keep && strcmp(list[i].name, keep_name) != 0) {
      char *p = join(ctx, out_dir, list[i].name);
      if (!p || !remove_step_dir(ctx, p))
        ir_diag(ctx, DSC_DIAG_WARNING, rt_loc(p ? p : out_dir),
                "could not remove an old checkpoint (keep_last = %d)", keep);
      free_path(ctx, p);
    }
    free_path(ctx, list[i].name);
  }
  if (list) ir_free(ctx, list, sizeof *list * (size_t)cap);
}

static dsc_status write_step_dir_files(dsc_context *ctx, const char *tmp,
                                       const dsc_tensor_set *model,
                                       const dsc_tensor_set *optimizer,
                                       const dsc_checkpoint_state *state) {
  dsc_tensor_set empty = {0, NULL, NULL, 0, NULL};
  const char *files[3] = {"model.safetensors", "optimizer.safetensors", "state.json"};
  dsc_status st = DSC_OK;
  for (int i = 0; i < 3 && st == DSC_OK; i++) {
    char *p = join(ctx, tmp, files[i]);
    if (!p) return oom(ctx, tmp);
    if (i == 0) st = dsc_safetensors_write(ctx, p, model);
    if (i == 1) st = dsc_safetensors_write(ctx, p, optimizer ? optimizer : &empty);
    if (i == 2) st = write_state(ctx, p, state);
    free_path(ctx, p);
  }
  return st;
}

static dsc_status check_save(dsc_context *ctx, const char *out_dir, const dsc_tensor_set *model,
                             const dsc_checkpoint_state *state) {
  dsc_loc loc = rt_loc(out_dir);
  if (!model || !state) {
    ir_error(ctx, loc, "checkpoint: model and state are required");
    return DSC_ERR_USER;
  }
  if (state->step < 0 || state->step >= (1LL << 53) || state->loader.epoch < 0 ||
      state->loader.epoch >= (1LL << 53) || state->loader.index < 0 ||
      state->loader.index >= (1LL << 53) || state->n_extra < 0 ||
      (state->n_extra && !state->extra)) {
    ir_error(ctx, loc, "checkpoint: step and loader position must be in [0, 2^53)");
    return DSC_ERR_USER;
  }
  for (int i = 0; i < state->n_extra; i++)
    if (!state->extra[i].key || !state->extra[i].value) {
      ir_error(ctx, loc, "checkpoint: extra entry %d has no key or value", i);
      return DSC_ERR_USER;
    }
  return make_dirs(ctx, out_dir);
}

/* The names of a save by process `pid`: the step directory, its temporary
 * name, `latest` and latest's temporary name (context-allocated). */
typedef struct {
  char name[40];
  char *final, *tmp, *latest, *link_tmp;
} save_paths;

static dsc_status make_paths(dsc_context *ctx, const char *out_dir, int64_t step, long pid,
                             save_paths *p) {
  char tmp_name[80], link_tmp_name[80];
  snprintf(p->name, sizeof p->name, "step-%06" PRId64, step);
  snprintf(tmp_name, sizeof tmp_name, ".%s.tmp-%ld", p->name, pid);
  snprintf(link_tmp_name, sizeof link_tmp_name, ".latest.tmp-%ld", pid);
  p->final = join(ctx, out_dir, p->name), p->tmp = join(ctx, out_dir, tmp_name);
  p->latest = join(ctx, out_dir, "latest"), p->link_tmp = join(ctx, out_dir, link_tmp_name);
  return p->final && p->tmp && p->latest && p->link_tmp ? DSC_OK : oom(ctx, out_dir);
}

static void free_paths(dsc_context *ctx, save_paths *p) {
  free_path(ctx, p->final);
  free_path(ctx, p->tmp);
  free_path(ctx, p->latest);
  free_path(ctx, p->link_tmp);
}

/* The written temporary directory becomes the step directory and `latest`
 * points at it; then older steps are pruned. */
static dsc_status publish(dsc_context *ctx, const char *out_dir, save_paths *p, int keep_last) {
  const char *name = p->name, *tmp = p->tmp, *final = p->final;
  const char *latest = p->latest, *link_tmp = p->link_tmp;
  dsc_status st = rt_fsync_dir(ctx, tmp);
  if (st != DSC_OK) {
    remove_step_dir(ctx, tmp);
    return st;
  }
  if (rename(tmp, final) != 0) {
    if (errno != EEXIST && errno != ENOTEMPTY) {
      st = rt_io_error(ctx, final, "cannot rename the new checkpoint into place");
      remove_step_dir(ctx, tmp);
      goto done;
    }
    /* The step was saved before (a resumed run): swap in one atomic step,
     * then drop the old contents, now under the temporary name. */
    if (renameat2(AT_FDCWD, tmp, AT_FDCWD, final, RENAME_EXCHANGE) != 0) {
      st = rt_io_error(ctx, final, "cannot replace the existing checkpoint");
      remove_step_dir(ctx, tmp);
      goto done;
    }
    if (!remove_step_dir(ctx, tmp))
      ir_diag(ctx, DSC_DIAG_WARNING, rt_loc(tmp), "could not remove the replaced checkpoint");
  }
  st = rt_fsync_dir(ctx, out_dir);
  if (st != DSC_OK) goto done;
  unlink(link_tmp);
  if (symlink(name, link_tmp) != 0) {
    st = rt_io_error(ctx, link_tmp, "cannot create symlink");
    goto done;
  }
  if (rename(link_tmp, latest) != 0) {
    st = rt_io_error(ctx, latest, "cannot repoint to the new checkpoint");
    unlink(link_tmp);
    goto done;
  }
  st = rt_fsync_dir(ctx, out_dir);
  if (st == DSC_OK && keep_last > 0) prune(ctx, out_dir, name, keep_last);
done:
  return st;
}

static dsc_status write_step_dir(dsc_context *ctx, const char *tmp, const dsc_tensor_set *model,
                                 const dsc_tensor_set *optimizer,
                                 const dsc_checkpoint_state *state) {
  if (mkdir(tmp, 0777) != 0) return rt_io_error(ctx, tmp, "cannot create directory");
  return write_step_dir_files(ctx, tmp, model, optimizer, state);
}

dsc_status dsc_checkpoint_save(dsc_context *ctx, const char *out_dir, const dsc_tensor_set *model,
                               const dsc_tensor_set *optimizer, const dsc_checkpoint_state *state,
                               int keep_last) {
  dsc_status st = check_save(ctx, out_dir, model, state);
  if (st != DSC_OK) return st;
  save_paths p;
  memset(&p, 0, sizeof p);
  st = make_paths(ctx, out_dir, state->step, (long)getpid(), &p);
  if (st == DSC_OK) {
    rt_run_clean_stale(ctx, out_dir, false); /* saves killed before they finished */
    remove_step_dir(ctx, p.tmp); /* a leftover of a crashed save by a process with our pid */
    st = write_step_dir(ctx, p.tmp, model, optimizer, state);
    if (st != DSC_OK) remove_step_dir(ctx, p.tmp);
  }
  if (st == DSC_OK) st = publish(ctx, out_dir, &p, keep_last);
  free_paths(ctx, &p);
  return st;
}

/* Every rank's failure count, summed (a collective). */
static bool all_ok(dsc_comm *comm, bool ok, int64_t tag, dsc_status *st) {
  int32_t bad = !ok;
  if (dsc_comm_all_reduce(comm, &bad, &bad, 1, DSC_I32, DSC_COMM_SUM, tag) != DSC_OK) {
    *st = DSC_ERR_USER;
    return false;
  }
  return bad == 0;
}

dsc_status dsc_checkpoint_save_sharded(dsc_context *ctx, dsc_comm *comm, const char *out_dir,
                                       const dsc_tensor_set *model,
                                       const dsc_tensor_set *optimizer,
                                       const dsc_tensor_set *shards,
                                       const dsc_checkpoint_state *state, int keep_last) {
  int rank = dsc_comm_rank(comm), world = dsc_comm_world(comm);
  int64_t tag = state ? state->step : 0;
  /* rank 0 prepares the temporary directory under its pid's name */
  dsc_status st = DSC_OK, cst = DSC_OK;
  int64_t pid = (int64_t)getpid();
  save_paths p;
  memset(&p, 0, sizeof p);
  if (rank == 0) {
    st = check_save(ctx, out_dir, model, state);
    if (st == DSC_OK) st = make_paths(ctx, out_dir, state->step, (long)pid, &p);
    if (st == DSC_OK) {
      remove_step_dir(ctx, p.tmp);
      if (mkdir(p.tmp, 0777) != 0) st = rt_io_error(ctx, p.tmp, "cannot create directory");
    }
  }
  if (!all_ok(comm, st == DSC_OK, tag, &cst)) {
    if (rank != 0 && cst == DSC_OK)
      ir_error(ctx, rt_loc(out_dir), "checkpoint: rank 0 could not prepare the step directory");
    free_paths(ctx, &p);
    return st != DSC_OK ? st : DSC_ERR_USER;
  }
  if (dsc_comm_broadcast(comm, &pid, 1, DSC_I64, 0, tag) != DSC_OK) {
    free_paths(ctx, &p);
    return DSC_ERR_USER;
  }
  if (rank != 0) st = make_paths(ctx, out_dir, state->step, (long)pid, &p);
  /* every rank writes its chunks */
  char file[64];
  snprintf(file, sizeof file, "shard-%05d-of-%05d.safetensors", rank, world);
  char *path = st == DSC_OK ? join(ctx, p.tmp, file) : NULL;
  if (st == DSC_OK && !path) st = oom(ctx, p.tmp);
  if (st == DSC_OK) st = dsc_safetensors_write(ctx, path, shards);
  free_path(ctx, path);
  bool written = all_ok(comm, st == DSC_OK, tag, &cst);
  if (written && rank == 0) st = write_step_dir_files(ctx, p.tmp, model, optimizer, state);
  if (written && rank == 0 && st == DSC_OK) st = publish(ctx, out_dir, &p, keep_last);
  if (!written && rank == 0) remove_step_dir(ctx, p.tmp);
  if (!written && st == DSC_OK && cst == DSC_OK) {
    ir_error(ctx, rt_loc(out_dir), "checkpoint: another rank could not write its shard");
    st = DSC_ERR_USER;
  }
  /* the others learn whether rank 0 published it */
  if (written && !all_ok(comm, st == DSC_OK, tag, &cst) && st == DSC_OK) {
    ir_error(ctx, rt_loc(out_dir), "checkpoint: rank 0 could not complete the step directory");
    st = DSC_ERR_USER;
  }
  free_paths(ctx, &p);
  return st != DSC_OK ? st : cst;
}

/* ------------------------------------------------------------------ load */

static bool json_int(const cJSON *j, int64_t *out) {
  if (!cJSON_IsNumber(j)) return false;
  double v = j->valuedouble;
  if (!(v >= 0 && v < 9007199254740992.0 && v == floor(v))) return false;
  *out = (int64_t)v;
  return true;
}

/* A decimal integer in [lo, hi] spelled by digits alone (no sign, space or
 * exponent: what the trainer writes). */
static bool dec_in(const char *s, uint64_t lo, uint64_t hi, uint64_t *out) {
  uint64_t v = 0;
  if (!*s || strlen(s) > 20) return false;
  for (const char *p = s; *p; p++) {
    if (*p < '0' || *p > '9' || v > (UINT64_MAX - (uint64_t)(*p - '0')) / 10) return false;
    v = v * 10 + (uint64_t)(*p - '0');
  }
  if (v < lo || v > hi) return false;
  if (out) *out = v;
  return true;
}

/* The values the trainer records in "extra" (driver/train.c,
 * dsc_trainer_save), range-checked: a resumed run would otherwise train
 * with junk or fail later naming no field. Other keys are free-form. */
static const char *check_extra(const cJSON *ex, int64_t step, char *why, size_t n) {
  static const struct {
    const char *key;
    uint64_t lo, hi;
  } ints[] = {
      {"batch", 1, 1ull << 31},      {"seq", 1, 1ull << 31},         {"grad_accum", 1, 1ull << 31},
      {"vocab", 1, 1ull << 31},      {"world", 1, 100000},           {"zero_world", 1, 100000},
      {"zero_stage", 0, 3},          {"steps", 0, (1ull << 53) - 1}, {"save_every", 0, 1ull << 53},
      {"eval_every", 0, 1ull << 53}, {"seed", 0, UINT64_MAX},
  };
  for (const cJSON *x = ex ? ex->child : NULL; x; x = x->next) {
    const char *k = x->string, *v = x->valuestring;
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
      uint64_t got;
      if (strcmp(k, ints[i].key) != 0) continue;
      if (!dec_in(v, ints[i].lo, ints[i].hi, &got)) {
        snprintf(why, n, "\"extra.%s\" is '%.40s', not an integer in [%" PRIu64 ", %" PRIu64 "]", k,
                 v, ints[i].lo, ints[i].hi);
        return why;
      }
      if (strcmp(k, "steps") == 0 && got < (uint64_t)step) {
        snprintf(why, n, "\"step\" %" PRId64 " is past \"extra.steps\" %" PRIu64, step, got);
        return why;
      }
    }
    if (strcmp(k, "lr") == 0) {
      char *end = NULL;
      errno = 0;
      double lr = strtod(v, &end);
      if (!*v || *end || errno || !isfinite(lr) || !(lr >= 0)) {
        snprintf(why, n, "\"extra.lr\" is '%.40s', not a finite number >= 0", v);
        return why;
      }
    }
  }
  return NULL;
}

/* A checkpoint holds finite values only: a NaN or Inf would otherwise load
 * and fail a step later, naming no file. */
static dsc_status check_finite(dsc_context *ctx, const char *path, const dsc_tensor_set *s) {
  for (int i = 0; s && i < s->n; i++) {
    const dsc_tensor *t = s->tensors[i];
    if (!dsc_dtype_is_float(t->type.dtype)) continue;
    int64_t n = dsc_type_numel(&t->type);
    for (int64_t e = 0; e < n; e++)
      if (!isfinite(t->data[e])) {
        ir_error(ctx, rt_loc(path),
                 "tensor '%s': element %" PRId64
                 " is %s (a checkpoint holds "
                 "finite values only)",
                 s->names[i], e, isnan(t->data[e]) ? "NaN" : "infinite");
        return DSC_ERR_USER;
      }
  }
  /* fp16's loss scale divides the gradients */
  const dsc_tensor *ls = dsc_tensor_set_find(s, "opt.loss_scale");
  if (ls && dsc_type_numel(&ls->type) == 1 && !(ls->data[0] > 0)) {
    ir_error(ctx, rt_loc(path), "tensor 'opt.loss_scale' is %g, not a positive number",
             ls->data[0]);
    return DSC_ERR_USER;
  }
  return DSC_OK;
}

static dsc_status read_state(dsc_context *ctx, const char *path, rt_checkpoint *c) {
  dsc_loc loc = rt_loc(path);
  char *text;
  size_t len;
  dsc_status ost = rt_read_small(ctx, path, MAX_STATE_BYTES, &text, &len);
  if (ost != DSC_OK) return ost;
  cJSON *root = cJSON_ParseWithLength(text, len);
  ir_free(ctx, text, len + 1);
  const char *bad = NULL;
  char why[200];
  dsc_checkpoint_state *s = &c->pub.state;
  if (!root || !cJSON_IsObject(root)) {
    bad = "not a JSON object";
  } else {
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(root, "format");
    const cJSON *ver = cJSON_GetObjectItemCaseSensitive(root, "version");
    const cJSON *rng = cJSON_GetObjectItemCaseSensitive(root, "rng");
    const cJSON *ld = cJSON_GetObjectItemCaseSensitive(root, "loader");
    const cJSON *ex = cJSON_GetObjectItemCaseSensitive(root, "extra");
    int64_t v;
    if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, STATE_FORMAT) != 0)
      bad = "\"format\" is not \"" STATE_FORMAT "\"";
    else if (!json_int(ver, &v) || v != STATE_VERSION)
      bad = "unsupported \"version\" (this dsc reads version 1)";
    else if (!json_int(cJSON_GetObjectItemCaseSensitive(root, "step"), &s->step))
      bad = "\"step\" is not a non-negative integer";
    else if (!cJSON_IsArray(rng) || cJSON_GetArraySize(rng) != 4)
      bad = "\"rng\" is not an array of 4 hex strings";
    else if (!cJSON_IsObject(ld) ||
             !json_int(cJSON_GetObjectItemCaseSensitive(ld, "epoch"), &s->loader.epoch) ||
             !json_int(cJSON_GetObjectItemCaseSensitive(ld, "index"), &s->loader.index))
      bad = "\"loader\" is not {\"epoch\": integer, \"index\": integer}";
    else if (ex && !cJSON_IsObject(ex))
      bad = "\"extra\" is not an object";
    int i = 0;
    for (const cJSON *x = rng ? rng->child : NULL; !bad && x; x = x->next, i++) {
      char *end = NULL;
      errno = 0;
      if (!cJSON_IsString(x) || strlen(x->valuestring) != 16 ||
          (s->rng[i] = strtoull(x->valuestring, &end, 16), errno) || *end)
        bad = "\"rng\" is not an array of 4 hex strings";
    }
    if (!bad && !(s->rng[0] | s->rng[1] | s->rng[2] | s->rng[3]))
      bad = "\"rng\" is all zero (xoshiro256** never leaves that state: not a saved RNG)";
    int n = 0;
    for (const cJSON *x = ex ? ex->child : NULL; !bad && x; x = x->next, n++)
      if (!cJSON_IsString(x)) bad = "\"extra\" values must be strings";
    if (!bad) bad = check_extra(ex, s->step, why, sizeof why);
    if (!bad && n > 0) {
      dsc_kv *kv = ir_arena_alloc(&c->arena, sizeof(dsc_kv) * (size_t)n);
      int k = 0;
      for (const cJSON *x = ex->child; kv && x; x = x->next, k++) {
        kv[k].key = ir_arena_strdup(&c->arena, x->string);
        kv[k].value = ir_arena_strdup(&c->arena, x->valuestring);
      }
      s->extra = kv;
      s->n_extra = n;
      if (c->arena.failed) {
        cJSON_Delete(root);
        return oom(ctx, path);
      }
    }
  }
  cJSON_Delete(root);
  if (bad) {
    ir_error(ctx, loc, "malformed checkpoint state: %s", bad);
    return DSC_ERR_USER;
  }
  return DSC_OK;
}

/* The step directory for path, canonical (realpath): path itself when it
 * holds state.json, otherwise what path/latest points to, which must be a
 * directory in path: a run is never read (nor then written and pruned)
 * outside its own directory. Arena-allocated. */
static dsc_status resolve_dir(dsc_context *ctx, const char *path, ir_arena *a, const char **out) {
  char *run = realpath(path, NULL);
  if (!run) return rt_io_error(ctx, path, "cannot open checkpoint");
  char *state = join(ctx, run, "state.json"), *latest = join(ctx, run, "latest");
  dsc_status st = DSC_OK;
  struct stat sb;
  *out = NULL;
  if (!state || !latest) {
    st = oom(ctx, path);
  } else if (stat(state, &sb) == 0) {
    *out = ir_arena_strdup(a, run);
  } else if (lstat(latest, &sb) == 0) {
    char target[4096] = "";
    ssize_t n = S_ISLNK(sb.st_mode) ? readlink(latest, target, sizeof target - 1) : -1;
    if (n >= 0) target[n] = 0;
    char *real = realpath(latest, NULL);
    char *in = real ? rt_parent_dir(ctx, real) : NULL;
    if (!real) {
      ir_error(ctx, rt_loc(latest), "points to '%s', which does not exist", target);
      st = DSC_ERR_USER;
    } else if (!in) {
      st = oom(ctx, path);
    } else if (strcmp(in, run) != 0) {
      ir_error(ctx, rt_loc(latest),
               "points to '%s', outside the run directory %s (dsc resumes, writes and prunes a "
               "run only inside its directory; name the step directory itself to resume it)",
               target, run);
      st = DSC_ERR_USER;
    } else {
      *out = ir_arena_strdup(a, real);
    }
    free_path(ctx, in);
    free(real);
  } else {
    ir_error(ctx, rt_loc(path),
             "not a checkpoint: no state.json here and no 'latest' link to a step directory");
    st = DSC_ERR_USER;
  }
  if (st == DSC_OK && !*out) st = oom(ctx, path);
  free_path(ctx, state);
  free_path(ctx, latest);
  free(run);
  return st;
}

void dsc_checkpoint_free(dsc_context *ctx, dsc_checkpoint *pub) {
  if (!pub) return;
  rt_checkpoint *c = (rt_checkpoint *)pub;
  dsc_tensor_set_free(ctx, pub->model);
  dsc_tensor_set_free(ctx, pub->optimizer);
  ir_arena_release(&c->arena);
  ir_free(ctx, c, sizeof *c);
}

static const char *state_extra(const dsc_checkpoint_state *s, const char *key) {
  for (int i = 0; i < s->n_extra; i++)
    if (strcmp(s->extra[i].key, key) == 0) return s->extra[i].value;
  return NULL;
}

/* Parses "d0xd1x..." (or "scalar") into t's dims: positive decimal dims
 * whose product fits int64 (a shape from a file becomes an allocation). */
static bool parse_dims(const char *s, dsc_type *t) {
  t->rank = 0;
  if (strcmp(s, "scalar") == 0) return true;
  for (;;) {
    char *end;
    errno = 0;
    long long d = *s >= '0' && *s <= '9' ? strtoll(s, &end, 10) : 0;
    if (d < 1 || errno || t->rank == DSC_MAX_RANK) return false;
    t->dims[t->rank++] = d;
    if (!*end) break;
    if (*end != 'x') return false;
    s = end + 1;
  }
  int64_t n;
  return dsc_type_numel_checked(t, &n);
}

/* ZeRO checkpoints: the full tensors from every rank's shard file, added to
 * the model or optimizer set. */
static dsc_status assemble_shards(dsc_context *ctx, dsc_checkpoint *c) {
  const char *w = state_extra(&c->state, "zero_world");
  if (!w) return DSC_OK;
  char *end;
  long long world = strtoll(w, &end, 10);
  if (*end || world < 1 || world > 100000) {
    ir_error(ctx, rt_loc(c->dir), "malformed checkpoint state: \"zero_world\" is '%s'", w);
    return DSC_ERR_USER;
  }
  dsc_tensor_set **sh = ir_alloc(ctx, sizeof(dsc_tensor_set *) * (size_t)world);
  if (!sh) return oom(ctx, c->dir);
  memset(sh, 0, sizeof(dsc_tensor_set *) * (size_t)world);
  dsc_status st = DSC_OK;
  char *first = NULL;
  for (long long r = 0; r < world && st == DSC_OK; r++) {
    char file[64];
    snprintf(file, sizeof file, "shard-%05lld-of-%05lld.safetensors", r, world);
    char *p = join(ctx, c->dir, file);
    if (!p) {
      st = oom(ctx, c->dir);
      break;
    }
    struct stat sb;
    if (stat(p, &sb) != 0) {
      ir_error(ctx, rt_loc(p), "checkpoint file is missing (the checkpoint has %lld shards)", world);
      st = DSC_ERR_USER;
    } else {
      st = dsc_safetensors_read(ctx, p, &sh[r]);
      if (st == DSC_OK) st = check_finite(ctx, p, sh[r]);
    }
    if (r == 0) first = p;
    else free_path(ctx, p);
  }
  for (int i = 0; st == DSC_OK && i < sh[0]->n; i++) {
    if ((st = ir_check_interrupt(ctx, "loading %s", c->dir)) != DSC_OK) break;
    const char *name = sh[0]->names[i];
    char key[300];
    snprintf(key, sizeof key, "full.%s", name);
    const char *dims = dsc_tensor_set_meta(sh[0], key);
    snprintf(key, sizeof key, "set.%s", name);
    const char *set = dsc_tensor_set_meta(sh[0], key);
    dsc_type full = sh[0]->tensors[i]->type;
    int64_t s = dsc_type_numel(&full), n_full = 0;
    if (dims && !parse_dims(dims, &full)) {
      ir_error(ctx, rt_loc(first),
               "malformed shard metadata: \"full.%s\" is '%.60s', not a shape d0xd1x... of "
               "positive dims whose element count fits 64 bits",
               name, dims);
      st = DSC_ERR_USER;
      break;
    }
    n_full = dims ? dsc_type_numel(&full) : 0;
    if (!dims || !set || sh[0]->tensors[i]->type.rank != 1 ||
        (strcmp(set, "model") != 0 && strcmp(set, "optimizer") != 0) || s > INT64_MAX / world ||
        n_full > s * world || n_full <= s * (world - 1)) {
      ir_error(ctx, rt_loc(first), "malformed shard '%s': its full shape or set is missing or "
               "does not fit %lld chunks", name, world);
      st = DSC_ERR_USER;
      break;
    }
    dsc_tensor *t = dsc_tensor_new(ctx, full);
    if (!t) {
      st = oom(ctx, c->dir);
      break;
    }
    int64_t n = dsc_type_numel(&full);
    for (long long r = 0; r < world && st == DSC_OK; r++) {
      const dsc_tensor *chunk = dsc_tensor_set_find(sh[r], name);
      if (!chunk || chunk->type.rank != 1 || chunk->type.dims[0] != s ||
          chunk->type.dtype != full.dtype) {
        ir_error(ctx, rt_loc(c->dir), "shard %lld of %lld lacks '%s' as %s[%lld]", r, world, name,
                 dsc_dtype_name(full.dtype), (long long)s);
        st = DSC_ERR_USER;
        break;
      }
      int64_t off = r * s, k = off >= n ? 0 : n - off < s ? n - off : s;
      if (k > 0) memcpy(t->data + off, chunk->data, sizeof(double) * (size_t)k);
    }
    dsc_tensor_set *dst = strcmp(set, "model") == 0 ? c->model : c->optimizer;
    if (st != DSC_OK || dsc_tensor_set_find(dst, name) || !rt_tensor_set_append(dst, name, t)) {
      if (st == DSC_OK) {
        ir_error(ctx, rt_loc(c->dir), "checkpoint: '%s' is both whole and sharded, or out of memory",
                 name);
        st = DSC_ERR_USER;
      }
      dsc_tensor_free(ctx, t);
    }
  }
  for (long long r = 0; r < world; r++) dsc_tensor_set_free(ctx, sh[r]);
  free_path(ctx, first);
  ir_free(ctx, sh, sizeof(dsc_tensor_set *) * (size_t)world);
  return st;
}

dsc_status dsc_checkpoint_load(dsc_context *ctx, const char *path,
                               const dsc_tensor_spec *model_spec, int n_model,
                               const dsc_tensor_spec *optimizer_spec, int n_optimizer,
                               dsc_checkpoint **out) {
  *out = NULL;
  rt_checkpoint *c = ir_alloc(ctx, sizeof *c);
  if (!c) return oom(ctx, path);
  memset(c, 0, sizeof *c);
  ir_arena_init(&c->arena, ctx);
  dsc_status st = resolve_dir(ctx, path, &c->arena, &c->pub.dir);
  char *files[3] = {NULL, NULL, NULL};
  if (st == DSC_OK) {
    files[0] = join(ctx, c->pub.dir, "model.safetensors");
    files[1] = join(ctx, c->pub.dir, "optimizer.safetensors");
    files[2] = join(ctx, c->pub.dir, "state.json");
    if (!files[0] || !files[1] || !files[2]) st = oom(ctx, path);
  }
  /* Report every missing file at once, before reading any. */
  bool checked = st == DSC_OK;
  for (int i = 0; checked && i < 3; i++) {
    struct stat sb;
    if (stat(files[i], &sb) != 0) {
      ir_error(ctx, rt_loc(files[i]), "checkpoint file is missing");
      st = DSC_ERR_USER;
    }
  }
  if (st == DSC_OK) st = read_state(ctx, files[2], c);
  if (st == DSC_OK) st = dsc_safetensors_read(ctx, files[0], &c->pub.model);
  if (st == DSC_OK) st = check_finite(ctx, files[0], c->pub.model);
  if (st == DSC_OK) st = dsc_safetensors_read(ctx, files[1], &c->pub.optimizer);
  if (st == DSC_OK) st = check_finite(ctx, files[1], c->pub.optimizer);
  if (st == DSC_OK) st = assemble_shards(ctx, &c->pub);
  if (st == DSC_OK && model_spec)
    st = dsc_tensor_set_check(ctx, files[0], c->pub.model, model_spec, n_model);
  if (st == DSC_OK && optimizer_spec)
    st = dsc_tensor_set_check(ctx, files[1], c->pub.optimizer, optimizer_spec, n_optimizer);
  for (int i = 0; i < 3; i++) free_path(ctx, files[i]);
  if (st != DSC_OK) {
    dsc_checkpoint_free(ctx, &c->pub);
    return st;
  }
  *out = &c->pub;
  return DSC_OK;
}

const char *dsc_checkpoint_extra(const dsc_checkpoint *c, const char *key) {
  for (int i = 0; c && i < c->state.n_extra; i++)
    if (strcmp(c->state.extra[i].key, key) == 0) return c->state.extra[i].value;
  return NULL;
}

dsc_status dsc_checkpoint_use_master_weights(dsc_context *ctx, dsc_checkpoint *c, int *n_replaced) {
  int n = 0;
  for (int i = 0; c && c->model && c->optimizer && i < c->model->n; i++) {
    char name[1024];
    snprintf(name, sizeof name, "opt.master.%s", c->model->names[i]);
    const dsc_tensor *m = dsc_tensor_set_find(c->optimizer, name);
    dsc_tensor *p = c->model->tensors[i];
    if (!m) continue;
    dsc_type want = p->type;
    want.dtype = m->type.dtype;
    if (!dsc_type_equal(&want, &m->type)) {
      char a[96], b[96];
      dsc_type_format(&p->type, a, sizeof a);
      dsc_type_format(&m->type, b, sizeof b);
      ir_error(ctx, rt_loc(c->dir), "master weights '%s' are %s, the param '%s' is %s", name, b,
               c->model->names[i], a);
      return DSC_ERR_USER;
    }
    dsc_tensor *copy = dsc_tensor_new(ctx, m->type);
    if (!copy) {
      ir_error(ctx, rt_loc(c->dir), "out of memory copying '%s'", name);
      return DSC_ERR_INTERNAL;
    }
    memcpy(copy->data, m->data, sizeof(double) * (size_t)dsc_type_numel(&m->type));
    dsc_tensor_free(ctx, p);
    c->model->tensors[i] = copy;
    n++;
  }
  if (n_replaced) *n_replaced = n;
  return DSC_OK;
}
