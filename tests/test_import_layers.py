"""The five packages import one way only: nccl_env <- traces <- costmodel <- tuner <- lagom.

Every module's imports (top level and inside functions, absolute and relative) are read
with ``ast``; a module may import its own package and lower ones, never a higher one.
The tuner also never imports the simulator (docs/design.md §2: it is judged against it).
Nothing outside ``traces/`` (the other packages, the benches) imports a trace reader's own
modules: they read traces through the interface, ``traces.reader``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]

LAYERS = ["nccl_env", "traces", "costmodel", "tuner", "lagom"]
SIMULATOR_MODULES = ("costmodel.sim",)  # costmodel.sim, costmodel.sim.collective, ...
# A reader's own modules (Kineto's: traces.kineto, kineto_json, kineto_events, kineto_comm, kineto_reader,
# kineto_export, and its kernel-name patterns); outside traces/ only traces.reader is imported for traces.
READER_PREFIX = "traces.kineto"
READER_MODULES = ("traces.comm_names",)


def _module_name(path: Path, root: Path = REPO_ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(path: Path, root: Path = REPO_ROOT) -> list[tuple[int, str]]:
    """(line, absolute module name) for every import statement in ``path``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    name = _module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.append((node.lineno, target))
            # `from costmodel import sim` names a module too
            found.extend((node.lineno, f"{target}.{alias.name}") for alias in node.names)
    return found


def violations(path: Path, root: Path = REPO_ROOT) -> list[str]:
    own = _module_name(path, root).split(".")[0]
    own_rank = LAYERS.index(own)
    out = []
    for line, target in imported_modules(path, root):
        top = target.split(".")[0]
        if top in LAYERS and LAYERS.index(top) > own_rank:
            out.append(f"{path.relative_to(root)}:{line}: {own} imports {target} (a higher layer)")
        if own == "tuner" and target.startswith(SIMULATOR_MODULES):
            out.append(f"{path.relative_to(root)}:{line}: tuner imports the simulator ({target})")
    return out


def _package_modules() -> list[Path]:
    return sorted(p for layer in LAYERS for p in (REPO_ROOT / layer).rglob("*.py"))


def test_every_package_module_is_checked():
    modules = _package_modules()
    assert {_module_name(p).split(".")[0] for p in modules} == set(LAYERS)
    assert len(modules) > 40  # the packages really were walked


@pytest.mark.parametrize("layer", LAYERS)
def test_no_upward_imports(layer):
    bad = [v for p in _package_modules() if _module_name(p).split(".")[0] == layer for v in violations(p)]
    assert not bad, "\n".join(bad)


def test_checker_catches_upward_and_relative_imports(tmp_path):
    """The checker itself finds a violation, including a function-local and a relative import."""
    fake_root = tmp_path
    (fake_root / "traces").mkdir()
    (fake_root / "tuner").mkdir()
    (fake_root / "traces" / "bad.py").write_text("def f():\n    from costmodel.cluster import load_cluster\n")
    (fake_root / "traces" / "ok.py").write_text("from .workload import Workload\nimport nccl_env.knobs\n")
    (fake_root / "tuner" / "peek.py").write_text("from costmodel import sim\n")
    assert violations(fake_root / "traces" / "bad.py", fake_root) == [
        "traces/bad.py:2: traces imports costmodel.cluster (a higher layer)",
        "traces/bad.py:2: traces imports costmodel.cluster.load_cluster (a higher layer)",
    ]
    assert violations(fake_root / "traces" / "ok.py", fake_root) == []
    assert violations(fake_root / "tuner" / "peek.py", fake_root) == [
        "tuner/peek.py:1: tuner imports the simulator (costmodel.sim)"]


def reader_violations(path: Path, root: Path = REPO_ROOT) -> list[str]:
    """Imports of a trace reader's own modules from ``path`` (outside traces/)."""
    out = []
    for line, target in imported_modules(path, root):
        parts = target.split(".")
        if target.startswith(READER_PREFIX) or ".".join(parts[:2]) in READER_MODULES:
            out.append(f"{path.relative_to(root)}:{line}: imports {target} (a reader's own module: use traces.reader)")
    return out


def _outside_traces() -> list[Path]:
    packages = [p for p in _package_modules() if _module_name(p).split(".")[0] != "traces"]
    return packages + sorted((REPO_ROOT / "bench").glob("*.py"))


def test_nothing_outside_traces_imports_a_reader():
    modules = _outside_traces()
    assert any(p.parent.name == "bench" for p in modules) and len(modules) > 60
    bad = [v for p in modules for v in reader_violations(p)]
    assert not bad, "\n".join(bad)


def test_reader_checker_catches_each_way_in(tmp_path):
    (tmp_path / "lagom").mkdir()
    bad = tmp_path / "lagom" / "bad.py"
    bad.write_text("from traces import kineto\nimport traces.kineto_json\n"
                   "def f():\n    from traces.comm_names import kernel_short_name\n"
                   "from traces.reader import read_trace\nfrom traces.workload import Workload\n")
    found = reader_violations(bad, tmp_path)
    assert [v.split(":")[1] for v in found] == ["1", "2", "4", "4"]
    assert "traces.kineto_json" in found[1]


# lagom/ by role (issue 25): its rooms, lowest first. A module may import lagom modules of its own
# room and the rooms below it, never above; the package itself (lagom.__version__) is everyone's.
LAGOM_ROOMS = ["files", "args", "reports", "orchestration", "online", "runtime", "commands", "cli"]
LAGOM_ROOT_ENTRY = {"cli", "__main__"}  # the entry points: the top room


def lagom_room(module: str, root: Path = REPO_ROOT) -> str | None:
    """The room of a lagom module (``lagom.files.tuned_config`` -> files), or None for the package."""
    parts = module.split(".")
    if parts[0] != "lagom" or len(parts) < 2:
        return None
    if parts[1] in LAGOM_ROOMS:
        return parts[1]
    if parts[1] in LAGOM_ROOT_ENTRY:
        return "cli"
    return "unknown"


def room_violations(path: Path, root: Path = REPO_ROOT) -> list[str]:
    own = lagom_room(_module_name(path, root), root)
    if own is None:
        return []
    out = []
    for line, target in imported_modules(path, root):
        room = lagom_room(target, root)
        if room is None or target == "lagom.__version__":
            continue
        if own == "unknown" or room == "unknown":
            out.append(f"{path.relative_to(root)}:{line}: {target}: every lagom module lives in a room "
                       f"({', '.join(LAGOM_ROOMS)}) or is an entry point")
        elif LAGOM_ROOMS.index(room) > LAGOM_ROOMS.index(own):
            out.append(f"{path.relative_to(root)}:{line}: lagom.{own} imports {target} (a higher room)")
    return out


def test_lagom_root_holds_only_rooms_and_entry_points():
    loose = sorted(p.stem for p in (REPO_ROOT / "lagom").glob("*.py")
                   if p.stem not in LAGOM_ROOT_ENTRY | {"__init__"})
    assert loose == [], f"lagom/ modules outside a room: {loose}"
    rooms = sorted(p.name for p in (REPO_ROOT / "lagom").iterdir() if (p / "__init__.py").exists())
    assert rooms == sorted(r for r in LAGOM_ROOMS if r != "cli")


def test_lagom_rooms_import_downwards_only():
    modules = sorted((REPO_ROOT / "lagom").rglob("*.py"))
    assert len(modules) > 40
    bad = [v for p in modules for v in room_violations(p)]
    assert not bad, "\n".join(bad)


def test_room_checker_catches_an_upward_import(tmp_path):
    (tmp_path / "lagom" / "files").mkdir(parents=True)
    bad = tmp_path / "lagom" / "files" / "bad.py"
    bad.write_text("def f():\n    from lagom.orchestration.tuning import tune\nfrom lagom import __version__\n"
                   "from lagom.files import output_paths\n")
    found = room_violations(bad, tmp_path)
    assert len(found) == 2 and all(":2:" in v and "higher room" in v for v in found), found
