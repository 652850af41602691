"""Every config value is checked where it is read, by one validator (lagom.files.tuned_config.parse_tuned_config).

Its env rules (nccl_env/env_values.py) must take everything Lagom itself delivers on every
NCCL version, and refuse what NCCL would ignore with a warning in its debug log; the same
file is refused the same way by every command that reads it (the matrix has the rows).
"""

from __future__ import annotations

import pytest
import yaml

from costmodel.cluster import load_cluster
from lagom.files.tuned_config import parse_tuned_config
from nccl_env.delivery import deliver
from nccl_env.env_values import validate_env
from nccl_env.errors import LagomError
from nccl_env.knobs import Algorithm, CollectiveType, CommConfig, Protocol
from nccl_env.plan import Plan, Signature
from nccl_env.rules import NcclVersion

V = NcclVersion.parse
VERSIONS = ["2.17.1", "2.18.3", "2.21.5", "2.24.3", "2.25.1", "2.30.3"]


def _plan() -> Plan:
    ag, rs, ar = CollectiveType.ALLGATHER, CollectiveType.REDUCESCATTER, CollectiveType.ALLREDUCE
    return Plan({
        Signature("0", ag, 1 << 20, 8, 1): CommConfig(Algorithm.RING, Protocol.SIMPLE, 2, 256, 700416),
        Signature("0", rs, 4 << 20, 8, 1): CommConfig(Algorithm.RING, Protocol.LL128, 4, 640, None),
        Signature("1", ar, 64 << 20, 16, 2): CommConfig(Algorithm.TREE, Protocol.LL, 8, 512, 1398784),
        Signature("1", CollectiveType.ALLTOALL, 8 << 20, 16, 2): CommConfig(chunk_bytes=1 << 20),
    })


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("use_plugin", [True, False])
def test_what_lagom_delivers_passes_its_own_validator(version, use_plugin):
    delivery = deliver(_plan(), V(version), use_plugin=use_plugin)
    assert delivery.env  # threads at least: something is checked
    validate_env(delivery.env, V(version))
    doc = {"format": "lagom.tuned-config", "version": 1, "nccl_version": version, "env": delivery.env,
           "process_groups": delivery.group_configs}
    parse_tuned_config(yaml.safe_load(yaml.safe_dump(doc)), "t.yaml")


@pytest.mark.parametrize("env, version, message", [
    ({"NCCL_NTHREADS": "lots"}, "2.18.3", r"NCCL_NTHREADS='lots' .*multiple of 32 in 64-512"),
    ({"NCCL_NTHREADS": "96.0"}, "2.18.3", r"NCCL_NTHREADS='96.0'"),
    ({"NCCL_NTHREADS": 100}, "2.18.3", r"NCCL_NTHREADS='100'"),
    ({"NCCL_LL128_NTHREADS": "128"}, "2.18.3", r"NCCL_LL128_NTHREADS='128' .*160-640"),
    ({"NCCL_BUFFSIZE": "-1"}, "2.18.3", r"NCCL_BUFFSIZE='-1' .*whole number of bytes"),
    ({"NCCL_P2P_NET_CHUNKSIZE": "0"}, "2.18.3", r"NCCL_P2P_NET_CHUNKSIZE='0'"),
    ({"NCCL_MIN_CTAS": "64"}, "2.24.3", r"NCCL_MIN_CTAS='64' .*1-32"),
    ({"NCCL_ALGO": "allreduce:tree"}, "2.18.3", r"per-function 'FUNC:' syntax needs NCCL 2.24"),
    ({"NCCL_ALGO": "pat"}, "2.22.3", r"NCCL_ALGO='pat' is not valid on NCCL 2.22.3"),
    ({"NCCL_ALGO": "sendrecv:ring"}, "2.24.3", r"FUNC one of"),
    ({"NCCL_PROTO": "LL,Fast"}, "2.24.3", r"NCCL_PROTO='LL,Fast'"),
    ({"NCCL_NTHREADS": [256]}, "2.18.3", r"env NCCL_NTHREADS: expected a single value"),
])
def test_values_nccl_would_ignore_are_refused(env, version, message):
    with pytest.raises(LagomError, match=message):
        validate_env(env, V(version))


def test_values_nccl_takes_pass():
    validate_env({"NCCL_NTHREADS": "64", "NCCL_LL128_NTHREADS": 640, "NCCL_ALGO": "^nvls", "NCCL_PROTO": "ll128,simple",
                  "NCCL_MAX_NCHANNELS": "64", "NCCL_DEBUG": "INFO"}, V("2.25.1"))
    validate_env({"NCCL_ALGO": "ring;allreduce:tree,ring;allgather:^nvls"}, V("2.24.3"))


def test_a_misspelled_key_gets_the_closest_one_in_a_tuned_file_and_a_cluster_file(tmp_path):
    with pytest.raises(LagomError, match=r"t.yaml: unknown key 'proces_groups' \(did you mean 'process_groups'\?\)"):
        parse_tuned_config({"format": "lagom.tuned-config", "version": 1, "proces_groups": {}}, "t.yaml")
    cluster = load_cluster("low-bw").to_dict()
    cluster["gpus_per_nod"] = cluster.pop("gpus_per_node")
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cluster))
    with pytest.raises(LagomError, match=r"c.yaml: unknown key 'gpus_per_nod' \(did you mean 'gpus_per_node'\?\)"):
        load_cluster(path)


def test_the_version_in_force_decides(tmp_path):
    doc = {"format": "lagom.tuned-config", "version": 1, "nccl_version": "2.30.3",
           "collectives": [{"match": {"collective": "allgather"}, "set": {"channels": 48}}]}
    parse_tuned_config(doc, "t.yaml")  # 64 channels from 2.25
    with pytest.raises(LagomError, match=r"collectives\[0\]: channels=48 is not valid on NCCL 2.18.3: allowed 1-32"):
        parse_tuned_config(doc, "t.yaml", V("2.18.3"))  # e.g. simulated on a 2.18.3 cluster
