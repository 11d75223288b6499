/* safetensors files, byte-for-byte as the Python package (Rust core,
 * safetensors/src/tensor.rs) writes them:
 *   u64 little-endian N | N bytes of compact JSON, padded with spaces to a
 *   multiple of 8 | the tensors' little-endian bytes, back to back.
 * The JSON object holds "__metadata__" (string -> string) first, then one
 * {"dtype","shape","data_offsets":[begin,end]} per tensor, in data order:
 * tensors sorted by dtype (the Rust enum's order, largest first, which puts
 * 8-byte types before 4-byte ones ...) then by name. The reader checks
 * everything the package checks (offsets contiguous from 0 to the end of
 * the file, sizes matching shapes), with messages naming file and tensor. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/runtime.h"

#define MAX_HEADER (100u * 1000u * 1000u) /* the Python package's own limit */
#define MAX_EXACT 9007199254740992.0      /* 2^53: integers JSON numbers hold exactly */

/* ------------------------------------------------------------ dtypes */

static const struct {
  const char *name;
  int rust_rank; /* position in the Rust Dtype enum: BOOL < F16 < BF16 < I32 < F32 < F64 < I64 */
} st_dtypes[DSC_DTYPE_COUNT] = {
    [DSC_F32] = {"F32", 4},   [DSC_F64] = {"F64", 5}, [DSC_BF16] = {"BF16", 2},
    [DSC_F16] = {"F16", 1},   [DSC_I32] = {"I32", 3}, [DSC_I64] = {"I64", 6},
    [DSC_BOOL] = {"BOOL", 0},
};

const char *rt_st_dtype_name(dsc_dtype dt) {
  return (unsigned)dt < DSC_DTYPE_COUNT ? st_dtypes[dt].name : "?";
}

bool rt_st_dtype_from_name(const char *name, dsc_dtype *out) {
  for (int i = 0; i < DSC_DTYPE_COUNT; i++)
    if (strcmp(st_dtypes[i].name, name) == 0) {
      *out = (dsc_dtype)i;
      return true;
    }
  return false;
}

/* ------------------------------------------------------------ tensor sets */

rt_tensor_set *rt_tensor_set_new(dsc_context *ctx, int n, int n_meta) {
  rt_tensor_set *s = ir_alloc(ctx, sizeof *s);
  if (!s) return NULL;
  memset(s, 0, sizeof *s);
  ir_arena_init(&s->arena, ctx);
  s->pub.names = ir_arena_alloc(&s->arena, sizeof(char *) * (size_t)(n > 0 ? n : 1));
  s->pub.tensors = ir_arena_alloc(&s->arena, sizeof(dsc_tensor *) * (size_t)(n > 0 ? n : 1));
  s->pub.meta = ir_arena_alloc(&s->arena, sizeof(dsc_kv) * (size_t)(n_meta > 0 ? n_meta : 1));
  s->cap = n > 0 ? n : 1;
  if (s->arena.failed) {
    ir_arena_release(&s->arena);
    ir_free(ctx, s, sizeof *s);
    return NULL;
  }
  return s;
}

/* The arrays double when full (the arena keeps the old ones), so n appends
 * cost O(n) time and memory, not O(n^2). */
bool rt_tensor_set_append(dsc_tensor_set *pub, const char *name, dsc_tensor *t) {
  rt_tensor_set *s = (rt_tensor_set *)pub;
  const char *copy = ir_arena_strdup(&s->arena, name);
  if (!copy || pub->n == INT32_MAX) return false;
  if (pub->n >= s->cap) {
    int cap = s->cap > INT32_MAX / 2 ? INT32_MAX : (s->cap > 0 ? s->cap * 2 : 4);
    const char **names = ir_arena_alloc(&s->arena, sizeof(char *) * (size_t)cap);
    dsc_tensor **ts = ir_arena_alloc(&s->arena, sizeof(dsc_tensor *) * (size_t)cap);
    if (!names || !ts) return false;
    if (pub->n) {
      memcpy(names, pub->names, sizeof(char *) * (size_t)pub->n);
      memcpy(ts, pub->tensors, sizeof(dsc_tensor *) * (size_t)pub->n);
    }
    pub->names = names, pub->tensors = ts, s->cap = cap;
  }
  pub->names[pub->n] = copy, pub->tensors[pub->n] = t;
  pub->n++;
  return true;
}

void dsc_tensor_set_free(dsc_context *ctx, dsc_tensor_set *pub) {
  if (!pub) return;
  rt_tensor_set *s = (rt_tensor_set *)pub;
  for (int i = 0; i < pub->n; i++) dsc_tensor_free(ctx, pub->tensors[i]);
  ir_arena_release(&s->arena);
  ir_free(ctx, s, sizeof *s);
}

dsc_tensor *dsc_tensor_set_find(const dsc_tensor_set *s, const char *name) {
  for (int i = 0; s && i < s->n; i++)
    if (strcmp(s->names[i], name) == 0) return s->tensors[i];
  return NULL;
}

const char *dsc_tensor_set_meta(const dsc_tensor_set *s, const char *key) {
  for (int i = 0; s && i < s->n_meta; i++)
    if (strcmp(s->meta[i].key, key) == 0) return s->meta[i].value;
  return NULL;
}

/* Name-sorted views for O(n log n) lookups (sets may hold 10^5 tensors). */
typedef struct {
  const char *name;
  int idx;
} name_ref;

static int cmp_name_ref(const void *a, const void *b) {
  const name_ref *x = a, *y = b;
  int c = strcmp(x->name, y->name);
  return c ? c : (x->idx > y->idx) - (x->idx < y->idx);
}

/* refs[0..n) = names sorted; NULL when out of memory. Free with free_refs. */
static name_ref *sorted_refs(dsc_context *ctx, const char *const *names, size_t stride, int n) {
  name_ref *r = ir_alloc(ctx, sizeof *r * (size_t)(n > 0 ? n : 1));
  if (!r) return NULL;
  for (int i = 0; i < n; i++)
    r[i] = (name_ref){*(const char *const *)((const char *)names + stride * (size_t)i), i};
  if (n > 1) qsort(r, (size_t)n, sizeof *r, cmp_name_ref);
  return r;
}
static void free_refs(dsc_context *ctx, name_ref *r, int n) {
  if (r) ir_free(ctx, r, sizeof *r * (size_t)(n > 0 ? n : 1));
}
/* The first entry named name, or -1. */
static int find_ref(const name_ref *r, int n, const char *name) {
  int lo = 0, hi = n;
  while (lo < hi) {
    int mid = lo + (hi - lo) / 2;
    if (strcmp(r[mid].name, name) < 0)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo < n && strcmp(r[lo].name, name) == 0 ? r[lo].idx : -1;
}
/* The first name that appears twice in sorted refs, or NULL. */
static const char *first_duplicate(const name_ref *r, int n) {
  for (int i = 1; i < n; i++)
    if (strcmp(r[i - 1].name, r[i].name) == 0) return r[i].name;
  return NULL;
}

dsc_status dsc_tensor_set_check(dsc_context *ctx, const char *path, const dsc_tensor_set *s,
                                const dsc_tensor_spec *expected, int n_expected) {
  dsc_status st = DSC_OK;
  char want[96], got[96];
  name_ref *have = sorted_refs(ctx, s->names, sizeof *s->names, s->n);
  name_ref *exp = sorted_refs(ctx, &expected[0].name, sizeof *expected, n_expected);
  if (!have || !exp) {
    free_refs(ctx, have, s->n);
    free_refs(ctx, exp, n_expected);
    ir_error(ctx, rt_loc(path), "out of memory");
    return DSC_ERR_INTERNAL;
  }
  for (int i = 0; i < n_expected; i++) {
    dsc_type_format(&expected[i].type, want, sizeof want);
    int at = find_ref(have, s->n, expected[i].name);
    const dsc_tensor *t = at >= 0 ? s->tensors[at] : NULL;
    if (!t) {
      ir_error(ctx, rt_loc(path), "tensor '%s' is missing (expected %s)", expected[i].name, want);
      st = DSC_ERR_USER;
    } else if (!dsc_type_equal(&t->type, &expected[i].type)) {
      dsc_type_format(&t->type, got, sizeof got);
      ir_error(ctx, rt_loc(path), "tensor '%s': expected %s, found %s", expected[i].name, want,
               got);
      st = DSC_ERR_USER;
    }
  }
  for (int i = 0; i < s->n; i++)
    if (find_ref(exp, n_expected, s->names[i]) < 0) {
      ir_error(ctx, rt_loc(path), "unexpected tensor '%s'", s->names[i]);
      st = DSC_ERR_USER;
    }
  free_refs(ctx, have, s->n);
  free_refs(ctx, exp, n_expected);
  return st;
}

bool rt_tensor_set_lookup(dsc_context *ctx, const dsc_tensor_set *s, const char *const *names,
                          int n, int *at) {
  name_ref *have = sorted_refs(ctx, s->names, sizeof *s->names, s->n);
  if (!have) return false;
  for (int i = 0; i < n; i++) at[i] = find_ref(have, s->n, names[i]);
  free_refs(ctx, have, s->n);
  return true;
}

/* ------------------------------------------------------------ writer */

typedef struct {
  dsc_context *ctx;
  char *p;
  size_t len, cap;
  bool failed;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n) {
  if (b->failed) return;
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + n + 1) cap *= 2;
    char *p = ir_realloc(b->ctx, b->p, b->cap, cap);
    if (!p) {
      b->failed = true;
      return;
    }
    b->p = p;
    b->cap = cap;
  }
  memcpy(b->p + b->len, s, n);
  b->len += n;
  b->p[b->len] = 0;
}
static void sb_str(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }
static void sb_u64(sbuf *b, uint64_t v) {
  char t[32];
  sb_put(b, t, (size_t)snprintf(t, sizeof t, "%" PRIu64, v));
}
/* A JSON string escaped as serde_json does (so headers match the package's). */
static void sb_json_str(sbuf *b, const char *s) {
  sb_put(b, "\"", 1);
  for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
    char e[8];
    switch (*c) {
      case '"':
        sb_str(b, "\\\"");
        break;
      case '\\':
        sb_str(b, "\\\\");
        break;
      case '\b':
        sb_str(b, "\\b");
        break;
      case '\f':
        sb_str(b, "\\f");
        break;
      case '\n':
        sb_str(b, "\\n");
        break;
      case '\r':
        sb_str(b, "\\r");
        break;
      case '\t':
        sb_str(b, "\\t");
        break;
      default:
        if (*c < 0x20) {
          snprintf(e, sizeof e, "\\u%04x", *c);
          sb_str(b, e);
        } else {
          sb_put(b, (const char *)c, 1);
        }
    }
  }
  sb_put(b, "\"", 1);
}

/* Data order: the Rust dtype rank (largest first), then the name. The
 * sort key carries what the comparison needs (qsort_r is not ISO C). */
typedef struct {
  int rank;
  const char *name;
  int idx;
} order_key;

static int cmp_order(const void *pa, const void *pb) {
  const order_key *a = pa, *b = pb;
  if (a->rank != b->rank) return b->rank - a->rank;
  return strcmp(a->name, b->name);
}

static bool sort_indices(dsc_context *ctx, int *idx, int n, const dsc_tensor_set *s) {
  order_key *k = ir_alloc(ctx, sizeof *k * (size_t)(n > 0 ? n : 1));
  if (!k) return false;
  for (int i = 0; i < n; i++)
    k[i] = (order_key){st_dtypes[s->tensors[i]->type.dtype].rust_rank, s->names[i], i};
  if (n > 1) qsort(k, (size_t)n, sizeof *k, cmp_order);
  for (int i = 0; i < n; i++) idx[i] = k[i].idx;
  ir_free(ctx, k, sizeof *k * (size_t)(n > 0 ? n : 1));
  return true;
}

/* Bytes of a tensor of type t; false when the shape is malformed or the
 * count overflows (shapes come from files: see dsc_type_numel_checked). */
static bool tensor_nbytes(const dsc_type *t, uint64_t *out) {
  int64_t n;
  uint64_t es = dsc_dtype_size(t->dtype);
  if (!es || !dsc_type_numel_checked(t, &n) || (uint64_t)n > UINT64_MAX / es) return false;
  *out = (uint64_t)n * es;
  return true;
}

/* Encodes element v of a dtype into out (little-endian); false if v does
 * not fit an integer dtype. */
static bool encode(dsc_dtype dt, double v, unsigned char *out) {
  uint64_t u = 0;
  int size = (int)dsc_dtype_size(dt);
  switch (dt) {
    case DSC_F32: {
      float f = (float)v;
      uint32_t w;
      memcpy(&w, &f, 4);
      u = w;
      break;
    }
    case DSC_F64:
      memcpy(&u, &v, 8);
      break;
    case DSC_BF16:
      u = ir_bf16_bits(v);
      break;
    case DSC_F16:
      u = ir_f16_bits(v);
      break;
    case DSC_I32:
      if (!(v == trunc(v) && v >= -2147483648.0 && v <= 2147483647.0)) return false;
      u = (uint32_t)(int32_t)v;
      break;
    case DSC_I64:
      if (!(v == trunc(v) && v >= -9223372036854775808.0 && v < 9223372036854775808.0))
        return false;
      u = (uint64_t)(int64_t)v;
      break;
    case DSC_BOOL:
      u = v != 0;
      break;
    default:
      return false;
  }
  for (int i = 0; i < size; i++) out[i] = (unsigned char)(u >> (8 * i));
  return true;
}

static dsc_status check_set(dsc_context *ctx, const char *path, const dsc_tensor_set *s) {
  dsc_loc loc = rt_loc(path);
  if (s->n < 0 || s->n_meta < 0 || (s->n && (!s->names || !s->tensors)) ||
      (s->n_meta && !s->meta)) {
    ir_error(ctx, loc, "malformed tensor set");
    return DSC_ERR_USER;
  }
  for (int i = 0; i < s->n; i++) {
    const char *name = s->names[i];
    const dsc_tensor *t = s->tensors[i];
    if (!name || !*name) {
      ir_error(ctx, loc, "tensor %d has no name", i);
      return DSC_ERR_USER;
    }
    if (strcmp(name, "__metadata__") == 0) {
      ir_error(ctx, loc, "'__metadata__' is reserved and cannot name a tensor");
      return DSC_ERR_USER;
    }
    uint64_t nb = 0;
    if (!t || (unsigned)t->type.dtype >= DSC_DTYPE_COUNT || t->type.rank < 0 ||
        t->type.rank > DSC_MAX_RANK || !tensor_nbytes(&t->type, &nb)) {
      ir_error(ctx, loc, "tensor '%s' is missing or has a malformed type", name);
      return DSC_ERR_USER;
    }
  }
  name_ref *r = sorted_refs(ctx, s->names, sizeof *s->names, s->n);
  if (!r) {
    ir_error(ctx, loc, "out of memory");
    return DSC_ERR_INTERNAL;
  }
  const char *dup = first_duplicate(r, s->n);
  if (dup) ir_error(ctx, loc, "tensor '%s' appears twice", dup);
  free_refs(ctx, r, s->n);
  if (dup) return DSC_ERR_USER;
  for (int i = 0; i < s->n_meta; i++)
    if (!s->meta[i].key || !s->meta[i].value) {
      ir_error(ctx, loc, "metadata entry %d has no key or value", i);
      return DSC_ERR_USER;
    }
  return DSC_OK;
}

dsc_status dsc_safetensors_write(dsc_context *ctx, const char *path, const dsc_tensor_set *s) {
  dsc_status st = check_set(ctx, path, s);
  if (st != DSC_OK) return st;
  int *idx = ir_alloc(ctx, sizeof(int) * (size_t)(s->n > 0 ? s->n : 1));
  sbuf h = {ctx, NULL, 0, 0, false};
  if (!idx) {
    ir_error(ctx, rt_loc(path), "out of memory");
    return DSC_ERR_INTERNAL;
  }
  if (!sort_indices(ctx, idx, s->n, s)) {
    ir_free(ctx, idx, sizeof(int) * (size_t)(s->n > 0 ? s->n : 1));
    ir_error(ctx, rt_loc(path), "out of memory");
    return DSC_ERR_INTERNAL;
  }

  sb_str(&h, "{");
  bool first = true;
  if (s->n_meta > 0) {
    sb_str(&h, "\"__metadata__\":{");
    for (int i = 0; i < s->n_meta; i++) {
      if (i) sb_str(&h, ",");
      sb_json_str(&h, s->meta[i].key);
      sb_str(&h, ":");
      sb_json_str(&h, s->meta[i].value);
    }
    sb_str(&h, "}");
    first = false;
  }
  uint64_t offset = 0;
  for (int k = 0; k < s->n; k++) {
    const dsc_tensor *t = s->tensors[idx[k]];
    uint64_t nb = 0;
    tensor_nbytes(&t->type, &nb);
    if (!first) sb_str(&h, ",");
    first = false;
    sb_json_str(&h, s->names[idx[k]]);
    sb_str(&h, ":{\"dtype\":\"");
    sb_str(&h, rt_st_dtype_name(t->type.dtype));
    sb_str(&h, "\",\"shape\":[");
    for (int d = 0; d < t->type.rank; d++) {
      if (d) sb_str(&h, ",");
      sb_u64(&h, (uint64_t)t->type.dims[d]);
    }
    sb_str(&h, "],\"data_offsets\":[");
    sb_u64(&h, offset);
    sb_str(&h, ",");
    sb_u64(&h, offset + nb);
    sb_str(&h, "]}");
    offset += nb;
  }
  sb_str(&h, "}");
  while (!h.failed && h.len % 8) sb_str(&h, " ");
  if (h.failed) {
    ir_free(ctx, idx, sizeof(int) * (size_t)(s->n > 0 ? s->n : 1));
    if (h.p) ir_free(ctx, h.p, h.cap);
    ir_error(ctx, rt_loc(path), "out of memory");
    return DSC_ERR_INTERNAL;
  }

  rt_atomic_file f;
  st = rt_atomic_open(ctx, path, &f);
  if (st == DSC_OK) {
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)h.len >> (8 * i));
    rt_atomic_write(&f, len8, 8);
    rt_atomic_write(&f, h.p, h.len);
    unsigned char buf[1 << 15];
    for (int k = 0; k < s->n && !f.failed; k++) {
      const dsc_tensor *t = s->tensors[idx[k]];
      size_t es = dsc_dtype_size(t->type.dtype), used = 0;
      int64_t n = dsc_type_numel(&t->type);
      for (int64_t e = 0; e < n && !f.failed; e++) {
        if (!encode(t->type.dtype, t->data[e], buf + used)) {
          ir_error(ctx, rt_loc(path), "tensor '%s': element %" PRId64 " (%g) does not fit %s",
                   s->names[idx[k]], e, t->data[e], rt_st_dtype_name(t->type.dtype));
          f.failed = true;
          break;
        }
        used += es;
        if (used + 8 > sizeof buf) {
          rt_atomic_write(&f, buf, used);
          used = 0;
        }
      }
      if (used) rt_atomic_write(&f, buf, used);
    }
    st = rt_atomic_commit(&f);
  }
  ir_free(ctx, idx, sizeof(int) * (size_t)(s->n > 0 ? s->n : 1));
  ir_free(ctx, h.p, h.cap);
  return st;
}

/* ------------------------------------------------------------ reader */

typedef struct {
  const char *name;
  dsc_type type;
  uint64_t begin, end;
} st_entry;

/* A JSON number that is an exact non-negative integer below 2^53. */
static bool json_u64(const cJSON *j, uint64_t *out) {
  if (!cJSON_IsNumber(j)) return false;
  double v = j->valuedouble;
  if (!(v >= 0 && v < MAX_EXACT && v == floor(v))) return false;
  *out = (uint64_t)v;
  return true;
}

static dsc_status parse_entry(dsc_context *ctx, const char *path, const cJSON *j, st_entry *e) {
  dsc_loc loc = rt_loc(path);
  const char *name = j->string;
  if (!cJSON_IsObject(j)) {
    ir_error(ctx, loc, "tensor '%s': entry is not a JSON object", name);
    return DSC_ERR_USER;
  }
  const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(j, "dtype");
  const cJSON *shape = cJSON_GetObjectItemCaseSensitive(j, "shape");
  const cJSON *offs = cJSON_GetObjectItemCaseSensitive(j, "data_offsets");
  const char *missing = !dtype ? "dtype" : !shape ? "shape" : !offs ? "data_offsets" : NULL;
  if (missing) {
    ir_error(ctx, loc, "tensor '%s': entry has no \"%s\"", name, missing);
    return DSC_ERR_USER;
  }
  if (!cJSON_IsString(dtype)) {
    ir_error(ctx, loc, "tensor '%s': \"dtype\" is not a string", name);
    return DSC_ERR_USER;
  }
  if (!rt_st_dtype_from_name(dtype->valuestring, &e->type.dtype)) {
    ir_error(ctx, loc,
             "tensor '%s': unsupported dtype '%s' (dsc reads F32 F64 BF16 F16 I32 I64 BOOL)", name,
             dtype->valuestring);
    return DSC_ERR_USER;
  }
  if (!cJSON_IsArray(shape)) {
    ir_error(ctx, loc, "tensor '%s': \"shape\" is not an array", name);
    return DSC_ERR_USER;
  }
  int rank = cJSON_GetArraySize(shape);
  if (rank > DSC_MAX_RANK) {
    ir_error(ctx, loc, "tensor '%s': rank %d exceeds dsc's maximum of %d", name, rank,
             DSC_MAX_RANK);
    return DSC_ERR_USER;
  }
  e->type.rank = rank;
  int d = 0;
  for (const cJSON *x = shape->child; x; x = x->next, d++) {
    uint64_t v;
    if (!json_u64(x, &v)) {
      ir_error(ctx, loc, "tensor '%s': shape entry %d is not a non-negative integer", name, d);
      return DSC_ERR_USER;
    }
    e->type.dims[d] = (int64_t)v;
  }
  if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2 || !json_u64(offs->child, &e->begin) ||
      !json_u64(offs->child->next, &e->end) || e->end < e->begin) {
    ir_error(ctx, loc, "tensor '%s': \"data_offsets\" is not [begin, end] with 0 <= begin <= end",
             name);
    return DSC_ERR_USER;
  }
  uint64_t nb = 0;
  char ty[96];
  dsc_type_format(&e->type, ty, sizeof ty);
  if (!tensor_nbytes(&e->type, &nb)) {
    ir_error(ctx, loc, "tensor '%s': shape %s has too many elements (the count overflows 64 bits)",
             name, ty);
    return DSC_ERR_USER;
  }
  if (nb != e->end - e->begin) {
    ir_error(ctx, loc,
             "tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] hold %" PRIu64
             " bytes but %s %s needs %" PRIu64,
             name, e->begin, e->end, e->end - e->begin, dtype->valuestring, ty, nb);
    return DSC_ERR_USER;
  }
  e->name = name;
  return DSC_OK;
}

static double decode(dsc_dtype dt, const unsigned char *p) {
  int size = (int)dsc_dtype_size(dt);
  uint64_t u = 0;
  for (int i = 0; i < size; i++) u |= (uint64_t)p[i] << (8 * i);
  switch (dt) {
    case DSC_F32: {
      uint32_t w = (uint32_t)u;
      float f;
      memcpy(&f, &w, 4);
      return f;
    }
    case DSC_F64: {
      double v;
      memcpy(&v, &u, 8);
      return v;
    }
    case DSC_BF16:
      return ir_bf16_value((uint16_t)u);
    case DSC_F16:
      return ir_f16_value((uint16_t)u);
    case DSC_I32:
      return (double)(int32_t)(uint32_t)u;
    case DSC_I64:
      return (double)(int64_t)u;
    case DSC_BOOL:
      return u != 0;
    default:
      return 0;
  }
}

static int cmp_begin(const void *a, const void *b) {
  const st_entry *x = *(const st_entry *const *)a, *y = *(const st_entry *const *)b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  return x->end < y->end ? -1 : x->end > y->end;
}

/* Parses and validates the header; fills entries/meta of a new set. */
static dsc_status read_header(dsc_context *ctx, const char *path, const char *text, size_t len,
                              uint64_t data_size, rt_tensor_set **out, st_entry **entries_out,
                              int *n_out) {
  dsc_loc loc = rt_loc(path);
  const char *end = NULL;
  cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
  if (!root) {
    ir_error(ctx, loc, "header is not valid JSON (error near header byte %td)",
             end && end >= text ? end - text : (ptrdiff_t)0);
    return DSC_ERR_USER;
  }
  for (const char *p = end; p && p < text + len; p++)
    if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
      ir_error(ctx, loc, "header has bytes after its JSON object (at header byte %td)", p - text);
      cJSON_Delete(root);
      return DSC_ERR_USER;
    }
  if (!cJSON_IsObject(root)) {
    ir_error(ctx, loc, "header is not a JSON object");
    cJSON_Delete(root);
    return DSC_ERR_USER;
  }
  int n = 0, n_meta = 0;
  const cJSON *meta = NULL;
  for (const cJSON *j = root->child; j; j = j->next) {
    if (strcmp(j->string, "__metadata__") == 0) {
      if (meta) {
        ir_error(ctx, loc, "header has \"__metadata__\" twice");
        cJSON_Delete(root);
        return DSC_ERR_USER;
      }
      meta = j;
      if (!cJSON_IsObject(meta)) {
        ir_error(ctx, loc, "\"__metadata__\" is not a JSON object");
        cJSON_Delete(root);
        return DSC_ERR_USER;
      }
      for (const cJSON *m = meta->child; m; m = m->next, n_meta++)
        if (!cJSON_IsString(m)) {
          ir_error(ctx, loc, "\"__metadata__\" entry '%s' is not a string", m->string);
          cJSON_Delete(root);
          return DSC_ERR_USER;
        }
    } else {
      n++;
    }
  }
  rt_tensor_set *s = rt_tensor_set_new(ctx, n, n_meta);
  st_entry *ents = ir_alloc(ctx, sizeof(st_entry) * (size_t)(n > 0 ? n : 1));
  st_entry **sorted = ir_alloc(ctx, sizeof(st_entry *) * (size_t)(n > 0 ? n : 1));
  dsc_status st = DSC_OK;
  if (!s || !ents || !sorted) {
    ir_error(ctx, loc, "out of memory");
    st = DSC_ERR_INTERNAL;
  }
  int i = 0;
  for (const cJSON *j = root->child; st == DSC_OK && j; j = j->next) {
    if (j == meta) continue;
    if ((st = ir_check_interrupt(ctx, "reading %s", path)) != DSC_OK) break;
    memset(&ents[i], 0, sizeof ents[i]);
    st = parse_entry(ctx, path, j, &ents[i]);
    if (st != DSC_OK) break;
    if (ents[i].end > data_size) {
      ir_error(ctx, loc,
               "tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64
               "] run past the end of the "
               "data (%" PRIu64 " bytes)",
               ents[i].name, ents[i].begin, ents[i].end, data_size);
      st = DSC_ERR_USER;
    }
    sorted[i] = &ents[i];
    i++;
  }
  if (st == DSC_OK) { /* names: sorted, so that 10^5 tensors take milliseconds */
    name_ref *r = sorted_refs(ctx, &ents[0].name, sizeof *ents, n);
    const char *dup = r ? first_duplicate(r, n) : NULL;
    if (!r) {
      ir_error(ctx, loc, "out of memory");
      st = DSC_ERR_INTERNAL;
    } else if (dup) {
      ir_error(ctx, loc, "tensor '%s' appears twice in the header", dup);
      st = DSC_ERR_USER;
    }
    free_refs(ctx, r, n);
  }
  if (st == DSC_OK) {
    qsort(sorted, (size_t)n, sizeof *sorted, cmp_begin);
    uint64_t at = 0;
    const char *prev = NULL;
    for (int k = 0; k < n && st == DSC_OK; k++) {
      const st_entry *e = sorted[k];
      if (e->begin < at) {
        ir_error(ctx, loc,
                 "tensors '%s' and '%s' overlap (data bytes %" PRIu64 " to %" PRIu64 " are shared)",
                 prev, e->name, e->begin, at < e->end ? at : e->end);
        st = DSC_ERR_USER;
      } else if (e->begin > at) {
        if (prev)
          ir_error(ctx, loc,
                   "hole between tensors '%s' and '%s' (data bytes %" PRIu64 " to %" PRIu64
                   " belong to no tensor)",
                   prev, e->name, at, e->begin);
        else
          ir_error(ctx, loc,
                   "hole before tensor '%s' (data bytes 0 to %" PRIu64 " belong to no tensor)",
                   e->name, e->begin);
        st = DSC_ERR_USER;
      }
      at = e->end;
      prev = e->name;
    }
    if (st == DSC_OK && at != data_size) {
      ir_error(ctx, loc, "%" PRIu64 " trailing bytes after the last tensor's data", data_size - at);
      st = DSC_ERR_USER;
    }
  }
  /* Copy names and metadata into the set's arena before the JSON goes. */
  for (int k = 0; st == DSC_OK && k < n; k++) {
    ents[k].name = ir_arena_strdup(&s->arena, ents[k].name);
    s->pub.names[k] = ents[k].name;
  }
  if (st == DSC_OK && meta) {
    int k = 0;
    for (const cJSON *m = meta->child; m; m = m->next, k++) {
      s->pub.meta[k].key = ir_arena_strdup(&s->arena, m->string);
      s->pub.meta[k].value = ir_arena_strdup(&s->arena, m->valuestring);
    }
    s->pub.n_meta = n_meta;
  }
  if (st == DSC_OK && s->arena.failed) {
    ir_error(ctx, loc, "out of memory");
    st = DSC_ERR_INTERNAL;
  }
  cJSON_Delete(root);
  if (sorted) ir_free(ctx, sorted, sizeof(st_entry *) * (size_t)(n > 0 ? n : 1));
  if (st != DSC_OK) {
    if (ents) ir_free(ctx, ents, sizeof(st_entry) * (size_t)(n > 0 ? n : 1));
    dsc_tensor_set_free(ctx, s ? &s->pub : NULL);
    return st;
  }
  *out = s;
  *entries_out = ents;
  *n_out = n;
  return DSC_OK;
}

/* Sequential reads of [pos, end) of a file through a buffer. */
typedef struct {
  int fd;
  uint64_t pos, end; /* file offset of buf[0]; the file's size */
  size_t len, at;    /* bytes in buf; next unread one */
  unsigned char buf[1 << 16];
} data_reader;

/* At least need unread bytes in r->buf; false on a read error. */
static bool reader_fill(data_reader *r, size_t need) {
  if (r->len - r->at >= need) return true;
  memmove(r->buf, r->buf + r->at, r->len - r->at);
  r->pos += r->at, r->len -= r->at, r->at = 0;
  uint64_t left = r->end - (r->pos + r->len);
  size_t want = sizeof r->buf - r->len < left ? sizeof r->buf - r->len : (size_t)left;
  if (want && !rt_pread_full(r->fd, r->buf + r->len, want, r->pos + r->len)) return false;
  r->len += want;
  return r->len >= need;
}

struct rt_st_file {
  dsc_context *ctx;
  char *path;
  int fd;
  uint64_t data_at;   /* file offset of the data section */
  uint64_t size;      /* the file's bytes */
  rt_tensor_set *set; /* names and metadata (its tensors stay NULL) */
  st_entry *ents;
  int n;
  int64_t bytes_read; /* tensor bytes read so far (rt_st_read, rt_st_read_range) */
};

void rt_st_close(rt_st_file *f) {
  if (!f) return;
  dsc_context *ctx = f->ctx;
  if (f->fd >= 0) close(f->fd);
  if (f->ents) ir_free(ctx, f->ents, sizeof(st_entry) * (size_t)(f->n > 0 ? f->n : 1));
  if (f->set) dsc_tensor_set_free(ctx, &f->set->pub);
  if (f->path) ir_free(ctx, f->path, strlen(f->path) + 1);
  ir_free(ctx, f, sizeof *f);
}

dsc_status rt_st_open(dsc_context *ctx, const char *path, rt_st_file **out) {
  *out = NULL;
  dsc_loc loc = rt_loc(path);
  rt_st_file *f = ir_alloc(ctx, sizeof *f);
  if (!f) {
    ir_error(ctx, loc, "out of memory");
    return DSC_ERR_INTERNAL;
  }
  memset(f, 0, sizeof *f);
  f->ctx = ctx, f->fd = -1;
  if ((f->path = ir_alloc(ctx, strlen(path) + 1))) memcpy(f->path, path, strlen(path) + 1);
  dsc_status st = f->path ? rt_open_regular(ctx, path, 0, &f->fd) : DSC_ERR_INTERNAL;
  if (!f->path) ir_error(ctx, loc, "out of memory");
  struct stat sb;
  if (st != DSC_OK) {
  } else if (fstat(f->fd, &sb) != 0) {
    st = rt_io_error(ctx, path, "cannot stat");
  } else if (!S_ISREG(sb.st_mode)) {
    ir_error(ctx, loc, "not a regular file");
    st = DSC_ERR_USER;
  }
  uint64_t size = st == DSC_OK ? (uint64_t)sb.st_size : 0, hlen = 0;
  unsigned char len8[8];
  if (st == DSC_OK && size < 8) {
    ir_error(ctx, loc,
             "file too short: %" PRIu64
             " bytes, a safetensors file starts with an 8-byte "
             "header length",
             size);
    st = DSC_ERR_USER;
  }
  if (st == DSC_OK && !rt_pread_full(f->fd, len8, 8, 0)) st = rt_io_error(ctx, path, "read failed");
  if (st == DSC_OK) {
    for (int i = 0; i < 8; i++) hlen |= (uint64_t)len8[i] << (8 * i);
    if (hlen > MAX_HEADER) {
      ir_error(ctx, loc, "header length %" PRIu64 " is absurd (more than %u bytes)", hlen,
               MAX_HEADER);
      st = DSC_ERR_USER;
    } else if (hlen > size - 8) {
      ir_error(ctx, loc,
               "header length %" PRIu64 " is larger than the rest of the file (%" PRIu64 " bytes)",
               hlen, size - 8);
      st = DSC_ERR_USER;
    }
  }
  char *text = NULL;
  if (st == DSC_OK) {
    text = ir_alloc(ctx, (size_t)hlen + 1);
    if (!text) {
      ir_error(ctx, loc, "out of memory");
      st = DSC_ERR_INTERNAL;
    } else if (!rt_pread_full(f->fd, text, (size_t)hlen, 8)) {
      st = rt_io_error(ctx, path, "read failed");
    } else {
      text[hlen] = 0;
      if (memchr(text, 0, (size_t)hlen)) {
        ir_error(ctx, loc, "header is not valid JSON (it contains a NUL byte)");
        st = DSC_ERR_USER;
      }
    }
  }
  if (st == DSC_OK)
    st = read_header(ctx, path, text, (size_t)hlen, size - 8 - hlen, &f->set, &f->ents, &f->n);
  if (text) ir_free(ctx, text, (size_t)hlen + 1);
  if (st != DSC_OK) {
    rt_st_close(f);
    return st;
  }
  f->data_at = 8 + hlen, f->size = size;
  *out = f;
  return DSC_OK;
}

int rt_st_count(const rt_st_file *f) { return f->n; }
const char *rt_st_name(const rt_st_file *f, int i) { return f->ents[i].name; }
dsc_type rt_st_type(const rt_st_file *f, int i) { return f->ents[i].type; }
const char *rt_st_meta(const rt_st_file *f, const char *key) {
  return dsc_tensor_set_meta(&f->set->pub, key);
}

int rt_st_find(const rt_st_file *f, const char *name) {
  for (int i = 0; i < f->n; i++)
    if (strcmp(f->ents[i].name, name) == 0) return i;
  return -1;
}

/* Reads entry e's values into dst through r (positioned anywhere before
 * e's bytes in the file). */
static dsc_status read_entry(rt_st_file *f, data_reader *r, const st_entry *e, double *dst) {
  size_t es = dsc_dtype_size(e->type.dtype);
  if (r->pos + r->at != f->data_at + e->begin) { /* not where the reader is: jump */
    r->pos = f->data_at + e->begin, r->len = r->at = 0;
  }
  int64_t count = (int64_t)((e->end - e->begin) / es), k = 0;
  while (k < count) {
    if (!reader_fill(r, es)) return rt_io_error(f->ctx, f->path, "read failed");
    size_t avail = (r->len - r->at) / es;
    int64_t take = (int64_t)avail < count - k ? (int64_t)avail : count - k;
    for (int64_t j = 0; j < take; j++, r->at += es)
      dst[k++] = decode(e->type.dtype, r->buf + r->at);
  }
  return DSC_OK;
}

dsc_status rt_st_read(rt_st_file *f, int i, double *dst) {
  data_reader *r = ir_alloc(f->ctx, sizeof *r);
  if (!r) {
    ir_error(f->ctx, rt_loc(f->path), "out of memory");
    return DSC_ERR_INTERNAL;
  }
  r->fd = f->fd, r->pos = f->data_at + f->ents[i].begin, r->end = f->size, r->len = r->at = 0;
  dsc_status st = read_entry(f, r, &f->ents[i], dst);
  ir_free(f->ctx, r, sizeof *r);
  if (st == DSC_OK) f->bytes_read += (int64_t)(f->ents[i].end - f->ents[i].begin);
  return st;
}

dsc_status rt_st_read_range(rt_st_file *f, int i, int64_t first, int64_t count, double *dst) {
  const st_entry *e = &f->ents[i];
  size_t es = dsc_dtype_size(e->type.dtype);
  if (count <= 0) return DSC_OK;
  if (first < 0 || (uint64_t)(first + count) * es > e->end - e->begin) {
    ir_error(f->ctx, rt_loc(f->path),
             "tensor '%s': elements [%" PRId64 ", %" PRId64 ") are outside it", e->name, first,
             first + count);
    return DSC_ERR_INTERNAL;
  }
  size_t bytes = (size_t)count * es;
  unsigned char *buf = ir_alloc(f->ctx, bytes);
  if (!buf) {
    ir_error(f->ctx, rt_loc(f->path), "out of memory");
    return DSC_ERR_INTERNAL;
  }
  dsc_status st = DSC_OK;
  if (!rt_pread_full(f->fd, buf, bytes, f->data_at + e->begin + (uint64_t)first * es))
    st = rt_io_error(f->ctx, f->path, "read failed");
  for (int64_t k = 0; st == DSC_OK && k < count; k++) dst[k] = decode(e->type.dtype, buf + k * es);
  ir_free(f->ctx, buf, bytes);
  if (st == DSC_OK) f->bytes_read += (int64_t)bytes;
  return st;
}

int64_t rt_st_bytes_read(const rt_st_file *f) { return f->bytes_read; }

dsc_status dsc_safetensors_read(dsc_context *ctx, const char *path, dsc_tensor_set **out) {
  *out = NULL;
  dsc_loc loc = rt_loc(path);
  rt_st_file *f = NULL;
  dsc_status st = rt_st_open(ctx, path, &f);
  if (st != DSC_OK) return st;
  int n = f->n;
  st_entry *ents = f->ents;
  rt_tensor_set *s = f->set;
  /* The data in file order, through one buffer: a pread per tensor would
   * be 10^5 system calls for a header of 10^5 small tensors. */
  st_entry **by_begin = ir_alloc(ctx, sizeof *by_begin * (size_t)(n > 0 ? n : 1));
  if (!by_begin) {
    ir_error(ctx, loc, "out of memory");
    st = DSC_ERR_INTERNAL;
  }
  if (st == DSC_OK) {
    for (int k = 0; k < n; k++) by_begin[k] = &ents[k], s->pub.tensors[k] = NULL;
    if (n > 1) qsort(by_begin, (size_t)n, sizeof *by_begin, cmp_begin);
    s->pub.n = n; /* so that freeing the set frees what exists so far */
  }
  data_reader *r = st == DSC_OK ? ir_alloc(ctx, sizeof *r) : NULL;
  if (st == DSC_OK && !r) {
    ir_error(ctx, loc, "out of memory");
    st = DSC_ERR_INTERNAL;
  }
  if (r) r->fd = f->fd, r->pos = f->data_at, r->end = f->size, r->len = r->at = 0;
  for (int i = 0; st == DSC_OK && i < n; i++) {
    if ((st = ir_check_interrupt(ctx, "reading %s", path)) != DSC_OK) break;
    const st_entry *en = by_begin[i];
    int k = (int)(en - ents);
    dsc_tensor *t = dsc_tensor_new(ctx, en->type);
    if (!t) {
      ir_error(ctx, loc, "tensor '%s': out of memory", en->name);
      st = DSC_ERR_INTERNAL;
      break;
    }
    s->pub.tensors[k] = t;
    st = read_entry(f, r, en, t->data);
  }
  if (r) ir_free(ctx, r, sizeof *r);
  if (by_begin) ir_free(ctx, by_begin, sizeof *by_begin * (size_t)(n > 0 ? n : 1));
  f->set = NULL; /* the set is the result now (or freed below) */
  rt_st_close(f);
  if (st != DSC_OK) {
    dsc_tensor_set_free(ctx, &s->pub);
    return st;
  }
  *out = &s->pub;
  return DSC_OK;
}
