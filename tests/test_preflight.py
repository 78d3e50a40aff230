"""Preflight on the lab: healthy passes; each fault fails the right check on the right node, with a
remedy; a healed lab passes again. Plus the model manifest, offline."""

from pathlib import Path

import pytest

from sparkbook import preflight
from sparkbook.cli import main
from sparkbook.lab import faults
from sparkbook.remote import Cluster

ROOT = Path(__file__).resolve().parents[1]
LAB = ROOT / "parameters" / "lab.yaml"


def failures(params):
    verdict, _ = preflight.run(params, Cluster.from_params(params))
    return {(c.check, c.node): c for c in verdict.failures}


def test_healthy_lab_passes_from_the_cli(lab, capsys):
    assert main(["preflight", "-p", str(LAB)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("01 preflight: WARN") or out.startswith("01 preflight: PASS")
    assert "path mtu" in out and "FAIL" not in out


# fault -> the checks that must fail, on the node the fault hits
EXPECTED = {
    # the peers' path-MTU pings towards the broken node fail too: both directions are checked
    "node-down": {("ssh", "spark-2"), ("ssh head→worker", "spark-2"), ("path mtu", "spark-1")},
    "mtu": {("rail mtu", "spark-2"), ("path mtu", "spark-2"), ("path mtu", "spark-1")},
    "rail-down": {("rail map", "spark-2"), ("rail port", "spark-2"), ("rail rate", "spark-2"),
                  ("path mtu", "spark-2"), ("path mtu", "spark-1")},
    "docker-down": {("docker", "spark-2")},
    "port-busy": {("ports free", "spark-1")},
    "image-drift": {("image", "spark-2")},
    "model-drift": {("model", "spark-2")},
}


@pytest.mark.parametrize("kind", sorted(EXPECTED))
def test_fault_fails_the_right_check_on_the_right_node(lab, params, kind):
    faults.apply(lab, kind)
    try:
        failed = failures(params)
    finally:
        faults.heal(lab, kind)
    assert EXPECTED[kind] <= set(failed), f"{kind}: failed {sorted(failed)}"
    unexpected = {k for k in failed if k not in EXPECTED[kind]}
    assert not unexpected, f"{kind} also failed {sorted(unexpected)}"
    for c in failed.values():
        assert c.remedy, f"{c.check} on {c.node} has no remedy"
    if kind == "port-busy":
        assert str(params.ports.api) in failed[("ports free", "spark-1")].observed
    if kind == "model-drift":
        assert "config.json" in failed[("model", "spark-2")].observed
    assert failures(params) == {}, f"the lab still fails after healing {kind}"


def test_cli_exits_1_and_names_the_remedy(lab, capsys):
    faults.apply(lab, "mtu")
    try:
        assert main(["preflight", "-p", str(LAB)]) == 1
    finally:
        faults.heal(lab, "mtu")
    out = capsys.readouterr().out
    assert "FAIL rail mtu on spark-2: enp1s0f1np1: mtu 1500" in out and "ip link set" in out
