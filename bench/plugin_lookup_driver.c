/*
 * Times the built tuner plugin's getCollInfo (ABI v4, what NCCL 2.24-2.27 calls; v5/v6
 * share the function) from C, as NCCL would call it. Driven by bench/plugin_lookup.py.
 *
 *   plugin_lookup_driver PLUGIN.so TABLE.csv QUERIES.txt SAMPLES CALLS_PER_SAMPLE
 *
 * QUERIES.txt: one "collType nBytes" per line, cycled through. Prints
 * "entries=N median_ns=X p10_ns=Y p90_ns=Z hits=H" (per call; each sample times
 * CALLS_PER_SAMPLE calls with a fresh cost table copy per call).
 */
#define _POSIX_C_SOURCE 200809L
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int (*init_t)(size_t, size_t, void*, void**);
typedef int (*get_t)(void*, int, size_t, int, float**, int, int, int, int*);
typedef struct { const char* name; init_t init; get_t getCollInfo; int (*destroy)(void*); } tuner_v4;

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static int cmp_d(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

static char* slurp(const char* path) {
  FILE* f = fopen(path, "rb");
  if (!f) { perror(path); exit(2); }
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char* s = malloc((size_t)n + 1);
  if (fread(s, 1, (size_t)n, f) != (size_t)n) { perror(path); exit(2); }
  s[n] = 0;
  fclose(f);
  return s;
}

int main(int argc, char** argv) {
  if (argc != 6) { fprintf(stderr, "usage: %s PLUGIN TABLE QUERIES SAMPLES CALLS\n", argv[0]); return 2; }
  void* h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!h) { fprintf(stderr, "%s\n", dlerror()); return 2; }
  tuner_v4* t = (tuner_v4*)dlsym(h, "ncclTunerPlugin_v4");
  int (*set_table)(const char*) = (int (*)(const char*))dlsym(h, "lagom_tuner_set_table");
  if (!t || !set_table) { fprintf(stderr, "symbols missing\n"); return 2; }
  char* table = slurp(argv[2]);
  int entries = set_table(table);
  char* qtext = slurp(argv[3]);
  int nq = 0, cap = 1024;
  int* qcoll = malloc(sizeof(int) * cap);
  size_t* qbytes = malloc(sizeof(size_t) * cap);
  for (char* line = strtok(qtext, "\n"); line; line = strtok(NULL, "\n")) {
    if (nq == cap) { cap *= 2; qcoll = realloc(qcoll, sizeof(int) * cap); qbytes = realloc(qbytes, sizeof(size_t) * cap); }
    unsigned long long b;
    if (sscanf(line, "%d %llu", &qcoll[nq], &b) == 2) { qbytes[nq] = (size_t)b; nq++; }
  }
  int samples = atoi(argv[4]), calls = atoi(argv[5]);
  void* ctx = NULL;
  if (t->init(8, 1, NULL, &ctx) != 0) return 2;
  static const float base[7][3] = {{40.1f, 30.2f, 35.5f}, {50.3f, 25.7f, 28.9f}, {-1, -1, -1}, {-1, -1, -1},
                                   {-1, -1, 22.0f}, {-1, -1, -1}, {-1, -1, 31.0f}};
  float cost[7][3];
  double* per = malloc(sizeof(double) * samples);
  long hits = 0;
  int q = 0;
  for (int s = 0; s < samples; s++) {
    double t0 = now_ns();
    for (int c = 0; c < calls; c++) {
      memcpy(cost, base, sizeof cost);
      int nCh = 0;
      t->getCollInfo(ctx, qcoll[q], qbytes[q], 1, (float**)cost, 7, 3, 0, &nCh);
      hits += nCh > 0;
      if (++q == nq) q = 0;
    }
    per[s] = (now_ns() - t0) / calls;
  }
  qsort(per, samples, sizeof(double), cmp_d);
  printf("entries=%d median_ns=%.1f p10_ns=%.1f p90_ns=%.1f hits=%ld\n", entries, per[samples / 2],
         per[samples / 10], per[samples * 9 / 10], hits);
  t->destroy(ctx);
  return 0;
}
