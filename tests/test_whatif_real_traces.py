"""What-ifs on real traces move the right way (issue: the replay predicts a change).

On every trace the suite can read: collectives at half their measured time never lengthen
a step, at twice never shorten one, and the step never shrinks by more than the collective
time on its critical path. On a trace where the GPU is the bottleneck and collectives are
exposed (a100_w16, in ../shared only), halving them shortens the mean step.
"""

from __future__ import annotations

import functools

import pytest
from conftest import all_test_traces, trace_path

from costmodel.analytic.evaluator import AnalyticEvaluator
from costmodel.cluster import load_cluster
from costmodel.evaluator import DurationScale
from costmodel.replay.trace_evaluator import ReplayEvaluator
from nccl_env.errors import LagomError
from nccl_env.plan import Plan
from traces.kineto import read_trace
from traces.workload import Workload

EPS_US = 1e-6
# the ratios play no part: Plan() throughout
_EVALUATOR = ReplayEvaluator(AnalyticEvaluator(load_cluster("a100-nvswitch")), 8)


@functools.cache
def _replayable(path) -> Workload | None:
    try:
        w = read_trace(path)[0]
    except LagomError:
        return None
    return w if w.exec_graph is not None and w.collectives else None


TRACES = [p for p in all_test_traces() if _replayable(p) is not None]


@pytest.mark.parametrize("path", TRACES, ids=[p.name for p in TRACES])
def test_faster_collectives_never_lengthen_a_step_and_slower_never_shorten_one(path):
    w = _replayable(path)
    base = _EVALUATOR.evaluate(w, Plan())
    half = _EVALUATOR.evaluate(w, Plan(), DurationScale(comm=0.5))
    double = _EVALUATOR.evaluate(w, Plan(), DurationScale(comm=2.0))
    assert base.steps and len(half.steps) == len(double.steps) == len(base.steps)
    for b, h, d in zip(base.steps, half.steps, double.steps):
        assert h.iteration_us <= b.iteration_us + EPS_US
        assert d.iteration_us >= b.iteration_us - EPS_US
        assert h.comm_us == pytest.approx(b.comm_us / 2, rel=0.05) or h.comm_us < b.comm_us
        # the critical path's collective time bounds what faster collectives can save
        assert b.iteration_us - h.iteration_us <= 0.5 * b.critical_comm_us + 1.0
        assert b.measured_iteration_us == h.measured_iteration_us  # what the trace measured stays the trace's


def test_on_a_gpu_bound_trace_with_exposed_collectives_halving_them_shortens_the_step():
    w = _replayable(trace_path("a100_w16_sendrecv_3streams_rank0.json.gz"))
    base = _EVALUATOR.evaluate(w, Plan())
    assert base.exposed_comm_us > 0.1 * base.iteration_us  # exposed collectives
    half = _EVALUATOR.evaluate(w, Plan(), DurationScale(comm=0.5))
    double = _EVALUATOR.evaluate(w, Plan(), DurationScale(comm=2.0))
    assert half.iteration_us < 0.97 * base.iteration_us
    assert double.iteration_us > 1.05 * base.iteration_us
    # the steps the critical path runs through collectives shrink by nearly half that time
    for b, h in zip(base.steps, half.steps):
        if b.critical_comm_us > 0.05 * b.iteration_us:
            assert b.iteration_us - h.iteration_us >= 0.4 * b.critical_comm_us


def test_scaling_compute_moves_a_gpu_bound_trace_too():
    w = _replayable(trace_path("a100_w16_sendrecv_3streams_rank0.json.gz"))
    base = _EVALUATOR.evaluate(w, Plan())
    slower = _EVALUATOR.evaluate(w, Plan(), DurationScale(compute=1.5))
    faster = _EVALUATOR.evaluate(w, Plan(), DurationScale(compute=0.5))
    assert faster.iteration_us < base.iteration_us < slower.iteration_us


def test_a_scale_on_a_generated_workload_is_refused():
    from traces.generate import generate_workload

    w = generate_workload("fsdp:phi2:gpus=8")
    with pytest.raises(LagomError, match="not a trace"):
        _EVALUATOR.evaluate(w, Plan(), DurationScale(comm=0.5))
