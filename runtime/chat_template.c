/* Chat templates: the Jinja subset Hugging Face's tokenizer_config.json
 * templates use, rendered as transformers' apply_chat_template renders them
 * (jinja2 with trim_blocks and lstrip_blocks, raise_exception, loop
 * controls). A template is parsed once, at load, so a construct outside the
 * subset is an error when the server starts, not at the first request.
 *
 * The subset: text, {{ expr }}, {% for %} (one or two targets, an `if`
 * filter, else, loop.index/index0/first/last/length/revindex/revindex0,
 * break, continue), {% if %}/elif/else, {% set %} (also ns.attr of a
 * namespace), {% generation %}, comments, whitespace control (- and +).
 * Expressions: literals, lists, dicts, names, .attr, [index], [a:b:c],
 * calls, filters, tests (is [not] defined/none/string/...), not/and/or,
 * comparisons and `in`, ~ + - * / // % **, `a if c else b`. Values are
 * jinja2's: undefined prints as nothing and is false; a missing key is
 * undefined; an attribute of undefined is an error; a filter of undefined
 * answers as jinja2's Undefined (undefined_filter). */
#include <cjson/cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/runtime.h"

/* ---------------------------------------------------------------- values */

typedef enum {
  V_UNDEF,
  V_NONE,
  V_BOOL,
  V_INT,
  V_FLOAT,
  V_STR,
  V_LIST,
  V_DICT,
  V_LOOP,
  V_FUNC
} vkind;

typedef struct coll coll;
typedef struct loop_info loop_info;

typedef struct {
  vkind k;
  bool b;
  int64_t i;
  double f;
  const char *s; /* V_STR (not NUL-terminated in general); V_FUNC: the name */
  size_t n;
  coll *c;                /* V_LIST, V_DICT: shared, so a namespace mutates in place */
  const loop_info *lp;    /* V_LOOP */
  const char *undef_name; /* V_UNDEF: what was looked up, for messages */
} val;

struct coll {
  bool ns; /* a namespace(): attributes may be set */
  int len, cap;
  const char **keys; /* dicts */
  size_t *key_len;
  val *items;
};

struct loop_info {
  int64_t index0, length;
};

/* ---------------------------------------------------------------- AST */

typedef enum {
  E_LIT,
  E_NAME,
  E_ATTR,
  E_INDEX,
  E_SLICE,
  E_CALL,
  E_FILTER,
  E_TEST,
  E_NOT,
  E_NEG,
  E_BIN,
  E_AND,
  E_OR,
  E_COND,
  E_LIST,
  E_DICT
} ekind;

typedef struct expr expr;
struct expr {
  ekind k;
  int line;
  val lit;          /* E_LIT */
  const char *name; /* E_NAME, E_ATTR, E_FILTER, E_TEST; E_BIN: the operator */
  expr *a, *b, *c;  /* operands; E_SLICE: a[b:c:d] with d in args[0] */
  expr **args;      /* E_CALL, E_FILTER, E_TEST: arguments (after the subject); lists, dicts */
  const char **kw;  /* keyword names (NULL: positional) */
  int n_args;
  bool negate; /* E_TEST: is not */
};

typedef enum { N_TEXT, N_OUT, N_FOR, N_IF, N_SET, N_BREAK, N_CONTINUE, N_BLOCK } nkind;

typedef struct node node;
typedef struct {
  node **v;
  int n, cap;
} node_list;

struct node {
  nkind k;
  int line;
  const char *text; /* N_TEXT */
  size_t len;
  expr *e;                /* N_OUT, N_SET (value), N_FOR (iterable), N_IF (condition) */
  expr *cond;             /* N_FOR: `if` filter */
  const char *var, *var2; /* N_FOR targets; N_SET: name (var2: attribute of a namespace) */
  node_list body,
      other; /* N_IF: then / else (an elif is an N_IF alone in else); N_FOR: body / else */
};

struct dsc_chat_template {
  dsc_context *ctx;
  ir_arena arena;
  node_list top;
  char *bos, *eos;
};

/* ---------------------------------------------------------------- parsing */

typedef struct {
  dsc_context *ctx;
  ir_arena *a;
  const char *src;
  size_t len, pos;
  int line;
  /* the tag being parsed: its inside [tpos, tend) */
  size_t tpos, tend;
  int tline;
  int depth;
  char err[300];
} parser;

static bool perr(parser *p, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static bool perr(parser *p, int line, const char *fmt, ...) {
  if (p->err[0]) return false;
  int k = snprintf(p->err, sizeof p->err, "line %d: ", line);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(p->err + k, sizeof p->err - (size_t)k, fmt, ap);
  va_end(ap);
  return false;
}

static bool push(parser *p, node_list *l, node *n) {
  if (l->n == l->cap) {
    int cap = l->cap ? 2 * l->cap : 8;
    node **v = ir_arena_alloc(p->a, (size_t)cap * sizeof *v);
    if (!v) return perr(p, 0, "out of memory");
    if (l->n) memcpy(v, l->v, (size_t)l->n * sizeof *v);
    l->v = v, l->cap = cap;
  }
  l->v[l->n++] = n;
  return true;
}

/* ---- the expression lexer, over the inside of one tag ---- */

typedef enum { T_END, T_NAME, T_STR, T_INT, T_FLOAT, T_OP } tkind;
typedef struct {
  tkind k;
  const char *s; /* T_NAME, T_OP: the source; T_STR: the unescaped value (arena) */
  size_t n;
  int64_t i;
  double f;
} token;

static void skip_ws(parser *p) {
  while (p->tpos < p->tend && isspace((unsigned char)p->src[p->tpos])) {
    if (p->src[p->tpos] == '\n') p->tline++;
    p->tpos++;
  }
}

static bool lex(parser *p, token *t, bool peek) {
  size_t save = p->tpos;
  int save_line = p->tline;
  skip_ws(p);
  memset(t, 0, sizeof *t);
  const char *s = p->src;
  size_t i = p->tpos;
  if (i >= p->tend) {
    t->k = T_END;
  } else if (isalpha((unsigned char)s[i]) || s[i] == '_') {
    size_t j = i;
    while (j < p->tend && (isalnum((unsigned char)s[j]) || s[j] == '_')) j++;
    t->k = T_NAME, t->s = s + i, t->n = j - i;
    p->tpos = j;
  } else if (isdigit((unsigned char)s[i])) {
    size_t j = i;
    bool fl = false;
    while (j < p->tend && (isdigit((unsigned char)s[j]) || s[j] == '_')) j++;
    if (j + 1 < p->tend && s[j] == '.' && isdigit((unsigned char)s[j + 1])) {
      fl = true;
      j++;
      while (j < p->tend && isdigit((unsigned char)s[j])) j++;
    }
    char buf[64];
    size_t n = j - i < sizeof buf - 1 ? j - i : sizeof buf - 1, m = 0;
    for (size_t q = 0; q < n; q++)
      if (s[i + q] != '_') buf[m++] = s[i + q];
    buf[m] = 0;
    errno = 0;
    if (fl)
      t->k = T_FLOAT, t->f = strtod(buf, NULL);
    else
      t->k = T_INT, t->i = strtoll(buf, NULL, 10);
    if (errno) return perr(p, p->tline, "number '%s' is out of range", buf);
    p->tpos = j;
  } else if (s[i] == '\'' || s[i] == '"') {
    char q = s[i];
    size_t j = i + 1, m = 0;
    char *out = ir_arena_alloc(p->a, p->tend - i + 1);
    if (!out) return perr(p, p->tline, "out of memory");
    for (; j < p->tend && s[j] != q; j++) {
      char ch = s[j];
      if (ch == '\\' && j + 1 < p->tend) {
        char e = s[++j];
        switch (e) {
          case 'n':
            ch = '\n';
            break;
          case 't':
            ch = '\t';
            break;
          case 'r':
            ch = '\r';
            break;
          case '0':
            ch = '\0';
            break;
          case '\\':
          case '\'':
          case '"':
            ch = e;
            break;
          default:
            out[m++] = '\\';
            ch = e;
            break; /* Python keeps unknown escapes */
        }
      } else if (ch == '\n') {
        p->tline++;
      }
      out[m++] = ch;
    }
    if (j >= p->tend) return perr(p, p->tline, "a string is not closed");
    t->k = T_STR, t->s = out, t->n = m;
    p->tpos = j + 1;
  } else {
    static const char *const two[] = {"==", "!=", "<=", ">=", "//", "**"};
    t->k = T_OP, t->s = s + i, t->n = 1;
    for (size_t q = 0; q < sizeof two / sizeof *two; q++)
      if (i + 1 < p->tend && s[i] == two[q][0] && s[i + 1] == two[q][1]) t->n = 2;
    if (!strchr("()[]{},.:|~+-*/%<>=!", s[i]))
      return perr(p, p->tline, "unexpected character '%c'", s[i]);
    p->tpos = i + t->n;
  }
  if (peek) p->tpos = save, p->tline = save_line;
  return true;
}

static bool tok_is(const token *t, const char *s) {
  return (t->k == T_OP || t->k == T_NAME) && t->n == strlen(s) && memcmp(t->s, s, t->n) == 0;
}

/* Takes the next token if it is s. */
static bool accept(parser *p, const char *s) {
  token t;
  if (!lex(p, &t, true) || !tok_is(&t, s)) return false;
  return lex(p, &t, false);
}

static bool expect(parser *p, const char *s) {
  if (accept(p, s)) return true;
  token t;
  lex(p, &t, true);
  return perr(p, p->tline, "expected '%s', found '%.*s'", s, t.k == T_END ? 3 : (int)t.n,
              t.k == T_END ? "end" : t.s);
}

static char *name_of(parser *p, const token *t) { return ir_arena_strndup(p->a, t->s, t->n); }

static expr *new_expr(parser *p, ekind k) {
  expr *e = ir_arena_alloc(p->a, sizeof *e);
  if (!e) {
    perr(p, p->tline, "out of memory");
    return NULL;
  }
  e->k = k, e->line = p->tline;
  return e;
}

static expr *parse_expr(parser *p);

/* Arguments of a call, a filter or a test: (a, b, key = c). */
static bool parse_args(parser *p, expr *e) {
  expr *args[32];
  const char *kw[32];
  int n = 0;
  if (!accept(p, ")")) {
    do {
      if (n == 32) return perr(p, p->tline, "more than 32 arguments");
      token t, t2;
      kw[n] = NULL;
      size_t save = p->tpos;
      int save_line = p->tline;
      /* name = value ("==" lexes as one token, so this is a keyword) */
      if (lex(p, &t, false) && t.k == T_NAME && lex(p, &t2, true) && tok_is(&t2, "=")) {
        lex(p, &t2, false);
        kw[n] = name_of(p, &t);
      } else {
        p->tpos = save, p->tline = save_line;
      }
      if (!(args[n++] = parse_expr(p))) return false;
    } while (accept(p, ","));
    if (!expect(p, ")")) return false;
  }
  e->args = ir_arena_alloc(p->a, (size_t)(n ? n : 1) * sizeof *e->args);
  e->kw = ir_arena_alloc(p->a, (size_t)(n ? n : 1) * sizeof *e->kw);
  if (!e->args || !e->kw) return perr(p, p->tline, "out of memory");
  memcpy(e->args, args, (size_t)n * sizeof *args);
  memcpy(e->kw, kw, (size_t)n * sizeof *kw);
  e->n_args = n;
  return true;
}

static expr *parse_primary(parser *p) {
  if (++p->depth > 200) {
    perr(p, p->tline, "the expression nests too deeply");
    return NULL;
  }
  token t;
  if (!lex(p, &t, false)) return NULL;
  expr *e = NULL;
  if (t.k == T_STR || t.k == T_INT || t.k == T_FLOAT) {
    if (!(e = new_expr(p, E_LIT))) return NULL;
    if (t.k == T_STR)
      e->lit = (val){.k = V_STR, .s = t.s, .n = t.n};
    else if (t.k == T_INT)
      e->lit = (val){.k = V_INT, .i = t.i};
    else
      e->lit = (val){.k = V_FLOAT, .f = t.f};
    /* adjacent strings concatenate, as in Python */
    token u;
    while (e->lit.k == V_STR && lex(p, &u, true) && u.k == T_STR) {
      lex(p, &u, false);
      char *s = ir_arena_alloc(p->a, e->lit.n + u.n + 1);
      if (!s) return perr(p, p->tline, "out of memory"), NULL;
      memcpy(s, e->lit.s, e->lit.n), memcpy(s + e->lit.n, u.s, u.n);
      e->lit.s = s, e->lit.n += u.n;
    }
  } else if (t.k == T_NAME) {
    if (!(e = new_expr(p, E_LIT))) return NULL;
    if (tok_is(&t, "true") || tok_is(&t, "True"))
      e->lit = (val){.k = V_BOOL, .b = true};
    else if (tok_is(&t, "false") || tok_is(&t, "False"))
      e->lit = (val){.k = V_BOOL, .b = false};
    else if (tok_is(&t, "none") || tok_is(&t, "None"))
      e->lit = (val){.k = V_NONE};
    else
      e->k = E_NAME, e->name = name_of(p, &t);
  } else if (tok_is(&t, "(")) {
    if (!(e = parse_expr(p))) return NULL;
    if (accept(p, ",")) { /* a tuple: a list here */
      expr *l = new_expr(p, E_LIST);
      expr *items[64];
      int n = 0;
      items[n++] = e;
      if (!l) return NULL;
      token u;
      while (lex(p, &u, true) && !tok_is(&u, ")")) {
        if (n == 64) return perr(p, p->tline, "a tuple of more than 64 items"), NULL;
        if (!(items[n++] = parse_expr(p))) return NULL;
        if (!accept(p, ",")) break;
      }
      l->args = ir_arena_alloc(p->a, (size_t)n * sizeof *l->args);
      if (!l->args) return perr(p, p->tline, "out of memory"), NULL;
      memcpy(l->args, items, (size_t)n * sizeof *items), l->n_args = n;
      e = l;
    }
    if (!expect(p, ")")) return NULL;
  } else if (tok_is(&t, "[") || tok_is(&t, "{")) {
    bool dict = tok_is(&t, "{");
    if (!(e = new_expr(p, dict ? E_DICT : E_LIST))) return NULL;
    expr *items[256];
    int n = 0;
    const char *close = dict ? "}" : "]";
    if (!accept(p, close)) {
      do {
        token u;
        if (lex(p, &u, true) && tok_is(&u, close)) break; /* a trailing comma */
        if (n + 2 > 256) return perr(p, p->tline, "a literal of more than 128 items"), NULL;
        if (!(items[n++] = parse_expr(p))) return NULL;
        if (dict && (!expect(p, ":") || !(items[n++] = parse_expr(p)))) return NULL;
      } while (accept(p, ","));
      if (!expect(p, close)) return NULL;
    }
    e->args = ir_arena_alloc(p->a, (size_t)(n ? n : 1) * sizeof *e->args);
    if (!e->args) return perr(p, p->tline, "out of memory"), NULL;
    memcpy(e->args, items, (size_t)n * sizeof *items), e->n_args = n;
  } else {
    perr(p, p->tline, "expected a value, found '%.*s'", t.k == T_END ? 3 : (int)t.n,
         t.k == T_END ? "end" : t.s);
    return NULL;
  }
  /* postfix: .attr, [index or slice], (call) */
  for (;;) {
    token u;
    if (!lex(p, &u, true)) return NULL;
    if (tok_is(&u, ".")) {
      lex(p, &u, false);
      token nm;
      if (!lex(p, &nm, false) || (nm.k != T_NAME && nm.k != T_INT))
        return perr(p, p->tline, "expected a name after '.'"), NULL;
      expr *x = new_expr(p, E_ATTR);
      if (!x) return NULL;
      x->a = e, x->name = nm.k == T_NAME ? name_of(p, &nm) : ir_arena_strndup(p->a, nm.s, nm.n);
      if (nm.k == T_INT) x->name = ir_arena_printf(p->a, "%lld", (long long)nm.i);
      e = x;
    } else if (tok_is(&u, "[")) {
      lex(p, &u, false);
      expr *x = new_expr(p, E_INDEX);
      if (!x) return NULL;
      x->a = e;
      token v;
      expr *parts[3] = {NULL, NULL, NULL};
      int np = 0;
      bool slice = false;
      for (;;) {
        if (!lex(p, &v, true)) return NULL;
        if (tok_is(&v, ":")) {
          lex(p, &v, false);
          slice = true;
          if (++np > 2) return perr(p, p->tline, "a slice has at most 3 parts"), NULL;
          continue;
        }
        if (tok_is(&v, "]")) break;
        if (parts[np]) return perr(p, p->tline, "expected ']'"), NULL;
        if (!(parts[np] = parse_expr(p))) return NULL;
      }
      lex(p, &v, false);
      if (slice) {
        x->k = E_SLICE, x->b = parts[0], x->c = parts[1];
        x->args = ir_arena_alloc(p->a, sizeof *x->args);
        if (!x->args) return perr(p, p->tline, "out of memory"), NULL;
        x->args[0] = parts[2];
      } else {
        if (!parts[0]) return perr(p, p->tline, "an empty index"), NULL;
        x->b = parts[0];
      }
      e = x;
    } else if (tok_is(&u, "(")) {
      lex(p, &u, false);
      expr *x = new_expr(p, E_CALL);
      if (!x) return NULL;
      x->a = e;
      if (!parse_args(p, x)) return NULL;
      e = x;
    } else {
      break;
    }
  }
  p->depth--;
  return e;
}

/* filters (x | f(args)) and tests (x is [not] t(args)) on a unary value */
static expr *parse_unary(parser *p) {
  expr *e;
  if (accept(p, "-")) {
    if (!(e = new_expr(p, E_NEG)) || !(e->a = parse_unary(p))) return NULL;
    return e;
  }
  if (accept(p, "+")) return parse_unary(p);
  if (!(e = parse_primary(p))) return NULL;
  for (;;) {
    token u;
    if (!lex(p, &u, true)) return NULL;
    bool filter = tok_is(&u, "|"), test = tok_is(&u, "is");
    if (!filter && !test) break;
    lex(p, &u, false);
    expr *x = new_expr(p, filter ? E_FILTER : E_TEST);
    if (!x) return NULL;
    if (test && accept(p, "not")) x->negate = true;
    token nm;
    if (!lex(p, &nm, false) || nm.k != T_NAME)
      return perr(p, p->tline, "expected a %s name", filter ? "filter" : "test"), NULL;
    x->name = name_of(p, &nm), x->a = e;
    if (accept(p, "(")) {
      if (!parse_args(p, x)) return NULL;
    } else if (test) { /* `is divisibleby 3`, `is sameas x`: one argument without parentheses */
      token v;
      if (lex(p, &v, true) && (v.k == T_INT || v.k == T_STR || v.k == T_FLOAT)) {
        x->args = ir_arena_alloc(p->a, sizeof *x->args);
        x->kw = ir_arena_alloc(p->a, sizeof *x->kw);
        if (!x->args || !x->kw || !(x->args[0] = parse_primary(p))) return NULL;
        x->n_args = 1;
      }
    }
    e = x;
  }
  return e;
}

static expr *binary(parser *p, const char *op, expr *a, expr *b) {
  if (!a || !b) return NULL;
  expr *e = new_expr(p, E_BIN);
  if (!e) return NULL;
  e->name = op, e->a = a, e->b = b;
  return e;
}

static expr *parse_pow(parser *p) {
  expr *e = parse_unary(p);
  while (e && accept(p, "**")) e = binary(p, "**", e, parse_unary(p));
  return e;
}

static expr *parse_mul(parser *p) {
  expr *e = parse_pow(p);
  for (;;) {
    token u;
    if (!e || !lex(p, &u, true) || u.k != T_OP) return e;
    const char *op = tok_is(&u, "*")    ? "*"
                     : tok_is(&u, "/")  ? "/"
                     : tok_is(&u, "//") ? "//"
                     : tok_is(&u, "%")  ? "%"
                                        : NULL;
    if (!op) return e;
    lex(p, &u, false);
    e = binary(p, op, e, parse_pow(p));
  }
}

static expr *parse_add(parser *p) {
  expr *e = parse_mul(p);
  for (;;) {
    token u;
    if (!e || !lex(p, &u, true) || u.k != T_OP) return e;
    const char *op = tok_is(&u, "+") ? "+" : tok_is(&u, "-") ? "-" : NULL;
    if (!op) return e;
    lex(p, &u, false);
    e = binary(p, op, e, parse_mul(p));
  }
}

static expr *parse_concat(parser *p) {
  expr *e = parse_add(p);
  while (e && accept(p, "~")) e = binary(p, "~", e, parse_add(p));
  return e;
}

static expr *parse_compare(parser *p) {
  expr *e = parse_concat(p);
  for (;;) {
    token u;
    if (!e || !lex(p, &u, true)) return e;
    static const char *const ops[] = {"==", "!=", "<=", ">=", "<", ">"};
    const char *op = NULL;
    for (size_t q = 0; q < sizeof ops / sizeof *ops && !op; q++)
      if (tok_is(&u, ops[q])) op = ops[q];
    if (op) {
      lex(p, &u, false);
    } else if (tok_is(&u, "in")) {
      lex(p, &u, false);
      op = "in";
    } else if (tok_is(&u, "not")) {
      size_t save = p->tpos;
      int save_line = p->tline;
      lex(p, &u, false);
      if (!accept(p, "in")) {
        p->tpos = save, p->tline = save_line;
        return e;
      }
      op = "not in";
    } else {
      return e;
    }
    e = binary(p, op, e, parse_concat(p));
  }
}

static expr *parse_not(parser *p) {
  if (accept(p, "not")) {
    expr *e = new_expr(p, E_NOT);
    if (!e || !(e->a = parse_not(p))) return NULL;
    return e;
  }
  return parse_compare(p);
}

static expr *parse_and(parser *p) {
  expr *e = parse_not(p);
  while (e && accept(p, "and")) {
    expr *x = new_expr(p, E_AND);
    if (!x || !(x->b = parse_not(p))) return NULL;
    x->a = e, e = x;
  }
  return e;
}

static expr *parse_or(parser *p) {
  expr *e = parse_and(p);
  while (e && accept(p, "or")) {
    expr *x = new_expr(p, E_OR);
    if (!x || !(x->b = parse_and(p))) return NULL;
    x->a = e, e = x;
  }
  return e;
}

static expr *parse_expr(parser *p) {
  expr *e = parse_or(p);
  if (e && accept(p, "if")) {
    expr *x = new_expr(p, E_COND);
    if (!x || !(x->b = parse_or(p))) return NULL;
    x->a = e;
    if (accept(p, "else") && !(x->c = parse_expr(p))) return NULL;
    e = x;
  }
  return e;
}

/* The whole inside of the tag must be used. */
static bool at_tag_end(parser *p) {
  token t;
  if (!lex(p, &t, true)) return false;
  if (t.k == T_END) return true;
  return perr(p, p->tline, "unexpected '%.*s'", (int)t.n, t.s);
}

/* ---- the template: text and tags ---- */

typedef struct {
  int kind;                                /* 0 text, 1 {{ }}, 2 {% %}, 3 {# #} */
  size_t start, end;                       /* the tag's inside, or the text */
  bool strip_left, strip_right, keep_left; /* -, - and + on the tag's sides */
  int line;
  bool keep_right; /* + before the closer: no trim_blocks */
} seg;

typedef struct {
  seg *v;
  int n, cap;
} seg_list;

static bool add_seg(parser *p, seg_list *l, seg s) {
  if (l->n == l->cap) {
    int cap = l->cap ? 2 * l->cap : 64;
    seg *v = realloc(l->v, (size_t)cap * sizeof *v);
    if (!v) return perr(p, s.line, "out of memory");
    l->v = v, l->cap = cap;
  }
  l->v[l->n++] = s;
  return true;
}

static int count_lines(const char *s, size_t a, size_t b) {
  int n = 0;
  for (size_t i = a; i < b; i++) n += s[i] == '\n';
  return n;
}

/* Cuts the source into text and tags. */
static bool segment(parser *p, seg_list *out) {
  const char *s = p->src;
  size_t i = 0, text = 0;
  int line = 1;
  while (i + 1 < p->len) {
    int kind = s[i] != '{'       ? 0
               : s[i + 1] == '{' ? 1
               : s[i + 1] == '%' ? 2
               : s[i + 1] == '#' ? 3
                                 : 0;
    if (!kind) {
      i++;
      continue;
    }
    int tag_line = line + count_lines(s, text, i);
    if (i > text && !add_seg(p, out, (seg){0, text, i, false, false, false, line, false}))
      return false;
    line = tag_line;
    const char *close = kind == 1 ? "}}" : kind == 2 ? "%}" : "#}";
    size_t in = i + 2;
    seg g = {kind, in, 0, false, false, false, line, false};
    if (in < p->len && (s[in] == '-' || s[in] == '+')) {
      g.strip_left = s[in] == '-', g.keep_left = s[in] == '+';
      in++;
    }
    const char *end = NULL;
    for (size_t j = in; j + 1 < p->len; j++) {
      if (kind != 3 && (s[j] == '\'' || s[j] == '"')) { /* a string may hold the closer */
        char q = s[j];
        for (j++; j < p->len && s[j] != q; j++)
          if (s[j] == '\\') j++;
        continue;
      }
      if (s[j] == close[0] && s[j + 1] == close[1]) {
        end = s + j;
        break;
      }
    }
    if (!end) return perr(p, line, "a '%.2s' is not closed", s + i);
    size_t e = (size_t)(end - s);
    g.start = in, g.end = e;
    if (e > in && s[e - 1] == '-')
      g.strip_right = true, g.end = e - 1;
    else if (e > in && s[e - 1] == '+')
      g.end = e - 1, g.keep_right = true;
    if (!add_seg(p, out, g)) return false;
    line += count_lines(s, i, e + 2);
    i = text = e + 2;
  }
  if (text < p->len && !add_seg(p, out, (seg){0, text, p->len, false, false, false, line, false}))
    return false;
  return true;
}

/* Whitespace as jinja2 with trim_blocks and lstrip_blocks: a '-' strips all
 * whitespace on its side; a block or comment tag alone on its line takes
 * the indentation before it (lstrip_blocks, unless '+') and the newline
 * after it (trim_blocks). */
static void trim_text(const parser *p, seg_list *l) {
  const char *s = p->src;
  for (int k = 0; k < l->n; k++) {
    seg *t = &l->v[k];
    if (t->kind != 0) continue;
    const seg *prev = k > 0 ? &l->v[k - 1] : NULL, *next = k + 1 < l->n ? &l->v[k + 1] : NULL;
    if (prev && prev->strip_right) {
      while (t->start < t->end && isspace((unsigned char)s[t->start])) t->start++;
    } else if (prev && prev->kind >= 2 && !prev->keep_right) {
      if (t->start < t->end && s[t->start] == '\n')
        t->start++;
      else if (t->start + 1 < t->end && s[t->start] == '\r' && s[t->start + 1] == '\n')
        t->start += 2;
    }
    if (next && next->strip_left) {
      while (t->end > t->start && isspace((unsigned char)s[t->end - 1])) t->end--;
    } else if (next && next->kind >= 2 && !next->keep_left) {
      size_t j = t->end;
      while (j > t->start && (s[j - 1] == ' ' || s[j - 1] == '\t')) j--;
      /* only when the tag starts its line (or the template) */
      if (j == 0 || s[j - 1] == '\n') t->end = j;
    }
  }
}

typedef struct {
  const seg_list *segs;
  int at;
} cursor;

static bool parse_block(parser *p, cursor *c, node_list *out, const char *const *stops, int n_stops,
                        char *stopped, size_t stopped_n);

/* The statement word of block tag g (into word), the parser placed after it. */
static bool stmt_word(parser *p, const seg *g, char *word, size_t n) {
  p->tpos = g->start, p->tend = g->end, p->tline = g->line;
  token t;
  if (!lex(p, &t, false)) return false;
  if (t.k != T_NAME) return perr(p, g->line, "a statement tag without a statement");
  snprintf(word, n, "%.*s", (int)t.n, t.s);
  return true;
}

static node *new_node(parser *p, nkind k, int line) {
  node *n = ir_arena_alloc(p->a, sizeof *n);
  if (!n)
    perr(p, line, "out of memory");
  else
    n->k = k, n->line = line;
  return n;
}

static bool parse_stmt(parser *p, cursor *c, const seg *g, const char *word, node_list *out) {
  int line = g->line;
  if (strcmp(word, "for") == 0) {
    node *n = new_node(p, N_FOR, line);
    token t;
    if (!n || !lex(p, &t, false) || t.k != T_NAME) return perr(p, line, "for: expected a name");
    n->var = name_of(p, &t);
    if (accept(p, ",")) {
      if (!lex(p, &t, false) || t.k != T_NAME) return perr(p, line, "for: expected a second name");
      n->var2 = name_of(p, &t);
    }
    if (!expect(p, "in") || !(n->e = parse_or(p))) return false;
    if (accept(p, "if") && !(n->cond = parse_expr(p))) return false;
    if (accept(p, "recursive")) return perr(p, line, "for ... recursive is not supported");
    if (!at_tag_end(p)) return false;
    static const char *const stops[] = {"endfor", "else"};
    char stop[32];
    if (!parse_block(p, c, &n->body, stops, 2, stop, sizeof stop)) return false;
    if (strcmp(stop, "else") == 0) {
      static const char *const end[] = {"endfor"};
      if (!parse_block(p, c, &n->other, end, 1, stop, sizeof stop)) return false;
    }
    return push(p, out, n);
  }
  if (strcmp(word, "if") == 0 || strcmp(word, "elif") == 0) {
    node *n = new_node(p, N_IF, line);
    if (!n || !(n->e = parse_expr(p)) || !at_tag_end(p)) return false;
    static const char *const stops[] = {"endif", "elif", "else"};
    char stop[32];
    if (!parse_block(p, c, &n->body, stops, 3, stop, sizeof stop)) return false;
    if (strcmp(stop, "elif") == 0) {
      /* the elif's tag is the one the block stopped at: parse it as an if */
      const seg *eg = &c->segs->v[c->at - 1];
      char w[16];
      if (!stmt_word(p, eg, w, sizeof w) || !parse_stmt(p, c, eg, "elif", &n->other)) return false;
    } else if (strcmp(stop, "else") == 0) {
      static const char *const end[] = {"endif"};
      if (!parse_block(p, c, &n->other, end, 1, stop, sizeof stop)) return false;
    }
    return push(p, out, n);
  }
  if (strcmp(word, "set") == 0) {
    node *n = new_node(p, N_SET, line);
    token t;
    if (!n || !lex(p, &t, false) || t.k != T_NAME) return perr(p, line, "set: expected a name");
    n->var = name_of(p, &t);
    if (accept(p, ".")) {
      if (!lex(p, &t, false) || t.k != T_NAME) return perr(p, line, "set: expected an attribute");
      n->var2 = name_of(p, &t);
    }
    if (!accept(p, "=")) return perr(p, line, "set: block assignments are not supported");
    if (!(n->e = parse_expr(p)) || !at_tag_end(p)) return false;
    return push(p, out, n);
  }
  if (strcmp(word, "break") == 0 || strcmp(word, "continue") == 0) {
    node *n = new_node(p, word[0] == 'b' ? N_BREAK : N_CONTINUE, line);
    return n && at_tag_end(p) && push(p, out, n);
  }
  if (strcmp(word, "generation") == 0) { /* transformers' assistant-mask marker: renders its body */
    node *n = new_node(p, N_BLOCK, line);
    static const char *const end[] = {"endgeneration"};
    char stop[32];
    return n && at_tag_end(p) && parse_block(p, c, &n->body, end, 1, stop, sizeof stop) &&
           push(p, out, n);
  }
  return perr(p, line, "the statement '%s' is not supported in chat templates here", word);
}

/* Parses until one of stops (its word into stopped; "" at the end of the
 * template, an error when stops were expected). */
static bool parse_block(parser *p, cursor *c, node_list *out, const char *const *stops, int n_stops,
                        char *stopped, size_t stopped_n) {
  stopped[0] = 0;
  while (c->at < c->segs->n) {
    const seg *g = &c->segs->v[c->at++];
    if (g->kind == 3) continue;
    if (g->kind == 0) {
      if (g->end == g->start) continue;
      node *n = new_node(p, N_TEXT, g->line);
      if (!n) return false;
      n->text = p->src + g->start, n->len = g->end - g->start;
      if (!push(p, out, n)) return false;
      continue;
    }
    if (g->kind == 1) {
      node *n = new_node(p, N_OUT, g->line);
      p->tpos = g->start, p->tend = g->end, p->tline = g->line;
      if (!n || !(n->e = parse_expr(p)) || !at_tag_end(p) || !push(p, out, n)) return false;
      continue;
    }
    char word[32];
    if (!stmt_word(p, g, word, sizeof word)) return false;
    for (int k = 0; k < n_stops; k++)
      if (strcmp(word, stops[k]) == 0) {
        if (strncmp(word, "end", 3) == 0 || strcmp(word, "else") == 0)
          if (!at_tag_end(p)) return false;
        snprintf(stopped, stopped_n, "%s", word);
        return true;
      }
    if (strncmp(word, "end", 3) == 0 || strcmp(word, "else") == 0 || strcmp(word, "elif") == 0)
      return perr(p, g->line, "'%s' without its opening statement", word);
    if (!parse_stmt(p, c, g, word, out)) return false;
  }
  if (n_stops > 0)
    return perr(p, (int)(count_lines(p->src, 0, p->len) + 1), "'%s' is missing", stops[0]);
  return true;
}

/* ---------------------------------------------------------------- rendering */

typedef struct scope scope;
struct scope {
  const char *name;
  val v;
  scope *next;
};

typedef struct {
  const dsc_chat_template *t;
  ir_arena *a;
  scope *vars;
  char *out;
  size_t len, cap;
  char err[400];
  int depth;
  int ctl; /* 1 break, 2 continue */
} render;

static bool rerr(render *r, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static bool rerr(render *r, int line, const char *fmt, ...) {
  if (r->err[0]) return false;
  int k = line > 0 ? snprintf(r->err, sizeof r->err, "line %d: ", line) : 0;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(r->err + k, sizeof r->err - (size_t)k, fmt, ap);
  va_end(ap);
  return false;
}

#define RT_CHAT_MAX_OUTPUT ((size_t)16 << 20)

static bool emit(render *r, const char *s, size_t n) {
  if (r->len + n + 1 > r->cap) {
    if (r->len + n + 1 > RT_CHAT_MAX_OUTPUT)
      return rerr(r, 0, "the rendered prompt is over 16 MiB");
    size_t cap = r->cap ? r->cap : 256;
    while (cap < r->len + n + 1) cap *= 2;
    char *o = realloc(r->out, cap);
    if (!o) return rerr(r, 0, "out of memory");
    r->out = o, r->cap = cap;
  }
  memcpy(r->out + r->len, s, n);
  r->len += n;
  r->out[r->len] = 0;
  return true;
}

static const char *vkind_name(vkind k) {
  static const char *const names[] = {"undefined", "none", "bool", "int",  "float",
                                      "string",    "list", "dict", "loop", "function"};
  return names[k];
}

static val mk_str(const char *s, size_t n) { return (val){.k = V_STR, .s = s, .n = n}; }
static val mk_int(int64_t i) { return (val){.k = V_INT, .i = i}; }
static val mk_bool(bool b) { return (val){.k = V_BOOL, .b = b}; }

/* Strings count, index and slice by code points, as Python's str. */
static int64_t u8_len(const char *s, size_t n) {
  int64_t k = 0;
  for (size_t i = 0; i < n; i++) k += ((unsigned char)s[i] & 0xC0) != 0x80;
  return k;
}

/* The byte offset of code point i (n for i == the length). */
static size_t u8_at(const char *s, size_t n, int64_t i) {
  size_t b = 0;
  for (int64_t k = 0; b < n; b++)
    if (((unsigned char)s[b] & 0xC0) != 0x80 && k++ == i) return b;
  return n;
}

static val u8_char(val s, int64_t i) {
  size_t a = u8_at(s.s, s.n, i), b = u8_at(s.s, s.n, i + 1);
  return mk_str(s.s + a, b - a);
}

static coll *new_coll(render *r, bool dict, int cap) {
  coll *c = ir_arena_alloc(r->a, sizeof *c);
  if (!c) return NULL;
  c->cap = cap > 0 ? cap : 4;
  c->items = ir_arena_alloc(r->a, (size_t)c->cap * sizeof *c->items);
  if (dict) {
    c->keys = ir_arena_alloc(r->a, (size_t)c->cap * sizeof *c->keys);
    c->key_len = ir_arena_alloc(r->a, (size_t)c->cap * sizeof *c->key_len);
  }
  return c->items && (!dict || (c->keys && c->key_len)) ? c : NULL;
}

static bool coll_add(render *r, coll *c, const char *key, size_t key_len, val v) {
  if (c->len == c->cap) {
    int cap = 2 * c->cap;
    val *items = ir_arena_alloc(r->a, (size_t)cap * sizeof *items);
    if (!items) return rerr(r, 0, "out of memory");
    memcpy(items, c->items, (size_t)c->len * sizeof *items);
    c->items = items;
    if (c->keys) {
      const char **keys = ir_arena_alloc(r->a, (size_t)cap * sizeof *keys);
      size_t *kl = ir_arena_alloc(r->a, (size_t)cap * sizeof *kl);
      if (!keys || !kl) return rerr(r, 0, "out of memory");
      memcpy(keys, c->keys, (size_t)c->len * sizeof *keys);
      memcpy(kl, c->key_len, (size_t)c->len * sizeof *kl);
      c->keys = keys, c->key_len = kl;
    }
    c->cap = cap;
  }
  if (c->keys) c->keys[c->len] = key, c->key_len[c->len] = key_len;
  c->items[c->len++] = v;
  return true;
}

static int coll_find(const coll *c, const char *key, size_t n) {
  for (int i = 0; c->keys && i < c->len; i++)
    if (c->key_len[i] == n && memcmp(c->keys[i], key, n) == 0) return i;
  return -1;
}

/* JSON data (the messages) as values. */
static bool from_json(render *r, const cJSON *j, val *out, int depth) {
  if (depth > 64) return rerr(r, 0, "the messages nest too deeply");
  if (cJSON_IsString(j))
    *out = mk_str(j->valuestring, strlen(j->valuestring));
  else if (cJSON_IsBool(j))
    *out = mk_bool(cJSON_IsTrue(j));
  else if (cJSON_IsNull(j))
    *out = (val){.k = V_NONE};
  else if (cJSON_IsNumber(j)) {
    double d = j->valuedouble;
    if (d == floor(d) && fabs(d) < 9.0e15)
      *out = mk_int((int64_t)d);
    else
      *out = (val){.k = V_FLOAT, .f = d};
  } else if (cJSON_IsArray(j) || cJSON_IsObject(j)) {
    bool dict = cJSON_IsObject(j);
    coll *c = new_coll(r, dict, cJSON_GetArraySize(j));
    if (!c) return rerr(r, 0, "out of memory");
    const cJSON *e;
    cJSON_ArrayForEach(e, j) {
      val v;
      if (!from_json(r, e, &v, depth + 1)) return false;
      if (!coll_add(r, c, dict ? e->string : NULL, dict ? strlen(e->string) : 0, v)) return false;
    }
    *out = (val){.k = dict ? V_DICT : V_LIST, .c = c};
  } else {
    return rerr(r, 0, "unsupported JSON value in the messages");
  }
  return true;
}

static bool truthy(val v) {
  switch (v.k) {
    case V_UNDEF:
    case V_NONE:
      return false;
    case V_BOOL:
      return v.b;
    case V_INT:
      return v.i != 0;
    case V_FLOAT:
      return v.f != 0;
    case V_STR:
      return v.n > 0;
    case V_LIST:
    case V_DICT:
      return v.c->len > 0 || v.c->ns;
    default:
      return true;
  }
}

/* Python's str() of v, appended through emit-like growth into an arena string. */
typedef struct {
  render *r;
  char *s;
  size_t n, cap;
} sbuf;

static bool sb_add(sbuf *b, const char *s, size_t n) {
  if (b->n + n + 1 > b->cap) {
    size_t cap = b->cap ? 2 * b->cap : 64;
    while (cap < b->n + n + 1) cap *= 2;
    if (cap > RT_CHAT_MAX_OUTPUT) return rerr(b->r, 0, "a string is over 16 MiB");
    char *g = ir_arena_alloc(b->r->a, cap);
    if (!g) return rerr(b->r, 0, "out of memory");
    if (b->n) memcpy(g, b->s, b->n);
    b->s = g, b->cap = cap;
  }
  memcpy(b->s + b->n, s, n);
  b->n += n;
  b->s[b->n] = 0;
  return true;
}

static bool repr(sbuf *b, val v, bool quote, bool json);

static bool fmt_float(sbuf *b, double f) {
  char buf[40];
  if (isnan(f)) return sb_add(b, "nan", 3);
  if (isinf(f)) return sb_add(b, f > 0 ? "inf" : "-inf", f > 0 ? 3 : 4);
  for (int prec = 1; prec <= 17; prec++) { /* the shortest that reads back, as Python's repr */
    snprintf(buf, sizeof buf, "%.*g", prec, f);
    if (strtod(buf, NULL) == f) break;
  }
  if (!strpbrk(buf, ".en")) strcat(buf, ".0");
  return sb_add(b, buf, strlen(buf));
}

/* json.dumps(s, ensure_ascii=False), as transformers' tojson: UTF-8 as is. */
static bool json_string(sbuf *b, const char *s, size_t n) {
  if (!sb_add(b, "\"", 1)) return false;
  for (size_t i = 0; i < n; i++) {
    unsigned char ch = (unsigned char)s[i];
    char esc[16];
    const char *e = NULL;
    switch (ch) {
      case '"':
        e = "\\\"";
        break;
      case '\\':
        e = "\\\\";
        break;
      case '\n':
        e = "\\n";
        break;
      case '\r':
        e = "\\r";
        break;
      case '\t':
        e = "\\t";
        break;
      case '\b':
        e = "\\b";
        break;
      case '\f':
        e = "\\f";
        break;
      default:
        if (ch < 0x20) snprintf(esc, sizeof esc, "\\u%04x", ch), e = esc;
    }
    if (e ? !sb_add(b, e, strlen(e)) : !sb_add(b, (const char *)&s[i], 1)) return false;
  }
  return sb_add(b, "\"", 1);
}

/* str(v) (quote false), repr(v) inside containers (quote true), or JSON. */
static bool repr(sbuf *b, val v, bool quote, bool json) {
  char buf[32];
  switch (v.k) {
    case V_UNDEF:
      return json ? rerr(b->r, 0, "tojson of an undefined value") : true;
    case V_NONE:
      return json ? sb_add(b, "null", 4) : sb_add(b, "None", 4);
    case V_BOOL:
      return json ? sb_add(b, v.b ? "true" : "false", v.b ? 4 : 5)
                  : sb_add(b, v.b ? "True" : "False", v.b ? 4 : 5);
    case V_INT:
      snprintf(buf, sizeof buf, "%lld", (long long)v.i);
      return sb_add(b, buf, strlen(buf));
    case V_FLOAT:
      return fmt_float(b, v.f);
    case V_STR:
      if (json) return json_string(b, v.s, v.n);
      if (!quote) return sb_add(b, v.s, v.n);
      return sb_add(b, "'", 1) && sb_add(b, v.s, v.n) && sb_add(b, "'", 1);
    case V_LIST:
    case V_DICT: {
      bool dict = v.k == V_DICT;
      if (!sb_add(b, dict ? "{" : "[", 1)) return false;
      for (int i = 0; i < v.c->len; i++) {
        if (i && !sb_add(b, ", ", 2)) return false;
        if (dict) {
          val k = mk_str(v.c->keys[i], v.c->key_len[i]);
          if (!repr(b, k, true, json) || !sb_add(b, ": ", 2)) return false;
        }
        if (!repr(b, v.c->items[i], true, json)) return false;
      }
      return sb_add(b, dict ? "}" : "]", 1);
    }
    default:
      return rerr(b->r, 0, "cannot print a %s", vkind_name(v.k));
  }
}

static bool to_str(render *r, val v, val *out) {
  if (v.k == V_STR) return *out = v, true;
  sbuf b = {r, NULL, 0, 0};
  if (!repr(&b, v, false, false)) return false;
  *out = mk_str(b.s ? b.s : "", b.n);
  return true;
}

static bool equal(val a, val b) {
  bool an = a.k == V_INT || a.k == V_FLOAT || a.k == V_BOOL;
  bool bn = b.k == V_INT || b.k == V_FLOAT || b.k == V_BOOL;
  if (an && bn) {
    double x = a.k == V_INT ? (double)a.i : a.k == V_FLOAT ? a.f : a.b;
    double y = b.k == V_INT ? (double)b.i : b.k == V_FLOAT ? b.f : b.b;
    if (a.k == V_INT && b.k == V_INT) return a.i == b.i;
    return x == y;
  }
  if (a.k != b.k) return false;
  switch (a.k) {
    case V_UNDEF:
    case V_NONE:
      return true;
    case V_STR:
      return a.n == b.n && memcmp(a.s, b.s, a.n) == 0;
    case V_LIST:
    case V_DICT:
      if (a.c->len != b.c->len) return false;
      for (int i = 0; i < a.c->len; i++) {
        int j = i;
        if (a.k == V_DICT && (j = coll_find(b.c, a.c->keys[i], a.c->key_len[i])) < 0) return false;
        if (!equal(a.c->items[i], b.c->items[j])) return false;
      }
      return true;
    default:
      return a.c == b.c;
  }
}

static bool eval(render *r, const expr *e, val *out);

static bool lookup(render *r, const char *name, val *out) {
  for (scope *s = r->vars; s; s = s->next)
    if (strcmp(s->name, name) == 0) return *out = s->v, true;
  static const char *const funcs[] = {"raise_exception", "range", "namespace", "dict"};
  for (size_t i = 0; i < sizeof funcs / sizeof *funcs; i++)
    if (strcmp(name, funcs[i]) == 0) return *out = (val){.k = V_FUNC, .s = funcs[i]}, true;
  *out = (val){.k = V_UNDEF, .undef_name = name};
  return true;
}

static bool set_var(render *r, const char *name, val v) {
  scope *s = ir_arena_alloc(r->a, sizeof *s);
  if (!s) return rerr(r, 0, "out of memory");
  s->name = name, s->v = v, s->next = r->vars;
  r->vars = s;
  return true;
}

static bool as_int(render *r, int line, val v, int64_t *out, const char *what) {
  if (v.k == V_INT) return *out = v.i, true;
  if (v.k == V_BOOL) return *out = v.b, true;
  return rerr(r, line, "%s must be an integer, not %s", what, vkind_name(v.k));
}

/* x[key] / x.key: a missing key or attribute is undefined. */
static bool get_item(render *r, int line, val x, val key, val *out, bool attr) {
  if (x.k == V_UNDEF)
    return rerr(r, line, "'%s' is undefined", x.undef_name ? x.undef_name : "value");
  if (x.k == V_LOOP && key.k == V_STR) {
    const loop_info *l = x.lp;
    char k[16] = "";
    if (key.n < sizeof k) memcpy(k, key.s, key.n), k[key.n] = 0;
    if (!strcmp(k, "index")) return *out = mk_int(l->index0 + 1), true;
    if (!strcmp(k, "index0")) return *out = mk_int(l->index0), true;
    if (!strcmp(k, "first")) return *out = mk_bool(l->index0 == 0), true;
    if (!strcmp(k, "last")) return *out = mk_bool(l->index0 == l->length - 1), true;
    if (!strcmp(k, "length")) return *out = mk_int(l->length), true;
    if (!strcmp(k, "revindex")) return *out = mk_int(l->length - l->index0), true;
    if (!strcmp(k, "revindex0")) return *out = mk_int(l->length - l->index0 - 1), true;
    return rerr(r, line, "loop.%s is not supported", k);
  }
  if (x.k == V_DICT && key.k == V_STR) {
    int i = coll_find(x.c, key.s, key.n);
    if (i >= 0) return *out = x.c->items[i], true;
    *out = (val){.k = V_UNDEF, .undef_name = ir_arena_strndup(r->a, key.s, key.n)};
    return true;
  }
  if ((x.k == V_LIST || x.k == V_STR) && !attr) {
    int64_t i = 0;
    if (!as_int(r, line, key, &i, "an index")) return false;
    int64_t n = x.k == V_LIST ? x.c->len : u8_len(x.s, x.n);
    if (i < 0) i += n;
    if (i < 0 || i >= n) {
      *out = (val){.k = V_UNDEF, .undef_name = "an index out of range"};
      return true;
    }
    *out = x.k == V_LIST ? x.c->items[i] : u8_char(x, i);
    return true;
  }
  if (attr && key.k == V_STR) { /* a method: bound on call */
    *out = (val){.k = V_FUNC, .s = ir_arena_strndup(r->a, key.s, key.n)};
    return out->s != NULL;
  }
  *out = (val){.k = V_UNDEF, .undef_name = "a missing key"};
  return true;
}

static bool is_space(char ch) {
  return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\f' || ch == '\v';
}

static val strip(val s, bool left, bool right) {
  size_t a = 0, b = s.n;
  while (left && a < b && is_space(s.s[a])) a++;
  while (right && b > a && is_space(s.s[b - 1])) b--;
  return mk_str(s.s + a, b - a);
}

static bool str_case(render *r, val s, int mode, val *out) { /* 0 lower, 1 upper, 2 capitalize */
  char *d = ir_arena_alloc(r->a, s.n + 1);
  if (!d) return rerr(r, 0, "out of memory");
  for (size_t i = 0; i < s.n; i++) {
    unsigned char ch = (unsigned char)s.s[i];
    d[i] = (char)(mode == 1 || (mode == 2 && i == 0) ? toupper(ch) : tolower(ch));
  }
  *out = mk_str(d, s.n);
  return true;
}

static bool replace(render *r, val s, val from, val to, val *out) {
  if (from.n == 0) return *out = s, true;
  sbuf b = {r, NULL, 0, 0};
  size_t i = 0;
  while (i < s.n) {
    if (i + from.n <= s.n && memcmp(s.s + i, from.s, from.n) == 0) {
      if (!sb_add(&b, to.s, to.n)) return false;
      i += from.n;
    } else if (!sb_add(&b, s.s + i++, 1)) {
      return false;
    }
  }
  *out = mk_str(b.s ? b.s : "", b.n);
  return true;
}

/* The evaluated arguments of a call node. */
typedef struct {
  val v[32];
  const char *kw[32];
  int n;
} args_t;

static bool eval_args(render *r, const expr *e, args_t *a) {
  a->n = e->n_args;
  for (int i = 0; i < e->n_args; i++) {
    a->kw[i] = e->kw ? e->kw[i] : NULL;
    if (!eval(r, e->args[i], &a->v[i])) return false;
  }
  return true;
}

static const val *arg(const args_t *a, int pos, const char *kw) {
  int k = 0;
  for (int i = 0; i < a->n; i++) {
    if (a->kw[i]) {
      if (kw && strcmp(a->kw[i], kw) == 0) return &a->v[i];
    } else if (k++ == pos) {
      return &a->v[i];
    }
  }
  return NULL;
}

static bool need_str(render *r, int line, val v, const char *what) {
  return v.k == V_STR || rerr(r, line, "%s needs a string, not %s", what, vkind_name(v.k));
}

static bool call_method(render *r, int line, val self, const char *m, const args_t *a, val *out) {
  const val *a0 = arg(a, 0, NULL), *a1 = arg(a, 1, NULL);
  if (self.k == V_STR) {
    if (!strcmp(m, "strip") || !strcmp(m, "lstrip") || !strcmp(m, "rstrip")) {
      if (a0) return rerr(r, line, "%s(chars) is not supported", m);
      *out = strip(self, m[0] != 'r', m[0] != 'l');
      return true;
    }
    if (!strcmp(m, "lower")) return str_case(r, self, 0, out);
    if (!strcmp(m, "upper")) return str_case(r, self, 1, out);
    if (!strcmp(m, "capitalize")) return str_case(r, self, 2, out);
    if ((!strcmp(m, "startswith") || !strcmp(m, "endswith")) && a0) {
      if (!need_str(r, line, *a0, m)) return false;
      bool ok = a0->n <= self.n &&
                memcmp(m[0] == 's' ? self.s : self.s + self.n - a0->n, a0->s, a0->n) == 0;
      return *out = mk_bool(ok), true;
    }
    if (!strcmp(m, "replace") && a0 && a1)
      return need_str(r, line, *a0, m) && need_str(r, line, *a1, m) &&
             replace(r, self, *a0, *a1, out);
    if (!strcmp(m, "split")) {
      coll *c = new_coll(r, false, 4);
      if (!c) return rerr(r, line, "out of memory");
      if (!a0 || a0->k == V_NONE) { /* on runs of whitespace */
        size_t i = 0;
        while (i < self.n) {
          while (i < self.n && is_space(self.s[i])) i++;
          size_t j = i;
          while (j < self.n && !is_space(self.s[j])) j++;
          if (j > i && !coll_add(r, c, NULL, 0, mk_str(self.s + i, j - i))) return false;
          i = j;
        }
      } else {
        if (!need_str(r, line, *a0, m) || a0->n == 0)
          return rerr(r, line, "split: empty separator");
        size_t i = 0, start = 0;
        while (i + a0->n <= self.n) {
          if (memcmp(self.s + i, a0->s, a0->n) == 0) {
            if (!coll_add(r, c, NULL, 0, mk_str(self.s + start, i - start))) return false;
            i += a0->n, start = i;
          } else {
            i++;
          }
        }
        if (!coll_add(r, c, NULL, 0, mk_str(self.s + start, self.n - start))) return false;
      }
      return *out = (val){.k = V_LIST, .c = c}, true;
    }
  }
  if (self.k == V_DICT) {
    if (!strcmp(m, "get") && a0) {
      if (!get_item(r, line, self, *a0, out, false)) return false;
      if (out->k == V_UNDEF) *out = a1 ? *a1 : (val){.k = V_NONE};
      return true;
    }
    if (!strcmp(m, "items") || !strcmp(m, "keys") || !strcmp(m, "values")) {
      coll *c = new_coll(r, false, self.c->len);
      if (!c) return rerr(r, line, "out of memory");
      for (int i = 0; i < self.c->len; i++) {
        val k = mk_str(self.c->keys[i], self.c->key_len[i]), v = self.c->items[i], item = k;
        if (m[0] == 'v') item = v;
        if (m[0] == 'i') {
          coll *pair = new_coll(r, false, 2);
          if (!pair || !coll_add(r, pair, NULL, 0, k) || !coll_add(r, pair, NULL, 0, v))
            return rerr(r, line, "out of memory");
          item = (val){.k = V_LIST, .c = pair};
        }
        if (!coll_add(r, c, NULL, 0, item)) return false;
      }
      return *out = (val){.k = V_LIST, .c = c}, true;
    }
  }
  return rerr(r, line, "the method %s of a %s is not supported", m, vkind_name(self.k));
}

static bool call(render *r, const expr *e, val *out) {
  args_t a;
  const expr *fe = e->a;
  if (fe->k == E_ATTR) { /* obj.method(args) */
    val self;
    if (!eval(r, fe->a, &self) || !eval_args(r, e, &a)) return false;
    if (self.k == V_DICT) {
      int i = coll_find(self.c, fe->name, strlen(fe->name));
      if (i >= 0 && self.c->items[i].k != V_FUNC)
        return rerr(r, e->line, "'%s' is not callable", fe->name);
    }
    return call_method(r, e->line, self, fe->name, &a, out);
  }
  val f;
  if (!eval(r, fe, &f) || !eval_args(r, e, &a)) return false;
  if (f.k != V_FUNC) return rerr(r, e->line, "a %s is not callable", vkind_name(f.k));
  if (!strcmp(f.s, "raise_exception")) {
    val msg = {.k = V_STR, .s = "", .n = 0};
    if (a.n > 0 && !to_str(r, a.v[0], &msg)) return false;
    return rerr(r, 0, "%.*s", (int)msg.n, msg.s);
  }
  if (!strcmp(f.s, "range")) {
    int64_t lo = 0, hi = 0, step = 1;
    if (a.n == 1 && !as_int(r, e->line, a.v[0], &hi, "range")) return false;
    if (a.n >= 2 &&
        (!as_int(r, e->line, a.v[0], &lo, "range") || !as_int(r, e->line, a.v[1], &hi, "range")))
      return false;
    if (a.n == 3 && !as_int(r, e->line, a.v[2], &step, "range")) return false;
    if (a.n < 1 || a.n > 3 || step == 0)
      return rerr(r, e->line, "range takes 1 to 3 arguments, step != 0");
    int64_t count = step > 0 ? (hi - lo + step - 1) / step : (lo - hi - step - 1) / -step;
    if (count > 1000000) return rerr(r, e->line, "range of more than a million");
    coll *c = new_coll(r, false, count > 0 ? (int)count : 1);
    if (!c) return rerr(r, e->line, "out of memory");
    for (int64_t i = 0; i < count; i++)
      if (!coll_add(r, c, NULL, 0, mk_int(lo + i * step))) return false;
    return *out = (val){.k = V_LIST, .c = c}, true;
  }
  if (!strcmp(f.s, "namespace") || !strcmp(f.s, "dict")) {
    coll *c = new_coll(r, true, a.n);
    if (!c) return rerr(r, e->line, "out of memory");
    c->ns = f.s[0] == 'n';
    for (int i = 0; i < a.n; i++) {
      if (!a.kw[i]) return rerr(r, e->line, "%s() takes keyword arguments", f.s);
      if (!coll_add(r, c, a.kw[i], strlen(a.kw[i]), a.v[i])) return false;
    }
    return *out = (val){.k = V_DICT, .c = c}, true;
  }
  return rerr(r, e->line, "the function %s is not supported", f.s);
}

static int64_t length_of(val v) {
  return v.k == V_STR ? u8_len(v.s, v.n) : (v.k == V_LIST || v.k == V_DICT) ? v.c->len : -1;
}

/* A filter of an undefined value, as jinja2's Undefined answers it: an
 * empty string to the string filters, 0 to length, an empty list to list,
 * itself to first, last and safe; the others (int, tojson, items, ...)
 * fail. (tests/chat_templates: undefined_values, against jinja2.) */
static bool undefined_filter(render *r, const expr *e, const char *f, val x, val *out) {
  static const char *const to_empty[] = {"trim",   "upper", "lower",  "capitalize",
                                         "string", "join",  "replace"};
  for (size_t i = 0; i < sizeof to_empty / sizeof *to_empty; i++)
    if (!strcmp(f, to_empty[i])) return *out = mk_str("", 0), true;
  if (!strcmp(f, "length") || !strcmp(f, "count")) return *out = mk_int(0), true;
  if (!strcmp(f, "first") || !strcmp(f, "last") || !strcmp(f, "safe")) return *out = x, true;
  if (!strcmp(f, "list")) {
    coll *c = new_coll(r, false, 0);
    if (!c) return rerr(r, e->line, "out of memory");
    return *out = (val){.k = V_LIST, .c = c}, true;
  }
  return rerr(r, e->line, "'%s' is undefined (filter %s)", x.undef_name ? x.undef_name : "value",
              f);
}

static bool filter(render *r, const expr *e, val x, val *out) {
  const char *f = e->name;
  args_t a;
  if (!eval_args(r, e, &a)) return false;
  const val *a0 = arg(&a, 0, NULL);
  if (!strcmp(f, "default") || !strcmp(f, "d")) {
    const val *b = arg(&a, 1, "boolean");
    bool use = x.k == V_UNDEF || (b && truthy(*b) && !truthy(x));
    *out = use ? (a0 ? *a0 : mk_str("", 0)) : x;
    return true;
  }
  if (x.k == V_UNDEF) return undefined_filter(r, e, f, x, out);
  if (!strcmp(f, "trim"))
    return need_str(r, e->line, x, "trim") && (*out = strip(x, true, true), true);
  if (!strcmp(f, "length") || !strcmp(f, "count")) {
    int64_t n = length_of(x);
    if (n < 0) return rerr(r, e->line, "length of a %s", vkind_name(x.k));
    return *out = mk_int(n), true;
  }
  if (!strcmp(f, "upper") || !strcmp(f, "lower") || !strcmp(f, "capitalize"))
    return need_str(r, e->line, x, f) && str_case(r, x, f[0] == 'l' ? 0 : f[0] == 'u' ? 1 : 2, out);
  if (!strcmp(f, "string")) return to_str(r, x, out);
  if (!strcmp(f, "safe") || !strcmp(f, "list")) {
    if (f[0] == 'l' && x.k == V_STR) {
      int64_t n = u8_len(x.s, x.n);
      coll *c = new_coll(r, false, (int)n);
      if (!c) return rerr(r, e->line, "out of memory");
      for (int64_t i = 0; i < n; i++)
        if (!coll_add(r, c, NULL, 0, u8_char(x, i))) return false;
      return *out = (val){.k = V_LIST, .c = c}, true;
    }
    return *out = x, true;
  }
  if (!strcmp(f, "int")) {
    if (x.k == V_FLOAT) return *out = mk_int((int64_t)x.f), true;
    if (x.k == V_STR)
      return *out = mk_int(strtoll(ir_arena_strndup(r->a, x.s, x.n), NULL, 10)), true;
    int64_t i = 0;
    return as_int(r, e->line, x, &i, "int") && (*out = mk_int(i), true);
  }
  if (!strcmp(f, "tojson")) {
    const val *ind = arg(&a, 0, "indent");
    if (ind && ind->k != V_NONE) return rerr(r, e->line, "tojson(indent) is not supported");
    sbuf b = {r, NULL, 0, 0};
    if (!repr(&b, x, true, true)) return false;
    return *out = mk_str(b.s ? b.s : "", b.n), true;
  }
  if (!strcmp(f, "join")) {
    if (x.k != V_LIST) return rerr(r, e->line, "join of a %s", vkind_name(x.k));
    val sep = a0 ? *a0 : mk_str("", 0);
    sbuf b = {r, NULL, 0, 0};
    for (int i = 0; i < x.c->len; i++) {
      val s;
      if ((i && !sb_add(&b, sep.s, sep.n)) || !to_str(r, x.c->items[i], &s) ||
          !sb_add(&b, s.s, s.n))
        return false;
    }
    return *out = mk_str(b.s ? b.s : "", b.n), true;
  }
  if (!strcmp(f, "first") || !strcmp(f, "last")) {
    int64_t n = length_of(x);
    if (n <= 0 || x.k == V_DICT) return *out = (val){.k = V_UNDEF, .undef_name = f}, true;
    return get_item(r, e->line, x, mk_int(f[0] == 'f' ? 0 : n - 1), out, false);
  }
  if (!strcmp(f, "replace") && a0 && arg(&a, 1, NULL))
    return need_str(r, e->line, x, f) && replace(r, x, *a0, *arg(&a, 1, NULL), out);
  if (!strcmp(f, "items")) {
    args_t none = {.n = 0};
    return call_method(r, e->line, x, "items", &none, out);
  }
  return rerr(r, e->line, "the filter %s is not supported", f);
}

static bool test(render *r, const expr *e, val x, bool *out) {
  const char *t = e->name;
  if (!strcmp(t, "defined"))
    *out = x.k != V_UNDEF;
  else if (!strcmp(t, "undefined"))
    *out = x.k == V_UNDEF;
  else if (!strcmp(t, "none"))
    *out = x.k == V_NONE;
  else if (!strcmp(t, "string"))
    *out = x.k == V_STR;
  else if (!strcmp(t, "number"))
    *out = x.k == V_INT || x.k == V_FLOAT;
  else if (!strcmp(t, "integer"))
    *out = x.k == V_INT;
  else if (!strcmp(t, "float"))
    *out = x.k == V_FLOAT;
  else if (!strcmp(t, "boolean"))
    *out = x.k == V_BOOL;
  else if (!strcmp(t, "true"))
    *out = x.k == V_BOOL && x.b;
  else if (!strcmp(t, "false"))
    *out = x.k == V_BOOL && !x.b;
  else if (!strcmp(t, "mapping"))
    *out = x.k == V_DICT;
  else if (!strcmp(t, "sequence"))
    *out = x.k == V_LIST || x.k == V_STR || x.k == V_DICT;
  else if (!strcmp(t, "iterable"))
    *out = x.k == V_LIST || x.k == V_STR || x.k == V_DICT;
  else if (!strcmp(t, "callable"))
    *out = x.k == V_FUNC;
  else if (!strcmp(t, "even") || !strcmp(t, "odd") || !strcmp(t, "divisibleby")) {
    int64_t i = 0, d = t[0] == 'd' ? 0 : 2;
    if (!as_int(r, e->line, x, &i, t)) return false;
    if (t[0] == 'd') {
      val dv;
      if (e->n_args != 1 || !eval(r, e->args[0], &dv) || !as_int(r, e->line, dv, &d, t))
        return false;
      if (d == 0) return rerr(r, e->line, "divisibleby 0");
    }
    *out = t[0] == 'o' ? i % 2 != 0 : i % d == 0;
  } else if (!strcmp(t, "eq") || !strcmp(t, "equalto") || !strcmp(t, "sameas")) {
    val y;
    if (e->n_args != 1 || !eval(r, e->args[0], &y))
      return rerr(r, e->line, "%s needs one argument", t);
    *out = equal(x, y);
  } else {
    return rerr(r, e->line, "the test %s is not supported", t);
  }
  if (e->negate) *out = !*out;
  return true;
}

static bool num(val v, double *d, bool *is_int, int64_t *i) {
  if (v.k == V_INT || v.k == V_BOOL)
    return *i = v.k == V_INT ? v.i : v.b, *d = (double)*i, *is_int = true, true;
  if (v.k == V_FLOAT) return *d = v.f, *is_int = false, true;
  return false;
}

static bool binop(render *r, const expr *e, val a, val b, val *out) {
  const char *op = e->name;
  if (!strcmp(op, "~")) {
    val x, y;
    if (a.k == V_UNDEF) a = mk_str("", 0);
    if (b.k == V_UNDEF) b = mk_str("", 0);
    if (!to_str(r, a, &x) || !to_str(r, b, &y)) return false;
    char *s = ir_arena_alloc(r->a, x.n + y.n + 1);
    if (!s) return rerr(r, e->line, "out of memory");
    memcpy(s, x.s, x.n), memcpy(s + x.n, y.s, y.n);
    return *out = mk_str(s, x.n + y.n), true;
  }
  if (!strcmp(op, "==") || !strcmp(op, "!=")) {
    bool eq = equal(a, b);
    return *out = mk_bool(op[0] == '=' ? eq : !eq), true;
  }
  if (!strcmp(op, "in") || !strcmp(op, "not in")) {
    bool found = false;
    if (b.k == V_STR) {
      if (!need_str(r, e->line, a, "'in' of a string")) return false;
      for (size_t i = 0; i + a.n <= b.n && !found; i++) found = memcmp(b.s + i, a.s, a.n) == 0;
    } else if (b.k == V_LIST) {
      for (int i = 0; i < b.c->len && !found; i++) found = equal(a, b.c->items[i]);
    } else if (b.k == V_DICT) {
      found = a.k == V_STR && coll_find(b.c, a.s, a.n) >= 0;
    } else {
      return rerr(r, e->line, "'in' of a %s", vkind_name(b.k));
    }
    return *out = mk_bool(op[0] == 'i' ? found : !found), true;
  }
  double x = 0, y = 0;
  bool xi = false, yi = false;
  int64_t ia = 0, ib = 0;
  bool an = num(a, &x, &xi, &ia), bn = num(b, &y, &yi, &ib);
  if (op[0] == '<' || op[0] == '>') {
    int c;
    if (an && bn)
      c = x < y ? -1 : x > y;
    else if (a.k == V_STR && b.k == V_STR) {
      size_t m = a.n < b.n ? a.n : b.n;
      c = memcmp(a.s, b.s, m);
      if (c == 0) c = a.n < b.n ? -1 : a.n > b.n;
    } else {
      return rerr(r, e->line, "cannot compare %s with %s", vkind_name(a.k), vkind_name(b.k));
    }
    bool res = !strcmp(op, "<")    ? c < 0
               : !strcmp(op, ">")  ? c > 0
               : !strcmp(op, "<=") ? c <= 0
                                   : c >= 0;
    return *out = mk_bool(res), true;
  }
  if (!strcmp(op, "+") && a.k == V_STR && b.k == V_STR) {
    char *s = ir_arena_alloc(r->a, a.n + b.n + 1);
    if (!s) return rerr(r, e->line, "out of memory");
    memcpy(s, a.s, a.n), memcpy(s + a.n, b.s, b.n);
    return *out = mk_str(s, a.n + b.n), true;
  }
  if (!strcmp(op, "+") && a.k == V_LIST && b.k == V_LIST) {
    coll *c = new_coll(r, false, a.c->len + b.c->len);
    if (!c) return rerr(r, e->line, "out of memory");
    for (int i = 0; i < a.c->len; i++)
      if (!coll_add(r, c, NULL, 0, a.c->items[i])) return false;
    for (int i = 0; i < b.c->len; i++)
      if (!coll_add(r, c, NULL, 0, b.c->items[i])) return false;
    return *out = (val){.k = V_LIST, .c = c}, true;
  }
  if (!strcmp(op, "*") && a.k == V_STR && bn && yi) {
    sbuf s = {r, NULL, 0, 0};
    for (int64_t i = 0; i < ib; i++)
      if (!sb_add(&s, a.s, a.n)) return false;
    return *out = mk_str(s.s ? s.s : "", s.n), true;
  }
  if (!an || !bn)
    return rerr(r, e->line, "unsupported operand types for %s: %s and %s", op, vkind_name(a.k),
                vkind_name(b.k));
  bool ints = xi && yi;
  switch (op[0]) {
    case '+':
      *out = ints ? mk_int(ia + ib) : (val){.k = V_FLOAT, .f = x + y};
      return true;
    case '-':
      *out = ints ? mk_int(ia - ib) : (val){.k = V_FLOAT, .f = x - y};
      return true;
    case '*':
      if (op[1] == '*') {
        *out = (val){.k = V_FLOAT, .f = pow(x, y)};
        if (ints && ib >= 0 && fabs(out->f) < 9e15) *out = mk_int((int64_t)out->f);
        return true;
      }
      *out = ints ? mk_int(ia * ib) : (val){.k = V_FLOAT, .f = x * y};
      return true;
    case '/':
    case '%':
      if (y == 0) return rerr(r, e->line, "division by zero");
      if (op[0] == '/' && op[1] != '/') return *out = (val){.k = V_FLOAT, .f = x / y}, true;
      if (ints) { /* Python: floor division, the remainder takes the divisor's sign */
        int64_t q = ia / ib, m = ia % ib;
        if (m != 0 && ((m < 0) != (ib < 0))) q--, m += ib;
        *out = mk_int(op[0] == '%' ? m : q);
        return true;
      }
      *out = (val){.k = V_FLOAT, .f = op[0] == '%' ? x - y * floor(x / y) : floor(x / y)};
      return true;
  }
  return rerr(r, e->line, "unknown operator %s", op);
}

static bool eval(render *r, const expr *e, val *out) {
  if (++r->depth > 400) return rerr(r, e->line, "the template recurses too deeply");
  bool ok = true;
  val a, b;
  switch (e->k) {
    case E_LIT:
      *out = e->lit;
      break;
    case E_NAME:
      ok = lookup(r, e->name, out);
      break;
    case E_ATTR:
      ok =
          eval(r, e->a, &a) && get_item(r, e->line, a, mk_str(e->name, strlen(e->name)), out, true);
      break;
    case E_INDEX:
      ok = eval(r, e->a, &a) && eval(r, e->b, &b) && get_item(r, e->line, a, b, out, false);
      break;
    case E_SLICE: {
      ok = eval(r, e->a, &a);
      int64_t n = ok ? length_of(a) : 0, lo = 0, hi = 0, step = 1;
      if (ok && (n < 0 || a.k == V_DICT)) ok = rerr(r, e->line, "a slice of a %s", vkind_name(a.k));
      val v;
      if (ok && e->args[0]) ok = eval(r, e->args[0], &v) && as_int(r, e->line, v, &step, "a step");
      if (ok && step == 0) ok = rerr(r, e->line, "a slice step of 0");
      lo = step > 0 ? 0 : n - 1, hi = step > 0 ? n : -n - 1;
      if (ok && e->b) ok = eval(r, e->b, &v) && as_int(r, e->line, v, &lo, "a slice bound");
      if (ok && e->c) ok = eval(r, e->c, &v) && as_int(r, e->line, v, &hi, "a slice bound");
      if (!ok) break;
      /* Python's slice.indices */
      if (e->b) {
        if (lo < 0) lo += n;
        lo = step > 0 ? (lo < 0 ? 0 : lo > n ? n : lo) : (lo < -1 ? -1 : lo > n - 1 ? n - 1 : lo);
      }
      if (e->c) {
        if (hi < 0) hi += n;
        hi = step > 0 ? (hi < 0 ? 0 : hi > n ? n : hi) : (hi < -1 ? -1 : hi > n - 1 ? n - 1 : hi);
      } else
        hi = step > 0 ? n : -1;
      if (a.k == V_STR) {
        sbuf s = {r, NULL, 0, 0};
        for (int64_t i = lo; ok && (step > 0 ? i < hi : i > hi); i += step) {
          val ch = u8_char(a, i);
          ok = sb_add(&s, ch.s, ch.n);
        }
        *out = mk_str(s.s ? s.s : "", s.n);
      } else {
        coll *c = new_coll(r, false, 4);
        if (!c) ok = rerr(r, e->line, "out of memory");
        for (int64_t i = lo; ok && (step > 0 ? i < hi : i > hi); i += step)
          ok = coll_add(r, c, NULL, 0, a.c->items[i]);
        *out = (val){.k = V_LIST, .c = c};
      }
      break;
    }
    case E_CALL:
      ok = call(r, e, out);
      break;
    case E_FILTER:
      ok = eval(r, e->a, &a) && filter(r, e, a, out);
      break;
    case E_TEST: {
      bool t = false;
      ok = eval(r, e->a, &a) && test(r, e, a, &t);
      *out = mk_bool(t);
      break;
    }
    case E_NOT:
      ok = eval(r, e->a, &a);
      *out = mk_bool(!truthy(a));
      break;
    case E_NEG:
      ok = eval(r, e->a, &a);
      if (ok && a.k == V_INT)
        *out = mk_int(-a.i);
      else if (ok && a.k == V_FLOAT)
        *out = (val){.k = V_FLOAT, .f = -a.f};
      else if (ok)
        ok = rerr(r, e->line, "negation of a %s", vkind_name(a.k));
      break;
    case E_AND: /* Python: the deciding operand */
      ok = eval(r, e->a, &a);
      if (ok && !truthy(a))
        *out = a;
      else if (ok)
        ok = eval(r, e->b, out);
      break;
    case E_OR:
      ok = eval(r, e->a, &a);
      if (ok && truthy(a))
        *out = a;
      else if (ok)
        ok = eval(r, e->b, out);
      break;
    case E_COND:
      ok = eval(r, e->b, &b);
      if (ok && truthy(b))
        ok = eval(r, e->a, out);
      else if (ok && e->c)
        ok = eval(r, e->c, out);
      else if (ok)
        *out = (val){.k = V_UNDEF, .undef_name = "an if without else"};
      break;
    case E_BIN:
      ok = eval(r, e->a, &a) && eval(r, e->b, &b) && binop(r, e, a, b, out);
      break;
    case E_LIST:
    case E_DICT: {
      bool dict = e->k == E_DICT;
      coll *c = new_coll(r, dict, e->n_args);
      if (!c) {
        ok = rerr(r, e->line, "out of memory");
        break;
      }
      for (int i = 0; ok && i < e->n_args; i += dict ? 2 : 1) {
        val k, v;
        ok = eval(r, e->args[i], &k);
        if (ok && dict) {
          ok = (k.k == V_STR || rerr(r, e->line, "dict keys must be strings here")) &&
               eval(r, e->args[i + 1], &v);
          if (ok) {
            int at = coll_find(c, k.s, k.n);
            if (at >= 0)
              c->items[at] = v;
            else
              ok = coll_add(r, c, k.s, k.n, v);
          }
        } else if (ok) {
          ok = coll_add(r, c, NULL, 0, k);
        }
      }
      *out = (val){.k = dict ? V_DICT : V_LIST, .c = c};
      break;
    }
  }
  r->depth--;
  return ok;
}

static bool run_nodes(render *r, const node_list *l);

static bool run_node(render *r, const node *n) {
  val v;
  switch (n->k) {
    case N_TEXT:
      return emit(r, n->text, n->len);
    case N_OUT: {
      if (!eval(r, n->e, &v)) return false;
      if (v.k == V_UNDEF) return true;
      val s;
      return to_str(r, v, &s) && emit(r, s.s, s.n);
    }
    case N_SET:
      if (!eval(r, n->e, &v)) return false;
      if (n->var2) {
        val ns;
        if (!lookup(r, n->var, &ns)) return false;
        if (ns.k != V_DICT || !ns.c->ns)
          return rerr(r, n->line, "set %s.%s: '%s' is not a namespace()", n->var, n->var2, n->var);
        int at = coll_find(ns.c, n->var2, strlen(n->var2));
        if (at >= 0)
          ns.c->items[at] = v;
        else
          return coll_add(r, ns.c, n->var2, strlen(n->var2), v);
        return true;
      }
      return set_var(r, n->var, v);
    case N_IF:
      if (!eval(r, n->e, &v)) return false;
      return run_nodes(r, truthy(v) ? &n->body : &n->other);
    case N_BLOCK:
      return run_nodes(r, &n->body);
    case N_BREAK:
    case N_CONTINUE:
      r->ctl = n->k == N_BREAK ? 1 : 2;
      return true;
    case N_FOR: {
      val it;
      if (!eval(r, n->e, &it)) return false;
      if (it.k == V_UNDEF) it = (val){.k = V_LIST, .c = new_coll(r, false, 1)};
      if (it.k == V_STR) { /* characters */
        int64_t len = u8_len(it.s, it.n);
        coll *c = new_coll(r, false, (int)len);
        if (!c) return rerr(r, n->line, "out of memory");
        for (int64_t i = 0; i < len; i++)
          if (!coll_add(r, c, NULL, 0, u8_char(it, i))) return false;
        it = (val){.k = V_LIST, .c = c};
      }
      if ((it.k != V_LIST && it.k != V_DICT) || !it.c)
        return rerr(r, n->line, "for: cannot iterate over a %s", vkind_name(it.k));
      /* the items the `if` keeps, first: loop.length counts those */
      val *items = ir_arena_alloc(r->a, (size_t)(it.c->len ? it.c->len : 1) * sizeof *items);
      if (!items) return rerr(r, n->line, "out of memory");
      int count = 0;
      scope *outer = r->vars;
      for (int i = 0; i < it.c->len; i++) {
        val x = it.k == V_DICT ? mk_str(it.c->keys[i], it.c->key_len[i]) : it.c->items[i];
        if (n->cond) {
          r->vars = outer;
          if (!set_var(r, n->var, x)) return false;
          if (n->var2 && x.k == V_LIST && x.c->len == 2 &&
              (!set_var(r, n->var, x.c->items[0]) || !set_var(r, n->var2, x.c->items[1])))
            return false;
          val keep;
          if (!eval(r, n->cond, &keep)) return false;
          if (!truthy(keep)) continue;
        }
        items[count++] = x;
      }
      r->vars = outer;
      loop_info li = {0, count};
      for (int i = 0; i < count; i++) {
        li.index0 = i;
        r->vars = outer; /* each iteration sees the outer scope; its sets stay inside */
        val x = items[i];
        if (n->var2) {
          if (x.k != V_LIST || x.c->len != 2)
            return rerr(r, n->line, "for %s, %s: an item is not a pair", n->var, n->var2);
          if (!set_var(r, n->var, x.c->items[0]) || !set_var(r, n->var2, x.c->items[1]))
            return false;
        } else if (!set_var(r, n->var, x)) {
          return false;
        }
        if (!set_var(r, "loop", (val){.k = V_LOOP, .lp = &li})) return false;
        if (!run_nodes(r, &n->body)) return false;
        int ctl = r->ctl;
        r->ctl = 0;
        if (ctl == 1) break;
      }
      r->vars = outer;
      if (count == 0) return run_nodes(r, &n->other);
      return true;
    }
  }
  return true;
}

static bool run_nodes(render *r, const node_list *l) {
  for (int i = 0; i < l->n && !r->ctl; i++)
    if (!run_node(r, l->v[i])) return false;
  return true;
}

/* ---------------------------------------------------------------- API */

void dsc_chat_template_free(dsc_chat_template *t) {
  if (!t) return;
  dsc_context *ctx = t->ctx;
  ir_arena_release(&t->arena);
  ir_free(ctx, t, sizeof *t);
}

dsc_status dsc_chat_template_parse(dsc_context *ctx, const char *source, const char *bos,
                                   const char *eos, dsc_chat_template **out) {
  *out = NULL;
  dsc_chat_template *t = ir_alloc(ctx, sizeof *t);
  if (!t) {
    ir_error(ctx, ir_no_loc, "chat template: out of memory");
    return DSC_ERR_INTERNAL;
  }
  memset(t, 0, sizeof *t);
  t->ctx = ctx;
  ir_arena_init(&t->arena, ctx);
  parser p = {ctx, &t->arena, NULL, 0, 0, 1, 0, 0, 1, 0, ""};
  p.len = strlen(source);
  char *src = ir_arena_strndup(&t->arena, source, p.len);
  t->bos = ir_arena_strdup(&t->arena, bos ? bos : "");
  t->eos = ir_arena_strdup(&t->arena, eos ? eos : "");
  p.src = src;
  seg_list segs = {NULL, 0, 0};
  bool ok = src && t->bos && t->eos && segment(&p, &segs);
  if (ok) {
    trim_text(&p, &segs);
    cursor c = {&segs, 0};
    char stop[32];
    ok = parse_block(&p, &c, &t->top, NULL, 0, stop, sizeof stop);
  }
  free(segs.v);
  if (!ok) {
    ir_error(ctx, ir_no_loc, "chat template: %s", p.err[0] ? p.err : "out of memory");
    dsc_chat_template_free(t);
    return DSC_ERR_USER;
  }
  *out = t;
  return DSC_OK;
}

/* tokenizer_config.json's bos_token / eos_token: a string or {"content": ...}. */
static const char *special(const cJSON *cfg, const char *key) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, key);
  if (cJSON_IsObject(v)) v = cJSON_GetObjectItemCaseSensitive(v, "content");
  return cJSON_IsString(v) ? v->valuestring : "";
}

dsc_status dsc_chat_template_load(dsc_context *ctx, const char *path, dsc_chat_template **out) {
  *out = NULL;
  char *text = NULL;
  size_t len = 0;
  dsc_status rs = rt_read_small(ctx, path, 64u << 20, &text, &len);
  if (rs != DSC_OK) return rs;
  cJSON *cfg = cJSON_ParseWithLength(text, len);
  dsc_status st = DSC_OK;
  if (!cfg) {
    /* not JSON: the file is the template itself (a .jinja file) */
    st = dsc_chat_template_parse(ctx, text, "", "", out);
  } else {
    const cJSON *tpl = cJSON_GetObjectItemCaseSensitive(cfg, "chat_template");
    if (cJSON_IsArray(tpl)) { /* [{"name": "default", "template": ...}, ...] */
      const cJSON *e, *found = NULL;
      cJSON_ArrayForEach(e, tpl) {
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(e, "name");
        if (cJSON_IsString(nm) && strcmp(nm->valuestring, "default") == 0)
          found = cJSON_GetObjectItemCaseSensitive(e, "template");
      }
      tpl = found;
    }
    if (!cJSON_IsString(tpl)) {
      ir_error(ctx, ir_no_loc, "%s: no chat_template (a string, or a list with a \"default\")",
               path);
      st = DSC_ERR_USER;
    } else {
      st = dsc_chat_template_parse(ctx, tpl->valuestring, special(cfg, "bos_token"),
                                   special(cfg, "eos_token"), out);
      if (st != DSC_OK) ir_diag(ctx, DSC_DIAG_NOTE, ir_no_loc, "in %s", path);
    }
    cJSON_Delete(cfg);
  }
  ir_free(ctx, text, len + 1);
  return st;
}

dsc_status dsc_chat_template_render(const dsc_chat_template *t, const char *messages_json,
                                    bool add_generation_prompt, char **out, size_t *out_len) {
  *out = NULL;
  if (out_len) *out_len = 0;
  ir_arena a;
  ir_arena_init(&a, t->ctx);
  render r = {t, &a, NULL, NULL, 0, 0, "", 0, 0};
  cJSON *msgs = cJSON_Parse(messages_json ? messages_json : "");
  val m;
  bool ok = msgs && cJSON_IsArray(msgs);
  if (!ok) rerr(&r, 0, "the messages are not a JSON list");
  ok = ok && from_json(&r, msgs, &m, 0) && set_var(&r, "messages", m) &&
       set_var(&r, "add_generation_prompt", mk_bool(add_generation_prompt)) &&
       set_var(&r, "bos_token", mk_str(t->bos, strlen(t->bos))) &&
       set_var(&r, "eos_token", mk_str(t->eos, strlen(t->eos))) &&
       /* transformers passes these, None without tools or documents */
       set_var(&r, "tools", (val){.k = V_NONE}) && set_var(&r, "documents", (val){.k = V_NONE}) &&
       emit(&r, "", 0) && run_nodes(&r, &t->top);
  cJSON_Delete(msgs);
  ir_arena_release(&a);
  if (!ok) {
    free(r.out);
    ir_error(t->ctx, ir_no_loc, "chat template: %s", r.err[0] ? r.err : "out of memory");
    return DSC_ERR_USER;
  }
  *out = r.out;
  if (out_len) *out_len = r.len;
  return DSC_OK;
}
