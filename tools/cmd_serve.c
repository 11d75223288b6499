/* dsc serve: an HTTP server with OpenAI's completion and chat shapes over
 * the continuous-batching engine (include/dsc/infer.h; docs/inference.md).
 *
 * Threads: libmicrohttpd runs one thread per connection; the main thread
 * runs the engine. Everything the batcher holds is under `lock`: a
 * connection submits its request, then waits on `progress` (broadcast after
 * every engine step) for its tokens; the engine waits on `work`. A
 * connection whose client went away cancels its request, which frees the
 * request's cache slot before the next step. */
#define _GNU_SOURCE /* POLLRDHUP */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "tools/cli.h"

static const char serve_help[] =
    "usage: dsc serve DIR [--port P] [--host ADDR] [--slots N] [--chunk C] [--context N]\n"
    "                 [--cache-tokens N] [--block-size N] [--queue N] [--name NAME]\n"
    "                 [--model FILE] [--tokenizer FILE] [--backend interp|cpu|cuda]\n"
    "                 [--threads N] [--chat-template FILE|none]\n"
    "\n"
    "Serves the checkpoint DIR (a step directory, or an output directory: its\n"
    "'latest') over HTTP with OpenAI's request and response shapes:\n"
    "  POST /v1/completions        {\"prompt\": \"...\", \"max_tokens\": 16, ...}\n"
    "  POST /v1/chat/completions   {\"messages\": [{\"role\": \"user\", \"content\": \"...\"}], "
    "...}\n"
    "      both take model, max_tokens, temperature, top_p, top_k, seed, stop, n (1),\n"
    "      user and stream (server-sent events); any other field is an error\n"
    "  GET  /v1/models, /health, /metrics (Prometheus text)\n"
    "Requests share the engine's steps (continuous batching): each step admits\n"
    "queued requests into free slots, runs prompts in chunks beside the running\n"
    "sequences' next tokens, and frees a slot when its sequence ends or its client\n"
    "goes away. The KV cache is one pool of blocks the sequences take as they grow;\n"
    "when it runs short, the youngest sequence waits in the queue and later runs its\n"
    "tokens again (the answer stays the same). Chat messages go through the model's\n"
    "chat template (tokenizer_config.json beside the tokenizer, or --chat-template),\n"
    "rendered as transformers' apply_chat_template with the generation prompt; without\n"
    "one they become 'role: content' lines and 'assistant:'. With a tokenizer (the\n"
    "run's tokenizer.json, or --tokenizer) its special tokens end a completion;\n"
    "without one, tokens are bytes.\n"
    "  --port P        TCP port (default 8000; 0: any free one, printed)\n"
    "  --host ADDR     IPv4 address to listen on (default 127.0.0.1: this machine only)\n"
    "  --slots N       sequences in one step (default 8)\n"
    "  --chunk C       prompt tokens per sequence and step (default 16)\n"
    "  --context N     positions per sequence (default: the model's)\n"
    "  --cache-tokens N  positions the KV cache holds for all sequences together\n"
    "                  (default: --context for every slot); a request needing more is refused\n"
    "  --block-size N  positions per cache block (default 16)\n"
    "  --queue N       requests waiting for a slot before new ones get 503 (default 256)\n"
    "  --name NAME     the model's name in requests and responses (default: DIR's name)\n"
    "  --backend B, --threads N, --model FILE, --tokenizer FILE: as dsc generate\n"
    "  --chat-template F  a tokenizer_config.json or a Jinja file (docs/inference.md);\n"
    "                  none: the plain role lines even where a template is found\n"
    "Stops on SIGINT or SIGTERM.\n";

#ifndef DSC_HAVE_SERVE
int cli_serve(int argc, char **argv) {
  (void)argc, (void)argv;
  fputs(
      "dsc: error: this dsc was built without dsc serve (libmicrohttpd was not found: "
      "apt-get install libmicrohttpd-dev, or scripts/install-deps.sh, then build again)\n",
      stderr);
  return CLI_EXIT_USER;
}
#else
#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <microhttpd.h>

enum { MAX_BODY = 1 << 20, MAX_STOPS = 4, RATE_SAMPLES = 256 };

typedef struct {
  pthread_mutex_t lock;          /* the batcher, the counters */
  pthread_cond_t work, progress; /* for the engine; for the connections */
  pthread_mutex_t tok_lock;      /* the tokenizer and its context */
  dsc_context *ctx, *tok_ctx;    /* the engine's; the tokenizer's own */
  dsc_infer *engine;
  dsc_batcher *b;
  dsc_tokenizer *tok;
  dsc_chat_template *chat; /* NULL: 'role: content' lines */
  int64_t vocab, context, max_queue;
  char name[256];
  bool stopping;
  char engine_error[512]; /* set when a step failed: running requests end with it */
  /* counters */
  int64_t requests[2], errors_4xx, errors_5xx, disconnects;
  double ttft_sum;
  int64_t ttft_n;
  double rate_t[RATE_SAMPLES];
  int64_t rate_gen[RATE_SAMPLES], rate_n;
  int64_t next_id;
} server;

/* One HTTP request: its body, then its generation. */
typedef struct {
  server *s;
  struct MHD_Connection *conn;
  char *body;
  size_t len;
  bool too_big;
  /* the generation */
  bool chat, stream;
  int64_t id; /* the batcher's; 0: none */
  int64_t n_prompt;
  char rid[48]; /* "cmpl-..." / "chatcmpl-..." */
  long created;
  char *stops[MAX_STOPS];
  int n_stops;
  size_t max_stop;
  /* streaming state */
  size_t sent; /* bytes of the text already sent */
  bool role_sent, done_sent;
  char *out; /* events not yet handed to MHD */
  size_t out_len, out_pos;
} request;

static server g_server;

static double now_s(void) { return (double)dsc_trace_now_ns() * 1e-9; }

/* ---------------------------------------------------------------- replies */

static enum MHD_Result reply(struct MHD_Connection *c, unsigned code, const char *type,
                             char *text) {
  struct MHD_Response *r =
      MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
  if (!r) {
    free(text);
    return MHD_NO;
  }
  MHD_add_response_header(r, "Content-Type", type);
  if (code == 503) MHD_add_response_header(r, "Retry-After", "1");
  enum MHD_Result ok = MHD_queue_response(c, code, r);
  MHD_destroy_response(r);
  return ok;
}

static enum MHD_Result reply_json(struct MHD_Connection *c, unsigned code, cJSON *j) {
  char *text = cJSON_PrintUnformatted(j);
  cJSON_Delete(j);
  if (!text) return MHD_NO;
  return reply(c, code, "application/json", text);
}

/* OpenAI's error shape: {"error": {"message", "type", "param", "code"}}. */
static enum MHD_Result reply_error(request *q, unsigned code, const char *param, const char *ecode,
                                   const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static enum MHD_Result reply_error(request *q, unsigned code, const char *param, const char *ecode,
                                   const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  pthread_mutex_lock(&q->s->lock);
  if (code >= 500)
    q->s->errors_5xx++;
  else
    q->s->errors_4xx++;
  pthread_mutex_unlock(&q->s->lock);
  cJSON *j = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(j, "error");
  cJSON_AddStringToObject(e, "message", msg);
  cJSON_AddStringToObject(e, "type", code >= 500 ? "server_error" : "invalid_request_error");
  if (param)
    cJSON_AddStringToObject(e, "param", param);
  else
    cJSON_AddNullToObject(e, "param");
  if (ecode)
    cJSON_AddStringToObject(e, "code", ecode);
  else
    cJSON_AddNullToObject(e, "code");
  return reply_json(q->conn, code, j);
}

/* ---------------------------------------------------------------- text */

/* The length of the valid UTF-8 sequence at p (1..4), 0 when invalid, -1
 * when it is cut short by the end at n. */
static int utf8_seq(const unsigned char *p, size_t n) {
  int len = p[0] < 0x80             ? 1
            : (p[0] & 0xe0) == 0xc0 ? 2
            : (p[0] & 0xf0) == 0xe0 ? 3
            : (p[0] & 0xf8) == 0xf0 ? 4
                                    : 0;
  if (len == 0 || (len == 2 && p[0] < 0xc2) || (len == 4 && p[0] > 0xf4)) return 0;
  for (int i = 1; i < len; i++) {
    if ((size_t)i >= n) return -1;
    if ((p[i] & 0xc0) != 0x80) return 0;
  }
  if (len == 3 && ((p[0] == 0xe0 && p[1] < 0xa0) || (p[0] == 0xed && p[1] > 0x9f))) return 0;
  if (len == 4 && ((p[0] == 0xf0 && p[1] < 0x90) || (p[0] == 0xf4 && p[1] > 0x8f))) return 0;
  return len;
}

/* The text of generated tokens, valid UTF-8 (malloc'd). Bytes (no
 * tokenizer): an invalid sequence becomes U+FFFD; an incomplete one at the
 * end is left out while more may come (*pending). With a tokenizer: its
 * decoding, which shows an incomplete character as U+FFFD at the end, then
 * pending too. */
static char *text_of(server *s, const int64_t *ids, int64_t n, bool final, bool *pending) {
  *pending = false;
  if (s->tok) {
    uint32_t *u = malloc(sizeof *u * (size_t)(n ? n : 1));
    char *text = NULL;
    size_t len = 0;
    if (!u) return NULL;
    for (int64_t i = 0; i < n; i++) u[i] = (uint32_t)ids[i];
    pthread_mutex_lock(&s->tok_lock);
    dsc_status st = dsc_tokenizer_decode(s->tok, u, n, true, &text, &len);
    dsc_diag_clear(s->tok_ctx);
    pthread_mutex_unlock(&s->tok_lock);
    free(u);
    if (st != DSC_OK) return NULL;
    if (!final && len >= 3 && memcmp(text + len - 3, "\xef\xbf\xbd", 3) == 0) {
      *pending = true;
      text[len - 3] = 0;
    }
    return text;
  }
  char *t = malloc((size_t)n * 3 + 1); /* a byte becomes at most U+FFFD */
  if (!t) return NULL;
  unsigned char *raw = malloc((size_t)(n ? n : 1));
  if (!raw) return free(t), NULL;
  for (int64_t i = 0; i < n; i++) raw[i] = (unsigned char)(ids[i] & 0xff);
  size_t o = 0;
  for (size_t i = 0; i < (size_t)n;) {
    int k = utf8_seq(raw + i, (size_t)n - i);
    if (k < 0 && !final) {
      *pending = true;
      break;
    }
    if (k <= 0) {
      memcpy(t + o, "\xef\xbf\xbd", 3), o += 3, i++;
    } else {
      memcpy(t + o, raw + i, (size_t)k), o += (size_t)k, i += (size_t)k;
    }
  }
  t[o] = 0;
  free(raw);
  return t;
}

/* The text of a prompt as token ids (malloc'd). */
/* add_special: the tokenizer's own additions (BOS); a chat template writes
 * its special tokens itself, as apply_chat_template's encode leaves them out. */
static dsc_status tokenize(server *s, const char *text, bool add_special, int64_t **ids,
                           int64_t *n) {
  *ids = NULL, *n = 0;
  size_t len = strlen(text);
  if (!s->tok) {
    *ids = malloc(sizeof(int64_t) * (len ? len : 1));
    if (!*ids) return DSC_ERR_INTERNAL;
    for (size_t i = 0; i < len; i++) (*ids)[i] = (unsigned char)text[i];
    *n = (int64_t)len;
    return DSC_OK;
  }
  uint32_t *u = NULL;
  pthread_mutex_lock(&s->tok_lock);
  dsc_status st = dsc_tokenizer_encode(s->tok, text, len, add_special, &u, n);
  dsc_diag_clear(s->tok_ctx); /* the reply says what was wrong */
  pthread_mutex_unlock(&s->tok_lock);
  if (st != DSC_OK) return st;
  *ids = malloc(sizeof(int64_t) * (size_t)(*n ? *n : 1));
  if (*ids)
    for (int64_t i = 0; i < *n; i++) (*ids)[i] = u[i];
  free(u);
  return *ids ? DSC_OK : DSC_ERR_INTERNAL;
}

/* ---------------------------------------------------------------- parsing */

typedef struct {
  int64_t *prompt, n_prompt;
  dsc_request_options o;
  bool max_given;
} parsed;

/* Fields a request may carry; anything else is refused by name. */
static bool known_field(bool chat, const char *k) {
  static const char *const common[] = {"model", "max_tokens", "temperature", "top_p", "top_k",
                                       "seed",  "stop",       "n",           "user",  "stream"};
  for (size_t i = 0; i < sizeof common / sizeof *common; i++)
    if (strcmp(k, common[i]) == 0) return true;
  return chat ? strcmp(k, "messages") == 0 || strcmp(k, "max_completion_tokens") == 0
              : strcmp(k, "prompt") == 0;
}

/* The chat's messages as one prompt: "role: content" lines, then "assistant:". */
static char *chat_prompt(const cJSON *messages, char *why, size_t n) {
  if (!cJSON_IsArray(messages) || cJSON_GetArraySize(messages) == 0) {
    snprintf(why, n, "'messages' must be a non-empty list of {\"role\", \"content\"}");
    return NULL;
  }
  size_t cap = 64, len = 0;
  char *p = malloc(cap);
  if (!p) return snprintf(why, n, "out of memory"), NULL;
  const cJSON *m;
  int i = 0;
  cJSON_ArrayForEach(m, messages) {
    const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
    const char *r = cJSON_IsString(role) ? role->valuestring : NULL;
    if (!r || (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant") &&
               strcmp(r, "developer"))) {
      snprintf(why, n, "messages[%d]: 'role' must be one of system, developer, user, assistant", i);
      free(p);
      return NULL;
    }
    if (!cJSON_IsString(content)) {
      snprintf(why, n, "messages[%d]: 'content' must be a string", i);
      free(p);
      return NULL;
    }
    size_t need = len + strlen(r) + strlen(content->valuestring) + 16;
    if (need > cap) {
      while (cap < need) cap *= 2;
      char *grown = realloc(p, cap);
      if (!grown) return free(p), snprintf(why, n, "out of memory"), NULL;
      p = grown;
    }
    len += (size_t)sprintf(p + len, "%s: %s\n", r, content->valuestring);
    i++;
  }
  char *grown = realloc(p, len + 16);
  if (!grown) return free(p), snprintf(why, n, "out of memory"), NULL;
  strcpy(grown + len, "assistant:");
  return grown;
}

/* The chat through the model's template, with the generation prompt; its
 * errors (raise_exception: "Conversation roles must alternate ...") are the
 * client's. */
static char *templated_prompt(server *s, const cJSON *messages, char *why, size_t n) {
  if (!cJSON_IsArray(messages) || cJSON_GetArraySize(messages) == 0) {
    snprintf(why, n, "'messages' must be a non-empty list of {\"role\", \"content\"}");
    return NULL;
  }
  int i = 0;
  const cJSON *m;
  cJSON_ArrayForEach(m, messages) {
    if (!cJSON_IsObject(m) || !cJSON_IsString(cJSON_GetObjectItemCaseSensitive(m, "role"))) {
      snprintf(why, n, "messages[%d] must be an object with a string 'role'", i);
      return NULL;
    }
    i++;
  }
  char *json = cJSON_PrintUnformatted(messages), *out = NULL;
  if (!json) return snprintf(why, n, "out of memory"), NULL;
  pthread_mutex_lock(&s->tok_lock); /* the template's diagnostics go to the tokenizer's context */
  dsc_status st = dsc_chat_template_render(s->chat, json, true, &out, NULL);
  if (st != DSC_OK) {
    int nd = dsc_diag_count(s->tok_ctx);
    snprintf(why, n, "%s", nd ? dsc_diag_get(s->tok_ctx, nd - 1)->message : "chat template failed");
    dsc_diag_clear(s->tok_ctx);
  }
  pthread_mutex_unlock(&s->tok_lock);
  free(json);
  return out;
}

static bool get_number(const cJSON *j, const char *key, double lo, double hi, double *out,
                       char *why, size_t n) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
  if (!v || cJSON_IsNull(v)) return true;
  if (!cJSON_IsNumber(v) || !(v->valuedouble >= lo && v->valuedouble <= hi)) {
    snprintf(why, n, "'%s' must be a number in [%g, %g]", key, lo, hi);
    return false;
  }
  *out = v->valuedouble;
  return true;
}

static bool get_int(const cJSON *j, const char *key, int64_t lo, int64_t hi, int64_t *out,
                    bool *given, char *why, size_t n) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
  if (!v || cJSON_IsNull(v)) return true;
  double d = cJSON_IsNumber(v) ? v->valuedouble : NAN;
  if (!(d >= (double)lo && d <= (double)hi) || d != floor(d)) {
    snprintf(why, n, "'%s' must be an integer in [%" PRId64 ", %" PRId64 "]", key, lo, hi);
    return false;
  }
  *out = (int64_t)d;
  if (given) *given = true;
  return true;
}

/* The request's JSON into q and p; false: a 400 with why (and the field in *param). */
static bool parse_request(request *q, const cJSON *j, parsed *p, char *why, size_t n,
                          const char **param) {
  server *s = q->s;
  *param = NULL;
  if (!cJSON_IsObject(j)) {
    snprintf(why, n, "the body must be a JSON object");
    return false;
  }
  const cJSON *f;
  cJSON_ArrayForEach(f, j) if (!known_field(q->chat, f->string)) {
    *param = f->string; /* j outlives the reply */
    snprintf(why, n, "unknown field '%s'", f->string);
    return false;
  }
  const cJSON *model = cJSON_GetObjectItemCaseSensitive(j, "model");
  if (model && !cJSON_IsNull(model) &&
      (!cJSON_IsString(model) || strcmp(model->valuestring, s->name) != 0)) {
    *param = "model";
    snprintf(why, n, "the model '%s' is not served here; this server has '%s'",
             cJSON_IsString(model) ? model->valuestring : "?", s->name);
    return false;
  }
  p->o = (dsc_request_options){{1.0, 0, 1.0}, 0, 16};
  int64_t nn = 1, seed = -1;
  const char *bad = NULL;
  if (!get_number(j, "temperature", 0, 2, &p->o.how.temperature, why, n))
    bad = "temperature";
  else if (!get_number(j, "top_p", 1e-9, 1, &p->o.how.top_p, why, n))
    bad = "top_p";
  else if (!get_int(j, "top_k", -1, INT32_MAX, &p->o.how.top_k, NULL, why, n))
    bad = "top_k";
  else if (!get_int(j, "seed", INT64_MIN / 2, INT64_MAX / 2, &seed, NULL, why, n))
    bad = "seed";
  else if (!get_int(j, "n", 1, 1, &nn, NULL, why, n))
    bad = "n";
  else if (!get_int(j, "max_tokens", 1, INT32_MAX, &p->o.max_tokens, &p->max_given, why, n))
    bad = "max_tokens";
  else if (q->chat && !get_int(j, "max_completion_tokens", 1, INT32_MAX, &p->o.max_tokens,
                               &p->max_given, why, n))
    bad = "max_completion_tokens";
  if (bad) return *param = bad, false;
  if (p->o.how.top_k < 0) p->o.how.top_k = 0; /* -1: all, as vLLM */
  p->o.seed =
      seed >= 0 ? (uint64_t)seed : (uint64_t)seed ^ (uint64_t)time(NULL) ^ (uint64_t)q->created;
  const cJSON *stream = cJSON_GetObjectItemCaseSensitive(j, "stream");
  if (stream && !cJSON_IsNull(stream) && !cJSON_IsBool(stream)) {
    *param = "stream";
    snprintf(why, n, "'stream' must be true or false");
    return false;
  }
  q->stream = cJSON_IsTrue(stream);
  const cJSON *user = cJSON_GetObjectItemCaseSensitive(j, "user");
  if (user && !cJSON_IsString(user) && !cJSON_IsNull(user)) {
    *param = "user";
    snprintf(why, n, "'user' must be a string");
    return false;
  }
  const cJSON *stop = cJSON_GetObjectItemCaseSensitive(j, "stop");
  if (stop && !cJSON_IsNull(stop)) {
    const cJSON *one;
    bool ok =
        cJSON_IsString(stop) || (cJSON_IsArray(stop) && cJSON_GetArraySize(stop) <= MAX_STOPS);
    if (cJSON_IsArray(stop))
      cJSON_ArrayForEach(one, stop) ok &= cJSON_IsString(one) && one->valuestring[0];
    if (cJSON_IsString(stop)) ok &= stop->valuestring[0] != 0;
    if (!ok) {
      *param = "stop";
      snprintf(why, n, "'stop' must be a non-empty string or a list of at most %d of them",
               MAX_STOPS);
      return false;
    }
    if (cJSON_IsString(stop)) {
      q->stops[q->n_stops++] = strdup(stop->valuestring);
    } else {
      cJSON_ArrayForEach(one, stop) q->stops[q->n_stops++] = strdup(one->valuestring);
    }
    for (int i = 0; i < q->n_stops; i++) {
      if (!q->stops[i]) return snprintf(why, n, "out of memory"), false;
      size_t l = strlen(q->stops[i]);
      if (l > q->max_stop) q->max_stop = l;
    }
  }
  /* the prompt: a string, one string in a list, or a list of token ids */
  char *text = NULL;
  if (q->chat) {
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(j, "messages");
    if (!(text = s->chat ? templated_prompt(s, msgs, why, n) : chat_prompt(msgs, why, n)))
      return *param = "messages", false;
  } else {
    const cJSON *pr = cJSON_GetObjectItemCaseSensitive(j, "prompt");
    if (cJSON_IsArray(pr) && cJSON_GetArraySize(pr) == 1 && cJSON_IsString(pr->child))
      pr = pr->child;
    if (cJSON_IsString(pr)) {
      text = strdup(pr->valuestring);
      if (!text) return snprintf(why, n, "out of memory"), false;
    } else if (cJSON_IsArray(pr) && cJSON_GetArraySize(pr) > 0 && cJSON_IsNumber(pr->child)) {
      int64_t k = cJSON_GetArraySize(pr), i = 0;
      p->prompt = malloc(sizeof(int64_t) * (size_t)k);
      if (!p->prompt) return snprintf(why, n, "out of memory"), false;
      const cJSON *t;
      cJSON_ArrayForEach(t, pr) {
        if (!cJSON_IsNumber(t) || t->valuedouble != floor(t->valuedouble) || t->valuedouble < 0 ||
            t->valuedouble >= (double)s->vocab) {
          snprintf(why, n, "prompt[%" PRId64 "] is not a token id in [0, %" PRId64 ")", i,
                   s->vocab);
          return *param = "prompt", false;
        }
        p->prompt[i++] = (int64_t)t->valuedouble;
      }
      p->n_prompt = k;
    } else {
      snprintf(why, n, "'prompt' must be a string, a list of one string, or a list of token ids");
      return *param = "prompt", false;
    }
  }
  if (text) {
    dsc_status st = tokenize(s, text, !(q->chat && s->chat), &p->prompt, &p->n_prompt);
    free(text);
    if (st != DSC_OK) {
      snprintf(why, n, "the prompt cannot be tokenized (it must be UTF-8 text)");
      return *param = q->chat ? "messages" : "prompt", false;
    }
  }
  if (!p->max_given && q->chat) p->o.max_tokens = s->context - p->n_prompt; /* as much as fits */
  if (!p->max_given && !q->chat && p->o.max_tokens > s->context - p->n_prompt)
    p->o.max_tokens = s->context - p->n_prompt;
  if (!p->max_given && p->o.max_tokens < 1) p->o.max_tokens = 1; /* then refused by length */
  return true;
}

/* ---------------------------------------------------------------- generation */

/* Is the client still there? A closed connection reads as end of file. */
static bool client_gone(struct MHD_Connection *c) {
  const union MHD_ConnectionInfo *ci =
      MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
  if (!ci) return false;
  struct pollfd pf = {ci->connect_fd, POLLIN | POLLRDHUP, 0};
  if (poll(&pf, 1, 0) <= 0) return false;
  if (pf.revents & (POLLHUP | POLLERR | POLLRDHUP)) return true;
  char byte;
  ssize_t r = recv(ci->connect_fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  return r == 0;
}

static bool has_stop(const request *q, const char *text) {
  for (int i = 0; i < q->n_stops; i++)
    if (strstr(text, q->stops[i])) return true;
  return false;
}

/* The request's text so far (under lock), cut at a stop string; *finish the
 * reason when it ended (NULL: still running). *n_tokens counts the tokens
 * generated, up to the one that completed a stop string: the engine may
 * have drawn more before this thread looked, and how many depends on the
 * timing, not on the request. */
static char *current_text(request *q, const char **finish, bool *pending, int64_t *n_tokens) {
  server *s = q->s;
  int64_t n;
  dsc_finish f;
  const int64_t *ids = dsc_batcher_output(s->b, q->id, &n, &f);
  *n_tokens = n;
  char *text = text_of(s, ids, n, f != DSC_FINISH_NONE, pending);
  *finish = f == DSC_FINISH_NONE ? NULL : f == DSC_FINISH_STOP ? "stop" : "length";
  if (!text || !has_stop(q, text)) return text;
  for (int64_t k = 1; k < n; k++) { /* the fewest tokens whose text holds a stop */
    bool held;
    char *part = text_of(s, ids, k, false, &held);
    bool found = part && has_stop(q, part);
    free(part);
    if (found) {
      *n_tokens = k;
      break;
    }
  }
  for (int i = 0; i < q->n_stops; i++) {
    char *at = strstr(text, q->stops[i]);
    if (at) *at = 0;
  }
  *pending = false;
  *finish = "stop";
  if (f == DSC_FINISH_NONE) dsc_batcher_cancel(s->b, q->id); /* frees its slot now */
  return text;
}

/* Waits (lock held) for the next engine step; false when the client left,
 * the server stops or the engine failed. */
static bool wait_step(request *q) {
  server *s = q->s;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  ts.tv_nsec += 50 * 1000 * 1000;
  if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
  pthread_cond_timedwait(&s->progress, &s->lock, &ts);
  if (s->stopping || s->engine_error[0]) return false;
  if (client_gone(q->conn)) { /* its slot is free for the next step */
    dsc_batcher_release(s->b, q->id);
    q->id = 0;
    s->disconnects++;
    return false;
  }
  return true;
}

static void note_first_token(request *q) {
  server *s = q->s;
  double t = dsc_batcher_first_token_s(s->b, q->id);
  if (t >= 0) s->ttft_sum += t, s->ttft_n++;
}

static cJSON *usage_json(int64_t prompt, int64_t completion) {
  cJSON *u = cJSON_CreateObject();
  cJSON_AddNumberToObject(u, "prompt_tokens", (double)prompt);
  cJSON_AddNumberToObject(u, "completion_tokens", (double)completion);
  cJSON_AddNumberToObject(u, "total_tokens", (double)(prompt + completion));
  return u;
}

/* A response object's common head: id, object, created, model, choices[0]. */
static cJSON *response_head(request *q, const char *object, cJSON **choice) {
  cJSON *j = cJSON_CreateObject();
  cJSON_AddStringToObject(j, "id", q->rid);
  cJSON_AddStringToObject(j, "object", object);
  cJSON_AddNumberToObject(j, "created", (double)q->created);
  cJSON_AddStringToObject(j, "model", q->s->name);
  cJSON *choices = cJSON_AddArrayToObject(j, "choices");
  *choice = cJSON_CreateObject();
  cJSON_AddItemToArray(choices, *choice);
  cJSON_AddNumberToObject(*choice, "index", 0);
  return j;
}

static void add_finish(cJSON *choice, const char *finish) {
  if (finish)
    cJSON_AddStringToObject(choice, "finish_reason", finish);
  else
    cJSON_AddNullToObject(choice, "finish_reason");
}

/* The whole answer once the request ended. */
static enum MHD_Result answer_whole(request *q) {
  server *s = q->s;
  const char *finish = NULL;
  bool pending;
  int64_t n_tok = 0;
  char *text = NULL;
  pthread_mutex_lock(&s->lock);
  for (;;) {
    /* the text only once it ended, unless a stop string may end it first */
    int64_t n;
    dsc_finish f;
    dsc_batcher_output(s->b, q->id, &n, &f);
    if (f != DSC_FINISH_NONE || q->n_stops > 0) {
      free(text);
      text = current_text(q, &finish, &pending, &n_tok);
      if (!text || finish) break;
    }
    if (!wait_step(q)) break;
  }
  note_first_token(q);
  bool failed = s->engine_error[0] || s->stopping || !text || !finish;
  char err[600];
  snprintf(err, sizeof err, "%s", s->engine_error[0] ? s->engine_error : "the server is stopping");
  dsc_batcher_release(s->b, q->id);
  q->id = 0;
  pthread_mutex_unlock(&s->lock);
  if (failed) {
    free(text);
    return client_gone(q->conn) ? MHD_NO : reply_error(q, 503, NULL, NULL, "%s", err);
  }
  cJSON *choice, *j = response_head(q, q->chat ? "chat.completion" : "text_completion", &choice);
  if (q->chat) {
    cJSON *m = cJSON_AddObjectToObject(choice, "message");
    cJSON_AddStringToObject(m, "role", "assistant");
    cJSON_AddStringToObject(m, "content", text);
  } else {
    cJSON_AddStringToObject(choice, "text", text);
  }
  cJSON_AddNullToObject(choice, "logprobs");
  add_finish(choice, finish);
  cJSON_AddItemToObject(j, "usage", usage_json(q->n_prompt, n_tok));
  free(text);
  return reply_json(q->conn, 200, j);
}

/* Appends one server-sent event ("data: ...\n\n") to q's pending bytes. */
static bool push_event(request *q, const char *data) {
  size_t need = q->out_len + strlen(data) + sizeof "data: \n\n";
  char *grown = realloc(q->out, need);
  if (!grown) return false;
  q->out = grown;
  q->out_len += (size_t)sprintf(q->out + q->out_len, "data: %s\n\n", data);
  return true;
}

static bool push_chunk(request *q, const char *delta, bool role, const char *finish, bool last,
                       int64_t n_tok) {
  cJSON *choice,
      *j = response_head(q, q->chat ? "chat.completion.chunk" : "text_completion", &choice);
  if (q->chat) {
    cJSON *d = cJSON_AddObjectToObject(choice, "delta");
    if (role) cJSON_AddStringToObject(d, "role", "assistant");
    if (delta) cJSON_AddStringToObject(d, "content", delta);
  } else {
    cJSON_AddStringToObject(choice, "text", delta ? delta : "");
  }
  cJSON_AddNullToObject(choice, "logprobs");
  add_finish(choice, finish);
  if (last) cJSON_AddItemToObject(j, "usage", usage_json(q->n_prompt, n_tok));
  char *text = cJSON_PrintUnformatted(j);
  cJSON_Delete(j);
  bool ok = text && push_event(q, text);
  free(text);
  return ok;
}

/* The bytes of text that can go out now: all of it once finished, else all
 * but what could still turn into a stop string, cut at a character start. */
static size_t sendable(const request *q, const char *text, bool finished) {
  size_t len = strlen(text);
  if (finished || q->max_stop == 0) return len;
  size_t hold = q->max_stop - 1, end = len > hold ? len - hold : 0;
  while (end > 0 && ((unsigned char)text[end] & 0xc0) == 0x80) end--;
  return end;
}

/* MHD's reader of a streamed answer: waits for new text and hands it out
 * as server-sent events, then "data: [DONE]". */
static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
  (void)pos;
  request *q = cls;
  server *s = q->s;
  pthread_mutex_lock(&s->lock);
  while (q->out_pos == q->out_len) {
    q->out_len = q->out_pos = 0;
    if (q->done_sent) {
      pthread_mutex_unlock(&s->lock);
      return MHD_CONTENT_READER_END_OF_STREAM;
    }
    const char *finish = NULL;
    bool pending;
    int64_t n_tok;
    char *text = current_text(q, &finish, &pending, &n_tok);
    if (!text) break;
    size_t upto = sendable(q, text, finish != NULL);
    bool ok = true;
    if (q->chat && !q->role_sent) ok = push_chunk(q, "", true, NULL, false, 0), q->role_sent = true;
    if (ok && upto > q->sent) {
      char save = text[upto];
      text[upto] = 0;
      ok = push_chunk(q, text + q->sent, false, NULL, false, 0);
      text[upto] = save;
      q->sent = upto;
    }
    free(text);
    if (ok && finish) {
      note_first_token(q);
      ok = push_chunk(q, NULL, false, finish, true, n_tok) && push_event(q, "[DONE]");
      q->done_sent = true;
      dsc_batcher_release(s->b, q->id);
      q->id = 0;
    }
    if (!ok) break;
    if (q->out_len == 0 && !wait_step(q)) break;
  }
  if (q->out_pos == q->out_len) { /* the client left, the server stops, or no memory */
    if (q->id) dsc_batcher_cancel(s->b, q->id);
    pthread_mutex_unlock(&s->lock);
    return MHD_CONTENT_READER_END_WITH_ERROR;
  }
  size_t k = q->out_len - q->out_pos < max ? q->out_len - q->out_pos : max;
  memcpy(buf, q->out + q->out_pos, k);
  q->out_pos += k;
  pthread_mutex_unlock(&s->lock);
  return (ssize_t)k;
}

static enum MHD_Result answer_stream(request *q) {
  struct MHD_Response *r =
      MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_reader, q, NULL);
  if (!r) return MHD_NO;
  MHD_add_response_header(r, "Content-Type", "text/event-stream");
  MHD_add_response_header(r, "Cache-Control", "no-cache");
  enum MHD_Result ok = MHD_queue_response(q->conn, 200, r);
  MHD_destroy_response(r);
  return ok;
}

static enum MHD_Result generate(request *q) {
  server *s = q->s;
  char why[1024];
  const char *param = NULL;
  cJSON *j = cJSON_ParseWithLength(q->body ? q->body : "", q->len);
  if (!j) return reply_error(q, 400, NULL, NULL, "the body is not valid JSON");
  parsed p = {0};
  q->created = (long)time(NULL);
  bool ok = parse_request(q, j, &p, why, sizeof why, &param);
  if (!ok) {
    free(p.prompt);
    enum MHD_Result r = reply_error(q, 400, param, NULL, "%s", why);
    cJSON_Delete(j);
    return r;
  }
  cJSON_Delete(j);
  q->n_prompt = p.n_prompt;
  pthread_mutex_lock(&s->lock);
  dsc_batcher_stats st;
  dsc_batcher_get_stats(s->b, &st);
  dsc_status rc = DSC_OK;
  if (s->stopping || s->engine_error[0]) {
    snprintf(why, sizeof why, "%s",
             s->engine_error[0] ? s->engine_error : "the server is stopping");
    rc = DSC_ERR_INTERRUPTED;
  } else if (st.queued >= s->max_queue) {
    snprintf(why, sizeof why,
             "the server is busy: %" PRId64 " requests wait for a slot; retry later", st.queued);
    rc = DSC_ERR_INTERRUPTED;
  } else {
    rc = dsc_batcher_submit(s->b, p.prompt, p.n_prompt, &p.o, &q->id, why, sizeof why);
  }
  if (rc == DSC_OK) {
    s->requests[q->chat]++;
    snprintf(q->rid, sizeof q->rid, "%s-%" PRId64, q->chat ? "chatcmpl" : "cmpl", ++s->next_id);
    pthread_cond_signal(&s->work);
  }
  pthread_mutex_unlock(&s->lock);
  free(p.prompt);
  if (rc == DSC_ERR_USER) {
    bool too_long = p.n_prompt > 0 && p.n_prompt + p.o.max_tokens > s->context;
    return reply_error(q, 400, too_long ? "max_tokens" : NULL,
                       too_long ? "context_length_exceeded" : NULL, "%s", why);
  }
  if (rc != DSC_OK) return reply_error(q, 503, NULL, NULL, "%s", why);
  return q->stream ? answer_stream(q) : answer_whole(q);
}

/* ---------------------------------------------------------------- routes */

static enum MHD_Result models(request *q) {
  cJSON *j = cJSON_CreateObject(), *data = cJSON_AddArrayToObject(j, "data"),
        *m = cJSON_CreateObject();
  cJSON_AddStringToObject(j, "object", "list");
  cJSON_AddStringToObject(m, "id", q->s->name);
  cJSON_AddStringToObject(m, "object", "model");
  cJSON_AddNumberToObject(m, "created", 0);
  cJSON_AddStringToObject(m, "owned_by", "dsc");
  cJSON_AddNumberToObject(m, "max_model_len", (double)q->s->context);
  cJSON_AddItemToArray(data, m);
  return reply_json(q->conn, 200, j);
}

static enum MHD_Result metrics(request *q) {
  server *s = q->s;
  pthread_mutex_lock(&s->lock);
  dsc_batcher_stats st;
  dsc_batcher_get_stats(s->b, &st);
  double rate = 0;
  if (s->rate_n > 1) { /* over the samples of the last 10 s */
    int64_t last = (s->rate_n - 1) % RATE_SAMPLES,
            first = s->rate_n > RATE_SAMPLES ? s->rate_n - RATE_SAMPLES : 0;
    double tnow = now_s();
    for (int64_t i = first; i < s->rate_n - 1; i++) {
      int64_t k = i % RATE_SAMPLES;
      if (tnow - s->rate_t[k] > 10) continue;
      double dt = s->rate_t[last] - s->rate_t[k];
      if (dt > 0) rate = (double)(s->rate_gen[last] - s->rate_gen[k]) / dt;
      break;
    }
    if (tnow - s->rate_t[last] > 10) rate = 0;
  }
  char *text = malloc(4096);
  if (text)
    snprintf(
        text, 4096,
        "# HELP dsc_requests_total Requests accepted, by endpoint.\n"
        "# TYPE dsc_requests_total counter\n"
        "dsc_requests_total{endpoint=\"completions\"} %" PRId64
        "\n"
        "dsc_requests_total{endpoint=\"chat_completions\"} %" PRId64
        "\n"
        "# HELP dsc_request_errors_total Requests answered with an error, by class.\n"
        "# TYPE dsc_request_errors_total counter\n"
        "dsc_request_errors_total{class=\"4xx\"} %" PRId64
        "\n"
        "dsc_request_errors_total{class=\"5xx\"} %" PRId64
        "\n"
        "# HELP dsc_client_disconnects_total Requests cancelled because their client left.\n"
        "# TYPE dsc_client_disconnects_total counter\n"
        "dsc_client_disconnects_total %" PRId64
        "\n"
        "# HELP dsc_requests_running Requests holding a cache slot.\n"
        "# TYPE dsc_requests_running gauge\n"
        "dsc_requests_running %" PRId64
        "\n"
        "# HELP dsc_requests_queued Requests waiting for a slot.\n"
        "# TYPE dsc_requests_queued gauge\n"
        "dsc_requests_queued %" PRId64
        "\n"
        "# HELP dsc_prompt_tokens_total Prompt tokens of accepted requests.\n"
        "# TYPE dsc_prompt_tokens_total counter\n"
        "dsc_prompt_tokens_total %" PRId64
        "\n"
        "# HELP dsc_generation_tokens_total Tokens generated.\n"
        "# TYPE dsc_generation_tokens_total counter\n"
        "dsc_generation_tokens_total %" PRId64
        "\n"
        "# HELP dsc_generation_tokens_per_second Tokens generated per second over the last 10 s.\n"
        "# TYPE dsc_generation_tokens_per_second gauge\n"
        "dsc_generation_tokens_per_second %.3f\n"
        "# HELP dsc_engine_steps_total Engine steps run.\n"
        "# TYPE dsc_engine_steps_total counter\n"
        "dsc_engine_steps_total %" PRId64
        "\n"
        "# HELP dsc_cache_slots Sequences the KV cache holds, and those in use.\n"
        "# TYPE dsc_cache_slots gauge\n"
        "dsc_cache_slots{state=\"total\"} %" PRId64
        "\n"
        "dsc_cache_slots{state=\"used\"} %" PRId64
        "\n"
        "# HELP dsc_cache_positions Token positions the KV cache holds, and those in use.\n"
        "# TYPE dsc_cache_positions gauge\n"
        "dsc_cache_positions{state=\"total\"} %" PRId64
        "\n"
        "dsc_cache_positions{state=\"used\"} %" PRId64
        "\n"
        "# HELP dsc_cache_blocks Blocks of the KV cache's pool, and those the sequences hold.\n"
        "# TYPE dsc_cache_blocks gauge\n"
        "dsc_cache_blocks{state=\"total\"} %" PRId64
        "\n"
        "dsc_cache_blocks{state=\"used\"} %" PRId64
        "\n"
        "# HELP dsc_preemptions_total Sequences sent back to the queue to free cache blocks.\n"
        "# TYPE dsc_preemptions_total counter\n"
        "dsc_preemptions_total %" PRId64
        "\n"
        "# HELP dsc_time_to_first_token_seconds From a request's arrival to its first token.\n"
        "# TYPE dsc_time_to_first_token_seconds summary\n"
        "dsc_time_to_first_token_seconds_sum %.6f\n"
        "dsc_time_to_first_token_seconds_count %" PRId64 "\n",
        s->requests[0], s->requests[1], s->errors_4xx, s->errors_5xx, s->disconnects, st.running,
        st.queued, st.prompt_tokens, st.generated_tokens, rate, st.steps, st.slots, st.running,
        st.positions, st.positions_used, st.blocks, st.blocks_used, st.preempted, s->ttft_sum,
        s->ttft_n);
  pthread_mutex_unlock(&s->lock);
  if (!text) return MHD_NO;
  return reply(q->conn, 200, "text/plain; version=0.0.4", text);
}

static enum MHD_Result route(request *q, const char *method, const char *url) {
  bool get = strcmp(method, "GET") == 0, post = strcmp(method, "POST") == 0;
  struct {
    const char *url;
    bool post;
  } const routes[] = {{"/health", false},
                      {"/metrics", false},
                      {"/v1/models", false},
                      {"/v1/completions", true},
                      {"/v1/chat/completions", true}};
  for (size_t i = 0; i < sizeof routes / sizeof *routes; i++) {
    if (strcmp(url, routes[i].url) != 0) continue;
    if (routes[i].post ? !post : !get)
      return reply_error(q, 405, NULL, NULL, "%s takes %s, not %s", url,
                         routes[i].post ? "POST" : "GET", method);
    if (q->too_big) return reply_error(q, 413, NULL, NULL, "the body is over %d bytes", MAX_BODY);
    switch (i) {
      case 0: {
        char *ok = strdup("{\"status\":\"ok\"}");
        return ok ? reply(q->conn, 200, "application/json", ok) : MHD_NO;
      }
      case 1:
        return metrics(q);
      case 2:
        return models(q);
      default:
        q->chat = i == 4;
        return generate(q);
    }
  }
  return reply_error(q, 404, NULL, NULL, "no such endpoint: %s %s", method, url);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload,
                                  size_t *upload_size, void **con_cls) {
  (void)version;
  request *q = *con_cls;
  if (!q) { /* the headers: the body comes in the next calls */
    if (!(q = calloc(1, sizeof *q))) return MHD_NO;
    q->s = cls, q->conn = conn;
    *con_cls = q;
    return MHD_YES;
  }
  if (*upload_size) {
    if (q->len + *upload_size > MAX_BODY) {
      q->too_big = true;
    } else if (!q->too_big) {
      char *grown = realloc(q->body, q->len + *upload_size + 1);
      if (!grown) return MHD_NO;
      q->body = grown;
      memcpy(q->body + q->len, upload, *upload_size);
      q->len += *upload_size;
      q->body[q->len] = 0;
    }
    *upload_size = 0;
    return MHD_YES;
  }
  return route(q, method, url);
}

/* The request ended (answered, or the connection dropped): its batcher
 * entry, if any, goes. */
static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode why) {
  (void)conn;
  server *s = cls;
  request *q = *con_cls;
  if (!q) return;
  pthread_mutex_lock(&s->lock);
  if (q->id) {
    if (why != MHD_REQUEST_TERMINATED_COMPLETED_OK) s->disconnects++;
    dsc_batcher_release(s->b, q->id);
  }
  pthread_mutex_unlock(&s->lock);
  for (int i = 0; i < q->n_stops; i++) free(q->stops[i]);
  free(q->out);
  free(q->body);
  free(q);
  *con_cls = NULL;
}

/* ---------------------------------------------------------------- engine */

/* Runs steps while there is work, until a signal. */
static dsc_status engine_loop(server *s) {
  dsc_status st = DSC_OK;
  pthread_mutex_lock(&s->lock);
  while (!cli_signal) {
    if (dsc_batcher_idle(s->b)) {
      struct timespec ts;
      clock_gettime(CLOCK_REALTIME, &ts);
      ts.tv_nsec += 200 * 1000 * 1000;
      if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
      pthread_cond_timedwait(&s->work, &s->lock, &ts);
      continue;
    }
    if (!dsc_batcher_step_begin(s->b)) continue;
    pthread_mutex_unlock(&s->lock); /* the connections come in while it runs */
    st = dsc_batcher_step_run(s->b);
    pthread_mutex_lock(&s->lock);
    if (st == DSC_OK) dsc_batcher_step_end(s->b);
    if (st == DSC_ERR_INTERRUPTED) break;
    if (st != DSC_OK) { /* a broken engine: every request gets the reason */
      const dsc_diag *d =
          dsc_diag_count(s->ctx) ? dsc_diag_get(s->ctx, dsc_diag_count(s->ctx) - 1) : NULL;
      snprintf(s->engine_error, sizeof s->engine_error, "the engine failed: %s",
               d ? d->message : "an internal error");
      fprintf(stderr, "dsc serve: %s\n", s->engine_error);
      pthread_cond_broadcast(&s->progress);
      break;
    }
    dsc_batcher_stats bs;
    dsc_batcher_get_stats(s->b, &bs);
    int64_t k = s->rate_n++ % RATE_SAMPLES;
    s->rate_t[k] = now_s(), s->rate_gen[k] = bs.generated_tokens;
    pthread_cond_broadcast(&s->progress);
  }
  s->stopping = true;
  pthread_cond_broadcast(&s->progress);
  pthread_mutex_unlock(&s->lock);
  return st;
}

int cli_serve(int argc, char **argv) {
  dsc_infer_options io = {0};
  dsc_exec_options xo = {dsc_backend_default(), 0, NULL};
  int64_t threads = 0, port = 8000, queue = 256;
  const char *host = "127.0.0.1", *tok_path = NULL, *name = NULL, *chat_path = NULL;
  io.slots = 8;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    bool has_val = i + 1 < argc;
    int64_t *num = NULL;
    int64_t lo = 1, hi = 0;
    const char *what = NULL;
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      fputs(serve_help, stdout);
      return CLI_EXIT_OK;
    } else if (strcmp(a, "--port") == 0) {
      num = &port, lo = 0, hi = 65535, what = "--port needs a port number (0..65535)";
    } else if (strcmp(a, "--slots") == 0) {
      num = &io.slots, hi = 1024, what = "--slots needs an integer in 1..1024";
    } else if (strcmp(a, "--chunk") == 0) {
      num = &io.chunk, hi = 4096, what = "--chunk needs an integer in 1..4096";
    } else if (strcmp(a, "--context") == 0) {
      num = &io.context, hi = 1 << 24, what = "--context needs a positive integer";
    } else if (strcmp(a, "--cache-tokens") == 0) {
      num = &io.cache_tokens, hi = INT32_MAX, what = "--cache-tokens needs a positive integer";
    } else if (strcmp(a, "--block-size") == 0) {
      num = &io.block, hi = 1 << 16, what = "--block-size needs an integer in 1..65536";
    } else if (strcmp(a, "--queue") == 0) {
      num = &queue, lo = 0, hi = 1 << 20, what = "--queue needs a non-negative integer";
    } else if (strcmp(a, "--threads") == 0) {
      num = &threads, hi = 1024, what = "--threads needs a positive integer";
    } else if (strcmp(a, "--host") == 0 || strcmp(a, "--name") == 0 || strcmp(a, "--model") == 0 ||
               strcmp(a, "--tokenizer") == 0) {
      if (!has_val) return cli_usage_error("serve", "%s needs a value", a), CLI_EXIT_USER;
      const char *v = argv[++i];
      if (a[2] == 'h')
        host = v;
      else if (a[2] == 'n')
        name = v;
      else if (a[2] == 'm')
        io.model_path = v;
      else
        tok_path = v;
    } else if (strcmp(a, "--chat-template") == 0) {
      if (!has_val) return cli_usage_error("serve", "%s needs a file or 'none'", a), CLI_EXIT_USER;
      chat_path = argv[++i];
    } else if (strcmp(a, "--backend") == 0) {
      if (!has_val || dsc_backend_from_name(argv[++i], &xo.backend) != 0)
        return cli_usage_error("serve", "--backend needs one of interp, cpu, cuda"), CLI_EXIT_USER;
    } else if (a[0] == '-' && a[1]) {
      return cli_usage_error("serve", "unknown option '%s'", a), CLI_EXIT_USER;
    } else if (io.checkpoint) {
      return cli_usage_error("serve", "one checkpoint at a time"), CLI_EXIT_USER;
    } else {
      io.checkpoint = a;
    }
    if (num && (!has_val || !cli_parse_i64(argv[++i], num) || *num < lo || *num > hi))
      return cli_usage_error("serve", "%s", what), CLI_EXIT_USER;
  }
  if (!io.checkpoint) return cli_usage_error("serve", "missing checkpoint DIR"), CLI_EXIT_USER;
  struct sockaddr_in addr;
  memset(&addr, 0, sizeof addr);
  addr.sin_family = AF_INET;
  addr.sin_port = htons((uint16_t)port);
  if (inet_pton(AF_INET, host, &addr.sin_addr) != 1)
    return cli_usage_error("serve", "--host needs an IPv4 address such as 127.0.0.1, not '%s'",
                           host),
           CLI_EXIT_USER;
  xo.threads = (int)threads;
  io.exec = &xo;

  server *s = &g_server;
  memset(s, 0, sizeof *s);
  pthread_mutex_init(&s->lock, NULL);
  pthread_mutex_init(&s->tok_lock, NULL);
  pthread_cond_init(&s->work, NULL);
  pthread_cond_init(&s->progress, NULL);
  s->max_queue = queue;
  dsc_context *ctx = s->ctx = dsc_context_new(NULL, NULL);
  if (!ctx) return fputs("dsc: out of memory\n", stderr), CLI_EXIT_INTERNAL;
  cli_show_progress(ctx);
  cli_catch_signals(ctx);
  char found[4096];
  if (!tok_path) tok_path = cli_run_tokenizer(io.checkpoint, found, sizeof found);
  s->tok_ctx = dsc_context_new(NULL, NULL);
  dsc_status st = !s->tok_ctx ? DSC_ERR_INTERNAL
                  : tok_path  ? dsc_tokenizer_load(s->tok_ctx, tok_path, &s->tok)
                              : DSC_OK;
  /* The chat template: --chat-template, else tokenizer_config.json beside
   * the tokenizer when it has one. */
  char cfg[4096 + 32];
  bool chat_given = chat_path && strcmp(chat_path, "none") != 0;
  if (st == DSC_OK && !chat_path && tok_path) {
    const char *slash = strrchr(tok_path, '/');
    snprintf(cfg, sizeof cfg, "%.*stokenizer_config.json", slash ? (int)(slash - tok_path + 1) : 0,
             tok_path);
    if (access(cfg, R_OK) == 0) chat_path = cfg;
  }
  if (st == DSC_OK && chat_path && strcmp(chat_path, "none") != 0) {
    st = dsc_chat_template_load(s->tok_ctx, chat_path, &s->chat);
    if (st != DSC_OK && !chat_given && dsc_diag_count(s->tok_ctx) > 0 &&
        strstr(dsc_diag_get(s->tok_ctx, 0)->message, "no chat_template")) {
      dsc_diag_clear(s->tok_ctx); /* a config without a template: the plain lines */
      st = DSC_OK;
    } else if (st != DSC_OK) {
      fprintf(stderr,
              "dsc serve: the chat template of %s cannot be used; --chat-template none "
              "serves chats as plain role lines\n",
              chat_path);
    }
  }
  dsc_diag_print(s->tok_ctx, stderr);
  dsc_diag_clear(s->tok_ctx);
  if (st == DSC_OK)
    fprintf(stderr, "dsc serve: chat: %s%s\n", s->chat ? "the chat template of " : "",
            s->chat ? chat_path : "'role: content' lines (no chat template)");
  if (st == DSC_OK) st = dsc_infer_open(ctx, &io, &s->engine);
  if (st == DSC_OK) { /* the graphs' first runs before the first request's */
    double t0 = now_s();
    int graphs = 0;
    st = dsc_infer_warm_up(s->engine, &graphs);
    if (st == DSC_OK)
      fprintf(stderr, "dsc serve: warmed up %d graphs in %.2f s\n", graphs, now_s() - t0);
  }
  if (st == DSC_OK) st = dsc_batcher_new(ctx, s->engine, &s->b);
  struct MHD_Daemon *d = NULL;
  if (st == DSC_OK) {
    s->vocab = dsc_infer_vocab(s->engine);
    s->context = dsc_infer_context(s->engine);
    if (s->tok)
      for (int64_t t = 0; t < s->vocab; t++)
        if (dsc_tokenizer_is_special(s->tok, t)) dsc_batcher_set_stop(s->b, t, true);
    if (name) {
      snprintf(s->name, sizeof s->name, "%s", name);
    } else { /* the checkpoint directory's name */
      char dir[4096];
      snprintf(dir, sizeof dir, "%s", io.checkpoint);
      size_t l = strlen(dir);
      while (l > 1 && dir[l - 1] == '/') dir[--l] = 0;
      const char *base = strrchr(dir, '/');
      snprintf(s->name, sizeof s->name, "%s", base ? base + 1 : dir);
    }
    dsc_diag_print(ctx, stderr); /* warnings of the open (no KV cache, ...) */
    dsc_diag_clear(ctx);
    unsigned limit = (unsigned)(queue + io.slots + 64);
    d = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
                             MHD_USE_POLL | MHD_USE_ERROR_LOG,
                         (uint16_t)port, NULL, NULL, on_request, s, MHD_OPTION_SOCK_ADDR, &addr,
                         MHD_OPTION_CONNECTION_LIMIT, limit, MHD_OPTION_CONNECTION_TIMEOUT,
                         (unsigned)600, MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
                         MHD_OPTION_END);
    if (!d) {
      fprintf(stderr, "dsc: error: cannot listen on %s:%" PRId64 " (%s)\n", host, port,
              errno ? strerror(errno) : "the port is taken, or the address is not this machine's");
      st = DSC_ERR_USER;
    }
  }
  if (st == DSC_OK) {
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    int64_t block, blocks, free_blocks;
    dsc_infer_cache(s->engine, &block, &blocks, &free_blocks);
    fprintf(stderr,
            "dsc serve: listening on http://%s:%u (model '%s', %" PRId64 " slots, context %" PRId64
            ", chunk %" PRId64 ", cache %" PRId64 " positions in blocks of %" PRId64 ")\n",
            host, di ? (unsigned)di->port : (unsigned)port, s->name, dsc_infer_slots(s->engine),
            s->context, dsc_infer_chunk(s->engine), blocks * block, block);
    fflush(stderr);
    st = engine_loop(s);
    if (st == DSC_ERR_INTERRUPTED) st = DSC_OK; /* asked to stop: a clean exit */
    fprintf(stderr, "dsc serve: stopping (%s)\n", cli_signal ? "signal" : "engine error");
  }
  if (d) MHD_stop_daemon(d); /* joins the connection threads: they see `stopping` */
  dsc_diag_print(ctx, stderr);
  dsc_batcher_free(s->b);
  dsc_infer_free(s->engine);
  dsc_tokenizer_free(s->tok);
  dsc_chat_template_free(s->chat);
  dsc_context_free(s->tok_ctx);
  dsc_context_free(ctx);
  pthread_cond_destroy(&s->work);
  pthread_cond_destroy(&s->progress);
  pthread_mutex_destroy(&s->lock);
  pthread_mutex_destroy(&s->tok_lock);
  if (st == DSC_OK && cli_signal) return CLI_EXIT_OK;
  return cli_exit_code(st);
}
#endif
