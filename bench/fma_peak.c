/* fma_peak: measures this CPU's f32 FMA throughput (GFLOP/s) with N threads,
 * and checks it against the published throughput of the detected core.
 *
 * Each thread runs independent chains of packed FMAs (acc = acc * a + b) on
 * registers only (bench/fma_probe.h says how many chains and why). One FMA
 * on a 16-lane AVX-512 register counts 32 flops (8 lanes and 16 flops with
 * AVX2; the SSE baseline's mulps + addps 8). Without -ffast-math the
 * compiler may not reassociate or fold the chains. The best of several
 * trials is reported, all threads timed together between barriers.
 *
 * The expected peak is FLOP/cycle/core (a table of cores, from cpuid's
 * vendor, family and model) x cores x the clock. The clock is measured, not
 * read: under KVM /proc/cpuinfo's "cpu MHz" is the nominal (TSC) rate, and
 * the cores run at their turbo clock. Each thread runs a chain of dependent
 * 64-bit imuls (3 cycles each on every Intel core since Nehalem and every
 * AMD Zen) at the same time, so the clock is the all-core one; it is the
 * scalar clock: a core that lowers its clock for wide vectors (AVX-512
 * licences on Skylake-SP / Ice Lake) reads a little below the expected peak.
 * Below 80% of it, a warning names the likely causes. Clock trials and FMA
 * trials alternate, so that other load slows both alike: on a shared machine
 * the measured clock drops below the nominal one, and the expected peak with
 * it (expected_gflops_nominal is the figure at /proc/cpuinfo's clock).
 *
 *   fma_peak [--threads N] [--trials K] [--ms MS] [--isa avx512|avx2|baseline]
 *
 * --isa defaults to DSC_CPU_ISA when set (dsc's knob to lower its own ISA),
 * else to the widest the CPU has, by dsc's rule (program/cpu_isa.c). Prints one JSON line:
 * {"impl":"fma_peak", "isa":..,"threads":..,"gflops":..,"expected_gflops":..,"clock_ghz":..,
 * "core":..,...}; the warning also goes to stderr. */
#define _GNU_SOURCE
#include <cpuid.h>
#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench/fma_probe.h"

enum isa { ISA_BASELINE, ISA_AVX2, ISA_AVX512 };
static const char *const isa_names[] = {"baseline", "avx2", "avx512"};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- the probes ---- */

static float probe(enum isa isa, int64_t iters, float seed) {
  switch (isa) {
    case ISA_AVX512:
      return fma_chains_avx512(iters, seed);
    case ISA_AVX2:
      return fma_chains_avx2(iters, seed);
    default:
      return fma_chains_sse(iters, seed);
  }
}

static double flops_per_iter(enum isa isa) {
  switch (isa) {
    case ISA_AVX512:
      return FMA_CHAINS * 32.0;
    case ISA_AVX2:
      return FMA_CHAINS_AVX2 * 16.0;
    default:
      return FMA_CHAINS_SSE * 8.0;
  }
}

/* 8 dependent imuls an iteration: 24 cycles; the loop counter runs beside
 * them on other ports. x stays 1. */
#define CLOCK_CYCLES_PER_ITER 24.0
static float clock_chain(int64_t iters) {
  uint64_t x = 1, one = 1;
  for (int64_t i = 0; i < iters; i++)
    __asm__ volatile(
        "imul %1, %0\n\timul %1, %0\n\timul %1, %0\n\timul %1, %0\n\t"
        "imul %1, %0\n\timul %1, %0\n\timul %1, %0\n\timul %1, %0"
        : "+r"(x)
        : "r"(one));
  return (float)x;
}

typedef struct {
  pthread_barrier_t *start, *stop;
  int64_t clock_iters, iters;
  enum isa isa;
  int trials;
  float result;
} worker;

/* Trials alternate: a clock trial (even t), then an FMA trial (odd t), so
 * that load from other processes hits both alike. */
static void *run_worker(void *p) {
  worker *w = p;
  for (int t = 0; t < 2 * w->trials; t++) {
    pthread_barrier_wait(w->start);
    w->result += t % 2 == 0 ? clock_chain(w->clock_iters) : probe(w->isa, w->iters, (float)t);
    pthread_barrier_wait(w->stop);
  }
  return NULL;
}

/* Iterations of f that last about ms on one thread. */
static int64_t calibrate(enum isa isa, int clock, double ms) {
  int64_t iters = 1 << 12;
  for (;;) {
    double t0 = now_s();
    volatile float sink = clock ? clock_chain(iters) : probe(isa, iters, 1);
    (void)sink;
    double dt = now_s() - t0;
    if (dt > ms * 1e-3 / 4 || iters > ((int64_t)1 << 40)) {
      iters = (int64_t)((double)iters * (ms * 1e-3) / (dt > 0 ? dt : 1e-9));
      return iters < 1 ? 1 : iters;
    }
    iters *= 4;
  }
}

/* ---- the core and its published throughput ---- */

typedef struct {
  char vendor[13], brand[49];
  unsigned family, model;
  const char *core;      /* the microarchitecture, or "unknown ..." */
  double flop_per_cycle; /* f32, one core, at the ISA in use */
  const char *note;      /* what the table cannot tell, or "" */
} core_info;

static void read_cpuid(core_info *ci) {
  unsigned a, b, c, d;
  memset(ci, 0, sizeof *ci);
  if (__get_cpuid(0, &a, &b, &c, &d)) {
    memcpy(ci->vendor, &b, 4), memcpy(ci->vendor + 4, &d, 4), memcpy(ci->vendor + 8, &c, 4);
  }
  if (__get_cpuid(1, &a, &b, &c, &d)) {
    unsigned fam = (a >> 8) & 0xf, mod = (a >> 4) & 0xf;
    if (fam == 0xf) fam += (a >> 20) & 0xff;
    if (fam == 0x6 || fam >= 0xf) mod |= ((a >> 16) & 0xf) << 4;
    ci->family = fam, ci->model = mod;
  }
  unsigned max_ext = __get_cpuid_max(0x80000000, NULL);
  if (max_ext >= 0x80000004) {
    unsigned r[12];
    for (unsigned i = 0; i < 3; i++)
      __get_cpuid(0x80000002 + i, &r[4 * i], &r[4 * i + 1], &r[4 * i + 2], &r[4 * i + 3]);
    memcpy(ci->brand, r, 48);
    char *s = ci->brand; /* some brands are padded with leading spaces */
    while (*s == ' ') s++;
    memmove(ci->brand, s, strlen(s) + 1);
  }
}

/* f32 FLOP/cycle/core: 2 per FMA lane x lanes x FMA pipes (software
 * optimization manuals; Agner Fog's instruction tables). The SSE baseline
 * issues mulps and addps: 2 x 4 lanes on Intel's two FMA ports, 4 x 4 on
 * Zen's two mul and two add pipes. */
static void classify(core_info *ci, enum isa isa) {
  unsigned f = ci->family, m = ci->model;
  ci->note = "";
  if (strcmp(ci->vendor, "GenuineIntel") == 0 && f == 6) {
    double avx512 = 0;
    switch (m) {
      case 0x55:
        ci->core = "Intel Skylake-SP/Cascade Lake";
        avx512 = 64;
        ci->note = "Xeon Bronze, Silver and some Gold 5xxx have one 512-bit FMA unit: 32";
        break;
      case 0x6a:
      case 0x6c:
        ci->core = "Intel Ice Lake-SP";
        avx512 = 64;
        break;
      case 0x8f:
        ci->core = "Intel Sapphire Rapids";
        avx512 = 64;
        break;
      case 0xcf:
        ci->core = "Intel Emerald Rapids";
        avx512 = 64;
        break;
      case 0xad:
      case 0xae:
        ci->core = "Intel Granite Rapids";
        avx512 = 64;
        break;
      case 0x7d:
      case 0x7e:
      case 0x8c:
      case 0x8d:
      case 0xa7:
      case 0x66:
        ci->core = "Intel Ice Lake/Tiger Lake/Rocket Lake client";
        avx512 = 32;
        break;
      case 0x3c:
      case 0x3f:
      case 0x45:
      case 0x46:
        ci->core = "Intel Haswell";
        break;
      case 0x3d:
      case 0x47:
      case 0x4f:
      case 0x56:
        ci->core = "Intel Broadwell";
        break;
      case 0x4e:
      case 0x5e:
      case 0x8e:
      case 0x9e:
      case 0xa5:
      case 0xa6:
        ci->core = "Intel Skylake client (Kaby/Coffee/Comet Lake)";
        break;
      case 0x97:
      case 0x9a:
      case 0xb7:
      case 0xba:
      case 0xbf:
        ci->core = "Intel Alder/Raptor Lake";
        ci->note = "P-cores; an E-core has half the FMA throughput";
        break;
      default:
        ci->core = "unknown Intel core";
        ci->note = "not in the table: assumed two FMA units of the ISA's width";
        avx512 = 64;
    }
    ci->flop_per_cycle = isa == ISA_AVX512 ? avx512 : isa == ISA_AVX2 ? 32 : 8;
    return;
  }
  if (strcmp(ci->vendor, "AuthenticAMD") == 0 || strcmp(ci->vendor, "HygonGenuine") == 0) {
    double avx2 = 32, avx512 = 0;
    if (f == 0x17 && m >= 0x30)
      ci->core = "AMD Zen 2";
    else if (f == 0x17 || f == 0x18)
      ci->core = "AMD Zen/Zen+", avx2 = 16; /* 2 x 128-bit */
    else if (f == 0x19 &&
             ((m >= 0x10 && m <= 0x1f) || (m >= 0x60 && m <= 0x7f) || (m >= 0xa0 && m <= 0xaf)))
      ci->core = "AMD Zen 4", avx512 = 32; /* 512-bit ops on the 256-bit pipes */
    else if (f == 0x19)
      ci->core = "AMD Zen 3";
    else if (f == 0x1a) {
      ci->core = "AMD Zen 5", avx512 = 64;
      ci->note = "mobile Zen 5 (Strix) has 256-bit pipes: avx512 32";
    } else {
      ci->core = "unknown AMD core", avx512 = 32;
      ci->note = "not in the table: assumed Zen 3/4 throughput";
    }
    ci->flop_per_cycle = isa == ISA_AVX512 ? avx512 : isa == ISA_AVX2 ? avx2 : 16;
    return;
  }
  ci->core = "unknown vendor";
  ci->note = "not in the table: assumed two FMA units of the ISA's width";
  ci->flop_per_cycle = isa == ISA_AVX512 ? 64 : isa == ISA_AVX2 ? 32 : 8;
}

/* /proc/cpuinfo's "cpu MHz" of the first CPU, in GHz; 0 if unreadable. */
static double nominal_ghz(void) {
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (!f) return 0;
  char line[512];
  double mhz = 0;
  while (fgets(line, sizeof line, f))
    if (strncmp(line, "cpu MHz", 7) == 0) {
      const char *colon = strchr(line, ':');
      if (colon) mhz = atof(colon + 1);
      break;
    }
  fclose(f);
  return mhz / 1000;
}

/* The 1-minute load average; -1 if unreadable. */
static double load1(void) {
  FILE *f = fopen("/proc/loadavg", "r");
  double l = -1;
  if (f) {
    if (fscanf(f, "%lf", &l) != 1) l = -1;
    fclose(f);
  }
  return l;
}

/* Physical cores among the online CPUs (SMT siblings share FMA pipes). */
static int physical_cores(int online) {
  FILE *f = fopen("/sys/devices/system/cpu/cpu0/topology/thread_siblings_list", "r");
  if (!f) return online;
  char s[64] = "";
  int per_core = 1;
  if (fgets(s, sizeof s, f)) {
    if (strchr(s, ','))
      per_core = 2;
    else if (strchr(s, '-')) { /* "0-1" */
      int lo = 0, hi = 0;
      if (sscanf(s, "%d-%d", &lo, &hi) == 2 && hi > lo) per_core = hi - lo + 1;
    }
  }
  fclose(f);
  return online / per_core > 0 ? online / per_core : 1;
}

static int usage(void) {
  fputs("usage: fma_peak [--threads N] [--trials K] [--ms MS] [--isa avx512|avx2|baseline]\n",
        stderr);
  return 2;
}

static int isa_from_name(const char *s, enum isa *out) {
  for (int i = 0; i < 3; i++)
    if (strcmp(s, isa_names[i]) == 0) return *out = (enum isa)i, 0;
  return -1;
}

int main(int argc, char **argv) {
  int threads = 2, trials = 5;
  double ms = 200;
  __builtin_cpu_init();
  /* dsc's avx512 (program/cpu_isa.c): the subsets its kernels use */
  int has512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  int has2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  enum isa host = has512 ? ISA_AVX512 : has2 ? ISA_AVX2 : ISA_BASELINE, isa = host;
  const char *want = getenv("DSC_CPU_ISA");
  if (want && !*want) want = NULL;
  for (int i = 1; i < argc; i++) {
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!v) return usage();
    if (strcmp(argv[i], "--threads") == 0)
      threads = atoi(v);
    else if (strcmp(argv[i], "--trials") == 0)
      trials = atoi(v);
    else if (strcmp(argv[i], "--ms") == 0)
      ms = atof(v);
    else if (strcmp(argv[i], "--isa") == 0)
      want = v;
    else
      return usage();
    i++;
  }
  if (threads < 1 || threads > 1024 || trials < 1 || trials > 1000 || !(ms > 0 && ms < 60000))
    return usage();
  if (want) {
    if (isa_from_name(want, &isa) != 0)
      return fprintf(stderr, "fma_peak: unknown ISA '%s' (avx512, avx2 or baseline)\n", want), 2;
    if (isa > host)
      return fprintf(stderr, "fma_peak: ISA '%s' is not available here (the CPU has %s)\n", want,
                     isa_names[host]),
             2;
  }

  double load_before = load1();
  int64_t iters = calibrate(isa, 0, ms);
  int64_t clock_iters = calibrate(isa, 1, ms / 4);

  pthread_barrier_t start, stop;
  pthread_barrier_init(&start, NULL, (unsigned)threads + 1);
  pthread_barrier_init(&stop, NULL, (unsigned)threads + 1);
  worker *ws = calloc((size_t)threads, sizeof *ws);
  pthread_t *tids = calloc((size_t)threads, sizeof *tids);
  if (!ws || !tids) return fputs("fma_peak: out of memory\n", stderr), 1;
  for (int i = 0; i < threads; i++) {
    ws[i] = (worker){&start, &stop, clock_iters, iters, isa, trials, 0};
    if (pthread_create(&tids[i], NULL, run_worker, &ws[i]) != 0)
      return fputs("fma_peak: cannot start a thread\n", stderr), 1;
  }
  double clock = 0, best = 0, sum = 0;
  for (int t = 0; t < 2 * trials; t++) {
    pthread_barrier_wait(&start);
    double t0 = now_s();
    pthread_barrier_wait(&stop);
    double dt = now_s() - t0;
    if (t % 2 == 0) {
      double ghz = CLOCK_CYCLES_PER_ITER * (double)clock_iters / dt * 1e-9;
      if (ghz > clock) clock = ghz;
      continue;
    }
    double gf = flops_per_iter(isa) * (double)iters * threads / dt * 1e-9;
    sum += gf;
    if (gf > best) best = gf;
  }
  float check = 0;
  for (int i = 0; i < threads; i++) {
    pthread_join(tids[i], NULL);
    check += ws[i].result;
  }
  pthread_barrier_destroy(&start);
  pthread_barrier_destroy(&stop);
  free(ws);
  free(tids);

  core_info ci;
  read_cpuid(&ci);
  classify(&ci, isa);
  int online = (int)sysconf(_SC_NPROCESSORS_ONLN);
  int phys = physical_cores(online > 0 ? online : 1);
  int cores = threads < phys ? threads : phys;
  double expected = ci.flop_per_cycle * cores * clock, nominal = nominal_ghz();
  double frac = expected > 0 ? best / expected : 0;
  char warning[512] = "";
  if (frac < 0.8)
    snprintf(warning, sizeof warning,
             "measured %.1f GFLOP/s is %.0f%% of the expected %.1f (%s, %s: %.0f FLOP/cycle x %d "
             "core(s) x %.2f GHz): other load on the cores (load average %.2f before), SMT "
             "siblings or a vCPU that shares its core, a lower clock for wide vectors, or a "
             "core the table has wrong%s%s",
             best, 100 * frac, expected, ci.core, isa_names[isa], ci.flop_per_cycle, cores, clock,
             load_before, *ci.note ? "; " : "", ci.note);
  if (*warning) fprintf(stderr, "fma_peak: WARNING: %s\n", warning);

  /* check is printed so the work cannot be optimised away. */
  printf(
      "{\"impl\":\"fma_peak\",\"isa\":\"%s\",\"threads\":%d,\"trials\":%d,\"gflops\":%.1f,"
      "\"gflops_mean\":%.1f,\"expected_gflops\":%.1f,\"pct_expected\":%.1f,"
      "\"clock_ghz\":%.3f,\"clock_source\":\"measured: %d threads of dependent imul chains\","
      "\"nominal_ghz\":%.3f,\"expected_gflops_nominal\":%.1f,\"flop_per_cycle\":%.0f,\"cores\":%d,"
      "\"core\":\"%s\","
      "\"cpu\":\"%s\",\"vendor\":\"%s\",\"family\":%u,\"model\":%u,\"chains\":%d,"
      "\"load1_before\":%.2f,\"note\":\"%s\",\"warning\":\"%s\",\"check\":%.3g}\n",
      isa_names[isa], threads, trials, best, sum / trials, expected, 100 * frac, clock, threads,
      nominal, ci.flop_per_cycle * cores * nominal, ci.flop_per_cycle, cores, ci.core, ci.brand,
      ci.vendor, ci.family, ci.model,
      isa == ISA_AVX512 ? FMA_CHAINS
      : isa == ISA_AVX2 ? FMA_CHAINS_AVX2
                        : FMA_CHAINS_SSE,
      load_before, ci.note, warning, (double)check);
  return 0;
}
