"""Online tuning: Lagom's search inside the running job, timed by the job's own steps.

- :mod:`lagom.online.controller`: the decider (the search, the noise rules, the A/B);
- :mod:`lagom.online.measure`: robust statistics over steps, MIN/MAX over ranks;
- :mod:`lagom.online.protocol`: decisions through a key-value store, checked by every rank;
- :mod:`lagom.online.agent`: one rank's step-boundary work; in-process driver;
- :mod:`lagom.online.clock`: step-time sources (the simulator, CUDA events);
- :mod:`lagom.runtime.online`: the torchrun side (optimizer-step hook, plugin table swap).

See docs/online.md.
"""

DEFAULT_BUDGET_STEPS = 400  # steps from the seed's first to the A/B's last (a few hundred of a long job)
MAX_BUDGET_STEPS = 1_000_000  # --budget-steps at most: 2,500 times the default, more than a search here takes
# For a peer's measurement or a decision: longer than any step we expect, short enough to end a broken job.
DEFAULT_TIMEOUT_S = 120.0
