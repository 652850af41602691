"""Lagom: co-tune NCCL with the computation it overlaps.

The user-facing layer: CLI, tuned-config files, reports, runtime hook and bench.
"""

__version__ = "0.1.0"
