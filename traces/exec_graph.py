"""The execution graph of one rank's trace: what a replay needs beyond the Workload's streams.

A trace is ground truth before it is a model input (docs/replay.md). The Workload holds
the GPU ops with their measured times; this graph adds why each op started when it did:

- **launch**: every GPU op's launching runtime call (its CPU thread and call time) and
  two delays that make a replay with measured durations start it where it started:
  the launch latency (its own ``start - call`` when its stream was free at the call,
  else the smaller of its own and the trace's median) and the gap after its stream and
  producers were done (its own when the call came first, else the smaller of its own
  and the median gap);
- **inter-stream**: producer op -> consumer op. Kineto's ``cuda_sync`` "Stream Wait
  Event" records are already the Workload's EVENT dependencies; where a trace has none,
  ``stream_waits`` holds those inferred from the ``cudaEventRecord`` /
  ``cudaStreamWaitEvent`` calls, or from a wait alone where the trace left the record
  out (:mod:`traces.exec_graph_build` documents both);
- **host synchronisation**: CPU calls that return only when GPU ops have finished
  (stream, device and event synchronisation, blocking copies): the thread's later
  calls move with those ops' ends;
- **hand-overs** between CPU threads: ``loss.backward()`` hands the backward pass to
  the autograd engine's thread and blocks until it is done, so the autograd thread's
  burst starts after the calling thread's last call before it, and the calling
  thread's next call comes after the burst's last (:mod:`traces.exec_graph_build`);
- the **profiler steps** with their names and threads, so a replay can report steps;
- the **recorded settings** of each NCCL kernel: channels (its grid) and threads per
  channel (its block), algorithm and protocol when the kernel name is reliable;
- each NCCL kernel's **wait** for its slowest peer (:mod:`traces.comm_split`): the rest
  of its measured time is the transfer, the only part NCCL settings change.

A CPU thread is a chain: the CPU's own time between its calls is kept as measured, and
a replay shifts a thread's later calls by how much later (or earlier) the thread's last
wait ended (a host synchronisation returned, or a hand-over let it go on).
Graphs are plain data keyed by op id; generated workloads have none.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from nccl_env.knobs import Algorithm, Protocol

# How traces.comm_split estimated the waits for peers of a graph's NCCL kernels
WAIT_BASIS_FASTEST = "fastest instances"  # one rank: a key's fastest instances are its transfer
WAIT_BASIS_RANKS = "ranks' launch times"  # several ranks: the last rank's launch ends the wait


@dataclass(frozen=True, slots=True)
class Launch:
    """The runtime call that launched a GPU op, and the op's launch latency."""

    thread: int  # index into ExecGraph.cpu_threads
    call_us: float  # start of the launching call
    latency_us: float  # the op starts no earlier than call_us + latency_us


@dataclass(frozen=True, slots=True)
class HostSync:
    """A CPU call that returned only after ``awaited`` GPU ops had finished."""

    thread: int
    start_us: float
    end_us: float
    awaited: tuple[int, ...]  # op ids; empty: the call waited for nothing the trace shows
    kind: str  # the runtime call's name
    own_us: float  # the call's own time: its duration when it did not wait, else 0
    return_us: float  # from the latest awaited end to the call's return (measured when it waited)


@dataclass(frozen=True, slots=True)
class HandOver:
    """``thread`` waited from ``start_us`` (None: since before the trace) and went on at
    ``resume_us`` because ``cause_thread`` reached its call at ``cause_us``."""

    thread: int
    start_us: float | None
    resume_us: float
    cause_thread: int
    cause_us: float
    kind: str  # "wake": the autograd thread starts a backward pass; "return": backward() returns


@dataclass(frozen=True, slots=True)
class StreamWait:
    """``consumer`` starts after ``producer`` ends (an event recorded on one stream, awaited on another)."""

    producer: int
    consumer: int
    source: str  # "cuda_sync" (Kineto recorded it), "record/wait" or "unrecorded wait" (the heuristics)


@dataclass(frozen=True, slots=True)
class StepSpan:
    name: str  # "ProfilerStep#N"
    thread: int
    start_us: float
    end_us: float


@dataclass(frozen=True, slots=True)
class RecordedSettings:
    """What an NCCL kernel ran with, as the trace shows it (a record, not Lagom's knobs:
    ``costmodel.replay.anchor.recorded_configs`` turns it into a CommConfig through the knob table)."""

    recorded_channels: int | None  # the kernel's grid (one CTA per channel)
    recorded_threads: int | None  # its block
    recorded_algorithm: Algorithm | None = None  # from the kernel name, only where the name is reliable
    recorded_protocol: Protocol | None = None


@dataclass
class ExecGraph:
    cpu_threads: list[str] = field(default_factory=list)  # "pid/tid" per thread index
    launches: dict[int, Launch] = field(default_factory=dict)  # op id -> its launch
    gaps: dict[int, float] = field(default_factory=dict)  # op id -> start minus when stream and producers were done
    syncs: list[HostSync] = field(default_factory=list)  # sorted by start
    hand_overs: list[HandOver] = field(default_factory=list)  # sorted by resume
    stream_waits: list[StreamWait] = field(default_factory=list)
    steps: list[StepSpan] = field(default_factory=list)  # sorted by start
    recorded: dict[int, RecordedSettings] = field(default_factory=dict)  # collective op id -> settings
    comm_wait_us: dict[int, float] = field(default_factory=dict)  # collective op id -> wait for peers (comm_split)
    wait_basis: str = WAIT_BASIS_FASTEST  # or WAIT_BASIS_RANKS
    median_latency_us: float = 0.0
    median_gap_us: float = 0.0

    def with_median_delays(self) -> ExecGraph:
        """This graph with every op's launch latency and queue gap at the trace's medians: what the
        dependencies explain by themselves (docs/replay.md, "with generic delays")."""
        launches = {op: Launch(la.thread, la.call_us, self.median_latency_us) for op, la in self.launches.items()}
        return replace(self, launches=launches, gaps=dict.fromkeys(self.gaps, self.median_gap_us))

    def to_dict(self) -> dict:
        return {
            "threads": self.cpu_threads,
            "median_latency_us": self.median_latency_us,
            "median_gap_us": self.median_gap_us,
            "gaps": [[op, g] for op, g in self.gaps.items()],
            "launches": [[op, la.thread, la.call_us, la.latency_us] for op, la in self.launches.items()],
            "syncs": [[s.thread, s.start_us, s.end_us, list(s.awaited), s.kind, s.own_us, s.return_us]
                      for s in self.syncs],
            "hand_overs": [[h.thread, h.start_us, h.resume_us, h.cause_thread, h.cause_us, h.kind]
                           for h in self.hand_overs],
            "stream_waits": [[w.producer, w.consumer, w.source] for w in self.stream_waits],
            "steps": [[s.name, s.thread, s.start_us, s.end_us] for s in self.steps],
            "comm_wait_us": [[op, w] for op, w in self.comm_wait_us.items()],
            "wait_basis": self.wait_basis,
            "recorded": [
                [op, r.recorded_channels, r.recorded_threads,
                 r.recorded_algorithm.nccl_name if r.recorded_algorithm else None,
                 r.recorded_protocol.nccl_name if r.recorded_protocol else None]
                for op, r in self.recorded.items()
            ],
        }

    @classmethod
    def from_dict(cls, data: dict) -> ExecGraph:
        return cls(
            cpu_threads=[str(t) for t in data["threads"]],
            median_latency_us=float(data["median_latency_us"]),
            median_gap_us=float(data["median_gap_us"]),
            gaps={int(op): float(g) for op, g in data["gaps"]},
            launches={int(op): Launch(int(t), float(c), float(lat)) for op, t, c, lat in data["launches"]},
            syncs=[HostSync(int(t), float(a), float(b), tuple(int(x) for x in aw), str(k), float(own), float(r))
                   for t, a, b, aw, k, own, r in data["syncs"]],
            hand_overs=[HandOver(int(t), None if a is None else float(a), float(r), int(ct), float(cu), str(k))
                        for t, a, r, ct, cu, k in data.get("hand_overs", [])],
            stream_waits=[StreamWait(int(p), int(c), str(s)) for p, c, s in data["stream_waits"]],
            steps=[StepSpan(str(n), int(t), float(a), float(b)) for n, t, a, b in data["steps"]],
            comm_wait_us={int(op): float(w) for op, w in data.get("comm_wait_us", [])},
            wait_basis=str(data.get("wait_basis", WAIT_BASIS_FASTEST)),
            recorded={
                int(op): RecordedSettings(ch, th, Algorithm[a.upper()] if a else None,
                                          Protocol[p.upper()] if p else None)
                for op, ch, th, a, p in data["recorded"]
            },
        )
