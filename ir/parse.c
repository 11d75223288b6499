/* Parser for the text form printed by ir/print.c (hand-written recursive
 * descent; the grammar is flat, so recursion depth is bounded).
 *
 *   module   := 'module' name { meta | param | graph }
 *   meta     := 'meta' STRING '=' STRING
 *   param    := ('param' | 'state') name ':' type '=' init
 *   init     := 'zeros' | 'ones' | 'const' '(' num ')'
 *             | ('normal' | 'uniform') '(' num ',' num ')'
 *   graph    := 'graph' name '(' [ VALUE ':' type { ',' VALUE ':' type } ] ')' '{'
 *               { VALUE '=' op [ '(' [ VALUE { ',' VALUE } ] ')' ]
 *                 [ '{' [ attr { ',' attr } ] '}' ] ':' type [ 'group' INT ] [ 'host' ]
 *                 [ ('when' | 'unless') VALUE ] }
 *               'return' VALUE { ',' VALUE } '}'
 *   attr     := IDENT '=' (num | 'true' | 'false' | dtype | STRING | '[' [int {',' int}] ']')
 *   type     := dtype '[' [ int { ',' int } ] ']'
 *   name     := IDENT | STRING            IDENT := [A-Za-z_][A-Za-z0-9_.]*
 *   VALUE    := '%' [A-Za-z0-9_.]+ | '%' STRING
 *
 * `//` starts a comment. Errors are diagnostics at the offending token;
 * after an error in a line the parser resumes at the next line, so one run
 * reports several independent errors. The verifier runs when the text
 * parsed cleanly (types against the shape rules, params, SSA). */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ir/ir.h"

#define MAX_ERRORS 25

typedef enum {
  T_EOF,
  T_ERROR, /* a lexical error, already reported */
  T_IDENT,
  T_VALUE,
  T_STRING,
  T_INT,
  T_FLOAT,
  T_LPAREN,
  T_RPAREN,
  T_LBRACE,
  T_RBRACE,
  T_LBRACKET,
  T_RBRACKET,
  T_COMMA,
  T_EQ,
  T_COLON,
} tok_kind;

typedef struct {
  tok_kind kind;
  int line, col;
  const char *start; /* into the source text */
  size_t len;
  int64_t i;
  double f;
  /* T_STRING and quoted T_VALUE: decoded text in parser.sbuf */
  bool quoted;
} token;

/* Symbol table of one graph: value name -> node (NULL: its line failed). */
typedef struct {
  const char *key;
  size_t len;
  ir_node *node;
  bool used;
} sym;

typedef struct {
  dsc_context *ctx;
  const char *file; /* arena copy, referenced by node locations */
  const char *src;
  size_t len, pos;
  int line, col;
  token tok;
  char *sbuf; /* decoded string of the current token */
  size_t sbuf_len, sbuf_cap;
  ir_module *m;
  int errors;
  bool oom, stop;
  bool eof_reported; /* a truncated file gets one error, not one per open construct */
  sym *syms;
  size_t nsyms, cap_syms;
  ir_node **ins;
  int cap_ins;
  int64_t *ints[5];
  int cap_ints[5];
} parser;

/* ---------------- diagnostics ---------------- */

static dsc_loc loc_at(parser *p, int line, int col) {
  dsc_loc l = {p->file, line, col};
  return l;
}

static void error_at(parser *p, int line, int col, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void error_at(parser *p, int line, int col, const char *fmt, ...) {
  if (p->stop) return;
  va_list ap;
  va_start(ap, fmt);
  ir_diag_v(p->ctx, DSC_DIAG_ERROR, loc_at(p, line, col), fmt, ap);
  va_end(ap);
  if (++p->errors >= MAX_ERRORS) {
    ir_error(p->ctx, loc_at(p, line, col), "too many errors; stopping");
    p->stop = true;
  }
}

static void out_of_memory(parser *p) {
  if (!p->oom) ir_error(p->ctx, ir_no_loc, "out of memory while parsing %s", p->file);
  p->oom = p->stop = true;
}

/* ---------------- lexer ---------------- */

static bool is_alpha(int c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
static bool is_digit(int c) { return c >= '0' && c <= '9'; }
static bool is_ident_char(int c) { return is_alpha(c) || is_digit(c) || c == '.'; }

static int peekc(parser *p, size_t ahead) {
  return p->pos + ahead < p->len ? (unsigned char)p->src[p->pos + ahead] : -1;
}

static void advance(parser *p) {
  if (p->pos >= p->len) return;
  if (p->src[p->pos] == '\n') {
    p->line++;
    p->col = 1;
  } else {
    p->col++;
  }
  p->pos++;
}

static bool sbuf_put(parser *p, char c) {
  if (p->sbuf_len + 2 > p->sbuf_cap) {
    size_t cap = p->sbuf_cap ? p->sbuf_cap * 2 : 64;
    char *b = ir_realloc(p->ctx, p->sbuf, p->sbuf_cap, cap);
    if (!b) {
      out_of_memory(p);
      return false;
    }
    p->sbuf = b;
    p->sbuf_cap = cap;
  }
  p->sbuf[p->sbuf_len++] = c;
  p->sbuf[p->sbuf_len] = 0;
  return true;
}

static int hexval(int c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/* After an error inside a string: moves past its closing quote (or to the
 * end of the line) so that its rest is not read as tokens. */
static bool skip_string(parser *p) {
  for (;;) {
    int c = peekc(p, 0);
    if (c < 0 || c == '\n') return false;
    advance(p);
    if (c == '"') return false;
    if (c == '\\' && peekc(p, 0) != '\n') advance(p);
  }
}

/* Reads a "..." string at pos into sbuf; false after reporting an error. */
static bool lex_string(parser *p) {
  int line = p->line, col = p->col;
  p->sbuf_len = 0;
  if (!sbuf_put(p, 0)) return false;
  p->sbuf_len = 0;
  advance(p); /* opening quote */
  for (;;) {
    int c = peekc(p, 0);
    if (c < 0 || c == '\n') {
      error_at(p, line, col, "unterminated string");
      return false;
    }
    if (c == '"') {
      advance(p);
      return true;
    }
    if (c == '\\') {
      int ecol = p->col, e = peekc(p, 1);
      char out;
      int skip = 2;
      switch (e) {
        case '"':
          out = '"';
          break;
        case '\\':
          out = '\\';
          break;
        case 'n':
          out = '\n';
          break;
        case 't':
          out = '\t';
          break;
        case 'r':
          out = '\r';
          break;
        case 'x': {
          int h1 = hexval(peekc(p, 2)), h2 = hexval(peekc(p, 3));
          if (h1 < 0 || h2 < 0 || (h1 == 0 && h2 == 0)) {
            error_at(p, p->line, ecol, "invalid \\x escape (two hex digits, not 00)");
            return skip_string(p);
          }
          out = (char)(h1 * 16 + h2);
          skip = 4;
          break;
        }
        default:
          error_at(p, p->line, ecol, "unknown escape sequence in string");
          return skip_string(p);
      }
      for (int k = 0; k < skip; k++) advance(p);
      if (!sbuf_put(p, out)) return false;
      continue;
    }
    if (c == 0) {
      error_at(p, p->line, p->col, "NUL byte in string");
      return skip_string(p);
    }
    advance(p);
    if (!sbuf_put(p, (char)c)) return false;
  }
}

/* Numbers: [+-]? digits [. digits*] [(e|E) [+-]? digits], or [+-]?inf, nan.
 * The whole run of number-like characters is taken so that "12ab" is one
 * bad number rather than a number and an identifier. */
static void lex_number(parser *p, token *t) {
  size_t s = p->pos, e = s;
  if (e < p->len && (p->src[e] == '-' || p->src[e] == '+')) e++;
  while (e < p->len) {
    char c = p->src[e];
    if (is_ident_char(c))
      e++;
    else if ((c == '-' || c == '+') && e > s && (p->src[e - 1] == 'e' || p->src[e - 1] == 'E'))
      e++;
    else
      break;
  }
  size_t n = e - s;
  char buf[64];
  bool ok = n < sizeof buf;
  if (ok) {
    memcpy(buf, p->src + s, n);
    buf[n] = 0;
  }
  /* validate the grammar */
  bool is_float = false;
  if (ok) {
    const char *q = buf;
    if (*q == '-' || *q == '+') q++;
    if (strcmp(q, "inf") == 0) {
      is_float = true;
    } else {
      if (!is_digit(*q)) ok = false;
      while (is_digit(*q)) q++;
      if (*q == '.') {
        is_float = true;
        q++;
        while (is_digit(*q)) q++;
      }
      if (*q == 'e' || *q == 'E') {
        is_float = true;
        q++;
        if (*q == '-' || *q == '+') q++;
        if (!is_digit(*q)) ok = false;
        while (is_digit(*q)) q++;
      }
      if (*q) ok = false;
    }
  }
  t->start = p->src + s;
  t->len = n;
  int line = p->line, col = p->col;
  while (p->pos < e) advance(p);
  if (!ok) {
    error_at(p, line, col, "invalid number '%.*s'", (int)(n > 40 ? 40 : n), p->src + s);
    t->kind = T_ERROR;
    return;
  }
  errno = 0;
  if (is_float) {
    t->kind = T_FLOAT;
    t->f = strtod(buf, NULL);
    if (isinf(t->f) && !strstr(buf, "inf")) {
      error_at(p, line, col, "number '%s' is out of range", buf);
      t->kind = T_ERROR;
    }
  } else {
    t->kind = T_INT;
    t->i = strtoll(buf, NULL, 10);
    t->f = (double)t->i;
    if (errno == ERANGE) {
      error_at(p, line, col, "integer '%s' is out of range", buf);
      t->kind = T_ERROR;
    }
  }
}

static void next(parser *p) {
  token *t = &p->tok;
  for (;;) { /* skip white space and comments */
    int c = peekc(p, 0);
    if (c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\f' || c == '\v')
      advance(p);
    else if (c == '/' && peekc(p, 1) == '/')
      while (p->pos < p->len && p->src[p->pos] != '\n') advance(p);
    else
      break;
  }
  memset(t, 0, sizeof *t);
  t->line = p->line;
  t->col = p->col;
  t->start = p->src + p->pos;
  int c = peekc(p, 0);
  if (c < 0 || p->oom) { /* after running out of memory, read nothing more */
    t->kind = T_EOF;
    return;
  }
  static const char punct[] = "(){}[],=:";
  static const tok_kind pkind[] = {T_LPAREN,   T_RPAREN, T_LBRACE, T_RBRACE, T_LBRACKET,
                                   T_RBRACKET, T_COMMA,  T_EQ,     T_COLON};
  const char *pc = c ? strchr(punct, c) : NULL;
  if (pc) {
    t->kind = pkind[pc - punct];
    t->len = 1;
    advance(p);
    return;
  }
  if (is_digit(c) || ((c == '-' || c == '+') && (is_digit(peekc(p, 1)) || peekc(p, 1) == 'i'))) {
    lex_number(p, t);
    return;
  }
  if (is_alpha(c)) {
    size_t s = p->pos;
    while (p->pos < p->len && is_ident_char((unsigned char)p->src[p->pos])) advance(p);
    t->kind = T_IDENT; /* also "inf" and "nan": names may be spelled so */
    t->len = p->pos - s;
    return;
  }
  if (c == '"') {
    t->kind = lex_string(p) ? T_STRING : T_ERROR;
    t->quoted = true;
    t->len = (size_t)(p->src + p->pos - t->start);
    return;
  }
  if (c == '%') {
    advance(p);
    if (peekc(p, 0) == '"') {
      t->kind = lex_string(p) ? T_VALUE : T_ERROR;
      t->quoted = true;
      if (t->kind == T_VALUE && p->sbuf_len == 0) {
        error_at(p, t->line, t->col, "empty value name");
        t->kind = T_ERROR;
      }
      t->len = (size_t)(p->src + p->pos - t->start);
      return;
    }
    size_t s = p->pos;
    while (p->pos < p->len && is_ident_char((unsigned char)p->src[p->pos])) advance(p);
    if (p->pos == s) {
      error_at(p, t->line, t->col, "expected a value name after '%%'");
      t->kind = T_ERROR;
      return;
    }
    t->kind = T_VALUE;
    t->len = (size_t)(p->src + p->pos - t->start);
    return;
  }
  if (c >= 0x21 && c < 0x7f)
    error_at(p, t->line, t->col, "unexpected character '%c'", c);
  else
    error_at(p, t->line, t->col, "unexpected byte 0x%02x", c);
  advance(p);
  t->kind = T_ERROR;
}

/* ---------------- token helpers ---------------- */

static bool is_word(const token *t, const char *w) {
  return t->kind == T_IDENT && strlen(w) == t->len && memcmp(t->start, w, t->len) == 0;
}

static const char *kind_desc(tok_kind k) {
  switch (k) {
    case T_EOF:
      return "end of input";
    case T_ERROR:
      return "invalid token";
    case T_IDENT:
      return "identifier";
    case T_VALUE:
      return "value";
    case T_STRING:
      return "string";
    case T_INT:
      return "integer";
    case T_FLOAT:
      return "float";
    case T_LPAREN:
      return "'('";
    case T_RPAREN:
      return "')'";
    case T_LBRACE:
      return "'{'";
    case T_RBRACE:
      return "'}'";
    case T_LBRACKET:
      return "'['";
    case T_RBRACKET:
      return "']'";
    case T_COMMA:
      return "','";
    case T_EQ:
      return "'='";
    case T_COLON:
      return "':'";
  }
  return "token";
}

/* Reports "expected X, got Y" at the current token (lexical errors were
 * already reported, so they add nothing). */
static bool expected(parser *p, const char *what) {
  token *t = &p->tok;
  if (t->kind == T_ERROR) return false;
  if (t->kind == T_EOF) {
    error_at(p, t->line, t->col, "expected %s, got end of input", what);
    p->eof_reported = true;
  } else if (t->kind == T_IDENT || t->kind == T_INT || t->kind == T_FLOAT || t->kind == T_VALUE)
    error_at(p, t->line, t->col, "expected %s, got '%.*s'", what, (int)(t->len > 40 ? 40 : t->len),
             t->start);
  else
    error_at(p, t->line, t->col, "expected %s, got %s", what, kind_desc(t->kind));
  return false;
}

static bool accept(parser *p, tok_kind k) {
  if (p->tok.kind != k) return false;
  next(p);
  return true;
}

static bool expect(parser *p, tok_kind k, const char *what) {
  if (accept(p, k)) return true;
  return expected(p, what);
}

/* Skips to the first token of a later line than `line` (error recovery). */
static void skip_line(parser *p, int line) {
  if (p->tok.kind == T_EOF || p->tok.line > line) return;
  /* Tokens never span lines, so the lexer is still on the token's line:
   * drop raw characters (the rest of a bad line may not even lex) up to
   * the end of `line`, then read the next token normally. */
  while (p->pos < p->len && p->line <= line) advance(p);
  next(p);
}

/* The current name token (IDENT or STRING) copied into the arena. */
static const char *take_name(parser *p, const char *what) {
  token *t = &p->tok;
  const char *s = NULL;
  if (t->kind == T_IDENT)
    s = ir_arena_strndup(&p->m->arena, t->start, t->len);
  else if (t->kind == T_STRING)
    s = ir_arena_strdup(&p->m->arena, p->sbuf);
  else
    return expected(p, what), NULL;
  if (!s) return out_of_memory(p), NULL;
  next(p);
  return s;
}

/* ---------------- symbols ---------------- */

static uint64_t hash_bytes(const char *s, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
  return h;
}

static sym *sym_find(parser *p, const char *key, size_t len) {
  if (!p->cap_syms) return NULL;
  size_t i = hash_bytes(key, len) & (p->cap_syms - 1);
  while (p->syms[i].used) {
    if (p->syms[i].len == len && memcmp(p->syms[i].key, key, len) == 0) return &p->syms[i];
    i = (i + 1) & (p->cap_syms - 1);
  }
  return NULL;
}

static bool sym_add(parser *p, const char *key, size_t len, ir_node *node) {
  if ((p->nsyms + 1) * 2 > p->cap_syms) {
    size_t cap = p->cap_syms ? p->cap_syms * 2 : 64;
    sym *s = ir_alloc(p->ctx, sizeof(sym) * cap);
    if (!s) return out_of_memory(p), false;
    memset(s, 0, sizeof(sym) * cap);
    for (size_t i = 0; i < p->cap_syms; i++)
      if (p->syms[i].used) {
        size_t j = hash_bytes(p->syms[i].key, p->syms[i].len) & (cap - 1);
        while (s[j].used) j = (j + 1) & (cap - 1);
        s[j] = p->syms[i];
      }
    ir_free(p->ctx, p->syms, sizeof(sym) * p->cap_syms);
    p->syms = s;
    p->cap_syms = cap;
  }
  size_t i = hash_bytes(key, len) & (p->cap_syms - 1);
  while (p->syms[i].used) i = (i + 1) & (p->cap_syms - 1);
  p->syms[i] = (sym){key, len, node, true};
  p->nsyms++;
  return true;
}

static void sym_clear(parser *p) {
  if (p->syms) memset(p->syms, 0, sizeof(sym) * p->cap_syms);
  p->nsyms = 0;
}

/* The name of the current T_VALUE token: a slice of the source or, when
 * quoted, the decoded text (copied to the arena, as it must outlive sbuf). */
static bool value_key(parser *p, const char **key, size_t *len) {
  if (p->tok.quoted) {
    char *k = ir_arena_strdup(&p->m->arena, p->sbuf);
    if (!k) return out_of_memory(p), false;
    *key = k;
    *len = strlen(k);
  } else {
    *key = p->tok.start + 1;
    *len = p->tok.len - 1;
  }
  return true;
}

static void value_name_desc(const char *key, size_t len, char *buf, size_t n) {
  snprintf(buf, n, "%%%.*s", (int)(len > 60 ? 60 : len), key);
}

/* ---------------- types and numbers ---------------- */

static bool parse_dtype(parser *p, dsc_dtype *dt) {
  token *t = &p->tok;
  if (t->kind != T_IDENT) return expected(p, "a dtype");
  char buf[16];
  if (t->len >= sizeof buf) {
    error_at(p, t->line, t->col, "unknown dtype '%.*s'", (int)(t->len > 40 ? 40 : t->len),
             t->start);
    return false;
  }
  memcpy(buf, t->start, t->len);
  buf[t->len] = 0;
  if (dsc_dtype_from_name(buf, dt) != 0) {
    error_at(p, t->line, t->col, "unknown dtype '%s'", buf);
    return false;
  }
  next(p);
  return true;
}

static bool parse_type(parser *p, dsc_type *out) {
  dsc_type t;
  memset(&t, 0, sizeof t);
  if (!parse_dtype(p, &t.dtype)) return false;
  if (!expect(p, T_LBRACKET, "'[' after the dtype")) return false;
  if (!accept(p, T_RBRACKET)) {
    for (;;) {
      token *d = &p->tok;
      if (d->kind != T_INT) return expected(p, "a dimension");
      if (t.rank == DSC_MAX_RANK) {
        error_at(p, d->line, d->col, "too many dimensions (the maximum rank is %d)", DSC_MAX_RANK);
        return false;
      }
      if (d->i <= 0) {
        error_at(p, d->line, d->col, "dimension %lld is not positive", (long long)d->i);
        return false;
      }
      t.dims[t.rank++] = d->i;
      next(p);
      if (accept(p, T_RBRACKET)) break;
      if (!expect(p, T_COMMA, "',' or ']'")) return false;
    }
  }
  *out = t;
  return true;
}

/* The current token as a float: a number, inf or nan. */
static bool number_value(const token *t, double *v) {
  if (t->kind == T_FLOAT || t->kind == T_INT)
    *v = t->f;
  else if (is_word(t, "inf"))
    *v = INFINITY;
  else if (is_word(t, "nan"))
    *v = NAN;
  else
    return false;
  return true;
}

static bool parse_float(parser *p, double *v) {
  if (!number_value(&p->tok, v)) return expected(p, "a number");
  next(p);
  return true;
}

/* ---------------- module-level lines ---------------- */

static void parse_meta(parser *p) {
  int line = p->tok.line;
  next(p);
  token kt = p->tok;
  if (p->tok.kind != T_STRING) {
    expected(p, "a quoted meta key");
    return skip_line(p, line);
  }
  char *key = ir_arena_strdup(&p->m->arena, p->sbuf);
  if (!key) return out_of_memory(p);
  next(p);
  if (!expect(p, T_EQ, "'='")) return skip_line(p, line);
  if (p->tok.kind != T_STRING) {
    expected(p, "a quoted meta value");
    return skip_line(p, line);
  }
  if (dsc_module_get_meta(p->m, key)) {
    error_at(p, kt.line, kt.col, "meta key \"%s\" is given twice", key);
    return skip_line(p, line);
  }
  if (dsc_module_set_meta(p->m, key, p->sbuf) != DSC_OK) return out_of_memory(p);
  next(p);
}

static void parse_param(parser *p, bool state) {
  int line = p->tok.line;
  next(p);
  token nt = p->tok;
  const char *name = take_name(p, "a parameter name");
  if (!name) return skip_line(p, line);
  if (dsc_module_find_param(p->m, name) >= 0) {
    error_at(p, nt.line, nt.col, "parameter '%s' is declared twice", name);
    return skip_line(p, line);
  }
  dsc_type type;
  if (!expect(p, T_COLON, "':'") || !parse_type(p, &type) || !expect(p, T_EQ, "'='"))
    return skip_line(p, line);
  dsc_init init = {DSC_INIT_ZEROS, 0, 0, NULL};
  token it = p->tok;
  int nargs = 0;
  if (is_word(&it, "zeros"))
    init.kind = DSC_INIT_ZEROS;
  else if (is_word(&it, "ones"))
    init.kind = DSC_INIT_ONES;
  else if (is_word(&it, "const"))
    init.kind = DSC_INIT_CONST, nargs = 1;
  else if (is_word(&it, "normal"))
    init.kind = DSC_INIT_NORMAL, nargs = 2;
  else if (is_word(&it, "uniform"))
    init.kind = DSC_INIT_UNIFORM, nargs = 2;
  else if (is_word(&it, "copy"))
    init.kind = DSC_INIT_COPY;
  else {
    expected(p, "an initializer (zeros, ones, const, normal, uniform, copy)");
    return skip_line(p, line);
  }
  next(p);
  if (nargs > 0) {
    if (!expect(p, T_LPAREN, "'('") || !parse_float(p, &init.a)) return skip_line(p, line);
    if (nargs == 2 && (!expect(p, T_COMMA, "','") || !parse_float(p, &init.b)))
      return skip_line(p, line);
    if (!expect(p, T_RPAREN, "')'")) return skip_line(p, line);
  }
  if (init.kind == DSC_INIT_COPY) {
    if (!expect(p, T_LPAREN, "'('") || !(init.from = take_name(p, "the name of the parameter copied")) ||
        !expect(p, T_RPAREN, "')'"))
      return skip_line(p, line);
  }
  if ((state ? dsc_module_add_state : dsc_module_add_param)(p->m, name, type, init) != DSC_OK)
    out_of_memory(p);
}

/* ---------------- graphs ---------------- */

/* Resolves the current T_VALUE token to a node. *node is NULL (with true
 * returned) when the value's own line failed, so no new error is due. */
static bool use_value(parser *p, ir_node **node) {
  if (p->tok.kind != T_VALUE) return expected(p, "a value (%name)");
  const char *key;
  size_t len;
  if (!value_key(p, &key, &len)) return false;
  sym *s = sym_find(p, key, len);
  if (!s) {
    char d[80];
    value_name_desc(key, len, d, sizeof d);
    error_at(p, p->tok.line, p->tok.col, "use of undefined value %s", d);
    return false;
  }
  *node = s->node;
  next(p);
  return true;
}

static bool grow_ins(parser *p, int need) {
  if (need <= p->cap_ins) return true;
  int cap = p->cap_ins ? p->cap_ins * 2 : 8;
  while (cap < need) cap *= 2;
  ir_node **b = ir_realloc(p->ctx, p->ins, sizeof(ir_node *) * (size_t)p->cap_ins,
                           sizeof(ir_node *) * (size_t)cap);
  if (!b) return out_of_memory(p), false;
  p->ins = b;
  p->cap_ins = cap;
  return true;
}

static bool push_int(parser *p, int slot, int *n, int64_t v) {
  if (*n == p->cap_ints[slot]) {
    int cap = p->cap_ints[slot] ? p->cap_ints[slot] * 2 : 8;
    int64_t *b = ir_realloc(p->ctx, p->ints[slot], sizeof(int64_t) * (size_t)p->cap_ints[slot],
                            sizeof(int64_t) * (size_t)cap);
    if (!b) return out_of_memory(p), false;
    p->ints[slot] = b;
    p->cap_ints[slot] = cap;
  }
  p->ints[slot][(*n)++] = v;
  return true;
}

static const char *attr_kind_name(dsc_attr_kind k) {
  static const char *names[] = {"an int",       "a float", "a bool",
                                "an ints list", "a dtype", "a string"};
  return (unsigned)k < 6 ? names[k] : "?";
}

/* Parses one attribute value of the expected kind into *a (ints go to slot). */
static bool parse_attr_value(parser *p, const char *op, const char *key, dsc_attr_kind kind,
                             int slot, dsc_attr *a) {
  token *t = &p->tok;
  a->kind = kind;
  bool ok = false;
  switch (kind) {
    case DSC_ATTR_INT:
      if ((ok = t->kind == T_INT)) a->u.i = t->i;
      break;
    case DSC_ATTR_FLOAT:
      ok = number_value(t, &a->u.f);
      break;
    case DSC_ATTR_BOOL:
      if ((ok = is_word(t, "true") || is_word(t, "false"))) a->u.b = is_word(t, "true");
      break;
    case DSC_ATTR_DTYPE:
      if (t->kind == T_IDENT) return parse_dtype(p, &a->u.dt);
      break;
    case DSC_ATTR_STR:
      if (t->kind == T_STRING) {
        a->u.s = ir_arena_strdup(&p->m->arena, p->sbuf);
        if (!a->u.s) return out_of_memory(p), false;
        ok = true;
      }
      break;
    case DSC_ATTR_INTS:
      if (t->kind == T_LBRACKET) {
        int n = 0;
        next(p);
        if (!accept(p, T_RBRACKET)) {
          for (;;) {
            if (p->tok.kind != T_INT) return expected(p, "an integer");
            if (!push_int(p, slot, &n, p->tok.i)) return false;
            next(p);
            if (accept(p, T_RBRACKET)) break;
            if (!expect(p, T_COMMA, "',' or ']'")) return false;
          }
        }
        a->u.ints.v = p->ints[slot];
        a->u.ints.n = n;
        return true;
      }
      break;
  }
  if (!ok) {
    if (t->kind == T_ERROR) return false;
    error_at(p, t->line, t->col, "attribute '%s' of '%s' must be %s", key, op,
             attr_kind_name(kind));
    return false;
  }
  next(p);
  return true;
}

/* Skips an attribute value of unknown kind (after reporting its key). */
static void skip_attr_value(parser *p) {
  if (accept(p, T_LBRACKET)) {
    while (p->tok.kind != T_RBRACKET && p->tok.kind != T_EOF && p->tok.kind != T_RBRACE) next(p);
    accept(p, T_RBRACKET);
  } else if (p->tok.kind != T_EOF) {
    next(p);
  }
}

/* `{k = v, ...}` for op `info`, in any order; out gets the op's order. */
static bool parse_attrs(parser *p, const ir_op_info *info, dsc_attr *out) {
  token open = p->tok;
  bool have[IR_MAX_OP_ATTRS] = {false};
  bool ok = true;
  if (accept(p, T_LBRACE) && !accept(p, T_RBRACE)) {
    for (;;) {
      token kt = p->tok;
      if (kt.kind != T_IDENT) return expected(p, "an attribute name");
      int k = -1;
      for (int j = 0; j < info->n_attrs; j++)
        if (is_word(&kt, info->attr_keys[j])) k = j;
      next(p);
      if (!expect(p, T_EQ, "'='")) return false;
      if (k < 0) {
        error_at(p, kt.line, kt.col, "op '%s' has no attribute '%.*s' (it takes: %s)", info->name,
                 (int)(kt.len > 40 ? 40 : kt.len), kt.start,
                 info->n_attrs ? info->attr_spec : "none");
        ok = false;
        skip_attr_value(p);
      } else if (have[k]) {
        error_at(p, kt.line, kt.col, "attribute '%s' is given twice", info->attr_keys[k]);
        return false;
      } else {
        out[k].key = info->attr_keys[k];
        if (!parse_attr_value(p, info->name, info->attr_keys[k], info->attr_kinds[k], k, &out[k]))
          return false;
        have[k] = true;
      }
      if (accept(p, T_RBRACE)) break;
      if (!expect(p, T_COMMA, "',' or '}'")) return false;
    }
  }
  if (!ok) return false;
  for (int k = 0; k < info->n_attrs; k++)
    if (!have[k]) {
      /* point at the attribute block when there is one, else at the ':' */
      token *at = open.kind == T_LBRACE ? &open : &p->tok;
      error_at(p, at->line, at->col, "op '%s' needs attribute '%s' (%s)", info->name,
               info->attr_keys[k], attr_kind_name(info->attr_kinds[k]));
      return false;
    }
  return true;
}

/* One node line; on error the caller skips to the next line. The result
 * name is defined either way (as NULL on failure) to avoid cascades. */
static bool parse_node(parser *p, ir_graph *g) {
  token vt = p->tok;
  const char *key;
  size_t len;
  if (!value_key(p, &key, &len)) return false;
  char desc[80];
  value_name_desc(key, len, desc, sizeof desc);
  if (sym_find(p, key, len)) {
    error_at(p, vt.line, vt.col, "redefinition of value %s", desc);
    return false;
  }
  /* from here on the name is defined (possibly as failed) */
  if (!sym_add(p, key, len, NULL)) return false;
  next(p);
  if (!expect(p, T_EQ, "'='")) return false;
  token ot = p->tok;
  if (ot.kind != T_IDENT) return expected(p, "an op name");
  char opname[32];
  dsc_op op;
  if (ot.len >= sizeof opname) {
    error_at(p, ot.line, ot.col, "unknown op '%.*s'", (int)(ot.len > 40 ? 40 : ot.len), ot.start);
    return false;
  }
  memcpy(opname, ot.start, ot.len);
  opname[ot.len] = 0;
  if (dsc_op_from_name(opname, &op) != 0) {
    error_at(p, ot.line, ot.col, "unknown op '%s'", opname);
    return false;
  }
  if (op == DSC_OP_INPUT) {
    error_at(p, ot.line, ot.col, "graph inputs are declared in the graph's signature");
    return false;
  }
  const ir_op_info *info = ir_op(op);
  next(p);
  int n_in = 0;
  bool inputs_failed = false;
  if (accept(p, T_LPAREN) && !accept(p, T_RPAREN)) {
    for (;;) {
      ir_node *in = NULL;
      if (!use_value(p, &in) || !grow_ins(p, n_in + 1)) return false;
      if (!in) inputs_failed = true;
      p->ins[n_in++] = in;
      if (accept(p, T_RPAREN)) break;
      if (!expect(p, T_COMMA, "',' or ')'")) return false;
    }
  }
  if (info->n_inputs >= 0 ? n_in != info->n_inputs : n_in < 1) {
    if (info->n_inputs >= 0)
      error_at(p, ot.line, ot.col, "op '%s' takes %d input(s), got %d", opname, info->n_inputs,
               n_in);
    else
      error_at(p, ot.line, ot.col, "op '%s' takes at least 1 input, got %d", opname, n_in);
    return false;
  }
  dsc_attr attrs[IR_MAX_OP_ATTRS];
  memset(attrs, 0, sizeof attrs);
  if (p->tok.kind == T_LBRACE || info->n_attrs > 0)
    if (!parse_attrs(p, info, attrs)) return false;
  dsc_type type;
  if (!expect(p, T_COLON, "':' and the value's type") || !parse_type(p, &type)) return false;
  int group = 0; /* fusion group (passes/fuse.c) */
  if (is_word(&p->tok, "group")) {
    next(p);
    token gt = p->tok;
    if (gt.kind != T_INT) return expected(p, "a group number after 'group'");
    if (gt.i <= 0 || gt.i > INT32_MAX) {
      error_at(p, gt.line, gt.col, "group number %lld is out of range [1, %d]", (long long)gt.i,
               INT32_MAX);
      return false;
    }
    group = (int)gt.i;
    next(p);
  }
  bool host = is_word(&p->tok, "host"); /* placement (passes/offload_host.c) */
  if (host) next(p);
  ir_node *guard = NULL; /* passes/guard.c; the verifier checks it */
  bool guard_if = is_word(&p->tok, "when");
  if (guard_if || is_word(&p->tok, "unless")) {
    next(p);
    if (!use_value(p, &guard)) return false;
    if (!guard) inputs_failed = true;
  }
  if (inputs_failed) return false; /* an input's line failed and was reported */
  ir_node *n = ir_node_new_raw(g, op, type, p->ins, n_in, attrs, info->n_attrs);
  if (!n) return out_of_memory(p), false;
  n->loc = loc_at(p, vt.line, vt.col);
  n->group = group;
  if (host) n->place = IR_PLACE_HOST;
  n->guard = guard, n->guard_if = guard_if;
  sym_find(p, key, len)->node = n;
  return true;
}

/* Skips the rest of a graph whose header failed: up to its closing '}'. */
static void skip_graph(parser *p) {
  while (p->tok.kind != T_EOF && p->tok.kind != T_LBRACE) next(p);
  int depth = 0;
  while (p->tok.kind != T_EOF) {
    if (p->tok.kind == T_LBRACE) depth++;
    if (p->tok.kind == T_RBRACE && --depth == 0) {
      next(p);
      return;
    }
    next(p);
  }
}

static bool parse_signature(parser *p, ir_graph *g) {
  if (!expect(p, T_LPAREN, "'('")) return false;
  if (accept(p, T_RPAREN)) return true;
  for (;;) {
    token vt = p->tok;
    if (vt.kind != T_VALUE) return expected(p, "an input (%name)");
    const char *key;
    size_t len;
    if (!value_key(p, &key, &len)) return false;
    char desc[80];
    value_name_desc(key, len, desc, sizeof desc);
    if (sym_find(p, key, len)) {
      error_at(p, vt.line, vt.col, "redefinition of value %s", desc);
      return false;
    }
    if (len == 0 || strspn(key, "0123456789") >= len) { /* %0, %1: the other values */
      error_at(p, vt.line, vt.col, "graph input %s must be named, not numbered", desc);
      return false;
    }
    next(p);
    dsc_type type;
    if (!expect(p, T_COLON, "':'") || !parse_type(p, &type)) return false;
    char *name = ir_arena_strndup(&p->m->arena, key, len);
    if (!name) return out_of_memory(p), false;
    ir_node *n = dsc_graph_input(g, name, type);
    if (!n) return out_of_memory(p), false;
    n->loc = loc_at(p, vt.line, vt.col);
    if (!sym_add(p, key, len, n)) return false;
    if (accept(p, T_RPAREN)) return true;
    if (!expect(p, T_COMMA, "',' or ')'")) return false;
  }
}

static void parse_graph(parser *p) {
  next(p);
  token nt = p->tok;
  sym_clear(p);
  const char *name = take_name(p, "a graph name");
  if (!name) return skip_graph(p);
  if (dsc_module_find_graph(p->m, name)) {
    error_at(p, nt.line, nt.col, "graph '%s' is defined twice", name);
    return skip_graph(p);
  }
  ir_graph *g = dsc_graph_new(p->m, name);
  if (!g) return out_of_memory(p);
  if (!parse_signature(p, g) || !expect(p, T_LBRACE, "'{'")) return skip_graph(p);
  bool returned = false;
  while (!p->stop) {
    token t = p->tok;
    if (t.kind == T_RBRACE) {
      if (!returned) error_at(p, t.line, t.col, "graph '%s' has no return statement", name);
      next(p);
      break;
    }
    if (t.kind == T_EOF) {
      if (!p->eof_reported)
        error_at(p, t.line, t.col, "unexpected end of input in graph '%s' (missing '}')", name);
      break;
    }
    if (returned) {
      if (t.kind != T_ERROR) error_at(p, t.line, t.col, "expected '}' after the return statement");
      skip_line(p, t.line);
      continue;
    }
    if (t.kind == T_VALUE) {
      if (!parse_node(p, g)) skip_line(p, p->tok.line > t.line ? p->tok.line - 1 : t.line);
      continue;
    }
    if (is_word(&t, "return")) {
      next(p);
      returned = true;
      ir_node *outs[64], **o = outs;
      int n = 0, cap = 64;
      bool ok = true, failed_in = false;
      for (;;) {
        ir_node *v = NULL;
        if (!use_value(p, &v)) {
          ok = false;
          break;
        }
        if (!v) failed_in = true;
        if (n == cap) { /* many outputs: move to a growable arena copy */
          ir_node **b = ir_arena_alloc(&p->m->arena, sizeof(ir_node *) * (size_t)cap * 2);
          if (!b) return out_of_memory(p);
          memcpy(b, o, sizeof(ir_node *) * (size_t)n);
          o = b;
          cap *= 2;
        }
        o[n++] = v;
        if (!accept(p, T_COMMA)) break;
      }
      if (ok && !failed_in && dsc_graph_set_outputs(g, o, n) != DSC_OK) return out_of_memory(p);
      if (!ok) skip_line(p, p->tok.line > t.line ? p->tok.line - 1 : t.line);
      continue;
    }
    if (is_word(&t, "graph") || is_word(&t, "param") || is_word(&t, "state") ||
        is_word(&t, "meta")) {
      error_at(p, t.line, t.col, "expected '}' to close graph '%s' before '%.*s'", name, (int)t.len,
               t.start);
      break;
    }
    expected(p, "a node (%name = ...), 'return' or '}'");
    skip_line(p, t.line);
  }
  g->cur_loc = ir_no_loc;
}

static void parse_module(parser *p) {
  next(p);
  if (!is_word(&p->tok, "module")) {
    expected(p, "'module'");
    return;
  }
  int line = p->tok.line;
  next(p);
  const char *name = take_name(p, "a module name");
  if (name)
    p->m->name = name;
  else
    skip_line(p, line);
  while (!p->stop && p->tok.kind != T_EOF) {
    token t = p->tok;
    if (is_word(&t, "meta"))
      parse_meta(p);
    else if (is_word(&t, "param") || is_word(&t, "state"))
      parse_param(p, is_word(&t, "state"));
    else if (is_word(&t, "graph"))
      parse_graph(p);
    else {
      expected(p, "'meta', 'param', 'state' or 'graph'");
      skip_line(p, t.line);
    }
  }
}

dsc_status dsc_module_parse(dsc_context *ctx, const char *text, size_t len, const char *file,
                            dsc_module **out) {
  if (out) *out = NULL;
  if (!ctx || !out || (!text && len)) return DSC_ERR_INTERNAL;
  if (!text) text = "";
  if (!file) file = "<input>";
  /* Node locations outlive the caller's string: use the context's copy. */
  if (!(file = ir_diag_add_source(ctx, file, text, len))) {
    ir_error(ctx, ir_no_loc, "out of memory while parsing");
    return DSC_ERR_INTERNAL;
  }
  parser p;
  memset(&p, 0, sizeof p);
  p.ctx = ctx;
  p.src = text;
  p.len = len;
  p.line = p.col = 1;
  p.m = dsc_module_new(ctx, "main");
  if (!p.m || !(p.file = ir_arena_strdup(&p.m->arena, file))) {
    dsc_module_free(p.m);
    ir_error(ctx, ir_no_loc, "out of memory while parsing %s", file);
    return DSC_ERR_INTERNAL;
  }
  parse_module(&p);
  ir_free(ctx, p.sbuf, p.sbuf_cap);
  ir_free(ctx, p.syms, sizeof(sym) * p.cap_syms);
  ir_free(ctx, p.ins, sizeof(ir_node *) * (size_t)p.cap_ins);
  for (int i = 0; i < 5; i++) ir_free(ctx, p.ints[i], sizeof(int64_t) * (size_t)p.cap_ints[i]);
  dsc_status st = p.oom ? DSC_ERR_INTERNAL : p.errors ? DSC_ERR_USER : DSC_OK;
  if (st == DSC_OK) st = dsc_module_verify(p.m);
  if (st != DSC_OK) {
    dsc_module_free(p.m);
    return st;
  }
  *out = p.m;
  return DSC_OK;
}
