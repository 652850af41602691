"""The least time a collective can take on a cluster, under any setting NCCL could use (issue 32).

Where a collective's group has members without a trace and a rank saw its key too few times
for the pattern of their arrivals (:data:`traces.rank_join.MIN_PATTERN_INSTANCES`), its
measured time cannot be split into wait and transfer from the trace: a 3 KB all-to-all over
128 ranks that took 30.7 ms was all "transfer", the part that tunes. The cluster says how
little it needs: this module's :func:`transfer_floor` is the fastest the analytic collective
model (:class:`costmodel.analytic.evaluator.AnalyticEvaluator`) gives it over every
algorithm and protocol it models (NCCL's choice included), at every channel count up to the
most NCCL allows; :mod:`traces.rank_join` takes that as the transfer's bound and calls the
rest wait for the ranks not recorded. ``traces`` knows no cluster: the bound goes in where
one is known (``lagom simulate``, ``tune``, ``analyze``).
"""

from __future__ import annotations

import math

from costmodel.analytic.evaluator import AnalyticEvaluator
from costmodel.cluster import ClusterSpec
from nccl_env.errors import LagomError
from nccl_env.knobs import Algorithm, CommConfig, Protocol
from nccl_env.plan import Signature
from nccl_env.rules import max_channels
from traces.comm_split import CommKey
from traces.rank_join import TransferFloor

# the algorithms the evaluators model (docs/costmodel.md); None: NCCL's own choice
_ALGORITHMS: tuple[Algorithm | None, ...] = (None, Algorithm.RING, Algorithm.TREE)
_PROTOCOLS: tuple[Protocol | None, ...] = (None, *Protocol)


def channel_ladder(cluster: ClusterSpec) -> tuple[int | None, ...]:
    """NCCL's choice and every power of two up to the most channels NCCL allows on the cluster
    (MAXCHANNELS, at most one CTA per SM pair as the tuner's space: tuner/space.py)."""
    top = min(max_channels(cluster.nccl_version), max(1, cluster.gpu.sm_count // 2))
    return (None, *sorted({min(top, 1 << k) for k in range(top.bit_length())} | {top}))


def transfer_floor(cluster: ClusterSpec) -> TransferFloor:
    """(key, group size) -> the least time (us) the model gives the key's collective on ``cluster``
    under any modelled setting; None for a collective no NCCL setting reaches (not NCCL's kernel,
    or of unknown size). Answers are kept for the function's life."""
    evaluator = AnalyticEvaluator(cluster)
    ladder = channel_ladder(cluster)
    known: dict[tuple[CommKey, int], float | None] = {}

    def floor(key: CommKey, group_size: int) -> float | None:
        if (key, group_size) in known:
            return known[(key, group_size)]
        group, collective, nbytes, tunable = key
        best: float | None = None
        if tunable and nbytes and group_size > 1:
            nodes = max(1, math.ceil(group_size / cluster.gpus_per_node))
            sig = Signature(group, collective, nbytes, group_size, nodes)
            times = []
            for algo in _ALGORITHMS:
                for proto in _PROTOCOLS:
                    for nc in ladder:
                        try:
                            times.append(evaluator.estimate(sig, CommConfig(algo, proto, nc)).time_us)
                        except LagomError:  # a pair the model refuses for this collective
                            continue
            best = min(times) if times else None
        known[(key, group_size)] = best
        return best

    return floor
