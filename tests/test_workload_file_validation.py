"""A workload JSON file that is well-formed JSON but inconsistent is refused with one line.

Before, a string duration crashed the simulator with a TypeError, and an unknown group or
stream, a negative size or a dependency cycle was simulated as if it made sense (the
simulator silently releases ops caught in a cycle)."""

from __future__ import annotations

import json

import pytest
from conftest import all_test_traces

from lagom.cli import main
from nccl_env import LagomError
from traces.generate import PAPER_WORKLOADS, generate_workload
from traces.kineto import read_trace
from traces.workload import ComputeOp, Dependency, Stream, StreamKind, Workload
from traces.workload_io import load_workload, save_workload, workload_problem


def _first_dep(x):
    return x["dependencies"][0]


MUTATIONS = {
    "string duration": (lambda x: x["compute_ops"][0].__setitem__("duration_us", "x"), "duration_us must be finite"),
    "negative duration": (lambda x: x["compute_ops"][0].__setitem__("duration_us", -5), "duration >= 0"),
    "negative size": (lambda x: x["collectives"][0].__setitem__("message_bytes", -5),
                      "message_bytes must be an integer >= 0"),
    "unknown group": (lambda x: x["collectives"][0].__setitem__("group", "nope"),
                      "process group 'nope' is not in 'groups'"),
    "unknown stream": (lambda x: x["compute_ops"][0].__setitem__("stream", 999), "stream 999 is not in 'streams'"),
    "duplicate id": (lambda x: x["compute_ops"][1].__setitem__("op_id", x["compute_ops"][0]["op_id"]), "is used twice"),
    "dangling dependency": (lambda x: x["dependencies"].append([99999, 1, "data"]), "names an op that is not"),
    "cycle": (lambda x: x["dependencies"].append([_first_dep(x)[1], _first_dep(x)[0], "data"]), "form a cycle"),
    "flops text": (lambda x: x["compute_ops"][0].__setitem__("flops", "abc"), "flops must be a finite number"),
    "streams not objects": (lambda x: x.__setitem__("streams", [1, 2]), "not a valid Lagom workload"),
    "p2p rank text": (lambda x: x["collectives"][0].__setitem__("p2p", {"src": 0, "dst": "one"}),
                      "p2p src and dst must be ranks"),
    "p2p negative rank": (lambda x: x["collectives"][0].__setitem__("p2p", {"src": -1, "dst": 1}),
                          "p2p src and dst must be ranks"),
    "p2p unknown key": (lambda x: x["collectives"][0].__setitem__("p2p", {"src": 0, "peer": 1}),
                        "not a valid Lagom workload"),
}


@pytest.fixture(scope="module")
def workload_dict(tmp_path_factory):
    path = tmp_path_factory.mktemp("w") / "w.json"
    save_workload(generate_workload("tp:phi2:tp=8,dp=1"), path)
    return json.loads(path.read_text())


@pytest.mark.parametrize("case", sorted(MUTATIONS))
def test_inconsistent_workload_file_is_one_line_error(case, workload_dict, tmp_path, capsys):
    mutate, message = MUTATIONS[case]
    data = json.loads(json.dumps(workload_dict))
    mutate(data)
    path = tmp_path / "w.json"
    path.write_text(json.dumps(data))
    with pytest.raises(LagomError, match="not a valid Lagom workload") as info:
        load_workload(path)
    assert message in str(info.value) and str(path) in str(info.value)
    assert main(["simulate", str(path), "--cluster", "low-bw", "--noise", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


def test_every_generated_and_read_workload_is_consistent():
    """The checks refuse nothing Lagom itself produces."""
    for spec in PAPER_WORKLOADS:
        assert workload_problem(generate_workload(spec)) is None, spec
    for path in all_test_traces():
        for w in read_trace(path):
            assert workload_problem(w) is None, path.name


def _two_streams(deps: list[tuple[int, int]]) -> Workload:
    """Ops 0-4 on stream 1 and 10-14 on stream 2, each stream in list order, and ``deps``."""
    ops = [ComputeOp(i, f"k{i}", 1 if i < 10 else 2, float(i), 1.0) for i in (*range(5), *range(10, 15))]
    return Workload(0, 1, streams=[Stream(1, StreamKind.COMPUTE), Stream(2, StreamKind.COMPUTE)], compute_ops=ops,
                    dependencies=[Dependency(a, b) for a, b in deps])


@pytest.mark.parametrize(("deps", "stuck"), [
    ([(3, 1)], "ops 1, 2, 3, 4 can"),  # back along its own stream: a cycle through the stream's order alone
    ([(3, 11), (13, 1)], "ops 1, 2, 3, 4, 11, ... can"),  # across both streams, through ops no dependency names
    ([(1, 3), (3, 12), (11, 4)], None),  # forward along a stream and across: no cycle
])
def test_a_cycle_through_stream_order_is_found_and_named(deps, stuck):
    """The cycle check looks at the dependencies' ends first (a cycle passes through one): a cycle
    closed by the streams' order between them is still one, and the ops named are every op stuck."""
    problem = workload_problem(_two_streams(deps))
    if stuck is None:
        assert problem is None
    else:
        assert problem is not None and "form a cycle" in problem and stuck in problem
