"""Where calibration measurements come from: one small interface, several backends.

A backend times three things on a cluster, each in microseconds:

* ``measure_collective(signature, config)``: one collective alone;
* ``measure_compute(op)``: one compute kernel alone;
* ``measure_overlap(op, signature, config)``: the kernel and the collective launched
  together on two streams, returning (kernel time, collective time).

``rank_layouts()`` says which (ranks, nodes) groups it can run collectives on, and
``cluster`` is the hardware description the fit starts from.

Backends: ``sim:PRESET`` (:class:`SimBackend`, the simulator on tiny workloads with
its default ~1% measurement noise) here; ``torch`` (real collectives under torchrun)
in ``costmodel.calibration.torch_backend``, the one module that imports torch.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Protocol, runtime_checkable

from costmodel.cluster import ClusterSpec, load_cluster
from nccl_env.errors import LagomError
from nccl_env.knobs import CommConfig
from nccl_env.plan import Plan, Signature
from nccl_env.rules import NcclVersion
from traces.workload import CollectiveOp, ComputeOp, ProcessGroup, Stream, StreamKind, Workload

_COMPUTE_STREAM = 7
_COMM_STREAM = 20


@runtime_checkable
class CalibrationBackend(Protocol):
    name: str
    cluster: ClusterSpec
    measurements: int

    def rank_layouts(self) -> list[tuple[int, int]]: ...

    def measure_collective(self, signature: Signature, config: CommConfig) -> float: ...

    def measure_compute(self, op: ComputeOp) -> float: ...

    def measure_overlap(self, op: ComputeOp, signature: Signature, config: CommConfig) -> tuple[float, float]: ...


def tiny_workload(cluster: ClusterSpec, op: ComputeOp | None, signature: Signature | None) -> Workload:
    """One compute kernel and/or one collective, both ready at time 0 on their own streams."""
    streams: list[Stream] = []
    compute: list[ComputeOp] = []
    colls: list[CollectiveOp] = []
    groups: dict[str, ProcessGroup] = {}
    world = cluster.world_size
    if op is not None:
        streams.append(Stream(_COMPUTE_STREAM, StreamKind.COMPUTE, "compute"))
        compute.append(ComputeOp(
            op_id=1, name=op.name, stream=_COMPUTE_STREAM, start_us=0.0, duration_us=op.duration_us,
            grid=op.grid, block=op.block, blocks_per_sm=op.blocks_per_sm, flops=op.flops,
            dram_bytes=op.dram_bytes,
        ))
    if signature is not None:
        streams.append(Stream(_COMM_STREAM, StreamKind.COMMUNICATION, "nccl"))
        groups[signature.group] = ProcessGroup(signature.group, tuple(range(signature.ranks)), signature.nodes)
        colls.append(CollectiveOp(
            op_id=2, name=f"nccl:{signature.collective.value}", collective=signature.collective,
            message_bytes=signature.message_bytes, stream=_COMM_STREAM, start_us=0.0, duration_us=0.0,
            group=signature.group,
        ))
        world = max(world, signature.ranks)
    return Workload(rank=0, world_size=world, streams=streams, compute_ops=compute, collectives=colls,
                    groups=groups, source="calibration", gpus_per_node=cluster.gpus_per_node,
                    sm_count=cluster.gpu.sm_count, device_name=cluster.gpu.name)


class SimBackend:
    """The simulator as the cluster to calibrate against (``sim:PRESET``)."""

    def __init__(self, cluster: ClusterSpec, noise: float = 0.01, seed: int = 0, label: str | None = None) -> None:
        from costmodel.sim.simulator import Simulator

        self.cluster = cluster
        self.name = label or f"sim:{cluster.name}"
        self.simulator = Simulator(cluster, noise=noise, seed=seed)
        self.measurements = 0

    def rank_layouts(self) -> list[tuple[int, int]]:
        c = self.cluster
        layouts = [(c.gpus_per_node, 1)]
        if c.nodes > 1:
            layouts.append((c.world_size, c.nodes))
        return layouts

    def _run(self, workload: Workload, plan: Plan):
        self.measurements += 1
        return self.simulator.evaluate(workload, plan)

    def measure_collective(self, signature: Signature, config: CommConfig) -> float:
        w = tiny_workload(self.cluster, None, signature)
        return self._run(w, Plan({signature: config})).ops[2].duration_us

    def measure_compute(self, op: ComputeOp) -> float:
        w = tiny_workload(self.cluster, op, None)
        return self._run(w, Plan()).ops[1].duration_us

    def measure_overlap(self, op: ComputeOp, signature: Signature, config: CommConfig) -> tuple[float, float]:
        w = tiny_workload(self.cluster, op, signature)
        ops = self._run(w, Plan({signature: config})).ops
        return ops[1].duration_us, ops[2].duration_us


def backend_from_spec(spec: str, noise: float = 0.01, seed: int = 0,
                      nccl_version: NcclVersion | None = None) -> SimBackend:
    """``sim:PRESET`` or ``sim:path/to/cluster.yaml``, running ``nccl_version`` (None: the cluster's).
    (``torch`` is built by the CLI.)"""
    kind, _, rest = spec.partition(":")
    if kind != "sim" or not rest:
        raise LagomError(f"unknown calibration backend {spec!r}: expected sim:PRESET or torch")
    cluster = load_cluster(rest)
    if nccl_version is not None:
        cluster = replace(cluster, nccl_version=nccl_version)
    return SimBackend(cluster, noise=noise, seed=seed, label=spec)
