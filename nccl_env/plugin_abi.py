"""Call Lagom's compiled tuner plugin from Python through NCCL's own ABI (ctypes).

What NCCL does with the plugin, done from Python: load the ``.so``, take one of the
``ncclTunerPlugin_vN`` structs, ``init`` a context, call ``getCollInfo`` with a cost
table, ``getChunkSize`` (v6, v7), ``finalize``; v7's init with its constants table
(:class:`TunerConstantsV7`, the layout of NCCL's tuner_v7.h). Also the live C API
(``lagom_tuner_set_table`` ...) a process uses to change the table in memory. Used
by the tests, the benchmark and the runtime.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path

from nccl_env.errors import LagomError

ABI_VERSIONS = (2, 3, 4, 5, 6, 7)
NUM_PROTOCOLS = 3
IGNORE = -1.0  # NCCL_ALGO_PROTO_IGNORE

# void (*)(ncclDebugLogLevel, unsigned long, const char* file, int line, const char* fmt, ...).
# The plugin always calls it as (level, flags, file, line, "%s", message): six register
# arguments, so a fixed-arity callback reads them correctly on x86-64 and aarch64 Linux.
LOGGER = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_ulong, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
                          ctypes.c_char_p)
_RES = ctypes.c_int
_PP = ctypes.POINTER(ctypes.c_void_p)
_INIT_V2 = ctypes.CFUNCTYPE(_RES, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_void_p, _PP)
_INIT_V5 = ctypes.CFUNCTYPE(_RES, _PP, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_void_p,
                            ctypes.c_void_p, ctypes.c_void_p)
_IP = ctypes.POINTER(ctypes.c_int)
_FP = ctypes.POINTER(ctypes.c_float)
_GET_V2 = ctypes.CFUNCTYPE(_RES, ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                           ctypes.c_int, _IP, _IP, _IP)
_GET_V3 = ctypes.CFUNCTYPE(_RES, ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t, ctypes.c_int, _FP, ctypes.c_int,
                           ctypes.c_int, _IP)
_GET_V4 = ctypes.CFUNCTYPE(_RES, ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t, ctypes.c_int, _FP, ctypes.c_int,
                           ctypes.c_int, ctypes.c_int, _IP)
_FIN = ctypes.CFUNCTYPE(_RES, ctypes.c_void_p)
_CHUNK = ctypes.CFUNCTYPE(_RES, ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.POINTER(ctypes.c_size_t))


# ABI v7's init arguments, as NVIDIA/nccl src/include/plugin/tuner/tuner_v7.h (at 2449986f) lays
# them out: v5's NVLink-domain info (three ints) and a constants table of doubles whose
# per-architecture rows cover 5 compute capabilities (Volta, Ampere, Hopper, Blackwell, Rubin;
# NCCL_NUM_COMPCAPS_V7) where v5/v6 had 4. 7 algorithms, 3 protocols, 3 link kinds and 3 tuning
# scales (1, 2, 4 nodes) as in tuner_v5.h. Lagom's plugin reads neither.
V7_ALGOS, V7_PROTOS, V7_HW_LINKS, V7_COMPCAPS, V7_SCALES = 7, 3, 3, 5, 3
_ARCH_ROWS = ctypes.c_double * V7_SCALES * V7_COMPCAPS


class NvlDomainInfoV7(ctypes.Structure):
    _fields_ = [("nNvlDomains", ctypes.c_int), ("minRanksPerNvlDomain", ctypes.c_int),
                ("maxRanksPerNvlDomain", ctypes.c_int)]


class TunerConstantsV7(ctypes.Structure):
    _fields_ = [("baseLatencies", ctypes.c_double * V7_PROTOS * V7_ALGOS),
                ("hwLatencies", ctypes.c_double * V7_PROTOS * V7_ALGOS * V7_HW_LINKS),
                ("llMaxBws", _ARCH_ROWS), ("perChMaxRingLL128Bws", _ARCH_ROWS), ("perChMaxTreeLL128Bws", _ARCH_ROWS),
                ("perChMaxTreeBws", _ARCH_ROWS), ("perChMaxNVLSTreeBws", _ARCH_ROWS)]


_INIT_V7 = ctypes.CFUNCTYPE(_RES, _PP, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_void_p,
                            ctypes.POINTER(NvlDomainInfoV7), ctypes.POINTER(TunerConstantsV7))


def _struct(name: str, init, get, extra=()) -> type[ctypes.Structure]:
    return type(name, (ctypes.Structure,), {
        "_fields_": [("name", ctypes.c_char_p), ("init", init), ("getCollInfo", get), ("finalize", _FIN), *extra]
    })


STRUCTS = {
    2: _struct("Tuner_v2", _INIT_V2, _GET_V2),
    3: _struct("Tuner_v3", _INIT_V2, _GET_V3),
    4: _struct("Tuner_v4", _INIT_V2, _GET_V4),
    5: _struct("Tuner_v5", _INIT_V5, _GET_V4),
    6: _struct("Tuner_v6", _INIT_V5, _GET_V4, [("getChunkSize", _CHUNK)]),
    7: _struct("Tuner_v7", _INIT_V7, _GET_V4, [("getChunkSize", _CHUNK)]),
}


@dataclass
class CollResult:
    """What one getCollInfo call left behind."""

    rc: int
    n_channels: int
    costs: list[list[float]]  # the cost table after the call (v3+), [algo][proto]
    algo: int = -1  # v2 outputs (NCCL_ALGO_* / NCCL_PROTO_* index, -1: NCCL decides)
    proto: int = -1

    def chosen(self) -> tuple[int, int] | None:
        """The (algo, proto) NCCL would now pick: the cheapest usable entry."""
        best = None
        for a, row in enumerate(self.costs):
            for p, cost in enumerate(row):
                if cost >= 0 and (best is None or cost < best[0]):
                    best = (cost, a, p)
        return None if best is None else (best[1], best[2])


@dataclass(frozen=True)
class EntryCalls:
    """Calls the plugin answered per entry of one table (index = entry in file order, rejected lines skipped)."""

    generation: int  # which table: 1 for the first installed in this process, +1 per replacement
    coll_info: list[int]  # getCollInfo calls (any ABI version)
    chunk_size: list[int]  # getChunkSize calls (v6), counted whether or not the entry set a chunk


class TunerLibrary:
    """The loaded plugin library: its ABI structs and its live C API."""

    def __init__(self, path: str | Path):
        try:
            self.lib = ctypes.CDLL(str(path))
        except OSError as exc:
            raise LagomError(f"{path}: cannot load tuner plugin: {exc}") from None
        self.path = Path(path)
        for fn, argtypes in (("lagom_tuner_set_table", [ctypes.c_char_p]), ("lagom_tuner_load_file", [ctypes.c_char_p]),
                             ("lagom_tuner_reload", []), ("lagom_tuner_entry_count", []),
                             ("lagom_tuner_rejected_count", [])):
            getattr(self.lib, fn).argtypes = argtypes
            getattr(self.lib, fn).restype = ctypes.c_int
        u64p = ctypes.POINTER(ctypes.c_uint64)
        self.lib.lagom_tuner_entry_calls.argtypes = [u64p, u64p, ctypes.c_int, u64p]
        self.lib.lagom_tuner_entry_calls.restype = ctypes.c_int
        self.lib.lagom_tuner_reset_entry_calls.argtypes = []
        self.lib.lagom_tuner_reset_entry_calls.restype = None

    def plugin(self, abi: int) -> ctypes.Structure:
        return STRUCTS[abi].in_dll(self.lib, f"ncclTunerPlugin_v{abi}")

    def set_table(self, csv_text: str | None) -> int:
        """Replace the table live (None clears it); number of entries."""
        return self.lib.lagom_tuner_set_table(None if csv_text is None else csv_text.encode())

    def load_file(self, path: str | Path) -> int:
        return self.lib.lagom_tuner_load_file(str(path).encode())

    def reload(self) -> int:
        """Back to NCCL_TUNER_CONFIG_FILE; entries or -1."""
        return self.lib.lagom_tuner_reload()

    def entry_count(self) -> int:
        return self.lib.lagom_tuner_entry_count()

    def rejected_count(self) -> int:
        return self.lib.lagom_tuner_rejected_count()

    def entry_calls(self) -> EntryCalls:
        """The current table's per-entry call counts, read in one go (all from the same table)."""
        while True:
            capacity = self.entry_count()
            coll = (ctypes.c_uint64 * max(capacity, 1))()
            chunk = (ctypes.c_uint64 * max(capacity, 1))()
            generation = ctypes.c_uint64(0)
            n = self.lib.lagom_tuner_entry_calls(coll, chunk, capacity, ctypes.byref(generation))
            if n <= capacity:  # else the table grew between the two calls: read again
                return EntryCalls(generation.value, list(coll[:n]), list(chunk[:n]))

    def entry_call_counts(self) -> list[int]:
        """getCollInfo calls each entry of the current table answered (index = entry, in file order)."""
        return self.entry_calls().coll_info

    def table_generation(self) -> int:
        """Which table is in force: 1 for the first one installed, +1 for each replacement (0: none yet)."""
        generation = ctypes.c_uint64(0)
        self.lib.lagom_tuner_entry_calls(None, None, 0, ctypes.byref(generation))
        return generation.value

    def reset_entry_call_counts(self) -> None:
        """Zero the current table's counts (a new table starts at zero anyway)."""
        self.lib.lagom_tuner_reset_entry_calls()

    def open(self, abi: int, n_ranks: int, n_nodes: int, logger=None, comm_id: int = 0,
             nvl_domain: NvlDomainInfoV7 | None = None, constants: TunerConstantsV7 | None = None) -> TunerContext:
        return TunerContext(self, abi, n_ranks, n_nodes, logger, comm_id, nvl_domain, constants)


class TunerContext:
    """One communicator's plugin context (init ... finalize)."""

    def __init__(self, library: TunerLibrary, abi: int, n_ranks: int, n_nodes: int, logger=None, comm_id: int = 0,
                 nvl_domain: NvlDomainInfoV7 | None = None, constants: TunerConstantsV7 | None = None):
        """``nvl_domain`` and ``constants``: v7's init arguments as NCCL passes them (None: NULL)."""
        if abi not in STRUCTS:
            raise LagomError(f"tuner ABI v{abi} unknown (have {ABI_VERSIONS})")
        self.library = library
        self.abi = abi
        self.plugin = library.plugin(abi)
        self._logger = logger  # keep the callback alive while the context lives
        log_ptr = ctypes.cast(logger, ctypes.c_void_p) if logger is not None else None
        self.ctx = ctypes.c_void_p()
        if abi >= 7:
            rc = self.plugin.init(ctypes.byref(self.ctx), comm_id, n_ranks, n_nodes, log_ptr,
                                  None if nvl_domain is None else ctypes.pointer(nvl_domain),
                                  None if constants is None else ctypes.pointer(constants))
        elif abi >= 5:
            rc = self.plugin.init(ctypes.byref(self.ctx), comm_id, n_ranks, n_nodes, log_ptr, None, None)
        else:
            rc = self.plugin.init(n_ranks, n_nodes, log_ptr, ctypes.byref(self.ctx))
        if rc != 0:
            raise LagomError(f"tuner init (v{abi}) returned {rc}")

    def get_coll_info(self, coll_type: int, n_bytes: int, costs: list[list[float]] | None = None,
                      num_pipe_ops: int = 1, reg_buff: int = 0, coll_net_support: int = 0,
                      nvls_support: int = 0) -> CollResult:
        """One getCollInfo call; ``costs`` is [numAlgo][3] (v3+); v2 gets the support flags instead."""
        n_channels = ctypes.c_int(0)
        if self.abi == 2:
            algo, proto = ctypes.c_int(-1), ctypes.c_int(-1)
            rc = self.plugin.getCollInfo(self.ctx, coll_type, n_bytes, coll_net_support, nvls_support, num_pipe_ops,
                                         ctypes.byref(algo), ctypes.byref(proto), ctypes.byref(n_channels))
            return CollResult(rc, n_channels.value, [], algo.value, proto.value)
        costs = costs or [[IGNORE] * NUM_PROTOCOLS]
        num_algo = len(costs)
        flat = (ctypes.c_float * (num_algo * NUM_PROTOCOLS))(*[c for row in costs for c in row])
        if self.abi == 3:
            rc = self.plugin.getCollInfo(self.ctx, coll_type, n_bytes, num_pipe_ops, flat, num_algo, NUM_PROTOCOLS,
                                         ctypes.byref(n_channels))
        else:
            rc = self.plugin.getCollInfo(self.ctx, coll_type, n_bytes, num_pipe_ops, flat, num_algo, NUM_PROTOCOLS,
                                         reg_buff, ctypes.byref(n_channels))
        after = [[flat[a * NUM_PROTOCOLS + p] for p in range(NUM_PROTOCOLS)] for a in range(num_algo)]
        return CollResult(rc, n_channels.value, after)

    def get_chunk_size(self, coll_type: int, n_bytes: int, algo: int, proto: int, n_channels: int,
                       nccl_chunk_bytes: int) -> int:
        """v6/v7 getChunkSize: NCCL's chunk in, the plugin's chunk out."""
        if self.abi < 6:
            raise LagomError(f"getChunkSize needs tuner ABI v6, this context is v{self.abi}")
        value = ctypes.c_size_t(nccl_chunk_bytes)
        rc = self.plugin.getChunkSize(self.ctx, coll_type, n_bytes, algo, proto, n_channels, ctypes.byref(value))
        if rc != 0:
            raise LagomError(f"getChunkSize returned {rc}")
        return value.value

    def close(self) -> None:
        if self.ctx:
            self.plugin.finalize(self.ctx)
            self.ctx = ctypes.c_void_p()

    def __enter__(self) -> TunerContext:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
