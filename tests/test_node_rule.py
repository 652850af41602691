"""The one node rule (costmodel/replay/schedule_kernel.py ``_op_start`` / ``_wait_finish``) drives the
one-rank pass and the joint pass alike: on random graphs under durations other than the measured
ones, one rank and several, the joint pass with no collective joining two ranks places every node
where the one-rank pass does, its compiled and plain-Python forms agree to the last bit, and a
matched collective's members end together a transfer after the last arrival."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from costmodel.replay.schedule import graph_edges
from costmodel.replay.schedule_kernel import joint_pass, schedule_pass


@dataclass
class Graph:
    """One graph (ops 0..n-1, waits n..) in the arrays the passes read; ``comp``: each op's component
    (its rank), every edge inside one component."""

    n: int
    preds: list[tuple[int, ...]]
    launch_wait: list[int]
    awaited: list[tuple[int, ...]]
    wait_prev: list[int]
    wait_cause: list[int]
    arrays: dict
    comp: list[int]


def _csr(rows: list[tuple[int, ...]]) -> tuple[np.ndarray, np.ndarray]:
    ptr = np.zeros(len(rows) + 1, dtype=np.int64)
    ptr[1:] = np.cumsum([len(r) for r in rows])
    return ptr, np.array([x for r in rows for x in r], dtype=np.int64)


@st.composite
def graphs(draw, ranks: int) -> Graph:
    """Per rank, nodes made one after another, each caused only by earlier nodes of its rank (acyclic)."""
    ops: list[dict] = []
    waits: list[dict] = []
    comp: list[int] = []
    for r in range(ranks):
        mine_ops: list[int] = []
        mine_waits: list[int] = []
        for _ in range(draw(st.integers(1, 14))):
            if mine_ops and draw(st.booleans()) and len(mine_waits) < 5:
                awaited = tuple(sorted(set(draw(st.lists(st.sampled_from(mine_ops), max_size=2)))))
                prev = draw(st.sampled_from([-1, *mine_waits]))
                cause = draw(st.sampled_from([-1, *mine_waits]))
                waits.append({"awaited": awaited, "prev": prev, "cause": cause, "thread": r,
                              "begin": draw(st.sampled_from([math.nan, draw(st.floats(0, 100))])),
                              "own": draw(st.floats(0, 5)), "end": draw(st.floats(0, 200)),
                              "ret": draw(st.floats(0, 3)),
                              "cause_us": math.nan if cause < 0 else draw(st.floats(0, 150))})
                mine_waits.append(len(waits) - 1)
                continue
            preds = tuple(sorted(set(draw(st.lists(st.sampled_from(mine_ops), max_size=2))))) if mine_ops else ()
            has_call = draw(st.booleans())
            ops.append({"preds": preds, "call": draw(st.floats(0, 100)) if has_call else math.nan,
                        "lat": draw(st.floats(0, 5)), "thread": r if has_call else -1,
                        "wait": draw(st.sampled_from([-1, *mine_waits])) if has_call else -1,
                        "gap": draw(st.floats(0, 4)), "start": draw(st.floats(0, 200))})
            mine_ops.append(len(ops) - 1)
            comp.append(r)
    n = len(ops)
    f64, i64 = np.float64, np.int64
    pred_ptr, pred_idx = _csr([o["preds"] for o in ops])
    awaited_ptr, awaited_idx = _csr([w["awaited"] for w in waits])

    def columns(rows: list[dict], dtype, **keys: str) -> dict[str, np.ndarray]:
        """One array per ``name=key``: each row's ``key``."""
        return {name: np.array([row[key] for row in rows], dtype=dtype) for name, key in keys.items()}

    arrays = {
        "pred_ptr": pred_ptr, "pred_idx": pred_idx, "awaited_ptr": awaited_ptr, "awaited_idx": awaited_idx,
        **columns(ops, f64, launch_call="call", launch_latency="lat", gap="gap", measured_start="start"),
        **columns(ops, i64, launch_thread="thread", launch_wait="wait"),
        **columns(waits, i64, wait_thread="thread", wait_prev="prev", wait_cause="cause"),
        **columns(waits, f64, wait_begin="begin", wait_own="own", wait_end="end", wait_return="ret",
                  wait_cause_us="cause_us"),
        "wait_cause_thread": np.array([w["thread"] if w["cause"] >= 0 else -1 for w in waits], dtype=i64),
        "anchor": np.array([draw(st.floats(0, 50)) for _ in range(ranks)], dtype=f64),
    }
    return Graph(n, [o["preds"] for o in ops], [o["wait"] for o in ops], [w["awaited"] for w in waits],
                 [w["prev"] for w in waits], [w["cause"] for w in waits], arrays, comp)


def _edges(g: Graph) -> tuple[list[list[int]], list[int]]:
    return graph_edges(g.n, len(g.wait_prev), g.preds, g.launch_wait, g.awaited, g.wait_prev, g.wait_cause)


def _order(g: Graph) -> np.ndarray:
    succ, indeg = _edges(g)
    indeg = list(indeg)
    order = [v for v in range(len(indeg)) if indeg[v] == 0]
    for v in order:
        for s in succ[v]:
            indeg[s] -= 1
            if indeg[s] == 0:
                order.append(s)
    return np.array(order, dtype=np.int64)


def _one_rank(g: Graph, cpu: float, durations: np.ndarray, fn=schedule_pass):
    a = g.arrays
    return fn(_order(g), g.n, a["pred_ptr"], a["pred_idx"], a["launch_call"], a["launch_latency"],
              a["launch_thread"], a["launch_wait"], a["gap"], a["measured_start"], a["wait_thread"], a["wait_prev"],
              a["wait_begin"], a["wait_own"], a["wait_end"], a["wait_return"], a["awaited_ptr"], a["awaited_idx"],
              a["wait_cause_thread"], a["wait_cause"], a["wait_cause_us"], a["anchor"], cpu, durations)


def _joint(g: Graph, cpu: float, durations: np.ndarray, members: list[list[int]], transfer: np.ndarray,
           offsets: np.ndarray, lag: np.ndarray, fn=joint_pass):
    a = g.arrays
    succ, indeg = _edges(g)
    succ_ptr, succ_idx = _csr([tuple(s) for s in succ])
    match_of = np.full(g.n, -1, dtype=np.int64)
    for i, mem in enumerate(members):
        match_of[mem] = i
    mem_ptr, mem_idx = _csr([tuple(m) for m in members])
    m = len(g.wait_prev)
    op_offset = offsets[np.array(g.comp, dtype=np.int64)]
    last_meas = np.array([max(a["measured_start"][k] + op_offset[k] for k in mem) + 1.0 for mem in members])
    return fn(g.n, succ_ptr, succ_idx, np.array(indeg, dtype=np.int64), a["pred_ptr"], a["pred_idx"],
              a["launch_call"], a["launch_latency"], a["launch_thread"], a["launch_wait"], a["gap"],
              a["measured_start"], a["wait_thread"], a["wait_prev"], a["wait_begin"], a["wait_own"], a["wait_end"],
              a["wait_return"], a["awaited_ptr"], a["awaited_idx"], a["wait_cause_thread"], a["wait_cause"],
              a["wait_cause_us"], a["anchor"], np.full(g.n, cpu), np.full(m, cpu), match_of, mem_ptr, mem_idx,
              op_offset, last_meas, lag, transfer, durations)


def _durations(draw, g: Graph) -> np.ndarray:
    return np.array([draw(st.floats(0.1, 30)) for _ in range(g.n)], dtype=np.float64)


@settings(max_examples=60, deadline=None)
@given(st.data(), st.integers(1, 3), st.sampled_from([1.0, 0.7, 1.6]))
def test_joint_pass_without_matches_is_the_one_rank_pass(data, ranks, cpu):
    g = data.draw(graphs(ranks))
    durations = _durations(data.draw, g)
    starts, ends, new_end, _ = _one_rank(g, cpu, durations)
    j_starts, j_ends, j_new_end, held, stuck = _joint(g, cpu, durations, [], np.zeros(g.n), np.zeros(ranks),
                                                       np.zeros(0))
    assert stuck == 0 and not held.any()
    assert np.array_equal(starts, j_starts) and np.array_equal(ends, j_ends)
    assert np.array_equal(new_end, j_new_end)


@settings(max_examples=60, deadline=None)
@given(st.data(), st.integers(2, 3), st.sampled_from([1.0, 1.3]))
def test_matched_members_end_together_and_both_forms_agree(data, ranks, cpu):
    g = data.draw(graphs(ranks))
    durations = _durations(data.draw, g)
    by_rank = [[k for k in range(g.n) if g.comp[k] == r] for r in range(ranks)]
    members: list[list[int]] = []
    used: set[int] = set()
    for _ in range(data.draw(st.integers(0, 3))):
        mem = [data.draw(st.sampled_from(ops)) for ops in by_rank]
        if used.isdisjoint(mem):
            members.append(mem)
            used.update(mem)
    transfer = np.array([data.draw(st.floats(0.5, 20)) for _ in range(g.n)])
    offsets = np.array([data.draw(st.floats(-50, 50)) for _ in range(ranks)])
    lag = np.array([data.draw(st.sampled_from([0.0, 2.5])) for _ in members])
    compiled = _joint(g, cpu, durations, members, transfer, offsets, lag)
    plain = _joint(g, cpu, durations, members, transfer, offsets, lag, fn=joint_pass.py_func)
    for x, y in zip(compiled, plain):
        assert np.array_equal(np.asarray(x), np.asarray(y))
    starts, ends, _, held, stuck = compiled
    assert stuck == 0
    assert np.all(ends >= starts)
    comp = np.array(g.comp)
    for i, mem in enumerate(members):
        if held[i]:
            continue
        last = max(starts[k] + offsets[comp[k]] for k in mem)
        for k in mem:
            assert ends[k] >= last - offsets[comp[k]] + transfer[k] - 1e-9 or ends[k] == starts[k]
    for k in range(g.n):  # every op after its stream predecessors and producers, plus its gap
        for p in g.preds[k]:
            assert starts[k] >= ends[p] + g.arrays["gap"][k] - 1e-9
