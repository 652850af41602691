"""The virtual cluster: a fluid event simulation of one rank's iteration (an Evaluator).

``Simulator(cluster, noise=0.01, seed=0).evaluate(workload, plan) -> Timing``.

Every stream runs its ops in list order; an op starts when its stream predecessor and
all its dependencies have finished. Between two events (an op starting or ending) the
set of running ops is fixed, so every running op progresses at a constant rate given by
the resources the others leave it:

* a running collective holds ``NC`` SMs (one CTA per channel) for its whole duration;
  compute kernels run their thread-block waves on the SMs left
  (:mod:`costmodel.sim.compute`);
* a collective's in-flight FIFO data (``NC x chunk``) takes that much L2 from the
  compute kernels; what does not fit spills to DRAM;
* DRAM bandwidth is shared max-min fairly between the compute kernels' and the
  collectives' demands; two collectives on the same link class share the link;
* a collective launched while a kernel fills the GPU waits for SMs until the kernel's
  current wave of blocks retires (half a wave on average);
* each collective's own pace is its chunk pipeline (:mod:`costmodel.sim.collective`).

A collective's CommConfig is ``plan.config_for(signature)`` resolved over NCCL's modelled
default (:func:`costmodel.nccl_defaults.resolve_config`). Each op's duration carries a
seeded multiplicative noise factor ``N(1, noise)`` (clipped to [0.5, 1.5]); ``noise=0`` is
exact and deterministic. ``evaluations`` counts evaluate() calls. Per-workload data is
built once and cached (keyed by the workload object): do not mutate a workload between
evaluations; build a new one.

A workload read from a trace is not simulated: it is replayed
(:class:`costmodel.replay.trace_evaluator.ReplayEvaluator` over this simulator's ratios,
:meth:`Simulator.collective_time_us` and :meth:`Simulator.slowdown_beside`; no noise).

Entry points for calibration (tiny workloads work too):
:meth:`Simulator.collective_time_us` (one collective alone, no noise),
:meth:`Simulator.compute_time_us` (one kernel under a given channel count / chunk),
:meth:`Simulator.overlap_us` (one kernel and one collective started together).
"""

from __future__ import annotations

import math

import numpy as np

from costmodel.cluster import ClusterSpec
from costmodel.evaluator import DurationScale, LazyOpTimings, LazyOpValues, Timing
from costmodel.nccl_algorithms import NVLS_FAMILY, admitted, algorithm_settings
from costmodel.nccl_defaults import nccl_graph, resolve_config, symmetric_kernel
from costmodel.sim.collective import CollectiveModel
from costmodel.sim.compute import ComputeModel, gemm_tile_from_name
from costmodel.sim.params import sim_params
from costmodel.workload_cache import WorkloadCache
from nccl_env.errors import LagomError
from nccl_env.knob_table import ALGORITHM, PATH
from nccl_env.knobs import Algorithm, CommConfig
from nccl_env.plan import Plan, Signature
from nccl_env.rules import Mechanism, collective_mechanism
from traces.intervals import intersection, union
from traces.workload import CollectiveOp, ComputeOp, ProcessGroup, Stream, StreamKind, Workload

_NOISE_CLIP = (0.5, 1.5)
_CACHE_WORKLOADS = 64  # static data kept for this many workloads


def _shape_key(op: ComputeOp) -> tuple:
    name = op.name.lower()
    return (gemm_tile_from_name(op.name), "flash" in name or "attn" in name, op.grid, op.block, op.blocks_per_sm,
            op.shared_memory_bytes, op.flops, op.dram_bytes, op.duration_us if op.flops is None else None)


class _Static:
    """Per-workload data that does not depend on the plan: built once, reused by every evaluation."""

    def __init__(self, workload: Workload, cluster: ClusterSpec, params):
        compute = [op for op in workload.compute_ops]
        colls = [op for op in workload.collectives]
        self.ops: list = compute + colls
        self.n_compute = len(compute)
        index = {op.op_id: i for i, op in enumerate(self.ops)}
        self.op_ids = [op.op_id for op in self.ops]
        self.index = index  # op id -> position in ops (Timing.ops reads it)
        n = len(self.ops)
        succ: list[list[int]] = [[] for _ in range(n)]
        pending = [0] * n
        # stream order: ops of one stream run in list order (lists are sorted by start time)
        last_on_stream: dict[int, int] = {}
        for i in sorted(range(n), key=lambda k: (self.ops[k].start_us, k)):
            sid = self.ops[i].stream
            prev = last_on_stream.get(sid)
            if prev is not None:
                succ[prev].append(i)
                pending[i] += 1
            last_on_stream[sid] = i
        for dep in workload.dependencies:  # every one names two ops (check_workload)
            succ[index[dep.before]].append(index[dep.after])
            pending[index[dep.after]] += 1
        self.succ = succ
        self.pending = pending
        # kernels of the same shape share one model (and its memo): layers repeat
        shared: dict[tuple, ComputeModel] = {}
        self.compute_models = []
        for op in compute:
            key = _shape_key(op)
            model = shared.get(key)
            if model is None:
                model = shared[key] = ComputeModel(op, cluster.gpu, params)
            self.compute_models.append(model)
        self.state_cache: dict[tuple, list[float]] = {}
        gpn = cluster.gpus_per_node
        self.signatures: list[Signature] = [workload.signature(op, gpn) for op in colls]
        self.unique_signatures = sorted(set(self.signatures))
        self.on_gpu = [op.on_gpu for op in colls]
        self.compute_streams = sorted({op.stream for op in compute})
        self.compute_stream_of = [op.stream for op in compute]


class Simulator:
    """The virtual cluster as an Evaluator (see the module docstring for the mechanism)."""

    def __init__(self, cluster: ClusterSpec, noise: float = 0.01, seed: int = 0):
        if not (isinstance(noise, (int, float)) and math.isfinite(noise) and noise >= 0):
            raise LagomError(f"simulator noise must be a finite number >= 0, got {noise!r}")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0):
            raise LagomError(f"simulator seed must be an integer >= 0 (or None: unseeded), got {seed!r}")
        self.cluster = cluster
        self.params = sim_params(cluster)
        self.noise = float(noise)
        self.seed = seed
        self.evaluations = 0
        self._rng = np.random.default_rng(seed)
        self._statics: WorkloadCache[_Static] = WorkloadCache(self._build_static, _CACHE_WORKLOADS)
        self._collective_models: dict[tuple[Signature, CommConfig], CollectiveModel] = {}
        self._sm = cluster.gpu.sm_count
        self._l2 = float(cluster.gpu.l2_bytes)
        self._bw = cluster.gpu.mem_bw_gb_per_s * 1e3 * self.params.mem_efficiency
        self._version = cluster.nccl_version
        self._topology = cluster.path_topology()
        self._compute_capability = nccl_graph(cluster).compute_capability  # NCCL's symmetric-kernel constants

    def reseed(self, seed: int | tuple[int, ...]) -> None:
        """Restart the noise stream (e.g. one per simulated rank and epoch), keeping the caches."""
        self._rng = np.random.default_rng(seed)

    # ---- caches ------------------------------------------------------------------------------
    def _build_static(self, workload: Workload) -> _Static:
        return _Static(workload, self.cluster, self.params)

    def collective_model(self, signature: Signature, config: CommConfig | None = None) -> CollectiveModel:
        """The collective's model under ``config`` resolved over NCCL's default."""
        requested = config or CommConfig()
        key = (signature, requested)
        model = self._collective_models.get(key)
        if model is None:
            requested = admitted(self.cluster, signature, requested)
            mechanism = collective_mechanism(PATH.get(requested), signature.collective, signature.nodes, self._version,
                                             self._topology)
            kernel = (symmetric_kernel(signature, compute_capability=self._compute_capability)
                      if mechanism is Mechanism.SYMMETRIC_KERNEL else None)
            if mechanism is Mechanism.COPY_ENGINE:
                model = CollectiveModel.copy_engine(signature, requested, self.cluster, self.params)
            elif kernel is not None:
                model = CollectiveModel.symmetric(signature, requested, kernel, self.cluster, self.params)
            else:
                resolved = algorithm_settings(self.cluster, signature, requested,
                                              resolve_config(self.cluster, signature, requested))
                if ALGORITHM.get(resolved) in NVLS_FAMILY:
                    model = CollectiveModel.nvls(signature, resolved, self.cluster, self.params)
                elif ALGORITHM.get(resolved) is Algorithm.COLLNET_DIRECT:
                    model = CollectiveModel.collnet_direct(signature, resolved, self.cluster, self.params)
                else:  # ring, tree and PAT: a chunk pipeline over channels
                    model = CollectiveModel.chunk_pipeline(signature, resolved, self.cluster, self.params)
            if len(self._collective_models) > 20_000:
                self._collective_models.clear()
            self._collective_models[key] = model
        return model

    # ---- entry points for calibration ----------------------------------------------------------
    def collective_time_us(self, signature: Signature, config: CommConfig | None = None) -> float:
        """One collective alone on an idle GPU (no noise, not counted as an evaluation)."""
        return self.collective_model(signature, config).alone_us

    def compute_time_us(self, op: ComputeOp, ctas: int = 0, l2_held_bytes: float = 0.0,
                        comm_dram_bytes_per_us: float = 0.0) -> float:
        """One kernel while a collective's ``ctas`` hold SMs and its ``l2_held_bytes`` of FIFO data
        hold L2, and it pulls ``comm_dram_bytes_per_us`` of DRAM (no noise, not counted)."""
        model = ComputeModel(op, self.cluster.gpu, self.params)
        return model.time_us(self._sm - ctas, max(0.0, self._l2 - l2_held_bytes),
                             max(1e-6, self._bw - comm_dram_bytes_per_us))

    def slowdown_beside(self, op: ComputeOp, signature: Signature, config: CommConfig | None = None) -> float:
        """The kernel's time beside the collective's CTAs and chunks over its time alone (replay's ratio)."""
        model = self.collective_model(signature, config)
        alone = self.compute_time_us(op)
        return self.compute_time_us(op, model.ctas, model.l2_held_beside(self.params)) / alone if alone > 0 else 1.0

    def overlap_us(self, op: ComputeOp, signature: Signature, config: CommConfig | None = None) -> tuple[float, float]:
        """(compute_us, collective_us) when the kernel and the collective start together (no noise)."""
        wl = tiny_overlap_workload(op, signature)
        plan = Plan(entries={signature: config or CommConfig()})
        saved, self.noise = self.noise, 0.0
        try:
            timing = self.evaluate(wl, plan)
        finally:
            self.noise = saved
            self.evaluations -= 1
        return timing.ops[wl.compute_ops[0].op_id].duration_us, timing.ops[wl.collectives[0].op_id].duration_us

    # ---- the evaluator -------------------------------------------------------------------------
    def evaluate(self, workload: Workload, plan: Plan, scale: DurationScale | None = None) -> Timing:
        """A generated workload (a trace is replayed: costmodel.replay.trace_evaluator.ReplayEvaluator
        over this evaluator); ``scale``, a what-if on a trace's measured times, is refused unless identity."""
        st = self._statics.for_evaluation(workload, plan, scale, self.cluster)
        self.evaluations += 1
        if not st.ops:
            return Timing(0.0, 0.0, 0.0, 0.0, 0.0, {})
        colls = self._collectives_under(st, plan)
        factors = self._noise_factors(len(st.ops))
        start, end = self._run(st, colls, factors)
        return self._timing(st, start, end, factors)

    def _collectives_under(self, st: _Static, plan: Plan) -> list[CollectiveModel]:
        """Each collective's model under the plan (host-side ones through the CPU path)."""
        by_sig = {sig: self.collective_model(sig, plan.config_for(sig)) for sig in st.unique_signatures}
        return [by_sig[sig] if on_gpu else by_sig[sig].host_side() for sig, on_gpu in zip(st.signatures, st.on_gpu)]

    def _noise_factors(self, n: int) -> list[float]:
        """One multiplicative factor per op: N(1, noise) clipped, or exactly 1 without noise."""
        if self.noise > 0:
            return np.clip(self._rng.normal(1.0, self.noise, n), *_NOISE_CLIP).tolist()
        return [1.0] * n

    def _run(self, st: _Static, colls: list[CollectiveModel], factors: list[float]) -> tuple[list[float], list[float]]:
        """The event loop: every op's start and end. Between two events the running set is
        fixed and each op progresses at the rate the others leave it (module docstring)."""
        n = len(st.ops)
        nc = st.n_compute
        cmodels = st.compute_models
        state_cache = st.state_cache
        succ = st.succ
        pending = list(st.pending)
        start = [0.0] * n
        end = [0.0] * n
        remaining = [1.0] * n
        ready = [i for i in range(n) if pending[i] == 0]
        active_c: list[int] = []  # running compute ops
        active_k: list[int] = []  # running collectives (indices into st.ops)
        t = 0.0
        done = 0
        while done < n:
            for i in ready:
                start[i] = t
                if i < nc:
                    active_c.append(i)
                else:
                    model = colls[i - nc]
                    # CTAs wait for SMs held by a running kernel: its blocks run in lockstep
                    # waves, so SMs free up at the end of the current wave (half a wave on average);
                    # copy engines need no SM
                    if active_c and model.waits_for_sms:
                        wait = max([cmodels[j].wave_wait_us for j in active_c])
                        if wait > 0:
                            remaining[i] += wait / max(model.alone_us, 1e-9)
                    active_k.append(i)
            ready = []
            if not active_c and not active_k:  # only if stream order and dependencies disagree
                stuck = next(i for i in range(n) if pending[i] > 0)
                raise LagomError(f"workload: op {st.op_ids[stuck]} can never start (cyclic dependencies)")
            if not active_k and len(active_c) == 1:  # fast path: one kernel alone on the GPU
                i = active_c[0]
                r = 1.0 / (cmodels[i].uncontended_us * factors[i])
                dt = remaining[i] / r
                t += dt
                remaining[i] = 0.0
                end[i] = t
                done += 1
                active_c.clear()
                for s in succ[i]:
                    pending[s] -= 1
                    if pending[s] == 0:
                        ready.append(s)
                continue
            key = (tuple([cmodels[i] for i in active_c]), tuple([colls[i - nc] for i in active_k]))
            durations = state_cache.get(key)
            if durations is None:
                durations = self._state_durations(key[0], key[1])
                if len(state_cache) > 50_000:
                    state_cache.clear()
                state_cache[key] = durations
            rates = {}
            dt = float("inf")
            for i, d in zip(active_c + active_k, durations):
                r = 1.0 / (d * factors[i])
                rates[i] = r
                step = remaining[i] / r
                if step < dt:
                    dt = step
            t += dt
            finished = []
            limit = dt * (1.0 + 1e-12) + 1e-12
            for i, r in rates.items():
                if remaining[i] / r <= limit:
                    finished.append(i)
                    remaining[i] = 0.0
                else:
                    remaining[i] -= r * dt
            for i in finished:
                end[i] = t
                done += 1
                if i < nc:
                    active_c.remove(i)
                else:
                    active_k.remove(i)
                for s in succ[i]:
                    pending[s] -= 1
                    if pending[s] == 0:
                        ready.append(s)
        return start, end

    def _state_durations(self, kernels: tuple, collectives: tuple) -> list[float]:
        """Duration of each running op (kernels first, then collectives) if this set of ops ran
        together for the op's whole life: the resources each leaves the others."""
        sm, l2, bw = self._sm, self._l2, self._bw
        ctas = 0
        footprint = 0.0
        net = intra = 0
        for m in collectives:
            ctas += m.ctas
            footprint += m.footprint_bytes
            if m.link_class == "net":
                net += 1
            else:
                intra += 1
        n_c = len(kernels)
        free_sms = max(1, sm - ctas)
        on_sms = sum(1 for cm in kernels if not cm.copy_engine)  # memcpy/memset hold no SM
        per_op_sms = max(1, free_sms // on_sms) if on_sms else free_sms
        # the collectives' in-flight FIFO data holds its footprint of L2; kernels get the rest
        l2_compute = l2 - footprint if footprint < l2 else 0.0
        shares = [1.0 / (net if m.link_class == "net" else intra) for m in collectives]
        l2_comm = [l2 * m.footprint_bytes / footprint if footprint > l2 else l2 for m in collectives]
        # DRAM: each side's demand at its own pace, then a max-min fair split
        demand_c = sum(cm.dram_demand(per_op_sms, l2_compute) for cm in kernels)
        demand_k = sum(m.dram_demand(l2k, share) for m, l2k, share in zip(collectives, l2_comm, shares))
        if demand_c + demand_k <= bw:
            bw_c, bw_k = bw - demand_k, bw - demand_c
        else:
            half = bw / 2.0
            if demand_k <= half:
                bw_c, bw_k = bw - demand_k, demand_k
            elif demand_c <= half:
                bw_c, bw_k = demand_c, bw - demand_c
            else:
                bw_c, bw_k = half, half
        out = []
        if n_c:
            each = bw_c / n_c
            out += [cm.time_us(per_op_sms, l2_compute, each) for cm in kernels]
        if collectives:
            each = bw_k / len(collectives)
            out += [m.time_us(l2k, each, share) for m, l2k, share in zip(collectives, l2_comm, shares)]
        return out

    def _timing(self, st: _Static, start: list[float], end: list[float], factors: list[float]) -> Timing:
        nc = st.n_compute
        ops = LazyOpTimings(st.index, start, end)
        first = min(start)
        last = max(end)
        compute_spans = union([(start[i], end[i]) for i in range(nc) if not st.ops[i].is_memory_op])
        comm_spans = union([(start[i], end[i]) for i in range(nc, len(st.ops))])
        compute_us = sum((b - a for a, b in compute_spans), 0.0)
        comm_us = sum((b - a for a, b in comm_spans), 0.0)
        exposed = comm_us - sum((b - a for a, b in intersection(comm_spans, compute_spans)), 0.0)
        per_stream: dict[int, float] = {}
        for i in range(nc):
            if st.ops[i].is_memory_op:
                continue
            sid = st.compute_stream_of[i]
            per_stream[sid] = per_stream.get(sid, 0.0) + st.compute_models[i].uncontended_us * factors[i]
        uncontended = max(per_stream.values(), default=0.0)
        return Timing(
            iteration_us=last - first,
            compute_us=compute_us,
            comm_us=comm_us,
            exposed_comm_us=max(0.0, exposed),
            compute_uncontended_us=min(uncontended, compute_us) if compute_us > 0 else 0.0,
            ops=ops,
            uncontended_us=LazyOpValues(st.op_ids[:nc], [st.compute_models[i].uncontended_us * factors[i]
                                                         for i in range(nc)]),
        )


def tiny_overlap_workload(op: ComputeOp, signature: Signature, collective_name: str = "collective") -> Workload:
    """A two-op workload: ``op`` on a compute stream and one collective of ``signature`` on a
    communication stream, both ready at time 0 (the calibration backend's building block)."""
    kernel = ComputeOp(**{**op.__dict__, "op_id": 0, "stream": 1, "start_us": 0.0})
    coll = CollectiveOp(1, collective_name, signature.collective, signature.message_bytes, 2, 0.0,
                        0.0, signature.group)
    ranks = tuple(range(signature.ranks))
    return Workload(
        rank=0,
        world_size=signature.ranks,
        streams=[Stream(1, StreamKind.COMPUTE), Stream(2, StreamKind.COMMUNICATION)],
        compute_ops=[kernel],
        collectives=[coll],
        groups={signature.group: ProcessGroup(signature.group, ranks, signature.nodes)},
        dependencies=[],
        source="tiny overlap",
    )


__all__ = ["Simulator", "tiny_overlap_workload"]
