/* dsc plot: a training run's curves (RUN_DIR/metrics.jsonl, one JSON object
 * per step as driver/train.c writes it) as one self-contained SVG file:
 * train and validation loss against step on the left axis, the learning rate
 * on the right one. */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "runtime/runtime.h"
#include "tools/cli.h"

static const char plot_help[] =
    "usage: dsc plot RUN_DIR -o FILE.svg [--title TEXT]\n"
    "\n"
    "Draws the curves of a training run (RUN_DIR/metrics.jsonl, written by\n"
    "'dsc train --out RUN_DIR'; RUN_DIR may also be a JSON-lines file itself, such\n"
    "as one from 'dsc train --log') as an SVG image: train loss and validation loss\n"
    "against step (left axis), the learning rate (right axis). Values that are not\n"
    "finite (null in the file: a diverged step) are left out, with a note.\n"
    "  -o FILE        the SVG to write (atomically: a temporary file, then renamed)\n"
    "  --title TEXT   the title (default: the run directory)\n";

/* ------------------------------------------------------------ the metrics */

typedef struct {
  double step, loss, lr, val; /* NAN: absent or null */
  unsigned nulls;             /* bit k: the k-th of loss, lr, val was null */
} plot_row;
enum { NULL_LOSS = 1, NULL_LR = 2, NULL_VAL = 4 };

typedef struct {
  plot_row *rows;
  int n, cap;
  int non_finite; /* values that were null (dsc writes a non-finite number so) */
} plot_data;

/* One flat JSON object (what write_line in driver/train.c writes: numbers,
 * null, true/false, strings). Fills the keys dsc plot uses; returns NULL on
 * success or what is wrong with the line. */
static const char *skip_ws(const char *p) {
  while (*p == ' ' || *p == '\t' || *p == '\r') p++;
  return p;
}

static const char *parse_string(const char *p, char *key, size_t cap, const char **err) {
  size_t n = 0;
  for (p++; *p != '"'; p++) {
    if (!*p) return *err = "unterminated string", NULL;
    if (*p == '\\') {
      if (!*++p) return *err = "unterminated string", NULL;
    }
    if (n + 1 < cap) key[n++] = *p;
  }
  key[n] = 0;
  return p + 1;
}

static const char *parse_line(const char *p, plot_row *r, bool *has_step, bool *has_loss,
                              int *nulls) {
  const char *err = NULL;
  *r = (plot_row){NAN, NAN, NAN, NAN, 0};
  *has_step = *has_loss = false;
  p = skip_ws(p);
  if (*p != '{') return "not a JSON object";
  p = skip_ws(p + 1);
  if (*p == '}') return "an empty object (no \"step\")";
  for (;;) {
    char key[64];
    if (*p != '"') return "expected a quoted key";
    if (!(p = parse_string(p, key, sizeof key, &err))) return err;
    p = skip_ws(p);
    if (*p != ':') return "expected ':' after a key";
    p = skip_ws(p + 1);
    double v = NAN;
    bool is_num = false, is_null = false;
    if (*p == '"') {
      char ignored[8];
      if (!(p = parse_string(p, ignored, sizeof ignored, &err))) return err;
    } else if (strncmp(p, "null", 4) == 0) {
      p += 4, is_null = true;
    } else if (strncmp(p, "true", 4) == 0) {
      p += 4;
    } else if (strncmp(p, "false", 5) == 0) {
      p += 5;
    } else if (*p == '-' || isdigit((unsigned char)*p)) {
      char *end;
      errno = 0;
      v = strtod(p, &end);
      if (end == p || !isfinite(v)) return "a bad number";
      p = end, is_num = true;
    } else {
      return "expected a number, null, true, false or a string";
    }
    double *slot = strcmp(key, "step") == 0       ? &r->step
                   : strcmp(key, "loss") == 0     ? &r->loss
                   : strcmp(key, "lr") == 0       ? &r->lr
                   : strcmp(key, "val_loss") == 0 ? &r->val
                                                  : NULL;
    if (slot) {
      if (!is_num && !is_null) return "a value that is not a number";
      if (slot == &r->step && !is_num) return "\"step\" is not a number";
      *slot = v;
      if (slot == &r->step) *has_step = true;
      if (slot == &r->loss) *has_loss = true;
      if (is_null) {
        ++*nulls;
        r->nulls |= slot == &r->loss ? NULL_LOSS : slot == &r->lr ? NULL_LR : NULL_VAL;
      }
    }
    p = skip_ws(p);
    if (*p == '}') break;
    if (*p != ',') return "expected ',' or '}'";
    p = skip_ws(p + 1);
  }
  if (*skip_ws(p + 1)) return "text after the object";
  if (!*has_step) return "no \"step\"";
  if (!*has_loss) return "no \"loss\"";
  return NULL;
}

/* Reads the metrics file; false with the error printed (path:line). */
static bool read_metrics(const char *path, plot_data *d) {
  size_t len;
  char *text = cli_read_file(path, &len);
  if (!text) return false;
  if (memchr(text, 0, len)) {
    fprintf(stderr, "%s: error: a binary file, not JSON lines\n", path);
    free(text);
    return false;
  }
  int line = 0;
  bool ok = true;
  for (char *p = text; ok && *p;) {
    char *nl = strchr(p, '\n');
    if (nl) *nl = 0;
    line++;
    if (*skip_ws(p)) {
      plot_row r;
      bool has_step, has_loss;
      const char *err = parse_line(p, &r, &has_step, &has_loss, &d->non_finite);
      if (err) {
        fprintf(stderr, "%s:%d: error: %s (a metrics line is {\"step\":N,\"loss\":X,...})\n",
                path, line, err);
        ok = false;
        break;
      }
      if (d->n == d->cap) {
        int cap = d->cap ? d->cap * 2 : 256;
        plot_row *nr = realloc(d->rows, (size_t)cap * sizeof *nr);
        if (!nr) {
          fprintf(stderr, "dsc plot: out of memory\n");
          ok = false;
          break;
        }
        d->rows = nr, d->cap = cap;
      }
      d->rows[d->n++] = r;
    }
    if (!nl) break;
    p = nl + 1;
  }
  free(text);
  if (ok && d->n == 0) {
    fprintf(stderr, "%s: error: no metrics in the file (empty: did the run train a step?)\n", path);
    ok = false;
  }
  return ok;
}

/* ------------------------------------------------------------- the SVG */

typedef struct {
  char *p;
  size_t n, cap;
  bool oom;
} plot_buf;

__attribute__((format(printf, 2, 3))) static void out(plot_buf *b, const char *fmt, ...) {
  if (b->oom) return;
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(b->p + b->n, b->cap - b->n, fmt, ap);
    va_end(ap);
    if (k < 0) {
      b->oom = true;
      return;
    }
    if ((size_t)k < b->cap - b->n) {
      b->n += (size_t)k;
      return;
    }
    size_t cap = (b->cap + (size_t)k + 1) * 2;
    char *np = realloc(b->p, cap);
    if (!np) {
      b->oom = true;
      return;
    }
    b->p = np, b->cap = cap;
  }
}

/* XML text: the five characters escaped, control bytes dropped. */
static void out_text(plot_buf *b, const char *s) {
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '&') out(b, "&amp;");
    else if (c == '<') out(b, "&lt;");
    else if (c == '>') out(b, "&gt;");
    else if (c == '"') out(b, "&quot;");
    else if (c == '\'') out(b, "&apos;");
    else if (c >= 0x20 || c == '\t') out(b, "%c", c);
  }
}

/* An axis: [lo, hi] widened to whole multiples of a 1-2-5 tick step. */
typedef struct {
  double lo, hi, step;
} plot_axis;

static plot_axis nice_axis(double lo, double hi, int ticks, bool integer) {
  if (!(hi > lo)) {
    double pad = lo != 0 ? fabs(lo) * 0.1 : 1;
    lo -= pad, hi += pad;
  }
  double rough = (hi - lo) / ticks, mag = pow(10, floor(log10(rough))), f = rough / mag;
  double step = (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) * mag;
  if (integer && step < 1) step = 1;
  plot_axis a = {floor(lo / step + 1e-9) * step, ceil(hi / step - 1e-9) * step, step};
  if (a.hi <= a.lo) a.hi = a.lo + step;
  return a;
}

static bool ends_with_zero_decimal(const char *m) {
  size_t k = strlen(m);
  return k >= 2 && m[k - 2] == '.' && m[k - 1] == '0';
}

/* A tick label with as many decimals as the tick step needs. */
static void tick_label(char *s, size_t n, double v, double step) {
  if (fabs(v) < step * 1e-6) v = 0;
  if (step >= 1) {
    snprintf(s, n, "%.0f", v);
  } else if (step >= 1e-4) {
    int dec = (int)ceil(-log10(step) - 1e-9);
    snprintf(s, n, "%.*f", dec, v);
  } else if (v == 0) {
    snprintf(s, n, "0");
  } else {
    /* 3.5e-4 rather than 3.5e-04 */
    char m[32];
    snprintf(m, sizeof m, "%.1e", v);
    char *e = strchr(m, 'e');
    if (!e) {
      snprintf(s, n, "%s", m);
      return;
    }
    int ex = atoi(e + 1);
    *e = 0;
    if (ends_with_zero_decimal(m)) m[strlen(m) - 2] = 0;
    snprintf(s, n, "%se%d", m, ex);
  }
}

enum { W = 880, H = 520, ML = 78, MR = 86, MT = 64, MB = 62 };
#define PW (W - ML - MR)
#define PH (H - MT - MB)

static double px(const plot_axis *x, double v) { return ML + (v - x->lo) / (x->hi - x->lo) * PW; }
static double py(const plot_axis *y, double v) {
  return MT + PH - (v - y->lo) / (y->hi - y->lo) * PH;
}

static const char *C_TRAIN = "#1f77b4", *C_VAL = "#e8590c", *C_LR = "#2b8a3e";

/* One series as a path in step order as in the file: a value left out (not
 * finite) breaks the line there, so a gap is seen as one. Returns how many
 * points it has. */
static int series(plot_buf *b, const plot_data *d, size_t off, unsigned null_bit,
                  const plot_axis *x, const plot_axis *y, const char *id, const char *color,
                  const char *extra) {
  int n = 0;
  bool pen_down = false;
  out(b, "<path id=\"%s\" fill=\"none\" stroke=\"%s\" %s d=\"", id, color, extra);
  for (int i = 0; i < d->n; i++) {
    double v = *(const double *)((const char *)&d->rows[i] + off);
    if (!isfinite(v)) {
      if (d->rows[i].nulls & null_bit) pen_down = false; /* absent (no evaluation): no gap */
      continue;
    }
    out(b, "%s%s%.2f,%.2f", n ? " " : "", pen_down ? "L" : "M", px(x, d->rows[i].step), py(y, v));
    pen_down = true;
    n++;
  }
  out(b, "\"/>\n");
  return n;
}

static void render(plot_buf *b, const plot_data *d, const char *title, int *n_train, int *n_val,
                   int *n_lr) {
  double s_lo = INFINITY, s_hi = -INFINITY, l_lo = INFINITY, l_hi = -INFINITY, r_hi = 0,
         r_lo = 0;
  double best_val = INFINITY, best_step = 0, last_loss = NAN;
  bool any_lr = false;
  for (int i = 0; i < d->n; i++) {
    const plot_row *r = &d->rows[i];
    s_lo = fmin(s_lo, r->step), s_hi = fmax(s_hi, r->step);
    if (isfinite(r->loss)) l_lo = fmin(l_lo, r->loss), l_hi = fmax(l_hi, r->loss), last_loss = r->loss;
    if (isfinite(r->val)) {
      l_lo = fmin(l_lo, r->val), l_hi = fmax(l_hi, r->val);
      if (r->val < best_val) best_val = r->val, best_step = r->step;
    }
    if (isfinite(r->lr)) r_hi = fmax(r_hi, r->lr), r_lo = fmin(r_lo, r->lr), any_lr = true;
  }
  if (!isfinite(l_lo)) l_lo = 0, l_hi = 1; /* every loss non-finite: empty axes */
  plot_axis x = nice_axis(s_lo, s_hi, 8, true), y = nice_axis(l_lo, l_hi, 6, false);
  plot_axis r = nice_axis(r_lo, r_hi > r_lo ? r_hi : r_lo + 1, 6, false);

  out(b, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
         "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
         "font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\" font-size=\"13\">\n",
      W, H, W, H);
  out(b, "<title>");
  out_text(b, title);
  out(b, "</title>\n<rect width=\"%d\" height=\"%d\" fill=\"#ffffff\"/>\n", W, H);
  out(b, "<text x=\"%d\" y=\"26\" text-anchor=\"middle\" font-size=\"17\" font-weight=\"bold\">", W / 2);
  out_text(b, title);
  out(b, "</text>\n<text x=\"%d\" y=\"46\" text-anchor=\"middle\" fill=\"#555555\">", W / 2);
  out(b, "%d steps", d->n);
  if (isfinite(last_loss)) out(b, ", final train loss %.4g", last_loss);
  if (isfinite(best_val)) out(b, ", best validation loss %.4g at step %.0f", best_val, best_step);
  out(b, "</text>\n");

  /* grid and ticks */
  out(b, "<g id=\"grid\" stroke=\"#e6e6e6\" stroke-width=\"1\">\n");
  for (double v = x.lo; v <= x.hi + x.step * 1e-6; v += x.step)
    out(b, "<line x1=\"%.2f\" y1=\"%d\" x2=\"%.2f\" y2=\"%d\"/>\n", px(&x, v), MT, px(&x, v), MT + PH);
  for (double v = y.lo; v <= y.hi + y.step * 1e-6; v += y.step)
    out(b, "<line x1=\"%d\" y1=\"%.2f\" x2=\"%d\" y2=\"%.2f\"/>\n", ML, py(&y, v), ML + PW, py(&y, v));
  out(b, "</g>\n<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#333333\"/>\n",
      ML, MT, PW, PH);
  char s[48];
  out(b, "<g id=\"x-ticks\" text-anchor=\"middle\">\n");
  for (double v = x.lo; v <= x.hi + x.step * 1e-6; v += x.step) {
    tick_label(s, sizeof s, v, x.step);
    out(b, "<line x1=\"%.2f\" y1=\"%d\" x2=\"%.2f\" y2=\"%d\" stroke=\"#333333\"/>"
           "<text x=\"%.2f\" y=\"%d\">%s</text>\n",
        px(&x, v), MT + PH, px(&x, v), MT + PH + 5, px(&x, v), MT + PH + 20, s);
  }
  out(b, "</g>\n<g id=\"loss-ticks\" text-anchor=\"end\">\n");
  for (double v = y.lo; v <= y.hi + y.step * 1e-6; v += y.step) {
    tick_label(s, sizeof s, v, y.step);
    out(b, "<line x1=\"%d\" y1=\"%.2f\" x2=\"%d\" y2=\"%.2f\" stroke=\"#333333\"/>"
           "<text x=\"%d\" y=\"%.2f\">%s</text>\n",
        ML - 5, py(&y, v), ML, py(&y, v), ML - 8, py(&y, v) + 4.5, s);
  }
  out(b, "</g>\n");
  if (any_lr) {
    out(b, "<g id=\"lr-ticks\" text-anchor=\"start\" fill=\"%s\">\n", C_LR);
    for (double v = r.lo; v <= r.hi + r.step * 1e-6; v += r.step) {
      tick_label(s, sizeof s, v, r.step);
      out(b, "<line x1=\"%d\" y1=\"%.2f\" x2=\"%d\" y2=\"%.2f\" stroke=\"%s\"/>"
             "<text x=\"%d\" y=\"%.2f\">%s</text>\n",
          ML + PW, py(&r, v), ML + PW + 5, py(&r, v), C_LR, ML + PW + 8, py(&r, v) + 4.5, s);
    }
    out(b, "</g>\n");
  }
  /* axis titles */
  out(b, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">step</text>\n", ML + PW / 2, H - 18);
  out(b, "<text transform=\"translate(20 %d) rotate(-90)\" text-anchor=\"middle\">loss</text>\n",
      MT + PH / 2);
  if (any_lr)
    out(b, "<text transform=\"translate(%d %d) rotate(90)\" text-anchor=\"middle\" fill=\"%s\">"
           "learning rate</text>\n",
        W - 16, MT + PH / 2, C_LR);

  /* the curves, clipped to the plot area */
  out(b, "<clipPath id=\"plot-area\"><rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\"/></clipPath>\n",
      ML, MT, PW, PH);
  out(b, "<g clip-path=\"url(#plot-area)\" stroke-linejoin=\"round\" stroke-linecap=\"round\">\n");
  *n_lr = any_lr ? series(b, d, offsetof(plot_row, lr), NULL_LR, &x, &r, "lr", C_LR,
                          "stroke-width=\"1.6\" stroke-dasharray=\"6 4\"")
                 : 0;
  *n_train = series(b, d, offsetof(plot_row, loss), NULL_LOSS, &x, &y, "train-loss", C_TRAIN,
                    "stroke-width=\"1.6\"");
  *n_val = 0;
  for (int i = 0; i < d->n; i++) *n_val += isfinite(d->rows[i].val);
  if (*n_val) {
    series(b, d, offsetof(plot_row, val), NULL_VAL, &x, &y, "val-loss", C_VAL, "stroke-width=\"2.2\"");
    out(b, "<g id=\"val-points\" fill=\"%s\">\n", C_VAL);
    for (int i = 0; i < d->n; i++)
      if (isfinite(d->rows[i].val))
        out(b, "<circle cx=\"%.2f\" cy=\"%.2f\" r=\"3.2\"/>\n", px(&x, d->rows[i].step),
            py(&y, d->rows[i].val));
    out(b, "</g>\n");
  }
  out(b, "</g>\n");

  /* the legend, top right inside the plot */
  int rows = 1 + (*n_val > 0) + any_lr, lw = 192, lx = ML + PW - lw - 10, ly = MT + 10, k = 0;
  out(b, "<g id=\"legend\">\n<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"#ffffff\" "
         "fill-opacity=\"0.9\" stroke=\"#bbbbbb\"/>\n",
      lx, ly, lw, 10 + 20 * rows);
  struct {
    bool on;
    const char *name, *color, *dash;
  } items[] = {{true, "train loss", C_TRAIN, ""},
               {*n_val > 0, "validation loss", C_VAL, ""},
               {any_lr, "learning rate (right)", C_LR, " stroke-dasharray=\"6 4\""}};
  for (int i = 0; i < 3; i++) {
    if (!items[i].on) continue;
    int yy = ly + 17 + 20 * k++;
    out(b, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"%s\" stroke-width=\"2.2\"%s/>"
           "<text x=\"%d\" y=\"%d\">%s</text>\n",
        lx + 10, yy, lx + 38, yy, items[i].color, items[i].dash, lx + 46, yy + 4, items[i].name);
  }
  out(b, "</g>\n</svg>\n");
}

/* ------------------------------------------------------------ the command */

int cli_plot(int argc, char **argv) {
  const char *run = NULL, *out_path = NULL, *title = NULL;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    bool has_val = i + 1 < argc;
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      fputs(plot_help, stdout);
      return CLI_EXIT_OK;
    } else if (strcmp(a, "-o") == 0) {
      if (!has_val) return cli_usage_error("plot", "-o needs a file"), CLI_EXIT_USER;
      out_path = argv[++i];
    } else if (strcmp(a, "--title") == 0) {
      if (!has_val) return cli_usage_error("plot", "--title needs a text"), CLI_EXIT_USER;
      title = argv[++i];
    } else if (a[0] == '-' && a[1]) {
      return cli_usage_error("plot", "unknown option '%s'", a), CLI_EXIT_USER;
    } else if (run) {
      return cli_usage_error("plot", "one run at a time"), CLI_EXIT_USER;
    } else {
      run = a;
    }
  }
  if (!run) return cli_usage_error("plot", "missing RUN_DIR"), CLI_EXIT_USER;
  if (!out_path) return cli_usage_error("plot", "missing -o FILE.svg"), CLI_EXIT_USER;

  struct stat sb;
  bool is_dir = stat(run, &sb) == 0 && S_ISDIR(sb.st_mode);
  size_t plen = strlen(run) + 32;
  char *metrics = malloc(plen);
  if (!metrics) return fputs("dsc plot: out of memory\n", stderr), CLI_EXIT_INTERNAL;
  snprintf(metrics, plen, is_dir ? "%s/metrics.jsonl" : "%s", run);
  if (is_dir && stat(metrics, &sb) != 0) {
    fprintf(stderr, "%s: error: no metrics.jsonl in the run directory (is it a 'dsc train --out' "
                    "directory?)\n", run);
    free(metrics);
    return CLI_EXIT_USER;
  }
  plot_data d = {0};
  if (!read_metrics(metrics, &d)) {
    free(metrics), free(d.rows);
    return CLI_EXIT_USER;
  }
  plot_buf b = {0};
  int n_train, n_val, n_lr;
  render(&b, &d, title ? title : run, &n_train, &n_val, &n_lr);
  int rc = CLI_EXIT_OK;
  if (b.oom) {
    fputs("dsc plot: out of memory\n", stderr);
    rc = CLI_EXIT_INTERNAL;
  } else {
    dsc_context *ctx = dsc_context_new(NULL, NULL);
    if (!ctx) {
      fputs("dsc plot: out of memory\n", stderr);
      rc = CLI_EXIT_INTERNAL;
    } else {
      rt_atomic_file f;
      dsc_status st = rt_atomic_open(ctx, out_path, &f);
      if (st == DSC_OK) {
        if (rt_atomic_write(&f, b.p, b.n)) st = rt_atomic_commit(&f);
        else rt_atomic_abort(&f), st = DSC_ERR_USER;
      }
      dsc_diag_print(ctx, stderr);
      dsc_context_free(ctx);
      rc = cli_exit_code(st);
    }
  }
  if (rc == CLI_EXIT_OK) {
    if (d.non_finite)
      fprintf(stderr, "%s: note: %d non-finite value%s (null) left out of the plot\n", metrics,
              d.non_finite, d.non_finite == 1 ? "" : "s");
    printf("%s: %d steps (%d train-loss, %d validation, %d learning-rate points)\n", out_path, d.n,
           n_train, n_val, n_lr);
  }
  free(metrics), free(d.rows), free(b.p);
  return rc;
}
