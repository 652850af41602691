"""The simulator: a virtual cluster that stands in for GPUs here (docs/simulator.md).

A fluid event simulation of thread-block waves (:mod:`.compute`), chunk pipelines over
shared links and memory bandwidth (:mod:`.collective`), with its mechanism constants in
:mod:`.params`; :mod:`.published_cases` holds it against measurements other people made.
It is a separate mechanism from the analytic model, so that tuning quality measured on
it is not the model grading itself.
"""

from costmodel.sim.simulator import Simulator, tiny_overlap_workload

__all__ = ["Simulator", "tiny_overlap_workload"]
