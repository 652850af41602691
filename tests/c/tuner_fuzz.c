/*
 * Fuzz driver for Lagom's tuner plugin, compiled together with
 * nccl_env/plugin/lagom_tuner.c under AddressSanitizer + UndefinedBehaviorSanitizer
 * by tests/test_plugin_fuzz.py.
 *
 *   tuner_fuzz SEED TMPDIR FILES CALLS_PER_FILE
 *
 * For each of FILES random table files (mutated valid lines, random bytes, huge
 * lines, NUL bytes) it points NCCL_TUNER_CONFIG_FILE at the file, inits a random
 * ABI version and makes CALLS_PER_FILE random getCollInfo / getChunkSize calls with
 * random cost tables, checking the plugin's promises after every call: ncclSuccess,
 * no -1 (ignored) entry revived, at most one cost changed and only to 0.0,
 * nChannels 0 or 1-64. Then a threaded phase: readers call getCollInfo while the
 * main thread replaces the table through lagom_tuner_set_table. Prints the counts;
 * any broken promise aborts.
 */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lagom_tuner_abi.h"

extern const lagomTuner_v2_t ncclTunerPlugin_v2;
extern const lagomTuner_v3_t ncclTunerPlugin_v3;
extern const lagomTuner_v4_t ncclTunerPlugin_v4;
extern const lagomTuner_v5_t ncclTunerPlugin_v5;
extern const lagomTuner_v6_t ncclTunerPlugin_v6;
int lagom_tuner_set_table(const char* csv_text);
int lagom_tuner_entry_count(void);
int lagom_tuner_reload(void);

static __thread uint64_t rng;
static long long g_calls = 0, g_logs = 0, g_effects = 0;

static uint64_t rnd(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return rng;
}
static int pick(int n) { return (int)(rnd() % (uint64_t)n); }

#define FAIL(...) do { fprintf(stderr, "FUZZ FAILURE: " __VA_ARGS__); fprintf(stderr, "\n"); abort(); } while (0)

static void logger(ncclDebugLogLevel level, unsigned long flags, const char* file, int line, const char* fmt, ...) {
  (void)level; (void)flags; (void)file; (void)line;
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  __atomic_add_fetch(&g_logs, 1, __ATOMIC_RELAXED);
}

/* Each pool lists valid tokens first (the first *_VALID of them), then invalid ones. */
static const char* COLLS[] = {"allreduce", "allgather", "reducescatter", "broadcast", "reduce", "-1", "any",
                              "AllReduce", "all_gather", "sendrecv", "", "bogus"};
#define COLLS_VALID 9
static const char* ALGOS[] = {"tree", "ring", "collnet_direct", "collnet_chain", "nvls", "nvls_tree", "pat", "-1",
                              "PAT", "Ring", "collnetdirect", "xyz", ""};
#define ALGOS_VALID 11
static const char* PROTOS[] = {"ll", "ll128", "simple", "-1", "LL128", "Simple", "q", ""};
#define PROTOS_VALID 6
static const char* INTS[] = {"-1", "1", "2", "4", "8", "16", "64", "3", "+2", "0", "65", "-7", "1x", "",
                             "99999999999999999999999", "-9223372036854775808", "2147483648"};
#define INTS_VALID 2 /* valid for every integer field including regBuff */
static const char* BYTES[] = {"0", "-1", "1", "65536", "1048576", "4294967295", "18446744073709551615", "+7",
                              "0000000000000000000000000000001", "18446744073709551616", "-5", "12abc"};
#define BYTES_VALID 9
static const char* EXTRAS[] = {"chunk_bytes=65536", "chunk_bytes=-1", "chunk_bytes=524288", "chunk_bytes = 131072",
                               "chunk_bytes=0", "chunk_bytes=1073741825", "foo=1", "chunk_bytes=", "="};
#define EXTRAS_VALID 4

static size_t append(char* out, size_t n, size_t cap, const char* s) {
  size_t len = strlen(s);
  if (n + len >= cap) return n;
  memcpy(out + n, s, len);
  return n + len;
}

/* One line of mostly plausible tokens. */
static size_t gen_line(char* out, size_t n, size_t cap) {
  int valid = pick(2);
#define POOL(arr, nvalid) (valid ? (nvalid) : (int)(sizeof arr / sizeof *arr))
  int fields = (valid || pick(4)) ? 8 + pick(3) : pick(15);
  for (int i = 0; i < fields; i++) {
    if (i) n = append(out, n, cap, ",");
    const char* tok;
    char num[32];
    switch (i) {
      case 0: tok = COLLS[pick(POOL(COLLS, COLLS_VALID))]; break;
      case 1: tok = valid ? "0" : BYTES[pick(POOL(BYTES, BYTES_VALID))]; break;
      case 2:
        if (pick(2)) { snprintf(num, sizeof num, "%llu", (unsigned long long)(rnd() >> pick(64))); tok = num; }
        else tok = BYTES[pick(POOL(BYTES, BYTES_VALID))];
        break;
      case 3: tok = ALGOS[pick(POOL(ALGOS, ALGOS_VALID))]; break;
      case 4: tok = PROTOS[pick(POOL(PROTOS, PROTOS_VALID))]; break;
      case 5: tok = valid ? INTS[pick(7)] : INTS[pick(POOL(INTS, INTS_VALID))]; break;
      default: tok = INTS[pick(POOL(INTS, INTS_VALID))]; break;
    }
    if (pick(10) == 0) n = append(out, n, cap, " ");
    n = append(out, n, cap, tok);
  }
  int extras = pick(3) ? 0 : (valid ? 1 : 1 + pick(3));
  for (int i = 0; i < extras; i++) {
    n = append(out, n, cap, ",");
    n = append(out, n, cap, EXTRAS[pick(POOL(EXTRAS, EXTRAS_VALID))]);
  }
  if (pick(8) == 0) n = append(out, n, cap, " # comment, with, commas");
  n = append(out, n, cap, pick(10) ? "\n" : "\r\n");
  return n;
}

/* A random table: valid-ish lines, mutated bytes, NULs, random garbage or a huge line. */
static size_t gen_table(char* out, size_t cap) {
  size_t n = 0;
  int kind = pick(10);
  if (kind == 0) { /* random bytes */
    size_t len = (size_t)pick(4096);
    for (size_t i = 0; i < len && n + 1 < cap; i++) out[n++] = (char)pick(256);
    return n;
  }
  if (kind == 1) { /* one huge line */
    size_t len = 10000 + (size_t)pick(30000);
    for (size_t i = 0; i < len && n + 1 < cap; i++) out[n++] = pick(5) ? (char)('0' + pick(10)) : ',';
    return n;
  }
  int lines = pick(kind == 2 ? 400 : 40);
  for (int i = 0; i < lines; i++) n = gen_line(out, n, cap);
  int flips = kind >= 7 ? pick(20) : 0;
  for (int i = 0; i < flips && n > 0; i++) out[pick((int)n)] = (char)pick(256);
  if (kind == 6 && n > 0) n = (size_t)pick((int)n); /* truncated */
  return n;
}

static float random_cost(void) {
  switch (pick(8)) {
    case 0: case 1: case 2: return -1.0f;
    case 3: return 0.0f;
    case 4: return NAN;
    case 5: return INFINITY;
    default: return (float)(rnd() % 100000) / 10.0f;
  }
}

static size_t random_bytes(void) {
  switch (pick(5)) {
    case 0: return 0;
    case 1: return SIZE_MAX - (size_t)pick(3);
    case 2: return (size_t)1 << pick(40);
    default: return (size_t)(rnd() >> pick(64));
  }
}

typedef struct {
  int abi;
  void* ctx;
} Comm;

static void open_comm(Comm* c, int abi) {
  size_t nRanks = (size_t)(1 + pick(16)), nNodes = (size_t)(1 + pick(4));
  if (pick(50) == 0) nRanks = SIZE_MAX;
  ncclDebugLogger_t log = pick(4) ? logger : NULL;
  ncclResult_t rc;
  c->abi = abi;
  c->ctx = NULL;
  switch (abi) {
    case 2: rc = ncclTunerPlugin_v2.init(nRanks, nNodes, log, &c->ctx); break;
    case 3: rc = ncclTunerPlugin_v3.init(nRanks, nNodes, log, &c->ctx); break;
    case 4: rc = ncclTunerPlugin_v4.init(nRanks, nNodes, log, &c->ctx); break;
    case 5: rc = ncclTunerPlugin_v5.init(&c->ctx, rnd(), nRanks, nNodes, log, NULL, NULL); break;
    default: rc = ncclTunerPlugin_v6.init(&c->ctx, rnd(), nRanks, nNodes, log, NULL, NULL); break;
  }
  if (rc != ncclSuccess || !c->ctx) FAIL("init v%d returned %d", abi, rc);
}

static void close_comm(Comm* c) {
  ncclResult_t rc = c->abi == 2 ? ncclTunerPlugin_v2.destroy(c->ctx)
                  : c->abi == 3 ? ncclTunerPlugin_v3.destroy(c->ctx)
                  : c->abi == 4 ? ncclTunerPlugin_v4.destroy(c->ctx)
                  : c->abi == 5 ? ncclTunerPlugin_v5.finalize(c->ctx)
                                : ncclTunerPlugin_v6.finalize(c->ctx);
  if (rc != ncclSuccess) FAIL("finalize v%d returned %d", c->abi, rc);
}

static void one_call(Comm* c) {
  int coll = pick(25) - 3;
  size_t nBytes = random_bytes();
  int pipeOps = pick(4), regBuff = pick(2);
  int nChannels = 0;
  __atomic_add_fetch(&g_calls, 1, __ATOMIC_RELAXED);
  if (c->abi == 2) {
    int algo = -1, proto = -1;
    ncclResult_t rc = ncclTunerPlugin_v2.getCollInfo(c->ctx, coll, nBytes, pick(2), pick(2), pipeOps, &algo, &proto,
                                                     &nChannels);
    if (rc != ncclSuccess) FAIL("v2 getCollInfo returned %d", rc);
    if (algo < -1 || algo > 5 || proto < -1 || proto > 2 || ((algo < 0) != (proto < 0)))
      FAIL("v2 set algo %d proto %d", algo, proto);
  } else {
    int numAlgo = pick(6) ? 6 + pick(2) : pick(9);
    int numProto = pick(6) ? 3 : pick(4);
    size_t cells = (size_t)numAlgo * (size_t)numProto;
    float* table = malloc(sizeof(float) * (cells ? cells : 1)); /* exact size: ASan sees any overrun */
    float* before = malloc(sizeof(float) * (cells ? cells : 1));
    for (size_t i = 0; i < cells; i++) before[i] = table[i] = random_cost();
    ncclResult_t rc;
    if (c->abi == 3)
      rc = ncclTunerPlugin_v3.getCollInfo(c->ctx, coll, nBytes, pipeOps, (float**)table, numAlgo, numProto, &nChannels);
    else if (c->abi == 4)
      rc = ncclTunerPlugin_v4.getCollInfo(c->ctx, coll, nBytes, pipeOps, (float**)table, numAlgo, numProto, regBuff,
                                          &nChannels);
    else if (c->abi == 5)
      rc = ncclTunerPlugin_v5.getCollInfo(c->ctx, coll, nBytes, pipeOps, (float**)table, numAlgo, numProto, regBuff,
                                          &nChannels);
    else
      rc = ncclTunerPlugin_v6.getCollInfo(c->ctx, coll, nBytes, pipeOps, (float**)table, numAlgo, numProto, regBuff,
                                          &nChannels);
    if (rc != ncclSuccess) FAIL("v%d getCollInfo returned %d", c->abi, rc);
    int changed = 0;
    for (size_t i = 0; i < cells; i++) {
      int same = (isnan(before[i]) && isnan(table[i])) || before[i] == table[i];
      if (same) continue;
      changed++;
      if (!(before[i] >= 0.0f)) FAIL("ignored cost entry %zu revived (%f -> %f)", i, before[i], table[i]);
      if (table[i] != 0.0f) FAIL("cost entry %zu set to %f, not 0", i, table[i]);
    }
    if (changed > 1) FAIL("%d cost entries changed", changed);
    if (changed) __atomic_add_fetch(&g_effects, 1, __ATOMIC_RELAXED);
    free(table);
    free(before);
    if (c->abi == 6) {
      size_t chunk = (size_t)1 << pick(24), was = chunk;
      rc = ncclTunerPlugin_v6.getChunkSize(c->ctx, coll, nBytes, pick(8) - 1, pick(4) - 1, pick(65), &chunk);
      if (rc != ncclSuccess) FAIL("getChunkSize returned %d", rc);
      if (chunk != was && (chunk < 1 || chunk > ((size_t)1 << 30))) FAIL("chunk %zu out of range", chunk);
    }
  }
  if (nChannels < 0 || nChannels > 64) FAIL("nChannels %d", nChannels);
  if (nChannels > 0) __atomic_add_fetch(&g_effects, 1, __ATOMIC_RELAXED);
}

typedef struct {
  uint64_t seed;
  int calls;
} ReaderArgs;

static void* reader(void* p) {
  ReaderArgs* a = p;
  rng = a->seed;
  Comm c;
  open_comm(&c, 3 + pick(4));
  for (int i = 0; i < a->calls; i++) one_call(&c);
  close_comm(&c);
  return NULL;
}

int main(int argc, char** argv) {
  if (argc != 5) { fprintf(stderr, "usage: %s SEED TMPDIR FILES CALLS_PER_FILE\n", argv[0]); return 2; }
  rng = strtoull(argv[1], NULL, 10) * 2654435761ULL + 88172645463325252ULL;
  int files = atoi(argv[3]), callsPerFile = atoi(argv[4]);
  size_t cap = 1 << 20;
  char* buf = malloc(cap);
  char path[4096];
  snprintf(path, sizeof path, "%s/table.csv", argv[2]);
  setenv("NCCL_TUNER_CONFIG_FILE", path, 1);
  long long entries = 0;
  for (int f = 0; f < files; f++) {
    size_t n = gen_table(buf, cap);
    FILE* fp = fopen(path, "wb");
    if (!fp) FAIL("cannot write %s", path);
    fwrite(buf, 1, n, fp);
    fclose(fp);
    if (f % 50 == 49) setenv("NCCL_TUNER_CONFIG_FILE", "/nonexistent/lagom/table.csv", 1);
    Comm a, b;
    open_comm(&a, 2 + pick(5));
    open_comm(&b, 2 + pick(5));
    setenv("NCCL_TUNER_CONFIG_FILE", path, 1);
    entries += lagom_tuner_entry_count();
    for (int i = 0; i < callsPerFile; i++) one_call(pick(2) ? &a : &b);
    close_comm(&a);
    close_comm(&b);
    if (f % 10 == 0) { /* the live API on the same random text, as a string */
      buf[n < cap ? n : cap - 1] = '\0';
      lagom_tuner_set_table(buf);
      lagom_tuner_set_table(NULL);
      lagom_tuner_reload();
    }
  }
  /* Threaded phase: readers while the table is replaced. */
  enum { READERS = 4 };
  pthread_t th[READERS];
  ReaderArgs args[READERS];
  for (int i = 0; i < READERS; i++) {
    args[i].seed = rnd() | 1;
    args[i].calls = 5000;
    pthread_create(&th[i], NULL, reader, &args[i]);
  }
  for (int s = 0; s < 200; s++) {
    size_t n = 0;
    int lines = 1 + pick(30);
    for (int i = 0; i < lines; i++) n = gen_line(buf, n, cap - 1);
    buf[n] = '\0';
    lagom_tuner_set_table(buf);
  }
  for (int i = 0; i < READERS; i++) pthread_join(th[i], NULL);
  lagom_tuner_set_table(NULL);
  free(buf);
  printf("files=%d calls=%lld entries_loaded=%lld effects=%lld log_messages=%lld\n", files, g_calls, entries,
         g_effects, g_logs);
  return 0;
}
