"""The NCCL releases there have been, and the doors a version comes in by.

A version a user writes (a tuned file's or a cluster file's ``nccl_version``, ``--nccl-version``)
must be one NCCL released: ``2.30.1`` or ``2.18`` (2.18.0 was never released) is refused with
the closest real ones named. A version NCCL itself reports (``ncclGetVersion``, a trace's
``distributedInfo.nccl_version``, also as distributions write it: ``2.21.5-1+cuda12.4``) is
taken as it is: the library said so.

A version newer than the newest release listed here (``2.33.1``, or ``2.99.1``: Lagom cannot
tell a release it has not heard of from a typo above the list) is accepted by every door alike
(flag, file, trace: :func:`in_force`), modelled with the newest known release's rules, and
said once per process in one warning line on stderr.
"""

from __future__ import annotations

import sys

from nccl_env.errors import LagomError
from nccl_env.rules import NcclVersion

# Releases from 2.14 on. Sources: the tags of github.com/NVIDIA/nccl (v2.14.3-1 .. v2.30.7-1,
# `git tag`, read 2026-12), PyPI's nvidia-nccl-cu12 release list for the two newer
# releases that the repository snapshot did not carry yet (2.31.2, 2.32.3), and NCCL's
# release list for 2.32.6 (2026-11-09, tuner ABI v7; issue 30). No 2.32.4 or 2.32.5 is
# published in any source read here (the snapshot's tags stop at 2.30.7): they count as
# never released until a source says otherwise.
RELEASED: tuple[NcclVersion, ...] = tuple(NcclVersion(2, minor, patch) for minor, patch in (
    (14, 3), (15, 1), (15, 5), (16, 2), (16, 5), (17, 1), (18, 1), (18, 3), (18, 5), (18, 6),
    (19, 1), (19, 3), (19, 4), (20, 3), (20, 5), (21, 5), (22, 3), (23, 4), (24, 3), (25, 1),
    (26, 2), (26, 3), (26, 5), (26, 6), (27, 3), (27, 5), (27, 6), (27, 7), (28, 3), (28, 7),
    (28, 9), (29, 2), (29, 3), (29, 7), (30, 3), (30, 4), (30, 7), (31, 2), (32, 3), (32, 6),
))
OLDEST_RELEASE = RELEASED[0]  # the tuner plugin's oldest door is 2.21; 2.14 renamed CollNet (rules.ALGORITHM_SINCE)
NEWEST_RELEASE = RELEASED[-1]
_SAID_NEWER: set[NcclVersion] = set()  # the newer versions already warned about in this process


def newer_warning(version: NcclVersion) -> str | None:
    """The one line for a version newer than :data:`NEWEST_RELEASE`; None for any other."""
    if version <= NEWEST_RELEASE:
        return None
    return (f"NCCL {version} is newer than the newest release Lagom knows ({NEWEST_RELEASE}): "
            f"modelled as {NEWEST_RELEASE}")


def forget_warnings() -> None:
    """Start a new command: the next newer version is said again (``lagom.cli.main``)."""
    _SAID_NEWER.clear()


def in_force(version: NcclVersion) -> NcclVersion:
    """The release Lagom models for ``version``, whichever door it came by: itself, or the
    newest known release for a newer one, said once per process on stderr."""
    warning = newer_warning(version)
    if warning is None:
        return version
    if version not in _SAID_NEWER:
        _SAID_NEWER.add(version)
        print(f"warning: {warning}", file=sys.stderr)
    return NEWEST_RELEASE


def closest_releases(version: NcclVersion, count: int = 3) -> tuple[NcclVersion, ...]:
    """The releases of ``version``'s minor, else the ``count`` nearest releases, oldest first."""
    same_minor = tuple(r for r in RELEASED if r.minor == version.minor)
    if same_minor:
        return same_minor
    nearest = sorted(RELEASED, key=lambda r: (abs(r.code - version.code), r.code))[:count]
    return tuple(sorted(nearest))


def released_version(text: object, what: str) -> NcclVersion:
    """``text`` (a flag, a tuned or cluster file) as the NCCL release it models (:func:`in_force`);
    one-line LagomError (naming ``what``) for a non-version, a float (YAML reads 2.20 as 2.2) or
    a version at or below the newest known that NCCL never released."""
    if not isinstance(text, str):
        raise LagomError(f"{what} must be a quoted string such as \"2.18.3\", got {text!r}")
    try:
        version = NcclVersion.parse(text)
    except LagomError as exc:
        raise LagomError(f"{what}: {exc}") from None
    if version > NEWEST_RELEASE:
        return in_force(version)
    if version not in RELEASED:
        near = ", ".join(str(r) for r in closest_releases(version))
        raise LagomError(f"{what} {text.strip()!r}: NCCL never released {version} (releases from "
                         f"{OLDEST_RELEASE} to {RELEASED[-1]}; closest: {near})")
    return version


def reported_version(text: str, what: str) -> NcclVersion:
    """A version NCCL reported (a trace's ``distributedInfo.nccl_version``) as the release it
    models: any 2.x taken as it is, distribution spellings included (``2.21.5-1+cuda12.4``,
    ``2.21.5+cuda12.4``, ``2.21.5-1``), a newer one as :func:`in_force` says; LagomError
    (naming ``what``) for text that is no version."""
    try:
        return in_force(NcclVersion.parse(text))
    except LagomError as exc:
        raise LagomError(f"{what}: {exc}") from None
