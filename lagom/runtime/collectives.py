"""Which collectives the hook observes, and how many bytes each moves: the ``c10d``
dispatcher ops every caller reaches (:data:`C10D_OPS`) and the ``torch.distributed``
functions (:data:`SPECS`).

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

Every collective a job issues, from Python or from C++ (DDP's gradient buckets, FSDP,
DeviceMesh and functional collectives), passes a ``ProcessGroup`` method that calls
one of the ``c10d`` dispatcher ops below; :class:`C10dOp` says which collective it is,
where its process group sits and which arguments' bytes count (the same convention).
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



def _gathered(args: tuple) -> int:
    """A functional all-gather: its input (or inputs) times the group size (args[1]), the output's bytes."""
    return _sum_bytes(args[0]) * int(args[1])


def _all_to_all_single(args: tuple) -> int:
    """A functional all-to-all: the larger of its input and its output (the output splits' rows)."""
    tensor = args[0]
    splits = args[1]
    if not splits or not tensor.dim() or not tensor.shape[0]:
        return tensor.nbytes
    return max(tensor.nbytes, tensor.nbytes // tensor.shape[0] * sum(int(s) for s in splits))


@dataclass(frozen=True)
class C10dOp:
    """One dispatcher op of c10d: its namespace and name, its type, the positions of the
    buffers whose bytes count (with two, the larger side) or a rule of its own, and the
    position of its process group (a ProcessGroup object in ``c10d``, a group name in
    ``_c10d_functional``), as their schemas in torch 2.4-2.13 put them."""

    namespace: str
    name: str
    collective: CollectiveType
    buffers: tuple[int, ...]
    group: int
    rule: Callable[[tuple], int] | None = None

    @property
    def qualified(self) -> str:
        return f"{self.namespace}::{self.name}"

    def nbytes(self, args: tuple) -> int:
        if self.rule is not None:
            return self.rule(args)
        if len(self.buffers) == 1:
            return _sum_bytes(args[self.buffers[0]])
        return max(_sum_bytes(args[i]) for i in self.buffers)


_C, _F = "c10d", "_c10d_functional"
_AR, _AG, _RS = CollectiveType.ALLREDUCE, CollectiveType.ALLGATHER, CollectiveType.REDUCESCATTER
_P2P = CollectiveType.SENDRECV  # NCCL runs gather and scatter as grouped send/recv

# The ProcessGroup methods' ops (Python's torch.distributed, DDP's reducer, FSDP) and the
# functional collectives (DeviceMesh/DTensor, torch.compile), which call those methods
# from C++ below autograd: each collective is seen once, at the outermost op.
C10D_OPS: tuple[C10dOp, ...] = (
    C10dOp(_C, "allreduce_", _AR, (0,), 1),
    C10dOp(_C, "allreduce_coalesced_", _AR, (0,), 1),
    C10dOp(_C, "allgather_", _AG, (0,), 2),
    C10dOp(_C, "_allgather_base_", _AG, (0,), 2),
    C10dOp(_C, "allgather_coalesced_", _AG, (0,), 2),
    C10dOp(_C, "allgather_into_tensor_coalesced_", _AG, (0,), 2),
    C10dOp(_C, "reduce_scatter_", _RS, (1,), 2),
    C10dOp(_C, "_reduce_scatter_base_", _RS, (1,), 2),
    C10dOp(_C, "reduce_scatter_tensor_coalesced_", _RS, (1,), 2),
    C10dOp(_C, "broadcast_", CollectiveType.BROADCAST, (0,), 1),
    C10dOp(_C, "reduce_", CollectiveType.REDUCE, (0,), 1),
    C10dOp(_C, "alltoall_", CollectiveType.ALLTOALL, (0, 1), 2),
    C10dOp(_C, "alltoall_base_", CollectiveType.ALLTOALL, (0, 1), 2),
    C10dOp(_C, "send", _P2P, (0,), 1),
    C10dOp(_C, "recv_", _P2P, (0,), 1),
    C10dOp(_C, "recv_any_source_", _P2P, (0,), 1),
    C10dOp(_C, "gather_", _P2P, (0, 1), 2),
    C10dOp(_C, "scatter_", _P2P, (0, 1), 2),
    C10dOp(_F, "all_reduce", _AR, (0,), 2),
    C10dOp(_F, "all_reduce_", _AR, (0,), 2),
    C10dOp(_F, "all_reduce_coalesced", _AR, (0,), 2),
    C10dOp(_F, "all_reduce_coalesced_", _AR, (0,), 2),
    C10dOp(_F, "all_gather_into_tensor", _AG, (0,), 2, _gathered),
    C10dOp(_F, "all_gather_into_tensor_coalesced", _AG, (0,), 2, _gathered),
    C10dOp(_F, "all_gather_into_tensor_out", _AG, (0,), 2, _gathered),
    C10dOp(_F, "reduce_scatter_tensor", _RS, (0,), 3),
    C10dOp(_F, "reduce_scatter_tensor_coalesced", _RS, (0,), 3),
    C10dOp(_F, "reduce_scatter_tensor_out", _RS, (0,), 3),
    C10dOp(_F, "all_to_all_single", CollectiveType.ALLTOALL, (0,), 3, _all_to_all_single),
    C10dOp(_F, "broadcast", CollectiveType.BROADCAST, (0,), 2),
    C10dOp(_F, "broadcast_", CollectiveType.BROADCAST, (0,), 2),
    C10dOp(_F, "isend", _P2P, (0,), 3),
    C10dOp(_F, "irecv", _P2P, (0,), 3),
)
