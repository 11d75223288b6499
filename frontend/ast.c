/* AST helpers: nodes live in the compilation's arena, freed as a whole. */
#include <string.h>

#include "frontend/frontend.h"

bool fe_list_push(ir_arena *a, fe_list *l, void *item) {
  if (!ir_grow(a, (void **)&l->items, &l->cap, l->n + 1, sizeof(void *))) return false;
  l->items[l->n++] = item;
  return true;
}

fe_expr *fe_expr_new(ir_arena *a, fe_expr_kind kind, dsc_loc loc) {
  fe_expr *e = ir_arena_alloc(a, sizeof *e);
  if (!e) return NULL;
  e->kind = kind;
  e->loc = loc;
  e->depth = 1;
  return e;
}

int fe_edit_distance(const char *a, const char *b, int cap) {
  size_t la = strlen(a), lb = strlen(b);
  if (la > 64 || lb > 64) return cap + 1;
  if ((la > lb ? la - lb : lb - la) > (size_t)cap) return cap + 1;
  int prev[65], cur[65];
  for (size_t j = 0; j <= lb; j++) prev[j] = (int)j;
  for (size_t i = 1; i <= la; i++) {
    cur[0] = (int)i;
    for (size_t j = 1; j <= lb; j++) {
      int sub = prev[j - 1] + (a[i - 1] != b[j - 1]);
      int del = prev[j] + 1, ins = cur[j - 1] + 1;
      cur[j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
    }
    memcpy(prev, cur, sizeof(int) * (lb + 1));
  }
  return prev[lb] > cap ? cap + 1 : prev[lb];
}

const char *fe_suggest(const char *name, const char *const *cands, int n) {
  int len = (int)strlen(name);
  if (len < 3) return NULL; /* every short name is close to another */
  int cap = len <= 4 ? 1 : len <= 8 ? 2 : 3;
  const char *best = NULL;
  int best_d = cap + 1;
  for (int i = 0; i < n; i++) {
    if (!cands[i] || strcmp(cands[i], name) == 0) continue;
    int d = fe_edit_distance(name, cands[i], cap);
    if (d < best_d) {
      best_d = d;
      best = cands[i];
    }
  }
  return best;
}
