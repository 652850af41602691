"""The Workload: one rank's training iteration as streams of operations.

This is the input of every analysis, evaluator and search (parse once, analyse many
times). A Workload is plain data: dataclasses with explicit units, a JSON round trip
(:meth:`Workload.to_dict` / :meth:`Workload.from_dict`), and no behaviour beyond
simple lookups. Analyses live in their own modules (``traces.overlap``, ...).

Times are microseconds from the start of the trace (``start_us``, ``duration_us``).
For a trace, durations are the observed ones (already slowed by any contention);
for a generated workload, compute durations are the uncontended estimate and start
times are a schedule hint that evaluators recompute from stream order and
dependencies.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field, fields

from nccl_env.knobs import Algorithm, CollectiveType, CommPath, Protocol
from nccl_env.plan import Signature
from traces.exec_graph import ExecGraph

WORKLOAD_FORMAT_VERSION = 1

# the data model's public names (``traces`` re-exports them)
__all__ = ["CollectiveOp", "ComputeOp", "Dependency", "DependencyKind", "ProcessGroup", "RecordedSteps", "Stream",
           "StreamKind", "Workload"]


class StreamKind(enum.Enum):
    COMPUTE = "compute"
    COMMUNICATION = "communication"
    MEMORY = "memory"  # memcpy / memset only


@dataclass(frozen=True)
class Stream:
    stream_id: int
    kind: StreamKind
    name: str = ""


@dataclass(frozen=True)
class ProcessGroup:
    """A communicator: its name (PyTorch's process group name), member ranks, span."""

    name: str
    ranks: tuple[int, ...]
    nodes: int | None = None  # nodes the group spans; None when the trace does not say

    @property
    def size(self) -> int:
        return len(self.ranks)


@dataclass
class ComputeOp:
    """A compute (or memory) kernel on a stream, with the launch shape that drives SM contention."""

    op_id: int
    name: str
    stream: int
    start_us: float
    duration_us: float
    grid: tuple[int, int, int] | None = None
    block: tuple[int, int, int] | None = None
    blocks_per_sm: float | None = None
    registers_per_thread: int | None = None
    shared_memory_bytes: int | None = None
    occupancy_pct: float | None = None
    flops: float | None = None  # floating-point operations, when known (generated workloads)
    dram_bytes: float | None = None  # bytes read + written from device memory, when known
    is_memory_op: bool = False  # memcpy / memset rather than a compute kernel
    launch_us: float | None = None  # CPU time of the runtime call that launched it (traces only)

    @property
    def end_us(self) -> float:
        return self.start_us + self.duration_us

    @property
    def thread_blocks(self) -> int | None:
        """Total blocks launched (grid x*y*z), or None when unknown."""
        if self.grid is None:
            return None
        return self.grid[0] * self.grid[1] * self.grid[2]


@dataclass(frozen=True)
class P2PLink:
    """A send/recv's two ends, as global ranks: the data moves from ``src`` to ``dst``. From
    Kineto's ``Dst Rank`` (on a send) or ``Src Rank`` (on a recv), the peer's global rank
    (PyTorch 2.5+), else ``Rank``, the peer's rank in its process group, mapped through the
    group's ranks (docs/reference.md §4); the other end is the trace's own rank. ``seq``:
    PyTorch's sequence number of the op (``Seq``), where recorded."""

    src: int
    dst: int
    seq: int | None = None


@dataclass
class CollectiveOp:
    """A communication kernel (or, in CPU-only traces, a collective call) on a stream.

    Two kinds of collective are not NCCL's to tune, and :attr:`tunable` says so: one
    whose size the trace did not record (``message_bytes`` None: shown as "unknown",
    never as 0 bytes) and a communication kernel that is not NCCL's
    (``nccl_tunable=False``: symmetric-memory ``multimem_*`` and custom one-shot /
    two-shot all-reduce kernels, :mod:`traces.comm_names`), which NCCL's knobs do not reach.
    """

    op_id: int
    name: str
    collective: CollectiveType
    message_bytes: int | None  # bytes of the larger of input and output buffers on this rank; None: not recorded
    stream: int
    start_us: float
    duration_us: float
    group: str  # ProcessGroup.name
    dtype: str | None = None
    p2p: P2PLink | None = None  # a send/recv's two ends where the trace names its peer (None: not said)
    recorded_algorithm: Algorithm | None = None  # as observed, when the trace says (kernel names are unreliable)
    recorded_protocol: Protocol | None = None
    on_gpu: bool = True  # False when only the CPU-side call was recorded (e.g. gloo)
    launch_us: float | None = None  # CPU time of the runtime call that launched it (traces only)
    nccl_tunable: bool = True  # False: a communication kernel that is not NCCL's (see the class doc)
    # how NCCL moved it, when the trace shows a path off its ring/tree kernels: SYMMETRIC (an
    # ncclSymkDevKernel_*, a few CTAs) or COPY_ENGINE (memory copies, no SM); None: NCCL's kernels
    recorded_path: CommPath | None = None  # the file's key: comm_path

    @property
    def end_us(self) -> float:
        return self.start_us + self.duration_us

    @property
    def holds_sms(self) -> bool:
        """False for a copy-engine collective: its copies take no SM (but DRAM and the link)."""
        return self.recorded_path is not CommPath.COPY_ENGINE

    @property
    def tunable(self) -> bool:
        """NCCL's knobs reach it and its signature is known: the tuner may set it."""
        return self.nccl_tunable and self.message_bytes is not None


class DependencyKind(enum.Enum):
    EVENT = "event"  # cudaEventRecord on one stream, cudaStreamWaitEvent on another
    DATA = "data"  # generated workloads: the consumer needs the producer's output


@dataclass(frozen=True)
class Dependency:
    """``after`` may not start before ``before`` has finished (op ids)."""

    before: int
    after: int
    kind: DependencyKind = DependencyKind.DATA


Op = ComputeOp | CollectiveOp


RECORD_METADATA_KEY = "lagomRecord"  # the top-level trace metadata `lagom record` writes (docs/record.md)


@dataclass(frozen=True)
class RecordedSteps:
    """The step times ``lagom record`` wrote into a trace's ``lagomRecord`` metadata
    (docs/record.md): the steps timed just before the profiled window without the
    profiler, and the profiled steps, on the same clock (``"cuda_events"``: the GPU
    timeline of the compute stream; ``"host"``: the CPU's wall clock), microseconds,
    one value per step. ``*_host_us`` are the host's times in both cases."""

    clock: str
    unprofiled_us: tuple[float, ...]
    profiled_us: tuple[float, ...]
    unprofiled_host_us: tuple[float, ...] = ()
    profiled_host_us: tuple[float, ...] = ()


@dataclass
class Workload:
    """One rank's iteration (or trace span): streams, ops, groups and dependencies.

    ``compute_ops`` and ``collectives`` are each sorted by ``start_us``; op ids are
    unique across both lists. Ops on one stream run in list order.
    """

    rank: int
    world_size: int
    streams: list[Stream] = field(default_factory=list)
    compute_ops: list[ComputeOp] = field(default_factory=list)
    collectives: list[CollectiveOp] = field(default_factory=list)
    groups: dict[str, ProcessGroup] = field(default_factory=dict)
    dependencies: list[Dependency] = field(default_factory=list)
    source: str = ""  # file the workload came from, or the generator spec
    device_name: str | None = None
    sm_count: int | None = None
    device_mem_bytes: int | None = None  # deviceProperties totalGlobalMem
    compute_capability: tuple[int, int] | None = None  # deviceProperties computeMajor, computeMinor
    device_count: int | None = None  # devices the trace's deviceProperties lists (the GPUs its process saw)
    gpus_per_node: int | None = None
    profiler_steps: list[tuple[float, float]] = field(default_factory=list)  # (start_us, end_us) per ProfilerStep
    nccl_version: str | None = None  # the NCCL the job ran, as the trace records it (distributedInfo.nccl_version)
    world_size_known: bool = True  # False: the trace records no world size; world_size counts the ranks read
    exec_graph: ExecGraph | None = None  # traces only: what a replay schedules (traces.exec_graph)
    recorded_steps: RecordedSteps | None = None  # traces from `lagom record` only (not in the workload JSON)
    input_warnings: list[str] = field(default_factory=list)  # what the reader dropped, one line each (not saved)

    # ---- lookups -----------------------------------------------------------------
    def op(self, op_id: int) -> Op:
        index = self.__dict__.get("_index")
        if index is None or len(index) != len(self.compute_ops) + len(self.collectives):
            ops: tuple[Op, ...] = (*self.compute_ops, *self.collectives)
            index = {o.op_id: o for o in ops}
            self.__dict__["_index"] = index
        return index[op_id]

    def stream_kind(self, stream_id: int) -> StreamKind | None:
        for s in self.streams:
            if s.stream_id == stream_id:
                return s.kind
        return None

    def group_size(self, group: str) -> int:
        """Ranks in a process group (the whole world when the workload does not describe it)."""
        known = self.groups.get(group)
        return known.size if known is not None else self.world_size

    def signature(self, op: CollectiveOp, gpus_per_node: int | None = None) -> Signature:
        """The run-time match key of a collective. ``nodes`` comes from the group,
        else from ``gpus_per_node`` (argument, then the workload's), else 1.

        A collective without a recorded size gets 0 bytes here, for the evaluators only
        (a latency-only stand-in for its time); it is not :attr:`CollectiveOp.tunable`,
        so no search space, plan or tuned file ever holds that signature."""
        group = self.groups.get(op.group)
        ranks = self.group_size(op.group)
        nodes = group.nodes if group is not None else None
        if nodes is None:
            per_node = gpus_per_node or self.gpus_per_node
            if per_node and group is not None:
                nodes = len({r // per_node for r in group.ranks})
            elif per_node:
                nodes = max(1, -(-ranks // per_node))
            else:
                nodes = 1
        return Signature(op.group, op.collective, op.message_bytes or 0, ranks, nodes)

    @property
    def span_us(self) -> float:
        """From the first op's start to the last op's end (0 for an empty workload)."""
        ops: list[Op] = [*self.compute_ops, *self.collectives]
        if not ops:
            return 0.0
        return max(o.end_us for o in ops) - min(o.start_us for o in ops)

    # ---- JSON round trip -----------------------------------------------------------
    def to_dict(self) -> dict:
        out = self._to_dict()
        if self.exec_graph is not None:
            out["exec_graph"] = self.exec_graph.to_dict()
        return out

    def _to_dict(self) -> dict:
        return {
            "format": "lagom.workload",
            "version": WORKLOAD_FORMAT_VERSION,
            "rank": self.rank,
            "world_size": self.world_size,
            "source": self.source,
            "device_name": self.device_name,
            "sm_count": self.sm_count,
            **({"device_mem_bytes": self.device_mem_bytes} if self.device_mem_bytes is not None else {}),
            **({"compute_capability": list(self.compute_capability)} if self.compute_capability is not None else {}),
            **({"device_count": self.device_count} if self.device_count is not None else {}),
            "gpus_per_node": self.gpus_per_node,
            "profiler_steps": [list(s) for s in self.profiler_steps],
            **({"nccl_version": self.nccl_version} if self.nccl_version is not None else {}),
            **({} if self.world_size_known else {"world_size_known": False}),
            "streams": [{"stream_id": s.stream_id, "kind": s.kind.value, "name": s.name} for s in self.streams],
            "groups": [
                {"name": g.name, "ranks": list(g.ranks), "nodes": g.nodes} for g in self.groups.values()
            ],
            "compute_ops": [_compute_to_dict(o) for o in self.compute_ops],
            "collectives": [_collective_to_dict(o) for o in self.collectives],
            "dependencies": [[d.before, d.after, d.kind.value] for d in self.dependencies],
        }

    @classmethod
    def from_dict(cls, data: dict) -> Workload:
        """Inverse of :meth:`to_dict`. Raises KeyError/ValueError/TypeError on malformed data;
        :func:`traces.workload_io.load_workload` turns those into a LagomError."""
        if data.get("format") != "lagom.workload":
            raise ValueError("not a Lagom workload (missing 'format': 'lagom.workload')")
        if int(data.get("version", 0)) > WORKLOAD_FORMAT_VERSION:
            raise ValueError(f"workload format version {data['version']} is newer than this Lagom reads")
        return cls(
            rank=int(data["rank"]),
            world_size=int(data["world_size"]),
            source=str(data.get("source", "")),
            device_name=data.get("device_name"),
            sm_count=data.get("sm_count"),
            device_mem_bytes=data.get("device_mem_bytes"),
            compute_capability=_major_minor(data.get("compute_capability")),
            device_count=data.get("device_count"),
            gpus_per_node=data.get("gpus_per_node"),
            profiler_steps=[(float(a), float(b)) for a, b in data.get("profiler_steps", [])],
            nccl_version=data.get("nccl_version"),
            world_size_known=bool(data.get("world_size_known", True)),
            streams=[Stream(int(s["stream_id"]), StreamKind(s["kind"]), s.get("name", "")) for s in data["streams"]],
            groups={
                g["name"]: ProcessGroup(str(g["name"]), tuple(int(r) for r in g["ranks"]), g.get("nodes"))
                for g in data["groups"]
            },
            compute_ops=[_compute_from_dict(o) for o in data["compute_ops"]],
            collectives=[_collective_from_dict(o) for o in data["collectives"]],
            dependencies=[Dependency(int(a), int(b), DependencyKind(k)) for a, b, k in data["dependencies"]],
            exec_graph=ExecGraph.from_dict(data["exec_graph"]) if data.get("exec_graph") is not None else None,
        )


def _major_minor(value: object) -> tuple[int, int] | None:
    """``[8, 0]`` -> ``(8, 0)``; None stays None."""
    if value is None:
        return None
    if not isinstance(value, list | tuple) or len(value) != 2:
        raise ValueError(f"compute_capability must be [major, minor], got {value!r}")
    return int(value[0]), int(value[1])


def _compute_to_dict(op: ComputeOp) -> dict:
    out = asdict(op)
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in out.items() if v is not None}


def _compute_from_dict(data: dict) -> ComputeOp:
    known = {f.name for f in fields(ComputeOp)}
    kwargs = {k: v for k, v in data.items() if k in known}
    for key in ("grid", "block"):
        if kwargs.get(key) is not None:
            kwargs[key] = tuple(int(x) for x in kwargs[key])
    return ComputeOp(**kwargs)


# A recorded NCCL choice: its key in a workload file -> its enum (the field is recorded_<key>).
_RECORDED_KEYS: dict[str, type[Algorithm] | type[Protocol]] = {"algorithm": Algorithm, "protocol": Protocol}


def _collective_to_dict(op: CollectiveOp) -> dict:
    out = asdict(op)
    out["collective"] = op.collective.value
    del out["recorded_path"]  # written as comm_path, last
    out = {k.removeprefix("recorded_"): (v.nccl_name if k.startswith("recorded_") and v is not None else v)
           for k, v in out.items()}  # the file's keys are the settings' names, in the same place
    out["comm_path"] = None if op.recorded_path is None else op.recorded_path.value
    out = {k: v for k, v in out.items() if v is not None and not (k == "nccl_tunable" and v)}
    out["message_bytes"] = op.message_bytes  # null when the trace recorded no size
    return out


def _collective_from_dict(data: dict) -> CollectiveOp:
    known = {f.name for f in fields(CollectiveOp)}
    kwargs = {k: v for k, v in data.items() if k in known}
    kwargs["collective"] = CollectiveType(kwargs["collective"])
    if kwargs.get("p2p") is not None:
        kwargs["p2p"] = P2PLink(**kwargs["p2p"])
    for key, kind in _RECORDED_KEYS.items():
        if data.get(key) is not None:
            kwargs[f"recorded_{key}"] = kind[data[key].upper()]
    if data.get("comm_path") is not None:
        kwargs["recorded_path"] = CommPath(data["comm_path"])
    return CollectiveOp(**kwargs)
