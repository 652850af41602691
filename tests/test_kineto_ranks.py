"""The N-rank paired-trace generator (tests/kineto_ranks.py) keeps NCCL's rule across ranks.

Checked on the traces it writes, read as plain JSON: every member of a collective ends at
the same true time (its trace time less its host's offset), no earlier than the last
member's kernel started; the files carry the rank, the groups and each host's offset.
"""

from __future__ import annotations

import ast
import gzip
import json
import sys
from pathlib import Path

import kineto_ranks as kr
import pytest

EPS_US = 0.002  # the trace's times are rounded to the nanosecond


def kernels(folder: Path, program: kr.RankProgram) -> dict[tuple[str, int], dict[int, tuple[float, float]]]:
    """(group, seq) -> rank -> (true start, true end) of its collective kernel; a send/recv in a
    group of more than two ranks: (group:src>dst, its order in the pair's), NCCL's pairing. The
    peer as PyTorch writes it: ``Dst Rank`` / ``Src Rank``, its global rank (the programs' groups
    are evenly spaced; a list of "[]": pg_config's)."""
    out: dict[tuple[str, int], dict[int, tuple[float, float]]] = {}
    stage = {program.global_rank(i): i for i in range(program.ranks)}
    for path in sorted(folder.glob("*.json.gz")):
        doc = json.loads(gzip.decompress(path.read_bytes()))
        rank = doc["distributedInfo"]["rank"]
        listed = {g["pg_name"]: g["ranks"] for g in doc["distributedInfo"]["pg_config"]}
        off = program.offsets_us[stage[rank]]
        pairs: dict[str, int] = {}
        for e in sorted((e for e in doc["traceEvents"] if e.get("cat") == "kernel"), key=lambda e: e["ts"]):
            args = e["args"]
            if "Process Group Name" in args:
                key = (args["Process Group Name"], args["Seq"])
                members = ast.literal_eval(args["Process Group Ranks"]) or listed[key[0]]
                if len(members) > 2 and args["Collective name"] in ("send", "recv"):
                    peer = args["Dst Rank"] if "Dst Rank" in args else args["Src Rank"]
                    src, dst = (rank, peer) if args["Collective name"] == "send" else (peer, rank)
                    pair = f"{key[0]}:{src}>{dst}"
                    key = (pair, pairs.setdefault(pair, 0))
                    pairs[pair] += 1
                out.setdefault(key, {})[rank] = (e["ts"] - off, e["ts"] + e["dur"] - off)
    return out


@pytest.mark.parametrize("name", list(kr.PROGRAMS))
def test_members_end_together_after_the_last_start(name: str, tmp_path: Path) -> None:
    p = kr.PROGRAMS[name]
    folder = kr.write_ranks(p, kr.simulate(p), tmp_path / name)
    found = kernels(folder, p)
    assert len(found) > 10
    waited = 0
    for key, members in found.items():
        if len(members) < 2:
            continue  # a collective the window cut on some rank
        ends = [e for _, e in members.values()]
        assert max(ends) - min(ends) <= EPS_US, key
        assert min(ends) >= max(s for s, _ in members.values()) - EPS_US, key
        waited += sum(1 for s, _ in members.values() if min(ends) - s > 50.0)
    assert waited > 0  # somebody waited for a peer


def test_the_slow_rank_waits_least_and_hosts_clocks_differ(tmp_path: Path) -> None:
    p = kr.PROGRAMS["straggler"]
    runs = kr.simulate(p)
    waits = [sum(run.waits_us.values()) for run in runs]
    assert waits.index(min(waits)) == p.slow.index(max(p.slow))
    assert min(waits) < 0.05 * max(waits)
    folder = kr.write_ranks(p, runs, tmp_path / "s")
    firsts = []
    for r in range(p.ranks):
        doc = json.loads(gzip.decompress((folder / f"straggler_rank{r}.json.gz").read_bytes()))
        assert doc["distributedInfo"]["rank"] == r
        assert {g["pg_name"] for g in doc["distributedInfo"]["pg_config"]} == {"0"}
        firsts.append(min(e["ts"] for e in doc["traceEvents"] if e.get("cat") == "kernel") - p.offsets_us[r])
    assert max(firsts) - min(firsts) < 100.0  # the true clocks agree; only the hosts' differ


def test_a_slower_rank_slows_its_peers(tmp_path: Path) -> None:
    p = kr.PROGRAMS["pipeline"]
    _, _, truth = kr.paired_ranks(p, tmp_path, compute={2: 1.3})
    for pair in truth.ranks:
        assert pair.change > 0.02  # every stage's step follows the slowest stage


def test_the_generator_imports_nothing_of_lagom() -> None:
    tree = ast.parse(Path(kr.__file__).read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert imported <= set(sys.stdlib_module_names) | {"__future__", "kineto_world"}, imported
