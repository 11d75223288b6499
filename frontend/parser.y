/* The model language's grammar (a pure Bison parser, no globals).
 *
 * Newlines separate declarations and statements. The lexer reports every
 * newline; fe_next_token below drops those that cannot end a statement
 * (inside () or [], or after a token such as '+' or ',') and adds one before
 * a '}' and at the end of the file, so that every item is followed by a
 * separator (a newline, ';' or ','). Error recovery resumes at the next
 * separator. */
%code requires {
#include "frontend/frontend.h"
}

%code top {
#include <stdio.h>
#include <string.h>
}

%define api.pure full
%define api.prefix {fe_yy}
%define api.token.prefix {FE_T_}
%define parse.error custom
%define lr.type ielr
%locations
%param {fe_parser *p}

%union {
  const fe_token *tok;
  fe_expr *e;
  fe_stmt *st;
  fe_decl *d;
  fe_type_expr *ty;
  fe_list *l;
  fe_arg *arg;
  fe_setting *set;
  fe_fn_arg *fa;
}

%code {
/* The parser's stacks never grow: deeper input is "nesting too deep", and
 * no memory is allocated behind the context's allocator. */
#define YYINITDEPTH 1000
#define YYMAXDEPTH 1000

static int fe_yylex(FE_YYSTYPE *lval, FE_YYLTYPE *lloc, fe_parser *p);
static void fe_yyerror(FE_YYLTYPE *lloc, fe_parser *p, const char *msg);

static dsc_loc L(fe_parser *p, FE_YYLTYPE l) {
  dsc_loc d = {p->file->path, l.first_line, l.first_column};
  return d;
}

/* Allocation failure in an action: stop parsing (reported as out-of-memory). */
#define NN(x)        \
  do {               \
    if (!(x)) {      \
      p->oom = true; \
      YYABORT;       \
    }                \
  } while (0)

static fe_list *new_list(fe_parser *p) { return ir_arena_alloc(p->arena, sizeof(fe_list)); }
static bool push(fe_parser *p, fe_list *l, void *x) { return x && fe_list_push(p->arena, l, x); }

/* Builds an expression node and enforces the nesting limit. */
static fe_expr *mk(fe_parser *p, fe_expr_kind k, dsc_loc loc, fe_expr *a, fe_expr *b) {
  fe_expr *e = fe_expr_new(p->arena, k, loc);
  if (!e) {
    p->oom = true;
    return NULL;
  }
  e->a = a;
  e->b2 = b;
  int d = 0;
  if (a && a->depth > d) d = a->depth;
  if (b && b->depth > d) d = b->depth;
  e->depth = d + 1;
  if (e->depth > FE_MAX_NESTING) {
    ir_error(p->ctx, loc, "expression nested too deeply (more than %d levels)", FE_MAX_NESTING);
    p->fatal = true;
    return NULL;
  }
  return e;
}

/* Depth of a node with a list of children (calls, lists, tuples). */
static fe_expr *mk_list(fe_parser *p, fe_expr_kind k, dsc_loc loc, fe_expr *a, fe_list *items,
                        bool args) {
  fe_expr *e = mk(p, k, loc, a, NULL);
  if (!e) return NULL;
  if (items) {
    e->items = *items;
    for (int i = 0; i < items->n; i++) {
      fe_expr *c = args ? ((fe_arg *)items->items[i])->value : (fe_expr *)items->items[i];
      if (c->depth + 1 > e->depth) e->depth = c->depth + 1;
    }
    if (e->depth > FE_MAX_NESTING) {
      ir_error(p->ctx, loc, "expression nested too deeply (more than %d levels)", FE_MAX_NESTING);
      p->fatal = true;
      return NULL;
    }
  }
  return e;
}

#define CHECK(x)   \
  do {             \
    if (!(x)) YYABORT; \
  } while (0)

static fe_decl *mk_decl(fe_parser *p, fe_decl_kind k, dsc_loc loc) {
  fe_decl *d = ir_arena_alloc(p->arena, sizeof *d);
  if (d) {
    d->kind = k;
    d->loc = loc;
    d->file = p->file;
  }
  return d;
}

static fe_stmt *mk_stmt(fe_parser *p, fe_stmt_kind k, dsc_loc loc) {
  fe_stmt *s = ir_arena_alloc(p->arena, sizeof *s);
  if (s) {
    s->kind = k;
    s->loc = loc;
  }
  return s;
}

/* Remembers identifiers written as dims of a type (B, T, ...), so that an
 * unbound one is reported as an unbound dimension rather than a typo. */
static bool note_dims(fe_parser *p, fe_list *dims) {
  for (int i = 0; dims && i < dims->n; i++) {
    fe_expr *e = dims->items[i];
    if (e->kind == FE_E_NAME && !fe_list_push(p->arena, &p->file->dim_names, (void *)e->name))
      return false;
  }
  return true;
}
}

%token END 0 "end of file"
%token <tok> IDENT "identifier" INT "integer" FLOAT "number" STRING "string"
%token NEWLINE "end of line"
%token IMPORT "'import'" CONST "'const'" FN "'fn'" MODEL "'model'" BLOCK "'block'"
%token PARAM "'param'" RETURN "'return'" FOR "'for'" IN "'in'" TRAIN "'train'"
%token TRUE "'true'" FALSE "'false'" ARROW "'->'" EQEQ "'=='"

%nonassoc '<' '>' EQEQ
%left '+' '-'
%left '*' '/' '%'
%precedence UMINUS

%type <l> decls const_list stmts settings fn_args fn_args_opt exprs exprs_opt args args_opt
%type <d> decl const_item
%type <st> stmt
%type <set> setting
%type <fa> fn_arg
%type <ty> type ret_opt
%type <e> expr postfix primary init
%type <arg> arg

%%

program:
    decls                   { p->file->decls = *$1; }
  ;

decls:
    %empty                  { NN($$ = new_list(p)); }
  | decls sep               { $$ = $1; }
  | decls decl sep          { NN(push(p, $1, $2)); $$ = $1; }
  | decls const_list sep    { for (int i = 0; i < $2->n; i++) NN(push(p, $1, $2->items[i]));
                              $$ = $1; }
  | decls error sep         { $$ = $1; }
  ;

sep: NEWLINE | ';' | ',' ;

nl_opt: %empty | NEWLINE ;

const_list:
    CONST const_item        { NN($$ = new_list(p)); $2->loc = L(p, @1); NN(push(p, $$, $2)); }
  | const_list ',' const_item { NN(push(p, $1, $3)); $$ = $1; }
  ;

const_item:
    IDENT '=' expr          { NN($$ = mk_decl(p, FE_D_CONST, L(p, @1)));
                              $$->name = $1->s; $$->name_loc = L(p, @1); $$->value = $3; }
  ;

decl:
    IMPORT STRING           { NN($$ = mk_decl(p, FE_D_IMPORT, L(p, @1)));
                              $$->name = $2->s; $$->name_loc = L(p, @2); }
  | PARAM IDENT ':' type '=' init
                            { NN($$ = mk_decl(p, FE_D_PARAM, L(p, @1)));
                              $$->name = $2->s; $$->name_loc = L(p, @2);
                              $$->type = $4; $$->value = $6; }
  | FN IDENT '(' fn_args_opt ')' ret_opt nl_opt '{' stmts '}'
                            { NN($$ = mk_decl(p, FE_D_FN, L(p, @1)));
                              $$->name = $2->s; $$->name_loc = L(p, @2);
                              $$->args = *$4; $$->type = $6; $$->body = *$9; }
  | BLOCK IDENT '[' expr ']' nl_opt '{' decls '}'
                            { NN($$ = mk_decl(p, FE_D_BLOCK, L(p, @1)));
                              $$->name = $2->s; $$->name_loc = L(p, @2);
                              $$->value = $4; $$->body = *$8; }
  | MODEL IDENT nl_opt '{' decls '}'
                            { NN($$ = mk_decl(p, FE_D_MODEL, L(p, @1)));
                              $$->name = $2->s; $$->name_loc = L(p, @2); $$->body = *$5; }
  | TRAIN nl_opt '{' settings '}'
                            { NN($$ = mk_decl(p, FE_D_TRAIN, L(p, @1)));
                              $$->name = "train"; $$->name_loc = L(p, @1); $$->body = *$4; }
  ;

fn_args_opt:
    %empty                  { NN($$ = new_list(p)); }
  | fn_args                 { $$ = $1; }
  ;

fn_args:
    fn_arg                  { NN($$ = new_list(p)); NN(push(p, $$, $1)); }
  | fn_args ',' fn_arg      { NN(push(p, $1, $3)); $$ = $1; }
  ;

fn_arg:
    IDENT                   { NN($$ = ir_arena_alloc(p->arena, sizeof(fe_fn_arg)));
                              $$->name = $1->s; $$->loc = L(p, @1); }
  | IDENT ':' type          { NN($$ = ir_arena_alloc(p->arena, sizeof(fe_fn_arg)));
                              $$->name = $1->s; $$->loc = L(p, @1); $$->type = $3; }
  ;

ret_opt:
    %empty                  { $$ = NULL; }
  | ARROW type              { $$ = $2; }
  ;

type:
    IDENT                   { NN($$ = ir_arena_alloc(p->arena, sizeof(fe_type_expr)));
                              $$->dtype = $1->s; $$->loc = L(p, @1); }
  | IDENT '[' exprs_opt ']' { NN($$ = ir_arena_alloc(p->arena, sizeof(fe_type_expr)));
                              $$->dtype = $1->s; $$->loc = L(p, @1); $$->has_shape = true;
                              $$->dims = *$3; NN(note_dims(p, $3)); }
  | '[' exprs_opt ']'       { NN($$ = ir_arena_alloc(p->arena, sizeof(fe_type_expr)));
                              $$->loc = L(p, @1); $$->has_shape = true;
                              $$->dims = *$2; NN(note_dims(p, $2)); }
  ;

init:
    expr                    { $$ = $1; }
  | CONST '(' args_opt ')'  { fe_expr *c = mk(p, FE_E_NAME, L(p, @1), NULL, NULL); CHECK(c);
                              c->name = "const";
                              CHECK($$ = mk_list(p, FE_E_CALL, L(p, @1), c, $3, true)); }
  ;

stmts:
    %empty                  { NN($$ = new_list(p)); }
  | stmts sep               { $$ = $1; }
  | stmts stmt sep          { NN(push(p, $1, $2)); $$ = $1; }
  | stmts error sep         { $$ = $1; }
  ;

stmt:
    IDENT '=' expr          { NN($$ = mk_stmt(p, FE_S_ASSIGN, L(p, @1)));
                              $$->name = $1->s; $$->value = $3; }
  | RETURN expr             { NN($$ = mk_stmt(p, FE_S_RETURN, L(p, @1))); $$->value = $2; }
  | FOR IDENT IN IDENT nl_opt '{' stmts '}'
                            { NN($$ = mk_stmt(p, FE_S_FOR, L(p, @1)));
                              $$->name = $2->s; $$->block = $4->s; $$->block_loc = L(p, @4);
                              $$->body = *$7; }
  ;

settings:
    %empty                  { NN($$ = new_list(p)); }
  | settings sep            { $$ = $1; }
  | settings setting sep    { NN(push(p, $1, $2)); $$ = $1; }
  | settings error sep      { $$ = $1; }
  ;

setting:
    IDENT '=' expr          { NN($$ = ir_arena_alloc(p->arena, sizeof(fe_setting)));
                              $$->key = $1->s; $$->loc = L(p, @1); $$->value = $3; }
  | IDENT nl_opt '{' settings '}'
                            { NN($$ = ir_arena_alloc(p->arena, sizeof(fe_setting)));
                              $$->key = $1->s; $$->loc = L(p, @1); $$->settings = *$4; }
  ;

expr:
    expr '+' expr           { CHECK($$ = mk(p, FE_E_BINARY, L(p, @2), $1, $3)); $$->op = '+'; }
  | expr '-' expr           { CHECK($$ = mk(p, FE_E_BINARY, L(p, @2), $1, $3)); $$->op = '-'; }
  | expr '*' expr           { CHECK($$ = mk(p, FE_E_BINARY, L(p, @2), $1, $3)); $$->op = '*'; }
  | expr '/' expr           { CHECK($$ = mk(p, FE_E_BINARY, L(p, @2), $1, $3)); $$->op = '/'; }
  | expr '%' expr           { CHECK($$ = mk(p, FE_E_BINARY, L(p, @2), $1, $3)); $$->op = '%'; }
  | expr '<' expr           { CHECK($$ = mk(p, FE_E_BINARY, L(p, @2), $1, $3)); $$->op = '<'; }
  | expr '>' expr           { CHECK($$ = mk(p, FE_E_BINARY, L(p, @2), $1, $3)); $$->op = '>'; }
  | expr EQEQ expr          { CHECK($$ = mk(p, FE_E_BINARY, L(p, @2), $1, $3)); $$->op = 'E'; }
  | '-' expr %prec UMINUS   { CHECK($$ = mk(p, FE_E_UNARY, L(p, @1), $2, NULL)); $$->op = '-'; }
  | postfix                 { $$ = $1; }
  ;

postfix:
    primary                 { $$ = $1; }
  | postfix '(' args_opt ')' { CHECK($$ = mk_list(p, FE_E_CALL, $1->loc, $1, $3, true)); }
  | postfix '.' IDENT       { CHECK($$ = mk(p, FE_E_MEMBER, L(p, @3), $1, NULL)); $$->name = $3->s; }
  | postfix '[' expr ']'    { CHECK($$ = mk(p, FE_E_INDEX, L(p, @2), $1, $3)); }
  ;

primary:
    INT                     { CHECK($$ = mk(p, FE_E_INT, L(p, @1), NULL, NULL));
                              $$->i = $1->i; $$->is_size = $1->is_size; }
  | FLOAT                   { CHECK($$ = mk(p, FE_E_FLOAT, L(p, @1), NULL, NULL)); $$->f = $1->f; }
  | TRUE                    { CHECK($$ = mk(p, FE_E_BOOL, L(p, @1), NULL, NULL)); $$->b = true; }
  | FALSE                   { CHECK($$ = mk(p, FE_E_BOOL, L(p, @1), NULL, NULL)); $$->b = false; }
  | IDENT                   { CHECK($$ = mk(p, FE_E_NAME, L(p, @1), NULL, NULL)); $$->name = $1->s; }
  | '(' expr ')'            { $$ = $2; }
  | '(' expr ',' exprs ')'  { fe_list *l = new_list(p); NN(l); NN(push(p, l, $2));
                              for (int i = 0; i < $4->n; i++) NN(push(p, l, $4->items[i]));
                              CHECK($$ = mk_list(p, FE_E_TUPLE, L(p, @1), NULL, l, false)); }
  | '[' exprs_opt ']'       { CHECK($$ = mk_list(p, FE_E_LIST, L(p, @1), NULL, $2, false)); }
  ;

exprs_opt:
    %empty                  { NN($$ = new_list(p)); }
  | exprs                   { $$ = $1; }
  ;

exprs:
    expr                    { NN($$ = new_list(p)); NN(push(p, $$, $1)); }
  | exprs ',' expr          { NN(push(p, $1, $3)); $$ = $1; }
  ;

args_opt:
    %empty                  { NN($$ = new_list(p)); }
  | args                    { $$ = $1; }
  ;

args:
    arg                     { NN($$ = new_list(p)); NN(push(p, $$, $1)); }
  | args ',' arg            { NN(push(p, $1, $3)); $$ = $1; }
  ;

arg:
    expr                    { NN($$ = ir_arena_alloc(p->arena, sizeof(fe_arg)));
                              /* the argument's first token, not its operator */
                              $$->value = $1; $$->loc = L(p, @1); }
  | IDENT '=' expr          { NN($$ = ir_arena_alloc(p->arena, sizeof(fe_arg)));
                              $$->key = $1->s; $$->loc = L(p, @1); $$->value = $3; }
  ;

%%

/* Tokens after which a newline ends the statement. */
static bool ends_statement(int kind) {
  switch (kind) {
    case FE_T_IDENT: case FE_T_INT: case FE_T_FLOAT: case FE_T_STRING: case FE_T_TRUE:
    case FE_T_FALSE: case ')': case ']': case '}':
      return true;
    default:
      return false;
  }
}

static void end_position(const fe_file *f, int *line, int *col) {
  int l = 1, c = 1;
  for (size_t i = 0; i < f->len; i++) {
    if (f->text[i] == '\n') {
      l++;
      c = 1;
    } else {
      c++;
    }
  }
  *line = l;
  *col = c;
}

/* The parser's view of the token stream (see the comment at the top). */
static int fe_yylex(FE_YYSTYPE *lval, FE_YYLTYPE *lloc, fe_parser *p) {
  lval->tok = NULL;
  for (;;) {
    const fe_token *t = p->pos < p->n_toks && !p->fatal ? &p->toks[p->pos] : NULL;
    int kind = t ? t->kind : FE_T_END;
    if (t) {
      lloc->first_line = lloc->last_line = t->line;
      lloc->first_column = lloc->last_column = t->col;
    } else {
      end_position(p->file, &lloc->first_line, &lloc->first_column);
      lloc->last_line = lloc->first_line;
      lloc->last_column = lloc->first_column;
    }
    bool in_parens = p->depth > 0 && p->brackets[p->depth - 1] != '{';
    if (kind == FE_T_NEWLINE) {
      p->pos++;
      if (in_parens || !ends_statement(p->prev_kind)) continue;
      p->prev_kind = FE_T_NEWLINE;
      p->last = t;
      p->virtual_before = NULL;
      return FE_T_NEWLINE;
    }
    /* a separator before every '}' and at the end: ends the last item, and
     * gives error recovery a place to resume before the brace */
    if ((kind == '}' && p->prev_kind != '{' && p->prev_kind != FE_T_NEWLINE) ||
        (kind == FE_T_END && p->prev_kind != FE_T_NEWLINE && p->prev_kind != FE_T_END &&
         !in_parens)) {
      p->prev_kind = FE_T_NEWLINE; /* virtual: does not consume t */
      p->last = NULL;
      p->virtual_before = t;
      return FE_T_NEWLINE;
    }
    if (!t) {
      p->last = NULL;
      p->prev_kind = FE_T_END;
      return FE_T_END;
    }
    if (kind == '(' || kind == '[' || kind == '{') {
      if (p->depth >= FE_MAX_NESTING) {
        dsc_loc loc = {p->file->path, t->line, t->col};
        ir_error(p->ctx, loc, "nesting too deep (more than %d levels of brackets)", FE_MAX_NESTING);
        p->fatal = true;
        continue; /* now at the end */
      }
      p->brackets[p->depth++] = (char)kind;
    } else if (kind == ')' || kind == ']') {
      if (p->depth > 0 && p->brackets[p->depth - 1] == (kind == ')' ? '(' : '[')) p->depth--;
    } else if (kind == '}') {
      /* a brace also closes any bracket left open by a syntax error */
      while (p->depth > 0 && p->brackets[p->depth - 1] != '{') p->depth--;
      if (p->depth > 0) p->depth--;
    }
    p->pos++;
    p->prev_kind = kind;
    p->last = t;
    p->virtual_before = NULL;
    lval->tok = t;
    return kind;
  }
}

static void fe_yyerror(FE_YYLTYPE *lloc, fe_parser *p, const char *msg) {
  if (p->fatal) return;
  /* the only message Bison reports here is its stack limit */
  dsc_loc loc = L(p, *lloc);
  if (strstr(msg, "exhausted"))
    ir_error(p->ctx, loc, "nesting too deep (the expression or block is too deeply nested)");
  else
    ir_error(p->ctx, loc, "%s", msg);
  p->fatal = true;
}

/* "'x'", "end of line", "end of file", "identifier". */
static void describe_symbol(yysymbol_kind_t sym, char *buf, size_t n) {
  const char *name = yysymbol_name(sym);
  size_t len = strlen(name);
  if (len >= 2 && name[0] == '"' && name[len - 1] == '"')
    snprintf(buf, n, "%.*s", (int)(len - 2), name + 1);
  else
    snprintf(buf, n, "%s", name);
}

static void describe_token(const fe_parser *p, yysymbol_kind_t sym, char *buf, size_t n) {
  const fe_token *t = p->last;
  if (!t && sym == YYSYMBOL_NEWLINE && p->virtual_before) t = p->virtual_before; /* the '}' */
  else if (!t || sym == YYSYMBOL_NEWLINE || sym == YYSYMBOL_YYEOF) {
    describe_symbol(sym, buf, n);
    return;
  }
  /* A token may hold any byte (a string literal of binary garbage): show
   * non-printable and non-ASCII bytes as '?', as the source excerpt does. */
  char shown[33];
  int len = t->len > 32 ? 32 : t->len;
  for (int i = 0; i < len; i++) {
    unsigned char c = (unsigned char)t->text[i];
    shown[i] = c >= 0x20 && c < 0x7f ? (char)c : '?';
  }
  shown[len] = 0;
  snprintf(buf, n, "'%s%s'", shown, t->len > 32 ? "..." : "");
}

static int yyreport_syntax_error(const yypcontext_t *ctx, fe_parser *p) {
  if (p->fatal) return 0;
  /* recovery resumes at a newline: stop treating newlines as inside () or [] */
  while (p->depth > 0 && p->brackets[p->depth - 1] != '{') p->depth--;
  dsc_loc loc = L(p, *yypcontext_location(ctx));
  yysymbol_kind_t exp[5];
  int n = yypcontext_expected_tokens(ctx, exp, 5);
  char got[64], e0[40], list[200] = "";
  describe_token(p, yypcontext_token(ctx), got, sizeof got);
  if (n == 1) {
    describe_symbol(exp[0], e0, sizeof e0);
    ir_error(p->ctx, loc, "expected %s before %s", e0, got);
  } else if (n > 1 && n <= 4) {
    for (int i = 0; i < n; i++) {
      describe_symbol(exp[i], e0, sizeof e0);
      size_t used = strlen(list);
      snprintf(list + used, sizeof list - used, "%s%s", i == 0 ? "" : i == n - 1 ? " or " : ", ",
               e0);
    }
    ir_error(p->ctx, loc, "unexpected %s; expected %s", got, list);
  } else {
    ir_error(p->ctx, loc, "unexpected %s", got);
  }
  if (++p->n_errors >= FE_MAX_ERRORS) {
    ir_error(p->ctx, loc, "too many errors; giving up on this file");
    p->fatal = true;
  }
  return 0;
}

bool fe_parse(dsc_context *ctx, ir_arena *a, fe_file *file) {
  fe_parser p;
  memset(&p, 0, sizeof p);
  p.ctx = ctx;
  p.arena = a;
  p.file = file;
  p.prev_kind = FE_T_NEWLINE;
  if (!fe_tokenize(ctx, a, file->path, file->text, file->len, &p.toks, &p.n_toks)) return false;
  fe_yyparse(&p);
  return !p.oom && !a->failed;
}
