"""One meaning per constant name (issue 33): a public module-level constant of the five packages that
two modules define has the same value in both. ``CHUNK_MAX_BYTES`` meant 4 MiB in nccl_env/knob_table.py
(the top of the search's ladder) and 1 GiB in nccl_env/rules.py (Lagom's cap), ``MAX_RANKS`` 131,072
and 2^20, ``PACKAGES`` four packages and five."""

from __future__ import annotations

import ast
import operator
from collections import defaultdict

from conftest import REPO_ROOT

PACKAGES_CHECKED = ("nccl_env", "traces", "costmodel", "tuner", "lagom")
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.LShift: operator.lshift,
        ast.Pow: operator.pow, ast.FloorDiv: operator.floordiv}


def _value(node: ast.expr) -> object:
    """A constant expression's value (literals and integer arithmetic); its source where it is more."""
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _value(node.left), _value(node.right)
        if isinstance(left, int) and isinstance(right, int):
            return _OPS[type(node.op)](left, right)
    try:
        return ast.literal_eval(node)
    except ValueError:
        return ast.unparse(node)


def _public_constants() -> dict[str, dict[str, object]]:
    found: dict[str, dict[str, object]] = defaultdict(dict)
    for pkg in PACKAGES_CHECKED:
        for path in sorted((REPO_ROOT / pkg).rglob("*.py")):
            for node in ast.parse(path.read_text()).body:
                if isinstance(node, ast.Assign):
                    targets, value = node.targets, node.value
                elif isinstance(node, ast.AnnAssign) and node.value is not None:
                    targets, value = [node.target], node.value
                else:
                    continue
                for target in targets:
                    if isinstance(target, ast.Name) and target.id.isupper() and not target.id.startswith("_"):
                        found[target.id][str(path.relative_to(REPO_ROOT))] = _value(value)
    return found


def test_the_scan_sees_module_constants():
    found = _public_constants()
    assert found["CHUNK_MAX_BYTES"] == {"nccl_env/rules.py": 1 << 30}
    assert "CHUNK_LADDER_MAX_BYTES" in found and "TRACE_RANK_BOUND" in found


def test_a_constant_name_means_one_thing():
    clashes = {name: where for name, where in _public_constants().items()
               if len(where) > 1 and len({repr(v) for v in where.values()}) > 1}
    assert not clashes, clashes
