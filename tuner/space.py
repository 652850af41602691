"""The search space: what the tuner may set for each collective signature of a workload.

Per signature the space holds (algorithm, protocol) pairs as *subspaces* and three
ordered *resource axes*: channels, chunk bytes, threads. Each knob has a *scope*, the
set of signatures that must share its value because of the door NCCL offers for it
(docs/reference.md §3):

- ``COLLECTIVE``: one value per signature (tuner plugin: algorithm, protocol, channels
  from NCCL 2.21; chunk from 2.30 through ``getChunkSize``);
- ``GROUP``: one value per process group (``ncclConfig_t`` minCTAs/maxCTAs, channels
  when the plugin cannot carry them);
- ``FUNCTION``: one value per collective type (per-function ``NCCL_ALGO``/``NCCL_PROTO``
  from NCCL 2.24);
- ``PROCESS``: one value for the whole process (``NCCL_NTHREADS`` always;
  ``NCCL_BUFFSIZE`` i.e. chunk before 2.30; ``NCCL_ALGO`` before 2.24).

Point-to-point signatures (AllToAll, send/recv) take none of these doors: NCCL's p2p
path reads only its step size, from ``NCCL_P2P_NET_CHUNKSIZE`` (communicators across
nodes) or ``NCCL_P2P_NVL/PCI_CHUNKSIZE`` (inside a node). They form one or two process
units of their own with the chunk axis only; from NCCL 2.19 the step is kept within
``NCCL_BUFFSIZE / 8``, which :meth:`SearchSpace.plan` applies as NCCL would.

A collective the tuner may not set (``CollectiveOp.tunable`` False: no recorded size,
or not an NCCL kernel) has no signature in the space; NCCL decides for it. Where a
collective's size changes from step to step (:mod:`traces.size_ranges`), the tuned
file matches a byte range rather than one size, so the signatures of one range share
every per-collective knob: their ``COLLECTIVE`` scope key names the range.

Signatures that share a scope key form a :class:`Unit`; search methods choose one
value per unit and axis, so every plan they emit is one the delivery doors can carry.
A :class:`Point` (rung index per unit and axis, pair per subspace unit, path per path
unit) becomes a :class:`~nccl_env.plan.Plan` through :meth:`SearchSpace.plan`.

*Path units* (scope ``GROUP``): where the NCCL version and the cluster admit them
(:func:`nccl_env.rules.collective_mechanism`: symmetric kernels from 2.27, copy engines
from 2.28, every rank of the group on NVLink), each process group chooses how its
collectives move data: NCCL's SM kernels (``None``, the default), symmetric kernels on
registered buffers, or the copy engines under CTA policy ZERO. A signature that a path takes
off the SM kernels keeps no channels, chunk, threads, algorithm or protocol in the plan:
NCCL picks the symmetric kernel's CTAs itself, and the copy engines have none.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from costmodel.cluster import ClusterSpec
from costmodel.nccl_algorithms import algorithm_refusal
from nccl_env.delivery import largest_message
from nccl_env.errors import LagomError
from nccl_env.knob_table import (
    ALGORITHM,
    CHANNELS,
    CHUNK,
    KERNEL_KNOBS,
    PATH,
    PROTOCOL,
    RESOURCE_AXES,
    RESOURCE_KNOBS,
    THREADS,
    Scope,
    knob_scopes,
)
from nccl_env.knobs import Algorithm, CollectiveType, CommConfig, CommPath, Protocol
from nccl_env.plan import Plan, Signature
from nccl_env.rules import (
    P2P_CHUNK_CAPPED_SINCE,
    P2P_COLLECTIVES,
    Mechanism,
    NcclVersion,
    algorithms_available,
    buffsize_for_chunk,
    collective_mechanism,
    max_channels,
    p2p_chunk_ceiling,
    per_collective_knobs,
)
from traces.size_ranges import signature_ranges
from traces.workload import Workload

# the algorithms switch_pairs offers where NCCL's rules allow them (NVLS, NVLSTree, CollNetDirect, PAT)
SWITCH_ALGORITHMS = (Algorithm.NVLS, Algorithm.NVLS_TREE, Algorithm.COLLNET_DIRECT, Algorithm.PAT)


def scope_key(scope: Scope, signature: Signature, byte_range: tuple[int, int] | None = None) -> str:
    """The label signatures share when they must share a knob's value (``byte_range``: the
    inclusive sizes the signature's setting will match; its own size when None)."""
    if scope is Scope.COLLECTIVE:
        # the plugin matches (collective, bytes, ranks, nodes): it cannot tell groups apart
        low, high = byte_range or (signature.message_bytes, signature.message_bytes)
        size = f"{low}B" if low == high else f"{low}-{high}B"
        return f"{signature.collective.value} {size} x{signature.ranks}r/{signature.nodes}n"
    if scope is Scope.GROUP:
        return f"group {signature.group}"
    if scope is Scope.FUNCTION:
        return f"{signature.collective.value}"
    return "process"


# ---- NCCL version rules (nccl_env.rules) ------------------------------------------------


def pairs_for(signature: Signature, version: NcclVersion, intra_kind: str) -> tuple[tuple[Algorithm, Protocol], ...]:
    """(algorithm, protocol) subspaces for one signature.

    Ring everywhere; Tree for AllReduce (NCCL implements Tree only for AllReduce).
    NVLS, NVLSTree and PAT are added by :func:`switch_pairs` where the cluster and NCCL
    have them; CollNet is not modelled.
    LL128 only where NCCL enables it by default: NVLink/NVSwitch nodes (NCCL
    src/graph/tuning.cc disables LL128 on PCIe-only systems). Point-to-point
    collectives (AllToAll, send/recv) have no algorithm: their only subspace is
    "NCCL decides", written (None, None) here is not returned; callers see ().
    """
    if signature.collective in P2P_COLLECTIVES:
        return ()
    algos = [Algorithm.RING]
    if signature.collective is CollectiveType.ALLREDUCE and Algorithm.TREE in algorithms_available(version):
        algos.append(Algorithm.TREE)
    protos = [Protocol.LL, Protocol.SIMPLE]
    if intra_kind in ("nvlink", "nvswitch"):
        protos.insert(1, Protocol.LL128)
    return tuple((a, p) for a in algos for p in protos)


def switch_pairs(signature: Signature, cluster: ClusterSpec, version: NcclVersion,
                 ) -> tuple[tuple[Algorithm, Protocol], ...]:
    """NVLS, NVLSTree, CollNetDirect and PAT subspaces (Simple: their only protocol) where NCCL would
    run them for the signature on this cluster and NCCL (``costmodel.nccl_algorithms.algorithm_refusal``:
    NVLS on one NVLink-SHARP node, NVLSTree across such nodes, CollNetDirect AllReduce across nodes
    whose network reduces, PAT with one GPU per node from 2.23); the
    evaluators model each. A plan reaches NCCL with them through the same door as Ring and Tree
    (the plugin's cost table per collective, NCCL_ALGO per function or process)."""
    if signature.collective in P2P_COLLECTIVES:
        return ()
    where = dataclasses.replace(cluster, nccl_version=version)
    return tuple((algo, Protocol.SIMPLE) for algo in SWITCH_ALGORITHMS
                 if algorithm_refusal(where, algo, signature.collective, signature.ranks, signature.nodes) is None)


# ---- units and points -------------------------------------------------------------------


@dataclass(frozen=True)
class Axis:
    """An ordered resource ladder for one CommConfig field."""

    name: str  # "channels" | "chunk_bytes" | "threads"
    values: tuple[int, ...]  # ascending
    scope: Scope


@dataclass(frozen=True)
class Unit:
    """Signatures that must share the values of ``axes`` (their scope key is ``key``)."""

    index: int
    key: str
    scope: Scope
    signatures: tuple[Signature, ...]
    axes: tuple[str, ...]  # resource axes this unit owns; empty for a subspace unit


@dataclass(frozen=True)
class Point:
    """A choice in the space: rung per (resource unit, axis); pair per subspace unit; path per
    path unit.

    ``pairs[i]`` is None when subspace unit ``i`` leaves algorithm/protocol to NCCL;
    ``paths[i]`` is None when path unit ``i`` keeps NCCL's SM kernels.
    """

    levels: tuple[tuple[int, str, int], ...]  # (unit index, axis, rung), sorted
    pairs: tuple[tuple[int, tuple[Algorithm, Protocol] | None], ...]  # (subspace unit index, pair)
    paths: tuple[tuple[int, CommPath | None], ...] = ()  # (path unit index, path)

    def path(self, unit: int) -> CommPath | None:
        for u, p in self.paths:
            if u == unit:
                return p
        raise KeyError(unit)

    def with_path(self, unit: int, path: CommPath | None) -> Point:
        return Point(self.levels, self.pairs, tuple((u, path if u == unit else p) for u, p in self.paths))

    def level(self, unit: int, axis: str) -> int:
        for u, a, r in self.levels:
            if u == unit and a == axis:
                return r
        raise KeyError((unit, axis))

    def with_levels(self, changes: dict[tuple[int, str], int]) -> Point:
        new = tuple((u, a, changes.get((u, a), r)) for u, a, r in self.levels)
        return Point(new, self.pairs, self.paths)

    def pair(self, unit: int) -> tuple[Algorithm, Protocol] | None:
        for u, p in self.pairs:
            if u == unit:
                return p
        raise KeyError(unit)

    def with_pair(self, unit: int, pair: tuple[Algorithm, Protocol] | None) -> Point:
        return Point(self.levels, tuple((u, pair if u == unit else p) for u, p in self.pairs), self.paths)


@dataclass
class SearchSpace:
    """Everything a search method needs to know about what it may set."""

    nccl_version: NcclVersion
    signatures: tuple[Signature, ...]
    collective_ids: dict[Signature, tuple[int, ...]]  # op ids of each signature's collectives
    axes: dict[str, Axis]
    scopes: dict[str, Scope]
    resource_units: list[Unit]
    subspace_units: list[Unit]
    pairs: dict[Signature, tuple[tuple[Algorithm, Protocol], ...]]
    defaults: dict[Signature, CommConfig]  # NCCL's own choice per signature (may be partial)
    notes: list[str] = field(default_factory=list)
    byte_ranges: dict[Signature, tuple[int, int]] = field(default_factory=dict)  # inclusive; absent: its own size

    def byte_range(self, signature: Signature) -> tuple[int, int]:
        """The sizes the signature's tuned setting matches (``traces.size_ranges``)."""
        return self.byte_ranges.get(signature, (signature.message_bytes, signature.message_bytes))
    # knob values every plan carries whatever the point (the online space's fixed knobs)
    pinned: dict[Signature, dict[str, object]] = field(default_factory=dict)
    path_units: list[Unit] = field(default_factory=list)  # one per process group with a path besides SM
    path_options: dict[int, tuple[CommPath, ...]] = field(default_factory=dict)  # path unit -> its paths
    # what moves each signature's data under a path (absent: NCCL's SM kernels)
    mechanisms: dict[tuple[Signature, CommPath], Mechanism] = field(default_factory=dict)

    def mechanism(self, signature: Signature, path: CommPath | None) -> Mechanism:
        """What moves the signature's data when its group takes ``path``."""
        if path is None:
            return Mechanism.SM_KERNEL
        return self.mechanisms.get((signature, path), Mechanism.SM_KERNEL)

    # -- unit lookups
    def unit_pairs(self, unit: Unit) -> tuple[tuple[Algorithm, Protocol], ...]:
        """Pairs every signature of a subspace unit accepts (the intersection)."""
        common: list[tuple[Algorithm, Protocol]] | None = None
        for sig in unit.signatures:
            options = self.pairs.get(sig, ())
            common = list(options) if common is None else [p for p in common if p in options]
        return tuple(common or ())

    def unit_collective_ids(self, unit: Unit) -> tuple[int, ...]:
        out: list[int] = []
        for sig in unit.signatures:
            out.extend(self.collective_ids.get(sig, ()))
        return tuple(out)

    # -- points
    def minimum_point(self) -> Point:
        """Every resource axis at its lowest rung; algorithm/protocol left to NCCL; SM kernels."""
        levels = tuple(sorted((u.index, a, 0) for u in self.resource_units for a in u.axes))
        return Point(levels, tuple((u.index, None) for u in self.subspace_units), self._sm_paths())

    def _sm_paths(self) -> tuple[tuple[int, CommPath | None], ...]:
        return tuple((u.index, None) for u in self.path_units)

    def point_near(self, configs: Callable[[Signature], CommConfig], with_pairs: bool = False) -> Point:
        """The point closest (in rungs) to per-signature configs, e.g. NCCL's defaults.

        A unit takes the rung nearest to the median wanted value of its signatures.
        ``with_pairs``: a subspace unit also takes the (algorithm, protocol) pair its
        signatures all ask for, when they agree on one the unit offers (else NCCL decides).
        """
        levels = []
        for unit in self.resource_units:
            for axis in unit.axes:
                wanted = [getattr(configs(s), axis) for s in unit.signatures]
                wanted = sorted(w for w in wanted if w is not None)
                ladder = self.axes[axis].values
                if not wanted:
                    rung = len(ladder) - 1
                else:
                    target = wanted[len(wanted) // 2]
                    rung = min(range(len(ladder)), key=lambda i: abs(math.log(ladder[i] / target)))
                levels.append((unit.index, axis, rung))
        pairs: list[tuple[int, tuple[Algorithm, Protocol] | None]] = []
        for sub in self.subspace_units:
            wanted_pairs = {(ALGORITHM.get(configs(s)), PROTOCOL.get(configs(s))) for s in sub.signatures}
            pair = next(iter(wanted_pairs)) if with_pairs and len(wanted_pairs) == 1 else None
            pairs.append((sub.index, pair if pair in self.unit_pairs(sub) else None))
        return Point(tuple(sorted(levels)), tuple(pairs), self._sm_paths())

    def plan(self, point: Point) -> Plan:
        """The Plan a point stands for: every signature gets its units' values."""
        configs: dict[Signature, dict] = {s: dict(self.pinned.get(s, {})) for s in self.signatures}
        for unit in self.resource_units:
            for axis in unit.axes:
                value = self.axes[axis].values[point.level(unit.index, axis)]
                for sig in unit.signatures:
                    configs[sig][axis] = value
        for unit in self.subspace_units:
            pair = point.pair(unit.index)
            if pair is None:
                continue
            for sig in unit.signatures:
                configs[sig][ALGORITHM.field], configs[sig][PROTOCOL.field] = pair
                if pair[1] is Protocol.LL128:
                    configs[sig].pop(THREADS.field, None)  # NCCL_LL128_NTHREADS has its own range: NCCL decides
        for unit in self.path_units:
            path = point.path(unit.index)
            if path is not None:
                for sig in unit.signatures:
                    configs[sig][PATH.field] = path
        for sig, cfg in configs.items():  # the point's paths, or the online space's pinned ones
            path = cfg.get(PATH.field)
            if isinstance(path, CommPath) and self.mechanism(sig, path) is not Mechanism.SM_KERNEL:
                for knob in KERNEL_KNOBS:
                    cfg.pop(knob, None)  # NCCL's kernels do not run it: no knob reaches it
        self._cap_p2p_chunks(configs)
        return Plan(entries={s: CommConfig(**c) for s, c in configs.items()})

    def _cap_p2p_chunks(self, configs: dict[Signature, dict]) -> None:
        """From NCCL 2.19 a p2p step is kept within NCCL_BUFFSIZE / 8; where NCCL_BUFFSIZE sets
        the collectives' chunk (before 2.30), the step is cut as NCCL will cut it
        (with ``nccl_env.delivery``'s own rule for NCCL_BUFFSIZE: the largest message's chunk)."""
        version = self.nccl_version
        if version < P2P_CHUNK_CAPPED_SINCE or self.scopes[CHUNK.field] is Scope.COLLECTIVE:
            return  # no cap, or the plugin carries the collectives' chunks and NCCL_BUFFSIZE is raised to fit
        sized = [(s, c) for s, c in configs.items() if s.collective not in P2P_COLLECTIVES and c.get(CHUNK.field)]
        buffsize = None
        if sized:
            _, cfg = largest_message(sized)
            buffsize = buffsize_for_chunk(cfg[CHUNK.field], cfg.get(ALGORITHM.field))
        ceiling = p2p_chunk_ceiling(version, buffsize)
        for sig, cfg in configs.items():
            if sig.collective in P2P_COLLECTIVES and cfg.get(CHUNK.field, 0) > ceiling:
                cfg[CHUNK.field] = ceiling

    def size(self) -> int:
        """Number of points (product over units of rungs and pairs + 'NCCL decides')."""
        total = 1
        for unit in self.resource_units:
            for axis in unit.axes:
                total *= len(self.axes[axis].values)
        for unit in self.subspace_units:
            total *= len(self.unit_pairs(unit)) + 1
        for unit in self.path_units:
            total *= len(self.path_options[unit.index]) + 1
        return total


def workload_signatures(workload: Workload, gpus_per_node: int | None = None) -> dict[Signature, tuple[int, ...]]:
    """The signatures the tuner may set, with their collectives' op ids (untunable ones left out)."""
    out: dict[Signature, list[int]] = {}
    for op in workload.collectives:
        if op.tunable:
            out.setdefault(workload.signature(op, gpus_per_node), []).append(op.op_id)
    return {s: tuple(ids) for s, ids in sorted(out.items())}


def _units(signatures: Iterable[Signature], scope: Scope, axes: tuple[str, ...], start: int,
           ranges: dict[Signature, tuple[int, int]]) -> list[Unit]:
    grouped: dict[str, list[Signature]] = {}
    for sig in signatures:
        if sig.collective in P2P_COLLECTIVES:
            continue  # NCCL's p2p path takes none of these doors: see _p2p_units
        grouped.setdefault(scope_key(scope, sig, ranges.get(sig)), []).append(sig)
    return [
        Unit(start + i, key, scope, tuple(sigs), axes) for i, (key, sigs) in enumerate(sorted(grouped.items()))
    ]


def _p2p_units(signatures: Iterable[Signature], start: int) -> list[Unit]:
    """Point-to-point signatures take one knob: their step size, once per process for
    communicators across nodes (NCCL_P2P_NET_CHUNKSIZE) and once for those inside a node
    (NCCL_P2P_NVL/PCI_CHUNKSIZE); NCCL picks their channels, threads and the rest."""
    grouped: dict[str, list[Signature]] = {}
    for sig in signatures:
        if sig.collective in P2P_COLLECTIVES:
            grouped.setdefault("p2p net" if sig.nodes > 1 else "p2p intra", []).append(sig)
    return [Unit(start + i, key, Scope.PROCESS, tuple(sigs), (CHUNK.field,))
            for i, (key, sigs) in enumerate(sorted(grouped.items()))]


def build_space(
    workload: Workload,
    cluster: ClusterSpec,
    defaults: Callable[[ClusterSpec, Signature], CommConfig] | None = None,
    nccl_version: NcclVersion | None = None,
    enabled_pairs: Callable[[ClusterSpec, Signature], Iterable[tuple[Algorithm, Protocol]]] | None = None,
    use_plugin: bool = True,
    other_ranks: Sequence[Workload] = (),
) -> SearchSpace:
    """The space for ``workload`` on ``cluster`` (NCCL version: the cluster's unless given).

    ``other_ranks``: the job's other ranks, replayed with it (``lagom tune DIR``): their
    signatures join the space (one entry for a signature the ranks share); the op ids it
    keeps per signature are ``workload``'s, so a signature only another rank has keeps none.

    ``defaults`` gives NCCL's own choice per signature (``costmodel.nccl_defaults``);
    it seeds AutoCCL and the tune table's "old" column. ``enabled_pairs`` gives the
    (algorithm, protocol) pairs NCCL's tuning model enables for a signature; without
    it, :func:`pairs_for`'s rule. The tuner imports no cost model: the caller
    (``lagom.orchestration.tuning.space_for``) passes both. ``use_plugin=False``: the doors without
    Lagom's tuner plugin (channels per group, chunk per process, algorithm per collective
    type). Raises LagomError when the workload has no collective to tune.
    """
    version = nccl_version or cluster.nccl_version
    sig_ids = workload_signatures(workload, cluster.gpus_per_node)
    ranges = signature_ranges(workload, sig_ids)
    for other in other_ranks:
        theirs = workload_signatures(other, cluster.gpus_per_node)
        for sig, span in signature_ranges(other, theirs).items():
            sig_ids.setdefault(sig, ())  # another rank's op ids are not this workload's
            if sig not in ranges or span != (sig.message_bytes, sig.message_bytes):  # varies on some rank
                ranges[sig] = span
    sig_ids = dict(sorted(sig_ids.items()))
    if not sig_ids:
        untunable = sum(1 for op in workload.collectives if not op.tunable)
        why = f" ({untunable} without a recorded size or not NCCL kernels)" if untunable else ""
        raise LagomError(f"workload {workload.source or '<workload>'}: no collectives to tune{why}")
    signatures = tuple(sig_ids)
    scopes = knob_scopes(version, use_plugin)
    max_nc = min(max_channels(version), max(1, cluster.gpu.sm_count // 2))
    axes = {k.field: Axis(k.field, tuple(v for v in k.ladder if k is not CHANNELS or v <= max_nc), scopes[k.field])
            for k in RESOURCE_KNOBS}
    # resource units: axes grouped by scope, then signatures grouped by scope key
    by_scope: dict[Scope, list[str]] = {}
    for axis in RESOURCE_AXES:
        by_scope.setdefault(axes[axis].scope, []).append(axis)
    resource_units: list[Unit] = []
    for scope in Scope:
        if scope in by_scope:
            resource_units += _units(signatures, scope, tuple(by_scope[scope]), len(resource_units), ranges)
    resource_units += _p2p_units(signatures, len(resource_units))
    available = set(algorithms_available(version))
    pairs = {}
    for sig in signatures:
        enabled = () if enabled_pairs is None or sig.collective in P2P_COLLECTIVES else tuple(
            (a, p) for a, p in enabled_pairs(cluster, sig) if a in available
        )
        base = enabled or pairs_for(sig, version, cluster.intra_node.kind)
        pairs[sig] = base + tuple(pair for pair in switch_pairs(sig, cluster, version) if pair not in base)
    with_pairs = [s for s in signatures if pairs[s]]
    subspace_units = _units(with_pairs, scopes[ALGORITHM.field], (), 0, ranges)
    notes = []
    for axis in RESOURCE_AXES:
        if axes[axis].scope is not Scope.COLLECTIVE:
            notes.append(f"{axis} is {axes[axis].scope.value}-wide on NCCL {version}: one value per "
                         f"{axes[axis].scope.value}")
    default_cfg = {s: (defaults(cluster, s) if defaults else CommConfig()) for s in signatures}
    path_units, path_options, mechanisms = _path_units(signatures, cluster, version)
    if path_units:
        notes.append("paths: " + "; ".join(
            f"{u.key} may take {', '.join(p.value for p in path_options[u.index])}" for u in path_units))
    return SearchSpace(
        nccl_version=version,
        signatures=signatures,
        collective_ids=sig_ids,
        axes=axes,
        scopes=scopes,
        resource_units=resource_units,
        subspace_units=subspace_units,
        pairs=pairs,
        defaults=default_cfg,
        notes=notes,
        byte_ranges={s: r for s, r in ranges.items() if r != (s.message_bytes, s.message_bytes)},
        path_units=path_units,
        path_options=path_options,
        mechanisms=mechanisms,
    )


# Paths the search offers, in probe order. EFFICIENCY is left out: its only effect is NCCL's
# NVLS re-selection on registered buffers, which the evaluators do not model (nccl_env.rules).
SEARCHED_PATHS = (CommPath.SYMMETRIC, CommPath.COPY_ENGINE)


def _path_units(signatures: tuple[Signature, ...], cluster: ClusterSpec, version: NcclVersion,
                ) -> tuple[list[Unit], dict[int, tuple[CommPath, ...]], dict[tuple[Signature, CommPath], Mechanism]]:
    """One path unit per process group that has a path moving at least one of its signatures off
    NCCL's SM kernels on this NCCL and cluster; its options are those paths."""
    topology = cluster.path_topology()
    by_group: dict[str, list[Signature]] = {}
    for sig in signatures:
        by_group.setdefault(sig.group, []).append(sig)
    units: list[Unit] = []
    options: dict[int, tuple[CommPath, ...]] = {}
    mechanisms: dict[tuple[Signature, CommPath], Mechanism] = {}
    for _, sigs in sorted(by_group.items()):
        offered = []
        for path in SEARCHED_PATHS:
            moved = False
            for sig in sigs:
                mech = collective_mechanism(path, sig.collective, sig.nodes, version, topology)
                if mech is not Mechanism.SM_KERNEL:
                    mechanisms[(sig, path)] = mech
                    moved = True
            if moved:
                offered.append(path)
        if offered:
            index = len(units)
            units.append(Unit(index, scope_key(Scope.GROUP, sigs[0]), Scope.GROUP, tuple(sigs), ()))
            options[index] = tuple(offered)
    return units, options, mechanisms


def online_space(space: SearchSpace, seed: Callable[[Signature], CommConfig]) -> SearchSpace:
    """The part of ``space`` a running job can change, every other knob pinned at the seed's value.

    Mid-job only the tuner plugin's per-call answers change (knob scope COLLECTIVE:
    algorithm/protocol and channels from NCCL 2.21, chunk from 2.30 through
    getChunkSize); threads, NCCL_BUFFSIZE, point-to-point step sizes and a group's
    channels are read when a communicator is created. Those units leave the space and
    each plan carries the seed's values for them (``SearchSpace.pinned``). Raises
    LagomError when this NCCL loads no tuner plugin (nothing could change).
    """
    version = space.nccl_version
    per_coll = per_collective_knobs(version)
    if CHANNELS.field not in per_coll:
        raise LagomError(f"online tuning needs NCCL >= 2.21 (its tuner plugin sets channels and algorithm per call); "
                         f"this is NCCL {space.nccl_version}")
    kept = [u for u in space.resource_units if u.scope is Scope.COLLECTIVE]
    fixed_knobs = [k for k in KERNEL_KNOBS if k not in per_coll]
    pinned: dict[Signature, dict[str, object]] = {}
    for sig in space.signatures:
        config = seed(sig)
        # a point-to-point step is NCCL_P2P_*_CHUNKSIZE's, read at start, whatever the version
        knobs = (CHUNK.field,) if sig.collective in P2P_COLLECTIVES else fixed_knobs
        values = {k: getattr(config, k) for k in knobs}
        pinned[sig] = {k: v for k, v in values.items() if v is not None}
        if (group_path := PATH.get(config)) is not None:
            pinned[sig][PATH.field] = group_path  # the CTA policy and the buffers are set up at start
    subspaces = space.subspace_units if space.scopes[ALGORITHM.field] is Scope.COLLECTIVE else []
    notes = [f"online: {', '.join(fixed_knobs)} fixed at the seed's values (read when a communicator is created)"]
    return dataclasses.replace(space, resource_units=kept, subspace_units=subspaces, notes=notes, pinned=pinned,
                               path_units=[], path_options={})
