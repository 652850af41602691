"""Byte ranges for collectives whose message size changes from step to step.

A tuned setting is matched at run time by message size (the tuned file's
``min_bytes``/``max_bytes``, the plugin table's byte range). Where a collective's size
is fixed (an FSDP all-gather of one layer's parameters), the exact size is the right
range. Where it changes from step to step (an MoE all-to-all carries the tokens the
router sent), a range per size seen once would match nothing in the next step; those
collectives get one range per power of two instead: ``[2^k, 2^(k+1) - 1]`` holds
every size with the same highest bit.

A *family* (process group, collective type) varies when two profiler steps each
carry a size of it that the other does not: a trace cut inside its last step loses
sizes but adds none, so an unfinished step alone does not make a family vary. A
workload with fewer than two profiler steps (a generated iteration) varies nowhere.
Ops are assigned to the step in which they were launched (their start when the trace
has no launch).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable

from nccl_env.knobs import CollectiveType
from nccl_env.plan import Signature
from traces.workload import Workload

Family = tuple[str, CollectiveType]  # (process group, collective type)


def power_of_two_range(nbytes: int) -> tuple[int, int]:
    """The inclusive byte range ``[2^k, 2^(k+1) - 1]`` that holds ``nbytes`` (``(0, 0)`` for 0)."""
    if nbytes <= 0:
        return (0, 0)
    low = 1 << (nbytes.bit_length() - 1)
    return (low, 2 * low - 1)


def varying_families(workload: Workload) -> set[Family]:
    """The (group, collective) families whose sizes change between profiler steps (see the module doc)."""
    steps = sorted(workload.profiler_steps)
    if len(steps) < 2:
        return set()
    starts = [s for s, _ in steps]
    sizes: dict[Family, dict[int, set[int]]] = {}
    for op in workload.collectives:
        if op.message_bytes is None:
            continue
        t = op.launch_us if op.launch_us is not None else op.start_us
        step = bisect_right(starts, t) - 1
        if step < 0 or t > steps[step][1]:
            continue  # before the first step or between steps
        sizes.setdefault((op.group, op.collective), {}).setdefault(step, set()).add(op.message_bytes)
    out = set()
    for family, by_step in sizes.items():
        seen = list(by_step.values())
        if any(a - b and b - a for i, a in enumerate(seen) for b in seen[i + 1:]):
            out.add(family)
    return out


def signature_ranges(workload: Workload, signatures: Iterable[Signature]) -> dict[Signature, tuple[int, int]]:
    """The inclusive byte range each signature's setting should match: its power of two
    where its family varies, else its own size."""
    varying = varying_families(workload)
    return {s: power_of_two_range(s.message_bytes) if (s.group, s.collective) in varying
            else (s.message_bytes, s.message_bytes) for s in signatures}
