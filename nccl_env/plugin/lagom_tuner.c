/*
 * Lagom's NCCL tuner plugin.
 *
 * Exports ncclTunerPlugin_v2 .. ncclTunerPlugin_v7 (ABI declared in lagom_tuner_abi.h)
 * and a small C API (lagom_tuner_*) so that a process that loaded this library can
 * replace the table live. The table comes from NCCL_TUNER_CONFIG_FILE (default
 * ./nccl_tuner.conf), in NVIDIA's example CSV format plus Lagom's keyed extra fields;
 * docs/plugin.md describes the format and the matching rules.
 *
 * It never makes NCCL fail: a missing or malformed file, an unknown name or an
 * out-of-range number means "NCCL decides" for that line plus one warning through
 * NCCL's logger. One process-wide table sits behind a rwlock, so communicators may
 * call concurrently; each communicator's context holds only its rank/node counts
 * and logger.
 */
#define _GNU_SOURCE /* glibc's writer-preferring rwlock initializer; other libcs take the POSIX one */

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "lagom_tuner_abi.h"

#define LAGOM_EXPORT __attribute__((visibility("default")))

#define PLUGIN_NAME "Lagom"
#define ANY (-1)
#define UNKNOWN INT_MIN           /* an input NCCL does not pass to this call: not matched on */
#define NUM_COLLS (ncclFuncAllReduce + 1) /* the collectives a line can name: ncclFunc_t 0..4 */
#define NUM_BUCKETS (NUM_COLLS + 1) /* one per collective plus one for any other ncclFunc_t (any-lines only) */
#define MAX_CHANNELS 64           /* MAXCHANNELS from NCCL 2.25 (32 before; NCCL caps it) */
#define MAX_CHUNK_BYTES (1LL << 30)
#define MAX_FILE_BYTES (64L << 20)
#define MAX_FIELDS 32
#define MAX_WARNINGS_PER_LOAD 100
#define MAX_COST_ALGOS 64         /* sanity bounds on numAlgo x numProto: NCCL passes 6 or 7 x 3 */
#define MAX_COST_PROTOS 16
#define SCAN_WARN_LINES 2000      /* a miss scans ~0.5 ns a line (bench/plugin_lookup.py): past this, > 1 us a call */

typedef struct {
  uint64_t minBytes, maxBytes; /* inclusive */
  int64_t chunkBytes;          /* ANY = NCCL decides */
  int32_t coll, algo, proto, channels, nNodes, nRanks, pipeOps, regBuff; /* ANY = any / NCCL decides */
  int32_t line;
  atomic_int warned; /* "pair unusable" said once per entry */
} Entry;

/* The match fields of an Entry, packed for the lookup scan (40 bytes). */
typedef struct {
  uint64_t minBytes, maxBytes;
  int32_t nNodes, nRanks, pipeOps, regBuff;
  int32_t entry; /* index into Table.entries */
} Key;

typedef struct {
  Entry* entries;
  int n;
  int rejected;
  /* The lines a call for collective c can match (c's own and any-collective lines), in file order:
   * scan[scanStart[bucket_of(c)] .. scanStart[bucket_of(c) + 1]). A tuned table has tens of lines, and a scan
   * of 1,000 stays well under NCCL's microsecond (bench/plugin_lookup.py), so there is no index. */
  Key* scan;
  int scanStart[NUM_BUCKETS + 1];
  _Atomic uint64_t* collCalls;  /* collCalls[i] = getCollInfo calls entries[i] answered (relaxed increments) */
  _Atomic uint64_t* chunkCalls; /* chunkCalls[i] = getChunkSize calls entries[i] answered */
  uint64_t generation;          /* set by install(): which table this is, for the counters' reader */
} Table;

typedef struct {
  int nRanks, nNodes;
  uint64_t commId;
  ncclDebugLogger_t log;
} Ctx;

#ifdef PTHREAD_RWLOCK_WRITER_NONRECURSIVE_INITIALIZER_NP
/* A waiting swap holds back new readers (glibc's default lets a steady stream of lookups starve it); no reader
 * takes the lock twice, which this kind forbids. */
static pthread_rwlock_t g_lock = PTHREAD_RWLOCK_WRITER_NONRECURSIVE_INITIALIZER_NP;
#else
static pthread_rwlock_t g_lock = PTHREAD_RWLOCK_INITIALIZER;
#endif
static Table* g_table = NULL;   /* guarded by g_lock */
static int g_apiOwned = 0;      /* guarded by g_lock: the table was set through the C API */
static uint64_t g_generation = 0; /* guarded by g_lock: tables installed so far */
static pthread_mutex_t g_logLock = PTHREAD_MUTEX_INITIALIZER;
static ncclDebugLogger_t g_log = NULL; /* the latest NCCL logger, for API-triggered warnings */
static atomic_int g_fallbackLevel = -1;

/* ---------------------------------------------------------------- logging */

static int fallback_level(void) {
  int level = atomic_load(&g_fallbackLevel);
  if (level >= 0) return level;
  const char* env = getenv("NCCL_DEBUG");
  level = NCCL_LOG_NONE;
  if (env) {
    if (strcasecmp(env, "VERSION") == 0) level = NCCL_LOG_VERSION;
    else if (strcasecmp(env, "WARN") == 0) level = NCCL_LOG_WARN;
    else if (strcasecmp(env, "INFO") == 0) level = NCCL_LOG_INFO;
    else if (strcasecmp(env, "TRACE") == 0) level = NCCL_LOG_TRACE;
  }
  atomic_store(&g_fallbackLevel, level);
  return level;
}

static ncclDebugLogger_t current_logger(void) {
  pthread_mutex_lock(&g_logLock);
  ncclDebugLogger_t fn = g_log;
  pthread_mutex_unlock(&g_logLock);
  return fn;
}

__attribute__((format(printf, 3, 4))) static void say(ncclDebugLogger_t log, ncclDebugLogLevel level,
                                                       const char* fmt, ...) {
  if (!log && (int)level > fallback_level()) return;
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (log) {
    log(level, LAGOM_NCCL_TUNING, __FILE__, __LINE__, "%s", msg); /* never a format from the file */
  } else {
    fprintf(stderr, "lagom-tuner %s: %s\n", level == NCCL_LOG_WARN ? "WARN" : "INFO", msg);
  }
}

/* ---------------------------------------------------------------- parsing */

static void trim(char** s) {
  char* p = *s;
  while (*p == ' ' || *p == '\t' || *p == '\r') p++;
  char* end = p + strlen(p);
  while (end > p && (end[-1] == ' ' || end[-1] == '\t' || end[-1] == '\r')) *--end = '\0';
  *s = p;
}

/* Lowercase, without '_' and '-', into out (size n). Returns 0 if it does not fit. */
static int normalize_name(const char* s, char* out, size_t n) {
  size_t j = 0;
  for (; *s; s++) {
    char c = *s;
    if (c == '_' || c == '-') continue;
    if (c >= 'A' && c <= 'Z') c = (char)(c - 'A' + 'a');
    if (j + 1 >= n) return 0;
    out[j++] = c;
  }
  out[j] = '\0';
  return 1;
}

static int is_any(const char* s) { return strcmp(s, "-1") == 0 || strcasecmp(s, "any") == 0; }

/* Index of the name in list (normalized), ANY for -1/any, -2 if unknown. */
static int parse_name(const char* s, const char* const* names, int count) {
  if (is_any(s)) return ANY;
  char key[32];
  if (!normalize_name(s, key, sizeof key)) return -2;
  for (int i = 0; i < count; i++)
    if (strcmp(key, names[i]) == 0) return i;
  return -2;
}

/* Indexed by ncclFunc_t, NCCL_ALGO_* and NCCL_PROTO_* (lagom_tuner_abi.h). */
static const char* const COLL_NAMES[NUM_COLLS] = {"broadcast", "reduce", "allgather", "reducescatter", "allreduce"};
static const char* const ALGO_NAMES[LAGOM_NUM_ALGOS] = {"tree", "ring", "collnetdirect", "collnetchain", "nvls",
                                                        "nvlstree", "pat"};
static const char* const PROTO_NAMES[LAGOM_NUM_PROTOS] = {"ll", "ll128", "simple"};
static const char* const ALGO_PRINT[LAGOM_NUM_ALGOS] = {"tree", "ring", "collnet_direct", "collnet_chain", "nvls",
                                                        "nvls_tree", "pat"};
static const char* const PROTO_PRINT[LAGOM_NUM_PROTOS] = {"ll", "ll128", "simple"};

/* Strict decimal integer in [lo, hi]; 0 on any junk, sign misuse or overflow. */
static int parse_int(const char* s, long long lo, long long hi, long long* out) {
  const char* p = s;
  int neg = 0;
  if (*p == '-' || *p == '+') neg = (*p++ == '-');
  if (*p < '0' || *p > '9') return 0;
  unsigned long long v = 0;
  for (; *p; p++) {
    if (*p < '0' || *p > '9') return 0;
    unsigned d = (unsigned)(*p - '0');
    if (v > (ULLONG_MAX - d) / 10) return 0;
    v = v * 10 + d;
  }
  if (neg) {
    if (v > (unsigned long long)LLONG_MAX + 1ULL) return 0;
    long long sv = (v == (unsigned long long)LLONG_MAX + 1ULL) ? LLONG_MIN : -(long long)v;
    if (sv < lo || sv > hi) return 0;
    *out = sv;
  } else {
    if (v > (unsigned long long)LLONG_MAX || (long long)v < lo || (long long)v > hi) return 0;
    *out = (long long)v;
  }
  return 1;
}

/* A byte count: -1 = any, else 0 .. 2^64-1. */
static int parse_bytes(const char* s, uint64_t anyValue, uint64_t* out) {
  if (strcmp(s, "-1") == 0) { *out = anyValue; return 1; }
  const char* p = s;
  if (*p == '+') p++;
  if (*p < '0' || *p > '9') return 0;
  uint64_t v = 0;
  for (; *p; p++) {
    if (*p < '0' || *p > '9') return 0;
    unsigned d = (unsigned)(*p - '0');
    if (v > (UINT64_MAX - d) / 10) return 0;
    v = v * 10 + d;
  }
  *out = v;
  return 1;
}

/* Parse one line (comment already cut, trimmed, non-empty). 0 + reason on rejection. */
static int parse_line(char* line, Entry* e, char* why, size_t whyLen) {
  char* tok[MAX_FIELDS];
  int nt = 0;
  char* p = line;
  for (;;) {
    if (nt == MAX_FIELDS) { snprintf(why, whyLen, "more than %d fields", MAX_FIELDS); return 0; }
    char* comma = strchr(p, ',');
    if (comma) *comma = '\0';
    tok[nt] = p;
    trim(&tok[nt]);
    nt++;
    if (!comma) break;
    p = comma + 1;
  }
  int npos = 0;
  while (npos < nt && strchr(tok[npos], '=') == NULL) npos++;
  if (npos < 8) { snprintf(why, whyLen, "%d positional fields, need at least 8", npos); return 0; }
  if (npos > 10) { snprintf(why, whyLen, "%d positional fields, at most 10 (extras go as key=value)", npos); return 0; }

  long long v;
  memset(e, 0, sizeof *e);
  e->chunkBytes = ANY;
  e->pipeOps = ANY;
  e->regBuff = ANY;

  int c = parse_name(tok[0], COLL_NAMES, NUM_COLLS);
  if (c == -2) { snprintf(why, whyLen, "unknown collective '%.40s'", tok[0]); return 0; }
  e->coll = c;
  if (!parse_bytes(tok[1], 0, &e->minBytes)) { snprintf(why, whyLen, "min_bytes '%.40s' is not a byte count or -1", tok[1]); return 0; }
  if (!parse_bytes(tok[2], UINT64_MAX, &e->maxBytes)) { snprintf(why, whyLen, "max_bytes '%.40s' is not a byte count or -1", tok[2]); return 0; }
  if (e->minBytes > e->maxBytes) { snprintf(why, whyLen, "min_bytes is larger than max_bytes"); return 0; }
  int a = parse_name(tok[3], ALGO_NAMES, LAGOM_NUM_ALGOS);
  if (a == -2) { snprintf(why, whyLen, "unknown algorithm '%.40s'", tok[3]); return 0; }
  e->algo = a;
  int pr = parse_name(tok[4], PROTO_NAMES, LAGOM_NUM_PROTOS);
  if (pr == -2) { snprintf(why, whyLen, "unknown protocol '%.40s'", tok[4]); return 0; }
  e->proto = pr;
  if (!parse_int(tok[5], -1, MAX_CHANNELS, &v) || v == 0) {
    snprintf(why, whyLen, "channels '%.40s' not -1 or 1-%d", tok[5], MAX_CHANNELS); return 0;
  }
  e->channels = (int32_t)v;
  if (!parse_int(tok[6], -1, INT_MAX, &v) || v == 0) { snprintf(why, whyLen, "nNodes '%.40s' not -1 or a positive count", tok[6]); return 0; }
  e->nNodes = (int32_t)v;
  if (!parse_int(tok[7], -1, INT_MAX, &v) || v == 0) { snprintf(why, whyLen, "nRanks '%.40s' not -1 or a positive count", tok[7]); return 0; }
  e->nRanks = (int32_t)v;
  if (npos > 8) {
    if (!parse_int(tok[8], -1, INT_MAX, &v) || v == 0) { snprintf(why, whyLen, "numPipeOps '%.40s' not -1 or a positive count", tok[8]); return 0; }
    e->pipeOps = (int32_t)v;
  }
  if (npos > 9) {
    if (!parse_int(tok[9], -1, 1, &v)) { snprintf(why, whyLen, "regBuff '%.40s' not -1, 0 or 1", tok[9]); return 0; }
    e->regBuff = (int32_t)v;
  }
  int haveChunk = 0;
  for (int i = npos; i < nt; i++) {
    char* eq = strchr(tok[i], '=');
    if (!eq) { snprintf(why, whyLen, "positional field '%.40s' after a key=value field", tok[i]); return 0; }
    *eq = '\0';
    char* key = tok[i];
    char* val = eq + 1;
    trim(&key);
    trim(&val);
    if (strcmp(key, "chunk_bytes") == 0) {
      if (haveChunk) { snprintf(why, whyLen, "chunk_bytes given twice"); return 0; }
      haveChunk = 1;
      if (!parse_int(val, -1, MAX_CHUNK_BYTES, &v) || v == 0) {
        snprintf(why, whyLen, "chunk_bytes '%.40s' not -1 or 1-%lld", val, (long long)MAX_CHUNK_BYTES); return 0;
      }
      e->chunkBytes = v;
    } else {
      snprintf(why, whyLen, "unknown field '%.40s'", key);
      return 0;
    }
  }
  return 1;
}

static int bucket_of(int coll) { return (coll >= 0 && coll < NUM_BUCKETS - 1) ? coll : NUM_BUCKETS - 1; }

static void free_table(Table* t) {
  if (!t) return;
  free(t->collCalls);
  free(t->chunkCalls);
  free(t->scan);
  free(t->entries);
  free(t);
}

static Table* new_table(void) { return calloc(1, sizeof(Table)); }

/* Fill t->scan: for each bucket, the lines of its collective and the any-collective lines, in file order.
 * Returns 0 when out of memory. */
static int build_scan(Table* t) {
  int counts[NUM_BUCKETS] = {0};
  for (int i = 0; i < t->n; i++)
    for (int b = 0; b < NUM_BUCKETS; b++) counts[b] += t->entries[i].coll == ANY || bucket_of(t->entries[i].coll) == b;
  t->scanStart[0] = 0;
  for (int b = 0; b < NUM_BUCKETS; b++) t->scanStart[b + 1] = t->scanStart[b] + counts[b];
  t->scan = malloc(sizeof(Key) * (size_t)(t->scanStart[NUM_BUCKETS] ? t->scanStart[NUM_BUCKETS] : 1));
  if (!t->scan) return 0;
  int fill[NUM_BUCKETS];
  memcpy(fill, t->scanStart, sizeof fill);
  for (int i = 0; i < t->n; i++) {
    const Entry* e = &t->entries[i];
    for (int b = 0; b < NUM_BUCKETS; b++)
      if (e->coll == ANY || bucket_of(e->coll) == b)
        t->scan[fill[b]++] = (Key){e->minBytes, e->maxBytes, e->nNodes, e->nRanks, e->pipeOps, e->regBuff, i};
  }
  return 1;
}

/* Parse text[0..len) into a new table (never NULL unless out of memory). */
static Table* parse_table(const char* text, size_t len, const char* origin, ncclDebugLogger_t log) {
  Table* t = new_table();
  if (!t) return NULL;
  char* buf = malloc(len + 1);
  if (!buf) { free(t); return NULL; }
  for (size_t i = 0; i < len; i++) buf[i] = text[i] == '\0' ? '\x7f' : text[i]; /* a NUL byte spoils its line */
  buf[len] = '\0';
  int cap = 0, lineNo = 0, warned = 0;
  char* p = buf;
  while (p && *p) {
    char* nl = strchr(p, '\n');
    if (nl) *nl = '\0';
    lineNo++;
    char* hash = strchr(p, '#');
    if (hash) *hash = '\0';
    char* line = p;
    trim(&line);
    p = nl ? nl + 1 : NULL;
    if (*line == '\0') continue;
    Entry e;
    char why[160];
    if (!parse_line(line, &e, why, sizeof why)) {
      t->rejected++;
      if (warned++ < MAX_WARNINGS_PER_LOAD)
        say(log, NCCL_LOG_WARN, "TUNER/Lagom: %s:%d: %s; line ignored, NCCL decides", origin, lineNo, why);
      continue;
    }
    if (t->n == cap) {
      int ncap = cap ? cap * 2 : 64;
      Entry* grown = realloc(t->entries, sizeof(Entry) * (size_t)ncap);
      if (!grown) { say(log, NCCL_LOG_WARN, "TUNER/Lagom: %s: out of memory at line %d; rest ignored", origin, lineNo); break; }
      t->entries = grown;
      cap = ncap;
    }
    e.line = lineNo;
    t->entries[t->n++] = e;
  }
  free(buf);
  if (warned > MAX_WARNINGS_PER_LOAD)
    say(log, NCCL_LOG_WARN, "TUNER/Lagom: %s: %d more rejected lines not listed", origin, warned - MAX_WARNINGS_PER_LOAD);
  t->collCalls = calloc((size_t)(t->n ? t->n : 1), sizeof(*t->collCalls));
  t->chunkCalls = calloc((size_t)(t->n ? t->n : 1), sizeof(*t->chunkCalls));
  if (!t->collCalls || !t->chunkCalls || !build_scan(t)) { free_table(t); return NULL; }
  int widest = 0;
  for (int b = 1; b < NUM_BUCKETS; b++)
    if (t->scanStart[b + 1] - t->scanStart[b] > t->scanStart[widest + 1] - t->scanStart[widest]) widest = b;
  int widestLines = t->scanStart[widest + 1] - t->scanStart[widest];
  if (widestLines > SCAN_WARN_LINES) /* every line still counts; only the time per call grows */
    say(log, NCCL_LOG_WARN, "TUNER/Lagom: %s: %d lines can match %s calls; each call scans them in order, so a call "
        "may take over a microsecond (keep a table under %d lines per collective)", origin, widestLines,
        widest < NUM_COLLS ? COLL_NAMES[widest] : "other", SCAN_WARN_LINES);
  say(log, NCCL_LOG_INFO, "TUNER/Lagom: %s: %d entries, %d lines rejected", origin, t->n, t->rejected);
  return t;
}

/* Read a whole file; NULL (and *missing set when it does not exist) when unreadable. */
static char* read_file(const char* path, size_t* len, int* missing, ncclDebugLogger_t log) {
  *missing = 0;
  FILE* f = fopen(path, "rb");
  if (!f) { *missing = (errno == ENOENT); return NULL; }
  size_t cap = 1 << 16, n = 0;
  char* data = malloc(cap);
  while (data) {
    if (n == cap) {
      if (cap >= (size_t)MAX_FILE_BYTES) {
        say(log, NCCL_LOG_WARN, "TUNER/Lagom: %s is larger than %ld bytes; ignored, NCCL decides", path, MAX_FILE_BYTES);
        free(data);
        data = NULL;
        break;
      }
      char* grown = realloc(data, cap * 2);
      if (!grown) { free(data); data = NULL; break; }
      data = grown;
      cap *= 2;
    }
    size_t got = fread(data + n, 1, cap - n, f);
    n += got;
    if (got == 0) {
      if (ferror(f)) { free(data); data = NULL; }
      break;
    }
  }
  fclose(f);
  *len = n;
  return data;
}

/* Who is installing a table: the C API (the table then stays until lagom_tuner_reload), lagom_tuner_reload, or a
 * communicator init re-reading the file, which yields to a table set through the API. */
typedef enum { BY_API, BY_RELOAD, BY_INIT } Installer;

/* Swap t in under the write lock (readers see the old or the new table, whole) and free the old one once no
 * reader holds it. The API-ownership check and the swap are one critical section, so an init that read the
 * file before a concurrent lagom_tuner_set_table cannot overwrite that table (t is then discarded). */
static void install(Table* t, Installer by) {
  pthread_rwlock_wrlock(&g_lock);
  if (by == BY_INIT && g_apiOwned) {
    pthread_rwlock_unlock(&g_lock);
    free_table(t);
    return;
  }
  Table* old = g_table;
  g_table = t;
  g_apiOwned = by == BY_API;
  if (t) t->generation = ++g_generation;
  pthread_rwlock_unlock(&g_lock);
  free_table(old);
}

/* Load a file into a new table; returns entries, or -1 if the file is unreadable (empty table). */
static int load_file(const char* path, Installer by, int quietIfMissing, ncclDebugLogger_t log) {
  size_t len = 0;
  int missing = 0;
  char* data = read_file(path, &len, &missing, log);
  Table* t;
  int rc;
  if (!data) {
    if (missing && quietIfMissing)
      say(log, NCCL_LOG_INFO, "TUNER/Lagom: no %s; NCCL decides everything", path);
    else
      say(log, NCCL_LOG_WARN, "TUNER/Lagom: cannot read tuner config %s (%s); NCCL decides everything", path,
          missing ? "no such file" : "unreadable");
    t = new_table();
    rc = -1;
  } else {
    t = parse_table(data, len, path, log);
    free(data);
    rc = t ? t->n : -1;
  }
  install(t, by);
  return rc;
}

static int load_from_env(Installer by, ncclDebugLogger_t log) {
  const char* path = getenv("NCCL_TUNER_CONFIG_FILE");
  if (path && *path) return load_file(path, by, 0, log);
  return load_file("nccl_tuner.conf", by, 1, log); /* NVIDIA's example default, quiet when absent */
}

/* ---------------------------------------------------------------- matching */

/* An UNKNOWN input (not passed by NCCL to this call) matches anything. */
static inline int key_matches(const Key* k, uint64_t nBytes, int nNodes, int nRanks, int pipeOps, int regBuff) {
  return nBytes >= k->minBytes && nBytes <= k->maxBytes &&
         (k->nNodes == ANY || k->nNodes == nNodes) &&
         (k->nRanks == ANY || k->nRanks == nRanks) &&
         (k->pipeOps == ANY || pipeOps == UNKNOWN || k->pipeOps == pipeOps) &&
         (k->regBuff == ANY || regBuff == UNKNOWN || k->regBuff == regBuff);
}

/* First matching entry in file order, or NULL. Caller holds the read lock. */
static Entry* lookup(Table* t, int coll, uint64_t nBytes, int nNodes, int nRanks, int pipeOps, int regBuff) {
  if (!t) return NULL;
  int b = bucket_of(coll);
  for (const Key* k = t->scan + t->scanStart[b]; k < t->scan + t->scanStart[b + 1]; k++)
    if (key_matches(k, nBytes, nNodes, nRanks, pipeOps, regBuff)) return &t->entries[k->entry];
  return NULL;
}

enum { COLL_CALL, CHUNK_CALL }; /* which of NCCL's calls asks: getCollInfo or getChunkSize */

/* The entry that answers this call (lookup), or NULL; a match counts one more call of its kind in
   collCalls or chunkCalls. Relaxed: a count, not a synchronisation. Caller holds the read lock. */
static inline Entry* answer(const Ctx* ctx, int kind, int coll, size_t nBytes, int pipeOps, int regBuff) {
  Entry* e = lookup(g_table, coll, (uint64_t)nBytes, ctx->nNodes, ctx->nRanks, pipeOps, regBuff);
  if (e) {
    _Atomic uint64_t* counters = kind == CHUNK_CALL ? g_table->chunkCalls : g_table->collCalls;
    atomic_fetch_add_explicit(&counters[e - g_table->entries], 1, memory_order_relaxed);
  }
  return e;
}

static int usable(float cost) { return cost >= 0.0f; } /* NCCL_ALGO_PROTO_IGNORE is -1.0; NaN is not usable */

static void warn_once(Ctx* ctx, Entry* e, const char* what) {
  if (atomic_exchange(&e->warned, 1) == 0)
    say(ctx->log, NCCL_LOG_WARN, "TUNER/Lagom: table line %d: %s; NCCL decides", e->line, what);
}

/* Zero the cost of the entry's algorithm/protocol pair (or best usable fill-in for a wildcard). */
static void apply_costs(Ctx* ctx, Entry* e, float* table, int numAlgo, int numProto) {
  if (e->algo == ANY && e->proto == ANY) return;
  if (!table || numAlgo <= 0 || numProto <= 0 || numAlgo > MAX_COST_ALGOS || numProto > MAX_COST_PROTOS) return;
  int bestA = -1, bestP = -1;
  float best = 0.0f;
  for (int a = 0; a < numAlgo; a++) {
    if (e->algo != ANY && a != e->algo) continue;
    for (int p = 0; p < numProto; p++) {
      if (e->proto != ANY && p != e->proto) continue;
      float cost = table[a * numProto + p];
      if (!usable(cost)) continue;
      if (bestA < 0 || cost < best) { bestA = a; bestP = p; best = cost; }
    }
  }
  if (bestA < 0) {
    char what[96];
    snprintf(what, sizeof what, "%s/%s is not usable for this collective",
             e->algo == ANY ? "any" : ALGO_PRINT[e->algo], e->proto == ANY ? "any" : PROTO_PRINT[e->proto]);
    warn_once(ctx, e, what);
    return;
  }
  table[bestA * numProto + bestP] = 0.0f;
}

static ncclResult_t coll_info(void* context, ncclFunc_t collType, size_t nBytes, int numPipeOps, float** collCostTable,
                              int numAlgo, int numProto, int regBuff, int* nChannels) {
  Ctx* ctx = (Ctx*)context;
  if (!ctx) return ncclSuccess;
  pthread_rwlock_rdlock(&g_lock);
  Entry* e = answer(ctx, COLL_CALL, collType, nBytes, numPipeOps, regBuff);
  if (e) {
    apply_costs(ctx, e, (float*)collCostTable, numAlgo, numProto);
    if (e->channels > 0 && nChannels) *nChannels = e->channels;
    if (ctx->log && fallback_level() >= NCCL_LOG_TRACE) /* formatting costs; only when NCCL_DEBUG=TRACE */
      say(ctx->log, NCCL_LOG_TRACE, "TUNER/Lagom: coll %d bytes %zu matched line %d", collType, nBytes, e->line);
  }
  pthread_rwlock_unlock(&g_lock);
  return ncclSuccess;
}

static int entry_count(void) {
  pthread_rwlock_rdlock(&g_lock);
  int n = g_table ? g_table->n : 0;
  pthread_rwlock_unlock(&g_lock);
  return n;
}

/* ---------------------------------------------------------------- ABI entry points */

static ncclResult_t new_context(size_t nRanks, size_t nNodes, uint64_t commId, ncclDebugLogger_t log, void** context) {
  if (!context) return ncclInvalidArgument;
  Ctx* ctx = calloc(1, sizeof(Ctx));
  if (!ctx) return ncclSystemError;
  ctx->nRanks = nRanks > INT_MAX ? INT_MAX : (int)nRanks;
  ctx->nNodes = nNodes > INT_MAX ? INT_MAX : (int)nNodes;
  ctx->commId = commId;
  ctx->log = log;
  pthread_mutex_lock(&g_logLock);
  if (log) g_log = log;
  pthread_mutex_unlock(&g_logLock);
  pthread_rwlock_rdlock(&g_lock);
  int apiOwned = g_apiOwned;
  pthread_rwlock_unlock(&g_lock);
  if (!apiOwned) load_from_env(BY_INIT, log); /* a table set through the C API wins until lagom_tuner_reload() */
  say(log, NCCL_LOG_INFO, "TUNER/Lagom: init nRanks %d nNodes %d, %d entries", ctx->nRanks, ctx->nNodes,
      entry_count());
  *context = ctx;
  return ncclSuccess;
}

static ncclResult_t init_v2(size_t nRanks, size_t nNodes, ncclDebugLogger_t log, void** context) {
  return new_context(nRanks, nNodes, 0, log, context);
}

static ncclResult_t init_v5(void** context, uint64_t commId, size_t nRanks, size_t nNodes, ncclDebugLogger_t log,
                            void* nvlDomainInfo, void* constants) {
  (void)nvlDomainInfo;
  (void)constants; /* read-only for us: NCCL's own constants stay as they are */
  return new_context(nRanks, nNodes, commId, log, context);
}

static ncclResult_t init_v7(void** context, uint64_t commId, size_t nRanks, size_t nNodes, ncclDebugLogger_t log,
                            lagomNvlDomainInfo_v7_t* nvlDomainInfo, lagomTunerConstants_v7_t* constants) {
  return init_v5(context, commId, nRanks, nNodes, log, nvlDomainInfo, constants); /* the same: read nothing */
}

static ncclResult_t finalize(void* context) {
  Ctx* ctx = (Ctx*)context;
  if (ctx) {
    /* Forget this logger for API-triggered warnings: it may not outlive its communicator. */
    pthread_mutex_lock(&g_logLock);
    if (g_log == ctx->log) g_log = NULL;
    pthread_mutex_unlock(&g_logLock);
  }
  free(context);
  return ncclSuccess;
}

/* Whether NCCL 2.21 (the only NCCL that loads v2 first) can run algo for this call. */
static int v2_supports(int algo, int collNetSupport, int nvlsSupport) {
  switch (algo) {
    case NCCL_ALGO_TREE:
    case NCCL_ALGO_RING: return 1;
    case NCCL_ALGO_COLLNET_DIRECT:
    case NCCL_ALGO_COLLNET_CHAIN: return collNetSupport != 0;
    case NCCL_ALGO_NVLS:
    case NCCL_ALGO_NVLS_TREE: return nvlsSupport != 0;
    default: return 0; /* PAT came with NCCL 2.23 */
  }
}

static ncclResult_t coll_info_v2(void* context, ncclFunc_t collType, size_t nBytes, int collNetSupport,
                                 int nvlsSupport, int numPipeOps, int* algorithm, int* protocol, int* nChannels) {
  Ctx* ctx = (Ctx*)context;
  if (!ctx) return ncclSuccess;
  pthread_rwlock_rdlock(&g_lock);
  Entry* e = answer(ctx, COLL_CALL, collType, nBytes, numPipeOps, UNKNOWN);
  if (e) {
    if (e->algo != ANY && e->proto != ANY) {
      if (v2_supports(e->algo, collNetSupport, nvlsSupport) && algorithm && protocol) {
        *algorithm = e->algo;
        *protocol = e->proto;
      } else {
        warn_once(ctx, e, "algorithm not supported here (v2 ABI)");
      }
    } else if (e->algo != ANY || e->proto != ANY) {
      warn_once(ctx, e, "the v2 ABI sets algorithm and protocol together only");
    }
    if (e->channels > 0 && nChannels) *nChannels = e->channels;
  }
  pthread_rwlock_unlock(&g_lock);
  return ncclSuccess;
}

static ncclResult_t coll_info_v3(void* context, ncclFunc_t collType, size_t nBytes, int numPipeOps,
                                 float** collCostTable, int numAlgo, int numProto, int* nChannels) {
  return coll_info(context, collType, nBytes, numPipeOps, collCostTable, numAlgo, numProto, UNKNOWN, nChannels);
}

static ncclResult_t chunk_size(void* context, ncclFunc_t collType, size_t nBytes, int algo, int proto, int nChannels,
                               size_t* chunkSize) {
  (void)nChannels;
  Ctx* ctx = (Ctx*)context;
  if (!ctx || !chunkSize) return ncclSuccess;
  pthread_rwlock_rdlock(&g_lock);
  Entry* e = answer(ctx, CHUNK_CALL, collType, nBytes, UNKNOWN, UNKNOWN);
  if (e && e->chunkBytes > 0 && (e->algo == ANY || e->algo == algo) && (e->proto == ANY || e->proto == proto))
    *chunkSize = (size_t)e->chunkBytes;
  pthread_rwlock_unlock(&g_lock);
  return ncclSuccess;
}

LAGOM_EXPORT const lagomTuner_v2_t ncclTunerPlugin_v2 = {
    .name = PLUGIN_NAME, .init = init_v2, .getCollInfo = coll_info_v2, .destroy = finalize};
LAGOM_EXPORT const lagomTuner_v3_t ncclTunerPlugin_v3 = {
    .name = PLUGIN_NAME, .init = init_v2, .getCollInfo = coll_info_v3, .destroy = finalize};
LAGOM_EXPORT const lagomTuner_v4_t ncclTunerPlugin_v4 = {
    .name = PLUGIN_NAME, .init = init_v2, .getCollInfo = coll_info, .destroy = finalize};
LAGOM_EXPORT const lagomTuner_v5_t ncclTunerPlugin_v5 = {
    .name = PLUGIN_NAME, .init = init_v5, .getCollInfo = coll_info, .finalize = finalize};
LAGOM_EXPORT const lagomTuner_v6_t ncclTunerPlugin_v6 = {
    .name = PLUGIN_NAME, .init = init_v5, .getCollInfo = coll_info, .finalize = finalize, .getChunkSize = chunk_size};
LAGOM_EXPORT const lagomTuner_v7_t ncclTunerPlugin_v7 = {
    .name = PLUGIN_NAME, .init = init_v7, .getCollInfo = coll_info, .finalize = finalize, .getChunkSize = chunk_size};

/* ---------------------------------------------------------------- live C API */

/* Replace the table with csv_text (NULL clears it). Returns the number of entries. */
LAGOM_EXPORT int lagom_tuner_set_table(const char* csv_text) {
  Table* t = csv_text ? parse_table(csv_text, strlen(csv_text), "<lagom_tuner_set_table>", current_logger())
                      : new_table();
  int n = t ? t->n : -1;
  install(t, BY_API);
  return n;
}

/* Replace the table with a file's. Returns entries, or -1 if unreadable (the table is then empty). */
LAGOM_EXPORT int lagom_tuner_load_file(const char* path) {
  if (!path) return lagom_tuner_set_table(NULL);
  return load_file(path, BY_API, 0, current_logger());
}

/* Go back to NCCL_TUNER_CONFIG_FILE (read now and at each communicator init). Returns entries or -1. */
LAGOM_EXPORT int lagom_tuner_reload(void) { return load_from_env(BY_RELOAD, current_logger()); }

LAGOM_EXPORT int lagom_tuner_entry_count(void) { return entry_count(); }

/* Lines rejected when the current table was loaded. */
LAGOM_EXPORT int lagom_tuner_rejected_count(void) {
  pthread_rwlock_rdlock(&g_lock);
  int n = g_table ? g_table->rejected : 0;
  pthread_rwlock_unlock(&g_lock);
  return n;
}

/* Per-entry call counts of the current table, read under the read lock so that they belong to one table:
 * collInfoCalls[i] / chunkSizeCalls[i] (either may be NULL) for i < min(capacity, entries), and *generation
 * (may be NULL) = which table (1 for the first installed, +1 per replacement). Returns the table's entries. */
LAGOM_EXPORT int lagom_tuner_entry_calls(uint64_t* collInfoCalls, uint64_t* chunkSizeCalls, int capacity,
                                         uint64_t* generation) {
  pthread_rwlock_rdlock(&g_lock);
  const Table* t = g_table;
  int n = t ? t->n : 0;
  for (int i = 0; i < n && i < capacity; i++) {
    if (collInfoCalls) collInfoCalls[i] = atomic_load_explicit(&t->collCalls[i], memory_order_relaxed);
    if (chunkSizeCalls) chunkSizeCalls[i] = atomic_load_explicit(&t->chunkCalls[i], memory_order_relaxed);
  }
  if (generation) *generation = t ? t->generation : 0;
  pthread_rwlock_unlock(&g_lock);
  return n;
}

/* Zero the current table's call counts (a new table starts at zero anyway). */
LAGOM_EXPORT void lagom_tuner_reset_entry_calls(void) {
  pthread_rwlock_rdlock(&g_lock);
  const Table* t = g_table;
  for (int i = 0; t && i < t->n; i++) {
    atomic_store_explicit(&t->collCalls[i], 0, memory_order_relaxed);
    atomic_store_explicit(&t->chunkCalls[i], 0, memory_order_relaxed);
  }
  pthread_rwlock_unlock(&g_lock);
}

__attribute__((destructor)) static void unload(void) {
  pthread_rwlock_wrlock(&g_lock);
  Table* t = g_table;
  g_table = NULL;
  pthread_rwlock_unlock(&g_lock);
  free_table(t);
}
