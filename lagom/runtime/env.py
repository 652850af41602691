"""Process-wide NCCL knobs: merge a tuned file's ``env`` into an environment, user first."""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field

# Variables the runtime itself passes to workers.
ENV_CONFIG = "LAGOM_CONFIG"  # tuned-config file the hook loads
ENV_RUN_DIR = "LAGOM_RUN_DIR"  # where ranks write their audit parts
ENV_HOME = "LAGOM_HOME"  # folder holding the lagom package, for workers that cannot import it
ENV_ONLINE = "LAGOM_ONLINE"  # under `lagom run --online`: the run's online settings (JSON)
ENV_RECORD = "LAGOM_RECORD"  # under `lagom record`: the run's record settings (JSON)


@dataclass
class EnvMerge:
    """What :func:`merge_env` did: variables set, and the user's values that won."""

    applied: dict[str, str] = field(default_factory=dict)
    kept: dict[str, tuple[str, str]] = field(default_factory=dict)  # name -> (user's value, tuned value)

    def kept_line(self) -> str:
        """One line naming every knob the user's own value overrode ('' if none)."""
        if not self.kept:
            return ""
        items = ", ".join(f"{k}={user} (tuned: {tuned})" for k, (user, tuned) in sorted(self.kept.items()))
        return f"your environment wins for {items}"


def merge_env(tuned: Mapping[str, str], env: MutableMapping[str, str]) -> EnvMerge:
    """Set each tuned variable in ``env`` unless ``env`` already has it (the user's value wins)."""
    result = EnvMerge()
    for name, value in tuned.items():
        value = str(value)
        if name in env:
            if env[name] != value:
                result.kept[name] = (env[name], value)
            continue
        env[name] = value
        result.applied[name] = value
    return result
