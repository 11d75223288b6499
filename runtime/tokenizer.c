/* Hugging Face tokenizers' tokenizer.json, BPE models: encode and decode.
 *
 * The pipeline is the library's (tokenizers/src/tokenizer/mod.rs): the text
 * is split around added tokens; each other segment is normalized, then
 * pre-tokenized into pieces; the BPE model turns each piece into ids; the
 * post-processor adds the template's special tokens. Decoding maps ids to
 * token strings and runs the decoder chain over them.
 *
 * Supported (what GPT-2, Llama 2/3, Mistral, Qwen-style files use):
 *   normalizer    null, Sequence, Prepend, Replace (String or Regex),
 *                 NFC, NFD, NFKC, NFKD (utf8proc)
 *   pre_tokenizer null, Sequence, ByteLevel, Split, Metaspace, Digits
 *   model         BPE: merges as "a b" or ["a", "b"], byte_fallback,
 *                 unk_token + fuse_unk, ignore_merges
 *   post_processor null, Sequence, ByteLevel, TemplateProcessing (single)
 *   decoder       null, Sequence, ByteLevel, Metaspace, Replace, ByteFallback,
 *                 Fuse, Strip
 * Anything else is refused at load with its JSON path, never approximated.
 * Regexes (Split, ByteLevel's GPT-2 pattern) run on PCRE2 in UTF + UCP mode;
 * Unicode normalization forms on utf8proc (Debian's libutf8proc). */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <cjson/cJSON.h>
#include <ctype.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <pcre2.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "runtime/runtime.h"

/* ByteLevel's split (the GPT-2 pattern, tokenizers' pre_tokenizers/byte_level.rs). */
static const char gpt2_pattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* --------------------------------------------------------------- buffers */

typedef struct {
  char *p;
  size_t n, cap;
} tk_bytes;

typedef struct {
  uint32_t *p;
  int64_t n, cap;
} tk_ids;

static bool bytes_put(tk_bytes *b, const void *s, size_t n) {
  if (b->n + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->n + n + 1) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) return false;
    b->p = p, b->cap = cap;
  }
  memcpy(b->p + b->n, s, n);
  b->n += n;
  b->p[b->n] = 0;
  return true;
}

static bool ids_put(tk_ids *v, uint32_t id) {
  if (v->n == v->cap) {
    int64_t cap = v->cap ? v->cap * 2 : 256;
    uint32_t *p = realloc(v->p, (size_t)cap * sizeof *p);
    if (!p) return false;
    v->p = p, v->cap = cap;
  }
  v->p[v->n++] = id;
  return true;
}

/* Bytes of the UTF-8 sequence starting with lead byte c (1 for a stray byte). */
static int utf8_len(unsigned char c) {
  return c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
}

static int utf8_put(char *out, uint32_t cp) {
  if (cp < 0x80) return out[0] = (char)cp, 1;
  if (cp < 0x800) return out[0] = (char)(0xc0 | cp >> 6), out[1] = (char)(0x80 | (cp & 63)), 2;
  out[0] = (char)(0xe0 | cp >> 12), out[1] = (char)(0x80 | ((cp >> 6) & 63));
  out[2] = (char)(0x80 | (cp & 63));
  return 3; /* the byte map's code points are all below 0x10000 */
}

/* Offset of the first byte that is not valid UTF-8, or len when all is. */
size_t rt_utf8_valid_prefix(const char *s, size_t len) {
  const unsigned char *u = (const unsigned char *)s;
  for (size_t i = 0; i < len;) {
    unsigned c = u[i];
    int n = c < 0x80 ? 1 : (c >= 0xc2 && c <= 0xdf) ? 2 : (c >= 0xe0 && c <= 0xef) ? 3
                                                 : (c >= 0xf0 && c <= 0xf4) ? 4 : 0;
    if (!n || i + (size_t)n > len) return i;
    for (int k = 1; k < n; k++)
      if ((u[i + k] & 0xc0) != 0x80) return i;
    if (n == 3 && ((c == 0xe0 && u[i + 1] < 0xa0) || (c == 0xed && u[i + 1] > 0x9f))) return i;
    if (n == 4 && ((c == 0xf0 && u[i + 1] < 0x90) || (c == 0xf4 && u[i + 1] > 0x8f))) return i;
    i += (size_t)n;
  }
  return len;
}

/* ------------------------------------------------------------ hash maps */

static uint64_t hash_bytes(const char *s, size_t n) {
  uint64_t h = 1469598103934665603ULL; /* FNV-1a */
  for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ULL;
  return h ^ (h >> 29);
}

static uint64_t hash_u64(uint64_t x) {
  x ^= x >> 33, x *= 0xff51afd7ed558ccdULL, x ^= x >> 33, x *= 0xc4ceb9fe1a85ec53ULL;
  return x ^ (x >> 33);
}

typedef struct {
  uint64_t key; /* (left id << 32) | right id; UINT64_MAX: empty */
  uint32_t rank, merged;
} tk_merge;

enum { SEG_NONE, SEG_PREPEND, SEG_REPLACE, SEG_REPLACE_RE, SEG_UNICODE }; /* normalizers */
enum { PRE_BYTELEVEL, PRE_SPLIT, PRE_METASPACE };            /* pre-tokenizers */
enum { BEH_REMOVED, BEH_ISOLATED, BEH_MERGED_PREV, BEH_MERGED_NEXT, BEH_CONTIGUOUS };
enum { DEC_BYTELEVEL, DEC_METASPACE, DEC_REPLACE, DEC_BYTEFALLBACK, DEC_FUSE, DEC_STRIP };
enum { PREPEND_ALWAYS, PREPEND_FIRST, PREPEND_NEVER };

typedef struct {
  int kind;
  char *a, *b;           /* Prepend: a; Replace: a -> b */
  pcre2_code *re;        /* Replace with a Regex, Split */
  bool add_prefix_space; /* ByteLevel */
  int behavior;          /* Split */
  bool invert;           /* Split */
  int unicode_form;      /* NFC..NFKD: utf8proc's options */
  uint32_t repl_cp;      /* Metaspace's replacement */
  int prepend;           /* Metaspace */
  bool split;            /* Metaspace */
  int start, stop;       /* Strip */
} tk_step;

typedef struct {
  char *content;
  size_t len;
  uint32_t id;
  bool special, lstrip, rstrip, single_word;
} tk_added;

#define CACHE_SLOTS 16384
#define CACHE_PIECE 48 /* longest piece cached */
#define CACHE_IDS 16
typedef struct {
  uint8_t len, n_ids; /* len 0: empty slot */
  char piece[CACHE_PIECE];
  uint32_t ids[CACHE_IDS];
} tk_cache_slot;

struct dsc_tokenizer {
  dsc_context *ctx;
  char *path;
  /* vocabulary: id -> string (model alphabet); string -> id by open addressing */
  char **tok;
  uint32_t *tok_len;
  uint32_t n_ids; /* 1 + the largest id */
  int32_t *vocab_slots;
  uint32_t vocab_mask;
  tk_merge *merges;
  uint64_t merge_mask;
  int32_t unk; /* -1: none */
  bool byte_fallback, fuse_unk, ignore_merges;
  int32_t byte_ids[256]; /* <0xXX> tokens (byte fallback); -1 absent */
  tk_added *added;
  int n_added;
  bool *is_special; /* [n_ids] */
  tk_step norm[8], pre[8], dec[8];
  int n_norm, n_pre, n_dec;
  bool has_decoder;
  tk_ids tmpl_before, tmpl_after; /* TemplateProcessing's single: ids around $A */
  bool byte_level_alphabet;       /* a ByteLevel step maps bytes to chars */
  tk_cache_slot *cache;
  pcre2_match_data *md;
};

/* -------------------------------------------------------------- loading */

typedef struct {
  dsc_tokenizer *t;
  dsc_status st;
} tk_load;

static void load_error(tk_load *L, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void load_error(tk_load *L, const char *fmt, ...) {
  if (L->st != DSC_OK) return;
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  ir_error(L->t->ctx, rt_loc(L->t->path), "%s", msg);
  L->st = DSC_ERR_USER;
}

static void oom(tk_load *L) {
  if (L->st != DSC_OK) return;
  ir_error(L->t->ctx, rt_loc(L->t->path), "out of memory");
  L->st = DSC_ERR_INTERNAL;
}

static int32_t vocab_find(const dsc_tokenizer *t, const char *s, size_t n) {
  for (uint32_t i = (uint32_t)hash_bytes(s, n) & t->vocab_mask;; i = (i + 1) & t->vocab_mask) {
    int32_t id = t->vocab_slots[i];
    if (id < 0) return -1;
    if (t->tok_len[id] == n && memcmp(t->tok[id], s, n) == 0) return id;
  }
}

static void vocab_insert(dsc_tokenizer *t, uint32_t id) {
  uint32_t i = (uint32_t)hash_bytes(t->tok[id], t->tok_len[id]) & t->vocab_mask;
  while (t->vocab_slots[i] >= 0) i = (i + 1) & t->vocab_mask;
  t->vocab_slots[i] = (int32_t)id;
}

static const tk_merge *merge_find(const dsc_tokenizer *t, uint32_t a, uint32_t b) {
  uint64_t key = (uint64_t)a << 32 | b;
  for (uint64_t i = hash_u64(key) & t->merge_mask;; i = (i + 1) & t->merge_mask) {
    if (t->merges[i].key == key) return &t->merges[i];
    if (t->merges[i].key == UINT64_MAX) return NULL;
  }
}

static pcre2_code *compile_re(tk_load *L, const char *pattern, bool literal, const char *where) {
  int err;
  PCRE2_SIZE at;
  uint32_t opts = literal ? PCRE2_LITERAL | PCRE2_UTF : PCRE2_UTF | PCRE2_UCP;
  pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, opts, &err, &at, NULL);
  if (!re) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    load_error(L, "%s: the pattern does not compile at offset %zu: %s", where, (size_t)at,
               (const char *)msg);
    return NULL;
  }
  pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* an interpreter match when JIT is absent */
  return re;
}

static char *dup_str(tk_load *L, const char *s) {
  char *d = strdup(s ? s : "");
  if (!d) oom(L);
  return d;
}

static const char *json_str(const cJSON *o, const char *key) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
  return cJSON_IsString(v) ? v->valuestring : NULL;
}

static bool json_bool(const cJSON *o, const char *key, bool dflt) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
  return cJSON_IsBool(v) ? cJSON_IsTrue(v) : dflt;
}

/* A {"String": s} or {"Regex": r} pattern into step->a (String) or step->re. */
static void load_pattern(tk_load *L, const cJSON *o, tk_step *s, const char *where) {
  const cJSON *pat = cJSON_GetObjectItemCaseSensitive(o, "pattern");
  const char *str = json_str(pat, "String"), *re = json_str(pat, "Regex");
  if (str)
    s->a = dup_str(L, str);
  else if (re)
    s->re = compile_re(L, re, false, where);
  else
    load_error(L, "%s: pattern must be {\"String\": ...} or {\"Regex\": ...}", where);
}

static uint32_t first_cp(const char *s) {
  const unsigned char *u = (const unsigned char *)s;
  int n = utf8_len(u[0]);
  uint32_t cp = n == 1 ? u[0] : u[0] & (0xff >> (n + 1));
  for (int k = 1; k < n && u[k]; k++) cp = cp << 6 | (u[k] & 63);
  return cp;
}

/* One normalizer, pre-tokenizer or decoder node (a Sequence recurses). */
static void load_steps(tk_load *L, const cJSON *o, const char *section, tk_step *steps, int *n) {
  if (!o || cJSON_IsNull(o) || L->st != DSC_OK) return;
  const char *type = json_str(o, "type");
  char where[96];
  snprintf(where, sizeof where, "%s %s", section, type ? type : "(no type)");
  if (!type) return load_error(L, "%s: an entry without a \"type\"", section);
  if (strcmp(type, "Sequence") == 0) {
    const char *key = strcmp(section, "normalizer") == 0      ? "normalizers"
                      : strcmp(section, "pre_tokenizer") == 0 ? "pretokenizers"
                                                              : "decoders";
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(o, key), *e;
    if (!cJSON_IsArray(list)) return load_error(L, "%s: \"%s\" must be a list", where, key);
    cJSON_ArrayForEach(e, list) load_steps(L, e, section, steps, n);
    return;
  }
  if (*n == 8) return load_error(L, "%s: more than 8 steps", section);
  tk_step *s = &steps[*n];
  memset(s, 0, sizeof *s);
  bool ok = true;
  if (strcmp(section, "normalizer") == 0) {
    if (strcmp(type, "Prepend") == 0) {
      s->kind = SEG_PREPEND, s->a = dup_str(L, json_str(o, "prepend"));
    } else if (strcmp(type, "Replace") == 0) {
      load_pattern(L, o, s, where);
      s->kind = s->re ? SEG_REPLACE_RE : SEG_REPLACE;
      s->b = dup_str(L, json_str(o, "content"));
    } else if (strcmp(type, "NFC") == 0 || strcmp(type, "NFD") == 0 || strcmp(type, "NFKC") == 0 ||
               strcmp(type, "NFKD") == 0) {
      s->kind = SEG_UNICODE;
      s->unicode_form = UTF8PROC_STABLE | (type[2] == 'K' ? UTF8PROC_COMPAT : 0) |
                        (type[strlen(type) - 1] == 'C' ? UTF8PROC_COMPOSE : UTF8PROC_DECOMPOSE);
    } else
      ok = false;
  } else if (strcmp(section, "pre_tokenizer") == 0) {
    if (strcmp(type, "ByteLevel") == 0) {
      s->kind = PRE_BYTELEVEL;
      s->add_prefix_space = json_bool(o, "add_prefix_space", true);
      if (json_bool(o, "use_regex", true)) s->re = compile_re(L, gpt2_pattern, false, where);
      L->t->byte_level_alphabet = true;
    } else if (strcmp(type, "Split") == 0 || strcmp(type, "Digits") == 0) {
      s->kind = PRE_SPLIT;
      if (type[0] == 'D') {
        bool each = json_bool(o, "individual_digits", false);
        s->re = compile_re(L, each ? "\\p{N}" : "\\p{N}+", false, where);
        s->behavior = BEH_ISOLATED;
      } else {
        load_pattern(L, o, s, where);
        if (s->a) s->re = compile_re(L, s->a, true, where);
        s->invert = json_bool(o, "invert", false);
        const char *b = json_str(o, "behavior");
        static const char *const names[] = {"Removed", "Isolated", "MergedWithPrevious",
                                            "MergedWithNext", "Contiguous"};
        s->behavior = -1;
        for (int i = 0; b && i < 5; i++)
          if (strcmp(b, names[i]) == 0) s->behavior = i;
        if (s->behavior < 0) load_error(L, "%s: unknown behavior '%s'", where, b ? b : "(none)");
      }
    } else if (strcmp(type, "Metaspace") == 0) {
      s->kind = PRE_METASPACE;
      const char *r = json_str(o, "replacement");
      s->repl_cp = r && *r ? first_cp(r) : 0x2581;
      const char *ps = json_str(o, "prepend_scheme");
      s->prepend = !ps ? (json_bool(o, "add_prefix_space", true) ? PREPEND_ALWAYS : PREPEND_NEVER)
                   : strcmp(ps, "first") == 0 ? PREPEND_FIRST
                   : strcmp(ps, "never") == 0 ? PREPEND_NEVER
                                              : PREPEND_ALWAYS;
      s->split = json_bool(o, "split", true);
    } else
      ok = false;
  } else { /* decoder */
    if (strcmp(type, "ByteLevel") == 0) {
      s->kind = DEC_BYTELEVEL;
    } else if (strcmp(type, "Metaspace") == 0) {
      s->kind = DEC_METASPACE;
      const char *r = json_str(o, "replacement");
      s->repl_cp = r && *r ? first_cp(r) : 0x2581;
      const char *ps = json_str(o, "prepend_scheme");
      s->prepend = (ps && strcmp(ps, "never") == 0) ||
                           (!ps && !json_bool(o, "add_prefix_space", true))
                       ? PREPEND_NEVER
                       : PREPEND_ALWAYS;
    } else if (strcmp(type, "Replace") == 0) {
      s->kind = DEC_REPLACE;
      load_pattern(L, o, s, where);
      if (s->re) load_error(L, "%s: a Regex pattern in a decoder is not supported", where);
      s->b = dup_str(L, json_str(o, "content"));
    } else if (strcmp(type, "ByteFallback") == 0) {
      s->kind = DEC_BYTEFALLBACK;
    } else if (strcmp(type, "Fuse") == 0) {
      s->kind = DEC_FUSE;
    } else if (strcmp(type, "Strip") == 0) {
      s->kind = DEC_STRIP;
      s->a = dup_str(L, json_str(o, "content"));
      const cJSON *st = cJSON_GetObjectItemCaseSensitive(o, "start"),
                  *sp = cJSON_GetObjectItemCaseSensitive(o, "stop");
      s->start = cJSON_IsNumber(st) ? st->valueint : 0;
      s->stop = cJSON_IsNumber(sp) ? sp->valueint : 0;
    } else
      ok = false;
  }
  if (!ok)
    return load_error(L, "%s '%s' is not supported (dsc reads the steps listed in docs/models.md)",
                      section, type);
  (*n)++;
}

static void set_token(tk_load *L, uint32_t id, const char *s) {
  dsc_tokenizer *t = L->t;
  if (t->tok[id]) return;
  t->tok[id] = dup_str(L, s);
  t->tok_len[id] = (uint32_t)strlen(s);
}

static void load_model(tk_load *L, const cJSON *model, const cJSON *added) {
  dsc_tokenizer *t = L->t;
  const char *type = json_str(model, "type");
  if (!type || strcmp(type, "BPE") != 0)
    return load_error(L, "model type '%s' is not supported (BPE is)", type ? type : "(none)");
  const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab"), *e;
  const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
  if (!cJSON_IsObject(vocab)) return load_error(L, "model.vocab must be an object");
  if (!cJSON_IsArray(merges)) return load_error(L, "model.merges must be a list");
  const cJSON *dropout = cJSON_GetObjectItemCaseSensitive(model, "dropout");
  if (cJSON_IsNumber(dropout) && dropout->valuedouble > 0)
    return load_error(L, "model.dropout %g: BPE dropout is not supported", dropout->valuedouble);
  if (json_str(model, "continuing_subword_prefix") || json_str(model, "end_of_word_suffix"))
    return load_error(L, "model: continuing_subword_prefix and end_of_word_suffix are not supported");
  t->byte_fallback = json_bool(model, "byte_fallback", false);
  t->fuse_unk = json_bool(model, "fuse_unk", false);
  t->ignore_merges = json_bool(model, "ignore_merges", false);
  /* ids: 1 + the largest of the vocabulary's and the added tokens' */
  int64_t max_id = -1, n_vocab = 0;
  cJSON_ArrayForEach(e, vocab) {
    if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble > (double)INT32_MAX ||
        e->valuedouble != (double)(int64_t)e->valuedouble)
      return load_error(L, "model.vocab[\"%s\"]: the id must be an integer in [0, 2^31)", e->string);
    if ((int64_t)e->valuedouble > max_id) max_id = (int64_t)e->valuedouble;
    n_vocab++;
  }
  cJSON_ArrayForEach(e, added) {
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(e, "id");
    if (!cJSON_IsNumber(id) || id->valuedouble < 0 || id->valuedouble > (double)INT32_MAX ||
        !json_str(e, "content"))
      return load_error(L, "added_tokens: each entry needs an \"id\" in [0, 2^31) and a \"content\"");
    if ((int64_t)id->valuedouble > max_id) max_id = (int64_t)id->valuedouble;
  }
  if (max_id < 0) return load_error(L, "model.vocab is empty");
  t->n_ids = (uint32_t)max_id + 1;
  t->tok = calloc(t->n_ids, sizeof *t->tok);
  t->tok_len = calloc(t->n_ids, sizeof *t->tok_len);
  t->is_special = calloc(t->n_ids, sizeof *t->is_special);
  uint32_t slots = 16;
  while (slots < 2 * (uint64_t)(n_vocab + 1)) slots *= 2;
  t->vocab_slots = malloc(slots * sizeof *t->vocab_slots);
  if (!t->tok || !t->tok_len || !t->is_special || !t->vocab_slots) return oom(L);
  memset(t->vocab_slots, 0xff, slots * sizeof *t->vocab_slots);
  t->vocab_mask = slots - 1;
  cJSON_ArrayForEach(e, vocab) {
    uint32_t id = (uint32_t)e->valuedouble;
    if (t->tok[id])
      return load_error(L, "model.vocab: id %u is given to both \"%s\" and \"%s\"", id, t->tok[id],
                        e->string);
    set_token(L, id, e->string);
    if (L->st != DSC_OK) return;
    if (vocab_find(t, t->tok[id], t->tok_len[id]) >= 0)
      return load_error(L, "model.vocab: \"%s\" appears twice", e->string);
    vocab_insert(t, id);
  }
  for (int b = 0; b < 256; b++) {
    char name[8];
    snprintf(name, sizeof name, "<0x%02X>", b);
    t->byte_ids[b] = vocab_find(t, name, 6);
  }
  const char *unk = json_str(model, "unk_token");
  t->unk = unk ? vocab_find(t, unk, strlen(unk)) : -1;
  if (unk && t->unk < 0) return load_error(L, "model.unk_token \"%s\" is not in the vocabulary", unk);
  /* merges: rank = position in the list */
  int64_t n_merges = cJSON_GetArraySize(merges);
  uint64_t mslots = 16;
  while (mslots < 2 * (uint64_t)(n_merges + 1)) mslots *= 2;
  t->merges = malloc(mslots * sizeof *t->merges);
  if (!t->merges) return oom(L);
  for (uint64_t i = 0; i < mslots; i++) t->merges[i].key = UINT64_MAX;
  t->merge_mask = mslots - 1;
  uint32_t rank = 0;
  tk_bytes joined = {0};
  cJSON_ArrayForEach(e, merges) {
    const char *a, *b;
    size_t la, lb;
    char *sp = NULL;
    if (cJSON_IsString(e)) { /* "a b": split at the one space */
      sp = strchr(e->valuestring, ' ');
      if (!sp || strchr(sp + 1, ' '))
        return free(joined.p), load_error(L, "model.merges[%u] \"%s\" is not two tokens split by one space",
                                          rank, e->valuestring);
      a = e->valuestring, la = (size_t)(sp - a), b = sp + 1, lb = strlen(b);
    } else if (cJSON_IsArray(e) && cJSON_GetArraySize(e) == 2 &&
               cJSON_IsString(cJSON_GetArrayItem(e, 0)) && cJSON_IsString(cJSON_GetArrayItem(e, 1))) {
      a = cJSON_GetArrayItem(e, 0)->valuestring, la = strlen(a);
      b = cJSON_GetArrayItem(e, 1)->valuestring, lb = strlen(b);
    } else
      return free(joined.p), load_error(L, "model.merges[%u]: a string \"a b\" or a pair [\"a\", \"b\"]", rank);
    int32_t ia = vocab_find(t, a, la), ib = vocab_find(t, b, lb);
    joined.n = 0;
    if (!bytes_put(&joined, a, la) || !bytes_put(&joined, b, lb)) return free(joined.p), oom(L);
    int32_t im = vocab_find(t, joined.p, joined.n);
    if (ia < 0 || ib < 0 || im < 0)
      return free(joined.p), load_error(L, "model.merges[%u]: \"%.*s\" + \"%.*s\": %s is not in the vocabulary",
                                        rank, (int)la, a, (int)lb, b,
                                        ia < 0 ? "the first" : ib < 0 ? "the second" : "the merged token");
    uint64_t key = (uint64_t)ia << 32 | (uint32_t)ib;
    uint64_t i = hash_u64(key) & t->merge_mask;
    while (t->merges[i].key != UINT64_MAX && t->merges[i].key != key) i = (i + 1) & t->merge_mask;
    if (t->merges[i].key == UINT64_MAX) /* a repeated pair keeps its first rank */
      t->merges[i] = (tk_merge){key, rank, (uint32_t)im};
    rank++;
  }
  free(joined.p);
}

static void load_added(tk_load *L, const cJSON *added) {
  dsc_tokenizer *t = L->t;
  int n = cJSON_GetArraySize(added);
  t->added = calloc((size_t)(n ? n : 1), sizeof *t->added);
  if (!t->added) return oom(L);
  const cJSON *e;
  cJSON_ArrayForEach(e, added) {
    tk_added *a = &t->added[t->n_added];
    const char *content = json_str(e, "content");
    if (!*content) return load_error(L, "added_tokens: an empty \"content\"");
    a->id = (uint32_t)cJSON_GetObjectItemCaseSensitive(e, "id")->valuedouble;
    a->content = dup_str(L, content);
    a->len = strlen(content);
    a->special = json_bool(e, "special", false);
    a->lstrip = json_bool(e, "lstrip", false);
    a->rstrip = json_bool(e, "rstrip", false);
    a->single_word = json_bool(e, "single_word", false);
    if (L->st != DSC_OK) return;
    t->n_added++;
    set_token(L, a->id, content);
    t->is_special[a->id] = a->special;
  }
}

static void load_post(tk_load *L, const cJSON *o) {
  if (!o || cJSON_IsNull(o) || L->st != DSC_OK) return;
  dsc_tokenizer *t = L->t;
  const char *type = json_str(o, "type");
  if (type && strcmp(type, "Sequence") == 0) {
    const cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(o, "processors")) load_post(L, e);
    return;
  }
  if (type && strcmp(type, "ByteLevel") == 0) return; /* offsets only */
  if (!type || strcmp(type, "TemplateProcessing") != 0)
    return load_error(L, "post_processor '%s' is not supported (TemplateProcessing and ByteLevel are)",
                      type ? type : "(no type)");
  const cJSON *single = cJSON_GetObjectItemCaseSensitive(o, "single"), *e;
  const cJSON *specials = cJSON_GetObjectItemCaseSensitive(o, "special_tokens");
  bool seen_a = false;
  cJSON_ArrayForEach(e, single) {
    const cJSON *sp = cJSON_GetObjectItemCaseSensitive(e, "SpecialToken");
    if (cJSON_GetObjectItemCaseSensitive(e, "Sequence")) {
      seen_a = true;
      continue;
    }
    const char *name = json_str(sp, "id");
    const cJSON *def = name ? cJSON_GetObjectItemCaseSensitive(specials, name) : NULL, *id;
    if (!def) return load_error(L, "post_processor: special token '%s' has no entry in special_tokens",
                                name ? name : "(none)");
    cJSON_ArrayForEach(id, cJSON_GetObjectItemCaseSensitive(def, "ids")) {
      if (!cJSON_IsNumber(id) || id->valuedouble < 0 || id->valuedouble >= t->n_ids)
        return load_error(L, "post_processor: special token '%s' has an id outside the vocabulary", name);
      if (!ids_put(seen_a ? &t->tmpl_after : &t->tmpl_before, (uint32_t)id->valuedouble)) return oom(L);
    }
  }
}

dsc_status dsc_tokenizer_load(dsc_context *ctx, const char *path, dsc_tokenizer **out) {
  *out = NULL;
  cJSON *root = NULL;
  dsc_status st = rt_read_json(ctx, path, &root);
  if (st != DSC_OK) return st;
  dsc_tokenizer *t = calloc(1, sizeof *t);
  tk_load L = {t, DSC_OK};
  if (!t || !(t->path = strdup(path))) {
    free(t);
    cJSON_Delete(root);
    ir_error(ctx, rt_loc(path), "out of memory");
    return DSC_ERR_INTERNAL;
  }
  t->ctx = ctx;
  const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
  if (added && !cJSON_IsArray(added)) load_error(&L, "added_tokens must be a list");
  const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
  if (!cJSON_IsObject(model)) load_error(&L, "no \"model\" object: not a tokenizers tokenizer.json");
  if (L.st == DSC_OK) load_model(&L, model, added);
  if (L.st == DSC_OK) load_added(&L, added);
  load_steps(&L, cJSON_GetObjectItemCaseSensitive(root, "normalizer"), "normalizer", t->norm, &t->n_norm);
  load_steps(&L, cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"), "pre_tokenizer", t->pre,
             &t->n_pre);
  const cJSON *dec = cJSON_GetObjectItemCaseSensitive(root, "decoder");
  t->has_decoder = dec && !cJSON_IsNull(dec);
  load_steps(&L, dec, "decoder", t->dec, &t->n_dec);
  load_post(&L, cJSON_GetObjectItemCaseSensitive(root, "post_processor"));
  cJSON_Delete(root);
  if (L.st == DSC_OK) {
    t->cache = calloc(CACHE_SLOTS, sizeof *t->cache);
    t->md = pcre2_match_data_create(4, NULL);
    if (!t->cache || !t->md) oom(&L);
  }
  if (L.st != DSC_OK) {
    dsc_tokenizer_free(t);
    return L.st;
  }
  *out = t;
  return DSC_OK;
}

static void free_steps(tk_step *s, int n) {
  for (int i = 0; i < n; i++) free(s[i].a), free(s[i].b), pcre2_code_free(s[i].re);
}

void dsc_tokenizer_free(dsc_tokenizer *t) {
  if (!t) return;
  for (uint32_t i = 0; t->tok && i < t->n_ids; i++) free(t->tok[i]);
  for (int i = 0; i < t->n_added; i++) free(t->added[i].content);
  free_steps(t->norm, t->n_norm), free_steps(t->pre, t->n_pre), free_steps(t->dec, t->n_dec);
  free(t->tok), free(t->tok_len), free(t->is_special), free(t->vocab_slots), free(t->merges);
  free(t->added), free(t->tmpl_before.p), free(t->tmpl_after.p), free(t->cache), free(t->path);
  pcre2_match_data_free(t->md);
  free(t);
}

int64_t dsc_tokenizer_vocab_size(const dsc_tokenizer *t) { return t->n_ids; }

bool dsc_tokenizer_is_special(const dsc_tokenizer *t, int64_t id) {
  return id >= 0 && id < t->n_ids && t->is_special[id];
}

const char *dsc_tokenizer_token(const dsc_tokenizer *t, int64_t id) {
  return id >= 0 && id < t->n_ids && t->tok[id] ? t->tok[id] : NULL;
}

/* -------------------------------------------------------------- the BPE */

typedef struct {
  uint32_t id;
  int32_t prev, next; /* -1: none */
  uint32_t len;       /* bytes of the piece it covers; 0: merged away */
} tk_sym;

typedef struct {
  uint32_t rank, pos, merged;
} tk_cand;

typedef struct { /* per-call scratch, grown as needed */
  tk_sym *sym;
  tk_cand *heap;
  size_t sym_cap, heap_cap;
  int64_t heap_n;
} tk_work;

static bool cand_less(tk_cand a, tk_cand b) {
  return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos);
}

static bool heap_push(tk_work *w, tk_cand c) {
  if ((size_t)w->heap_n == w->heap_cap) {
    size_t cap = w->heap_cap ? w->heap_cap * 2 : 64;
    tk_cand *p = realloc(w->heap, cap * sizeof *p);
    if (!p) return false;
    w->heap = p, w->heap_cap = cap;
  }
  int64_t i = w->heap_n++;
  while (i > 0 && cand_less(c, w->heap[(i - 1) / 2])) {
    w->heap[i] = w->heap[(i - 1) / 2];
    i = (i - 1) / 2;
  }
  w->heap[i] = c;
  return true;
}

static tk_cand heap_pop(tk_work *w) {
  tk_cand top = w->heap[0], last = w->heap[--w->heap_n];
  int64_t i = 0;
  for (;;) {
    int64_t c = 2 * i + 1;
    if (c >= w->heap_n) break;
    if (c + 1 < w->heap_n && cand_less(w->heap[c + 1], w->heap[c])) c++;
    if (!cand_less(w->heap[c], last)) break;
    w->heap[i] = w->heap[c];
    i = c;
  }
  if (w->heap_n) w->heap[i] = last;
  return top;
}

static bool push_pair(const dsc_tokenizer *t, tk_work *w, int32_t pos) {
  int32_t nx = w->sym[pos].next;
  if (nx < 0) return true;
  const tk_merge *m = merge_find(t, w->sym[pos].id, w->sym[nx].id);
  return !m || heap_push(w, (tk_cand){m->rank, (uint32_t)pos, m->merged});
}

/* The ids of one piece (UTF-8 in the model's alphabet) appended to out. */
static bool bpe_piece(dsc_tokenizer *t, tk_work *w, const char *s, size_t n, tk_ids *out) {
  if (!n) return true;
  if (t->ignore_merges) {
    int32_t id = vocab_find(t, s, n);
    if (id >= 0) return ids_put(out, (uint32_t)id);
  }
  tk_cache_slot *slot = NULL;
  if (n <= CACHE_PIECE) {
    slot = &t->cache[hash_bytes(s, n) & (CACHE_SLOTS - 1)];
    if (slot->len == n && memcmp(slot->piece, s, n) == 0) {
      for (int i = 0; i < slot->n_ids; i++)
        if (!ids_put(out, slot->ids[i])) return false;
      return true;
    }
  }
  if (w->sym_cap < n) {
    tk_sym *p = realloc(w->sym, n * sizeof *p);
    if (!p) return false;
    w->sym = p, w->sym_cap = n;
  }
  /* the initial symbols: one per character; an unknown character becomes
   * its bytes' <0xXX> tokens (byte fallback), the unknown token (merged
   * with a preceding one under fuse_unk), or nothing (no unk_token: as the
   * library does) */
  int32_t ns = 0;
  for (size_t i = 0; i < n;) {
    size_t cl = (size_t)utf8_len((unsigned char)s[i]);
    if (i + cl > n) cl = n - i;
    int32_t id = vocab_find(t, s + i, cl);
    if (id >= 0) {
      w->sym[ns] = (tk_sym){(uint32_t)id, ns - 1, -1, (uint32_t)cl};
      ns++;
    } else if (t->byte_fallback && t->byte_ids[(unsigned char)s[i]] >= 0) {
      for (size_t k = 0; k < cl; k++) {
        int32_t b = t->byte_ids[(unsigned char)s[i + k]];
        if (b < 0) b = t->unk;
        if (b >= 0) {
          w->sym[ns] = (tk_sym){(uint32_t)b, ns - 1, -1, 1};
          ns++;
        }
      }
    } else if (t->unk >= 0) {
      if (t->fuse_unk && ns && w->sym[ns - 1].id == (uint32_t)t->unk)
        w->sym[ns - 1].len += (uint32_t)cl;
      else {
        w->sym[ns] = (tk_sym){(uint32_t)t->unk, ns - 1, -1, (uint32_t)cl};
        ns++;
      }
    }
    i += cl;
  }
  for (int32_t i = 0; i + 1 < ns; i++) w->sym[i].next = i + 1;
  w->heap_n = 0;
  for (int32_t i = 0; i + 1 < ns; i++)
    if (!push_pair(t, w, i)) return false;
  while (w->heap_n) {
    tk_cand c = heap_pop(w);
    tk_sym *a = &w->sym[c.pos];
    if (!a->len || a->next < 0) continue;
    tk_sym *b = &w->sym[a->next];
    const tk_merge *m = merge_find(t, a->id, b->id);
    if (!m || m->rank != c.rank) continue; /* stale: a neighbour changed */
    a->id = c.merged;
    a->len += b->len;
    b->len = 0;
    a->next = b->next;
    if (a->next >= 0) w->sym[a->next].prev = (int32_t)c.pos;
    if (a->prev >= 0 && !push_pair(t, w, a->prev)) return false;
    if (!push_pair(t, w, (int32_t)c.pos)) return false;
  }
  int64_t first = out->n;
  for (int32_t i = 0; i >= 0 && i < ns; i = w->sym[i].next)
    if (!ids_put(out, w->sym[i].id)) return false;
  if (slot && out->n - first <= CACHE_IDS) {
    slot->len = (uint8_t)n, slot->n_ids = (uint8_t)(out->n - first);
    memcpy(slot->piece, s, n);
    memcpy(slot->ids, out->p + first, (size_t)slot->n_ids * sizeof *slot->ids);
  }
  return true;
}

/* ------------------------------------------------- normalize, pre-tokenize */

/* Bytes 33-126, 161-172, 174-255 stand for themselves; the others take the
 * code points from 256 up, in order (GPT-2's bytes_to_unicode). */
static uint32_t byte_cp(unsigned b) {
  if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174) return b;
  unsigned k = 0;
  for (unsigned c = 0; c < b; c++)
    if (!((c >= 33 && c <= 126) || (c >= 161 && c <= 172) || c >= 174)) k++;
  return 256 + k;
}

static bool byte_level_map(const char *s, size_t n, tk_bytes *out) {
  static char enc[256][4];
  static uint8_t enc_len[256];
  if (!enc_len[0]) /* idempotent: racing threads write the same bytes */
    for (unsigned b = 0; b < 256; b++) enc_len[b] = (uint8_t)utf8_put(enc[b], byte_cp(b));
  out->n = 0;
  for (size_t i = 0; i < n; i++)
    if (!bytes_put(out, enc[(unsigned char)s[i]], enc_len[(unsigned char)s[i]])) return false;
  if (!out->p && !bytes_put(out, "", 0)) return false;
  return true;
}

/* A piece list: spans [off[i], off[i] + len[i]) of one buffer. */
typedef struct {
  tk_bytes buf;
  size_t *off, *len;
  int64_t n, cap;
} tk_pieces;

static bool piece_add(tk_pieces *p, const char *s, size_t n) {
  if (p->n == p->cap) {
    int64_t cap = p->cap ? p->cap * 2 : 64;
    size_t *o = realloc(p->off, (size_t)cap * sizeof *o), *l;
    if (!o) return false;
    p->off = o;
    if (!(l = realloc(p->len, (size_t)cap * sizeof *l))) return false;
    p->len = l, p->cap = cap;
  }
  p->off[p->n] = p->buf.n, p->len[p->n] = n;
  p->n++;
  return bytes_put(&p->buf, s, n);
}

static void pieces_free(tk_pieces *p) { free(p->buf.p), free(p->off), free(p->len); }

/* Appends s with each occurrence of `from` replaced by `to`. */
static bool replace_all(tk_bytes *out, const char *s, size_t n, const char *from, const char *to) {
  size_t fl = strlen(from), tl = strlen(to);
  for (size_t i = 0; i < n;) {
    if (fl && i + fl <= n && memcmp(s + i, from, fl) == 0) {
      if (!bytes_put(out, to, tl)) return false;
      i += fl;
    } else {
      if (!bytes_put(out, s + i, 1)) return false;
      i++;
    }
  }
  return out->p || bytes_put(out, "", 0);
}

/* Appends s in a Unicode normalization form. ASCII characters are starters
 * that no normalization changes and no earlier character composes with, so
 * the text is cut before each ASCII character that ends a non-ASCII run; the
 * ASCII character before a run goes with it (a combining mark composes with
 * it). ASCII runs are copied, only the rest goes through utf8proc. */
static bool unicode_normalize(tk_bytes *out, const char *s, size_t n, int form) {
  size_t i = 0;
  while (i < n) {
    size_t j = i;
    while (j < n && !((unsigned char)s[j] & 0x80)) j++;
    if (j == n) return bytes_put(out, s + i, n - i) && (out->p || bytes_put(out, "", 0));
    if (j > i) j--; /* the base character of a following combining mark */
    if (!bytes_put(out, s + i, j - i)) return false;
    size_t k = j + 1;
    while (k < n && ((unsigned char)s[k] & 0x80)) k++;
    utf8proc_uint8_t *dst = NULL;
    utf8proc_ssize_t m =
        utf8proc_map((const utf8proc_uint8_t *)s + j, (utf8proc_ssize_t)(k - j), &dst, form);
    bool ok = m >= 0 && bytes_put(out, (const char *)dst, (size_t)m);
    free(dst);
    if (!ok) return false;
    i = k;
  }
  return out->p || bytes_put(out, "", 0);
}

/* The regex's matches over s as (start, end) pairs, then the split of s into
 * matched and unmatched spans; pieces per behavior (normalizer.rs split). */
static bool split_re(dsc_tokenizer *t, const tk_step *st, const char *s, size_t n, tk_pieces *out) {
  size_t spans_cap = 16, ns = 0;
  struct span {
    size_t a, b;
    bool m;
  } *sp = malloc(spans_cap * sizeof *sp);
  if (!sp) return false;
#define SPAN(A, B, M)                                                      \
  do {                                                                     \
    if (ns == spans_cap) {                                                 \
      struct span *q = realloc(sp, (spans_cap *= 2) * sizeof *sp);         \
      if (!q) return free(sp), false;                                      \
      sp = q;                                                              \
    }                                                                      \
    sp[ns++] = (struct span){(A), (B), (M)};                               \
  } while (0)
  size_t at = 0, gap = 0;
  while (at <= n) {
    int rc = pcre2_match(st->re, (PCRE2_SPTR)s, n, at, PCRE2_NO_UTF_CHECK, t->md, NULL);
    if (rc < 0) break;
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(t->md);
    size_t a = ov[0], b = ov[1];
    if (a == b) { /* an empty match splits nothing: step one character on */
      if (a >= n) break;
      at = a + (size_t)utf8_len((unsigned char)s[a]);
      continue;
    }
    if (a > gap) SPAN(gap, a, false);
    SPAN(a, b, true);
    gap = at = b;
  }
  if (gap < n) SPAN(gap, n, false);
#undef SPAN
  for (size_t i = 0; i < ns; i++) sp[i].m ^= st->invert;
  /* merge per behavior into sp[0..k) (tokenizers' normalizer.rs split) */
  bool ok = true, prev_match = false;
  size_t k = 0;
  switch (st->behavior) {
  case BEH_REMOVED:
    for (size_t i = 0; i < ns; i++)
      if (!sp[i].m) sp[k++] = sp[i];
    break;
  case BEH_ISOLATED:
    k = ns;
    break;
  case BEH_MERGED_PREV: /* a match joins the piece before it */
    for (size_t i = 0; i < ns; i++) {
      bool m = sp[i].m;
      if (m && !prev_match && k)
        sp[k - 1].b = sp[i].b;
      else
        sp[k++] = sp[i];
      prev_match = m;
    }
    break;
  case BEH_MERGED_NEXT: /* a match joins the piece after it: the same, from the end */
    for (size_t i = ns; i-- > 0;) {
      bool m = sp[i].m;
      if (m && !prev_match && k)
        sp[ns - k].a = sp[i].a;
      else
        sp[ns - ++k] = sp[i];
      prev_match = m;
    }
    memmove(sp, sp + ns - k, k * sizeof *sp);
    break;
  case BEH_CONTIGUOUS:
    for (size_t i = 0; i < ns; i++) {
      if (k && sp[k - 1].m == sp[i].m)
        sp[k - 1].b = sp[i].b;
      else
        sp[k++] = sp[i];
    }
    break;
  }
  for (size_t i = 0; ok && i < k; i++) ok = piece_add(out, s + sp[i].a, sp[i].b - sp[i].a);
  free(sp);
  return ok;
}

/* One pre-tokenizer step over one piece; the result goes to out. */
static bool pre_step(dsc_tokenizer *t, const tk_step *st, const char *s, size_t n, bool at_start,
                     tk_pieces *out, tk_bytes *tmp) {
  switch (st->kind) {
  case PRE_BYTELEVEL: {
    tmp->n = 0;
    if (st->add_prefix_space && (n == 0 || s[0] != ' ') && !bytes_put(tmp, " ", 1)) return false;
    if (!bytes_put(tmp, s, n)) return false;
    tk_pieces split = {0};
    tk_bytes enc = {0};
    bool ok = true;
    if (st->re) {
      tk_step iso = *st;
      iso.behavior = BEH_ISOLATED, iso.invert = false;
      ok = split_re(t, &iso, tmp->p, tmp->n, &split);
    } else
      ok = piece_add(&split, tmp->p, tmp->n);
    for (int64_t i = 0; ok && i < split.n; i++)
      ok = byte_level_map(split.buf.p + split.off[i], split.len[i], &enc) &&
           piece_add(out, enc.p, enc.n);
    pieces_free(&split), free(enc.p);
    return ok;
  }
  case PRE_SPLIT:
    return split_re(t, st, s, n, out);
  case PRE_METASPACE: {
    char rep[4];
    int rl = utf8_put(rep, st->repl_cp);
    rep[rl] = 0;
    tmp->n = 0;
    bool starts = n >= (size_t)rl && memcmp(s, rep, (size_t)rl) == 0;
    if (!starts && (st->prepend == PREPEND_ALWAYS || (st->prepend == PREPEND_FIRST && at_start)) &&
        !bytes_put(tmp, rep, (size_t)rl))
      return false;
    /* spaces become the replacement, then (split) each replacement starts a piece */
    tk_bytes r = {0};
    if (!replace_all(&r, s, n, " ", rep) || !bytes_put(tmp, r.p, r.n)) return free(r.p), false;
    free(r.p);
    if (!st->split) return piece_add(out, tmp->p, tmp->n);
    size_t from = 0;
    for (size_t i = 0; i + (size_t)rl <= tmp->n; i++)
      if (i > from && memcmp(tmp->p + i, rep, (size_t)rl) == 0) {
        if (!piece_add(out, tmp->p + from, i - from)) return false;
        from = i;
      }
    return from >= tmp->n || piece_add(out, tmp->p + from, tmp->n - from);
  }
  }
  return false;
}

/* A non-added segment of the input: normalize, pre-tokenize, BPE. */
static bool encode_segment(dsc_tokenizer *t, tk_work *w, const char *s, size_t n, bool at_start,
                           tk_ids *out) {
  if (!n) return true; /* an empty segment (between added tokens) has no tokens */
  tk_bytes norm = {0}, tmp = {0};
  bool ok = bytes_put(&norm, s, n);
  for (int i = 0; ok && i < t->n_norm; i++) {
    const tk_step *st = &t->norm[i];
    tmp.n = 0;
    if (st->kind == SEG_PREPEND) {
      if (norm.n && (!bytes_put(&tmp, st->a, strlen(st->a)) || !bytes_put(&tmp, norm.p, norm.n)))
        ok = false;
      if (!norm.n) continue;
    } else if (st->kind == SEG_REPLACE) {
      ok = replace_all(&tmp, norm.p, norm.n, st->a, st->b);
    } else if (st->kind == SEG_UNICODE) {
      ok = unicode_normalize(&tmp, norm.p, norm.n, st->unicode_form);
    } else { /* a regex replace */
      /* each match of the pattern is replaced: split, then rejoin */
      size_t at = 0;
      while (ok && at <= norm.n) {
        int rc = pcre2_match(st->re, (PCRE2_SPTR)norm.p, norm.n, at, PCRE2_NO_UTF_CHECK, t->md, NULL);
        if (rc < 0) break;
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(t->md);
        ok = bytes_put(&tmp, norm.p + at, ov[0] - at) && bytes_put(&tmp, st->b, strlen(st->b));
        if (ov[1] == ov[0]) {
          if (ov[0] >= norm.n) {
            at = norm.n;
            break;
          }
          size_t cl = (size_t)utf8_len((unsigned char)norm.p[ov[0]]);
          ok = ok && bytes_put(&tmp, norm.p + ov[0], cl);
          at = ov[0] + cl;
        } else
          at = ov[1];
      }
      ok = ok && bytes_put(&tmp, norm.p + at, norm.n - at);
    }
    tk_bytes x = norm;
    norm = tmp, tmp = x;
  }
  tk_pieces cur = {0}, next = {0};
  ok = ok && piece_add(&cur, norm.p ? norm.p : "", norm.n);
  for (int i = 0; ok && i < t->n_pre; i++) {
    next.n = 0, next.buf.n = 0;
    for (int64_t k = 0; ok && k < cur.n; k++)
      ok = pre_step(t, &t->pre[i], cur.buf.p + cur.off[k], cur.len[k], at_start && k == 0, &next,
                    &tmp);
    tk_pieces x = cur;
    cur = next, next = x;
  }
  for (int64_t k = 0; ok && k < cur.n; k++) ok = bpe_piece(t, w, cur.buf.p + cur.off[k], cur.len[k], out);
  pieces_free(&cur), pieces_free(&next), free(norm.p), free(tmp.p);
  return ok;
}

static bool is_word_byte(unsigned char c) {
  return c >= 0x80 || c == '_' || (c >= '0' && c <= '9') || ((c | 32) >= 'a' && (c | 32) <= 'z');
}

static bool is_space(unsigned char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

/* The added token matching at s[i] (the longest), or -1. */
static int added_at(const dsc_tokenizer *t, const char *s, size_t n, size_t i) {
  int best = -1;
  for (int k = 0; k < t->n_added; k++) {
    const tk_added *a = &t->added[k];
    if (a->len > n - i || memcmp(s + i, a->content, a->len) != 0) continue;
    if (a->single_word && ((i > 0 && is_word_byte((unsigned char)s[i - 1])) ||
                           (i + a->len < n && is_word_byte((unsigned char)s[i + a->len]))))
      continue;
    if (best < 0 || a->len > t->added[best].len) best = k;
  }
  return best;
}

dsc_status dsc_tokenizer_encode(dsc_tokenizer *t, const char *text, size_t len, bool add_special,
                                uint32_t **ids, int64_t *n_ids) {
  *ids = NULL, *n_ids = 0;
  size_t bad = rt_utf8_valid_prefix(text, len);
  if (bad < len) {
    ir_error(t->ctx, rt_loc(t->path), "the text is not UTF-8 at byte %zu (0x%02x)", bad,
             (unsigned char)text[bad]);
    return DSC_ERR_USER;
  }
  tk_ids out = {0};
  tk_work w = {0};
  bool ok = true;
  if (add_special)
    for (int64_t i = 0; ok && i < t->tmpl_before.n; i++) ok = ids_put(&out, t->tmpl_before.p[i]);
  /* segments between added tokens; a token's lstrip/rstrip eat the
   * whitespace beside it */
  size_t seg = 0;
  uint8_t first_byte[256] = {0};
  for (int k = 0; k < t->n_added; k++) first_byte[(unsigned char)t->added[k].content[0]] = 1;
  for (size_t i = 0; ok && i <= len; i++) {
    int k = i < len && first_byte[(unsigned char)text[i]] ? added_at(t, text, len, i) : -1;
    if (i < len && k < 0) continue;
    size_t end = i;
    if (k >= 0 && t->added[k].lstrip)
      while (end > seg && is_space((unsigned char)text[end - 1])) end--;
    ok = encode_segment(t, &w, text + seg, end - seg, seg == 0, &out);
    if (k < 0) break;
    ok = ok && ids_put(&out, t->added[k].id);
    i += t->added[k].len;
    if (t->added[k].rstrip)
      while (i < len && is_space((unsigned char)text[i])) i++;
    seg = i;
    i--; /* the loop's i++ */
  }
  if (add_special)
    for (int64_t i = 0; ok && i < t->tmpl_after.n; i++) ok = ids_put(&out, t->tmpl_after.p[i]);
  free(w.sym), free(w.heap);
  if (!ok) {
    free(out.p);
    ir_error(t->ctx, rt_loc(t->path), "out of memory while encoding %zu bytes", len);
    return DSC_ERR_INTERNAL;
  }
  *ids = out.p ? out.p : malloc(1);
  *n_ids = out.n;
  return DSC_OK;
}

/* ------------------------------------------------------------- decoding */

typedef struct {
  tk_bytes *s;
  int64_t n, cap;
} tk_strs;

static bool strs_add(tk_strs *v, const char *s, size_t n) {
  if (v->n == v->cap) {
    int64_t cap = v->cap ? v->cap * 2 : 64;
    tk_bytes *p = realloc(v->s, (size_t)cap * sizeof *p);
    if (!p) return false;
    memset(p + v->cap, 0, (size_t)(cap - v->cap) * sizeof *p);
    v->s = p, v->cap = cap;
  }
  v->s[v->n].n = 0;
  return bytes_put(&v->s[v->n++], s, n);
}

static void strs_free(tk_strs *v) {
  for (int64_t i = 0; i < v->cap; i++) free(v->s[i].p);
  free(v->s);
}

/* Replaces invalid UTF-8 by U+FFFD, one per maximal invalid prefix (as Rust's
 * from_utf8_lossy does). */
static bool lossy_utf8(const char *s, size_t n, tk_bytes *out) {
  out->n = 0;
  for (size_t i = 0; i < n;) {
    size_t ok = rt_utf8_valid_prefix(s + i, n - i);
    if (!bytes_put(out, s + i, ok)) return false;
    i += ok;
    if (i >= n) break;
    /* the longest prefix of a valid sequence counts as one error */
    unsigned char c = (unsigned char)s[i];
    size_t want = (size_t)utf8_len(c), k = 1;
    if (c >= 0xc2 && c <= 0xf4)
      while (k < want && i + k < n && ((unsigned char)s[i + k] & 0xc0) == 0x80 &&
             !(k == 1 && ((c == 0xe0 && (unsigned char)s[i + 1] < 0xa0) ||
                          (c == 0xed && (unsigned char)s[i + 1] > 0x9f) ||
                          (c == 0xf0 && (unsigned char)s[i + 1] < 0x90) ||
                          (c == 0xf4 && (unsigned char)s[i + 1] > 0x8f))))
        k++;
    if (!bytes_put(out, "\xef\xbf\xbd", 3)) return false;
    i += k;
  }
  return out->p || bytes_put(out, "", 0);
}

static int byte_of_cp(uint32_t cp) {
  static int16_t inv[512];
  static bool ready;
  if (!ready) {
    for (int i = 0; i < 512; i++) inv[i] = -1;
    for (unsigned b = 0; b < 256; b++) inv[byte_cp(b)] = (int16_t)b;
    ready = true;
  }
  return cp < 512 ? inv[cp] : -1;
}

static bool dec_step(const tk_step *st, tk_strs *v) {
  tk_bytes tmp = {0};
  bool ok = true;
  switch (st->kind) {
  case DEC_BYTELEVEL: { /* all tokens joined, chars back to bytes, lossy UTF-8 */
    tk_bytes raw = {0};
    for (int64_t i = 0; ok && i < v->n; i++) {
      const char *s = v->s[i].p;
      size_t n = v->s[i].n, at = raw.n;
      bool all = true;
      for (size_t k = 0; ok && k < n;) {
        int cl = utf8_len((unsigned char)s[k]);
        int b = byte_of_cp(first_cp(s + k));
        if (b < 0) {
          all = false;
          break;
        }
        unsigned char c = (unsigned char)b;
        ok = bytes_put(&raw, &c, 1);
        k += (size_t)cl;
      }
      if (!all) raw.n = at, ok = ok && bytes_put(&raw, s, n);
    }
    ok = ok && lossy_utf8(raw.p ? raw.p : "", raw.n, &tmp);
    if (ok) v->n = 0, ok = strs_add(v, tmp.p, tmp.n);
    free(raw.p);
    break;
  }
  case DEC_METASPACE: {
    char rep[5];
    rep[utf8_put(rep, st->repl_cp)] = 0;
    for (int64_t i = 0; ok && i < v->n; i++) {
      tmp.n = 0;
      ok = replace_all(&tmp, v->s[i].p, v->s[i].n, rep, " ");
      size_t skip = i == 0 && st->prepend != PREPEND_NEVER && tmp.n && tmp.p[0] == ' ';
      v->s[i].n = 0;
      ok = ok && bytes_put(&v->s[i], tmp.p + skip, tmp.n - skip);
    }
    break;
  }
  case DEC_REPLACE:
    for (int64_t i = 0; ok && i < v->n; i++) {
      tmp.n = 0;
      ok = replace_all(&tmp, v->s[i].p, v->s[i].n, st->a, st->b);
      v->s[i].n = 0;
      ok = ok && bytes_put(&v->s[i], tmp.p, tmp.n);
    }
    break;
  case DEC_BYTEFALLBACK: { /* runs of <0xXX> tokens become their bytes */
    tk_strs outv = {0};
    tk_bytes run = {0};
    int64_t run_tokens = 0;
    for (int64_t i = 0; ok && i <= v->n; i++) {
      const tk_bytes *s = i < v->n ? &v->s[i] : NULL;
      unsigned hex;
      char tail;
      if (s && s->n == 6 && sscanf(s->p, "<0x%2X%c", &hex, &tail) == 2 && tail == '>' &&
          isxdigit((unsigned char)s->p[3]) && isxdigit((unsigned char)s->p[4])) {
        unsigned char c = (unsigned char)hex;
        ok = bytes_put(&run, &c, 1);
        run_tokens++;
        continue;
      }
      if (run_tokens) { /* a valid run is its text; an invalid one one U+FFFD per token */
        if (rt_utf8_valid_prefix(run.p, run.n) == run.n)
          ok = strs_add(&outv, run.p, run.n);
        else
          for (int64_t k = 0; ok && k < run_tokens; k++) ok = strs_add(&outv, "\xef\xbf\xbd", 3);
        run.n = 0, run_tokens = 0;
      }
      if (s) ok = ok && strs_add(&outv, s->p, s->n);
    }
    free(run.p);
    strs_free(v);
    *v = outv;
    break;
  }
  case DEC_FUSE:
    for (int64_t i = 0; ok && i < v->n; i++) ok = bytes_put(&tmp, v->s[i].p, v->s[i].n);
    if (ok) v->n = 0, ok = strs_add(v, tmp.p ? tmp.p : "", tmp.n);
    break;
  case DEC_STRIP: {
    size_t cl = strlen(st->a);
    for (int64_t i = 0; cl && i < v->n; i++) {
      tk_bytes *s = &v->s[i];
      size_t a = 0, b = s->n;
      for (int k = 0; k < st->start && a + cl <= b && memcmp(s->p + a, st->a, cl) == 0; k++) a += cl;
      for (int k = 0; k < st->stop && b >= a + cl && memcmp(s->p + b - cl, st->a, cl) == 0; k++) b -= cl;
      memmove(s->p, s->p + a, b - a);
      s->n = b - a;
      s->p[s->n] = 0;
    }
    break;
  }
  }
  free(tmp.p);
  return ok;
}

dsc_status dsc_tokenizer_decode(dsc_tokenizer *t, const uint32_t *ids, int64_t n, bool skip_special,
                                char **text, size_t *len) {
  *text = NULL, *len = 0;
  tk_strs v = {0};
  bool ok = true;
  for (int64_t i = 0; ok && i < n; i++) {
    if (ids[i] >= t->n_ids || !t->tok[ids[i]]) {
      strs_free(&v);
      ir_error(t->ctx, rt_loc(t->path), "token id %u at position %" PRId64 " is not in the vocabulary",
               ids[i], i);
      return DSC_ERR_USER;
    }
    if (skip_special && t->is_special[ids[i]]) continue;
    ok = strs_add(&v, t->tok[ids[i]], t->tok_len[ids[i]]);
  }
  for (int i = 0; ok && i < t->n_dec; i++) ok = dec_step(&t->dec[i], &v);
  tk_bytes out = {0};
  for (int64_t i = 0; ok && i < v.n; i++) /* no decoder: the library joins with spaces */
    ok = (t->has_decoder || i == 0 || bytes_put(&out, " ", 1)) && bytes_put(&out, v.s[i].p, v.s[i].n);
  ok = ok && (out.p || bytes_put(&out, "", 0));
  strs_free(&v);
  if (!ok) {
    free(out.p);
    ir_error(t->ctx, rt_loc(t->path), "out of memory while decoding %" PRId64 " ids", n);
    return DSC_ERR_INTERNAL;
  }
  *text = out.p, *len = out.n;
  return DSC_OK;
}
