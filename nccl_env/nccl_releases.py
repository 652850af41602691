"""The NCCL releases there have been, and the one door a user-written version comes in by.

A version a user writes (a tuned file's or a cluster file's ``nccl_version``, ``--nccl-version``)
must be one NCCL released: ``2.99.1`` or ``2.18`` (2.18.0 was never released) is refused with
the closest real ones named. A version NCCL itself reports (``ncclGetVersion``, a trace's
``distributedInfo.nccl_version``) is taken as it is: the library said so.
"""

from __future__ import annotations

from nccl_env.errors import LagomError
from nccl_env.rules import NcclVersion

# Releases from 2.14 on. Sources: the tags of github.com/NVIDIA/nccl (v2.14.3-1 .. v2.30.7-1,
# `git tag`, read 2026-12), and PyPI's nvidia-nccl-cu12 release list for the two newer
# releases that the repository snapshot did not carry yet (2.31.2, 2.32.3).
RELEASED: tuple[NcclVersion, ...] = tuple(NcclVersion(2, minor, patch) for minor, patch in (
    (14, 3), (15, 1), (15, 5), (16, 2), (16, 5), (17, 1), (18, 1), (18, 3), (18, 5), (18, 6),
    (19, 1), (19, 3), (19, 4), (20, 3), (20, 5), (21, 5), (22, 3), (23, 4), (24, 3), (25, 1),
    (26, 2), (26, 3), (26, 5), (26, 6), (27, 3), (27, 5), (27, 6), (27, 7), (28, 3), (28, 7),
    (28, 9), (29, 2), (29, 3), (29, 7), (30, 3), (30, 4), (30, 7), (31, 2), (32, 3),
))
OLDEST_RELEASE = RELEASED[0]  # the tuner plugin's oldest door is 2.21; 2.14 renamed CollNet (rules.ALGORITHM_SINCE)


def closest_releases(version: NcclVersion, count: int = 3) -> tuple[NcclVersion, ...]:
    """The releases of ``version``'s minor, else the ``count`` nearest releases, oldest first."""
    same_minor = tuple(r for r in RELEASED if r.minor == version.minor)
    if same_minor:
        return same_minor
    nearest = sorted(RELEASED, key=lambda r: (abs(r.code - version.code), r.code))[:count]
    return tuple(sorted(nearest))


def released_version(text: object, what: str) -> NcclVersion:
    """``text`` as an NCCL release; one-line LagomError (naming ``what``) for a non-version,
    a float (YAML reads 2.20 as 2.2) or a version NCCL never released."""
    if not isinstance(text, str):
        raise LagomError(f"{what} must be a quoted string such as \"2.18.3\", got {text!r}")
    try:
        version = NcclVersion.parse(text)
    except LagomError as exc:
        raise LagomError(f"{what}: {exc}") from None
    if version not in RELEASED:
        near = ", ".join(str(r) for r in closest_releases(version))
        raise LagomError(f"{what} {text.strip()!r}: NCCL never released {version} (releases from "
                         f"{OLDEST_RELEASE} to {RELEASED[-1]}; closest: {near})")
    return version
