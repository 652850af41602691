"""The plan NCCL would run, read back from the tuner plugin the way NCCL calls it.

Under ``--simulate`` no NCCL calls the plugin (the job runs on gloo), so the simulated
clock asks it instead, once per collective of a step, through the same ABI
(:mod:`nccl_env.plugin_abi`): ``getCollInfo`` with a cost table of ones (a pair the
plugin picks comes back at cost 0), the channels it sets, and (ABI v6) the chunk from
``getChunkSize``. What the simulator then runs is what the plugin answered, so a
table swap that did not reach the plugin would show in the timings and the audit.
"""

from __future__ import annotations

from nccl_env.knob_table import ALGORITHM, CHANNELS, CHUNK, KNOBS, PATH, PROTOCOL, Scope
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
        # the knobs the plugin answers for on this NCCL (chunk from ABI v6); NCCL's env the rest
        self.carried = {k for k in KNOBS if k.scope(version) is Scope.COLLECTIVE}
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
        algo = proto = None
        if len(picked) == 1:
            algo, proto = Algorithm(picked[0][0]), Protocol(picked[0][1])
        n_channels = answer.n_channels or None
        chunk = None
        if self.abi >= 6:
            chunk = (
                ctx.get_chunk_size(
                    signature.collective.nccl_func,
                    signature.message_bytes,
                    int(algo if algo is not None else Algorithm.RING),
                    int(proto if proto is not None else Protocol.SIMPLE),
                    n_channels or 1,
                    0,
                )
                or None
            )
        out = PROTOCOL.set(ALGORITHM.set(CommConfig(), algo), proto)
        return CHUNK.set(CHANNELS.set(out, n_channels), chunk)

    def plan_in_force(self, decided: Plan, calls: dict[Signature, int]) -> Plan:
        """``decided`` with its per-call knobs replaced by the plugin's answers; the plugin is
        asked ``calls[signature]`` times (once per collective of the step)."""
        entries = {}
        for sig, count in calls.items():
            answer = CommConfig()
            for _ in range(count):
                answer = self.config(sig)
            wanted = decided.config_for(sig)
            in_force = CommConfig()
            for knob in KNOBS:
                if knob is not PATH:  # the path is the communicator's, not the plugin's
                    in_force = knob.set(in_force, knob.get(answer if knob in self.carried else wanted))
            entries[sig] = in_force
            if sig.collective in P2P_COLLECTIVES:
                entries[sig] = wanted
        return Plan(entries=entries)

    def close(self) -> None:
        for ctx in self._contexts.values():
            ctx.close()
        self._contexts.clear()
