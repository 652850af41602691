/*
 * Lagom tuner plugin: NCCL's tuner-plugin ABI, declared here so that the plugin
 * builds without NCCL's headers or libnccl.
 *
 * Written from NVIDIA/nccl src/include/plugin/tuner/tuner_v2.h .. tuner_v7.h and
 * nccl_common.h (field order and signatures must match those exactly). The v5/v6
 * nvlDomainInfo and constants structs reach the plugin by pointer only, so their
 * contents are not declared; v7's are (its constants table is the one the ABI
 * changed), so that a test checks their layout (tests/test_tuner_plugin.py).
 */
#ifndef LAGOM_TUNER_ABI_H_
#define LAGOM_TUNER_ABI_H_

#include <stddef.h>
#include <stdint.h>

/* ncclResult_t (nccl.h) */
typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7
} ncclResult_t;

/* ncclDebugLogLevel and the NCCL_TUNING subsystem flag (nccl_common.h) */
typedef enum {
  NCCL_LOG_NONE = 0,
  NCCL_LOG_VERSION = 1,
  NCCL_LOG_WARN = 2,
  NCCL_LOG_INFO = 3,
  NCCL_LOG_ABORT = 4,
  NCCL_LOG_TRACE = 5
} ncclDebugLogLevel;
#define LAGOM_NCCL_TUNING 64UL

typedef void (*ncclDebugLogger_t)(ncclDebugLogLevel level, unsigned long flags, const char* file, int line,
                                  const char* fmt, ...);

/* ncclFunc_t is an int-sized enum; the collectives a tuner is asked about (later NCCLs add more after these). */
typedef int ncclFunc_t;
enum { ncclFuncBroadcast = 0, ncclFuncReduce = 1, ncclFuncAllGather = 2, ncclFuncReduceScatter = 3 };
enum { ncclFuncAllReduce = 4 };

/* Rows and columns of the float[numAlgo][numProto] cost table (NCCL_ALGO_* and NCCL_PROTO_*; NCCL before 2.23
 * has no PAT and passes numAlgo 6). */
enum { NCCL_ALGO_TREE = 0, NCCL_ALGO_RING = 1, NCCL_ALGO_COLLNET_DIRECT = 2, NCCL_ALGO_COLLNET_CHAIN = 3 };
enum { NCCL_ALGO_NVLS = 4, NCCL_ALGO_NVLS_TREE = 5, NCCL_ALGO_PAT = 6, LAGOM_NUM_ALGOS = 7 };
enum { NCCL_PROTO_LL = 0, NCCL_PROTO_LL128 = 1, NCCL_PROTO_SIMPLE = 2, LAGOM_NUM_PROTOS = 3 };

/* The entry points, by the ABI version that introduced each signature. */
typedef ncclResult_t (*lagomInitV2_t)(size_t nRanks, size_t nNodes, ncclDebugLogger_t logFunction, void** context);
typedef ncclResult_t (*lagomInitV5_t)(void** context, uint64_t commId, size_t nRanks, size_t nNodes,
                                      ncclDebugLogger_t logFunction, void* nvlDomainInfo, void* constants);
typedef ncclResult_t (*lagomGetCollInfoV2_t)(void* context, ncclFunc_t collType, size_t nBytes, int collNetSupport,
                                             int nvlsSupport, int numPipeOps, int* algorithm, int* protocol,
                                             int* nChannels);
typedef ncclResult_t (*lagomGetCollInfoV3_t)(void* context, ncclFunc_t collType, size_t nBytes, int numPipeOps,
                                             float** collCostTable, int numAlgo, int numProto, int* nChannels);
typedef ncclResult_t (*lagomGetCollInfoV4_t)(void* context, ncclFunc_t collType, size_t nBytes, int numPipeOps,
                                             float** collCostTable, int numAlgo, int numProto, int regBuff,
                                             int* nChannels);
typedef ncclResult_t (*lagomGetChunkSizeV6_t)(void* context, ncclFunc_t collType, size_t nBytes, int algo, int proto,
                                              int nChannels, size_t* chunkSize);
typedef ncclResult_t (*lagomEnd_t)(void* context); /* destroy (v2-v4), finalize (v5-v7) */

typedef struct {
  const char* name;
  lagomInitV2_t init;
  lagomGetCollInfoV2_t getCollInfo;
  lagomEnd_t destroy;
} lagomTuner_v2_t;

typedef struct {
  const char* name;
  lagomInitV2_t init;
  lagomGetCollInfoV3_t getCollInfo;
  lagomEnd_t destroy;
} lagomTuner_v3_t;

typedef struct {
  const char* name;
  lagomInitV2_t init;
  lagomGetCollInfoV4_t getCollInfo;
  lagomEnd_t destroy;
} lagomTuner_v4_t;

typedef struct {
  const char* name;
  lagomInitV5_t init;
  lagomGetCollInfoV4_t getCollInfo;
  lagomEnd_t finalize;
} lagomTuner_v5_t;

typedef struct {
  const char* name;
  lagomInitV5_t init;
  lagomGetCollInfoV4_t getCollInfo;
  lagomEnd_t finalize;
  lagomGetChunkSizeV6_t getChunkSize; /* optional for NCCL: NULL keeps its chunk */
} lagomTuner_v6_t;

/* ABI v7 (tuner_v7.h at NVIDIA/nccl 2449986f; NCCL 2.32.6): v6's callbacks in v6's order, init
 * taking v7's NVLink-domain info (v5's three ints) and v7's constants table: v5's table with the
 * per-architecture rows widened from 4 compute capabilities (Volta, Ampere, Hopper, Blackwell) to
 * 5 (plus Rubin). Dimensions: 7 algorithms, 3 protocols, 3 link kinds (NVLink, PCI, network),
 * 3 tuning scales (1, 2, 4 nodes): tuner_v5.h NCCL_NUM_*_V5, tuner_v7.h NCCL_NUM_COMPCAPS_V7. */
#define LAGOM_V7_ALGOS 7
#define LAGOM_V7_PROTOS 3
#define LAGOM_V7_HW_LINKS 3
#define LAGOM_V7_COMPCAPS 5
#define LAGOM_V7_SCALES 3

typedef struct {
  int nNvlDomains;          /* NVLink domains of the communicator */
  int minRanksPerNvlDomain; /* fewest ranks in one of them */
  int maxRanksPerNvlDomain; /* most ranks in one of them */
} lagomNvlDomainInfo_v7_t;

typedef struct {
  double baseLatencies[LAGOM_V7_ALGOS][LAGOM_V7_PROTOS];
  double hwLatencies[LAGOM_V7_HW_LINKS][LAGOM_V7_ALGOS][LAGOM_V7_PROTOS];
  double llMaxBws[LAGOM_V7_COMPCAPS][LAGOM_V7_SCALES];
  double perChMaxRingLL128Bws[LAGOM_V7_COMPCAPS][LAGOM_V7_SCALES];
  double perChMaxTreeLL128Bws[LAGOM_V7_COMPCAPS][LAGOM_V7_SCALES];
  double perChMaxTreeBws[LAGOM_V7_COMPCAPS][LAGOM_V7_SCALES];
  double perChMaxNVLSTreeBws[LAGOM_V7_COMPCAPS][LAGOM_V7_SCALES];
} lagomTunerConstants_v7_t;

typedef ncclResult_t (*lagomInitV7_t)(void** context, uint64_t commId, size_t nRanks, size_t nNodes,
                                      ncclDebugLogger_t logFunction, lagomNvlDomainInfo_v7_t* nvlDomainInfo,
                                      lagomTunerConstants_v7_t* constants);

typedef struct {
  const char* name;
  lagomInitV7_t init;
  lagomGetCollInfoV4_t getCollInfo;
  lagomEnd_t finalize;
  lagomGetChunkSizeV6_t getChunkSize; /* optional for NCCL: NULL keeps its chunk */
} lagomTuner_v7_t;

#endif /* LAGOM_TUNER_ABI_H_ */
