"""The knob table (nccl_env.knob_table) drives the space, --set, delivery and the validator;
the NCCL version is parsed only where it enters (a file, a flag, a trace, libnccl); a
version NCCL never released is refused in one line."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest
from conftest import REPO_ROOT

from costmodel.cluster import load_cluster
from lagom.args.knob_args import parse_nccl_version_arg, parse_set
from nccl_env import delivery
from nccl_env.errors import LagomError
from nccl_env.knob_table import GROUP_BY_KEY, GROUP_KNOBS, KNOBS, PATH, RESOURCE_KNOBS, Scope, knob_scopes
from nccl_env.knobs import CommConfig
from nccl_env.nccl_releases import RELEASED, closest_releases, released_version
from nccl_env.plan import Plan
from nccl_env.rules import NcclVersion, max_channels, per_collective_knobs, validate_config
from traces.generate import generate_workload
from tuner.space import build_space

PACKAGES = ("nccl_env", "traces", "costmodel", "tuner", "lagom")
# issue 25: a knob's CommConfig field name is a Python identifier in at most four non-test files
# of the five packages: its definition, the two collective models and one more (the knob table
# spells the fields as strings, so it does not count). Everything else reads the table's rows.
KNOB_HOMES = {"nccl_env/knobs.py", "costmodel/analytic/collective_model.py", "costmodel/sim/collective.py"}
# The one more file is costmodel/nccl_defaults.py, NCCL's own choice of every knob
# (tuning.cc), a third model of NCCL beside the two collective models.
# CommConfig.comm_path is "path" in files and --set (Knob.key); the field is not, as the word names
# file paths in ~40 modules.


def _sources() -> list[Path]:
    return [p for pkg in PACKAGES for p in sorted((REPO_ROOT / pkg).rglob("*.py"))]


def _identifiers(tree: ast.AST) -> set[str]:
    """Every name the code uses as an identifier: attributes, names, keywords, parameters,
    definitions and imports (not strings, comments or docstrings)."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            out.add(node.attr)
        elif isinstance(node, ast.Name):
            out.add(node.id)
        elif isinstance(node, ast.keyword | ast.arg) and node.arg:
            out.add(node.arg)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            out.add(node.name)
        elif isinstance(node, ast.alias):
            out.add((node.asname or node.name).split(".")[-1])
    return out


@functools.cache
def _parsed() -> dict[str, tuple[set[str], set[str]]]:
    """Each source file's identifiers, and its identifiers with the strings its code uses: parsed once
    for every knob's count (each parse of the ~250 files took a second or more)."""
    out = {}
    for p in _sources():
        tree = ast.parse(p.read_text())
        identifiers = _identifiers(tree)
        out[str(p.relative_to(REPO_ROOT))] = (identifiers, identifiers | _strings(tree))
    return out


def files_naming(field: str) -> set[str]:
    return {name for name, (identifiers, _) in _parsed().items() if field in identifiers}


def test_the_identifier_count_sees_code_not_text():
    tree = ast.parse('"""channels"""\n# threads\nx = "chunk_bytes"\ny = cfg.algorithm\nf(protocol=1)\n'
                     'def g(path): pass\n')
    assert _identifiers(tree) >= {"algorithm", "protocol", "path"}
    assert not _identifiers(tree) & {"channels", "threads", "chunk_bytes"}


@pytest.mark.parametrize("knob", KNOBS, ids=lambda k: k.field)
def test_a_knobs_field_name_lives_in_at_most_four_files(knob):
    naming = files_naming(knob.field)
    others = naming - KNOB_HOMES
    assert len(others) <= 1, sorted(others)  # the one more
    assert "nccl_env/knobs.py" in naming  # the count would be vacuous if the field were not found
    assert len(naming) <= 4, sorted(naming)


def test_every_cli_spelling_sets_its_row_field():
    samples = {"algorithm": "ring", "protocol": "simple", "channels": "4", "threads": "256", "chunk_bytes": "1MiB",
               "comm_path": "symmetric"}
    for knob in KNOBS:
        for name in knob.cli_names:
            config = parse_set(f"{name}={samples[knob.field]}")
            assert knob.get(config) is not None and [f for f, v in config.to_dict().items()] == [knob.key], name
            assert CommConfig.from_dict(config.to_dict()) == config
    assert PATH.key == "path" and PATH.cli_names == ("path",)  # files and --set keep the word
    with pytest.raises(LagomError, match="KNOB one of channels, threads, chunk, algorithm, protocol, path"):
        parse_set("chanels=4")


def test_the_space_takes_its_axes_ladders_and_scopes_from_the_table():
    cluster = load_cluster("h100-nvswitch")
    workload = generate_workload("fsdp:phi2:gpus=8")
    for version in (NcclVersion(2, 18, 3), NcclVersion(2, 21, 5), NcclVersion(2, 30, 7)):
        space = build_space(workload, cluster, nccl_version=version)
        assert space.scopes == knob_scopes(version)
        top = min(max_channels(version), cluster.gpu.sm_count // 2)
        for knob in RESOURCE_KNOBS:
            axis = space.axes[knob.field]
            assert axis.values == tuple(v for v in knob.ladder if knob.field != "channels" or v <= top)
            assert axis.scope is knob.scope(version)


def test_table_scopes_agree_with_the_version_rules_on_every_release():
    for version in RELEASED:
        per_coll = per_collective_knobs(version)
        for knob in KNOBS:
            if knob is PATH:
                assert knob.scope(version) is Scope.GROUP  # one CTA policy per communicator
                continue
            assert (knob.scope(version) is Scope.COLLECTIVE) == (knob.field in per_coll), (knob.field, version)
            assert knob.scope(version, use_plugin=False) is not Scope.COLLECTIVE


def test_delivery_writes_the_rows_env_names_and_plugin_columns():
    sig = build_space(generate_workload("fsdp:phi2:gpus=8"), load_cluster("low-bw"),
                      nccl_version=NcclVersion(2, 18, 3)).signatures[0]
    written: set[str] = set()
    config = CommConfig.from_dict({"algorithm": "ring", "protocol": "simple", "channels": 4, "threads": 256,
                                   "chunk_bytes": 1 << 20})
    for use_plugin in (False, True):
        out = delivery.deliver(Plan(entries={sig: config}), NcclVersion(2, 18, 3), use_plugin=use_plugin)
        written |= set(out.env)
    for knob in KNOBS:
        assert set(knob.env) <= set(delivery.ENV_NAMES), knob.field
        if knob.field in ("algorithm", "protocol", "threads", "chunk_bytes"):  # process-wide on 2.18
            assert written & set(knob.env), knob.field
    assert set(delivery.PLUGIN_SETTINGS) == {k.field for k in KNOBS if k.plugin_column is not None}
    assert "threads" not in delivery.PLUGIN_SETTINGS  # no plugin ABI carries threads


def test_every_ladder_value_validates_where_the_space_offers_it():
    for version in (NcclVersion(2, 18, 3), NcclVersion(2, 24, 3), NcclVersion(2, 30, 7)):
        for knob in RESOURCE_KNOBS:
            for value in knob.ladder:
                if knob.field == "channels" and value > max_channels(version):
                    continue
                validate_config(CommConfig(**{knob.field: value}), version)


# ---- the NCCL version ------------------------------------------------------------------

# Where a version enters: the rules' own constants, the release table, libnccl's and torch's
# version codes, a cluster or tuned file, --nccl-version, a trace's distributedInfo, a published
# measurement's data file, and the settings file the launcher writes for its ranks.
VERSION_EDGES = {
    "nccl_env/rules.py", "nccl_env/nccl_releases.py", "nccl_env/libnccl.py", "costmodel/cluster.py",
    "costmodel/calibration/torch_backend.py", "costmodel/sim/published_cases.py", "lagom/files/tuned_config.py",
    "lagom/args/knob_args.py", "lagom/commands/tune.py", "lagom/commands/bench.py", "lagom/commands/run.py",
    "lagom/commands/calibrate.py",
    "lagom/orchestration/simulation.py",
    "lagom/orchestration/trace_context.py", "lagom/runtime/online.py",
}
PARSE = re.compile(r"NcclVersion\.(parse|from_code)\(|released_version\(|parse_nccl_version_arg\(|"
                   r"nccl_version\S*\.split\(|version\S*\.split\(\s*[\"']\.")


def test_the_nccl_version_is_parsed_only_where_it_enters():
    parsing = {str(p.relative_to(REPO_ROOT)) for p in _sources() if PARSE.search(p.read_text())}
    assert parsing <= VERSION_EDGES, sorted(parsing - VERSION_EDGES)


def test_a_version_nccl_never_released_is_refused_with_the_closest_named():
    assert released_version("2.30.7", "--nccl-version") == NcclVersion(2, 30, 7)
    assert released_version("v2.21.5-1", "x") == NcclVersion(2, 21, 5)
    with pytest.raises(LagomError, match=r"^nccl_version '2.31.9': NCCL never released 2.31.9 \(releases from "
                                         r"2.14.3 to 2.32.6; closest: 2.31.2\)$"):
        released_version("2.31.9", "nccl_version")
    with pytest.raises(LagomError, match=r"closest: 2.28.3, 2.28.7, 2.28.9\)$"):
        parse_nccl_version_arg("2.28")
    with pytest.raises(LagomError, match="must be a quoted string"):
        released_version(2.2, "nccl_version")
    with pytest.raises(LagomError, match="^--nccl-version: NCCL version 'two' is not of the form"):
        parse_nccl_version_arg("two")
    assert parse_nccl_version_arg(None) is None
    assert closest_releases(NcclVersion(2, 13, 0)) == (NcclVersion(2, 14, 3), NcclVersion(2, 15, 1),
                                                       NcclVersion(2, 15, 5))
    assert list(RELEASED) == sorted(set(RELEASED))


def test_every_version_the_project_ships_is_a_release():
    presets = [load_cluster(p).nccl_version for p in ("a100-nvswitch", "h100-nvswitch", "high-bw", "low-bw")]
    from lagom.orchestration.bench_matrix import PATHS_NCCL_VERSION

    assert all(v in RELEASED for v in [*presets, PATHS_NCCL_VERSION])


def _strings(tree: ast.AST) -> set[str]:
    """The strings code uses (dict keys, attribute names given as text), docstrings left out."""
    docs = {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and node.body
            and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    return {node.value for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs}


@pytest.mark.parametrize("row", GROUP_KNOBS, ids=lambda k: k.key)
def test_a_group_knob_is_a_row_and_its_key_lives_in_at_most_four_files(row):
    """issue 33: min_ctas, max_ctas and cta_policy were string-keyed dicts in four modules; now rows
    (nccl_env.knob_table.GROUP_KNOBS) that the file validator, delivery, the launcher, preflight and
    the process-group options read, their keys spelled in the table alone (and as nccl4py's field names
    in lagom/runtime/coll_config.py, another API)."""
    naming = {name for name, (_, names_and_keys) in _parsed().items() if row.key in names_and_keys}
    assert "nccl_env/knob_table.py" in naming
    assert len(naming) <= 4, sorted(naming)
    assert row.carries in KNOBS and row.env.startswith("NCCL_") and row.since <= NcclVersion(2, 28)


def test_a_group_knobs_value_is_what_nccl_takes():
    assert GROUP_BY_KEY["cta_policy"].value("zero") == 2 and GROUP_BY_KEY["max_ctas"].value(8) == 8
    for row, bad in ((GROUP_BY_KEY["min_ctas"], -1), (GROUP_BY_KEY["cta_policy"], "fast"),
                     (GROUP_BY_KEY["max_ctas"], True)):
        with pytest.raises(ValueError, match=row.key):
            row.value(bad)
