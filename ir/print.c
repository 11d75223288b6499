/* The text form of a module (the reference is docs/ir.md and ir/parse.c).
 *
 * Canonical layout, so that print -> parse -> print is byte-identical:
 *   module NAME\n
 *   then each non-empty section preceded by one blank line:
 *     meta lines, param lines, and every graph (graphs are separated by one
 *     blank line each). The text ends with "}\n" (or the last section's
 *     newline). Nothing else, no trailing spaces.
 * Graph inputs print as %<name>; every other node as %N, numbered in node
 * order skipping inputs. Names that are not identifiers print quoted. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "ir/ir.h"

/* Output goes either to a FILE or to a growable buffer. */
typedef struct {
  FILE *f;
  dsc_context *ctx;
  char *buf;
  size_t len, cap;
  bool failed;
} writer;

static void w_write(writer *w, const char *s, size_t n) {
  if (w->failed || n == 0) return;
  if (w->f) {
    if (fwrite(s, 1, n, w->f) != n) w->failed = true;
    return;
  }
  if (w->len + n + 1 > w->cap) {
    size_t cap = w->cap ? w->cap : 256;
    while (cap < w->len + n + 1) cap *= 2;
    char *b = ir_realloc(w->ctx, w->buf, w->cap, cap);
    if (!b) {
      w->failed = true;
      return;
    }
    w->buf = b;
    w->cap = cap;
  }
  memcpy(w->buf + w->len, s, n);
  w->len += n;
  w->buf[w->len] = 0;
}

static void w_puts(writer *w, const char *s) { w_write(w, s, strlen(s)); }

static void w_printf(writer *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void w_printf(writer *w, const char *fmt, ...) {
  char small[256];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(small, sizeof small, fmt, ap);
  va_end(ap);
  if (n < 0) {
    w->failed = true;
    return;
  }
  if ((size_t)n < sizeof small) {
    w_write(w, small, (size_t)n);
    return;
  }
  /* Long output (only from %s of long strings): format into the buffer. */
  char *tmp = ir_alloc(w->ctx, (size_t)n + 1);
  if (!tmp) {
    w->failed = true;
    return;
  }
  va_start(ap, fmt);
  vsnprintf(tmp, (size_t)n + 1, fmt, ap);
  va_end(ap);
  w_write(w, tmp, (size_t)n);
  ir_free(w->ctx, tmp, (size_t)n + 1);
}

/* An identifier of the text form: [A-Za-z_][A-Za-z0-9_.]* */
static bool is_ident(const char *s) {
  if (!s || !((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || *s == '_')) return false;
  for (s++; *s; s++)
    if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
          *s == '_' || *s == '.'))
      return false;
  return true;
}

static void w_quoted(writer *w, const char *s) {
  w_puts(w, "\"");
  if (!s) s = "";
  const char *run = s;
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    const char *esc = NULL;
    char hex[8];
    if (c == '"')
      esc = "\\\"";
    else if (c == '\\')
      esc = "\\\\";
    else if (c == '\n')
      esc = "\\n";
    else if (c == '\t')
      esc = "\\t";
    else if (c < 0x20 || c == 0x7f) {
      snprintf(hex, sizeof hex, "\\x%02x", c);
      esc = hex;
    }
    if (esc) {
      w_write(w, run, (size_t)(s - run));
      w_puts(w, esc);
      run = s + 1;
    }
  }
  w_write(w, run, (size_t)(s - run));
  w_puts(w, "\"");
}

static void w_name(writer *w, const char *s) {
  if (is_ident(s))
    w_puts(w, s);
  else
    w_quoted(w, s);
}

static void w_double(writer *w, double v) {
  char b[64];
  ir_format_double(v, b, sizeof b);
  w_puts(w, b);
}

static void w_type(writer *w, const dsc_type *t) {
  char b[256];
  dsc_type_format(t, b, sizeof b);
  w_puts(w, b);
}

/* The printed name of a value used in graph g; nums[id] is its number. */
static void w_value(writer *w, const ir_graph *g, const int *nums, const ir_node *n) {
  if (!n || n->graph != g || n->id < 0 || n->id >= g->n_nodes || g->nodes[n->id] != n) {
    w_puts(w, "%?"); /* invalid IR: printed so that the parser rejects it */
    return;
  }
  if (n->op == DSC_OP_INPUT && n->name) {
    w_puts(w, "%");
    if (is_ident(n->name))
      w_puts(w, n->name);
    else
      w_quoted(w, n->name);
    return;
  }
  w_printf(w, "%%%d", nums[n->id]);
}

static void w_attr_value(writer *w, const dsc_attr *a) {
  switch (a->kind) {
    case DSC_ATTR_INT:
      w_printf(w, "%lld", (long long)a->u.i);
      break;
    case DSC_ATTR_FLOAT:
      w_double(w, a->u.f);
      break;
    case DSC_ATTR_BOOL:
      w_puts(w, a->u.b ? "true" : "false");
      break;
    case DSC_ATTR_DTYPE:
      w_puts(w, dsc_dtype_name(a->u.dt));
      break;
    case DSC_ATTR_STR:
      w_quoted(w, a->u.s);
      break;
    case DSC_ATTR_INTS:
      w_puts(w, "[");
      for (int i = 0; i < a->u.ints.n && a->u.ints.v; i++)
        w_printf(w, i ? ",%lld" : "%lld", (long long)a->u.ints.v[i]);
      w_puts(w, "]");
      break;
    default:
      w_puts(w, "?");
      break;
  }
}

static void w_init(writer *w, dsc_init init) {
  switch (init.kind) {
    case DSC_INIT_ZEROS:
      w_puts(w, "zeros");
      break;
    case DSC_INIT_ONES:
      w_puts(w, "ones");
      break;
    case DSC_INIT_CONST:
      w_puts(w, "const(");
      w_double(w, init.a);
      w_puts(w, ")");
      break;
    case DSC_INIT_NORMAL:
    case DSC_INIT_UNIFORM:
      w_puts(w, init.kind == DSC_INIT_NORMAL ? "normal(" : "uniform(");
      w_double(w, init.a);
      w_puts(w, ", ");
      w_double(w, init.b);
      w_puts(w, ")");
      break;
    case DSC_INIT_COPY:
      w_puts(w, "copy(");
      w_name(w, init.from);
      w_puts(w, ")");
      break;
    default:
      w_puts(w, "?");
      break;
  }
}

static void w_graph(writer *w, const ir_graph *g) {
  dsc_context *ctx = g->module->ctx;
  size_t nbytes = sizeof(int) * (size_t)(g->n_nodes ? g->n_nodes : 1);
  int *nums = ir_alloc(ctx, nbytes);
  if (!nums) {
    w->failed = true;
    return;
  }
  int k = 0;
  for (int i = 0; i < g->n_nodes; i++)
    nums[i] = g->nodes[i] && g->nodes[i]->op == DSC_OP_INPUT ? -1 : k++;

  w_puts(w, "graph ");
  w_name(w, g->name);
  w_puts(w, "(");
  for (int i = 0; i < g->n_inputs; i++) {
    if (i) w_puts(w, ", ");
    w_value(w, g, nums, g->inputs[i]);
    w_puts(w, ": ");
    if (g->inputs[i]) w_type(w, &g->inputs[i]->type);
  }
  w_puts(w, ") {\n");
  for (int i = 0; i < g->n_nodes; i++) {
    const ir_node *n = g->nodes[i];
    if (!n || n->op == DSC_OP_INPUT) continue;
    w_puts(w, "  ");
    w_value(w, g, nums, n);
    w_puts(w, " = ");
    w_puts(w, dsc_op_name(n->op));
    if (n->n_in > 0) {
      w_puts(w, "(");
      for (int j = 0; j < n->n_in; j++) {
        if (j) w_puts(w, ", ");
        w_value(w, g, nums, n->in[j]);
      }
      w_puts(w, ")");
    }
    if (n->n_attrs > 0) {
      /* Stored order: the op table's order for every verified node. */
      w_puts(w, " {");
      for (int j = 0; j < n->n_attrs; j++) {
        if (j) w_puts(w, ", ");
        w_puts(w, n->attrs[j].key ? n->attrs[j].key : "?");
        w_puts(w, " = ");
        w_attr_value(w, &n->attrs[j]);
      }
      w_puts(w, "}");
    }
    w_puts(w, " : ");
    w_type(w, &n->type);
    if (n->group > 0) w_printf(w, " group %d", n->group);
    if (n->place == IR_PLACE_HOST) w_puts(w, " host"); /* passes/offload_host.c */
    if (n->guard) { /* passes/guard.c */
      w_puts(w, n->guard_if ? " when " : " unless ");
      w_value(w, g, nums, n->guard);
    }
    w_puts(w, "\n");
  }
  w_puts(w, "  return");
  for (int i = 0; i < g->n_outputs; i++) {
    w_puts(w, i ? ", " : " ");
    w_value(w, g, nums, g->outputs[i]);
  }
  w_puts(w, "\n}\n");
  ir_free(ctx, nums, nbytes);
}

static void w_module(writer *w, const ir_module *m) {
  w_puts(w, "module ");
  w_name(w, m->name);
  w_puts(w, "\n");
  if (m->n_meta > 0) {
    w_puts(w, "\n");
    for (int i = 0; i < m->n_meta; i++) {
      w_puts(w, "meta ");
      w_quoted(w, m->meta[i].key);
      w_puts(w, " = ");
      w_quoted(w, m->meta[i].value);
      w_puts(w, "\n");
    }
  }
  if (m->n_params > 0) {
    w_puts(w, "\n");
    for (int i = 0; i < m->n_params; i++) {
      const ir_param *p = &m->params[i];
      w_puts(w, p->state ? "state " : "param ");
      w_name(w, p->name);
      w_puts(w, ": ");
      w_type(w, &p->type);
      w_puts(w, " = ");
      w_init(w, p->init);
      w_puts(w, "\n");
    }
  }
  for (int i = 0; i < m->n_graphs; i++) {
    w_puts(w, "\n");
    w_graph(w, m->graphs[i]);
  }
}

dsc_status dsc_module_print(const dsc_module *m, FILE *out) {
  if (!m || !out) return DSC_ERR_INTERNAL;
  writer w = {.f = out, .ctx = m->ctx};
  w_module(&w, m);
  if (w.failed || ferror(out)) {
    ir_error(m->ctx, ir_no_loc, "could not write the module text (I/O error or out of memory)");
    return DSC_ERR_INTERNAL;
  }
  return DSC_OK;
}

char *dsc_module_print_string(const dsc_module *m) {
  if (!m) return NULL;
  writer w = {.ctx = m->ctx};
  w_module(&w, m);
  if (w.failed || !w.buf) {
    ir_free(m->ctx, w.buf, w.cap);
    ir_error(m->ctx, ir_no_loc, "out of memory while printing the module");
    return NULL;
  }
  /* Shrink to exactly strlen + 1 so that dsc_string_free knows the size. */
  char *s = ir_realloc(m->ctx, w.buf, w.cap, w.len + 1);
  if (!s) {
    ir_free(m->ctx, w.buf, w.cap);
    ir_error(m->ctx, ir_no_loc, "out of memory while printing the module");
    return NULL;
  }
  return s;
}

void dsc_string_free(dsc_context *ctx, char *s) {
  if (ctx && s) ir_free(ctx, s, strlen(s) + 1);
}
