/* The op table, built from include/dsc/ops.def. */
#include <math.h>
#include <pthread.h>
#include <string.h>

#include "ir/ir.h"

/* ---------------------------------------------------------------- scalar functions
 * One C function per elementwise op, from the formula in its row. */
static double sc_max(double a, double b) {
  if (isnan(a) || isnan(b)) return NAN; /* NaN propagates, as in torch.maximum */
  return a > b ? a : b;
}
static double sc_sigmoid(double a) { return 1.0 / (1.0 + exp(-a)); }

#define F_X x[0]
#define F_Y x[1]
#define F_Z x[2]
#define F_P p
#define F_K(c) ((double)(c))
#define F_ADD(a, b) ((a) + (b))
#define F_SUB(a, b) ((a) - (b))
#define F_MUL(a, b) ((a) * (b))
#define F_DIV(a, b) ((a) / (b))
#define F_MAX(a, b) sc_max((a), (b))
#define F_POW(a, b) pow((a), (b))
#define F_LT(a, b) ((double)((a) < (b)))
#define F_GT(a, b) ((double)((a) > (b)))
#define F_EQ(a, b) ((double)((a) == (b)))
#define F_SEL(c, a, b) ((c) != 0 ? (a) : (b))
#define F_NEG(a) (-(a))
#define F_ABS(a) fabs(a)
#define F_EXP(a) exp(a)
#define F_LOG(a) log(a)
#define F_SQRT(a) sqrt(a)
#define F_RSQRT(a) (1.0 / sqrt(a))
#define F_TANH(a) tanh(a)
#define F_SIGMOID(a) sc_sigmoid(a)
#define F_SIN(a) sin(a)
#define F_COS(a) cos(a)
#define F_RAND24(a, b) ((double)ir_rand24((int64_t)(a), (int64_t)(b)))
#define OP(...)
#define EW(id, nm, nin, attrs, shp, ik, gr, fl, bi, formula) \
  static double scalar_##id(const double *x, double p) {    \
    IR_UNUSED(x), IR_UNUSED(p);                             \
    return formula;                                         \
  }
#include "dsc/ops.def"
#undef OP
#undef EW

static ir_op_info op_table[DSC_OP_COUNT] = {
#define OP(id, nm, nin, attrs, shp, ik, cgc, gr)                                                \
  [DSC_OP_##id] = {.name = nm, .n_inputs = nin, .attr_spec = attrs, .shape = shp, .interp = ik, \
                   .cg = cgc, .grad = gr, .builtin = ""},
#define EW(id, nm, nin, attrs, shp, ik, gr, fl, bi, formula)                                    \
  [DSC_OP_##id] = {.name = nm, .n_inputs = nin, .attr_spec = attrs, .shape = shp, .interp = ik, \
                   .cg = IR_CG_ELEMENTWISE, .grad = gr, .scalar = scalar_##id, .flags = fl,     \
                   .builtin = bi},
#include "dsc/ops.def"
#undef OP
#undef EW
};

static const struct {
  const char *name;
  dsc_attr_kind kind;
} attr_kinds[] = {{"int", DSC_ATTR_INT},     {"float", DSC_ATTR_FLOAT}, {"bool", DSC_ATTR_BOOL},
                  {"ints", DSC_ATTR_INTS},   {"dtype", DSC_ATTR_DTYPE}, {"str", DSC_ATTR_STR}};

/* Attribute keys live in a static pool so that the table stays immutable
 * after initialisation. */
static char key_pool[DSC_OP_COUNT][IR_MAX_OP_ATTRS][24];

static void parse_specs(void) {
  for (int op = 0; op < DSC_OP_COUNT; op++) {
    ir_op_info *info = &op_table[op];
    if (info->grad == ir_grad_none) info->grad = NULL;
    const char *p = info->attr_spec;
    info->n_attrs = 0;
    while (*p) {
      while (*p == ' ') p++;
      if (!*p) break;
      const char *colon = strchr(p, ':');
      const char *end = strchr(p, ' ');
      if (!end) end = p + strlen(p);
      int k = info->n_attrs++;
      size_t klen = (size_t)(colon - p);
      memcpy(key_pool[op][k], p, klen);
      key_pool[op][k][klen] = 0;
      info->attr_keys[k] = key_pool[op][k];
      for (size_t j = 0; j < sizeof attr_kinds / sizeof attr_kinds[0]; j++)
        if (strlen(attr_kinds[j].name) == (size_t)(end - colon - 1) &&
            strncmp(colon + 1, attr_kinds[j].name, (size_t)(end - colon - 1)) == 0)
          info->attr_kinds[k] = attr_kinds[j].kind;
      p = end;
    }
  }
}

static pthread_once_t ops_once = PTHREAD_ONCE_INIT;
void ir_ops_init(void) { pthread_once(&ops_once, parse_specs); }

const ir_op_info *ir_op(dsc_op op) {
  ir_ops_init();
  return (unsigned)op < DSC_OP_COUNT ? &op_table[op] : NULL;
}

const char *dsc_op_name(dsc_op op) { return (unsigned)op < DSC_OP_COUNT ? op_table[op].name : "?"; }

int dsc_op_from_name(const char *name, dsc_op *out) {
  for (int i = 0; i < DSC_OP_COUNT; i++)
    if (strcmp(op_table[i].name, name) == 0) {
      *out = (dsc_op)i;
      return 0;
    }
  return -1;
}
