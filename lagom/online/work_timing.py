"""Per-collective times on a GPU: the durations of the Work handles the job's async collectives returned.

Under ``lagom run --online`` the hook (:mod:`lagom.runtime.hook`) hands every Work a
collective call returned (``async_op=True``; a synchronous call returns None and is
not timed) to :meth:`WorkDurations.record`, with the call's signature as the hook
resolved it: ``(collective, group name, ranks, nodes, bytes)``. After the step's end
event has completed, :meth:`WorkDurations.collect` reads ``Work._get_duration()``
(torch, with ``TORCH_NCCL_ENABLE_TIMING=1``: the collective's span on the NCCL stream,
the wait for peers included; docs/reference.md §7) and sums them per signature.

A backend that cannot time its collectives (gloo raises "This Backend doesn't support
getDuration"; NCCL without the timing flag raises too) turns the reading off for the
rest of the job: one line says so, the search then judges by step time alone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from costmodel.evaluator import OpTiming
from nccl_env.plan import Signature

CallSignature = tuple  # (collective value, group name, ranks, nodes or None, bytes): the hook's resolved call


class WorkDurations:
    """The Work handles of one step's async collectives, read at the step's end (see the module doc)."""

    def __init__(self, emit: Callable[[str], None]) -> None:
        self.emit = emit
        self.available = True
        self.works: list[tuple[CallSignature, object]] = []

    def record(self, call: CallSignature, work: object) -> None:
        if self.available:
            self.works.append((call, work))

    def collect(self) -> dict[CallSignature, float]:
        """Microseconds per call signature over the works recorded since the last collect
        (a work not completed yet is left out); {} once timing is found unavailable."""
        works, self.works = self.works, []
        totals_us: dict[CallSignature, float] = {}
        for call, work in works:
            if not self.available:
                break
            try:
                if not work.is_completed():  # type: ignore[attr-defined]  # torch's Work
                    continue
                duration_ms = work._get_duration()  # type: ignore[attr-defined]  # torch's timing API
            except Exception as exc:  # noqa: BLE001 - timing is optional: never fail the job over it
                self.available = False
                first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                self.emit(f"lagom: note: collective durations unavailable ({first}); "
                          "online tuning judges by step time only")
                return {}
            totals_us[call] = totals_us.get(call, 0.0) + float(duration_ms) * 1000.0
        return totals_us


def signature_of_call(signatures: Iterable[Signature], call: CallSignature) -> Signature | None:
    """The workload signature a call signature stands for: the one of the same collective,
    bytes and group size (and nodes, when the call knows them), the one of the same group
    name when several remain; None when none or several do."""
    collective, group, ranks, nodes, nbytes = call
    found = [sig for sig in signatures
             if sig.collective.value == collective and sig.message_bytes == nbytes and sig.ranks == ranks
             and (nodes is None or sig.nodes == nodes)]
    if len(found) > 1:
        found = [sig for sig in found if sig.group == group]
    return found[0] if len(found) == 1 else None


def op_ids_of_call(collective_ids: Mapping[Signature, tuple[int, ...]], call: CallSignature) -> tuple[int, ...]:
    """The workload op ids a call signature stands for (:func:`signature_of_call`); () when none."""
    sig = signature_of_call(collective_ids, call)
    return collective_ids[sig] if sig is not None else ()


def op_timings(totals_us: Mapping[CallSignature, float], collective_ids: Mapping[Signature, tuple[int, ...]],
               cache: dict[CallSignature, tuple[int, ...]]) -> dict[int, OpTiming]:
    """A step's per-op times: each signature's summed duration spread evenly over its op ids
    (the tuner sums a signature's ops, so the total is what counts)."""
    ops: dict[int, OpTiming] = {}
    for call, total_us in totals_us.items():
        ids = cache.get(call)
        if ids is None:
            ids = cache[call] = op_ids_of_call(collective_ids, call)
        for op_id in ids:
            ops[op_id] = OpTiming(0.0, total_us / len(ids))
    return ops
