/* frontend/: the model language's whole internal vocabulary, sectioned by
 * source file. The public entry points are in include/dsc/frontend.h. */
#ifndef DSC_FRONTEND_INTERNAL_H
#define DSC_FRONTEND_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "dsc/frontend.h"
#include "ir/ir.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Limits that keep every input bounded (no hang, no unbounded recursion). */
#define FE_MAX_NESTING 256 /* brackets and expression depth */
#define FE_MAX_ERRORS 20   /* syntax/lexical errors per file before giving up */
#define FE_MAX_FILE_BYTES (8 << 20)
#define FE_MAX_TOKENS 1000000
#define FE_MAX_BLOCK_COUNT 4096
#define FE_MAX_INLINE_DEPTH 64
#define FE_MAX_CONST_DEPTH 256 /* constants defined through other constants */
#define FE_MAX_EVAL_DEPTH 1024 /* nested evaluations: expressions, constants, inlined calls */
#define FE_MAX_WORK 1000000 /* operations built while unrolling the forward function */
#define FE_MAX_NUMEL ((int64_t)1 << 40)

/* ======================= frontend/ast.c ======================= */
typedef struct fe_expr fe_expr;
typedef struct fe_stmt fe_stmt;
typedef struct fe_decl fe_decl;

/* Arena-backed growable list of pointers (old storage is left to the arena). */
typedef struct {
  void **items;
  int n, cap;
} fe_list;
bool fe_list_push(ir_arena *a, fe_list *l, void *item);

typedef enum {
  FE_E_INT,    /* i (is_size: written with a unit such as 25MB) */
  FE_E_FLOAT,  /* f */
  FE_E_BOOL,   /* b */
  FE_E_NAME,   /* name */
  FE_E_UNARY,  /* op '-' on a */
  FE_E_BINARY, /* op in + - * / % < > and 'E' for ==, on a and b */
  FE_E_CALL,   /* a(args) */
  FE_E_MEMBER, /* a.name */
  FE_E_INDEX,  /* a[b] */
  FE_E_LIST,   /* [items] */
  FE_E_TUPLE,  /* (items) with at least two */
} fe_expr_kind;

typedef struct {
  const char *key; /* NULL for a positional argument */
  dsc_loc loc;     /* of the key, or of the value when positional */
  fe_expr *value;
} fe_arg;

struct fe_expr {
  fe_expr_kind kind;
  dsc_loc loc; /* operator for unary/binary, callee for calls, first token otherwise */
  int depth;
  bool is_size;
  int op;
  int64_t i;
  double f;
  bool b;
  const char *name;
  fe_expr *a, *b2;
  fe_list items; /* fe_expr* for lists/tuples, fe_arg* for calls */
};

typedef struct {
  const char *dtype; /* NULL: f32 */
  dsc_loc loc;
  bool has_shape; /* false: "f32" alone, a rank-0 tensor */
  fe_list dims;   /* fe_expr* */
} fe_type_expr;

typedef enum { FE_S_ASSIGN, FE_S_RETURN, FE_S_FOR } fe_stmt_kind;

struct fe_stmt {
  fe_stmt_kind kind;
  dsc_loc loc;
  const char *name;  /* assigned name, or the loop variable */
  const char *block; /* for: the block looped over */
  dsc_loc block_loc;
  fe_expr *value;
  fe_list body; /* fe_stmt* */
};

typedef struct {
  const char *name;
  dsc_loc loc;
  fe_type_expr *type; /* NULL when untyped */
} fe_fn_arg;

typedef struct fe_setting {
  const char *key;
  dsc_loc loc;
  fe_expr *value;   /* NULL for a section */
  fe_list settings; /* fe_setting* of a section */
} fe_setting;

typedef enum {
  FE_D_IMPORT,
  FE_D_CONST,
  FE_D_PARAM,
  FE_D_FN,
  FE_D_BLOCK,
  FE_D_MODEL,
  FE_D_TRAIN
} fe_decl_kind;

struct fe_decl {
  fe_decl_kind kind;
  dsc_loc loc;      /* the keyword */
  const char *name; /* import: the path as written */
  dsc_loc name_loc;
  fe_expr *value;     /* const value, param init, block count */
  fe_type_expr *type; /* param type, fn return type */
  fe_list args;       /* fn: fe_fn_arg* */
  fe_list body;       /* fn: fe_stmt*; block/model: fe_decl*; train: fe_setting* */
  struct fe_file *file;
};

/* A parsed source file. */
typedef struct fe_file {
  const char *path; /* as shown in diagnostics */
  const char *key;  /* canonical path, to recognise the same file twice */
  const char *text;
  size_t len;
  fe_list decls;     /* fe_decl* */
  fe_list dim_names; /* const char*: identifiers written in type dims */
  bool loading;      /* on the import stack (cycle detection) */
} fe_file;

fe_expr *fe_expr_new(ir_arena *a, fe_expr_kind kind, dsc_loc loc);
const char *fe_token_desc(int kind); /* for messages: "'('", "identifier" */

/* ======================= frontend/lexer.l ======================= */
typedef struct {
  int kind; /* parser token kind */
  int line, col;
  const char *text; /* points into the source */
  int len;
  int64_t i;
  double f;
  const char *s; /* identifiers and strings, arena copies */
  bool is_size;
} fe_token;

/* Splits text into tokens (newline tokens included, comments dropped).
 * Reports lexical errors; returns false only on out-of-memory. */
bool fe_tokenize(dsc_context *ctx, ir_arena *a, const char *file, const char *text, size_t len,
                 fe_token **out, int *n_out);

/* ======================= frontend/parser.y ======================= */
typedef struct {
  dsc_context *ctx;
  ir_arena *arena;
  fe_file *file;
  fe_token *toks;
  int n_toks, pos;
  int prev_kind; /* last token handed to the parser */
  char brackets[FE_MAX_NESTING + 1];
  int depth;
  bool pending_newline; /* a virtual newline before '}' or at the end */
  int n_errors;
  bool fatal; /* stop reporting: nesting limit or too many errors */
  bool oom;
  const fe_token *last;           /* the lookahead, for messages */
  const fe_token *virtual_before; /* the '}' a virtual newline was put before */
} fe_parser;

/* Parses file->text into file->decls. Returns false only on out-of-memory. */
bool fe_parse(dsc_context *ctx, ir_arena *a, fe_file *file);


/* ======================= lowering: shared by frontend/lower.c, eval.c,
 * builtins.c, train_section.c and imports.c =======================
 * Lowering is an evaluator (frontend/lower.c says how); these are its values,
 * scopes and state. */
/* ---------------------------------------------------------------- values */

typedef enum {
  V_ERR,    /* an error was already reported */
  V_NUM,    /* is_int ? i : f */
  V_BOOL,   /* b */
  V_LIST,   /* items */
  V_TENSOR, /* node */
  V_DTYPE,  /* dt */
  V_BLOCK,  /* sym */
  V_INST,   /* sym, inst */
  V_FN,     /* sym, inst (the block instance it closes over, or -1) */
  V_SYM,    /* name: an identifier in the train section */
  V_TUPLE,  /* items: train section only */
  V_CALL,   /* name(keys[i] = items[i]): train section only */
} vkind;

typedef struct fe_sym fe_sym;
typedef struct fe_scope fe_scope;

typedef struct fe_value {
  vkind kind;
  bool is_int, is_size, b;
  int64_t i;
  double f;
  dsc_node *node;
  dsc_dtype dt;
  struct fe_value *items;
  const char **keys;
  int n;
  fe_sym *sym;
  int inst;
  const char *name;
} fe_value;

static const fe_value verr = {.kind = V_ERR};

static inline fe_value vint(int64_t i) {
  fe_value v = {.kind = V_NUM, .is_int = true, .i = i};
  return v;
}
static inline fe_value vfloat(double f) {
  fe_value v = {.kind = V_NUM, .f = f};
  return v;
}
static inline double num(const fe_value *v) { return v->is_int ? (double)v->i : v->f; }


/* ---------------------------------------------------------------- scopes */

typedef enum { SYM_CONST, SYM_PARAM, SYM_FN, SYM_BLOCK } symkind;

struct fe_sym {
  symkind kind;
  const char *name;
  fe_decl *decl;
  fe_scope *scope; /* where it is declared */
  int state;       /* consts: 0 not evaluated, 1 evaluating, 2 done */
  fe_value val;
  fe_scope *inner; /* blocks: their own scope */
  int64_t count;   /* blocks: number of instances (0 when invalid) */
  bool ok;         /* params: type and init evaluated without error */
  dsc_type ptype;
  dsc_init pinit;
  int first_index; /* params: module index (block params: of instance 0) */
};

struct fe_scope {
  fe_scope *parent;
  fe_list syms;  /* fe_sym* */
  fe_sym *block; /* the block this scope belongs to, if any */
  int n_block_params;
};

typedef struct {
  const char *name; /* NULL: dead (a loop variable after its loop) */
  fe_value val;
} fe_local;

typedef struct fe_frame {
  fe_scope *scope;
  int inst;       /* block instance in effect for scope's block params */
  bool is_const;  /* constant expression: no tensors */
  fe_list locals; /* fe_local* */
  bool returned;
  fe_value ret;
  dsc_loc ret_loc;
} fe_frame;

typedef struct {
  dsc_context *ctx;
  ir_arena arena; /* AST and lowering values, released at the end */
  const dsc_frontend_options *opts;
  fe_list files; /* fe_file* */
  fe_file *import_stack[32];
  int import_depth;
  fe_scope global;
  fe_scope model_scope;
  fe_decl *model, *train;
  dsc_module *m;
  dsc_graph *g;
  dsc_node **param_nodes;
  dsc_node *dropout_seed;  /* the graph's "dropout_seed" input, made by the first dropout */
  int64_t dropout_streams; /* dropouts lowered so far: the next one's stream */
  bool has_batch, has_seq;
  int64_t batch, seq;
  fe_sym *calls[FE_MAX_INLINE_DEPTH];
  int n_calls;
  int const_depth;          /* constants being evaluated, one inside the other */
  bool const_deep_reported; /* report the depth limit once, not once per chain segment */
  int eval_depth;           /* fe_ev() recursion: bounds the stack (deep expressions in deep
                               constant chains or inlined calls multiply) */
  long work;
  bool abort; /* the work limit was hit: stop evaluating */
  bool oom;
} fe_state;

static inline void *st_alloc(fe_state *st, size_t n) {
  void *p = ir_arena_alloc(&st->arena, n);
  if (!p) st->oom = true;
  return p;
}

static inline bool st_push(fe_state *st, fe_list *l, void *x) {
  if (!x || !fe_list_push(&st->arena, l, x)) {
    st->oom = true;
    return false;
  }
  return true;
}

#define ERR(loc, ...) ir_error(st->ctx, (loc), __VA_ARGS__)

/* Arguments of a call mapped onto parameter slots (fe_bind_args). */
typedef struct {
  const char *fname;
  const char *const *params;
  int n_params, n_req;
  const fe_expr *slots[10];
  dsc_loc slot_loc[10];
} fe_binding;

/* ======================= frontend/eval.c ======================= */
const char *fe_kind_name(const fe_value *v);
fe_sym *fe_scope_find(const fe_scope *s, const char *name);
const char *fe_decl_word(fe_decl_kind k);
fe_sym *fe_scope_add(fe_state *st, fe_scope *s, symkind kind, fe_decl *d);
fe_value fe_ev(fe_state *st, fe_frame *fr, const fe_expr *e);
fe_value fe_const_value(fe_state *st, fe_sym *y, dsc_loc use);
bool fe_exec_body(fe_state *st, fe_frame *fr, const fe_list *body);
fe_value fe_tensor(fe_state *st, dsc_node *n, dsc_loc loc);
void fe_at(fe_state *st, dsc_loc loc);
const char *fe_fmt_type(dsc_type t, char *buf, size_t n);
fe_local *fe_set_local(fe_state *st, fe_frame *fr, const char *name, fe_value v);
bool fe_check_fits(fe_state *st, const fe_value *n, dsc_dtype dt, const char *what, dsc_loc loc);
fe_value fe_materialize(fe_state *st, fe_frame *fr, const fe_value *n, dsc_dtype dt, dsc_loc loc);
bool fe_bind_args(fe_state *st, const fe_expr *call, fe_binding *b);
fe_value fe_arg_tensor(fe_state *st, fe_frame *fr, fe_binding *b, int k);
bool fe_arg_int(fe_state *st, fe_frame *fr, fe_binding *b, int k, int64_t *out);
bool fe_arg_num(fe_state *st, fe_frame *fr, fe_binding *b, int k, double *out);
bool fe_arg_bool(fe_state *st, fe_frame *fr, fe_binding *b, int k, bool *out);
bool fe_arg_dtype(fe_state *st, fe_frame *fr, fe_binding *b, int k, dsc_dtype *out);
bool fe_arg_ints(fe_state *st, fe_frame *fr, fe_binding *b, int k, bool allow_int, int64_t *out,
                 int *n);
bool fe_norm_axis(fe_state *st, fe_binding *b, int k, int64_t *axis, int rank);
bool fe_need_graph(fe_state *st, fe_frame *fr, const char *fname, dsc_loc loc);
bool fe_check_shape(fe_state *st, dsc_loc loc, const int64_t *dims, int n);

/* ======================= frontend/builtins.c =======================
 * A builtin's signature: elementwise ops' from their row of the op table
 * (include/dsc/ops.def), the others' from the table in builtins.c. */
typedef struct fe_builtin fe_builtin;
typedef fe_value (*fe_builtin_fn)(fe_state *st, fe_frame *fr, const fe_builtin *bi, fe_binding *b,
                                  dsc_loc loc);
struct fe_builtin {
  const char *name;
  fe_builtin_fn lower; /* builds the call's value from its bound arguments */
  dsc_op op;
  int n_req;              /* the first n_req parameters are required */
  const char *params[10]; /* parameter names, NULL after the last */
  double value;           /* zeros/ones: the fill; layernorm/rmsnorm: eps's default */
  unsigned tensor_only;   /* elementwise: bit k, argument k must be a tensor */
  int attr[6];            /* elementwise: argument k is the op's attribute attr[k]; -1 an input */
  char names[6][16];      /* elementwise: storage of params (so *out must not move) */
};
/* The builtin called name into *out; false when there is none. */
bool fe_find_builtin(const char *name, fe_builtin *out);
/* The names of every builtin into out (at most max); returns the count. */
int fe_builtin_names(const char **out, int max);
fe_value fe_call_builtin(fe_state *st, fe_frame *fr, const fe_builtin *bi, const fe_expr *call);

/* ======================= frontend/train_section.c =======================
 * The train section's settings (its key table train_keys and their checks)
 * into module metadata "train.<key>"; section "" or a sub-section. */
void fe_lower_settings(fe_state *st, const fe_list *settings, const char *section);

/* ======================= frontend/imports.c ======================= */
FILE *fe_open_regular(dsc_context *ctx, const char *path, dsc_loc loc, const char *verb);
void fe_load_imports(fe_state *st, fe_file *file);
fe_file *fe_add_file(fe_state *st, const char *path, const char *text, size_t len);

/* ======================= frontend/lower.c ======================= */
dsc_status fe_compile(dsc_context *ctx, const char *text, size_t len, const char *file,
                      const dsc_frontend_options *opts, dsc_module **out);
bool fe_eval_type(fe_state *st, fe_frame *fr, const fe_type_expr *te, dsc_type *out,
                  const char *what);

/* (frontend/ast.c, continued) */
/* Edit distance with a cap (returns cap+1 beyond it). */
int fe_edit_distance(const char *a, const char *b, int cap);
/* Best candidate within a distance suited to `name`'s length, or NULL. */
const char *fe_suggest(const char *name, const char *const *cands, int n);

#ifdef __cplusplus
}
#endif
#endif
