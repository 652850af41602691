"""Tuner ABI v7 (NCCL 2.32.6): the plugin exports ncclTunerPlugin_v7, its declarations have the
layout of NCCL's own tuner_v7.h, and NCCL's calls through it (init with v7's constants table,
getCollInfo, getChunkSize, finalize) work and fail safe on bad input."""

from __future__ import annotations

import ctypes
import subprocess

import pytest

from nccl_env.plugin_abi import STRUCTS, NvlDomainInfoV7, TunerConstantsV7, TunerLibrary
from nccl_env.plugin_build import PLUGIN_DIR, build_plugin, find_compiler
from nccl_env.rules import NcclVersion, tuner_symbols

ALLGATHER, ALLREDUCE = 2, 4
RING, SIMPLE = 1, 2
X = -1.0

# Offsets and sizes derived from NVIDIA/nccl src/include/plugin/tuner/tuner_v7.h (2449986f) and
# tuner_v5.h: doubles, baseLatencies [7 algos][3 protos] = 21, hwLatencies [3 links][7][3] = 63,
# then five per-architecture tables [5 compute capabilities][3 scales] = 15 each; 8 bytes a double.
# ncclNvlDomainInfo_v7_t = v5's three ints; ncclTuner_v7_t = name, init, getCollInfo, finalize,
# getChunkSize: five pointers (LP64).
V7_LAYOUT = {
    "sizeof(lagomTunerConstants_v7_t)": (21 + 63 + 5 * 15) * 8,
    "offsetof(lagomTunerConstants_v7_t, hwLatencies)": 21 * 8,
    "offsetof(lagomTunerConstants_v7_t, llMaxBws)": (21 + 63) * 8,
    "offsetof(lagomTunerConstants_v7_t, perChMaxRingLL128Bws)": (21 + 63 + 15) * 8,
    "offsetof(lagomTunerConstants_v7_t, perChMaxTreeLL128Bws)": (21 + 63 + 30) * 8,
    "offsetof(lagomTunerConstants_v7_t, perChMaxTreeBws)": (21 + 63 + 45) * 8,
    "offsetof(lagomTunerConstants_v7_t, perChMaxNVLSTreeBws)": (21 + 63 + 60) * 8,
    "sizeof(lagomNvlDomainInfo_v7_t)": 12,
    "sizeof(lagomTuner_v7_t)": 40,
    "offsetof(lagomTuner_v7_t, init)": 8,
    "offsetof(lagomTuner_v7_t, getCollInfo)": 16,
    "offsetof(lagomTuner_v7_t, finalize)": 24,
    "offsetof(lagomTuner_v7_t, getChunkSize)": 32,
}


@pytest.fixture(scope="module")
def lib() -> TunerLibrary:
    return TunerLibrary(build_plugin(strict=True))


def test_the_c_declarations_have_the_layout_of_nccls_v7_header(tmp_path):
    prints = "".join(f'  printf("%zu\\n", (size_t){expr});\n' for expr in V7_LAYOUT)
    source = tmp_path / "layout.c"
    source.write_text(f'#include <stddef.h>\n#include <stdio.h>\n#include "lagom_tuner_abi.h"\n'
                      f"int main(void) {{\n{prints}  return 0;\n}}\n")
    binary = tmp_path / "layout"
    subprocess.run([find_compiler(), "-std=c11", f"-I{PLUGIN_DIR}", str(source), "-o", str(binary)], check=True)
    values = [int(v) for v in subprocess.run([str(binary)], capture_output=True, text=True,
                                             check=True).stdout.split()]
    assert dict(zip(V7_LAYOUT, values, strict=True)) == V7_LAYOUT


def test_the_ctypes_declarations_have_the_same_layout():
    assert ctypes.sizeof(TunerConstantsV7) == V7_LAYOUT["sizeof(lagomTunerConstants_v7_t)"]
    assert TunerConstantsV7.perChMaxNVLSTreeBws.offset == V7_LAYOUT[
        "offsetof(lagomTunerConstants_v7_t, perChMaxNVLSTreeBws)"]
    assert ctypes.sizeof(NvlDomainInfoV7) == 12
    assert ctypes.sizeof(STRUCTS[7]) == 40 and STRUCTS[7].getChunkSize.offset == 32


def test_the_plugin_exports_v7_and_nccl_2_32_6_loads_it_first(lib):
    assert hasattr(lib.lib, "ncclTunerPlugin_v7") and lib.plugin(7).name == b"Lagom"
    assert tuner_symbols(NcclVersion(2, 32, 6))[0] == "ncclTunerPlugin_v7"
    assert tuner_symbols(NcclVersion(2, 32, 3))[0] == "ncclTunerPlugin_v6"  # its libnccl names v2-v6 only


def _constants() -> TunerConstantsV7:
    """A constants table as NCCL fills it: every cell a distinct number, the Rubin row too."""
    constants = TunerConstantsV7()
    raw = (ctypes.c_double * (ctypes.sizeof(constants) // 8)).from_buffer(constants)
    for i in range(len(raw)):
        raw[i] = 0.5 + i
    return constants


def test_v7_as_nccl_calls_it(lib):
    assert lib.set_table("allgather,1048576,1048576,ring,simple,2,1,8,-1,-1,chunk_bytes=700416\n") == 1
    constants, domain = _constants(), NvlDomainInfoV7(1, 8, 8)
    before = bytes(constants)
    with lib.open(7, 8, 1, comm_id=0xABC, nvl_domain=domain, constants=constants) as comm:
        costs = [[40.1, 30.2, 35.5], [50.3, 25.7, 28.9], [X] * 3, [X] * 3, [X] * 3, [X] * 3, [X, X, 31.0]]
        r = comm.get_coll_info(ALLGATHER, 1 << 20, costs)
        assert r.rc == 0 and r.n_channels == 2 and r.chosen() == (RING, SIMPLE)
        assert comm.get_chunk_size(ALLGATHER, 1 << 20, RING, SIMPLE, 2, 2 << 20) == 700416
        untouched = comm.get_coll_info(ALLREDUCE, 1 << 20, costs)  # no line: NCCL's table as it came
        assert untouched.n_channels == 0 and untouched.costs == [[float(ctypes.c_float(c).value) for c in row]
                                                                for row in costs]
    assert bytes(constants) == before  # NCCL reads the table back: the plugin leaves NCCL's figures


def test_v7_fails_safe_on_bad_input(lib):
    plugin = lib.plugin(7)
    assert plugin.init(None, 0, 8, 1, None, None, None) == 4  # no context pointer: ncclInvalidArgument
    lib.set_table("allgather,0,-1,ring,simple,2,-1,-1\n")
    n_channels = ctypes.c_int(0)
    table = (ctypes.c_float * 21)(*([X] * 21))
    # no context (NCCL never passes one, but a crash would take the job): success, nothing set
    assert plugin.getCollInfo(None, ALLGATHER, 1 << 20, 1, table, 7, 3, 0, ctypes.byref(n_channels)) == 0
    assert n_channels.value == 0 and list(table) == [X] * 21
    chunk = ctypes.c_size_t(65536)
    assert plugin.getChunkSize(None, ALLGATHER, 1 << 20, RING, SIMPLE, 2, ctypes.byref(chunk)) == 0
    assert chunk.value == 65536
    with lib.open(7, 8, 1) as comm:  # NULL domain info and constants (v5/v6 callers' habit): still a context
        assert plugin.getChunkSize(comm.ctx, ALLGATHER, 1 << 20, RING, SIMPLE, 2, None) == 0
        # an unusable pair stays unusable: -1 is never revived, NCCL keeps its choice
        r = comm.get_coll_info(ALLGATHER, 1 << 20, [[X] * 3] * 7)
        assert r.rc == 0 and r.chosen() is None
        # a table with fewer rows than the line's algorithm: no write outside it
        short = (ctypes.c_float * 3)(1.0, 2.0, 3.0)
        assert plugin.getCollInfo(comm.ctx, ALLGATHER, 1 << 20, 1, short, 1, 3, 0, ctypes.byref(n_channels)) == 0
        assert list(short) == [1.0, 2.0, 3.0]
    lib.set_table(None)
