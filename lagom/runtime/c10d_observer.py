"""Counting collectives where every caller meets them: the ``c10d`` dispatcher ops.

``torch.distributed``'s Python functions are one door into a process group; DDP's
gradient buckets (issued from C++ by its reducer, on the autograd thread), FSDP,
DeviceMesh and the functional collectives of compiled code are others. All of them call
a ``ProcessGroup`` method, and each method runs its collective as a ``torch.ops.c10d``
op through PyTorch's dispatcher, on gloo and NCCL alike; the functional collectives are
dispatcher ops of their own (``torch.ops._c10d_functional``) that call those methods
below autograd. The dispatcher is PyTorch's own place to add behaviour to an op:
:class:`C10dObserver` registers, with ``torch.library``, a kernel for each op in
:data:`lagom.runtime.collectives.C10D_OPS`: at the ``Autograd`` key of the ``c10d`` ops
(they have none of their own) and at ``ADInplaceOrView`` of the functional ones (torch
registers their autograd formulas). The kernel redispatches below its key with the very
same arguments and, once the collective was issued, hands (type, bytes, group name) to a
counter: one Python call per collective, nothing per other op. A functional collective's
inner ``c10d`` op runs below autograd, so each collective is counted once.

What it cannot see: a collective issued under ``torch.inference_mode()`` (the dispatcher
skips autograd keys there), and a torch whose c10d ops are named or laid out otherwise.
:meth:`C10dObserver.install` raises :class:`~nccl_env.errors.LagomError` when it cannot
register; the hook then says so once and counts the Python calls only.
"""

from __future__ import annotations

from collections.abc import Callable

from lagom.runtime.collectives import C10D_OPS, TYPE_INDEX, C10dOp
from nccl_env.errors import LagomError

# (type index, bytes, group name) of one collective the job issued
Counter = Callable[[int, int, str], None]
# (where, exception): the counter failed; the collective itself went through
Failure = Callable[[str, BaseException], None]

# c10d's ops have no autograd kernel: theirs is "Autograd" (the alias of AutogradCPU, AutogradCUDA, ...),
# before every backend's. The functional collectives have torch's own autograd formulas
# (torch/distributed/_functional_collectives.py registers them): theirs is the next key down.
DISPATCH_KEYS = {"c10d": "Autograd", "_c10d_functional": "ADInplaceOrView"}


class C10dObserver:
    """The kernels counting c10d ops; :meth:`uninstall` removes them (torch as it was)."""

    def __init__(self, count: Counter, failed: Failure, active: Callable[[], bool]) -> None:
        self._count, self._failed, self._active = count, failed, active
        self._libraries: list = []  # torch.library.Library, one per namespace
        self.observed: list[str] = []

    def install(self) -> None:
        """Register a kernel for every op this torch has; LagomError when none could be."""
        try:
            import torch
            import torch.distributed as dist

            below = {"Autograd": (torch._C._after_autograd_keyset, torch._C._AutoDispatchBelowAutograd),
                     "ADInplaceOrView": (torch._C._after_ADInplaceOrView_keyset,
                                         torch._C._AutoDispatchBelowADInplaceOrView)}
            unbox = dist.ProcessGroup.unbox
        except (ImportError, AttributeError, RuntimeError) as exc:
            raise LagomError(f"this torch offers no c10d dispatcher ops to observe ({exc})") from None

        def group_name(group: object) -> str:
            if isinstance(group, str):
                return group
            name = getattr(group, "group_name", None)  # a ProcessGroup; else its TorchScript box
            return name if isinstance(name, str) else unbox(group).group_name  # type: ignore[arg-type]  # a ScriptObject here

        libraries: dict[str, torch.library.Library] = {}
        taken = []
        try:
            for spec in C10D_OPS:
                packet = getattr(getattr(torch.ops, spec.namespace), spec.name, None)
                op = getattr(packet, "default", None) if packet is not None else None
                key = DISPATCH_KEYS[spec.namespace]
                if op is None or torch._C._dispatch_has_kernel_for_dispatch_key(spec.qualified, key):
                    continue  # absent here, or someone's kernel is there already: never replace it
                library = libraries.get(spec.namespace)
                if library is None:
                    library = libraries[spec.namespace] = torch.library.Library(spec.namespace, "IMPL")
                library.impl(spec.name, self._kernel(spec, op, *below[key], group_name), key, with_keyset=True)
                taken.append(spec.qualified)
        except Exception as exc:  # a torch whose ops differ: leave them all as they were
            for library in libraries.values():
                library._destroy()
            raise LagomError(f"this torch's c10d ops could not be observed ({type(exc).__name__}: {exc})") from None
        self._libraries, self.observed = list(libraries.values()), taken
        if not taken:
            raise LagomError("this torch's c10d ops could not be observed")

    def uninstall(self) -> None:
        for library in self._libraries:
            library._destroy()
        self._libraries, self.observed = [], []

    def _kernel(self, spec: C10dOp, op, after_key, below_key, group_name):
        import torch

        count, failed, active = self._count, self._failed, self._active
        type_index = TYPE_INDEX[spec.collective]
        real = (torch.Tensor, torch.nn.Parameter)

        def kernel(keyset, *args, **kwargs):
            with below_key():  # as torch's own fallback runs it: the c10d op it calls is not seen again
                result = op.redispatch(keyset & after_key, *args, **kwargs)
            if active():
                try:
                    # not a fake or functional tensor of a trace being compiled
                    if type(_first_tensor(args, spec.buffers)) in real:
                        count(type_index, spec.nbytes(args), group_name(args[spec.group]))
                except Exception as exc:
                    failed(spec.qualified, exc)
            return result

        return kernel


def _first_tensor(args: tuple, positions: tuple[int, ...]) -> object:
    """The first tensor among the buffers (a non-root's gather list may be empty)."""
    for pos in positions:
        stack = [args[pos]]
        while stack:
            item = stack.pop(0)
            if isinstance(item, (list, tuple)):
                stack[:0] = list(item)
            else:
                return item
    return None
