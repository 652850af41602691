"""NCCL's knob vocabulary: algorithms, protocols, collective types and CommConfig.

Numeric values are NCCL's own (src/include/device.h, nccl_tuner.h): they are what
the tuner plugin ABI passes around. Validation of values against a given NCCL
version lives in :mod:`nccl_env.rules`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, fields, replace


class _NcclIndex(enum.IntEnum):
    """An NCCL index enum whose member names, lower-cased, are Lagom's spelling."""

    @property
    def nccl_name(self) -> str:
        return self.name.lower()


class Algorithm(_NcclIndex):
    """NCCL_ALGO_* indices (NCCL_NUM_ALGORITHMS is 6 before 2.23, 7 with PAT).

    ``nccl_name`` (e.g. ``collnet_direct``) is Lagom's spelling in tuned configs and reports;
    NCCL_ALGO's parser knows ``collnetdirect`` (no underscore): env values come from
    ``nccl_env.delivery.ENV_ALGO_NAME``; the plugin table accepts both."""

    TREE = 0
    RING = 1
    COLLNET_DIRECT = 2
    COLLNET_CHAIN = 3
    NVLS = 4
    NVLS_TREE = 5
    PAT = 6


class Protocol(_NcclIndex):
    """NCCL_PROTO_* indices."""

    LL = 0
    LL128 = 1
    SIMPLE = 2


class CtaPolicy(_NcclIndex):
    """``ncclConfig_t.CTAPolicy`` flags (nccl.h: DEFAULT 0x00 and EFFICIENCY 0x01 from NCCL 2.27,
    ZERO 0x02 from 2.28); which version takes which: :mod:`nccl_env.rules`."""

    DEFAULT = 0
    EFFICIENCY = 1
    ZERO = 2


# ncclConfig_t.CTAPolicy flag values by name.
CTA_POLICIES = {p.nccl_name: int(p) for p in CtaPolicy}


def cta_policy_value(value: int | str) -> int:
    """``"efficiency"`` / ``1`` -> 1; flags may be combined as ints. ValueError otherwise."""
    if isinstance(value, str) and not value.strip().isdigit():
        try:
            return CTA_POLICIES[value.strip().lower()]
        except KeyError:
            raise ValueError(f"unknown cta_policy {value!r} (expected one of {', '.join(sorted(CTA_POLICIES))} "
                             f"or an int)") from None
    number = int(value)
    if number < 0 or number > (CTA_POLICIES["efficiency"] | CTA_POLICIES["zero"]):
        raise ValueError(f"cta_policy {number} is out of range 0..3")
    return number


class CommPath(enum.Enum):
    """How a process group's collectives move data: Lagom's per-group decision.

    ``SM``: NCCL's kernels (one CTA per channel), with Lagom's channels, chunk and
    threads. ``SYMMETRIC``: the collectives' buffers live in NCCL symmetric windows, so
    NCCL runs its low-CTA symmetric kernels (``ncclSymkDevKernel_*``) where it has one.
    ``COPY_ENGINE``: CTA policy ZERO and all-gather / all-to-all buffers in symmetric
    windows, so NCCL moves those with the copy engines (no SM). ``EFFICIENCY``: CTA
    policy EFFICIENCY. Where each takes effect: :func:`nccl_env.rules.collective_mechanism`.
    """

    SM = "sm"
    SYMMETRIC = "symmetric"
    COPY_ENGINE = "copy_engine"
    EFFICIENCY = "efficiency"

    @property
    def nccl_name(self) -> str:
        return self.value

    @property
    def cta_policy(self) -> CtaPolicy:
        """The CTA policy the group's communicator is created with."""
        if self is CommPath.COPY_ENGINE:
            return CtaPolicy.ZERO
        if self is CommPath.EFFICIENCY:
            return CtaPolicy.EFFICIENCY
        return CtaPolicy.DEFAULT


class CollectiveType(enum.Enum):
    """Collective operations Lagom knows. Values are our stable spellings.

    ``nccl_func`` gives ncclFunc_t where NCCL has one (Broadcast 0 .. AllReduce 4;
    SendRecv 5). AllToAll and gather-style collectives are grouped send/recv in NCCL.
    """

    BROADCAST = "broadcast"
    REDUCE = "reduce"
    ALLGATHER = "allgather"
    REDUCESCATTER = "reducescatter"
    ALLREDUCE = "allreduce"
    SENDRECV = "sendrecv"
    ALLTOALL = "alltoall"

    @property
    def nccl_func(self) -> int:
        """ncclFunc_t value as seen by tuner plugins (AllToAll is SendRecv there)."""
        return _NCCL_FUNC[self]

    @classmethod
    def parse(cls, text: str) -> CollectiveType:
        """Accept our spellings and the common ones of PyTorch and NCCL kernel names.

        ``all_reduce``, ``AllReduce``, ``allreduce_coalesced``, ``_allgather_base``,
        ``reduce_scatter_tensor``, ``all_to_all``, ``send``/``recv`` all resolve.
        Raises ValueError for anything else.
        """
        key = text.strip().lower().replace("_", "").replace("-", "").replace(" ", "")
        key = key.lstrip("_")
        for suffix in ("coalesced", "base", "intotensor", "tensor", "single"):
            if key.endswith(suffix) and key not in _ALIASES:
                key = key[: -len(suffix)]
        if key in _ALIASES:
            return _ALIASES[key]
        raise ValueError(f"unknown collective type {text!r}")


_NCCL_FUNC = {
    CollectiveType.BROADCAST: 0,
    CollectiveType.REDUCE: 1,
    CollectiveType.ALLGATHER: 2,
    CollectiveType.REDUCESCATTER: 3,
    CollectiveType.ALLREDUCE: 4,
    CollectiveType.SENDRECV: 5,
    CollectiveType.ALLTOALL: 5,
}

_ALIASES = {
    "broadcast": CollectiveType.BROADCAST,
    "reduce": CollectiveType.REDUCE,
    "allgather": CollectiveType.ALLGATHER,
    "allgatherinto": CollectiveType.ALLGATHER,
    "reducescatter": CollectiveType.REDUCESCATTER,
    "allreduce": CollectiveType.ALLREDUCE,
    "sendrecv": CollectiveType.SENDRECV,
    "send": CollectiveType.SENDRECV,
    "recv": CollectiveType.SENDRECV,
    "alltoall": CollectiveType.ALLTOALL,
    "alltoallv": CollectiveType.ALLTOALL,
}


# A field's spelling in files (tuned configs, workload JSON) and --set, where it differs from the field.
FILE_KEYS = {"comm_path": "path"}


@dataclass(frozen=True)
class CommConfig:
    """One collective's NCCL settings. ``None`` in a field means "NCCL decides".

    ``comm_path`` is its process group's :class:`CommPath` (one value per group; None: NCCL's
    kernels, as ``SM``); files and ``--set`` spell it ``path``."""

    algorithm: Algorithm | None = None
    protocol: Protocol | None = None
    channels: int | None = None
    threads: int | None = None
    chunk_bytes: int | None = None
    comm_path: CommPath | None = None

    def merged_over(self, base: CommConfig) -> CommConfig:
        """This config with its ``None`` fields filled from ``base``."""
        return replace(
            base,
            **{f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None},
        )

    def to_dict(self) -> dict:
        """Plain dict with NCCL names for enums, keyed as files spell the fields; ``None`` fields are left out."""
        out: dict = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None:
                continue
            shown = value.nccl_name if isinstance(value, (Algorithm, Protocol, CommPath)) else int(value)
            out[FILE_KEYS.get(f.name, f.name)] = shown
        return out

    @classmethod
    def from_dict(cls, data: dict) -> CommConfig:
        """Inverse of :meth:`to_dict`; raises ValueError on unknown keys or names."""
        unknown = set(data) - {FILE_KEYS.get(f.name, f.name) for f in fields(cls)}
        if unknown:
            raise ValueError(f"unknown CommConfig field(s): {', '.join(sorted(unknown))}")
        return cls(
            algorithm=_enum_field(Algorithm, "algorithm", data.get("algorithm")),
            protocol=_enum_field(Protocol, "protocol", data.get("protocol")),
            channels=_int_field("channels", data.get("channels")),
            threads=_int_field("threads", data.get("threads")),
            chunk_bytes=_int_field("chunk_bytes", data.get("chunk_bytes")),
            comm_path=_path_field(data.get("path")),
        )


def _enum_field(enum_cls: type[enum.IntEnum], name: str, value: object):
    """An Algorithm/Protocol from its NCCL name (or the enum itself); ValueError names the field."""
    if value is None or isinstance(value, enum_cls):
        return value
    if isinstance(value, str) and value.strip().upper() in enum_cls.__members__:
        return enum_cls[value.strip().upper()]
    names = ", ".join(m.name.lower() for m in enum_cls)
    raise ValueError(f"{name} {value!r} is not one of {names}")


def _path_field(value: object) -> CommPath | None:
    """A CommPath from its name (or the enum itself); ValueError names the field."""
    if value is None or isinstance(value, CommPath):
        return value
    if isinstance(value, str):
        for member in CommPath:
            if value.strip().lower() == member.value:
                return member
    raise ValueError(f"path {value!r} is not one of {', '.join(m.value for m in CommPath)}")


def _int_field(name: str, value: object) -> int | None:
    """A whole number (an int, an integral float, or digits); bools and fractions are errors, not truncated."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if isinstance(value, float):
        if value.is_integer():
            return int(value)
        raise ValueError(f"{name} must be an integer, got {value!r}")
    try:
        return int(value)  # type: ignore[call-overload]  # any object: int() decides, its TypeError is ours
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be an integer, got {value!r}") from None
