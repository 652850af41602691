"""From noisy step measurements to one Timing the search can be told.

Two reductions, neither of which adds floats (so every rank that runs them on the same
bytes gets the same answer, and a rank's own value is never averaged away):

- over the steps of one evaluation, on each rank: the *lower median* of every field
  (:func:`robust_timing`), a selection, robust to one slow step in three;
- over the ranks: the step time is the *maximum* (the slowest rank is the critical
  path), each collective's time the *minimum* (every rank's span includes its wait for
  the slowest peer: the least skewed one is nearest the collective's own time), in
  :func:`across_ranks`.

A Timing travels between ranks as :func:`timing_to_wire` / :func:`timing_from_wire`
(plain lists, JSON-safe).
"""

from __future__ import annotations

from collections.abc import Sequence

from costmodel.evaluator import OpTiming, Timing

_FIELDS = ("iteration_us", "compute_us", "comm_us", "exposed_comm_us", "compute_uncontended_us")


def lower_median(values: Sequence[float]) -> float:
    """The middle value (the lower one of the two middles for an even count): a selection."""
    if not values:
        raise ValueError("lower_median of no values")
    ordered = sorted(values)
    return ordered[(len(ordered) - 1) // 2]


def robust_timing(samples: Sequence[Timing]) -> Timing:
    """One rank's evaluation: the lower median of each field and of each op's start and duration."""
    fields = {name: lower_median([getattr(t, name) for t in samples]) for name in _FIELDS}
    ops = {}
    for op_id in samples[0].ops:
        starts = [t.ops[op_id].start_us for t in samples if op_id in t.ops]
        durations = [t.ops[op_id].duration_us for t in samples if op_id in t.ops]
        ops[op_id] = OpTiming(lower_median(starts), lower_median(durations))
    return _timing(fields, ops)


def _timing(fields: dict[str, float], ops: dict[int, OpTiming]) -> Timing:
    return Timing(fields["iteration_us"], fields["compute_us"], fields["comm_us"], fields["exposed_comm_us"],
                  fields["compute_uncontended_us"], ops)


def across_ranks(per_rank: Sequence[Timing]) -> Timing:
    """The evaluation all ranks agree on: MAX of the step-level fields, MIN of each op's duration."""
    fields = {name: max(getattr(t, name) for t in per_rank) for name in _FIELDS}
    ops = {}
    for op_id in per_rank[0].ops:
        present = [t.ops[op_id] for t in per_rank if op_id in t.ops]
        ops[op_id] = OpTiming(min(o.start_us for o in present), min(o.duration_us for o in present))
    return _timing(fields, ops)


def timing_to_wire(timing: Timing) -> list:
    return [
        [getattr(timing, name) for name in _FIELDS],
        [[i, o.start_us, o.duration_us] for i, o in timing.ops.items()],
    ]


def timing_from_wire(data: list) -> Timing:
    fields, ops = data
    return _timing({name: float(v) for name, v in zip(_FIELDS, fields, strict=True)},
                   {int(i): OpTiming(float(s), float(d)) for i, s, d in ops})
