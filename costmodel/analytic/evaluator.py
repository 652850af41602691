"""The analytic Evaluator: Lagom's unified contention model, fast enough to search with.

``AnalyticEvaluator(cluster).evaluate(workload, plan) -> Timing``

Three closed-form pieces (docs/costmodel.md has the equations):

1. each collective's time from its settings: a chunk pipeline over channels, limited
   by the link, the protocol, threads and per-step latency
   (:mod:`costmodel.analytic.collective_model`);
2. each compute kernel's time beside the running collectives, by waves of thread
   blocks on the SMs they leave, the L2 they leave and the DRAM bandwidth they leave
   (the paper's Eq. 4-6, :mod:`costmodel.analytic.contention_model`), and each collective's
   time on the DRAM bandwidth and L2 the kernel leaves it;

3. stream order and dependencies: an op starts when its stream's previous op and
   every op it depends on have finished; while the set of running ops stays the same
   every op progresses at the constant rate of (2), so the timeline jumps from one op
   end to the next. A change of settings shifts every later overlap (the cascade).

A workload read from a trace is not timed here: it is replayed
(:class:`costmodel.replay.trace_evaluator.ReplayEvaluator` over this evaluator), its execution
graph scheduled with the measured times, scaled by (1) and (2) as ratios
(:meth:`AnalyticEvaluator.collective_time_us`, :meth:`AnalyticEvaluator.slowdown_beside`).

Parameters come from the cluster file's ``model:`` section (fitted by ``lagom
calibrate``), else from the hardware numbers (:func:`costmodel.analytic.params.default_params`).

Speed: the workload's static data (stream order, dependencies, kernel shapes) is built
once per workload object; collective estimates are cached per (signature, setting)
and the contended times per (kernel shape, running collective estimates), so
re-evaluating with one signature changed recomputes only what that change touches.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial

from costmodel.analytic.collective_model import (
    CollectiveEstimate,
    collnet_estimate,
    copy_engine_estimate,
    nvls_estimate,
    resolved_estimate,
    symmetric_estimate,
)
from costmodel.analytic.contention_model import (
    ComputeShape,
    GpuNumbers,
    compute_shape,
    cta_wait_us,
    gpu_numbers,
    pair_times,
    pair_times_many,
    running_set_times,
    shape_arrays,
)
from costmodel.analytic.jump import JumpStatic, build_jump_static, jump_timeline
from costmodel.analytic.params import params_for
from costmodel.cluster import ClusterSpec
from costmodel.evaluator import DurationScale, LazyOpTimings, LazyOpValues, Timing
from costmodel.nccl_algorithms import NVLS_FAMILY, admitted, algorithm_settings
from costmodel.nccl_defaults import nccl_graph, protocol_hop_factors, symmetric_kernel
from costmodel.workload_cache import WorkloadCache
from nccl_env.errors import LagomError
from nccl_env.knob_table import ALGORITHM, CHANNELS, CHUNK, PATH, THREADS, sets_every_kernel_knob
from nccl_env.knobs import Algorithm, CommConfig
from nccl_env.plan import Plan, Signature
from nccl_env.rules import P2P_COLLECTIVES, Mechanism, collective_mechanism
from traces.workload import CollectiveOp, ComputeOp, Op, Workload

_EPS = 1e-9


def _advance(running: list[int], times: list[float], remaining: list[float], dt: float) -> list[int]:
    """Advance each running op by ``dt`` (``times[i]``: its duration at the current pace;
    ``remaining``: fractions left, updated in place) and return those that finished;
    at least one always does (the one with the least left), so a timeline cannot stall
    on rounding."""
    finished = []
    for k, tk in zip(running, times):
        left = remaining[k] - (dt / tk if tk > 0 else 1.0)
        if left <= _EPS:
            finished.append(k)
        else:
            remaining[k] = left
    if not finished:
        finished.append(min(running, key=remaining.__getitem__))
    return finished
_CACHE_WORKLOADS = 8  # static data kept for this many workloads


@dataclass
class _Static:
    """What a workload contributes to every evaluation, built once."""

    n_ops: int
    op_ids: list[int]
    index: dict[int, int]  # op id -> position
    is_coll: list[bool]
    next_on_stream: list[int]  # the next op on the same stream, -1 at the end
    succs: list[tuple[int, ...]]  # dependency successors
    n_preds: list[int]  # stream predecessor + dependencies
    shapes: list[ComputeShape | None]
    shape_id: list[int]  # kernels with equal shapes share an id (and cached times)
    busy: list[bool]  # counts toward compute-busy time (a kernel, not a memcpy/memset)
    sig_of: list[int]  # collective -> index into signatures; -1 for kernels
    signatures: list[Signature]  # per collective kind (a signature may appear twice: on the GPU, on the host)
    host_side: list[bool]  # run by the host (gloo in a CPU-only trace): no SMs, L2 or GPU DRAM
    all_succs: list[tuple[int, ...]]  # stream successor then dependency successors
    base_us: list[float]  # kernel alone (0 for collectives)
    cta_wait_us: list[float]  # a collective's start delay beside this kernel (0 for collectives)
    jump: JumpStatic | None  # two streams: the jump timeline applies
    pair_many: object  # estimate -> (kernel times, collective times, CTA waits) over shape ids
    compute_streams: dict[int, list[int]]  # stream -> its kernels
    one_compute_stream: bool
    uncontended_us: float  # compute busy time with no collective running
    rate_cache: dict


class AnalyticEvaluator:
    """Evaluator protocol (costmodel.evaluator) over the fitted closed-form model."""

    def __init__(self, cluster: ClusterSpec, params: dict[str, float] | None = None) -> None:
        self.cluster = cluster
        self.params = dict(params) if params is not None else params_for(cluster)
        g = cluster.gpu
        self.gpu: GpuNumbers = gpu_numbers(g.sm_count, g.l2_bytes, g.mem_bw_gb_per_s, g.peak_tflops,
                                           g.max_blocks_per_sm, g.max_threads_per_sm, self.params["mem_efficiency"],
                                           g.fp32_tflops)
        self.evaluations = 0
        self._version = cluster.nccl_version
        self._topology = cluster.path_topology()
        self._statics: WorkloadCache[_Static] = WorkloadCache(self._build_static, _CACHE_WORKLOADS)
        self._est_cache: dict[tuple[Signature, CommConfig], CollectiveEstimate] = {}
        self._host_cache: dict[tuple, tuple[CollectiveEstimate, CollectiveEstimate]] = {}

    # ---- public ------------------------------------------------------------------------------
    def evaluate(self, workload: Workload, plan: Plan, scale: DurationScale | None = None) -> Timing:
        """A generated workload (a trace is replayed: costmodel.replay.trace_evaluator.ReplayEvaluator
        over this evaluator); ``scale``, a what-if on a trace's measured times, is refused unless identity."""
        st = self._statics.for_evaluation(workload, plan, scale, self.cluster)
        self.evaluations += 1
        ests = [self.estimate(sig, plan.config_for(sig)) for sig in st.signatures]
        if True in st.host_side:
            ests = [self._host_side(e) if host else e for e, host in zip(ests, st.host_side)]
        if st.jump is not None:
            starts, ends, busy_c, busy_x, exposed, iteration, fill = jump_timeline(st.jump, ests, st.pair_many)
            return Timing(iteration_us=iteration, compute_us=busy_c, comm_us=busy_x, exposed_comm_us=exposed,
                          compute_uncontended_us=min(st.uncontended_us, busy_c),
                          ops=LazyOpTimings(st.jump.index, starts, ends, fill),
                          uncontended_us=LazyOpValues(st.op_ids, st.base_us))
        timeline = self._timeline_one_compute_stream if st.one_compute_stream else self._timeline
        return self._timing(st, *timeline(st, ests))

    def estimate(self, signature: Signature, config: CommConfig) -> CollectiveEstimate:
        """The collective under ``config`` (None fields resolved to NCCL's choices)."""
        key = (signature, config)
        est = self._est_cache.get(key)
        if est is not None:
            return est
        config = admitted(self.cluster, signature, config)
        est = self._path_estimate(signature, config) or self._algorithm_estimate(signature, config)
        if est is None:
            est = resolved_estimate(
                self.params, signature.collective, signature.message_bytes, signature.ranks, signature.nodes,
                self.cluster.gpus_per_node, self.resolve(signature, config),
                self.gpu.sm_count - 1,  # a channel is a CTA: one SM each
                self.gpu.l2_bytes, self.gpu.mem_bw, partial(protocol_hop_factors, self.cluster),
            )
        if key not in self._est_cache:
            if len(self._est_cache) > 200_000:
                self._est_cache.clear()
                self._host_cache.clear()
                for static in self._statics.values():
                    static.rate_cache.clear()  # keyed by estimate ids
            self._est_cache[key] = est
        return est

    def _path_estimate(self, signature: Signature, config: CommConfig) -> CollectiveEstimate | None:
        """The estimate when the collective's path takes it off NCCL's SM kernels (cached), else None."""
        mechanism = collective_mechanism(PATH.get(config), signature.collective, signature.nodes, self._version,
                                         self._topology)
        if mechanism is Mechanism.SM_KERNEL:
            return None
        p, g = self.params, self.gpu
        est: CollectiveEstimate | None = None
        if mechanism is Mechanism.COPY_ENGINE:
            est = copy_engine_estimate(p, signature.collective, signature.message_bytes, signature.ranks,
                                       signature.nodes, self.cluster.gpus_per_node, g.l2_bytes, g.mem_bw)
        else:
            kernel = symmetric_kernel(signature, compute_capability=nccl_graph(self.cluster).compute_capability)
            if kernel is None:
                return None
            est = symmetric_estimate(p, signature.collective, signature.message_bytes, signature.ranks,
                                     min(kernel.ctas, g.sm_count - 1), kernel.bus_bytes,
                                     kernel.cta_bw_bytes_per_us, kernel.peak_bw_bytes_per_us, g.l2_bytes, g.mem_bw)
        self._est_cache[(signature, config)] = est
        return est

    def _algorithm_estimate(self, signature: Signature, config: CommConfig) -> CollectiveEstimate | None:
        """The estimate when NCCL's kernels run NVLS, NVLSTree, CollNetDirect or PAT (NCCL's settings for them:
        costmodel.nccl_algorithms.algorithm_settings), else None (ring and tree: resolved_estimate)."""
        resolved = self.resolve(signature, config)
        algo = ALGORITHM.get(resolved)
        if algo is Algorithm.PAT:
            resolved = algorithm_settings(self.cluster, signature, config, resolved)
            return resolved_estimate(
                self.params, signature.collective, signature.message_bytes, signature.ranks, signature.nodes,
                self.cluster.gpus_per_node, resolved, self.gpu.sm_count - 1, self.gpu.l2_bytes, self.gpu.mem_bw,
                partial(protocol_hop_factors, self.cluster))
        if algo not in NVLS_FAMILY and algo is not Algorithm.COLLNET_DIRECT:
            return None
        resolved = algorithm_settings(self.cluster, signature, config, resolved)
        nc, chunk = CHANNELS.get(resolved), CHUNK.get(resolved)
        assert nc is not None and chunk is not None  # algorithm_settings sets them
        if algo is Algorithm.COLLNET_DIRECT:
            return collnet_estimate(self.params, signature.message_bytes, signature.ranks, signature.nodes,
                                    self.cluster.gpus_per_node, min(nc, self.gpu.sm_count - 1),
                                    THREADS.get(resolved) or 512, chunk, self.gpu.l2_bytes, self.gpu.mem_bw)
        return nvls_estimate(self.params, signature.collective, signature.message_bytes, signature.ranks,
                             signature.nodes, min(nc, self.gpu.sm_count - 1), chunk, self.gpu.l2_bytes,
                             self.gpu.mem_bw)

    def _host_side(self, est: CollectiveEstimate) -> CollectiveEstimate:
        """The same collective run by the host: same pace, no SMs, L2 or GPU DRAM."""
        key = ("host", id(est))
        hit = self._host_cache.get(key)
        if hit is None or hit[0] is not est:
            hit = (est, replace(est, ctas=0, footprint_bytes=0.0, dram_base=0.0, dram_fifo=0.0))
            self._host_cache[key] = hit
        return hit[1]

    def resolve(self, signature: Signature, config: CommConfig) -> CommConfig:
        """``config`` with every None field filled by NCCL's modelled default."""
        # p2p: NCCL overrides threads and the rest
        if sets_every_kernel_knob(config) and signature.collective not in P2P_COLLECTIVES:
            return config
        from costmodel.nccl_defaults import resolve_config

        return resolve_config(self.cluster, signature, config)

    def collective_time_us(self, signature: Signature, config: CommConfig) -> float:
        """The collective alone (no compute beside it), microseconds."""
        return self.estimate(signature, config).time_us

    def compute_shape(self, op: ComputeOp) -> ComputeShape:
        block_threads = op.block[0] * op.block[1] * op.block[2] if op.block else None
        return compute_shape(self.params, self.gpu, op.name, op.duration_us, op.thread_blocks, block_threads,
                             op.blocks_per_sm, op.flops, op.dram_bytes, op.shared_memory_bytes, op.is_memory_op)

    def compute_time_us(self, op: ComputeOp) -> float:
        """The kernel alone on the whole GPU, microseconds."""
        return self.compute_shape(op).base_us

    def slowdown_beside(self, op: ComputeOp, signature: Signature, config: CommConfig) -> float:
        """The kernel's time beside the collective over its time alone (the replay's contention ratio)."""
        shape = self.compute_shape(op)
        yc, _ = pair_times(self.params, self.gpu, shape, self.estimate(signature, config))
        return yc / shape.base_us if shape.base_us > 0 else 1.0

    def overlap_us(self, op: ComputeOp, signature: Signature, config: CommConfig) -> tuple[float, float]:
        """(kernel time, collective time) when both start together on two streams: both run
        at their contended rates until the first ends, then the other finishes alone."""
        shape = self.compute_shape(op)
        est = self.estimate(signature, config)
        yc, yx = running_set_times(self.params, self.gpu, [shape], [est])
        wait = cta_wait_us(self.params, self.gpu, shape) if est.waits_for_sms else 0.0
        x_rem = 1.0 + wait / max(est.time_us, 1e-9)
        tc, tx = yc, x_rem * yx
        if tc <= tx:
            return tc, tc + (x_rem - tc / yx) * est.time_us
        return tx + (1.0 - tx / yc) * shape.base_us, tx

    # ---- static data ----------------------------------------------------------------------------
    def _build_static(self, w: Workload) -> _Static:
        ops: list[Op] = [*w.compute_ops, *w.collectives]
        order = sorted(range(len(ops)), key=lambda i: (ops[i].start_us, i))  # stream order = list order
        op_ids = [ops[i].op_id for i in order]
        index = {oid: k for k, oid in enumerate(op_ids)}  # unique, dependencies acyclic: check_workload
        n = len(op_ids)
        is_coll = [i >= len(w.compute_ops) for i in order]
        next_on_stream = [-1] * n
        n_preds = [0] * n
        succs: list[list[int]] = [[] for _ in range(n)]
        last: dict[int, int] = {}
        for k, i in enumerate(order):
            prev = last.get(ops[i].stream)
            if prev is not None:
                next_on_stream[prev] = k
                n_preds[k] += 1
            last[ops[i].stream] = k
        for dep in w.dependencies:
            succs[index[dep.before]].append(index[dep.after])
            n_preds[index[dep.after]] += 1
        shapes: list[ComputeShape | None] = [None] * n
        shape_id = [-1] * n
        busy = [False] * n
        ids: dict[ComputeShape, int] = {}
        sig_index: dict[tuple[Signature, bool], int] = {}
        signatures: list[Signature] = []
        host_side: list[bool] = []
        sig_of = [-1] * n
        compute_streams: dict[int, list[int]] = {}
        for k, i in enumerate(order):
            op = ops[i]
            if isinstance(op, CollectiveOp):  # is_coll[k]
                sig = w.signature(op, self.cluster.gpus_per_node)
                key = (sig, not op.on_gpu)
                j = sig_index.get(key)
                if j is None:
                    j = sig_index[key] = len(signatures)
                    signatures.append(sig)
                    host_side.append(not op.on_gpu)
                sig_of[k] = j
            else:
                shape = self.compute_shape(op)
                shapes[k] = shape
                shape_id[k] = ids.setdefault(shape, len(ids))
                busy[k] = not op.is_memory_op
                compute_streams.setdefault(op.stream, []).append(k)
        coll_streams = {ops[i].stream for k, i in enumerate(order) if is_coll[k]}
        base_us = [sh.base_us if sh is not None else 0.0 for sh in shapes]
        return _Static(
            n_ops=n, op_ids=op_ids, index=index, is_coll=is_coll, next_on_stream=next_on_stream,
            succs=[tuple(s) for s in succs], n_preds=n_preds, shapes=shapes, shape_id=shape_id, busy=busy,
            sig_of=sig_of, signatures=signatures, host_side=host_side,
            compute_streams=compute_streams,
            one_compute_stream=len(compute_streams) <= 1 and not (set(compute_streams) & coll_streams),
            rate_cache={},
            uncontended_us=max((sum(base_us[k] for k in ks if busy[k]) for ks in compute_streams.values()),
                               default=0.0),
            pair_many=self._pair_many(list(ids)),
            all_succs=[tuple(x for x in (next_on_stream[k], *succs[k]) if x >= 0) for k in range(n)],
            base_us=base_us,
            cta_wait_us=[cta_wait_us(self.params, self.gpu, sh) if sh is not None else 0.0 for sh in shapes],
            jump=build_jump_static(op_ids, is_coll, next_on_stream, [tuple(x) for x in succs], n_preds, busy,
                                   shape_id, [sh.base_us if sh is not None else 0.0 for sh in shapes], sig_of,
                                   [ops[i].stream for i in order]),
        )

    # ---- the timeline -------------------------------------------------------------------------------
    def _times_under(self, st: _Static, comps: list[int], colls: list[int],
                     ests: list[CollectiveEstimate]) -> list[float]:
        """Durations of the running kernels then collectives, were the running set fixed."""
        key = (tuple([st.shape_id[k] for k in comps]), tuple([id(ests[st.sig_of[k]]) for k in colls]))
        hit = st.rate_cache.get(key)
        if hit is None:
            # comps are kernels, whose shapes are set (None marks a collective)
            hit = running_set_times(self.params, self.gpu, [st.shapes[k] for k in comps],  # type: ignore[misc]
                                    [ests[st.sig_of[k]] for k in colls])
            if len(st.rate_cache) > 500_000:
                st.rate_cache.clear()
            st.rate_cache[key] = hit
        return hit

    def _pair_many(self, shapes: list[ComputeShape]):
        arrays = shape_arrays(self.gpu, shapes)
        p, gpu = self.params, self.gpu
        return lambda e: pair_times_many(p, gpu, arrays, e)

    def _start_collective(self, st: _Static, x: int, kernels: list[int], ests: list[CollectiveEstimate],
                          remaining: list[float]) -> None:
        """A collective launched beside full kernels waits for SMs for its CTAs."""
        e = ests[st.sig_of[x]]
        if not e.waits_for_sms:
            return
        wait = max((st.cta_wait_us[k] for k in kernels), default=0.0)
        if wait > 0.0:
            remaining[x] += wait / max(e.time_us, 1e-9)

    def _timeline(self, st: _Static, ests: list[CollectiveEstimate]) -> tuple:
        """Start and end of every op, compute-busy, comm-busy and exposed-comm time (any streams)."""
        n = st.n_ops
        starts = [0.0] * n
        ends = [0.0] * n
        remaining = [1.0] * n
        waiting = list(st.n_preds)
        comps: list[int] = []
        colls: list[int] = []
        ready = [k for k in range(n) if waiting[k] == 0]
        t = 0.0
        done = 0
        busy_compute = busy_comm = exposed = 0.0
        while True:
            for k in ready:
                starts[k] = t
                if st.is_coll[k]:
                    if comps:
                        self._start_collective(st, k, comps, ests, remaining)
                    colls.append(k)
                else:
                    comps.append(k)
            ready = []
            if not comps and not colls:
                break
            comps.sort()
            colls.sort()
            times = self._times_under(st, comps, colls, ests) if colls else [st.base_us[k] for k in comps]
            running = comps + colls
            dt = min(remaining[k] * tk for k, tk in zip(running, times))
            t += dt
            computing = any(st.busy[k] for k in comps)
            if computing:
                busy_compute += dt
            if colls:
                busy_comm += dt
                if not computing:
                    exposed += dt
            finished = _advance(running, times, remaining, dt)
            for k in finished:
                ends[k] = t
                done += 1
                (colls if st.is_coll[k] else comps).remove(k)
                for s in (st.next_on_stream[k], *st.succs[k]):
                    if s >= 0:
                        waiting[s] -= 1
                        if waiting[s] == 0:
                            ready.append(s)
        if done != n:
            stuck = next(k for k in range(n) if waiting[k] > 0)
            raise LagomError(f"workload: op {st.op_ids[stuck]} can never start (cyclic dependencies)")
        return starts, ends, busy_compute, busy_comm, exposed

    def _timeline_one_compute_stream(self, st: _Static, ests: list[CollectiveEstimate]) -> tuple:
        """:meth:`_timeline` for one compute stream beside any number of collective streams
        (every generated workload): the same phases, the common cases unrolled. Kept for
        speed: without it TP and EP iterations evaluate about 3x slower
        (``bench/evaluator_speed.py --workload tp:phi2:tp=8,dp=2``: 1.26 -> 3.70 ms cold)."""
        n = st.n_ops
        starts = [0.0] * n
        ends = [0.0] * n
        remaining = [1.0] * n
        waiting = list(st.n_preds)
        allsucc = st.all_succs
        is_coll = st.is_coll
        shapes = st.shapes
        sig_of = st.sig_of
        shape_id = st.shape_id
        busy = st.busy
        base = st.base_us
        cache = st.rate_cache
        times_under = self._times_under
        p, gpu = self.params, self.gpu
        waits = st.cta_wait_us
        c = -1  # the running kernel
        xs: list[int] = []  # the running collectives, sorted
        for k in range(n):
            if waiting[k] == 0:
                if is_coll[k]:
                    if c >= 0 and waits[c] > 0.0 and ests[sig_of[k]].waits_for_sms:
                        remaining[k] += waits[c] / max(ests[sig_of[k]].time_us, 1e-9)
                    xs.append(k)
                else:
                    c = k
        t = 0.0
        done = 0
        busy_compute = busy_comm = exposed = 0.0
        while c >= 0 or xs:
            f2 = -1  # a second op ending at the same time
            if not xs:  # a kernel alone
                dt = remaining[c] * base[c]
                f1 = c
            elif len(xs) == 1:
                x = xs[0]
                e = ests[sig_of[x]]
                if c < 0:  # a collective alone
                    dt = remaining[x] * e.time_us
                    f1 = x
                else:  # the common case: one kernel beside one collective
                    key: tuple[int, ...] = (shape_id[c], id(e))
                    pair = cache.get(key)
                    if pair is None:  # c is a kernel: its shape is set (None marks a collective)
                        pair = cache[key] = pair_times(p, gpu, shapes[c], e)  # type: ignore[arg-type]
                    yc, yx = pair
                    tc = remaining[c] * yc
                    tx = remaining[x] * yx
                    if tc < tx * (1.0 - 1e-12):
                        dt = tc
                        remaining[x] -= dt / yx
                        f1 = c
                    elif tx < tc * (1.0 - 1e-12):
                        dt = tx
                        remaining[c] -= dt / yc
                        f1 = x
                    else:
                        dt = tc
                        f1, f2 = c, x
            elif len(xs) == 2 and c >= 0:  # a kernel beside two collectives (e.g. TP + DP groups)
                x1, x2 = xs
                key = (shape_id[c], id(ests[sig_of[x1]]), id(ests[sig_of[x2]]))
                times = cache.get(key)
                if times is None:
                    times = cache[key] = times_under(st, [c], xs, ests)
                yc, y1, y2 = times
                tc = remaining[c] * yc
                t1 = remaining[x1] * y1
                t2 = remaining[x2] * y2
                dt = tc if tc <= t1 and tc <= t2 else (t1 if t1 <= t2 else t2)
                f1 = f2 = -1
                for k, y in ((c, yc), (x1, y1), (x2, y2)):
                    left = remaining[k] - dt / y
                    if left <= _EPS:
                        if f1 < 0:
                            f1 = k
                        elif f2 < 0:
                            f2 = k
                        else:
                            remaining[k] = 0.0  # a third end at the same time: next step, dt = 0
                    else:
                        remaining[k] = left
            else:  # several collectives at once (rare: _times_under's own cache serves it)
                times = times_under(st, [c] if c >= 0 else [], xs, ests)
                running = [c, *xs] if c >= 0 else xs
                dt = min([remaining[k] * tk for k, tk in zip(running, times)])
                finished = _advance(running, times, remaining, dt)
                if len(finished) > 2:  # rare: end them one by one at the same time
                    for k in finished[2:]:
                        remaining[k] = 0.0
                    f1 = finished[0]
                    f2 = finished[1]
                else:
                    f1 = finished[0]
                    f2 = finished[1] if len(finished) == 2 else -1
            t += dt  # the step's busy time, before the ended ops leave
            if xs:
                busy_comm += dt
                if c >= 0 and busy[c]:
                    busy_compute += dt
                else:
                    exposed += dt
            elif busy[c]:
                busy_compute += dt
            for k in (f1, f2):
                if k < 0:
                    continue
                ends[k] = t
                done += 1
                if k == c:
                    c = -1
                else:
                    xs.remove(k)
            started_coll = False
            for k in (f1, f2):
                if k < 0:
                    continue
                for s in allsucc[k]:
                    waiting[s] -= 1
                    if waiting[s] == 0:
                        starts[s] = t
                        if is_coll[s]:
                            xs.append(s)
                            started_coll = True
                            if c >= 0 and waits[c] > 0.0 and ests[sig_of[s]].waits_for_sms:
                                # beside a full kernel: its CTAs wait for SMs
                                remaining[s] += waits[c] / max(ests[sig_of[s]].time_us, 1e-9)
                        else:
                            c = s
            if started_coll and len(xs) > 1:
                xs.sort()
        if done != n:
            stuck = next(k for k in range(n) if waiting[k] > 0)
            raise LagomError(f"workload: op {st.op_ids[stuck]} can never start (cyclic dependencies)")
        return starts, ends, busy_compute, busy_comm, exposed

    # ---- summary ----------------------------------------------------------------------------------------
    def _timing(self, st: _Static, starts: list[float], ends: list[float], busy_compute: float, busy_comm: float,
                exposed: float, index: dict[int, int] | None = None) -> Timing:
        iteration = (max(ends) - min(starts)) if st.n_ops else 0.0
        return Timing(iteration_us=iteration, compute_us=busy_compute, comm_us=busy_comm,
                      exposed_comm_us=exposed, compute_uncontended_us=min(st.uncontended_us, busy_compute),
                      ops=LazyOpTimings(index or st.index, starts, ends),
                      uncontended_us=LazyOpValues(st.op_ids, st.base_us))
