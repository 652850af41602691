"""Stream waits the trace shows only as a ``cudaStreamWaitEvent`` (no ``cudaEventRecord``,
no ``cuda_sync`` event): which ops they join, on small synthetic traces (docs/replay.md)."""

from __future__ import annotations

from pathlib import Path

from kineto_builder import TraceBuilder

from costmodel.replay.schedule import replay, replay_static
from traces.kineto import read_trace
from traces.workload import Workload

COMPUTE, NCCL = 7, 20


def _relaunch_on(b: TraceBuilder, corr: int, tid: int) -> None:
    """Move the launch call of the op with correlation ``corr`` to CPU thread ``tid``."""
    for e in b.events:
        if e["cat"] == "cuda_runtime" and e["args"].get("correlation") == corr:
            e["tid"] = tid


def _wait(b: TraceBuilder, ts: float, tid: int) -> None:
    b.corr += 1
    b.events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamWaitEvent", "pid": 1, "tid": tid,
                     "ts": ts, "dur": 1, "args": {"correlation": b.corr}})


def _by_name(w: Workload) -> dict[str, int]:
    return {o.name: o.op_id for o in w.compute_ops}


def _ddp_like(tmp_path: Path, optimizer_start_us: float) -> Workload:
    """Thread 2 launches an all-reduce on the NCCL stream and waits for it (work.wait(), no
    record in the trace); thread 1 then launches the optimizer on the compute stream."""
    b = TraceBuilder()
    b.kernel("backward_gemm", COMPUTE, 20, 100, launch_ts=10)
    reduce_corr = b.kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
                           NCCL, 130, 400, launch_ts=15)
    _relaunch_on(b, reduce_corr, 2)
    _wait(b, 17, 2)
    b.kernel("optimizer_step", COMPUTE, optimizer_start_us, 50, launch_ts=40)
    late_corr = b.kernel("next_backward", COMPUTE, 1000, 10, launch_ts=900)  # thread 2's next launch: compute
    _relaunch_on(b, late_corr, 2)
    return read_trace(b.write(tmp_path / "ddp.json"))[0]


def test_a_wait_with_no_record_joins_the_collective_to_the_next_op_on_the_waiting_stream(tmp_path):
    w = _ddp_like(tmp_path, optimizer_start_us=534)
    ops = _by_name(w)
    waits = {(s.producer, s.consumer, s.source) for s in w.exec_graph.stream_waits}
    allreduce = next(c.op_id for c in w.collectives)
    # launched by another thread than the wait's, but the first op on the stream after it
    assert waits == {(allreduce, ops["optimizer_step"], "unrecorded wait")}
    st = replay_static(w)
    durations = list(st.measured_dur)
    durations[st.op_ids.index(allreduce)] -= 200.0
    faster = replay(st, durations)
    assert faster.ops[ops["optimizer_step"]].start_us == (
        replay(st, st.measured_dur).ops[ops["optimizer_step"]].start_us - 200.0)


def test_a_wait_the_trace_contradicts_adds_nothing(tmp_path):
    w = _ddp_like(tmp_path, optimizer_start_us=300)  # started while the all-reduce still ran
    assert not w.exec_graph.stream_waits
