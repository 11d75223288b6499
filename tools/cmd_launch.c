/* dsc launch -n N -- train ARGS...: runs `mpirun -np N <this dsc> train
 * ARGS...` (each process one rank, include/dsc/comm.h) and supervises it, so
 * that no process of the job outlives it (docs/zero.md "When a rank dies").
 *
 * mpirun runs in a session of its own (Open MPI gives every rank its own
 * process group, so a group is not enough to find them; the session is kept
 * by every descendant), and this process is their subreaper (orphans come
 * back to us, to be reaped). We forward SIGINT, SIGTERM and SIGHUP to
 * mpirun, poll the session's processes, and SIGKILL whatever is left of it
 * once mpirun has exited, and the whole job when a rank has been stopped
 * longer than the collective timeout (a stopped process takes no SIGTERM) or
 * the job goes on long after a rank ended. */
#define _XOPEN_SOURCE 700 /* readlink, setenv, kill, sigaction, nanosleep */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "runtime/cuda_api.h"
#include "tools/cli.h"

static const char launch_help[] =
    "usage: dsc launch -n N [--mpirun PATH] [--dry-run] [--] train ARGS...\n"
    "       dsc launch [--num_gpus G] [--num_nodes M] [--hostfile FILE] [--] train ARGS...\n"
    "       dsc launch [--hostfile FILE] [-i SPEC | -e SPEC] [--] train ARGS...\n"
    "\n"
    "Runs 'mpirun -np N DSC train ARGS...' with DSC this dsc binary: N processes,\n"
    "one rank each (Open MPI; docs/training.md \"Data parallel\"). The exit status is\n"
    "mpirun's (a failing rank ends the job with its error).\n"
    "No process of the job outlives it (docs/zero.md \"When a rank dies\"): SIGINT,\n"
    "SIGTERM and SIGHUP go to mpirun (a second one kills the job); once mpirun exits\n"
    "every process of the job still there is killed (SIGKILL), and so is the whole\n"
    "job when a rank stays stopped longer than the collective timeout\n"
    "(DSC_COMM_TIMEOUT, default 300 s) or the job goes on 10 s past that after a\n"
    "rank ended.\n"
    "  -n N           ranks (processes), 1 to 1024\n"
    "  --mpirun PATH  the launcher (default: mpirun from PATH)\n"
    "  --dry-run      print the command instead of running it\n"
    "DeepSpeed's launcher flags (deepspeed --num_gpus 2 train.py ...), mapped onto\n"
    "mpirun (on the CPU a GPU is a rank):\n"
    "  --num_gpus G   ranks per node (without a hostfile: -n G on this node)\n"
    "  --num_nodes M  the first M hosts of the hostfile\n"
    "  --hostfile F   DeepSpeed's hostfile: one 'HOST slots=N' per line, '#'\n"
    "                 comments; the ranks are the hosts' slots (at most G each),\n"
    "                 run as 'mpirun -np TOTAL --host HOST:N,...'\n"
    "  -i, --include SPEC  only these hosts and slots, DeepSpeed's form\n"
    "                 NAME[:SLOT[,SLOT...]][@NAME...]; worker-0:0,1@worker-1 is\n"
    "                 slots 0 and 1 of worker-0 and all of worker-1\n"
    "  -e, --exclude SPEC  all but these hosts and slots (the same form)\n"
    "                 Without --hostfile the one host is 'localhost' with its GPUs\n"
    "                 (CUDA devices; without any, its online CPUs). --include and\n"
    "                 --exclude exclude each other and --num_gpus/--num_nodes; a host\n"
    "                 or slot not in the pool is an error. A host runs as many ranks\n"
    "                 as it keeps slots; slots other than its first ones, the same\n"
    "                 on every host, go to the ranks as CUDA_VISIBLE_DEVICES (mpirun\n"
    "                 -x; a rank takes GPU rank mod their number)\n"
    "The command it runs is printed on stderr first.\n"
    "For Open MPI it sets, unless already set: OMPI_ALLOW_RUN_AS_ROOT(_CONFIRM)=1\n"
    "when run as root (containers), and OMPI_MCA_rmaps_base_oversubscribe=1 when\n"
    "N exceeds the online CPUs, as the project's MPI tests do.\n"
    "Exit codes: mpirun's (128+S when it was killed by signal S); 1 bad arguments,\n"
    "mpirun not found, no MPI in this dsc, or the job ended by dsc launch.\n";

/* PATH lookup of an executable; the found path in buf, or false. */
static bool find_in_path(const char *name, char *buf, size_t n) {
  if (strchr(name, '/')) {
    snprintf(buf, n, "%s", name);
    return access(buf, X_OK) == 0;
  }
  const char *path = getenv("PATH");
  if (!path || !*path) return false;
  while (*path) {
    const char *end = strchr(path, ':');
    size_t len = end ? (size_t)(end - path) : strlen(path);
    int w = snprintf(buf, n, "%.*s%s%s", (int)len, len ? path : ".", "/", name);
    struct stat sb;
    if (w > 0 && (size_t)w < n && stat(buf, &sb) == 0 && S_ISREG(sb.st_mode) &&
        access(buf, X_OK) == 0)
      return true;
    if (!end) break;
    path = end + 1;
  }
  return false;
}

static void set_default(const char *var, const char *value) {
  if (!getenv(var)) setenv(var, value, 0);
}

/* ---- supervising the job ---- */

typedef struct {
  pid_t pid;
  int rank;             /* OMPI_COMM_WORLD_RANK; -1: mpirun, or not known yet */
  double stopped_since; /* < 0: not stopped */
  bool seen;            /* in the latest scan */
} job_proc;

typedef struct {
  pid_t sid; /* the job's session: mpirun's pid */
  double limit; /* the collective timeout */
  job_proc *procs;
  int n, cap;
  int n_ranks;           /* rank processes alive in the latest scan */
  int gone_rank;         /* the first rank that ended while others ran; -1 */
  pid_t gone_pid;
  double gone_at;
} job_watch;

static volatile sig_atomic_t got_signal, n_signals;

static void on_signal(int sig) {
  got_signal = sig;
  n_signals = n_signals + 1;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void nap_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL); /* a signal ends it early: fine */
}

/* Reads up to n-1 bytes of a /proc file; its length, or -1. */
static ssize_t read_small(const char *path, char *buf, size_t n) {
  int fd = open(path, O_RDONLY);
  if (fd < 0) return -1;
  size_t k = 0;
  while (k + 1 < n) {
    ssize_t r = read(fd, buf + k, n - 1 - k);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    k += (size_t)r;
  }
  close(fd);
  buf[k] = 0;
  return (ssize_t)k;
}

/* State and session of a process from /proc/PID/stat; false if it is gone. */
static bool proc_stat(pid_t pid, char *state, pid_t *sid) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  if (read_small(path, buf, sizeof buf) <= 0) return false;
  /* "pid (comm) S ppid pgrp session ...": comm may hold spaces and ')'. */
  char *p = strrchr(buf, ')');
  int ppid, pgrp, session;
  if (!p || sscanf(p + 1, " %c %d %d %d", state, &ppid, &pgrp, &session) != 4) return false;
  *sid = (pid_t)session;
  return true;
}

/* The rank of a process started by mpirun (its environment), or -1. */
static int proc_rank(pid_t pid) {
  char path[64];
  static char env[1 << 18];
  snprintf(path, sizeof path, "/proc/%d/environ", (int)pid);
  ssize_t n = read_small(path, env, sizeof env);
  static const char key[] = "OMPI_COMM_WORLD_RANK=";
  for (ssize_t i = 0; i < n; i += (ssize_t)strlen(env + i) + 1)
    if (strncmp(env + i, key, sizeof key - 1) == 0) return atoi(env + i + sizeof key - 1);
  return -1;
}

static job_proc *find_proc(job_watch *w, pid_t pid) {
  for (int i = 0; i < w->n; i++)
    if (w->procs[i].pid == pid) return &w->procs[i];
  if (w->n == w->cap) {
    int cap = w->cap ? 2 * w->cap : 16;
    job_proc *p = realloc(w->procs, (size_t)cap * sizeof *p);
    if (!p) return NULL;
    w->procs = p, w->cap = cap;
  }
  job_proc *p = &w->procs[w->n++];
  *p = (job_proc){pid, -1, -1.0, false};
  return p;
}

/* Updates the list of the job's live processes (zombies are dead); their
 * number. With kill_sig, also sends it to each. */
static int scan_job(job_watch *w, int kill_sig) {
  for (int i = 0; i < w->n; i++) w->procs[i].seen = false;
  DIR *d = opendir("/proc");
  if (!d) return 0;
  struct dirent *e;
  pid_t self = getpid();
  double t = now_s();
  while ((e = readdir(d))) {
    if (!isdigit((unsigned char)e->d_name[0])) continue;
    pid_t pid = (pid_t)atoi(e->d_name);
    char state;
    pid_t sid;
    if (pid == self || !proc_stat(pid, &state, &sid) || sid != w->sid || state == 'Z' ||
        state == 'X')
      continue;
    job_proc *p = find_proc(w, pid);
    if (!p) continue;
    p->seen = true;
    if (p->rank < 0 && pid != w->sid) p->rank = proc_rank(pid); /* set once it has exec'd */
    if (state == 'T') {
      if (p->stopped_since < 0) p->stopped_since = t;
    } else {
      p->stopped_since = -1;
    }
    if (kill_sig) kill(pid, kill_sig);
  }
  closedir(d);
  int live = 0, ranks = 0;
  for (int i = 0; i < w->n;) {
    job_proc *p = &w->procs[i];
    if (!p->seen) {
      if (p->rank >= 0 && w->gone_rank < 0 && w->n_ranks > 1)
        w->gone_rank = p->rank, w->gone_pid = p->pid, w->gone_at = t;
      w->procs[i] = w->procs[--w->n];
      continue;
    }
    live++;
    ranks += p->rank >= 0;
    i++;
  }
  w->n_ranks = ranks;
  return live;
}

static void describe_proc(const job_watch *w, const job_proc *p, char *buf, size_t n) {
  if (p->rank >= 0) snprintf(buf, n, "rank %d (pid %d)", p->rank, (int)p->pid);
  else if (p->pid == w->sid) snprintf(buf, n, "mpirun (pid %d)", (int)p->pid);
  else snprintf(buf, n, "pid %d", (int)p->pid);
}

/* Why the job must be killed now (into why), or false. */
static bool must_kill(const job_watch *w, char *why, size_t n) {
  double t = now_s();
  for (int i = 0; i < w->n; i++) {
    const job_proc *p = &w->procs[i];
    if (p->stopped_since >= 0 && t - p->stopped_since > w->limit) {
      char who[64];
      describe_proc(w, p, who, sizeof who);
      snprintf(why, n, "%s has been stopped for %.1f s, longer than the collective timeout "
               "(%.1f s)", who, t - p->stopped_since, w->limit);
      return true;
    }
  }
  if (w->gone_rank >= 0 && w->n > 0 && t - w->gone_at > w->limit + 10.0) {
    snprintf(why, n, "rank %d (pid %d) ended %.1f s ago and the job goes on", w->gone_rank,
             (int)w->gone_pid, t - w->gone_at);
    return true;
  }
  return false;
}

/* Reaps every child that ended (mpirun, orphans handed to us); mpirun's
 * status into *status, true once it ended. */
static bool reap(pid_t mpirun, int *status, bool *mpirun_done) {
  int st;
  pid_t p;
  while ((p = waitpid(-1, &st, WNOHANG)) > 0)
    if (p == mpirun) *status = st, *mpirun_done = true;
  return *mpirun_done;
}

/* SIGKILLs every process of the job until none is left (at most ~5 s). */
static void kill_job(job_watch *w, pid_t mpirun, int *status, bool *mpirun_done) {
  kill(-w->sid, SIGKILL); /* mpirun's own group */
  for (int i = 0; i < 100; i++) {
    reap(mpirun, status, mpirun_done);
    if (scan_job(w, SIGKILL) == 0) break;
    nap_ms(50);
  }
  reap(mpirun, status, mpirun_done);
}

/* Runs the job and waits for it; the exit code. */
static int supervise(char *const *args) {
  double limit = DSC_COMM_DEFAULT_TIMEOUT;
  const char *env = getenv("DSC_COMM_TIMEOUT");
  if (env && *env) {
    char *end;
    double t = strtod(env, &end);
    if (*end == 0 && t > 0 && isfinite(t)) limit = t; /* else the ranks report it */
  }
#ifdef PR_SET_CHILD_SUBREAPER
  prctl(PR_SET_CHILD_SUBREAPER, 1);
#endif
  struct sigaction sa, dfl;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  memset(&dfl, 0, sizeof dfl);
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(SIGCHLD, &dfl, NULL); /* waitpid must see mpirun, even if we inherited SIG_IGN */
  const int fwd[] = {SIGINT, SIGTERM, SIGHUP};
  for (int i = 0; i < 3; i++) sigaction(fwd[i], &sa, NULL);
  fflush(stdout);
  fflush(stderr);
  pid_t parent = getpid();
  pid_t child = fork();
  if (child < 0) {
    fprintf(stderr, "dsc launch: error: cannot start %s: %s\n", args[0], strerror(errno));
    return CLI_EXIT_USER;
  }
  if (child == 0) {
    for (int i = 0; i < 3; i++) sigaction(fwd[i], &dfl, NULL);
    setsid();
#ifdef PR_SET_PDEATHSIG
    /* Should dsc launch itself be killed, mpirun ends the job. */
    prctl(PR_SET_PDEATHSIG, SIGTERM);
#endif
    if (getppid() != parent) _exit(CLI_EXIT_USER);
    execv(args[0], args);
    fprintf(stderr, "dsc launch: error: cannot run %s: %s\n", args[0], strerror(errno));
    _exit(CLI_EXIT_USER);
  }
  job_watch w = {.sid = child, .limit = limit, .gone_rank = -1};
  int status = 0;
  bool done = false, killed = false;
  int forwarded = 0, kill_code = 0;
  char why[256] = "";
  while (!reap(child, &status, &done)) {
    int sig = got_signal, k = n_signals;
    if (k > forwarded) {
      forwarded = k;
      if (k == 1) {
        kill(-child, sig);
      } else if (!killed) {
        fprintf(stderr, "dsc launch: a second signal (%s): killing the job\n", strsignal(sig));
        kill_job(&w, child, &status, &done);
        killed = true;
        kill_code = 128 + sig;
      }
    }
    scan_job(&w, 0);
    if (!killed && must_kill(&w, why, sizeof why)) {
      fprintf(stderr, "dsc launch: error: %s: killing the job\n", why);
      kill_job(&w, child, &status, &done);
      killed = true;
      kill_code = CLI_EXIT_USER; /* we ended it, not mpirun */
    }
    nap_ms(50);
  }
  /* mpirun is gone: whatever of the job is still there would be orphaned. */
  scan_job(&w, 0);
  char left[256] = "";
  size_t k = 0;
  for (int i = 0; i < w.n && k < sizeof left; i++) {
    char who[64];
    describe_proc(&w, &w.procs[i], who, sizeof who);
    k += (size_t)snprintf(left + k, sizeof left - k, "%s%s%s", k ? ", " : "", who,
                          w.procs[i].stopped_since >= 0 ? " (stopped)" : "");
  }
  int n_left = w.n;
  if (n_left) kill_job(&w, child, &status, &done);
  if (n_left > 0)
    fprintf(stderr, "dsc launch: error: mpirun exited but %s %s still there: killed\n", left,
            n_left > 1 ? "were" : "was");
  int code;
  if (WIFEXITED(status)) code = WEXITSTATUS(status);
  else if (WIFSIGNALED(status)) code = 128 + WTERMSIG(status);
  else code = CLI_EXIT_USER;
  if (killed) code = kill_code;
  else if (n_left > 0 && code == 0) code = CLI_EXIT_USER;
  if (WIFSIGNALED(status) && !killed)
    fprintf(stderr, "dsc launch: error: mpirun was killed by signal %d (%s)\n", WTERMSIG(status),
            strsignal(WTERMSIG(status)));
  free(w.procs);
  return code;
}

/* ---- the hosts and their slots (DeepSpeed's resource pool) ---- */

#define MAX_SLOTS 1024

typedef struct {
  char name[256];
  int slots;            /* slots=N of the hostfile */
  bool keep[MAX_SLOTS]; /* the slots the job uses (--include, --exclude) */
  bool named;           /* a filter named this host */
} launch_host;

typedef struct {
  launch_host *hosts;
  int n, cap;
} launch_pool;

static launch_host *pool_add(launch_pool *p, const char *name, int slots) {
  if (p->n == p->cap) {
    int cap = p->cap ? 2 * p->cap : 8;
    launch_host *h = realloc(p->hosts, (size_t)cap * sizeof *h);
    if (!h) return NULL;
    p->hosts = h, p->cap = cap;
  }
  launch_host *h = &p->hosts[p->n++];
  memset(h, 0, sizeof *h);
  snprintf(h->name, sizeof h->name, "%s", name);
  h->slots = slots;
  for (int i = 0; i < slots; i++) h->keep[i] = true;
  return h;
}

static launch_host *pool_find(launch_pool *p, const char *name) {
  for (int i = 0; i < p->n; i++)
    if (strcmp(p->hosts[i].name, name) == 0) return &p->hosts[i];
  return NULL;
}

static int host_kept(const launch_host *h) {
  int k = 0;
  for (int i = 0; i < h->slots; i++) k += h->keep[i];
  return k;
}

/* DeepSpeed's hostfile: "HOST slots=N" per line, '#' comments, blank
 * lines, into *p in the file's order; false after printing what is wrong
 * (file:line). */
static bool read_hostfile(const char *path, launch_pool *p) {
  FILE *f = fopen(path, "r");
  if (!f) {
    fprintf(stderr, "dsc launch: error: cannot open hostfile %s: %s\n", path, strerror(errno));
    return false;
  }
  char line[1024];
  int ln = 0;
  bool ok = true;
  while (ok && fgets(line, sizeof line, f)) {
    ln++;
    char *hash = strchr(line, '#');
    if (hash) *hash = 0;
    char host[256], extra[8];
    long long slots;
    int got = sscanf(line, " %255s slots=%lld %7s", host, &slots, extra);
    if (got <= 0 || (got == EOF)) continue; /* blank or comment */
    if (got != 2 || slots < 1 || slots > MAX_SLOTS) {
      fprintf(stderr,
              "dsc launch: error: %s:%d: expected 'HOST slots=N' (N from 1 to 1024), as in "
              "DeepSpeed's hostfile\n",
              path, ln);
      ok = false;
    } else if (pool_find(p, host)) {
      fprintf(stderr, "dsc launch: error: %s:%d: host '%s' is listed twice\n", path, ln, host);
      ok = false;
    } else if (!pool_add(p, host, (int)slots)) {
      fputs("dsc: out of memory\n", stderr);
      ok = false;
    }
  }
  fclose(f);
  if (ok && p->n == 0) {
    fprintf(stderr, "dsc launch: error: hostfile %s lists no host ('HOST slots=N' lines)\n", path);
    ok = false;
  }
  return ok;
}

/* Without a hostfile DeepSpeed's pool is "localhost" with its GPUs: the
 * CUDA devices the driver reports, or with none the online CPUs (on the CPU
 * a rank stands in for a GPU). */
static int local_slots(void) {
#ifdef DSC_HAVE_CUDA
  char why[256];
  const rt_cuda_api *a = rt_cuda_api_get(why, sizeof why);
  int count = 0;
  if (a && a->Init(0) == CUDA_SUCCESS && a->DeviceGetCount(&count) == CUDA_SUCCESS && count > 0)
    return count < MAX_SLOTS ? count : MAX_SLOTS;
#endif
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  return cpus < 1 ? 1 : cpus < MAX_SLOTS ? (int)cpus : MAX_SLOTS;
}

/* --include / --exclude SPEC, DeepSpeed's NAME[:SLOT[,SLOT...]][@NAME...]
 * (launcher/runner.py parse_resource_filter): include keeps the hosts named
 * (a bare name all its slots, else the slots listed: a host both bare and
 * with slots keeps the slots, as DeepSpeed merges them), exclude removes
 * the slots listed or the whole host. Hosts and slots must be in the pool.
 * false after printing what is wrong. */
static bool apply_filter(launch_pool *p, const char *spec, bool include, const char *hostfile) {
  const char *flag = include ? "--include" : "--exclude";
  /* the slots each host's specs name, merged as DeepSpeed does */
  bool *listed = calloc((size_t)p->n * MAX_SLOTS, sizeof *listed);
  bool *any = calloc((size_t)p->n, sizeof *any);
  if (!listed || !any) {
    free(listed), free(any);
    fputs("dsc: out of memory\n", stderr);
    return false;
  }
  bool ok = true;
  for (const char *s = spec; ok;) {
    const char *end = strchr(s, '@');
    size_t len = end ? (size_t)(end - s) : strlen(s);
    char node[512];
    if (len >= sizeof node) len = sizeof node - 1;
    memcpy(node, s, len);
    node[len] = 0;
    char *colon = strchr(node, ':');
    if (colon) *colon = 0;
    launch_host *h = NULL;
    if (!node[0]) {
      fprintf(stderr,
              "dsc launch: error: %s '%s': an empty host name (the form is "
              "NAME[:SLOT[,SLOT...]][@NAME...], as in worker-0:0,1@worker-1)\n",
              flag, spec);
      ok = false;
    } else if (colon && strchr(colon + 1, ':')) {
      fprintf(stderr, "dsc launch: error: %s '%s': '%s:%s' has more than one ':'\n", flag, spec,
              node, colon + 1);
      ok = false;
    } else if (!(h = pool_find(p, node))) {
      if (hostfile)
        fprintf(stderr, "dsc launch: error: %s: host '%s' is not in hostfile %s\n", flag, node,
                hostfile);
      else
        fprintf(stderr,
                "dsc launch: error: %s: host '%s' is not this one: without --hostfile "
                "the only host is 'localhost'\n",
                flag, node);
      ok = false;
    }
    int hi = h ? (int)(h - p->hosts) : 0;
    if (ok) h->named = true;
    for (char *t = colon ? colon + 1 : NULL; ok && t;) {
      char *comma = strchr(t, ',');
      if (comma) *comma = 0;
      char *e;
      long slot = strtol(t, &e, 10);
      if (!isdigit((unsigned char)*t) || *e) {
        fprintf(stderr,
                "dsc launch: error: %s '%s': bad slot '%s' for host '%s' (slots are "
                "indices from 0, as in worker-0:0,1)\n",
                flag, spec, t, node);
        ok = false;
      } else if (slot >= h->slots) {
        fprintf(stderr, "dsc launch: error: %s: host '%s' has no slot %ld: it has %d (0 to %d%s)\n",
                flag, node, slot, h->slots, h->slots - 1,
                hostfile ? "" : "; without --hostfile: its CUDA devices, or with none its CPUs");
        ok = false;
      } else {
        listed[(size_t)hi * MAX_SLOTS + (size_t)slot] = any[hi] = true;
      }
      t = comma ? comma + 1 : NULL;
    }
    if (!end) break;
    s = end + 1;
  }
  for (int i = 0; ok && i < p->n; i++) {
    launch_host *h = &p->hosts[i];
    for (int k = 0; k < h->slots; k++) {
      bool l = listed[(size_t)i * MAX_SLOTS + (size_t)k];
      if (include)
        h->keep[k] = h->named && (!any[i] || l);
      else
        h->keep[k] = h->named ? any[i] && !l : true;
    }
  }
  free(listed), free(any);
  /* hosts left without a slot leave the pool, the others keep their order */
  int n = 0;
  for (int i = 0; ok && i < p->n; i++)
    if (host_kept(&p->hosts[i]) > 0) p->hosts[n++] = p->hosts[i];
  if (ok) p->n = n;
  if (ok && n == 0) {
    fprintf(stderr, "dsc launch: error: --exclude '%s' leaves no slot to run on\n", spec);
    ok = false;
  }
  return ok;
}

/* The pool's hosts as mpirun's "--host HOST:N,..." (N its kept slots),
 * their sum in *total; false when it does not fit. */
static bool format_hosts(const launch_pool *p, char *buf, size_t cap, int64_t *total) {
  size_t k = 0;
  buf[0] = 0;
  *total = 0;
  for (int i = 0; i < p->n; i++) {
    int n = host_kept(&p->hosts[i]);
    int w = snprintf(buf + k, cap - k, "%s%s:%d", k ? "," : "", p->hosts[i].name, n);
    if (w < 0 || (size_t)w >= cap - k) return false;
    k += (size_t)w, *total += n;
  }
  return true;
}

/* The slot indices the pool keeps, "1,3", when every host keeps the same
 * ones (into buf); false when hosts keep different ones. */
static bool same_slots(const launch_pool *p, char *buf, size_t cap) {
  const launch_host *a = &p->hosts[0];
  for (int i = 1; i < p->n; i++) {
    const launch_host *b = &p->hosts[i];
    for (int k = 0; k < MAX_SLOTS; k++)
      if ((k < a->slots && a->keep[k]) != (k < b->slots && b->keep[k])) return false;
  }
  size_t used = 0;
  buf[0] = 0;
  for (int k = 0; k < a->slots; k++)
    if (a->keep[k]) {
      int w = snprintf(buf + used, cap - used, "%s%d", used ? "," : "", k);
      if (w < 0 || (size_t)w >= cap - used) return false;
      used += (size_t)w;
    }
  return true;
}

/* DeepSpeed's launcher flags: the hosts and their slots (hostfile, then
 * --include/--exclude, or --num_nodes/--num_gpus: DeepSpeed refuses both
 * kinds together) as mpirun's --host list (hosts[0] = 0: this node alone),
 * the ranks they give (*total; 0: none said, -n or --num_gpus decide) and
 * the GPU indices to expose where a filter keeps slots other than each
 * host's first ones (visible[0] = 0: none). false after printing what is wrong. */
static bool resolve_hosts(const char *hostfile, int64_t num_nodes, int64_t num_gpus,
                          const char *include, const char *exclude, char *hosts, size_t cap,
                          char *visible, size_t vcap, int64_t *total) {
  hosts[0] = visible[0] = 0;
  *total = 0;
  const char *spec = include ? include : exclude;
  if (include && exclude) {
    cli_usage_error("launch",
                    "--include and --exclude are mutually exclusive (as in DeepSpeed's "
                    "launcher)");
    return false;
  }
  if (spec && (num_nodes > 0 || num_gpus > 0)) {
    cli_usage_error("launch",
                    "%s cannot be combined with --num_nodes or --num_gpus (as in "
                    "DeepSpeed's launcher: it names the hosts and slots itself)",
                    include ? "--include" : "--exclude");
    return false;
  }
  if (!hostfile && !spec) return true;
  launch_pool p = {0};
  bool ok = true;
  if (hostfile) {
    ok = read_hostfile(hostfile, &p);
  } else {
    if (!pool_add(&p, "localhost", local_slots()))
      ok = false, fputs("dsc: out of memory\n", stderr);
  }
  if (ok && num_nodes > p.n) {
    fprintf(stderr, "dsc launch: error: --num_nodes %" PRId64 ", but hostfile %s lists %d host%s\n",
            num_nodes, hostfile, p.n, p.n == 1 ? "" : "s");
    ok = false;
  }
  if (ok && num_nodes > 0) p.n = (int)num_nodes; /* the first M hosts */
  for (int i = 0; ok && num_gpus > 0 && i < p.n; i++)
    for (int k = 0; k < p.hosts[i].slots; k++) p.hosts[i].keep[k] = k < num_gpus;
  if (ok && spec) ok = apply_filter(&p, spec, include != NULL, hostfile);
  if (ok && !format_hosts(&p, hosts, cap, total)) {
    fprintf(stderr, "dsc launch: error: %s: too many hosts\n", hostfile ? hostfile : "--include");
    ok = false;
  }
  if (ok && !hostfile) hosts[0] = 0; /* localhost: mpirun's own node */
  /* slots named that are not each host's first ones: the GPUs to expose */
  bool prefix = true;
  for (int i = 0; ok && i < p.n; i++)
    for (int k = 0, kept = host_kept(&p.hosts[i]); k < kept; k++) prefix &= p.hosts[i].keep[k];
  if (ok && !prefix && !same_slots(&p, visible, vcap)) {
    visible[0] = 0;
    fprintf(stderr,
            "dsc launch: note: %s keeps different slots on different hosts: each host runs as "
            "many ranks as it keeps slots, but mpirun gives every rank one environment, so the "
            "slot indices are not pinned (a rank takes GPU rank mod the node's GPUs)\n",
            include ? "--include" : "--exclude");
  }
  free(p.hosts);
  return ok;
}

/* A DeepSpeed launcher flag's value: "--flag V" or "--flag=V". */
static const char *flag_value(int argc, char **argv, int *i, const char *flag) {
  size_t l = strlen(flag);
  if (strncmp(argv[*i], flag, l) != 0) return NULL;
  if (argv[*i][l] == '=') return argv[*i] + l + 1;
  if (argv[*i][l] || *i + 1 >= argc) return NULL;
  return argv[++*i];
}

int cli_launch(int argc, char **argv) {
  int64_t n = 0, num_gpus = 0, num_nodes = 0;
  const char *mpirun = NULL, *hostfile = NULL, *include = NULL, *exclude = NULL;
  bool dry = false;
  int i = 1;
  for (; i < argc; i++) {
    const char *a = argv[i], *v;
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      fputs(launch_help, stdout);
      return CLI_EXIT_OK;
    } else if (strncmp(a, "--num_gpus", 10) == 0 || strncmp(a, "--num_nodes", 11) == 0) {
      bool gpus = a[6] == 'g';
      const char *flag = gpus ? "--num_gpus" : "--num_nodes";
      int64_t x;
      if (!(v = flag_value(argc, argv, &i, flag)) || !cli_parse_i64(v, &x) || x < 1 || x > 1024)
        return cli_usage_error("launch", "%s needs an integer in [1, 1024]", flag), CLI_EXIT_USER;
      *(gpus ? &num_gpus : &num_nodes) = x;
    } else if (strncmp(a, "--include", 9) == 0 || strncmp(a, "--exclude", 9) == 0 ||
               strcmp(a, "-i") == 0 || strcmp(a, "-e") == 0) {
      bool inc = a[1] == 'i' || a[2] == 'i';
      const char *flag = inc ? "--include" : "--exclude";
      if (!(v = flag_value(argc, argv, &i, a[1] == '-' ? flag : inc ? "-i" : "-e")) || *v == '-')
        return cli_usage_error("launch",
                               "%s needs NAME[:SLOT[,SLOT...]][@NAME...], as in "
                               "worker-0:0,1@worker-1",
                               flag),
               CLI_EXIT_USER;
      if (*v) *(inc ? &include : &exclude) = v; /* "" is not given, as DeepSpeed's default */
    } else if (strncmp(a, "--hostfile", 10) == 0) {
      if (!(v = flag_value(argc, argv, &i, "--hostfile")) || !*v)
        return cli_usage_error("launch", "--hostfile needs a file ('HOST slots=N' lines)"),
               CLI_EXIT_USER;
      hostfile = v;
    } else if (strcmp(a, "-n") == 0 || strcmp(a, "-np") == 0) {
      if (i + 1 >= argc || !cli_parse_i64(argv[i + 1], &n) || n < 1 || n > 1024)
        return cli_usage_error("launch", "-n needs an integer in [1, 1024]"), CLI_EXIT_USER;
      i++;
    } else if (strcmp(a, "--mpirun") == 0) {
      if (i + 1 >= argc || !argv[i + 1][0])
        return cli_usage_error("launch", "--mpirun needs a path"), CLI_EXIT_USER;
      mpirun = argv[++i];
    } else if (strcmp(a, "--dry-run") == 0) {
      dry = true;
    } else if (strcmp(a, "--") == 0) {
      i++;
      break;
    } else if (strcmp(a, "train") == 0) {
      break; /* the '--' is optional before the command */
    } else {
      return cli_usage_error("launch", "unknown option '%s' (the command follows '--')", a),
             CLI_EXIT_USER;
    }
  }
  /* DeepSpeed's flags: the hosts and their slots */
  char hosts[4096], visible[4096];
  int64_t total = 0;
  if (!resolve_hosts(hostfile, num_nodes, num_gpus, include, exclude, hosts, sizeof hosts, visible,
                     sizeof visible, &total))
    return CLI_EXIT_USER;
  if (total > 0) {
    if (n > total)
      return cli_usage_error("launch", "-n %" PRId64 " ranks, but %s %" PRId64 " slot%s", n,
                             include   ? "--include keeps"
                             : exclude ? "--exclude leaves"
                                       : "the hostfile gives",
                             total, total == 1 ? "" : "s"),
             CLI_EXIT_USER;
    if (n == 0) n = total;
  } else if (num_nodes > 1) {
    return cli_usage_error("launch", "--num_nodes %" PRId64 " needs a --hostfile naming the nodes",
                           num_nodes),
           CLI_EXIT_USER;
  } else if (num_gpus > 0) {
    if (n > 0 && n != num_gpus)
      return cli_usage_error("launch", "-n %" PRId64 " and --num_gpus %" PRId64 " disagree", n,
                             num_gpus),
             CLI_EXIT_USER;
    n = num_gpus;
  }
  if (n == 0)
    return cli_usage_error("launch", "missing -n N (the number of ranks) or --num_gpus N"),
           CLI_EXIT_USER;
  if (i >= argc)
    return cli_usage_error("launch",
                           "missing the command after '--' (dsc launch -n N -- train ...)"),
           CLI_EXIT_USER;
  if (strcmp(argv[i], "train") != 0)
    return cli_usage_error("launch",
                           "'%s' does not run on ranks; dsc launch runs 'train' "
                           "(dsc launch -n N -- train ...)",
                           argv[i]),
           CLI_EXIT_USER;
  for (int k = i + 1; k < argc; k++)
    if (strcmp(argv[k], "--ranks") == 0)
      return cli_usage_error("launch",
                             "--ranks runs in-process ranks; under dsc launch each process is a "
                             "rank already (-n gives their number)"),
             CLI_EXIT_USER;
  if (!dsc_comm_have_mpi()) {
    fputs(
        "dsc launch: error: this dsc was built without MPI (rebuild with MPI, or use "
        "'dsc train --ranks N' for in-process ranks)\n",
        stderr);
    return CLI_EXIT_USER;
  }

  /* This binary, by absolute path: mpirun's processes may not share our PATH. */
  char self[PATH_MAX];
  ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
  if (len <= 0) {
    fprintf(stderr, "dsc launch: error: cannot find this dsc binary (/proc/self/exe): %s\n",
            strerror(errno));
    return CLI_EXIT_USER;
  }
  self[len] = 0;
  char launcher[PATH_MAX];
  const char *want = mpirun ? mpirun : "mpirun";
  if (!find_in_path(want, launcher, sizeof launcher)) {
    if (mpirun)
      fprintf(stderr, "dsc launch: error: --mpirun %s: not an executable file\n", mpirun);
    else
      fputs(
          "dsc launch: error: mpirun not found in PATH (install Open MPI, e.g. "
          "apt-get install openmpi-bin, or give --mpirun PATH)\n",
          stderr);
    return CLI_EXIT_USER;
  }

  /* mpirun -np N SELF train ARGS... */
  int n_rest = argc - i;
  char **args = calloc((size_t)n_rest + 9, sizeof *args);
  char np[24], env[4200];
  if (!args) return fputs("dsc: out of memory\n", stderr), CLI_EXIT_INTERNAL;
  snprintf(np, sizeof np, "%" PRId64, n);
  int k = 0;
  args[k++] = launcher;
  args[k++] = "-np";
  args[k++] = np;
  if (hosts[0]) args[k++] = "--host", args[k++] = hosts;
  if (visible[0]) { /* the slots named: the GPUs each node's ranks take (rank % their count) */
    snprintf(env, sizeof env, "CUDA_VISIBLE_DEVICES=%s", visible);
    args[k++] = "-x", args[k++] = env;
  }
  args[k++] = self;
  for (int j = i; j < argc; j++) args[k++] = argv[j];
  args[k] = NULL;

  /* Open MPI refuses root and more ranks than slots unless told; these
   * variables are its own (other MPIs ignore them), never overriding the user's. */
  if (geteuid() == 0) {
    set_default("OMPI_ALLOW_RUN_AS_ROOT", "1");
    set_default("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
  }
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  if (cpus > 0 && n > cpus) set_default("OMPI_MCA_rmaps_base_oversubscribe", "1");

  if (dry) {
    for (int j = 0; j < k; j++) printf("%s%s", j ? " " : "", args[j]);
    putchar('\n');
    free(args);
    return CLI_EXIT_OK;
  }
  fputs("dsc launch: running:", stderr);
  for (int j = 0; j < k; j++) fprintf(stderr, " %s", args[j]);
  fputc('\n', stderr);
  int code = supervise(args);
  free(args);
  return code;
}
