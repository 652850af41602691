"""Commands render (issue 33, item 5): ``simulate`` and ``tune`` parse their flags, call the work
in ``lagom/orchestration`` and render its result; their ``run()`` stays at most 80 lines."""

from __future__ import annotations

import ast

import pytest
from conftest import REPO_ROOT

RUN_MAX_LINES = 80  # issue 33: "run() of tune and simulate at most 80 lines"


def run_lines(command: str) -> int:
    tree = ast.parse((REPO_ROOT / "lagom" / "commands" / f"{command}.py").read_text())
    (run,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "run"]
    assert run.end_lineno is not None
    return run.end_lineno - run.lineno + 1


@pytest.mark.parametrize("command", ["simulate", "tune"])
def test_a_commands_run_renders_in_at_most_80_lines(command):
    lines = run_lines(command)
    assert 5 < lines <= RUN_MAX_LINES, lines
