"""NCCL's knobs, the doors they are delivered through, and Lagom's C tuner plugin.

Imports nothing else of Lagom's.
"""

from nccl_env.errors import LagomError
from nccl_env.knobs import Algorithm, CollectiveType, CommConfig, CommPath, CtaPolicy, Protocol
from nccl_env.plan import Plan, Signature

__all__ = ["Algorithm", "CollectiveType", "CommConfig", "CommPath", "CtaPolicy", "LagomError", "Plan", "Protocol",
           "Signature"]
