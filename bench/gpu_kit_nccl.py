"""The one-GPU kit's NCCL check: Lagom's tuner plugin loaded into the real libnccl, read from NCCL's log.

:func:`run_probe` builds the plugin (``nccl_env.plugin_build``), writes a one-line table,
and runs a one-rank ``torch.distributed`` job with the NCCL backend in a child process
(NCCL reads its env once per process) with ``NCCL_TUNER_PLUGIN``, ``NCCL_DEBUG=INFO``,
``NCCL_DEBUG_SUBSYS=INIT,ENV,TUNING`` and ``NCCL_DEBUG_FILE``; the child all-reduces a few
sizes. :func:`parse_log` reads what NCCL itself wrote. The lines and where NCCL writes them
(NVIDIA/nccl, 2.28-2.30; docs/reference.md §3):

- ``NCCL version 2.21.5+cuda12.4`` (init);
- ``NCCL_TUNER_PLUGIN set by environment to <path>`` (``src/plugin/tuner.cc``);
- ``TUNER/Plugin: Using <name> (v<N>)``: the plugin struct NCCL took, by its ``name`` field
  and ABI version (``src/plugin/tuner/tuner_v<N>.cc``);
- ``Successfully loaded external tuner plugin <path>`` or ``External tuner plugin <path> is
  unsupported`` (``src/plugin/tuner.cc``);
- ``TUNER/Plugin: Closing tuner: '<name>'`` at teardown;
- Lagom's own line, through the logger NCCL hands the plugin: ``TUNER/Lagom: <table>: N
  entries, M lines rejected``;
- per collective, at TUNING, the path NCCL planned (``lagom.runtime.nccl_paths``). On a
  one-rank communicator NCCL may run a collective as a local copy without asking the
  plugin, so these lines can be absent there; the kit reports what it finds.

Every INFO line reads ``<host>:<pid>:<tid> [<device>] NCCL INFO <text>`` (``src/debug.cc``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from lagom.runtime.nccl_paths import PathLine, parse_line
from nccl_env.knobs import Algorithm, CollectiveType, CommConfig, Protocol
from nccl_env.plugin_table import PluginEntry, format_table

PROBE_SIZES = (4096, 1 << 20, 64 << 20)  # bytes all-reduced by the one-rank job
PROBE_ENTRY = PluginEntry(collective=CollectiveType.ALLREDUCE,
                          settings=CommConfig(Algorithm.RING, Protocol.SIMPLE, channels=2))
PROBE_TIMEOUT_S = 120

_VERSION = re.compile(r"NCCL INFO NCCL version (\S+)")
_REQUESTED = re.compile(r"NCCL INFO NCCL_TUNER_PLUGIN set by environment to (\S+)")
_USING = re.compile(r"NCCL INFO TUNER/Plugin: Using (.+) \(v(\d+)\)\s*$")
_LOADED = re.compile(r"NCCL INFO Successfully loaded external tuner plugin (\S+)")
_UNSUPPORTED = re.compile(r"NCCL (?:INFO|ATTN|WARN) .*External tuner plugin (\S+) is unsupported")
_CLOSING = re.compile(r"NCCL INFO TUNER/Plugin: Closing tuner: '(.*)'")
_TABLE = re.compile(r"TUNER/Lagom: (.+): (\d+) entries, (\d+) lines rejected")
_WARN = re.compile(r"NCCL WARN (.*)$")


@dataclass
class PluginLog:
    """What NCCL's log says about the tuner plugin."""

    nccl_version: str | None = None
    requested: str | None = None  # NCCL_TUNER_PLUGIN as NCCL read it
    plugin_name: str | None = None  # the struct's name field, as NCCL printed it
    abi_version: int | None = None
    loaded_from: str | None = None
    unsupported: str | None = None
    table: str | None = None
    table_entries: int | None = None
    table_rejected: int | None = None
    closed: str | None = None
    collectives: list[PathLine] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def loaded(self) -> bool:
        return self.plugin_name is not None and self.unsupported is None

    def served(self, entry: PluginEntry) -> list[PathLine]:
        """The collectives NCCL planned as ``entry`` says (its algorithm, protocol and channels)."""
        s = entry.settings
        kernel = f"{s.algorithm.name}/{s.protocol.name}" if s.algorithm and s.protocol else None
        return [c for c in self.collectives if (kernel is None or c.kernel.upper() == kernel)
                and (s.channels is None or c.ctas == s.channels)]

    def to_dict(self) -> dict:
        out = asdict(self)
        out["loaded"] = self.loaded
        out["served"] = len(self.served(PROBE_ENTRY))
        return out


def parse_log(text: str) -> PluginLog:
    """Everything :class:`PluginLog` holds, from the text of NCCL's debug file(s)."""
    log = PluginLog()
    for line in text.splitlines():
        if (m := _VERSION.search(line)) and log.nccl_version is None:
            log.nccl_version = m.group(1)
        elif m := _REQUESTED.search(line):
            log.requested = m.group(1)
        elif m := _USING.search(line):
            log.plugin_name, log.abi_version = m.group(1), int(m.group(2))
        elif m := _LOADED.search(line):
            log.loaded_from = m.group(1)
        elif m := _UNSUPPORTED.search(line):
            log.unsupported = m.group(1)
        elif m := _CLOSING.search(line):
            log.closed = m.group(1)
        elif m := _TABLE.search(line):
            log.table, log.table_entries, log.table_rejected = m.group(1), int(m.group(2)), int(m.group(3))
        elif m := _WARN.search(line):
            log.warnings.append(m.group(1).strip())
        elif (path := parse_line(line)) is not None:
            log.collectives.append(path)
    return log


def probe_env(plugin: Path, table: Path, log_dir: Path) -> dict[str, str]:
    """The child's env: the plugin, its table, NCCL's INFO log of INIT, ENV and TUNING into ``log_dir``."""
    env = dict(os.environ)
    repo = str(Path(__file__).resolve().parents[1])  # the child imports Lagom's packages from this checkout
    env["PYTHONPATH"] = os.pathsep.join(p for p in (repo, env.get("PYTHONPATH", "")) if p)
    env.update({"NCCL_TUNER_PLUGIN": str(plugin), "NCCL_TUNER_CONFIG_FILE": str(table), "NCCL_DEBUG": "INFO",
                "NCCL_DEBUG_SUBSYS": "INIT,ENV,TUNING", "NCCL_DEBUG_FILE": str(log_dir / "nccl.%h.%p.log")})
    return env


def run_probe(out: Path) -> PluginLog:
    """Build the plugin, run the one-rank job, read NCCL's log (written under ``out/nccl-log``)."""
    from nccl_env.plugin_build import build_plugin

    plugin = build_plugin()
    table = out / "probe_table.csv"
    table.write_text(format_table([PROBE_ENTRY], ["one AllReduce entry: Ring/Simple on 2 channels"]))
    log_dir = out / "nccl-log"
    log_dir.mkdir(parents=True, exist_ok=True)
    done = subprocess.run([sys.executable, __file__, "--child"], env=probe_env(plugin, table, log_dir),
                          capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
    text = "".join(p.read_text(errors="replace") for p in sorted(log_dir.glob("nccl.*.log")))
    log = parse_log(text)
    if done.returncode != 0:
        log.warnings.append(f"the one-rank job exited {done.returncode}: "
                            f"{(done.stderr.strip().splitlines() or [''])[-1][:200]}")
    return log


def _child() -> None:
    """The one-rank job (a fresh process: NCCL reads its env once)."""
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(0)
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1, device_id=torch.device("cuda", 0))
    for size in PROBE_SIZES:
        tensor = torch.ones(size // 4, device="cuda")
        dist.all_reduce(tensor)
    torch.cuda.synchronize()
    dist.destroy_process_group()


if __name__ == "__main__" and sys.argv[1:] == ["--child"]:
    _child()
