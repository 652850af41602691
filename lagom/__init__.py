"""Lagom: co-tune NCCL with the computation it overlaps.

The user-facing layer: CLI, tuned-config files, reports, runtime hook and bench.
"""

__version__ = "0.1.0"


def install(path=None, **kwargs):
    """Install Lagom's torch.distributed hook in this process; see :func:`lagom.runtime.install`."""
    from lagom.runtime import install as _install

    return _install(path, **kwargs)
