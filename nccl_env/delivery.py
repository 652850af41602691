"""Turn a Plan into what stock NCCL accepts: process-wide env, per-group ncclConfig, plugin table.

Which knob goes through which door (docs/reference.md §3; README "NCCL knobs and
the tuner plugin"):

- per collective, through Lagom's tuner plugin: algorithm, protocol and channels from
  NCCL 2.21 (plugin ABI v2), chunk size from 2.30 (v6 getChunkSize);
- per process group (``ncclConfig_t`` minCTAs/maxCTAs, PyTorch
  ``ProcessGroupNCCL.Options().config``): channels, when the plugin cannot carry them;
- process-wide env (read once per process): threads always (NCCL_NTHREADS,
  NCCL_LL128_NTHREADS), chunk size before 2.30 (NCCL_BUFFSIZE), algorithm/protocol
  when the plugin is not used (NCCL_ALGO/NCCL_PROTO, per-function syntax from 2.24);
- per process group, the communication path (``CommConfig.comm_path``): CTA policy ZERO for
  copy engines and EFFICIENCY for NCCL's own NVLS re-selection, through
  ``ncclConfig_t.CTAPolicy`` (``ProcessGroupNCCL.Options().config.cta_policy``, from NCCL
  2.27/2.28), and ``NCCL_CTA_POLICY=2`` beside it only when every group off the SM kernels
  is on the copy engines (the env overrides every communicator's config, and ZERO moves only
  registered buffers, which only those groups have); the buffer registration a path needs
  is the user's (``nccl_env.rules.path_requirements``);
- point-to-point (AllToAll, send/recv) takes only its step size, from
  NCCL_P2P_NET_CHUNKSIZE across nodes and NCCL_P2P_NVL/PCI_CHUNKSIZE inside one (not
  NCCL_BUFFSIZE, which from 2.19 only caps it at BUFFSIZE / 8); NCCL picks its
  algorithm, protocol, channels and threads (``nccl_env.rules`` P2P_*).

When a door cannot carry what the plan asks (two thread counts in one process, two
chunk sizes before 2.30, two channel counts in one group without the plugin, ...)
:func:`deliver` picks the value of the collective with the largest message (it
moves the most bytes; ties go to the first signature in sorted order) and says so in
``Delivery.compromises``. The tuner uses the same rules as constraints
(:func:`nccl_env.rules.per_collective_knobs`).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field, replace
from typing import TypeVar

from nccl_env.errors import LagomError
from nccl_env.knob_table import (
    ALGORITHM,
    CHANNELS,
    CHUNK,
    CTA_POLICY,
    KNOBS,
    MAX_CTAS,
    MIN_CTAS,
    PATH,
    PROTOCOL,
    THREADS,
    validate_config,
)
from nccl_env.knobs import Algorithm, CollectiveType, CommConfig, CommPath, CtaPolicy, Protocol
from nccl_env.plan import Plan, Signature
from nccl_env.plugin_table import PLUGIN_COLLECTIVES, PluginEntry, check_entry, plugin_settings
from nccl_env.rules import (
    CTAS_ENV_SINCE,
    DEFAULT_BUFFSIZE_BYTES,
    NCCL_STEPS,
    P2P_COLLECTIVES,
    P2P_NET_CHUNK_ENV,
    P2P_NVL_CHUNK_ENV,
    P2P_PCI_CHUNK_ENV,
    PER_FUNCTION_ALGO_SINCE,
    NcclVersion,
    buffsize_for_chunk,
    max_channels,
    p2p_chunk_ceiling,
    p2p_chunk_envs,
    per_collective_knobs,
)

# Spellings NCCL_ALGO / NCCL_PROTO parse (init.cc ncclFuncStr / ncclAlgoStr / ncclProtoStr; case-insensitive).
ENV_FUNC_NAME = {
    CollectiveType.BROADCAST: "broadcast",
    CollectiveType.REDUCE: "reduce",
    CollectiveType.ALLGATHER: "allgather",
    CollectiveType.REDUCESCATTER: "reducescatter",
    CollectiveType.ALLREDUCE: "allreduce",
}
ENV_ALGO_NAME = {
    Algorithm.TREE: "tree",
    Algorithm.RING: "ring",
    Algorithm.COLLNET_DIRECT: "collnetdirect",
    Algorithm.COLLNET_CHAIN: "collnetchain",
    Algorithm.NVLS: "nvls",
    Algorithm.NVLS_TREE: "nvlstree",
    Algorithm.PAT: "pat",
}
ENV_PROTO_NAME = {Protocol.LL: "LL", Protocol.LL128: "LL128", Protocol.SIMPLE: "Simple"}

# The CommConfig fields a plugin table line can carry (threads never: no plugin ABI sets them).
PLUGIN_SETTINGS = tuple(k.field for k in KNOBS if k.plugin_column is not None)

# Every env name deliver() and online_ceilings() can put into a tuned file's env: the knob
# table's and point-to-point's step sizes. A tuned file may set these and no other variable
# (nccl_env.env_names): nothing that names a file or a library.
TUNED_ENV_NAMES = (
    *(name for knob in KNOBS for name in knob.env),
    P2P_NET_CHUNK_ENV,
    P2P_NVL_CHUNK_ENV,
    P2P_PCI_CHUNK_ENV,
)
# Every env name lagom run sets (lagom doctor checks the library knows them): those and the plugin's own.
ENV_NAMES = (*TUNED_ENV_NAMES, "NCCL_TUNER_PLUGIN")


@dataclass
class Delivery:
    """A plan split over NCCL's doors.

    ``group_configs`` maps a process-group name (Signature.group) to ncclConfig_t
    values with PyTorch's attribute names (``min_ctas``, ``max_ctas``, ``cta_policy``):
    set them on ``ProcessGroupNCCL.Options().config`` and pass the options to
    ``new_group(pg_options=...)``.
    """

    env: dict[str, str] = field(default_factory=dict)
    group_configs: dict[str, dict] = field(default_factory=dict)
    plugin_entries: list[PluginEntry] = field(default_factory=list)
    compromises: list[str] = field(default_factory=list)


def plugin_env(plugin_path: str, table_path: str) -> dict[str, str]:
    """The env that makes NCCL load Lagom's plugin with this table."""
    return {"NCCL_TUNER_PLUGIN": str(plugin_path), "NCCL_TUNER_CONFIG_FILE": str(table_path)}


def online_ceilings(version: NcclVersion, max_chunk_bytes: int, env: dict[str, str]) -> dict[str, str]:
    """Process-wide settings under which a running job can take every plan of the online space.

    A call's channels are capped by its communicator's channel count, fixed at init: the
    communicator gets MAXCHANNELS (NCCL_MIN_CTAS = NCCL_MAX_CTAS; AutoCCL likewise creates
    its communicators with 32). From 2.30 the plugin sets each call's chunk, which NCCL
    clamps to its buffer: NCCL_BUFFSIZE admits ``max_chunk_bytes`` for every algorithm
    (Tree's one chunk step per buffer is the tightest), or the file's, if larger.
    """
    ceiling = str(max_channels(version))
    out = {"NCCL_MIN_CTAS": ceiling, "NCCL_MAX_CTAS": ceiling}
    if CHUNK.field in per_collective_knobs(version):
        needed = buffsize_for_chunk(max_chunk_bytes, Algorithm.TREE)
        given = env.get("NCCL_BUFFSIZE", "")
        out["NCCL_BUFFSIZE"] = str(max(needed, int(given) if given.isdigit() else 0))
    return out


_Value = TypeVar("_Value")


def largest_message(items: list[tuple[Signature, _Value]]) -> tuple[Signature, _Value]:
    """The (signature, value) of the largest message; ties: first in sorted order."""
    best = items[0]
    for item in items[1:]:
        if item[0].message_bytes > best[0].message_bytes:
            best = item
    return best


def _one_value(knob: str, items: list[tuple[Signature, _Value]], scope: str, why: str,
               compromises: list[str], show=str) -> tuple[Signature, _Value]:
    sig, value = largest_message(items)
    distinct = sorted({show(v) for _, v in items})
    if len(distinct) > 1:
        compromises.append(
            f"{knob}: the plan asks for {', '.join(distinct)} {scope}, but {why}; "
            f"chose {show(value)} (from {sig.label()}, the largest message)"
        )
    return sig, value


def deliver(plan: Plan, version: NcclVersion, use_plugin: bool = True, own_communicator: bool = False) -> Delivery:
    """Split ``plan`` over env / process-group configs / plugin table for NCCL ``version``.

    ``use_plugin=False`` delivers without the tuner plugin (everything per collective
    falls back to env and group configs). ``own_communicator=True`` says the process
    runs only the plan's collectives (calibration's one communicator per setting): a
    point-to-point step then raises NCCL_BUFFSIZE where no collective's chunk sets it,
    instead of being cut to what NCCL keeps. Raises LagomError when a config is
    invalid on ``version`` (naming the signature).
    """
    out = Delivery()
    items = sorted(plan.entries.items())
    for sig, cfg in items:
        try:
            validate_config(cfg, version, sig.collective)
        except LagomError as exc:
            raise LagomError(f"{sig.label()}: {exc}") from None
    if plan.default != CommConfig():
        validate_config(plan.default, version)
    per_coll = per_collective_knobs(version) if use_plugin else frozenset()

    def door_knobs(sig: Signature) -> frozenset[str]:
        return per_coll if sig.collective in PLUGIN_COLLECTIVES else frozenset()

    _plugin_part(items, plan.default, per_coll, out)
    for sig, cfg in items:
        if sig.collective in P2P_COLLECTIVES:
            asked = [k.field for k in (ALGORITHM, PROTOCOL, CHANNELS, THREADS) if getattr(cfg, k.field) is not None]
            if asked:
                out.compromises.append(
                    f"{sig.label()}: {', '.join(asked)} not delivered: NCCL consults no tuner plugin, "
                    f"NCCL_ALGO/NCCL_PROTO or NCCL_NTHREADS for point-to-point traffic; NCCL decides"
                )
    collectives = [(s, c) for s, c in items if s.collective not in P2P_COLLECTIVES]
    _threads(collectives, plan.default, out)
    _chunk(collectives, plan.default, version, per_coll, door_knobs, out)
    buffsize_free = CHUNK.field in per_coll or (own_communicator and "NCCL_BUFFSIZE" not in out.env)
    _p2p_chunk([(s, c) for s, c in items if s.collective in P2P_COLLECTIVES], version, buffsize_free, out)
    _channels(items, plan.default, version, per_coll, out)
    _algo_proto(items, plan.default, version, per_coll, out)
    _paths(items, out)
    return out


@dataclass(frozen=True)
class PluginRule:
    """One per-collective setting on its way into the plugin table: the entry (its match
    fields and every setting), the process group it was tuned for (None: any), and how
    a message names it (a signature's label, or "entry N" of a tuned-config file)."""

    entry: PluginEntry
    group: str | None
    label: str


def plugin_lines(rules: list[PluginRule], per_coll: frozenset[str]) -> tuple[list[PluginEntry], list[str]]:
    """The plugin table's lines for ``rules``, first-match order kept, and what they could not carry.

    Each line keeps only the settings the plugin carries on this NCCL (``per_coll``:
    :func:`nccl_env.rules.per_collective_knobs`); point-to-point rules and rules left
    with no setting give no line. The plugin cannot see process groups: a rule whose
    match repeats an earlier one's with other settings gives no line (the earlier one
    wins, as it would in the plugin) and a compromise that says so. A value the plugin
    would reject raises LagomError, also where this NCCL would not be given it.
    """
    lines: list[PluginEntry] = []
    compromises: list[str] = []
    first_by_match: dict[tuple, tuple[PluginRule, PluginEntry]] = {}
    for index, rule in enumerate(rules):
        e = rule.entry
        if e.collective is not None and e.collective not in PLUGIN_COLLECTIVES:
            continue
        check_entry(e, index)
        settings = plugin_settings(e.settings, per_coll)
        if settings == CommConfig():
            continue
        line = e if settings is e.settings else replace(e, settings=settings)
        key = (e.collective, e.min_bytes, e.max_bytes, e.ranks, e.nodes, e.pipe_ops, e.reg_buff)
        if key in first_by_match:
            first_rule, first_line = first_by_match[key]
            if first_line != line:
                compromises.append(
                    f"{rule.label}: the plugin cannot tell process groups apart ({first_rule.group!r} and "
                    f"{rule.group!r} have the same collective, size, ranks and nodes); "
                    f"both get the settings of group {first_rule.group!r}"
                )
            continue
        first_by_match[key] = (rule, line)
        lines.append(line)
    return lines, compromises


def _plugin_part(items: list[tuple[Signature, CommConfig]], default: CommConfig, per_coll: frozenset[str],
                 out: Delivery) -> None:
    if not per_coll:
        return
    rules = [
        PluginRule(PluginEntry(collective=sig.collective, min_bytes=sig.message_bytes or None,
                               max_bytes=sig.message_bytes, nodes=sig.nodes, ranks=sig.ranks,
                               settings=plugin_settings(cfg)),
                   sig.group, sig.label())
        for sig, cfg in items
    ]
    lines, compromises = plugin_lines(rules, per_coll)
    out.plugin_entries += lines
    out.compromises += compromises
    fallback = plugin_settings(default, per_coll)
    if fallback != CommConfig():
        out.plugin_entries.append(PluginEntry(settings=fallback))  # wildcard last: first match wins


def _threads(items: list[tuple[Signature, CommConfig]], default: CommConfig, out: Delivery) -> None:
    for var, ll128 in (("NCCL_NTHREADS", False), ("NCCL_LL128_NTHREADS", True)):
        wanted = THREADS.set_in((s, c) for s, c in items if (PROTOCOL.get(c) is Protocol.LL128) == ll128)
        if not wanted and THREADS.get(default) is not None and (PROTOCOL.get(default) is Protocol.LL128) == ll128:
            out.env[var] = str(THREADS.get(default))
            continue
        if wanted:
            _, value = _one_value(THREADS.field, wanted, "in one process",
                                  f"{var} is read once per process and no plugin ABI sets threads", out.compromises)
            out.env[var] = str(value)


def _chunk(items, default: CommConfig, version: NcclVersion, per_coll, door_knobs, out: Delivery) -> None:
    wanted = [(s, c) for s, c in items if CHUNK.get(c) is not None]
    if CHUNK.field in per_coll:
        # Per collective through getChunkSize, but NCCL clamps to the buffer: make it big enough.
        needs = [_buffsize_for(c) for s, c in wanted if CHUNK.field in door_knobs(s)]
        if CHUNK.get(default) is not None:
            needs.append(_buffsize_for(default))
        need = max(needs, default=0)
        if need > DEFAULT_BUFFSIZE_BYTES:
            out.env["NCCL_BUFFSIZE"] = str(1 << (need - 1).bit_length())  # NCCL recommends powers of two
        return
    if not wanted:
        if CHUNK.get(default) is not None:
            out.env["NCCL_BUFFSIZE"] = str(_buffsize_for(default))
        return
    sig, cfg = _one_value(
        CHUNK.field, wanted, "in one process",
        f"NCCL {version} has no per-collective chunk size (tuner getChunkSize needs 2.30) and NCCL_BUFFSIZE is "
        f"one value per process", out.compromises, show=lambda c: str(CHUNK.get(c)),
    )
    out.env["NCCL_BUFFSIZE"] = str(_buffsize_for(cfg))


def _buffsize_for(cfg: CommConfig) -> int:
    """The NCCL_BUFFSIZE that admits ``cfg``'s chunk (which it sets) on its algorithm."""
    chunk = CHUNK.get(cfg)
    assert chunk is not None
    return buffsize_for_chunk(chunk, ALGORITHM.get(cfg))


def _p2p_chunk(items: list[tuple[Signature, CommConfig]], version: NcclVersion, buffsize_free: bool,
               out: Delivery) -> None:
    """Point-to-point step sizes: one value per env variable; from 2.19 within BUFFSIZE / 8.

    ``buffsize_free``: NCCL_BUFFSIZE only has to be large enough (the plugin carries the
    collectives' chunks, or no collective shares the process), so it is raised to admit
    the step; otherwise it sets the collectives' chunk and the step is cut to what NCCL
    will keep.
    """
    wanted: dict[str, list[tuple[Signature, int]]] = defaultdict(list)
    for sig, cfg in items:
        if (step_bytes := CHUNK.get(cfg)) is not None:
            for env in p2p_chunk_envs(sig.nodes):
                wanted[env].append((sig, int(step_bytes)))
    for env, values in sorted(wanted.items()):
        if env == P2P_PCI_CHUNK_ENV and P2P_NVL_CHUNK_ENV in wanted:
            out.env[env] = out.env[P2P_NVL_CHUNK_ENV]  # the same signatures: said once already
            continue
        sig, chunk = _one_value("point-to-point chunk_bytes", values, "in one process",
                                f"{env} is read once per process", out.compromises)
        ceiling = p2p_chunk_ceiling(version, int(out.env.get("NCCL_BUFFSIZE", DEFAULT_BUFFSIZE_BYTES)))
        if ceiling is not None and chunk > ceiling:
            if buffsize_free:
                need = chunk * NCCL_STEPS
                out.env["NCCL_BUFFSIZE"] = str(1 << (need - 1).bit_length())
            else:
                out.compromises.append(
                    f"{sig.label()}: point-to-point chunk_bytes {chunk} cut to {ceiling}: NCCL {version} keeps the "
                    f"step within NCCL_BUFFSIZE / 8, and NCCL_BUFFSIZE here sets the collectives' chunk")
                chunk = ceiling
        out.env[env] = str(chunk)


def _channels(items, default: CommConfig, version: NcclVersion, per_coll, out: Delivery) -> None:
    if CHANNELS.field in per_coll:
        # The plugin carries them (the default went into a wildcard entry), but NCCL caps a
        # plugin's channel count at the communicator's (enqueue.cc: nc <= comm->nChannels).
        # minCTAs = the most any collective of the group asks for lets it ask that many;
        # below NCCL's own count it changes nothing, since NCCL keeps max(its count, minCTAs).
        most: dict[str, int] = {}
        for sig, count in CHANNELS.set_in(items):
            if sig.collective in PLUGIN_COLLECTIVES:
                most[sig.group] = max(most.get(sig.group, 0), int(count))
        symmetric = {g for g, p in group_paths(Plan(dict(items))).items() if p is CommPath.SYMMETRIC}
        for group, value in sorted(most.items()):
            if group in symmetric:
                # NCCL gives its symmetric kernels at least the communicator's minCTAs (sym_kernels.cc
                # nMinBlocks = config.minCTAs): raising it would hand them CTAs they do not need
                # and take those SMs from the compute beside them
                out.compromises.append(
                    f"channels: group {group!r} runs symmetric kernels, which take at least its minCTAs; min_ctas is "
                    f"not raised to {value}, so its other collectives get at most NCCL's own channel count")
                continue
            if version >= CTAS_ENV_SINCE:
                out.group_configs[group] = {MIN_CTAS.key: value}
        return
    wanted = [(s, count) for s, count in CHANNELS.set_in(items) if s.collective in PLUGIN_COLLECTIVES]
    default_channels = CHANNELS.get(default)
    if version < CTAS_ENV_SINCE:
        if wanted:
            _, value = _one_value(CHANNELS.field, wanted, "in one process",
                                  f"NCCL {version} has neither a tuner plugin nor per-communicator CTAs",
                                  out.compromises)
            out.env["NCCL_MIN_NCHANNELS"] = out.env["NCCL_MAX_NCHANNELS"] = str(value)
        elif default_channels is not None:
            out.env["NCCL_MIN_NCHANNELS"] = out.env["NCCL_MAX_NCHANNELS"] = str(default_channels)
        return
    by_group: dict[str, list] = defaultdict(list)
    for sig, value in wanted:
        by_group[sig.group].append((sig, value))
    for group, group_items in sorted(by_group.items()):
        _, value = _one_value(CHANNELS.field, group_items, f"in process group {group!r}",
                              "without the tuner plugin channels are set per communicator (minCTAs/maxCTAs)",
                              out.compromises)
        out.group_configs[group] = {MIN_CTAS.key: int(value), MAX_CTAS.key: int(value)}
    if default_channels is not None:
        if out.group_configs:
            out.compromises.append(
                f"channels: the plan's default of {default_channels} is not set process-wide because "
                f"NCCL_MIN_CTAS/NCCL_MAX_CTAS override every communicator's minCTAs/maxCTAs; other groups: NCCL decides"
            )
        else:
            out.env["NCCL_MIN_CTAS"] = out.env["NCCL_MAX_CTAS"] = str(default_channels)


def _algo_proto(items, default: CommConfig, version: NcclVersion, per_coll, out: Delivery) -> None:
    for row, names in ((ALGORITHM, ENV_ALGO_NAME), (PROTOCOL, ENV_PROTO_NAME)):
        knob, (var,) = row.field, row.env  # NCCL_ALGO / NCCL_PROTO
        if knob in per_coll:
            continue  # the plugin carries it (the default went into a wildcard entry)
        wanted = [(s, getattr(c, knob)) for s, c in items
                  if getattr(c, knob) is not None and s.collective in PLUGIN_COLLECTIVES]
        base = getattr(default, knob)
        if not wanted and base is None:
            continue
        if version >= PER_FUNCTION_ALGO_SINCE:
            parts = [names[base]] if base is not None else []
            per_func: dict[CollectiveType, list] = defaultdict(list)
            for sig, value in wanted:
                per_func[sig.collective].append((sig, value))
            for coll in PLUGIN_COLLECTIVES:
                if coll not in per_func:
                    continue
                values = sorted({v for _, v in per_func[coll]})
                if len(values) > 1:
                    out.compromises.append(
                        f"{knob}: {ENV_FUNC_NAME[coll]} asks for {', '.join(names[v] for v in values)} at different "
                        f"sizes, but {var} cannot select by size; NCCL chooses among them"
                    )
                parts.append(f"{ENV_FUNC_NAME[coll]}:{','.join(names[v] for v in values)}")
            out.env[var] = ";".join(parts)
        else:
            values = sorted({v for _, v in wanted} | ({base} if base is not None else set()))
            if len(values) > 1 or (wanted and {s.collective for s, _ in wanted} != set(PLUGIN_COLLECTIVES)):
                out.compromises.append(
                    f"{knob}: NCCL {version} has no per-collective {var} (per-function syntax needs "
                    f"{PER_FUNCTION_ALGO_SINCE}); {var}={','.join(names[v] for v in values)} limits every collective "
                    f"and NCCL chooses among those"
                )
            out.env[var] = ",".join(names[v] for v in values)


def group_paths(plan: Plan) -> dict[str, CommPath]:
    """Each process group's path in ``plan`` (groups without one are left out: NCCL's kernels);
    where a group's signatures disagree, the largest message's (as :func:`deliver` delivers)."""
    by_group: dict[str, list[tuple[Signature, CommPath]]] = defaultdict(list)
    for sig, group_path in PATH.set_in(sorted(plan.entries.items())):
        by_group[sig.group].append((sig, group_path))
    return {group: largest_message(items)[1] for group, items in sorted(by_group.items())}


def _paths(items: list[tuple[Signature, CommConfig]], out: Delivery) -> None:
    """Per group, the CTA policy its path needs (ncclConfig_t.CTAPolicy; validate_config checked the
    version); a group asked for two paths gets the largest message's, and a compromise says so."""
    by_group: dict[str, list[tuple[Signature, CommPath]]] = defaultdict(list)
    for sig, group_path in PATH.set_in(items):
        by_group[sig.group].append((sig, group_path))
    chosen: set[CommPath] = set()
    for group, group_items in sorted(by_group.items()):
        _, path = _one_value(PATH.key, group_items, f"in process group {group!r}",
                             "a communicator has one CTA policy and its collectives one buffer registration",
                             out.compromises, show=lambda p: p.value)
        if path.cta_policy is not CtaPolicy.DEFAULT:
            out.group_configs.setdefault(group, {})[CTA_POLICY.key] = path.cta_policy.nccl_name
        chosen.add(path)
    if CommPath.COPY_ENGINE in chosen and chosen <= {CommPath.SM, CommPath.COPY_ENGINE}:
        # The process-wide twin, for torch builds without the config.cta_policy binding: ZERO moves
        # only collectives whose buffers sit in a symmetric window (enqueue.cc: ceAvailable needs the
        # window's registration, else the kernel path), and here only the copy-engine groups register;
        # a symmetric or EFFICIENCY group would be overridden by it (init.cc "Comm config CTAPolicy reset
        # to NCCL_CTA_POLICY"), so then the policy goes per group alone. The integer form: 2.28 reads
        # no names (NCCL_PARAM), 2.29+ keeps the digits.
        out.env["NCCL_CTA_POLICY"] = str(int(CtaPolicy.ZERO))
