"""The ``torch`` calibration backend: time real collectives in the torchrun job it runs in.

Every rank runs the same measurement plan (it is deterministic), so every rank
issues the same collectives in the same order; rank 0 fits and writes. Each
measurement is repeated, and its median is reduced with MAX over ranks (a
collective ends when its slowest rank does).

* NCCL on GPUs: each distinct NCCL setting gets a fresh communicator (``new_group``)
  created after the setting's env vars are exported: the env ``nccl_env.delivery``
  gives that setting on the running NCCL without the tuner plugin (for an AllToAll
  only NCCL_P2P_*_CHUNKSIZE), plus NCCL_NO_CACHE=1 so NCCL >= 2.29.7 re-reads them.
  The previous setting's variables are reset to the user's values first. Kernels and
  collectives are timed with CUDA events, an overlap by a matmul on the current
  stream against the collective on NCCL's.
* gloo on CPU: the same orchestration, timed with the wall clock. NCCL's knobs have
  no effect there; the measurements still pin latency, bandwidth and how a
  concurrent matmul slows a collective on this machine.

torch is imported only in this module.
"""

from __future__ import annotations

import os
import statistics
import threading
import time

from costmodel.cluster import ClusterSpec
from nccl_env.delivery import ENV_NAMES, deliver
from nccl_env.errors import LagomError
from nccl_env.knobs import CollectiveType, CommConfig
from nccl_env.plan import Plan, Signature
from nccl_env.rules import P2P_COLLECTIVES, NcclVersion
from traces.workload import ComputeOp

_ELEM_BYTES = 4  # float32 buffers
_CPU_MAX_MESSAGE_BYTES = 4 * 1024 * 1024  # gloo on CPU: keep each measurement in the milliseconds
_CPU_MAX_GEMM_DIM = 256  # a CPU matmul of this size takes about a millisecond


# Every variable a setting may set: a setting's communicator sees exactly its own
# values, and the user's value (or NCCL's default) for the rest.
MANAGED_ENV = tuple(name for name in ENV_NAMES if name != "NCCL_TUNER_PLUGIN")


def nccl_env_for(config: CommConfig, version: NcclVersion, signature: Signature | None = None) -> dict[str, str]:
    """NCCL env vars that make a fresh communicator run ``config`` on NCCL ``version`` (unset
    fields: NCCL decides), by ``nccl_env.delivery``'s rules without the tuner plugin.

    The communicator serves this one setting, so ``config`` is its default for every
    collective; a point-to-point ``signature`` (AllToAll) takes only its step, from
    NCCL_P2P_*_CHUNKSIZE, with NCCL_BUFFSIZE raised to keep it (nothing else on that
    communicator reads the buffer size)."""
    if signature is not None and signature.collective in P2P_COLLECTIVES:
        delivery = deliver(Plan({signature: config}), version, use_plugin=False, own_communicator=True)
    else:
        delivery = deliver(Plan(default=config), version, use_plugin=False)
    return {"NCCL_NO_CACHE": "1", **delivery.env}  # NCCL >= 2.29.7 re-reads parameters (docs/reference.md §3)


def apply_env(env: dict[str, str], user_env: dict[str, str | None]) -> None:
    """Export ``env``; every other managed variable goes back to the user's value or unset,
    so one setting's knobs never leak into the next setting's communicator."""
    os.environ.update(env)
    for name in MANAGED_ENV:
        if name in env:
            continue
        value = user_env.get(name)
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def _running_nccl(torch) -> NcclVersion:
    """The NCCL torch runs (``torch.cuda.nccl.version()``: a tuple, or the version code on old torch)."""
    version = torch.cuda.nccl.version()
    if isinstance(version, int):
        return NcclVersion.from_code(version)
    return NcclVersion(*(int(x) for x in version[:3]))


class TorchBackend:
    """Calibration backend over torch.distributed (see the module docstring)."""

    def __init__(self, cluster: ClusterSpec, repeats: int = 3) -> None:
        import torch
        import torch.distributed as dist

        if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
            raise LagomError("--backend torch must run under torchrun (RANK / WORLD_SIZE are not set)")
        self.torch = torch
        self.dist = dist
        self.on_gpu = torch.cuda.is_available()
        if not dist.is_initialized():
            dist.init_process_group(backend="nccl" if self.on_gpu else "gloo")
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        local = int(os.environ.get("LOCAL_WORLD_SIZE", self.world))
        self.nodes = max(1, self.world // max(1, local))
        if self.on_gpu:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        self.device = torch.device("cuda") if self.on_gpu else torch.device("cpu")
        self.cluster = cluster
        self.nccl_version = _running_nccl(torch) if self.on_gpu else cluster.nccl_version
        self.name = "torch:nccl" if self.on_gpu else "torch:gloo"
        self.is_leader = self.rank == 0
        self.repeats = repeats
        self.measurements = 0
        self.max_message_bytes = None if self.on_gpu else _CPU_MAX_MESSAGE_BYTES
        self._groups: dict[tuple, object] = {}
        self._user_env = {name: os.environ.get(name) for name in MANAGED_ENV}

    # ---- CalibrationBackend --------------------------------------------------------------------
    def rank_layouts(self) -> list[tuple[int, int]]:
        return [(self.world, self.nodes)]

    def measure_collective(self, signature: Signature, config: CommConfig) -> float:
        self._check(signature)
        group = self._group(config, signature)
        bufs = self._buffers(signature)
        run = self._launcher(signature, bufs, group)
        run()  # warm-up (connects the communicator)
        times = [self._time(run) for _ in range(self.repeats)]
        self.measurements += 1
        return self._agree(statistics.median(times))

    def measure_compute(self, op: ComputeOp) -> float:
        a, b = self._matmul_inputs(op)
        run = lambda: self.torch.matmul(a, b)  # noqa: E731
        run()
        times = [self._time(run) for _ in range(self.repeats)]
        self.measurements += 1
        return self._agree(statistics.median(times))

    def measure_overlap(self, op: ComputeOp, signature: Signature, config: CommConfig) -> tuple[float, float]:
        self._check(signature)
        group = self._group(config, signature)
        bufs = self._buffers(signature)
        a, b = self._matmul_inputs(op)
        self._launcher(signature, bufs, group)()  # warm-up
        pairs = [self._time_overlap(signature, bufs, group, a, b) for _ in range(self.repeats)]
        self.measurements += 1
        comp = self._agree(statistics.median(p[0] for p in pairs))
        coll = self._agree(statistics.median(p[1] for p in pairs))
        return comp, coll

    def close(self) -> None:
        if self.dist.is_initialized():
            self.dist.barrier()
            self.dist.destroy_process_group()

    # ---- helpers ----------------------------------------------------------------------------------
    def _check(self, signature: Signature) -> None:
        if signature.ranks != self.world:
            raise LagomError(f"torch backend: a {signature.ranks}-rank collective in a {self.world}-rank job")

    def _group(self, config: CommConfig, signature: Signature):
        if not self.on_gpu:
            return None  # gloo: NCCL's knobs do not apply, the default group serves every setting
        env = nccl_env_for(config, self.nccl_version, signature)
        key = tuple(sorted(env.items()))
        group = self._groups.get(key)
        if group is None:
            apply_env(env, self._user_env)
            group = self.dist.new_group(ranks=list(range(self.world)))
            self._groups[key] = group
        return group

    def _buffers(self, signature: Signature):
        torch = self.torch
        n = max(self.world, signature.message_bytes // _ELEM_BYTES)
        n -= n % self.world
        full = torch.ones(n, dtype=torch.float32, device=self.device)
        part = torch.ones(n // self.world, dtype=torch.float32, device=self.device)
        return full, part

    def _launcher(self, signature: Signature, bufs, group, async_op: bool = False):
        dist = self.dist
        full, part = bufs
        kind = signature.collective
        if kind is CollectiveType.ALLREDUCE:
            return lambda: dist.all_reduce(full, group=group, async_op=async_op)
        if kind is CollectiveType.ALLGATHER:
            return lambda: dist.all_gather_into_tensor(full, part, group=group, async_op=async_op)
        if kind is CollectiveType.REDUCESCATTER:
            if not self.on_gpu:  # gloo has no reduce_scatter_tensor: an all_reduce moves the same bytes twice
                return lambda: dist.all_reduce(full, group=group, async_op=async_op)
            return lambda: dist.reduce_scatter_tensor(part, full, group=group, async_op=async_op)
        if kind is CollectiveType.ALLTOALL:
            out = self.torch.empty_like(full)
            return lambda: dist.all_to_all_single(out, full, group=group, async_op=async_op)
        if kind is CollectiveType.BROADCAST:
            return lambda: dist.broadcast(full, src=0, group=group, async_op=async_op)
        raise LagomError(f"torch backend: cannot time {kind.value}")

    def _matmul_inputs(self, op: ComputeOp):
        torch = self.torch
        flops = op.flops or 2.0 * 1024**3
        dim = int(round((flops / 2.0) ** (1.0 / 3.0)))
        if not self.on_gpu:
            dim = min(dim, _CPU_MAX_GEMM_DIM)
        dim = max(16, dim)
        dtype = torch.bfloat16 if self.on_gpu else torch.float32
        return (torch.randn(dim, dim, dtype=dtype, device=self.device),
                torch.randn(dim, dim, dtype=dtype, device=self.device))

    def _time(self, run) -> float:
        """Microseconds of one call, all ranks starting together."""
        torch = self.torch
        self.dist.barrier()
        if self.on_gpu:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            run()
            end.record()
            torch.cuda.synchronize()
            return start.elapsed_time(end) * 1000.0
        t0 = time.perf_counter()
        run()
        return (time.perf_counter() - t0) * 1e6

    def _time_overlap(self, signature: Signature, bufs, group, a, b) -> tuple[float, float]:
        """(matmul time, collective time) when both start together."""
        torch = self.torch
        self.dist.barrier()
        launch = self._launcher(signature, bufs, group, async_op=True)
        if self.on_gpu:
            side = torch.cuda.Stream()
            start = torch.cuda.Event(enable_timing=True)
            comp_end = torch.cuda.Event(enable_timing=True)
            coll_end = torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            side.wait_event(start)
            work = launch()
            torch.matmul(a, b)
            comp_end.record()
            with torch.cuda.stream(side):
                work.wait()
                coll_end.record(side)
            torch.cuda.synchronize()
            return start.elapsed_time(comp_end) * 1000.0, start.elapsed_time(coll_end) * 1000.0
        done: dict[str, float] = {}
        t0 = time.perf_counter()
        work = launch()
        waiter = threading.Thread(target=lambda: (work.wait(), done.setdefault("coll", time.perf_counter())))
        waiter.start()
        torch.matmul(a, b)
        t_comp = time.perf_counter()
        waiter.join()
        return (t_comp - t0) * 1e6, (done["coll"] - t0) * 1e6

    def _agree(self, value_us: float) -> float:
        """The slowest rank's value, on every rank."""
        torch = self.torch
        t = torch.tensor([float(value_us)], dtype=torch.float64,
                         device=self.device if self.on_gpu else torch.device("cpu"))
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MAX)
        return max(1e-3, float(t.item()))

