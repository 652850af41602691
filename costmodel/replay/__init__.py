"""Replaying a trace's execution graph: the scheduler both evaluators share (docs/replay.md).

:mod:`.schedule` schedules the graph with one duration per op and reports per step
beside what the trace measured; :mod:`.anchor` gives those durations under a plan,
anchored at the measured ones, from either evaluator's mechanism.
"""
