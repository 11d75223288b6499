/* dsc export: a checkpoint's params as one safetensors file (the shards of
 * a ZeRO checkpoint consolidated), for PyTorch, Hugging Face or llm.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/cli.h"

static const char export_help[] =
    "usage: dsc export DIR -o FILE.safetensors [--dtype f32|bf16|f16] [--optimizer FILE]\n"
    "                  [--model FILE]\n"
    "       dsc export DIR --format hf -o OUT_DIR [--dtype D] [--max-shard-size BYTES]\n"
    "\n"
    "Writes the trainable params of checkpoint DIR (a step directory, or an output\n"
    "directory: its 'latest') to one safetensors file, full tensors under the\n"
    "model's names. A ZeRO checkpoint (stages 1-3 at several ranks: each rank\n"
    "wrote its shards) is consolidated from every shard-*-of-*.safetensors.\n"
    "  -o FILE           the output file (written atomically: a temporary file, then\n"
    "                    renamed over a regular file, or a link's file); a character\n"
    "                    device (/dev/null) or a FIFO is written into in place; a\n"
    "                    directory is refused\n"
    "  --dtype D         store the params as f32 (default), bf16 or f16\n"
    "  --optimizer FILE  also write the optimizer states (f32) to FILE\n"
    "  --model FILE      the model the tensors must match (default: the one the\n"
    "                    checkpoint records); every param of it, no other tensor,\n"
    "                    with its dtype and shape\n"
    "  --format hf       write a Hugging Face model directory OUT_DIR instead:\n"
    "                    config.json and model.safetensors under transformers' names\n"
    "                    and layout (Linear weights [out, in]), which\n"
    "                    AutoModelForCausalLM.from_pretrained(OUT_DIR) loads; the\n"
    "                    model's param names pick the architecture (llama, qwen2,\n"
    "                    gpt2; docs/models.md)\n"
    "  --max-shard-size B  with --format hf: files of at most B bytes (default 5GB)\n"
    "                    and model.safetensors.index.json when there are several\n";

static const char *extra(const dsc_checkpoint *ck, const char *key) {
  for (int i = 0; i < ck->state.n_extra; i++)
    if (strcmp(ck->state.extra[i].key, key) == 0) return ck->state.extra[i].value;
  return NULL;
}

/* The checkpoint's model.safetensors must hold exactly the params of its
 * model (as resume and sample check): compiled at the checkpoint's seq,
 * from the .dsm a .dsx was compiled from. */
static dsc_status check_against_model(dsc_context *ctx, const dsc_checkpoint *ck, const char *model,
                                      dsc_module **out_m) {
  char src[4096], file[4096];
  snprintf(file, sizeof file, "%s/model.safetensors", ck->dir);
  if (!model) model = extra(ck, "model");
  if (!model) {
    fprintf(stderr, "%s: error: the checkpoint does not record its model file; give --model\n",
            ck->dir);
    return DSC_ERR_USER;
  }
  if (dsc_program_is_file(model)) {
    dsc_program *prog = NULL;
    dsc_status st = dsc_program_open(ctx, model, &prog);
    if (st != DSC_OK) return st;
    const char *m = dsc_program_meta(prog, "model");
    snprintf(src, sizeof src, "%s", m ? m : "");
    dsc_program_free(prog);
    if (!src[0]) {
      fprintf(stderr, "%s: error: not a valid .dsx file: meta 'model' is missing\n", model);
      return DSC_ERR_USER;
    }
    model = src;
  }
  int64_t T = 0;
  const char *seq = extra(ck, "seq");
  cli_dims dims = {.n = 0};
  dims.dims[dims.n++] = (dsc_dim_binding){"B", 1};
  if (seq && cli_parse_i64(seq, &T) && T > 0) dims.dims[dims.n++] = (dsc_dim_binding){"T", T};
  dsc_module *m = NULL;
  dsc_status st = cli_load_module(ctx, model, &dims, &m);
  if (st != DSC_OK) return st;
  int n = dsc_module_param_count(m), k = 0;
  dsc_tensor_spec *spec = calloc((size_t)n + 1, sizeof *spec);
  if (!spec) {
    dsc_module_free(m);
    return DSC_ERR_INTERNAL;
  }
  for (int i = 0; i < n; i++)
    if (!dsc_module_param_is_state(m, i))
      spec[k++] = (dsc_tensor_spec){dsc_module_param_name(m, i), dsc_module_param_type(m, i)};
  st = dsc_tensor_set_check(ctx, file, ck->model, spec, k);
  if (st == DSC_OK && k == 0) {
    fprintf(stderr, "%s: error: the model has no params to export\n", model);
    st = DSC_ERR_USER;
  }
  free(spec);
  if (st == DSC_OK && out_m)
    *out_m = m;
  else
    dsc_module_free(m);
  return st;
}

/* A copy of set s with every float tensor converted to dtype dt (values
 * are rounded by the writer). */
static dsc_status write_as(dsc_context *ctx, const char *path, const dsc_tensor_set *s,
                           dsc_dtype dt, const dsc_kv *meta, int n_meta) {
  dsc_tensor **ts = calloc((size_t)(s->n + 1), sizeof *ts);
  if (!ts) return DSC_ERR_INTERNAL;
  dsc_status st = DSC_OK;
  for (int i = 0; i < s->n && st == DSC_OK; i++) {
    dsc_type t = s->tensors[i]->type;
    if (dsc_dtype_is_float(t.dtype)) t.dtype = dt;
    if (!(ts[i] = dsc_tensor_new(ctx, t))) {
      st = DSC_ERR_INTERNAL;
      break;
    }
    memcpy(ts[i]->data, s->tensors[i]->data, sizeof(double) * (size_t)dsc_type_numel(&t));
  }
  dsc_tensor_set out = {s->n, s->names, ts, n_meta, (dsc_kv *)meta};
  if (st == DSC_OK) st = dsc_safetensors_write(ctx, path, &out);
  for (int i = 0; i < s->n; i++) dsc_tensor_free(ctx, ts[i]);
  free(ts);
  return st;
}

int cli_export(int argc, char **argv) {
  const char *dir = NULL, *out = NULL, *opt_out = NULL, *dtype = "f32", *model = NULL;
  const char *format = "safetensors";
  int64_t max_shard = (int64_t)5 << 30;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    bool has_val = i + 1 < argc;
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      fputs(export_help, stdout);
      return CLI_EXIT_OK;
    } else if (strcmp(a, "-o") == 0) {
      if (!has_val) return cli_usage_error("export", "-o needs a file"), CLI_EXIT_USER;
      out = argv[++i];
    } else if (strcmp(a, "--optimizer") == 0) {
      if (!has_val) return cli_usage_error("export", "--optimizer needs a file"), CLI_EXIT_USER;
      opt_out = argv[++i];
    } else if (strcmp(a, "--model") == 0) {
      if (!has_val) return cli_usage_error("export", "--model needs a file"), CLI_EXIT_USER;
      model = argv[++i];
    } else if (strcmp(a, "--format") == 0) {
      if (!has_val)
        return cli_usage_error("export", "--format needs hf or safetensors"), CLI_EXIT_USER;
      format = argv[++i];
      if (strcmp(format, "hf") != 0 && strcmp(format, "safetensors") != 0)
        return cli_usage_error("export", "--format needs hf or safetensors, got '%s'", format),
               CLI_EXIT_USER;
    } else if (strcmp(a, "--max-shard-size") == 0) {
      if (!has_val || !cli_parse_bytes(argv[++i], &max_shard) || max_shard <= 0)
        return cli_usage_error("export", "--max-shard-size needs a positive byte count"),
               CLI_EXIT_USER;
    } else if (strcmp(a, "--dtype") == 0) {
      if (!has_val) return cli_usage_error("export", "--dtype needs f32, bf16 or f16"), CLI_EXIT_USER;
      dtype = argv[++i];
    } else if (a[0] == '-' && a[1]) {
      return cli_usage_error("export", "unknown option '%s'", a), CLI_EXIT_USER;
    } else if (dir) {
      return cli_usage_error("export", "one checkpoint at a time"), CLI_EXIT_USER;
    } else {
      dir = a;
    }
  }
  if (!dir) return cli_usage_error("export", "missing checkpoint DIR"), CLI_EXIT_USER;
  if (!out) return cli_usage_error("export", "missing -o FILE"), CLI_EXIT_USER;
  bool hf = strcmp(format, "hf") == 0;
  if (hf && opt_out)
    return cli_usage_error("export", "--optimizer writes a safetensors file; not with --format hf"),
           CLI_EXIT_USER;
  dsc_dtype dt;
  if (strcmp(dtype, "f32") == 0)
    dt = DSC_F32;
  else if (strcmp(dtype, "bf16") == 0)
    dt = DSC_BF16;
  else if (strcmp(dtype, "f16") == 0)
    dt = DSC_F16;
  else
    return cli_usage_error("export", "--dtype needs f32, bf16 or f16, got '%s'", dtype),
           CLI_EXIT_USER;

  dsc_context *ctx = dsc_context_new(NULL, NULL);
  if (!ctx) return fputs("dsc: out of memory\n", stderr), CLI_EXIT_INTERNAL;
  dsc_checkpoint *ck = NULL;
  dsc_status st = dsc_checkpoint_load(ctx, dir, NULL, 0, NULL, 0, &ck);
  int n_master = 0;
  if (st == DSC_OK) st = dsc_checkpoint_use_master_weights(ctx, ck, &n_master);
  dsc_module *m = NULL;
  if (st == DSC_OK) st = check_against_model(ctx, ck, model, hf ? &m : NULL);
  if (st == DSC_OK && hf) {
    int64_t seq = 0;
    for (int i = 0; i < ck->state.n_extra; i++)
      if (strcmp(ck->state.extra[i].key, "seq") == 0) cli_parse_i64(ck->state.extra[i].value, &seq);
    st = dsc_hf_export(ctx, m, ck->model, out, dt, seq, max_shard, stdout);
    if (st == DSC_OK && n_master) printf("(from the f32 master weights)\n");
  } else if (st == DSC_OK) {
    char step[32];
    snprintf(step, sizeof step, "%lld", (long long)ck->state.step);
    const char *name = NULL;
    for (int i = 0; i < ck->state.n_extra; i++)
      if (strcmp(ck->state.extra[i].key, "model_name") == 0) name = ck->state.extra[i].value;
    dsc_kv meta[3] = {{"format", "pt"}, {"step", step}, {"model", name ? name : "?"}};
    st = write_as(ctx, out, ck->model, dt, meta, 3);
    if (st == DSC_OK && opt_out) st = write_as(ctx, opt_out, ck->optimizer, DSC_F32, meta, 3);
    if (st == DSC_OK) {
      int64_t n = 0;
      for (int i = 0; i < ck->model->n; i++) n += dsc_type_numel(&ck->model->tensors[i]->type);
      printf("%s: %d tensors, %lld params (%s) from %s (step %s)%s\n", out, ck->model->n,
             (long long)n, dtype, ck->dir, step,
             n_master ? ", from the f32 master weights" : "");
    }
  }
  dsc_module_free(m);
  dsc_checkpoint_free(ctx, ck);
  dsc_diag_print(ctx, stderr);
  dsc_context_free(ctx);
  return cli_exit_code(st);
}
