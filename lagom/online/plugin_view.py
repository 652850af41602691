"""The plan NCCL would run, read back from the tuner plugin the way NCCL calls it.

Under ``--simulate`` no NCCL calls the plugin (the job runs on gloo), so the simulated
clock asks it instead, once per collective of a step, through the same ABI
(:mod:`nccl_env.plugin_abi`): ``getCollInfo`` with a cost table of ones (a pair the
plugin picks comes back at cost 0), the channels it sets, and (ABI v6) the chunk from
``getChunkSize``. What the simulator then runs is what the plugin answered, so a
table swap that did not reach the plugin would show in the timings and the audit.
"""

from __future__ import annotations

from nccl_env.knobs import Algorithm, CommConfig, Protocol
from nccl_env.plan import Plan, Signature
from nccl_env.plugin_abi import NUM_PROTOCOLS, TunerContext, TunerLibrary
from nccl_env.rules import P2P_COLLECTIVES, NcclVersion, tuner_symbols

NUM_ALGORITHMS = len(Algorithm)  # NCCL_NUM_ALGORITHMS from 2.23 (PAT); NCCL sizes its table the same way


class PluginView:
    """One context per communicator shape (ranks, nodes), opened once, as NCCL opens one per communicator."""

    def __init__(self, library: TunerLibrary, version: NcclVersion) -> None:
        symbols = tuner_symbols(version)
        if not symbols:
            raise ValueError(f"NCCL {version} loads no tuner plugin")
        self.library = library
        self.abi = int(symbols[0].rsplit("_v", 1)[1])
        self._contexts: dict[tuple[int, int], TunerContext] = {}

    def _context(self, ranks: int, nodes: int) -> TunerContext:
        key = (ranks, nodes)
        if key not in self._contexts:
            self._contexts[key] = self.library.open(self.abi, ranks, nodes)
        return self._contexts[key]

    def config(self, signature: Signature) -> CommConfig:
        """What the plugin sets for one call of this collective (None fields: NCCL decides)."""
        if signature.collective in P2P_COLLECTIVES:
            return CommConfig()  # NCCL's p2p path never asks the tuner
        ctx = self._context(signature.ranks, signature.nodes)
        costs = [[1.0] * NUM_PROTOCOLS for _ in range(NUM_ALGORITHMS)]
        answer = ctx.get_coll_info(signature.collective.nccl_func, signature.message_bytes, costs)
        picked = [(a, p) for a, row in enumerate(answer.costs) for p, cost in enumerate(row) if cost == 0.0]
        algorithm = protocol = None
        if len(picked) == 1:
            algorithm, protocol = Algorithm(picked[0][0]), Protocol(picked[0][1])
        channels = answer.n_channels or None
        chunk = None
        if self.abi >= 6:
            chunk = (
                ctx.get_chunk_size(
                    signature.collective.nccl_func,
                    signature.message_bytes,
                    int(algorithm if algorithm is not None else Algorithm.RING),
                    int(protocol if protocol is not None else Protocol.SIMPLE),
                    channels or 1,
                    0,
                )
                or None
            )
        return CommConfig(algorithm=algorithm, protocol=protocol, channels=channels, chunk_bytes=chunk)

    def plan_in_force(self, decided: Plan, calls: dict[Signature, int]) -> Plan:
        """``decided`` with its per-call knobs replaced by the plugin's answers; the plugin is
        asked ``calls[signature]`` times (once per collective of the step)."""
        entries = {}
        for sig, count in calls.items():
            answer = CommConfig()
            for _ in range(count):
                answer = self.config(sig)
            wanted = decided.config_for(sig)
            entries[sig] = CommConfig(answer.algorithm, answer.protocol, answer.channels, wanted.threads,
                                      answer.chunk_bytes if self.abi >= 6 else wanted.chunk_bytes)
            if sig.collective in P2P_COLLECTIVES:
                entries[sig] = wanted
        return Plan(entries=entries)

    def close(self) -> None:
        for ctx in self._contexts.values():
            ctx.close()
        self._contexts.clear()
