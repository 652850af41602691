"""The analytic Evaluator: Lagom's unified contention model, fast enough to search with.

``AnalyticEvaluator(cluster).evaluate(workload, plan) -> Timing``

Three closed-form pieces (see docs/costmodel.md for the equations):

1. each collective's time alone from its settings
   (:func:`costmodel.collective_model.collective_estimate`);
2. each compute op's time under the collectives running beside it, by waves of
   thread blocks on the SMs they leave and the memory bandwidth they leave
   (:mod:`costmodel.contention_model`, the paper's Eq. 4-6), and each collective's
   time under the memory traffic of the compute beside it;
3. stream order and dependencies: an op starts when its stream's previous op and
   every op it depends on have finished; while the set of running ops stays the
   same every op progresses at a constant rate, so the timeline jumps from one
   op end to the next (a change of settings shifts every later overlap: the cascade).

Parameters come from the cluster file's ``model:`` section (fitted by ``lagom
calibrate``), else from the hardware numbers (:func:`costmodel.model_params.default_params`).

Speed: the workload's static data (stream order, dependencies, compute shapes) is
built once per workload object; collective estimates are cached per (signature,
setting) and contended rates per (compute op, collective estimate), so
re-evaluating with one signature changed recomputes only what it touches.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

from costmodel.cluster import ClusterSpec
from costmodel.collective_model import CollectiveEstimate, collective_estimate
from costmodel.contention_model import (
    ComputeShape,
    GpuNumbers,
    compute_shape,
    compute_time_us,
    gpu_numbers,
)
from costmodel.evaluator import OpTiming, Timing
from costmodel.model_params import params_for
from nccl_env.errors import LagomError
from nccl_env.knobs import CommConfig
from nccl_env.plan import Plan, Signature
from traces.workload import ComputeOp, Workload

_EPS = 1e-9
_CACHE_WORKLOADS = 8  # static data kept for this many workloads (LRU)


@dataclass
class _Static:
    """What a workload contributes to every evaluation, built once."""

    n_ops: int
    op_ids: list[int]
    is_coll: list[bool]
    next_on_stream: list[int]  # index of the next op on the same stream, -1 at the end
    succs: list[tuple[int, ...]]  # dependency successors (cross-stream and same-stream)
    n_preds: list[int]  # stream predecessor + dependencies
    shapes: list[ComputeShape | None]
    shape_id: list[int]  # compute ops with equal shapes share an id (and cached rates)
    sig_of: list[int]  # collective -> index into signatures; -1 for compute
    signatures: list[Signature]
    compute_idx: list[int]
    coll_idx: list[int]
    compute_streams: int
    one_compute_stream: bool  # one compute stream, any collective streams: the fast timeline applies
    base_sum_us: float
    rate_cache: dict  # (running compute ops, ids of running collective estimates) -> times


class AnalyticEvaluator:
    """Evaluator protocol (costmodel.evaluator) over the fitted closed-form model."""

    def __init__(self, cluster: ClusterSpec, params: dict[str, float] | None = None) -> None:
        self.cluster = cluster
        self.params = dict(params) if params is not None else params_for(cluster)
        p = self.params
        g = cluster.gpu
        self.gpu: GpuNumbers = gpu_numbers(g.sm_count, g.peak_tflops, g.mem_bw_gb_per_s, g.l2_bytes,
                                           g.max_blocks_per_sm, p["mem_efficiency"])
        self.evaluations = 0
        self._statics: dict[int, tuple[weakref.ref, _Static]] = {}
        self._est_cache: dict[tuple[Signature, CommConfig], CollectiveEstimate] = {}

    # ---- public ------------------------------------------------------------------------
    def evaluate(self, workload: Workload, plan: Plan) -> Timing:
        self.evaluations += 1
        st = self._static(workload)
        ests = [self.estimate(sig, plan.config_for(sig)) for sig in st.signatures]
        timeline = self._timeline_one_compute_stream if st.one_compute_stream else self._timeline
        return self._timing(st, *timeline(st, ests))

    def estimate(self, signature: Signature, config: CommConfig) -> CollectiveEstimate:
        """The collective alone under ``config`` (None fields resolved to NCCL's choices)."""
        key = (signature, config)
        est = self._est_cache.get(key)
        if est is None:
            full = self.resolve(signature, config)
            p = self.params
            est = collective_estimate(
                p, signature.collective, signature.message_bytes, signature.ranks, signature.nodes,
                full.algorithm, full.protocol, full.channels, full.threads, full.chunk_bytes,
            )
            self._est_cache[key] = est
        return est

    def resolve(self, signature: Signature, config: CommConfig) -> CommConfig:
        """``config`` with every None field filled by NCCL's modelled default."""
        if None not in (config.algorithm, config.protocol, config.channels, config.threads, config.chunk_bytes):
            return config
        from costmodel.nccl_defaults import resolve_config  # the simulator issue's NCCL model

        return resolve_config(self.cluster, signature, config)

    def collective_time_us(self, signature: Signature, config: CommConfig) -> float:
        """The collective alone (no compute beside it), microseconds."""
        return self.estimate(signature, config).time_us

    def compute_shape(self, op: ComputeOp) -> ComputeShape:
        return compute_shape(self.gpu, op.duration_us, op.thread_blocks, op.blocks_per_sm, op.flops, op.dram_bytes)

    def overlap_us(self, op: ComputeOp, signature: Signature, config: CommConfig) -> tuple[float, float]:
        """(kernel time, collective time) when both start together on two streams.

        ``op.duration_us`` is the kernel's time alone. The same phases as the timeline:
        both run at their contended rates until the first ends, the other finishes alone.
        """
        shape = self.compute_shape(op)
        est = self.estimate(signature, config)
        yc, yx = self.pair_times_us(shape, est)
        if yc <= 0 or yx <= 0:
            return yc, yx
        if yc <= yx:
            return yc, yc + (1.0 - yc / yx) * est.time_us
        return yx + (1.0 - yx / yc) * shape.base_us, yx

    def pair_times_us(self, shape: ComputeShape, est: CollectiveEstimate) -> tuple[float, float]:
        """Durations of a kernel and a collective were they to run side by side throughout."""
        p = self.params
        gpu = self.gpu
        gain = p["l2_miss_gain"]
        y = compute_time_us(gpu, shape, est.channels, est.mem_bw_bytes_per_us, est.footprint_bytes, gain)
        comp_mem = 0.0
        if y > 0 and shape.blocks > 0:
            pressure = min(1.0, est.footprint_bytes / gpu.l2_bytes)
            comp_mem = shape.blocks * shape.bytes_per_block * (1.0 + gain * pressure) / y
        slow = 1.0 + p["coll_mem_sensitivity"] * comp_mem / gpu.mem_bw_bytes_per_us
        return y, est.time_us * slow

    # ---- static data ----------------------------------------------------------------------
    def _static(self, workload: Workload) -> _Static:
        key = id(workload)
        hit = self._statics.get(key)
        if hit is not None and hit[0]() is workload:
            return hit[1]
        st = self._build_static(workload)
        if len(self._statics) >= _CACHE_WORKLOADS:
            self._statics.pop(next(iter(self._statics)))
        self._statics[key] = (weakref.ref(workload), st)
        return st

    def _build_static(self, w: Workload) -> _Static:
        ops = [*w.compute_ops, *w.collectives]
        # stream order = list order within each kind; merge the two kinds on a stream by start time
        ops_sorted = sorted(range(len(ops)), key=lambda i: (ops[i].start_us, i))
        op_ids = [ops[i].op_id for i in ops_sorted]
        index = {oid: k for k, oid in enumerate(op_ids)}
        if len(index) != len(op_ids):
            raise LagomError(f"workload {w.source or ''}: op ids are not unique".replace("  ", " "))
        n = len(op_ids)
        is_coll = [i >= len(w.compute_ops) for i in ops_sorted]
        next_on_stream = [-1] * n
        n_preds = [0] * n
        succs: list[list[int]] = [[] for _ in range(n)]
        last_on_stream: dict[int, int] = {}
        for k, i in enumerate(ops_sorted):
            s = ops[i].stream
            prev = last_on_stream.get(s)
            if prev is not None:
                next_on_stream[prev] = k
                n_preds[k] += 1
            last_on_stream[s] = k
        for dep in w.dependencies:
            a = index.get(dep.before)
            b = index.get(dep.after)
            if a is None or b is None or a == b:
                continue
            succs[a].append(b)
            n_preds[b] += 1
        shapes: list[ComputeShape | None] = [None] * n
        shape_id = [-1] * n
        shape_ids: dict[ComputeShape, int] = {}
        sig_index: dict[Signature, int] = {}
        signatures: list[Signature] = []
        sig_of = [-1] * n
        per_node = self.cluster.gpus_per_node
        base_sum = 0.0
        compute_streams = set()
        coll_streams = {ops[i].stream for k, i in enumerate(ops_sorted) if is_coll[k]}
        for k, i in enumerate(ops_sorted):
            op = ops[i]
            if is_coll[k]:
                sig = w.signature(op, per_node)
                j = sig_index.get(sig)
                if j is None:
                    j = sig_index[sig] = len(signatures)
                    signatures.append(sig)
                sig_of[k] = j
            else:
                shapes[k] = compute_shape(self.gpu, op.duration_us, op.thread_blocks, op.blocks_per_sm,
                                          op.flops, op.dram_bytes)
                shape_id[k] = shape_ids.setdefault(shapes[k], len(shape_ids))  # type: ignore[arg-type]
                base_sum += op.duration_us
                compute_streams.add(op.stream)
        return _Static(
            n_ops=n, op_ids=op_ids, is_coll=is_coll, next_on_stream=next_on_stream,
            succs=[tuple(s) for s in succs], n_preds=n_preds, shapes=shapes, shape_id=shape_id, sig_of=sig_of,
            signatures=signatures,
            compute_idx=[k for k in range(n) if not is_coll[k]],
            coll_idx=[k for k in range(n) if is_coll[k]],
            compute_streams=len(compute_streams), base_sum_us=base_sum, rate_cache={},
            one_compute_stream=len(compute_streams) <= 1 and not (compute_streams & coll_streams),
        )

    # ---- the timeline -------------------------------------------------------------------------
    def _times_under(self, st: _Static, comps: list[int], colls: list[int],
                     ests: list[CollectiveEstimate]) -> list[float]:
        """Durations of the running compute ops then collectives, were the running set fixed."""
        cests = [ests[st.sig_of[k]] for k in colls]
        key = (tuple([st.shape_id[k] for k in comps]), tuple(map(id, cests)))
        hit = st.rate_cache.get(key)
        if hit is not None:
            return hit
        p = self.params
        gpu = self.gpu
        channels = sum(e.channels for e in cests)
        mem_bw = sum(e.mem_bw_bytes_per_us for e in cests)
        footprint = sum(e.footprint_bytes for e in cests)
        gain = p["l2_miss_gain"]
        pressure = min(1.0, footprint / gpu.l2_bytes)
        out: list[float] = []
        comp_mem = 0.0
        for k in comps:
            shape: ComputeShape = st.shapes[k]  # type: ignore[assignment]
            y = compute_time_us(gpu, shape, channels, mem_bw, footprint, gain) if cests else shape.base_us
            out.append(y)
            if y > 0 and shape.blocks > 0:
                comp_mem += shape.blocks * shape.bytes_per_block * (1.0 + gain * pressure) / y
        slow = 1.0 + p["coll_mem_sensitivity"] * comp_mem / gpu.mem_bw_bytes_per_us
        share = len(cests)
        for e in cests:
            out.append((e.latency_us + e.channel_us + e.bandwidth_us * share) * slow)
        if len(st.rate_cache) > 500_000:
            st.rate_cache.clear()
        st.rate_cache[key] = out
        return out

    def _timeline(self, st: _Static, ests: list[CollectiveEstimate]) -> tuple[list[float], list[float], float, float, float]:
        """Start and end of every op; compute-busy, comm-busy and exposed-comm time."""
        n = st.n_ops
        starts = [0.0] * n
        ends = [0.0] * n
        remaining = [1.0] * n
        waiting = list(st.n_preds)
        nxt = st.next_on_stream
        succs = st.succs
        is_coll = st.is_coll
        comps: list[int] = []
        colls: list[int] = []
        ready = [k for k in range(n) if waiting[k] == 0]
        t = 0.0
        done = 0
        busy_compute = busy_comm = exposed = 0.0
        times_under = self._times_under
        shapes = st.shapes
        while True:
            for k in ready:
                starts[k] = t
                if is_coll[k]:
                    colls.append(k)
                else:
                    comps.append(k)
            if not comps and not colls:
                break
            if len(ready) > 0:
                comps.sort()
                colls.sort()
            ready = []
            if colls:
                times = times_under(st, comps, colls, ests)
            else:
                times = [shapes[k].base_us for k in comps]  # type: ignore[union-attr]
            running = comps + colls
            dt = min(remaining[k] * times[i] for i, k in enumerate(running))
            t += dt
            if comps:
                busy_compute += dt
                if colls:
                    busy_comm += dt
            elif colls:
                busy_comm += dt
                exposed += dt
            finished = []
            for i, k in enumerate(running):
                tk = times[i]
                left = remaining[k] - (dt / tk if tk > 0 else 1.0)
                if left <= _EPS:
                    finished.append(k)
                else:
                    remaining[k] = left
            if not finished:  # rounding left every op a sliver short
                finished.append(min(running, key=lambda k: remaining[k]))
            for k in finished:
                ends[k] = t
                done += 1
                if is_coll[k]:
                    colls.remove(k)
                else:
                    comps.remove(k)
                s = nxt[k]
                if s >= 0:
                    waiting[s] -= 1
                    if waiting[s] == 0:
                        ready.append(s)
                for s in succs[k]:
                    waiting[s] -= 1
                    if waiting[s] == 0:
                        ready.append(s)
        if done != n:
            stuck = next(k for k in range(n) if waiting[k] > 0)
            raise LagomError(f"workload: op {st.op_ids[stuck]} can never start (cyclic dependencies)")
        return starts, ends, busy_compute, busy_comm, exposed

    def _timeline_one_compute_stream(self, st: _Static, ests: list[CollectiveEstimate]) -> tuple:
        """:meth:`_timeline` for one compute stream beside any number of collective streams
        (every generated workload): the same phases, with the common cases unrolled."""
        n = st.n_ops
        starts = [0.0] * n
        ends = [0.0] * n
        remaining = [1.0] * n
        waiting = list(st.n_preds)
        nxt = st.next_on_stream
        succs = st.succs
        is_coll = st.is_coll
        shapes = st.shapes
        sig_of = st.sig_of
        shape_id = st.shape_id
        cache = st.rate_cache
        times_under = self._times_under
        c = -1  # the running compute op
        xs: list[int] = []  # the running collectives, sorted
        for k in range(n):
            if waiting[k] == 0:
                if is_coll[k]:
                    xs.append(k)
                else:
                    c = k
        t = 0.0
        done = 0
        busy_compute = busy_comm = exposed = 0.0
        while c >= 0 or xs:
            if not xs:  # compute alone
                dt = remaining[c] * shapes[c].base_us  # type: ignore[union-attr]
                t += dt
                busy_compute += dt
                finished = [c]
            elif len(xs) == 1:
                x = xs[0]
                e = ests[sig_of[x]]
                if c < 0:  # one collective alone
                    dt = remaining[x] * e.time_us
                    t += dt
                    busy_comm += dt
                    exposed += dt
                    finished = [x]
                else:  # the common case: one kernel beside one collective
                    key = (shape_id[c], id(e))
                    pair = cache.get(key)
                    if pair is None:
                        pair = cache[key] = times_under(st, [c], [x], ests)
                    yc, yx = pair
                    tc = remaining[c] * yc
                    tx = remaining[x] * yx
                    if tc < tx * (1.0 - 1e-12):
                        dt = tc
                        remaining[x] -= dt / yx
                        finished = [c]
                    elif tx < tc * (1.0 - 1e-12):
                        dt = tx
                        remaining[c] -= dt / yc
                        finished = [x]
                    else:
                        dt = tc
                        finished = [c, x]
                    t += dt
                    busy_compute += dt
                    busy_comm += dt
            else:  # several collectives at once
                key = (shape_id[c] if c >= 0 else -1, *[id(ests[sig_of[x]]) for x in xs])
                times = cache.get(key)
                if times is None:
                    times = cache[key] = times_under(st, [c] if c >= 0 else [], xs, ests)
                running = [c, *xs] if c >= 0 else xs
                dt = min([remaining[k] * tk for k, tk in zip(running, times)])
                t += dt
                busy_comm += dt
                if c >= 0:
                    busy_compute += dt
                else:
                    exposed += dt
                finished = []
                for k, tk in zip(running, times):
                    left = remaining[k] - (dt / tk if tk > 0 else 1.0)
                    if left <= _EPS:
                        finished.append(k)
                    else:
                        remaining[k] = left
                if not finished:
                    finished.append(min(running, key=remaining.__getitem__))
            for k in finished:
                ends[k] = t
                done += 1
                if k == c:
                    c = -1
                else:
                    xs.remove(k)
            for k in finished:
                s = nxt[k]
                if s >= 0:
                    waiting[s] -= 1
                    if waiting[s] == 0:
                        starts[s] = t
                        if is_coll[s]:
                            xs.append(s)
                            if len(xs) > 1:
                                xs.sort()
                        else:
                            c = s
                for s in succs[k]:
                    waiting[s] -= 1
                    if waiting[s] == 0:
                        starts[s] = t
                        if is_coll[s]:
                            xs.append(s)
                            if len(xs) > 1:
                                xs.sort()
                        else:
                            c = s
        if done != n:
            stuck = next(k for k in range(n) if waiting[k] > 0)
            raise LagomError(f"workload: op {st.op_ids[stuck]} can never start (cyclic dependencies)")
        return starts, ends, busy_compute, busy_comm, exposed

    # ---- summary -------------------------------------------------------------------------------
    def _timing(self, st: _Static, starts: list[float], ends: list[float],
                busy_compute: float, busy_comm: float, exposed: float) -> Timing:
        ops = {oid: OpTiming(a, b - a) for oid, a, b in zip(st.op_ids, starts, ends)}
        iteration = (max(ends) - min(starts)) if st.n_ops else 0.0
        busy_sum = sum([ends[k] - starts[k] for k in st.compute_idx])
        uncontended = busy_compute * (st.base_sum_us / busy_sum) if busy_sum > 0 else busy_compute
        return Timing(iteration_us=iteration, compute_us=busy_compute, comm_us=busy_comm,
                      exposed_comm_us=exposed, compute_uncontended_us=uncontended, ops=ops)


def fully_specified(config: CommConfig) -> bool:
    return None not in (config.algorithm, config.protocol, config.channels, config.threads, config.chunk_bytes)
