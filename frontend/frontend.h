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

/* ======================= frontend/lower.c ======================= */
dsc_status fe_compile(dsc_context *ctx, const char *text, size_t len, const char *file,
                      const dsc_frontend_options *opts, dsc_module **out);

/* (frontend/ast.c, continued) */
/* Edit distance with a cap (returns cap+1 beyond it). */
int fe_edit_distance(const char *a, const char *b, int cap);
/* Best candidate within a distance suited to `name`'s length, or NULL. */
const char *fe_suggest(const char *name, const char *const *cands, int n);

#ifdef __cplusplus
}
#endif
#endif
