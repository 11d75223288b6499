/* Embedding dsc: build a small graph through the public C API, print its
 * text IR, parse that text back, and run it with the reference interpreter.
 *
 *   y = mean(gelu(x @ w + b)^2)      x: f32[2,4] input, w: f32[4,3], b: f32[3]
 *
 * Build: cc embed.c -ldsc -lm -lpthread   (the CMake target `embed`). */
#include <dsc/dsc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(dsc_context *ctx, const char *what) {
  fprintf(stderr, "embed: %s failed\n", what);
  dsc_diag_print(ctx, stderr);
  return 1;
}

int main(void) {
  dsc_context *ctx = dsc_context_new(NULL, NULL); /* NULL: malloc/free */
  if (!ctx) return 2;
  int rc = 1;
  dsc_module *m = dsc_module_new(ctx, "embed_demo"), *back = NULL;
  dsc_params *params = NULL;
  dsc_tensor *x = NULL, *y = NULL;
  char *text = NULL, *text2 = NULL;
  if (!m) goto done;

  /* parameters: name, type, initializer */
  int64_t wdims[2] = {4, 3}, bdims[1] = {3}, xdims[2] = {2, 4};
  dsc_init normal = {DSC_INIT_NORMAL, 0.5, 0.0, NULL}, zeros = {DSC_INIT_ZEROS, 0, 0, NULL};
  if (dsc_module_add_param(m, "w", dsc_type_make(DSC_F32, 2, wdims), normal) ||
      dsc_module_add_param(m, "b", dsc_type_make(DSC_F32, 1, bdims), zeros)) {
    rc = fail(ctx, "adding params");
    goto done;
  }

  /* the graph: builder calls return NULL after reporting a shape error, and
   * accept NULL inputs, so one check at the end suffices */
  dsc_graph *g = dsc_graph_new(m, "forward");
  dsc_node *xin = dsc_graph_input(g, "x", dsc_type_make(DSC_F32, 2, xdims));
  dsc_node *h = dsc_matmul(g, xin, dsc_param_ref(g, "w"));
  h = dsc_binary(g, DSC_OP_ADD, h, dsc_param_ref(g, "b"));
  h = dsc_unary(g, DSC_OP_GELU, h);
  h = dsc_binary(g, DSC_OP_MUL, h, h);
  int64_t all[2] = {0, 1};
  dsc_node *loss = dsc_reduce(g, DSC_OP_MEAN, h, all, 2, 0);
  if (dsc_graph_set_outputs(g, &loss, 1) != DSC_OK || dsc_module_verify(m) != DSC_OK) {
    rc = fail(ctx, "building the graph");
    goto done;
  }

  /* text IR: print, parse back, print again: the two texts are identical */
  text = dsc_module_print_string(m);
  if (!text) {
    rc = fail(ctx, "printing");
    goto done;
  }
  fputs(text, stdout);
  if (dsc_module_parse(ctx, text, strlen(text), "<printed>", &back) != DSC_OK) {
    rc = fail(ctx, "parsing the printed IR");
    goto done;
  }
  text2 = dsc_module_print_string(back);
  if (!text2 || strcmp(text, text2) != 0) {
    rc = fail(ctx, "the round trip");
    goto done;
  }
  printf("round trip: identical\n");

  /* run the parsed module with the reference interpreter */
  params = dsc_params_init(back, 42);
  x = dsc_tensor_new(ctx, dsc_type_make(DSC_F32, 2, xdims));
  if (!params || !x) {
    rc = fail(ctx, "allocating");
    goto done;
  }
  for (int i = 0; i < 8; i++) x->data[i] = (i - 3.5) / 4.0;
  const dsc_tensor *inputs[1] = {x};
  if (dsc_interp_run(dsc_module_find_graph(back, "forward"), params, inputs, 1, &y) != DSC_OK) {
    rc = fail(ctx, "running");
    goto done;
  }
  printf("loss: %.6f\n", y->data[0]);
  rc = 0;

done:
  dsc_tensor_free(ctx, x);
  dsc_tensor_free(ctx, y);
  dsc_params_free(params);
  dsc_string_free(ctx, text);
  dsc_string_free(ctx, text2);
  dsc_module_free(back);
  dsc_module_free(m);
  dsc_context_free(ctx);
  return rc;
}
