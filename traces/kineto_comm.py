"""What a trace says about one collective: type, size, dtype and process group.

:class:`CommInfo` is filled from several sources in priority order (the first to
give a field wins): the kernel's own args, ``record_param_comms`` metadata, then the
names and tensor shapes of the CPU comm calls around the launch. See :mod:`traces.kineto`.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from dataclasses import dataclass

from nccl_env.knobs import CollectiveType
from traces.comm_names import collective_from_call_name, dtype_bytes
from traces.kineto_events import CommCall, to_int

P2P_KINDS = ("send", "recv")  # PyTorch's "Collective name" of a point-to-point op (and nccl:send / nccl:recv)


def parse_ranks(value: object) -> tuple[int, ...]:
    """Group ranks from a list or a "[0, 1]" string; () where the list is cut short (PyTorch
    writes the first 30 ranks and "..." of a larger group: torch/csrc/profiler/util.cpp
    format_list, kTruncatLength) or empty (a group not evenly spaced: see docs/reference.md)."""
    if isinstance(value, str):
        if "..." in value:
            return ()
        return tuple(int(x) for x in re.findall(r"-?\d+", value))
    if isinstance(value, list):
        out = [to_int(v) for v in value]
        return tuple(x for x in out if x is not None)
    return ()


@dataclass(frozen=True)
class PeerRef:
    """The peer a send/recv's metadata names, as written: a global rank (``Src Rank`` /
    ``Dst Rank``) or the peer's rank in the op's process group (``Rank``)."""

    sends: bool  # the op is a send: the peer is the data's destination
    rank: int
    is_global: bool
    field: str  # the metadata key it came from (for a warning that names it)


@dataclass
class CommInfo:
    collective: CollectiveType | None = None
    message_bytes: int | None = None
    dtype: str | None = None
    group: str | None = None
    group_ranks: tuple[int, ...] = ()
    group_size: int | None = None
    # a send/recv's p2p metadata: "send" or "recv"; Kineto's "Src Rank" / "Dst Rank" (the peer's
    # GLOBAL rank, PyTorch 2.5+, evenly spaced groups only), "Rank" (on a send/recv: the peer's rank
    # in its group; on a collective: the rank's own) and "Seq"; traces.kineto resolves them to a P2PLink
    p2p_kind: str | None = None
    src_rank: int | None = None
    dst_rank: int | None = None
    rank_arg: int | None = None
    seq: int | None = None

    def absorb_metadata(self, args: dict) -> None:
        """Fill unset fields from PyTorch's comm metadata (kernel args or record_param_comms)."""
        if self.collective is None and isinstance(args.get("Collective name"), str):
            self.collective = collective_from_call_name(args["Collective name"])
        dtype = args.get("dtype")
        if self.dtype is None and isinstance(dtype, str):
            self.dtype = dtype
        if self.message_bytes is None:
            size = dtype_bytes(dtype)
            counts = [n for n in (to_int(args.get("In msg nelems")), to_int(args.get("Out msg nelems")))
                      if n is not None]
            if size is not None and counts:
                self.message_bytes = max(counts) * size
        if self.group is None and isinstance(args.get("Process Group Name"), (str, int)):
            self.group = str(args["Process Group Name"])
        if not self.group_ranks:
            self.group_ranks = parse_ranks(args.get("Process Group Ranks"))
        if self.group_size is None:
            self.group_size = to_int(args.get("Group size"))
        name = args.get("Collective name")
        if self.p2p_kind is None and name in P2P_KINDS:
            self.p2p_kind = str(name)
        if self.src_rank is None:
            self.src_rank = to_int(args.get("Src Rank"))
        if self.dst_rank is None:
            self.dst_rank = to_int(args.get("Dst Rank"))
        if self.rank_arg is None:
            self.rank_arg = to_int(args.get("Rank"))
        if self.seq is None:
            self.seq = to_int(args.get("Seq"))

    def p2p_peer(self) -> PeerRef | None:
        """The peer a send/recv's metadata names: ``Dst Rank`` (a send) or ``Src Rank`` (a recv) as
        a global rank, else ``Rank`` as the peer's rank in its group; None where it names none."""
        kind = self.p2p_kind
        if kind is None:  # the one rank field given says which end the peer is
            ends = (self.src_rank is None, self.dst_rank is None)
            kind = "send" if ends == (True, False) else "recv" if ends == (False, True) else None
        if kind not in P2P_KINDS:
            return None
        peer = self.dst_rank if kind == "send" else self.src_rank
        field = "Dst Rank" if kind == "send" else "Src Rank"
        if peer is None and self.rank_arg is not None:
            return PeerRef(kind == "send", self.rank_arg, False, "Rank")
        return None if peer is None else PeerRef(kind == "send", peer, True, field)

    def absorb_call(self, call: CommCall) -> None:
        """Fill unset fields from a CPU comm call's name and tensor shapes."""
        if call.name == "record_param_comms":
            self.absorb_metadata(call.args)
        elif self.collective is None:
            self.collective = collective_from_call_name(call.name)
        if self.p2p_kind is None and call.name.startswith(BACKEND_CALL_PREFIXES):
            kind = call.name.split(":", 1)[1]
            self.p2p_kind = kind if kind in P2P_KINDS else None
        if self.message_bytes is None:
            nbytes = tensor_bytes(call.args)
            if nbytes:
                self.message_bytes = nbytes
                if self.dtype is None:
                    types = call.args.get("Input type")
                    if isinstance(types, list) and types and isinstance(types[0], str) and dtype_bytes(types[0]):
                        self.dtype = types[0]


def tensor_bytes(args: dict) -> int | None:
    """Largest tensor (elements x dtype size) among a CPU op's ``Input Dims`` / ``Input type``."""
    dims = args.get("Input Dims")
    types = args.get("Input type")
    if not isinstance(dims, list) or not isinstance(types, list):
        return None
    best = None
    for shape, dtype in zip(dims, types):
        size = dtype_bytes(dtype)
        if size is None or not isinstance(shape, list) or not shape:
            continue
        n = 1
        for d in shape:
            dim = to_int(d)
            if dim is None or dim < 0:
                break
            n *= dim
        else:  # every dimension read
            if best is None or n * size > best:
                best = n * size
    return best


def collective_from_call(call: CommCall) -> CollectiveType | None:
    info = CommInfo()
    info.absorb_call(call)
    return info.collective


# The backends' own spans of a collective's work ("gloo:all_reduce" on gloo's worker thread);
# "c10d::allreduce_" is the caller's call that hands the work over (comm_names.COMM_CALL_PREFIXES).
BACKEND_CALL_PREFIXES = ("gloo:", "mpi:", "ucc:", "nccl:")
# how many backend spans after a hand-over may be looked at for its own (the workers run a
# bounded queue in order, so its span is among the next few; bounded, pairing stays linear)
_PAIR_WINDOW = 64


@dataclass
class CpuCollectiveCall:
    """One nest of CPU comm calls on one thread (the outermost call and what it encloses)."""

    outer: CommCall
    info: CommInfo
    backend: bool  # a backend's own span of the work, not the caller's hand-over


def cpu_call_nest(outer: CommCall, members: list[CommCall]) -> CpuCollectiveCall:
    info = CommInfo()
    for call in members:
        info.absorb_call(call)
    return CpuCollectiveCall(outer, info, any(c.name.startswith(BACKEND_CALL_PREFIXES) for c in members))


def issuing_calls(nests: list[CpuCollectiveCall]) -> dict[int, int]:
    """The caller's hand-over calls that a backend's span on another thread ran: index of the
    hand-over -> index of the backend span it handed over.

    A gloo collective appears twice in a trace: ``c10d::allreduce_`` on the calling thread
    (it queues the work and returns) and ``gloo:all_reduce`` on one of gloo's worker threads
    (the work itself). Counting both counts the collective twice. Each hand-over pairs with
    the first backend span on another thread that starts at or after it and is not yet
    paired, of the same collective (and the same size where both record one): gloo's workers
    take the queue in order."""
    spans: dict[CollectiveType | None, list[int]] = {}
    for i in sorted((i for i, n in enumerate(nests) if n.backend), key=lambda i: nests[i].outer.ts):
        spans.setdefault(nests[i].info.collective, []).append(i)
    starts = {kind: [nests[i].outer.ts for i in idx] for kind, idx in spans.items()}
    taken: set[int] = set()
    first_free = dict.fromkeys(spans, 0)  # per collective: spans before this one are all taken
    out: dict[int, int] = {}
    for i in sorted((i for i, n in enumerate(nests) if not n.backend), key=lambda i: nests[i].outer.ts):
        call = nests[i]
        kind = call.info.collective
        candidates = spans.get(kind, [])
        if not candidates:
            continue
        while first_free[kind] < len(candidates) and candidates[first_free[kind]] in taken:
            first_free[kind] += 1
        k = max(bisect_left(starts[kind], call.outer.ts), first_free[kind])
        for j in candidates[k:k + _PAIR_WINDOW]:
            span = nests[j]
            if j in taken or span.outer.thread == call.outer.thread:
                continue
            a, b = span.info.message_bytes, call.info.message_bytes
            if a is not None and b is not None and a != b:
                continue
            taken.add(j)
            out[i] = j
            break
    return out
