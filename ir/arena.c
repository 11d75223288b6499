/* Arena: bump allocation in chunks, released as a whole. */
#include <stdio.h>
#include <string.h>

#include "ir/ir.h"

struct ir_arena_chunk {
  ir_arena_chunk *next;
  size_t size, used;
  _Alignas(16) unsigned char data[];
};

#define ARENA_CHUNK (64 * 1024)

void ir_arena_init(ir_arena *a, dsc_context *ctx) {
  a->ctx = ctx;
  a->head = NULL;
  a->failed = false;
}

void ir_arena_release(ir_arena *a) {
  ir_arena_chunk *c = a->head;
  while (c) {
    ir_arena_chunk *next = c->next;
    ir_free(a->ctx, c, sizeof *c + c->size);
    c = next;
  }
  a->head = NULL;
}

void *ir_arena_alloc(ir_arena *a, size_t n) {
  n = (n + 15) & ~(size_t)15;
  if (n == 0) n = 16;
  ir_arena_chunk *c = a->head;
  if (!c || c->size - c->used < n) {
    size_t size = n > ARENA_CHUNK ? n : ARENA_CHUNK;
    c = ir_alloc(a->ctx, sizeof *c + size);
    if (!c) {
      a->failed = true;
      return NULL;
    }
    c->size = size;
    c->used = 0;
    c->next = a->head;
    a->head = c;
  }
  void *p = c->data + c->used;
  c->used += n;
  memset(p, 0, n);
  return p;
}

char *ir_arena_strndup(ir_arena *a, const char *s, size_t n) {
  char *d = ir_arena_alloc(a, n + 1);
  if (!d) return NULL;
  memcpy(d, s, n);
  d[n] = 0;
  return d;
}

char *ir_arena_strdup(ir_arena *a, const char *s) { return ir_arena_strndup(a, s, strlen(s)); }

char *ir_arena_printf(ir_arena *a, const char *fmt, ...) {
  va_list ap, ap2;
  va_start(ap, fmt);
  va_copy(ap2, ap);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  char *d = n >= 0 ? ir_arena_alloc(a, (size_t)n + 1) : NULL;
  if (d) vsnprintf(d, (size_t)n + 1, fmt, ap2);
  va_end(ap2);
  return d;
}
