/* Hugging Face model directories: config.json and model.safetensors, or
 * model.safetensors.index.json and its shards, read into a module's params
 * and written from them (include/dsc/runtime.h, docs/models.md).
 *
 * One table of name rules per architecture (config.json's model_type): a
 * transformers tensor name with {L} for the layer, the dsc param it is, and
 * how its layout differs. transformers' nn.Linear stores [out, in] and dsc
 * multiplies x [.., in] by w [in, out], so Linear weights are transposed;
 * GPT-2's Conv1D already stores [in, out]. Rotary embeddings need no
 * permutation: transformers' Llama weights are laid out for rotate-half,
 * which is dsc's rope. An import is planned in full (every tensor matched,
 * every shape checked, every param found) before one value is read, and the
 * data is read one tensor at a time (rt_st_read), never a whole file. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/runtime.h"

#define MAX_JSON_BYTES (64u << 20)

typedef enum {
  HF_SAME,      /* the param's shape and layout */
  HF_TRANSPOSE, /* nn.Linear: stored [out, in], the param is [in, out] */
  HF_ROWS,      /* an embedding table: the param may have more rows (a padded
                   vocabulary); they are zero */
} hf_layout;

typedef struct {
  const char *hf;  /* transformers' name, {L} the layer index */
  const char *dsc; /* the param's name */
  hf_layout layout;
} hf_rule;

typedef struct {
  const char *model_type;
  const char *architecture; /* config.json "architectures" on export */
  const char *prefix;       /* a prefix some files have and others lack, or "" */
  const hf_rule *rules;
  int n_rules;
  const char *const *ignored; /* buffers, not weights */
  int n_ignored;
  const char *tied_head; /* the head's param when tie_word_embeddings */
  const char *embedding; /* the embedding it is tied to */
} hf_arch;

#define LLAMA_RULES                                                                               \
  {"model.embed_tokens.weight", "embed_tokens", HF_SAME},                                         \
      {"model.layers.{L}.input_layernorm.weight", "layers.{L}.input_layernorm", HF_SAME},         \
      {"model.layers.{L}.self_attn.q_proj.weight", "layers.{L}.q_proj", HF_TRANSPOSE},            \
      {"model.layers.{L}.self_attn.k_proj.weight", "layers.{L}.k_proj", HF_TRANSPOSE},            \
      {"model.layers.{L}.self_attn.v_proj.weight", "layers.{L}.v_proj", HF_TRANSPOSE},            \
      {"model.layers.{L}.self_attn.o_proj.weight", "layers.{L}.o_proj", HF_TRANSPOSE},            \
      {"model.layers.{L}.post_attention_layernorm.weight", "layers.{L}.post_attention_layernorm", \
       HF_SAME},                                                                                  \
      {"model.layers.{L}.mlp.gate_proj.weight", "layers.{L}.gate_proj", HF_TRANSPOSE},            \
      {"model.layers.{L}.mlp.up_proj.weight", "layers.{L}.up_proj", HF_TRANSPOSE},                \
      {"model.layers.{L}.mlp.down_proj.weight", "layers.{L}.down_proj", HF_TRANSPOSE},            \
      {"model.norm.weight", "norm", HF_SAME}, {                                                   \
    "lm_head.weight", "lm_head", HF_TRANSPOSE                                                     \
  }

static const hf_rule llama_rules[] = {LLAMA_RULES};
/* Qwen2: Llama with biases on q, k and v */
static const hf_rule qwen2_rules[] = {
    LLAMA_RULES,
    {"model.layers.{L}.self_attn.q_proj.bias", "layers.{L}.q_proj_bias", HF_SAME},
    {"model.layers.{L}.self_attn.k_proj.bias", "layers.{L}.k_proj_bias", HF_SAME},
    {"model.layers.{L}.self_attn.v_proj.bias", "layers.{L}.v_proj_bias", HF_SAME},
};
static const char *const llama_ignored[] = {"model.rotary_emb.inv_freq",
                                            "model.layers.{L}.self_attn.rotary_emb.inv_freq"};

/* GPT-2 (examples/gpt2.dsm's names): Conv1D weights are [in, out] */
static const hf_rule gpt2_rules[] = {
    {"wte.weight", "wte", HF_ROWS},
    {"wpe.weight", "wpe", HF_SAME},
    {"h.{L}.ln_1.weight", "h.{L}.ln1_w", HF_SAME},
    {"h.{L}.ln_1.bias", "h.{L}.ln1_b", HF_SAME},
    {"h.{L}.attn.c_attn.weight", "h.{L}.attn_w", HF_SAME},
    {"h.{L}.attn.c_attn.bias", "h.{L}.attn_b", HF_SAME},
    {"h.{L}.attn.c_proj.weight", "h.{L}.attn_proj_w", HF_SAME},
    {"h.{L}.attn.c_proj.bias", "h.{L}.attn_proj_b", HF_SAME},
    {"h.{L}.ln_2.weight", "h.{L}.ln2_w", HF_SAME},
    {"h.{L}.ln_2.bias", "h.{L}.ln2_b", HF_SAME},
    {"h.{L}.mlp.c_fc.weight", "h.{L}.fc_w", HF_SAME},
    {"h.{L}.mlp.c_fc.bias", "h.{L}.fc_b", HF_SAME},
    {"h.{L}.mlp.c_proj.weight", "h.{L}.fc_proj_w", HF_SAME},
    {"h.{L}.mlp.c_proj.bias", "h.{L}.fc_proj_b", HF_SAME},
    {"ln_f.weight", "lnf_w", HF_SAME},
    {"ln_f.bias", "lnf_b", HF_SAME},
};
/* the causal mask buffers of older files, and the head tied to wte */
static const char *const gpt2_ignored[] = {"h.{L}.attn.bias", "h.{L}.attn.masked_bias",
                                           "lm_head.weight"};

#define N(a) ((int)(sizeof a / sizeof a[0]))
static const hf_arch archs[] = {
    {"llama", "LlamaForCausalLM", "", llama_rules, N(llama_rules), llama_ignored, N(llama_ignored),
     "lm_head", "embed_tokens"},
    {"mistral", "MistralForCausalLM", "", llama_rules, N(llama_rules), llama_ignored,
     N(llama_ignored), "lm_head", "embed_tokens"},
    {"qwen2", "Qwen2ForCausalLM", "", qwen2_rules, N(qwen2_rules), llama_ignored, N(llama_ignored),
     "lm_head", "embed_tokens"},
    {"gpt2", "GPT2LMHeadModel", "transformer.", gpt2_rules, N(gpt2_rules), gpt2_ignored,
     N(gpt2_ignored), NULL, NULL},
};

/* ------------------------------------------------------------ names */

/* Matches name against pattern ({L}: a decimal layer index, stored in *layer). */
static bool match(const char *pattern, const char *name, long *layer) {
  *layer = -1;
  while (*pattern) {
    if (strncmp(pattern, "{L}", 3) == 0) {
      if (*name < '0' || *name > '9' || (name[0] == '0' && name[1] >= '0' && name[1] <= '9'))
        return false;
      char *end;
      errno = 0;
      long v = strtol(name, &end, 10);
      if (errno || v > 1000000) return false;
      *layer = v, name = end, pattern += 3;
    } else if (*pattern++ != *name++) {
      return false;
    }
  }
  return *name == 0;
}

/* pattern with {L} replaced by layer, into buf. */
static void expand(const char *pattern, long layer, char *buf, size_t n) {
  size_t k = 0;
  for (const char *p = pattern; *p && k + 1 < n; p++) {
    if (strncmp(p, "{L}", 3) == 0) {
      int w = snprintf(buf + k, n - k, "%ld", layer);
      k += w > 0 ? (size_t)w : 0;
      p += 2;
    } else {
      buf[k++] = *p;
    }
  }
  buf[k < n ? k : n - 1] = 0;
}

static const hf_arch *find_arch(const char *model_type) {
  for (int i = 0; i < N(archs); i++)
    if (strcmp(archs[i].model_type, model_type) == 0) return &archs[i];
  return NULL;
}

static void arch_list(char *buf, size_t n) {
  size_t k = 0;
  buf[0] = 0;
  for (int i = 0; i < N(archs) && k < n; i++) {
    int w = snprintf(buf + k, n - k, "%s%s", i ? ", " : "", archs[i].model_type);
    k += w > 0 ? (size_t)w : 0;
  }
}

/* The rule a (prefix-stripped) tensor name matches, and the param name. */
static const hf_rule *rule_of(const hf_arch *a, const char *hf, char *param, size_t n) {
  long layer;
  for (int r = 0; r < a->n_rules; r++)
    if (match(a->rules[r].hf, hf, &layer)) {
      expand(a->rules[r].dsc, layer, param, n);
      return &a->rules[r];
    }
  return NULL;
}

static bool ignored(const hf_arch *a, const char *hf) {
  long layer;
  for (int i = 0; i < a->n_ignored; i++)
    if (match(a->ignored[i], hf, &layer)) return true;
  return false;
}

/* The transformers name of param (the first rule whose dsc pattern matches). */
static const hf_rule *hf_name_of(const hf_arch *a, const char *param, char *hf, size_t n) {
  long layer;
  for (int r = 0; r < a->n_rules; r++)
    if (match(a->rules[r].dsc, param, &layer)) {
      expand(a->rules[r].hf, layer, hf, n);
      return &a->rules[r];
    }
  return NULL;
}

/* ------------------------------------------------------------ files */

static dsc_status oom(dsc_context *ctx, const char *path) {
  ir_error(ctx, rt_loc(path), "out of memory");
  return DSC_ERR_INTERNAL;
}

dsc_status rt_read_json(dsc_context *ctx, const char *path, cJSON **out) {
  *out = NULL;
  dsc_loc loc = rt_loc(path);
  char *text;
  size_t len;
  dsc_status st = rt_read_small(ctx, path, MAX_JSON_BYTES, &text, &len);
  if (st != DSC_OK) return st;
  const char *end = NULL;
  cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
  if (!root || !cJSON_IsObject(root)) {
    int line = 1, col = 1;
    for (const char *p = text; end && p < end && p < text + len; p++)
      if (*p == '\n')
        line++, col = 1;
      else
        col++;
    if (root)
      ir_error(ctx, loc, "not a JSON object");
    else {
      dsc_loc at = loc;
      at.line = line, at.col = col;
      ir_error(ctx, at, "not valid JSON here");
    }
    cJSON_Delete(root);
    ir_free(ctx, text, len + 1);
    return DSC_ERR_USER;
  }
  ir_free(ctx, text, len + 1);
  *out = root;
  return DSC_OK;
}

dsc_status rt_write_json(dsc_context *ctx, const char *path, const cJSON *j) {
  char *text = cJSON_Print(j);
  if (!text) return oom(ctx, path);
  rt_atomic_file f;
  dsc_status st = rt_atomic_open(ctx, path, &f);
  if (st == DSC_OK) {
    rt_atomic_write(&f, text, strlen(text));
    rt_atomic_write(&f, "\n", 1);
    st = rt_atomic_commit(&f);
  }
  cJSON_free(text);
  return st;
}

/* One tensor of the directory, as planned. */
typedef struct {
  const char *hf;      /* name in the file (prefix included) */
  int file, entry;     /* which file, which entry in it */
  int param;           /* module param index; -1: ignored */
  const hf_rule *rule; /* NULL: ignored */
  bool tied;           /* the tied head: read from the embedding's tensor */
} plan_item;

typedef struct {
  dsc_context *ctx;
  const char *dir;
  cJSON *config;
  const hf_arch *arch;
  char **paths; /* weight files */
  rt_st_file **files;
  int n_files;
  plan_item *items;
  int n_items, cap_items;
} hf_dir;

static void dir_close(hf_dir *d) {
  dsc_context *ctx = d->ctx;
  for (int i = 0; i < d->n_files; i++) {
    rt_st_close(d->files[i]);
    if (d->paths[i]) ir_free(ctx, d->paths[i], strlen(d->paths[i]) + 1);
  }
  if (d->files)
    ir_free(ctx, d->files, sizeof *d->files * (size_t)(d->n_files > 0 ? d->n_files : 1));
  if (d->paths)
    ir_free(ctx, d->paths, sizeof *d->paths * (size_t)(d->n_files > 0 ? d->n_files : 1));
  if (d->items) ir_free(ctx, d->items, sizeof *d->items * (size_t)d->cap_items);
  cJSON_Delete(d->config);
  memset(d, 0, sizeof *d);
}

static char *join(dsc_context *ctx, const char *dir, const char *name) {
  size_t n = strlen(dir) + strlen(name) + 2;
  char *p = ir_alloc(ctx, n);
  if (p) snprintf(p, n, "%s/%s", dir, name);
  return p;
}

/* Param i's whole type, also in a module the ZeRO pass sharded (there the
 * module's type is a rank's chunk). */
static dsc_type param_type(const dsc_module *m, int i) {
  dsc_type full;
  int64_t world;
  if (dsc_module_param_shard(m, i, &full, &world) > 0) return full;
  return dsc_module_param_type(m, i);
}

/* A file name of the index: a plain name in the directory, nothing else. */
static bool plain_name(const char *s) {
  return *s && strcmp(s, ".") != 0 && strcmp(s, "..") != 0 && !strchr(s, '/');
}

static dsc_status need_dir(dsc_context *ctx, const char *dir) {
  struct stat sb;
  if (stat(dir, &sb) == 0 && S_ISDIR(sb.st_mode)) return DSC_OK;
  ir_error(ctx, rt_loc(dir),
           "not a directory (a Hugging Face model directory holds config.json and "
           "model.safetensors or model.safetensors.index.json)");
  return DSC_ERR_USER;
}

/* config.json, and the weight files: model.safetensors, or the index's. */
static dsc_status dir_open(dsc_context *ctx, const char *dir, hf_dir *d) {
  memset(d, 0, sizeof *d);
  d->ctx = ctx, d->dir = dir;
  struct stat sb;
  dsc_status st = need_dir(ctx, dir);
  if (st != DSC_OK) return st;
  char *cfg = join(ctx, dir, "config.json");
  if (!cfg) return oom(ctx, dir);
  st = rt_read_json(ctx, cfg, &d->config);
  if (st == DSC_OK) {
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(d->config, "model_type");
    char known[128];
    arch_list(known, sizeof known);
    if (!cJSON_IsString(mt)) {
      ir_error(ctx, rt_loc(cfg), "no \"model_type\" string (dsc reads %s)", known);
      st = DSC_ERR_USER;
    } else if (!(d->arch = find_arch(mt->valuestring))) {
      ir_error(ctx, rt_loc(cfg), "model_type \"%s\" has no name map in dsc (it has %s)",
               mt->valuestring, known);
      st = DSC_ERR_USER;
    }
  }
  ir_free(ctx, cfg, strlen(cfg) + 1);
  if (st != DSC_OK) return st;

  char *single = join(ctx, dir, "model.safetensors"),
       *index = join(ctx, dir, "model.safetensors.index.json");
  if (!single || !index) {
    if (single) ir_free(ctx, single, strlen(single) + 1);
    if (index) ir_free(ctx, index, strlen(index) + 1);
    return oom(ctx, dir);
  }
  cJSON *idx = NULL;
  bool has_single = stat(single, &sb) == 0, has_index = stat(index, &sb) == 0;
  if (!has_single && !has_index) {
    ir_error(ctx, rt_loc(dir), "has neither model.safetensors nor model.safetensors.index.json");
    st = DSC_ERR_USER;
  } else if (!has_single) {
    st = rt_read_json(ctx, index, &idx);
    const cJSON *wm = idx ? cJSON_GetObjectItemCaseSensitive(idx, "weight_map") : NULL;
    if (st == DSC_OK && !cJSON_IsObject(wm)) {
      ir_error(ctx, rt_loc(index), "no \"weight_map\" object");
      st = DSC_ERR_USER;
    }
    /* the distinct shard names, in order of first appearance */
    int n = 0;
    for (const cJSON *e = wm ? wm->child : NULL; st == DSC_OK && e; e = e->next) n++;
    if (st == DSC_OK) {
      d->paths = ir_alloc(ctx, sizeof *d->paths * (size_t)(n > 0 ? n : 1));
      d->files = ir_alloc(ctx, sizeof *d->files * (size_t)(n > 0 ? n : 1));
      if (!d->paths || !d->files) st = oom(ctx, index);
    }
    for (const cJSON *e = wm ? wm->child : NULL; st == DSC_OK && e; e = e->next) {
      if (!cJSON_IsString(e) || !plain_name(e->valuestring)) {
        ir_error(ctx, rt_loc(index), "weight_map[\"%s\"] is not the name of a file in %s",
                 e->string, dir);
        st = DSC_ERR_USER;
        break;
      }
      bool seen = false;
      for (int f = 0; f < d->n_files && !seen; f++)
        seen = strcmp(strrchr(d->paths[f], '/') + 1, e->valuestring) == 0;
      if (seen) continue;
      d->files[d->n_files] = NULL;
      if (!(d->paths[d->n_files] = join(ctx, dir, e->valuestring)))
        st = oom(ctx, index);
      else
        d->n_files++;
    }
  } else {
    d->paths = ir_alloc(ctx, sizeof *d->paths), d->files = ir_alloc(ctx, sizeof *d->files);
    if (!d->paths || !d->files)
      st = oom(ctx, dir);
    else
      d->paths[0] = single, d->files[0] = NULL, d->n_files = 1, single = NULL;
  }
  for (int f = 0; st == DSC_OK && f < d->n_files; f++)
    st = rt_st_open(ctx, d->paths[f], &d->files[f]);
  /* every index entry is in the shard it names */
  const cJSON *wm = idx ? cJSON_GetObjectItemCaseSensitive(idx, "weight_map") : NULL;
  for (const cJSON *e = wm ? wm->child : NULL; st == DSC_OK && e; e = e->next) {
    int f = 0;
    while (strcmp(strrchr(d->paths[f], '/') + 1, e->valuestring) != 0) f++;
    if (rt_st_find(d->files[f], e->string) < 0) {
      ir_error(ctx, rt_loc(index), "weight_map puts '%s' in %s, which has no such tensor",
               e->string, e->valuestring);
      st = DSC_ERR_USER;
    }
  }
  cJSON_Delete(idx);
  if (single) ir_free(ctx, single, strlen(single) + 1);
  ir_free(ctx, index, strlen(index) + 1);
  return st;
}

static plan_item *add_item(hf_dir *d) {
  if (d->n_items == d->cap_items) {
    int cap = d->cap_items ? 2 * d->cap_items : 64;
    plan_item *p = ir_alloc(d->ctx, sizeof *p * (size_t)cap);
    if (!p) return NULL;
    if (d->items) {
      memcpy(p, d->items, sizeof *p * (size_t)d->n_items);
      ir_free(d->ctx, d->items, sizeof *p * (size_t)d->cap_items);
    }
    d->items = p, d->cap_items = cap;
  }
  plan_item *it = &d->items[d->n_items++];
  memset(it, 0, sizeof *it);
  it->param = -1;
  return it;
}

static const char *strip(const hf_arch *a, const char *name) {
  size_t k = strlen(a->prefix);
  return k && strncmp(name, a->prefix, k) == 0 ? name + k : name;
}

/* The shape the file must have for param type t under layout. */
static void stored_shape(const dsc_type *t, hf_layout layout, dsc_type *out) {
  *out = *t;
  if (layout == HF_TRANSPOSE && t->rank == 2) out->dims[0] = t->dims[1], out->dims[1] = t->dims[0];
}

static bool is_model_param(const dsc_module *m, int i) {
  return !dsc_module_param_is_state(m, i) && !dsc_step_is_sum(m, i);
}

static bool tie_word_embeddings(const hf_dir *d) {
  const cJSON *t = cJSON_GetObjectItemCaseSensitive(d->config, "tie_word_embeddings");
  return cJSON_IsTrue(t);
}

/* Matches every tensor of the directory to a param of m and checks every
 * shape; every model param of m must be found. */
static dsc_status plan(hf_dir *d, const dsc_module *m) {
  dsc_context *ctx = d->ctx;
  const hf_arch *a = d->arch;
  int np = dsc_module_param_count(m);
  int *owner = ir_alloc(ctx, sizeof *owner * (size_t)(np > 0 ? np : 1));
  if (!owner) return oom(ctx, d->dir);
  for (int i = 0; i < np; i++) owner[i] = -1;
  dsc_status st = DSC_OK;
  char param[512];
  for (int f = 0; st == DSC_OK && f < d->n_files; f++)
    for (int e = 0; st == DSC_OK && e < rt_st_count(d->files[f]); e++) {
      const char *full = rt_st_name(d->files[f], e), *name = strip(a, full);
      plan_item *it = add_item(d);
      if (!it) {
        st = oom(ctx, d->dir);
        break;
      }
      it->hf = full, it->file = f, it->entry = e;
      const hf_rule *r = rule_of(a, name, param, sizeof param);
      if (!r) {
        if (ignored(a, name)) continue;
        ir_error(ctx, rt_loc(d->paths[f]),
                 "tensor '%s' has no param in dsc's %s name map (docs/models.md lists it)", full,
                 a->model_type);
        st = DSC_ERR_USER;
        break;
      }
      int p = dsc_module_find_param(m, param);
      if (p < 0 || !is_model_param(m, p)) {
        ir_error(ctx, rt_loc(d->paths[f]), "tensor '%s' maps to param '%s', which model '%s' lacks",
                 full, param, dsc_module_name(m));
        st = DSC_ERR_USER;
        break;
      }
      if (owner[p] >= 0) {
        ir_error(ctx, rt_loc(d->paths[f]), "tensors '%s' and '%s' both map to param '%s'",
                 d->items[owner[p]].hf, full, param);
        st = DSC_ERR_USER;
        break;
      }
      dsc_type pt = param_type(m, p), want, got = rt_st_type(d->files[f], e);
      stored_shape(&pt, r->layout, &want);
      bool fits = got.rank == want.rank;
      for (int k = 0; fits && k < got.rank; k++)
        fits = got.dims[k] == want.dims[k] ||
               (r->layout == HF_ROWS && k == 0 && got.dims[0] <= want.dims[0]);
      if (!fits || !dsc_dtype_is_float(got.dtype)) {
        char gs[128], ws[128];
        dsc_type_format(&got, gs, sizeof gs);
        dsc_type_format(&want, ws, sizeof ws);
        ir_error(ctx, rt_loc(d->paths[f]), "tensor '%s' is %s; param '%s' needs %s%s", full, gs,
                 param, ws,
                 r->layout == HF_TRANSPOSE ? " (transformers stores a Linear weight [out, in])"
                 : r->layout == HF_ROWS    ? " (or fewer rows)"
                                           : "");
        st = DSC_ERR_USER;
        break;
      }
      it->param = p, it->rule = r, owner[p] = d->n_items - 1;
    }
  /* the head tied to the embedding */
  if (st == DSC_OK && a->tied_head) {
    int h = dsc_module_find_param(m, a->tied_head), e = dsc_module_find_param(m, a->embedding);
    if (h >= 0 && owner[h] < 0 && e >= 0 && owner[e] >= 0 && tie_word_embeddings(d)) {
      dsc_type ht = param_type(m, h), et = param_type(m, e);
      if (ht.rank != 2 || et.rank != 2 || ht.dims[0] != et.dims[1] || ht.dims[1] != et.dims[0]) {
        ir_error(ctx, rt_loc(d->dir),
                 "tie_word_embeddings: param '%s' is not the transpose of '%s'", a->tied_head,
                 a->embedding);
        st = DSC_ERR_USER;
      } else {
        plan_item *it = add_item(d);
        if (!it) {
          st = oom(ctx, d->dir);
        } else {
          *it = d->items[owner[e]];
          static const hf_rule tied = {"", "", HF_TRANSPOSE};
          it->param = h, it->rule = &tied, it->tied = true, owner[h] = d->n_items - 1;
        }
      }
    }
  }
  for (int p = 0; st == DSC_OK && p < np; p++) {
    if (!is_model_param(m, p) || owner[p] >= 0) continue;
    char hf[512];
    const char *pn = dsc_module_param_name(m, p);
    if (hf_name_of(a, pn, hf, sizeof hf))
      ir_error(ctx, rt_loc(d->dir), "param '%s' of model '%s' has no tensor here (%s's name: %s%s)",
               pn, dsc_module_name(m), a->model_type, a->prefix, hf);
    else
      ir_error(ctx, rt_loc(d->dir),
               "param '%s' of model '%s' has no name in dsc's %s name map (docs/models.md)", pn,
               dsc_module_name(m), a->model_type);
    st = DSC_ERR_USER;
  }
  ir_free(ctx, owner, sizeof *owner * (size_t)(np > 0 ? np : 1));
  return st;
}

/* ------------------------------------------------------------ config checks */

static bool cfg_num(const cJSON *c, const char *key, double *out) {
  const cJSON *j = cJSON_GetObjectItemCaseSensitive(c, key);
  if (!cJSON_IsNumber(j)) return false;
  *out = j->valuedouble;
  return true;
}

static bool close_to(double a, double b) { return fabs(a - b) <= 1e-9 * fmax(fabs(a), fabs(b)); }

/* The first node of op in g's forward graph with attribute key unlike want. */
static dsc_status check_attr(dsc_context *ctx, const char *cfg_path, const dsc_graph *g, dsc_op op,
                             const char *key, const char *cfg_key, double want) {
  for (int i = 0; i < dsc_graph_node_count(g); i++) {
    const dsc_node *n = dsc_graph_node(g, i);
    if (dsc_node_op(n) != op) continue;
    const dsc_attr *at = dsc_node_attr(n, key);
    if (!at) continue;
    double v = at->kind == DSC_ATTR_INT ? (double)at->u.i : at->u.f;
    if (!close_to(v, want)) {
      ir_error(ctx, rt_loc(cfg_path), "%s is %g, but the model's %s has %s = %g", cfg_key, want,
               dsc_op_name(op), key, v);
      return DSC_ERR_USER;
    }
  }
  return DSC_OK;
}

dsc_status dsc_hf_check_config(dsc_context *ctx, const char *dir, const dsc_module *m) {
  hf_dir d;
  memset(&d, 0, sizeof d);
  if (need_dir(ctx, dir) != DSC_OK) return DSC_ERR_USER;
  char *cfg = join(ctx, dir, "config.json");
  if (!cfg) return oom(ctx, dir);
  dsc_status st = rt_read_json(ctx, cfg, &d.config);
  const cJSON *mt = d.config ? cJSON_GetObjectItemCaseSensitive(d.config, "model_type") : NULL;
  const hf_arch *a = cJSON_IsString(mt) ? find_arch(mt->valuestring) : NULL;
  const dsc_graph *g = dsc_module_find_graph(m, "forward");
  double v;
  if (st == DSC_OK && a && g) {
    bool llama = a->tied_head != NULL;
    const char *heads = llama ? "num_attention_heads" : "n_head";
    if (st == DSC_OK && cfg_num(d.config, heads, &v))
      st = check_attr(ctx, cfg, g, DSC_OP_ATTENTION, "heads", heads, v);
    if (st == DSC_OK && llama) {
      double kv = 0;
      if (!cfg_num(d.config, "num_key_value_heads", &kv)) cfg_num(d.config, heads, &kv);
      if (kv > 0)
        st = check_attr(ctx, cfg, g, DSC_OP_ATTENTION, "kv_heads", "num_key_value_heads", kv);
      double theta = 10000.0;
      cfg_num(d.config, "rope_theta", &theta);
      const cJSON *rp = cJSON_GetObjectItemCaseSensitive(d.config, "rope_parameters");
      if (cJSON_IsObject(rp)) cfg_num(rp, "rope_theta", &theta);
      if (st == DSC_OK) st = check_attr(ctx, cfg, g, DSC_OP_ROPE, "theta", "rope_theta", theta);
      const cJSON *rs = cJSON_GetObjectItemCaseSensitive(d.config, "rope_scaling");
      const cJSON *rt =
          cJSON_IsObject(rs) ? cJSON_GetObjectItemCaseSensitive(rs, "rope_type") : NULL;
      if (!rt && cJSON_IsObject(rp)) rt = cJSON_GetObjectItemCaseSensitive(rp, "rope_type");
      const char *type = cJSON_IsString(rt) ? rt->valuestring : "default";
      if (st == DSC_OK && strcmp(type, "default") == 0) {
        st = check_attr(ctx, cfg, g, DSC_OP_ROPE, "factor", "the rope scaling factor (none)", 1);
      } else if (st == DSC_OK && strcmp(type, "llama3") == 0) {
        /* Llama 3.1: the model's rope must scale its frequencies alike */
        const cJSON *sc = cJSON_IsObject(rs) ? rs : rp;
        static const char *const keys[4][2] = {
            {"factor", "factor"},
            {"low_freq_factor", "low_freq_factor"},
            {"high_freq_factor", "high_freq_factor"},
            {"original_context", "original_max_position_embeddings"}};
        for (int k = 0; st == DSC_OK && k < 4; k++) {
          char what[96];
          snprintf(what, sizeof what, "rope_scaling.%s", keys[k][1]);
          if (!cfg_num(sc, keys[k][1], &v)) {
            ir_error(ctx, rt_loc(cfg), "rope_type \"llama3\" without %s", what);
            st = DSC_ERR_USER;
          } else {
            st = check_attr(ctx, cfg, g, DSC_OP_ROPE, keys[k][0], what, v);
          }
        }
      } else if (st == DSC_OK) {
        ir_error(ctx, rt_loc(cfg),
                 "rope_type \"%s\" scales the rotary frequencies in a way dsc's rope does not "
                 "(it has the default frequencies and \"llama3\"'s)",
                 type);
        st = DSC_ERR_USER;
      }
      double hidden, nh, hd;
      if (st == DSC_OK && cfg_num(d.config, "head_dim", &hd) &&
          cfg_num(d.config, "hidden_size", &hidden) && cfg_num(d.config, heads, &nh) && nh > 0 &&
          !close_to(hd * nh, hidden)) {
        ir_error(ctx, rt_loc(cfg),
                 "head_dim %g x %g heads is not hidden_size %g: dsc's attention splits the "
                 "channels into heads of hidden_size / heads",
                 hd, nh, hidden);
        st = DSC_ERR_USER;
      }
      if (st == DSC_OK && cfg_num(d.config, "rms_norm_eps", &v))
        st = check_attr(ctx, cfg, g, DSC_OP_RMSNORM, "eps", "rms_norm_eps", v);
      /* Mistral's sliding window (null: none); Qwen2's per-layer windows
       * (use_sliding_window with max_window_layers) are not modelled */
      const cJSON *usw = cJSON_GetObjectItemCaseSensitive(d.config, "use_sliding_window");
      double window = 0;
      if (st == DSC_OK && strcmp(a->model_type, "qwen2") == 0 && cJSON_IsTrue(usw)) {
        ir_error(ctx, rt_loc(cfg),
                 "use_sliding_window: Qwen2's sliding windows on the layers from "
                 "max_window_layers on are not modelled; dsc's attention window is per call");
        st = DSC_ERR_USER;
      }
      if (strcmp(a->model_type, "mistral") == 0) cfg_num(d.config, "sliding_window", &window);
      if (st == DSC_OK)
        st = check_attr(ctx, cfg, g, DSC_OP_ATTENTION, "window",
                        window > 0 ? "sliding_window" : "the sliding window (none)", window);
    } else if (st == DSC_OK && cfg_num(d.config, "layer_norm_epsilon", &v)) {
      st = check_attr(ctx, cfg, g, DSC_OP_LAYERNORM, "eps", "layer_norm_epsilon", v);
    }
  }
  cJSON_Delete(d.config);
  ir_free(ctx, cfg, strlen(cfg) + 1);
  return st;
}

/* ------------------------------------------------------------ import */

static const char *layout_text(const plan_item *it) {
  if (it->tied) return "transposed, tied to the embedding";
  switch (it->rule->layout) {
    case HF_TRANSPOSE:
      return "transposed";
    case HF_ROWS:
      return "rows";
    default:
      return "as is";
  }
}

dsc_status dsc_hf_list(dsc_context *ctx, const char *dir, const dsc_module *m, FILE *out) {
  hf_dir d;
  dsc_status st = dir_open(ctx, dir, &d);
  if (st == DSC_OK) st = plan(&d, m);
  if (st == DSC_OK) {
    fprintf(out, "%s: model_type %s, %d file(s), %d tensors, into model '%s'\n", dir,
            d.arch->model_type, d.n_files, d.n_items, dsc_module_name(m));
    for (int i = 0; i < d.n_items; i++) {
      const plan_item *it = &d.items[i];
      char ts[128];
      dsc_type t = rt_st_type(d.files[it->file], it->entry);
      dsc_type_format(&t, ts, sizeof ts);
      const char *file = strrchr(d.paths[it->file], '/') + 1;
      if (it->param < 0)
        fprintf(out, "  %-56s %-18s %s  (ignored: not a weight)\n", it->hf, ts, file);
      else
        fprintf(out, "  %-56s %-18s %s  -> %s (%s)\n", it->hf, ts, file,
                dsc_module_param_name(m, it->param), layout_text(it));
    }
  }
  dir_close(&d);
  return st;
}

/* Param it->param's elements [a, b) of its flattened value (dsc's layout)
 * into out[0 .. b - a), zero past a padded vocabulary's rows. The whole
 * param (a = 0, b = n) is one streamed read of its tensor (a transposed one,
 * file [R, C] -> param [C, R], through whole[], R C doubles). A rank's chunk
 * reads only the file bytes that hold it: one range of a plain tensor; of a
 * transposed one, where element c R + r is file element r C + c, columns
 * c_lo..c_hi of each file row, one read per row through row[]. */
static dsc_status read_span(const hf_dir *d, const plan_item *it, int64_t a, int64_t b, int64_t n,
                            double *out, double *whole, double *row) {
  rt_st_file *f = d->files[it->file];
  dsc_type ft = rt_st_type(f, it->entry);
  int64_t got = dsc_type_numel(&ft);
  bool full = a == 0 && b == n;
  if (!(it->tied || it->rule->layout == HF_TRANSPOSE)) {
    int64_t end = b < got ? b : got;
    for (int64_t k = end > a ? end - a : 0; k < b - a; k++) out[k] = 0; /* padded rows */
    if (end <= a) return DSC_OK;
    return full ? rt_st_read(f, it->entry, out) : rt_st_read_range(f, it->entry, a, end - a, out);
  }
  int64_t R = ft.dims[0], C = ft.dims[1];
  if (full) {
    dsc_status st = rt_st_read(f, it->entry, whole);
    for (int64_t r = 0; st == DSC_OK && r < R; r++)
      for (int64_t c = 0; c < C; c++) out[c * R + r] = whole[r * C + c];
    return st;
  }
  int64_t c_lo = a / R, c_hi = (b - 1) / R;
  for (int64_t r = 0; r < R; r++) {
    dsc_status st = rt_st_read_range(f, it->entry, r * C + c_lo, c_hi - c_lo + 1, row);
    if (st != DSC_OK) return st;
    for (int64_t c = c_lo; c <= c_hi; c++) {
      int64_t j = c * R + r;
      if (j >= a && j < b) out[j - a] = row[c - c_lo];
    }
  }
  return DSC_OK;
}

dsc_status dsc_hf_import_sharded(dsc_context *ctx, const char *dir, const dsc_module *m,
                                 dsc_tensor *const *dst, dsc_tensor *const *chunk, int rank,
                                 int world, int64_t *bytes_read) {
  hf_dir d;
  if (bytes_read) *bytes_read = 0;
  if (world < 1 || rank < 0 || rank >= world) {
    ir_error(ctx, ir_no_loc, "import: rank %d of a world of %d", rank, world);
    return DSC_ERR_USER;
  }
  dsc_status st = dir_open(ctx, dir, &d);
  if (st == DSC_OK) st = plan(&d, m);
  /* scratch: the largest transposed tensor read whole, the longest file row
   * a chunk reads from */
  int64_t most = 1, widest = 1;
  for (int i = 0; st == DSC_OK && i < d.n_items; i++) {
    const plan_item *it = &d.items[i];
    if (it->param < 0) continue;
    dsc_type ft = rt_st_type(d.files[it->file], it->entry);
    if (chunk && chunk[it->param]) {
      if (ft.rank == 2 && ft.dims[1] > widest) widest = ft.dims[1];
    } else if (dsc_type_numel(&ft) > most) {
      most = dsc_type_numel(&ft);
    }
  }
  double *whole = st == DSC_OK ? ir_alloc(ctx, sizeof(double) * (size_t)most) : NULL;
  double *row = st == DSC_OK ? ir_alloc(ctx, sizeof(double) * (size_t)widest) : NULL;
  if (st == DSC_OK && (!whole || !row)) st = oom(ctx, dir);
  for (int i = 0; st == DSC_OK && i < d.n_items; i++) {
    const plan_item *it = &d.items[i];
    if (it->param < 0) continue;
    bool part = chunk && chunk[it->param];
    dsc_tensor *t = part ? chunk[it->param] : dst[it->param];
    if (!t) continue;
    if ((st = ir_check_interrupt(ctx, "reading %s", dir)) != DSC_OK) break;
    dsc_type pt = param_type(m, it->param);
    int64_t n = dsc_type_numel(&pt), s = part ? (n + world - 1) / world : n;
    int64_t a = part ? (int64_t)rank * s : 0, b = a + s < n ? a + s : n;
    if (dsc_type_numel(&t->type) != s) {
      ir_error(ctx, ir_no_loc,
               "import: param '%s' has %" PRId64 " elements here, expected %" PRId64,
               dsc_module_param_name(m, it->param), dsc_type_numel(&t->type), s);
      st = DSC_ERR_INTERNAL;
      break;
    }
    for (int64_t k = b > a ? b - a : 0; k < s; k++) t->data[k] = 0; /* the chunk's padding */
    if (b > a && (st = read_span(&d, it, a, b, n, t->data, whole, row)) != DSC_OK) break;
    for (int64_t k = 0; k < b - a; k++)
      if (!isfinite(t->data[k])) {
        ir_error(ctx, rt_loc(d.paths[it->file]), "tensor '%s': element %" PRId64 " is %s", it->hf,
                 a + k, isnan(t->data[k]) ? "NaN" : "infinite");
        st = DSC_ERR_USER;
        break;
      }
  }
  for (int i = 0; bytes_read && st == DSC_OK && i < d.n_files; i++)
    *bytes_read += rt_st_bytes_read(d.files[i]);
  if (whole) ir_free(ctx, whole, sizeof(double) * (size_t)most);
  if (row) ir_free(ctx, row, sizeof(double) * (size_t)widest);
  dir_close(&d);
  return st;
}

dsc_status dsc_hf_import(dsc_context *ctx, const char *dir, const dsc_module *m,
                         dsc_tensor *const *dst) {
  return dsc_hf_import_sharded(ctx, dir, m, dst, NULL, 0, 1, NULL);
}

/* ------------------------------------------------------------ export */

/* The architecture whose rules name every model param of m. */
static const hf_arch *arch_of_module(const dsc_module *m) {
  char hf[512];
  for (int a = 0; a < N(archs); a++) {
    bool all = true;
    for (int i = 0; all && i < dsc_module_param_count(m); i++)
      if (is_model_param(m, i))
        all = hf_name_of(&archs[a], dsc_module_param_name(m, i), hf, sizeof hf) != NULL;
    if (all) return &archs[a];
  }
  return NULL;
}

/* The first node of op in g with attribute key (its number), or false. */
static bool graph_attr(const dsc_graph *g, dsc_op op, const char *key, double *out) {
  for (int i = 0; g && i < dsc_graph_node_count(g); i++) {
    const dsc_node *n = dsc_graph_node(g, i);
    const dsc_attr *at = dsc_node_op(n) == op ? dsc_node_attr(n, key) : NULL;
    if (!at) continue;
    *out = at->kind == DSC_ATTR_INT    ? (double)at->u.i
           : at->kind == DSC_ATTR_BOOL ? at->u.b
                                       : at->u.f;
    return true;
  }
  return false;
}

static int64_t dim_of(const dsc_module *m, const char *param, int axis) {
  int i = dsc_module_find_param(m, param);
  if (i < 0) return 0;
  dsc_type t = param_type(m, i);
  return axis < t.rank ? t.dims[axis] : 0;
}

/* The layers: one more than the largest index of a block param. */
static int64_t layer_count(const dsc_module *m, const char *block) {
  int64_t n = 0;
  size_t k = strlen(block);
  for (int i = 0; i < dsc_module_param_count(m); i++) {
    const char *p = dsc_module_param_name(m, i);
    if (strncmp(p, block, k) == 0 && p[k] == '.') {
      long l = strtol(p + k + 1, NULL, 10);
      if (l + 1 > n) n = l + 1;
    }
  }
  return n;
}

static cJSON *hf_config(const hf_arch *a, const dsc_module *m, dsc_dtype dt, int64_t seq) {
  const dsc_graph *g = dsc_module_find_graph(m, "forward");
  cJSON *c = cJSON_CreateObject();
  if (!c) return NULL;
  cJSON *arch = cJSON_AddArrayToObject(c, "architectures");
  if (arch) cJSON_AddItemToArray(arch, cJSON_CreateString(a->architecture));
  cJSON_AddStringToObject(c, "model_type", a->model_type);
  cJSON_AddStringToObject(c, "torch_dtype",
                          dt == DSC_BF16  ? "bfloat16"
                          : dt == DSC_F16 ? "float16"
                                          : "float32");
  double heads = 0, kv = 0, theta = 10000, eps = 1e-5;
  graph_attr(g, DSC_OP_ATTENTION, "heads", &heads);
  if (!graph_attr(g, DSC_OP_ATTENTION, "kv_heads", &kv)) kv = heads;
  if (a->tied_head) { /* the Llama family */
    int64_t d = dim_of(m, "embed_tokens", 1);
    graph_attr(g, DSC_OP_ROPE, "theta", &theta);
    graph_attr(g, DSC_OP_RMSNORM, "eps", &eps);
    cJSON_AddNumberToObject(c, "vocab_size", (double)dim_of(m, "embed_tokens", 0));
    cJSON_AddNumberToObject(c, "hidden_size", (double)d);
    cJSON_AddNumberToObject(c, "intermediate_size", (double)dim_of(m, "layers.0.gate_proj", 1));
    cJSON_AddNumberToObject(c, "num_hidden_layers", (double)layer_count(m, "layers"));
    cJSON_AddNumberToObject(c, "num_attention_heads", heads);
    cJSON_AddNumberToObject(c, "num_key_value_heads", kv);
    cJSON_AddNumberToObject(c, "head_dim", heads > 0 ? (double)d / heads : 0);
    cJSON_AddNumberToObject(c, "rms_norm_eps", eps);
    cJSON_AddNumberToObject(c, "rope_theta", theta);
    double window = 0;
    if (graph_attr(g, DSC_OP_ATTENTION, "window", &window) && window > 0)
      cJSON_AddNumberToObject(c, "sliding_window", window);
    double factor = 1, lo = 0, hi = 0, old = 0;
    graph_attr(g, DSC_OP_ROPE, "factor", &factor);
    cJSON *rs = factor != 1 ? cJSON_AddObjectToObject(c, "rope_scaling") : NULL;
    if (rs) { /* Llama 3.1's */
      graph_attr(g, DSC_OP_ROPE, "low_freq_factor", &lo);
      graph_attr(g, DSC_OP_ROPE, "high_freq_factor", &hi);
      graph_attr(g, DSC_OP_ROPE, "original_context", &old);
      cJSON_AddStringToObject(rs, "rope_type", "llama3");
      cJSON_AddNumberToObject(rs, "factor", factor);
      cJSON_AddNumberToObject(rs, "low_freq_factor", lo);
      cJSON_AddNumberToObject(rs, "high_freq_factor", hi);
      cJSON_AddNumberToObject(rs, "original_max_position_embeddings", old);
    }
    cJSON_AddNumberToObject(c, "max_position_embeddings", (double)(seq > 2048 ? seq : 2048));
    cJSON_AddStringToObject(c, "hidden_act", "silu");
    cJSON_AddBoolToObject(c, "attention_bias",
                          dsc_module_find_param(m, "layers.0.q_proj_bias") >= 0);
    cJSON_AddBoolToObject(c, "tie_word_embeddings", dsc_module_find_param(m, "lm_head") < 0);
  } else { /* GPT-2: a tied head, the tanh GELU; dropout 0 (inference does not
            * drop, and where a .dsm drops is not what transformers' keys say) */
    graph_attr(g, DSC_OP_LAYERNORM, "eps", &eps);
    cJSON_AddNumberToObject(c, "vocab_size", (double)dim_of(m, "wte", 0));
    cJSON_AddNumberToObject(c, "n_embd", (double)dim_of(m, "wte", 1));
    cJSON_AddNumberToObject(c, "n_layer", (double)layer_count(m, "h"));
    cJSON_AddNumberToObject(c, "n_head", heads);
    cJSON_AddNumberToObject(c, "n_positions", (double)dim_of(m, "wpe", 0));
    cJSON_AddNumberToObject(c, "n_ctx", (double)dim_of(m, "wpe", 0));
    cJSON_AddNumberToObject(c, "layer_norm_epsilon", eps);
    cJSON_AddStringToObject(c, "activation_function", "gelu_new");
    cJSON_AddNumberToObject(c, "resid_pdrop", 0);
    cJSON_AddNumberToObject(c, "embd_pdrop", 0);
    cJSON_AddNumberToObject(c, "attn_pdrop", 0);
    cJSON_AddBoolToObject(c, "tie_word_embeddings", true);
  }
  return c;
}

dsc_status dsc_hf_export(dsc_context *ctx, const dsc_module *m, const dsc_tensor_set *params,
                         const char *out_dir, dsc_dtype dt, int64_t seq, int64_t max_shard_bytes,
                         FILE *report) {
  const hf_arch *a = arch_of_module(m);
  if (!a) {
    char known[128];
    arch_list(known, sizeof known);
    ir_error(ctx, ir_no_loc,
             "model '%s' has params that no transformers architecture dsc knows (%s) names; "
             "its params must follow one name map (docs/models.md)",
             dsc_module_name(m), known);
    return DSC_ERR_USER;
  }
  struct stat sb;
  if (stat(out_dir, &sb) == 0 ? !S_ISDIR(sb.st_mode) : mkdir(out_dir, 0777) != 0) {
    ir_error(ctx, rt_loc(out_dir), "cannot make the output directory: %s",
             errno ? strerror(errno) : "not a directory");
    return DSC_ERR_USER;
  }
  /* the tensors under transformers' names, in its layout */
  int n = 0, np = dsc_module_param_count(m);
  const char **names = ir_alloc(ctx, sizeof *names * (size_t)(np > 0 ? np : 1));
  char **owned = ir_alloc(ctx, sizeof *owned * (size_t)(np > 0 ? np : 1));
  dsc_tensor **ts = ir_alloc(ctx, sizeof *ts * (size_t)(np > 0 ? np : 1));
  int64_t *bytes = ir_alloc(ctx, sizeof *bytes * (size_t)(np > 0 ? np : 1));
  dsc_status st = names && owned && ts && bytes ? DSC_OK : oom(ctx, out_dir);
  for (int i = 0; st == DSC_OK && i < np; i++) {
    if (!is_model_param(m, i)) continue;
    const char *pn = dsc_module_param_name(m, i);
    const dsc_tensor *src = dsc_tensor_set_find(params, pn);
    char hf[512];
    const hf_rule *r = hf_name_of(a, pn, hf, sizeof hf);
    if (!src) {
      ir_error(ctx, rt_loc(out_dir), "param '%s' is not in the checkpoint", pn);
      st = DSC_ERR_USER;
      break;
    }
    dsc_type t = src->type;
    stored_shape(&src->type, r->layout, &t);
    t.dtype = dt;
    size_t len = strlen(a->prefix) + strlen(hf) + 1;
    if (!(owned[n] = ir_alloc(ctx, len)) || !(ts[n] = dsc_tensor_new(ctx, t))) {
      if (owned[n]) ir_free(ctx, owned[n], len);
      st = oom(ctx, out_dir);
      break;
    }
    snprintf(owned[n], len, "%s%s", a->prefix, hf);
    names[n] = owned[n];
    if (r->layout == HF_TRANSPOSE) {
      int64_t R = src->type.dims[0], C = src->type.dims[1]; /* [in, out] -> [out, in] */
      for (int64_t x = 0; x < R; x++)
        for (int64_t y = 0; y < C; y++) ts[n]->data[y * R + x] = src->data[x * C + y];
    } else {
      memcpy(ts[n]->data, src->data, sizeof(double) * (size_t)dsc_type_numel(&t));
    }
    bytes[n] = dsc_type_numel(&t) * (int64_t)dsc_dtype_size(dt);
    n++;
  }
  /* shards of at most max_shard_bytes (one tensor may exceed it alone), in
   * the order of the model's params */
  int n_shards = 0;
  int64_t total = 0, in_shard = 0;
  for (int i = 0; i < n; i++) {
    if (i == 0 || (max_shard_bytes > 0 && in_shard + bytes[i] > max_shard_bytes))
      n_shards++, in_shard = 0;
    in_shard += bytes[i], total += bytes[i];
  }
  cJSON *index = n_shards > 1 ? cJSON_CreateObject() : NULL;
  cJSON *wm = index ? cJSON_CreateObject() : NULL;
  if (index) {
    cJSON *meta = cJSON_AddObjectToObject(index, "metadata");
    if (meta) cJSON_AddNumberToObject(meta, "total_size", (double)total);
    cJSON_AddItemToObject(index, "weight_map", wm);
  }
  dsc_kv fmt = {"format", "pt"};
  for (int first = 0, k = 0; st == DSC_OK && first < n; k++) {
    int last = first;
    int64_t sz = bytes[first];
    while (last + 1 < n && !(max_shard_bytes > 0 && sz + bytes[last + 1] > max_shard_bytes))
      sz += bytes[++last];
    char file[64];
    if (n_shards > 1)
      snprintf(file, sizeof file, "model-%05d-of-%05d.safetensors", k + 1, n_shards);
    else
      snprintf(file, sizeof file, "model.safetensors");
    char *path = join(ctx, out_dir, file);
    if (!path) {
      st = oom(ctx, out_dir);
      break;
    }
    dsc_tensor_set set = {last - first + 1, names + first, ts + first, 1, &fmt};
    st = dsc_safetensors_write(ctx, path, &set);
    ir_free(ctx, path, strlen(path) + 1);
    for (int i = first; wm && i <= last; i++) cJSON_AddStringToObject(wm, names[i], file);
    if (report && st == DSC_OK)
      fprintf(report, "  %s: %d tensors, %lld bytes\n", file, last - first + 1, (long long)sz);
    first = last + 1;
  }
  char *p = st == DSC_OK && index ? join(ctx, out_dir, "model.safetensors.index.json") : NULL;
  if (p) {
    st = rt_write_json(ctx, p, index);
    ir_free(ctx, p, strlen(p) + 1);
  }
  /* a sliding window is Mistral's: LlamaConfig would drop it */
  double window = 0;
  const dsc_graph *fg = dsc_module_find_graph(m, "forward");
  if (fg && graph_attr(fg, DSC_OP_ATTENTION, "window", &window) && window > 0 &&
      strcmp(a->model_type, "llama") == 0)
    a = find_arch("mistral");
  cJSON *cfg = st == DSC_OK ? hf_config(a, m, dt, seq) : NULL;
  if (cfg) {
    char *cp = join(ctx, out_dir, "config.json");
    st = cp ? rt_write_json(ctx, cp, cfg) : oom(ctx, out_dir);
    if (cp) ir_free(ctx, cp, strlen(cp) + 1);
  } else if (st == DSC_OK) {
    st = oom(ctx, out_dir);
  }
  if (report && st == DSC_OK)
    fprintf(report, "%s: %s (%s), %d tensors in %d file(s), %lld bytes, and config.json\n", out_dir,
            a->architecture, a->model_type, n, n_shards, (long long)total);
  cJSON_Delete(cfg);
  cJSON_Delete(index);
  for (int i = 0; i < n; i++) {
    dsc_tensor_free(ctx, ts[i]);
    ir_free(ctx, owned[i], strlen(owned[i]) + 1);
  }
  if (names) ir_free(ctx, names, sizeof *names * (size_t)(np > 0 ? np : 1));
  if (owned) ir_free(ctx, owned, sizeof *owned * (size_t)(np > 0 ? np : 1));
  if (ts) ir_free(ctx, ts, sizeof *ts * (size_t)(np > 0 ? np : 1));
  if (bytes) ir_free(ctx, bytes, sizeof *bytes * (size_t)(np > 0 ? np : 1));
  return st;
}
