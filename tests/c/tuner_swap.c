/*
 * Live table swaps against concurrent lookups, for Lagom's tuner plugin: compiled together with
 * nccl_env/plugin/lagom_tuner.c under ASan+UBSan and under ThreadSanitizer by tests/test_plugin_fuzz.py.
 *
 *   tuner_swap TMPDIR SWAPS RACE_ROUNDS
 *
 * K tables, each covering every allreduce size with two lines whose channel counts (2k+1, 2k+2) say which
 * table and line they are, behind a table-specific number of filler lines that never match here.
 * Phase 1: reader threads (ABI v4-v6, re-initialising now and then) call getCollInfo and getChunkSize and
 * check that each answer is one that one of the K tables gives for that size, whole; a counter thread reads
 * and resets the per-entry call counts (each read must have the size of one of the tables); the main thread
 * swaps tables at least SWAPS times (and until the readers made as many lookups) through lagom_tuner_set_table, lagom_tuner_load_file and lagom_tuner_reload.
 * Phase 2: threads making a known number of calls on one table; the per-entry counts must be exact.
 * Phase 3: communicators initialising (which re-reads NCCL_TUNER_CONFIG_FILE) while the main thread sets a
 * table through the C API, RACE_ROUNDS times: once set, that table must stay (an init may not overwrite it).
 * Prints the counts; a broken promise aborts with "SWAP FAILURE".
 */
#define _POSIX_C_SOURCE 200809L

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lagom_tuner_abi.h"

extern const lagomTuner_v4_t ncclTunerPlugin_v4;
extern const lagomTuner_v5_t ncclTunerPlugin_v5;
extern const lagomTuner_v6_t ncclTunerPlugin_v6;
int lagom_tuner_set_table(const char* csv_text);
int lagom_tuner_load_file(const char* path);
int lagom_tuner_reload(void);
int lagom_tuner_entry_count(void);
int lagom_tuner_entry_calls(uint64_t* collInfoCalls, uint64_t* chunkSizeCalls, int capacity, uint64_t* generation);
void lagom_tuner_reset_entry_calls(void);

#define K 16              /* tables */
#define FILLER 5          /* table k has k * FILLER filler lines before its two allreduce lines */
#define READERS 4
#define MAX_ENTRIES (K * FILLER + 2)
#define ALLREDUCE 4
#define TREE 0
#define RING 1
#define LL 0
#define SIMPLE 2
#define NUM_ALGO 7
#define NUM_PROTO 3

#define FAIL(...) do { fprintf(stderr, "SWAP FAILURE: " __VA_ARGS__); fprintf(stderr, "\n"); abort(); } while (0)

static char* g_text[K];
static char g_path[K][4096];
static atomic_int g_stop;
static atomic_llong g_lookups, g_chunks, g_counterReads;

static uint64_t split(int k) { return (uint64_t)1 << (10 + k); } /* line A: [0, split], line B: (split, inf) */
static int entries_of(int k) { return k * FILLER + 2; }
static size_t chunk_of(int k, int line) { return (size_t)(k + 1) * 1024 + (size_t)line * 512; }

static void make_tables(const char* dir) {
  for (int k = 0; k < K; k++) {
    size_t cap = 256 * (size_t)(entries_of(k) + 1), n = 0;
    g_text[k] = malloc(cap);
    for (int i = 0; i < k * FILLER; i++) /* other shapes, collectives and sizes: never match the readers */
      n += (size_t)snprintf(g_text[k] + n, cap - n, "allgather,%d,-1,ring,simple,1,99,-1\n", i);
    n += (size_t)snprintf(g_text[k] + n, cap - n, "allreduce,0,%llu,ring,simple,%d,-1,-1,-1,-1,chunk_bytes=%zu\n",
                          (unsigned long long)split(k), 2 * k + 1, chunk_of(k, 0));
    snprintf(g_text[k] + n, cap - n, "allreduce,%llu,-1,tree,ll,%d,-1,-1,-1,-1,chunk_bytes=%zu\n",
             (unsigned long long)split(k) + 1, 2 * k + 2, chunk_of(k, 1));
    snprintf(g_path[k], sizeof g_path[k], "%s/swap%d.csv", dir, k);
    FILE* f = fopen(g_path[k], "w");
    if (!f) FAIL("cannot write %s", g_path[k]);
    fputs(g_text[k], f);
    fclose(f);
  }
}

static uint64_t next(uint64_t* s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

typedef struct {
  int abi;
  void* ctx;
} Comm;

static void open_comm(Comm* c, int abi) {
  c->abi = abi;
  c->ctx = NULL;
  ncclResult_t rc = abi == 4 ? ncclTunerPlugin_v4.init(8, 1, NULL, &c->ctx)
                  : abi == 5 ? ncclTunerPlugin_v5.init(&c->ctx, 1, 8, 1, NULL, NULL, NULL)
                             : ncclTunerPlugin_v6.init(&c->ctx, 1, 8, 1, NULL, NULL, NULL);
  if (rc != ncclSuccess || !c->ctx) FAIL("init v%d returned %d", abi, rc);
}

static void close_comm(Comm* c) {
  ncclResult_t rc = c->abi == 4 ? ncclTunerPlugin_v4.destroy(c->ctx)
                  : c->abi == 5 ? ncclTunerPlugin_v5.finalize(c->ctx)
                                : ncclTunerPlugin_v6.finalize(c->ctx);
  if (rc != ncclSuccess) FAIL("finalize v%d returned %d", c->abi, rc);
}

/* getCollInfo for an allreduce of nBytes: the channels set and the pair zeroed (-1 when none). */
static int coll_info(const Comm* c, uint64_t nBytes, int* algo, int* proto) {
  float cost[NUM_ALGO * NUM_PROTO];
  for (int i = 0; i < NUM_ALGO * NUM_PROTO; i++) cost[i] = 10.0f + (float)i; /* every pair usable */
  int nChannels = 0;
  const lagomTuner_v4_t* p4 = &ncclTunerPlugin_v4;
  ncclResult_t rc = c->abi == 4 ? p4->getCollInfo(c->ctx, ALLREDUCE, nBytes, 1, (float**)cost, NUM_ALGO, NUM_PROTO,
                                                  0, &nChannels)
                  : c->abi == 5 ? ncclTunerPlugin_v5.getCollInfo(c->ctx, ALLREDUCE, nBytes, 1, (float**)cost,
                                                                 NUM_ALGO, NUM_PROTO, 0, &nChannels)
                                : ncclTunerPlugin_v6.getCollInfo(c->ctx, ALLREDUCE, nBytes, 1, (float**)cost,
                                                                 NUM_ALGO, NUM_PROTO, 0, &nChannels);
  if (rc != ncclSuccess) FAIL("getCollInfo returned %d", rc);
  *algo = *proto = -1;
  for (int i = 0; i < NUM_ALGO * NUM_PROTO; i++)
    if (cost[i] == 0.0f) {
      if (*algo >= 0) FAIL("two pairs zeroed");
      *algo = i / NUM_PROTO;
      *proto = i % NUM_PROTO;
    }
  return nChannels;
}

/* The line (0: A, 1: B) of table k that an allreduce of nBytes matches. */
static int line_for(int k, uint64_t nBytes) { return nBytes <= split(k) ? 0 : 1; }

static void check_answer(uint64_t nBytes, int channels, int algo, int proto) {
  if (channels < 1 || channels > 2 * K) FAIL("bytes %llu: channels %d from no table", (unsigned long long)nBytes,
                                             channels);
  int k = (channels - 1) / 2, line = (channels - 1) % 2;
  if (line_for(k, nBytes) != line) FAIL("bytes %llu: table %d line %d does not cover it", (unsigned long long)nBytes,
                                        k, line);
  int wantAlgo = line ? TREE : RING, wantProto = line ? LL : SIMPLE;
  if (algo != wantAlgo || proto != wantProto)
    FAIL("bytes %llu: channels of table %d line %d but pair %d/%d (a mixed answer)", (unsigned long long)nBytes, k,
         line, algo, proto);
}

/* A getChunkSize answer for (nBytes, algo, proto) that one of the tables gives. */
static void check_chunk(uint64_t nBytes, int algo, int proto, size_t chunk, size_t was) {
  for (int k = 0; k < K; k++) {
    int line = line_for(k, nBytes);
    int pairOk = algo == (line ? TREE : RING) && proto == (line ? LL : SIMPLE);
    if (pairOk ? chunk == chunk_of(k, line) : chunk == was) return;
  }
  FAIL("bytes %llu algo %d proto %d: chunk %zu from no table", (unsigned long long)nBytes, algo, proto, chunk);
}

static void* reader(void* arg) {
  uint64_t s = (uint64_t)(uintptr_t)arg * 0x9E3779B97F4A7C15ULL + 1;
  Comm c;
  open_comm(&c, 4 + (int)(next(&s) % 3));
  for (long i = 0; !atomic_load(&g_stop); i++) {
    if (i % 500 == 499) { /* a communicator ends and another starts (init may re-read the file) */
      close_comm(&c);
      open_comm(&c, 4 + (int)(next(&s) % 3));
    }
    uint64_t nBytes = next(&s) >> (34 + next(&s) % 30);
    int algo, proto;
    int channels = coll_info(&c, nBytes, &algo, &proto);
    check_answer(nBytes, channels, algo, proto);
    atomic_fetch_add(&g_lookups, 1);
    if (c.abi == 6) {
      size_t was = 3, chunk = was;
      if (ncclTunerPlugin_v6.getChunkSize(c.ctx, ALLREDUCE, nBytes, algo, proto, channels, &chunk) != ncclSuccess)
        FAIL("getChunkSize failed");
      check_chunk(nBytes, algo, proto, chunk, was);
      atomic_fetch_add(&g_chunks, 1);
    }
  }
  close_comm(&c);
  return NULL;
}

static void* counter_reader(void* arg) {
  (void)arg;
  uint64_t coll[MAX_ENTRIES], chunk[MAX_ENTRIES], generation, last = 0;
  for (long i = 0; !atomic_load(&g_stop); i++) {
    int n = lagom_tuner_entry_calls(coll, chunk, MAX_ENTRIES, &generation);
    if (n == 0 || n > MAX_ENTRIES || (n - 2) % FILLER != 0) FAIL("counts of %d entries: no such table", n);
    if (generation < last) FAIL("table generation went back from %llu to %llu", (unsigned long long)last,
                                (unsigned long long)generation);
    last = generation;
    for (int j = 0; j < n - 2; j++)
      if (coll[j] || chunk[j]) FAIL("filler entry %d of a %d-entry table counted a call", j, n);
    if (i % 64 == 0) lagom_tuner_reset_entry_calls();
    atomic_fetch_add(&g_counterReads, 1);
  }
  return NULL;
}

typedef struct {
  int index, calls;
  long long answered[2];
} ExactArgs;

static void* exact_caller(void* p) {
  ExactArgs* a = p;
  uint64_t s = (uint64_t)a->index * 7919 + 3;
  Comm c;
  open_comm(&c, 6);
  for (int i = 0; i < a->calls; i++) {
    uint64_t nBytes = next(&s) >> (34 + next(&s) % 30);
    int algo, proto, channels = coll_info(&c, nBytes, &algo, &proto);
    a->answered[(channels - 1) % 2]++;
    size_t chunk = 1;
    ncclTunerPlugin_v6.getChunkSize(c.ctx, ALLREDUCE, nBytes, algo, proto, channels, &chunk);
  }
  close_comm(&c);
  return NULL;
}

static atomic_long g_inits[READERS]; /* inits completed by each initer thread */

static void* initer(void* arg) {
  atomic_long* done = arg;
  while (!atomic_load(&g_stop)) {
    Comm c;
    open_comm(&c, 5);
    close_comm(&c);
    atomic_fetch_add(done, 1);
  }
  return NULL;
}

int main(int argc, char** argv) {
  if (argc != 4) { fprintf(stderr, "usage: %s TMPDIR SWAPS RACE_ROUNDS\n", argv[0]); return 2; }
  int swaps = atoi(argv[2]), rounds = atoi(argv[3]);
  make_tables(argv[1]);
  setenv("NCCL_TUNER_CONFIG_FILE", g_path[0], 1); /* before any thread: reload and init read table 0 */
  if (lagom_tuner_reload() != entries_of(0)) FAIL("table 0 did not load");

  /* Phase 1: lookups and counter reads against swaps. */
  pthread_t th[READERS + 1];
  for (int i = 0; i < READERS; i++) pthread_create(&th[i], NULL, reader, (void*)(uintptr_t)(i + 1));
  pthread_create(&th[READERS], NULL, counter_reader, NULL);
  uint64_t s = 42;
  int swapped = 0;
  for (; swapped < swaps || atomic_load(&g_lookups) < swaps || atomic_load(&g_counterReads) == 0; swapped++) {
    int k = (int)(next(&s) % K), how = (int)(next(&s) % 8);
    int got = how == 0 ? lagom_tuner_reload() : how < 3 ? lagom_tuner_load_file(g_path[k])
                                                        : lagom_tuner_set_table(g_text[k]);
    if (got != entries_of(how == 0 ? 0 : k)) FAIL("swap %d returned %d entries", swapped, got);
  }
  atomic_store(&g_stop, 1);
  for (int i = 0; i <= READERS; i++) pthread_join(th[i], NULL);

  /* Phase 2: exact counts on one table. */
  int k = 3;
  lagom_tuner_set_table(g_text[k]);
  ExactArgs ex[READERS];
  for (int i = 0; i < READERS; i++) {
    ex[i] = (ExactArgs){.index = i, .calls = 2000, .answered = {0, 0}};
    pthread_create(&th[i], NULL, exact_caller, &ex[i]);
  }
  for (int i = 0; i < READERS; i++) pthread_join(th[i], NULL);
  uint64_t coll[MAX_ENTRIES], chunk[MAX_ENTRIES];
  int n = lagom_tuner_entry_calls(coll, chunk, MAX_ENTRIES, NULL);
  long long want[2] = {0, 0};
  for (int i = 0; i < READERS; i++) { want[0] += ex[i].answered[0]; want[1] += ex[i].answered[1]; }
  if (n != entries_of(k)) FAIL("table %d has %d entries", k, n);
  for (int line = 0; line < 2; line++)
    if ((long long)coll[n - 2 + line] != want[line] || (long long)chunk[n - 2 + line] != want[line])
      FAIL("line %d answered %lld calls, counted %llu getCollInfo and %llu getChunkSize", line, want[line],
           (unsigned long long)coll[n - 2 + line], (unsigned long long)chunk[n - 2 + line]);
  if (want[0] == 0 || want[1] == 0) FAIL("phase 2 did not reach both lines");

  /* Phase 3: a table set through the C API is not overwritten by a concurrent communicator init. */
  atomic_store(&g_stop, 0);
  for (int i = 0; i < READERS; i++) pthread_create(&th[i], NULL, initer, &g_inits[i]);
  int kept = 0;
  for (int r = 0; r < rounds; r++) {
    lagom_tuner_reload(); /* back to the file: inits re-read it */
    int want = 1 + r % (K - 1);
    lagom_tuner_set_table(g_text[want]);
    uint64_t g0, g;
    lagom_tuner_entry_calls(NULL, NULL, 0, &g0);
    long begun[READERS];
    for (int i = 0; i < READERS; i++) begun[i] = atomic_load(&g_inits[i]);
    for (int i = 0; i < READERS; i++) /* until each initer has run a whole init that began after the set */
      while (atomic_load(&g_inits[i]) < begun[i] + 2) sched_yield();
    int got = lagom_tuner_entry_count();
    if (got != entries_of(want)) FAIL("round %d: table set through the API replaced by an init (%d entries)", r, got);
    lagom_tuner_entry_calls(NULL, NULL, 0, &g);
    if (g != g0) FAIL("round %d: a table was installed after lagom_tuner_set_table", r);
    kept++;
  }
  atomic_store(&g_stop, 1);
  for (int i = 0; i < READERS; i++) pthread_join(th[i], NULL);

  lagom_tuner_set_table(NULL);
  for (int i = 0; i < K; i++) free(g_text[i]);
  printf("swaps=%d lookups=%lld chunk_calls=%lld counter_reads=%lld exact_calls=%lld race_rounds=%d\n", swapped,
         (long long)atomic_load(&g_lookups), (long long)atomic_load(&g_chunks), (long long)atomic_load(&g_counterReads),
         want[0] + want[1], kept);
  return 0;
}
