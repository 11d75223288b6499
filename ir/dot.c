/* Graphviz DOT export: one cluster per graph, one node per IR node
 * (labelled with op, short attributes and type), edges from each input to
 * its user, and a "return" node per graph collecting the outputs.
 * Graph inputs are drawn as houses, params as cylinders, constants as
 * ellipses, everything else as boxes. */
#include <stdio.h>
#include <string.h>

#include "ir/ir.h"

/* Writes s escaped for a DOT double-quoted string, at most max bytes. */
static void dot_str(FILE *out, const char *s, size_t max) {
  size_t n = 0;
  for (; s && *s && n < max; s++, n++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\')
      fprintf(out, "\\%c", c);
    else if (c == '\n')
      fputs("\\n", out);
    else if (c < 0x20 || c == 0x7f)
      fputc(' ', out);
    else
      fputc(c, out);
  }
  if (s && *s) fputs("...", out);
}

static void dot_attr(FILE *out, const dsc_attr *a) {
  char b[64];
  dot_str(out, a->key ? a->key : "?", 32);
  fputc('=', out);
  switch (a->kind) {
    case DSC_ATTR_INT:
      fprintf(out, "%lld", (long long)a->u.i);
      break;
    case DSC_ATTR_FLOAT:
      ir_format_double(a->u.f, b, sizeof b);
      fputs(b, out);
      break;
    case DSC_ATTR_BOOL:
      fputs(a->u.b ? "true" : "false", out);
      break;
    case DSC_ATTR_DTYPE:
      fputs(dsc_dtype_name(a->u.dt), out);
      break;
    case DSC_ATTR_STR:
      fputs("\\\"", out);
      dot_str(out, a->u.s, 32);
      fputs("\\\"", out);
      break;
    case DSC_ATTR_INTS:
      fputc('[', out);
      for (int i = 0; i < a->u.ints.n && a->u.ints.v; i++) {
        if (i == 8) { /* short: long lists are elided */
          fputs(",...", out);
          break;
        }
        fprintf(out, i ? ",%lld" : "%lld", (long long)a->u.ints.v[i]);
      }
      fputc(']', out);
      break;
  }
}

static bool node_ok(const ir_graph *g, const ir_node *n) {
  return n && n->graph == g && n->id >= 0 && n->id < g->n_nodes && g->nodes[n->id] == n;
}

dsc_status dsc_module_print_dot(const dsc_module *m, FILE *out) {
  if (!m || !out) return DSC_ERR_INTERNAL;
  fputs("digraph \"", out);
  dot_str(out, m->name, 200);
  fputs("\" {\n", out);
  fputs("  compound=true;\n  node [fontname=\"monospace\", fontsize=10];\n", out);
  for (int gi = 0; gi < m->n_graphs; gi++) {
    const ir_graph *g = m->graphs[gi];
    if (!g) continue;
    fprintf(out, "  subgraph \"cluster_%d\" {\n    label=\"", gi);
    dot_str(out, g->name, 200);
    fputs("\";\n", out);
    int num = 0;
    for (int i = 0; i < g->n_nodes; i++) {
      const ir_node *n = g->nodes[i];
      if (!n) continue;
      char type[256];
      dsc_type_format(&n->type, type, sizeof type);
      const char *shape = "box";
      if (n->op == DSC_OP_INPUT)
        shape = "invhouse";
      else if (n->op == DSC_OP_PARAM)
        shape = "cylinder";
      else if (n->op == DSC_OP_CONST || n->op == DSC_OP_IOTA)
        shape = "ellipse";
      fprintf(out, "    g%d_n%d [shape=%s, label=\"", gi, i, shape);
      if (n->op == DSC_OP_INPUT) {
        fputc('%', out);
        dot_str(out, n->name ? n->name : "?", 64);
      } else {
        fprintf(out, "%%%d = %s", num++, dsc_op_name(n->op));
        for (int j = 0; j < n->n_attrs && n->attrs; j++) {
          fputs(j ? ", " : "\\n", out);
          dot_attr(out, &n->attrs[j]);
        }
      }
      fprintf(out, "\\n%s\"];\n", type);
    }
    fprintf(out, "    g%d_ret [shape=house, label=\"return\"];\n", gi);
    for (int i = 0; i < g->n_nodes; i++) {
      const ir_node *n = g->nodes[i];
      if (!n || (n->n_in > 0 && !n->in)) continue;
      for (int j = 0; j < n->n_in; j++)
        if (node_ok(g, n->in[j]))
          fprintf(out, "    g%d_n%d -> g%d_n%d;\n", gi, n->in[j]->id, gi, i);
    }
    for (int i = 0; i < g->n_outputs && g->outputs; i++)
      if (node_ok(g, g->outputs[i]))
        fprintf(out, "    g%d_n%d -> g%d_ret;\n", gi, g->outputs[i]->id, gi);
    fputs("  }\n", out);
  }
  fputs("}\n", out);
  if (ferror(out)) {
    ir_error(m->ctx, ir_no_loc, "could not write the DOT graph (I/O error)");
    return DSC_ERR_INTERNAL;
  }
  return DSC_OK;
}
