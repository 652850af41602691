"""Which ``torch.distributed`` functions the hook observes, and how many bytes each moves.

Bytes follow the Workload convention (traces/workload.py ``message_bytes``): the
larger of this rank's input and output buffers. So an all-gather counts its whole
output, a reduce-scatter its whole input, an all-to-all the larger side. That is the
number a tuned file's ``min_bytes``/``max_bytes`` were written against.

Each :class:`CollectiveSpec` names the function, its :class:`CollectiveType` and the
parameters holding the buffers; their positions (and the ``group`` parameter's) are
read from the running torch's signatures, so positional and keyword calls both
work. Functions absent from the running torch, or without a ``group`` parameter,
are skipped. Object collectives (``all_gather_object`` ...) and ``barrier`` are
not observed: they are small and call c10d internals directly.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from nccl_env.knobs import CollectiveType

# Small ints stand in for CollectiveType in the hot path: hashing an Enum member runs
# Python code, hashing an int does not.
TYPE_ORDER: tuple[CollectiveType, ...] = tuple(CollectiveType)
TYPE_INDEX: dict[CollectiveType, int] = {t: i for i, t in enumerate(TYPE_ORDER)}

ByteRule = Callable[[tuple, dict], int]


def _sum_bytes(tensors) -> int:
    if tensors is None:
        return 0
    if not isinstance(tensors, (list, tuple)):
        return tensors.nbytes
    total = 0
    for t in tensors:
        total += _sum_bytes(t)
    return total


def _one_tensor(pos: int, name: str) -> ByteRule:
    def rule(args: tuple, kwargs: dict) -> int:
        return (args[pos] if len(args) > pos else kwargs[name]).nbytes

    return rule


def _any_buffers(pos: int, name: str) -> ByteRule:
    """A tensor, a list (of lists) of tensors, or None (a non-root's gather list)."""

    def rule(args: tuple, kwargs: dict) -> int:
        return _sum_bytes(args[pos] if len(args) > pos else kwargs.get(name))

    return rule


def _larger(first: ByteRule, second: ByteRule) -> ByteRule:
    def rule(args: tuple, kwargs: dict) -> int:
        return max(first(args, kwargs), second(args, kwargs))

    return rule


@dataclass(frozen=True)
class CollectiveSpec:
    """One observed function: its type and the parameter(s) whose bytes count.

    ``buffers`` lists parameter names; a single plain-tensor buffer is read with one
    attribute access, anything else through :func:`_sum_bytes`; with two names the
    larger side counts. Positions come from the running torch's signature.
    """

    function: str  # attribute of torch.distributed
    collective: CollectiveType
    buffers: tuple[str, ...]
    single_tensor: bool = True  # the buffer(s) are plain tensors, never lists

    def byte_rule(self, params: list[str]) -> ByteRule:
        """The rule for a function whose parameters are ``params`` (in order)."""
        make = _one_tensor if self.single_tensor else _any_buffers
        rules = [make(params.index(name), name) for name in self.buffers]
        return rules[0] if len(rules) == 1 else _larger(rules[0], rules[1])


SPECS: tuple[CollectiveSpec, ...] = (
    CollectiveSpec("all_reduce", CollectiveType.ALLREDUCE, ("tensor",)),
    CollectiveSpec("all_reduce_coalesced", CollectiveType.ALLREDUCE, ("tensors",), False),
    CollectiveSpec("all_gather", CollectiveType.ALLGATHER, ("tensor_list",), False),
    CollectiveSpec("all_gather_single", CollectiveType.ALLGATHER, ("output_tensor",)),
    CollectiveSpec("all_gather_into_tensor", CollectiveType.ALLGATHER, ("output_tensor",)),
    CollectiveSpec("_all_gather_base", CollectiveType.ALLGATHER, ("output_tensor",)),
    CollectiveSpec("all_gather_coalesced", CollectiveType.ALLGATHER, ("output_tensor_lists",), False),
    CollectiveSpec("reduce_scatter", CollectiveType.REDUCESCATTER, ("input_list",), False),
    CollectiveSpec("reduce_scatter_single", CollectiveType.REDUCESCATTER, ("input",)),
    CollectiveSpec("reduce_scatter_tensor", CollectiveType.REDUCESCATTER, ("input",)),
    CollectiveSpec("_reduce_scatter_base", CollectiveType.REDUCESCATTER, ("input",)),
    CollectiveSpec("broadcast", CollectiveType.BROADCAST, ("tensor",)),
    CollectiveSpec("reduce", CollectiveType.REDUCE, ("tensor",)),
    CollectiveSpec("all_to_all", CollectiveType.ALLTOALL, ("output_tensor_list", "input_tensor_list"), False),
    CollectiveSpec("all_to_all_single", CollectiveType.ALLTOALL, ("output", "input")),
    CollectiveSpec("send", CollectiveType.SENDRECV, ("tensor",)),
    CollectiveSpec("recv", CollectiveType.SENDRECV, ("tensor",)),
    CollectiveSpec("isend", CollectiveType.SENDRECV, ("tensor",)),
    CollectiveSpec("irecv", CollectiveType.SENDRECV, ("tensor",)),
    # NCCL runs gather and scatter as grouped send/recv.
    CollectiveSpec("gather", CollectiveType.SENDRECV, ("tensor", "gather_list"), False),
    CollectiveSpec("scatter", CollectiveType.SENDRECV, ("tensor", "scatter_list"), False),
)

# P2POp checks its ``op`` against distributed_c10d's own isend/irecv, so those two are
# replaced in distributed_c10d as well; every other function only in the
# torch.distributed namespace, so c10d's internal calls (all_gather_into_tensor calls
# all_gather_single) are not counted twice.
ALSO_IN_C10D = frozenset({"isend", "irecv"})
