"""01's parity table: what must match on every node, side by side, each difference marked; the
verdict's `same *` rows judge them (a planted driver and UID difference, issue 28)."""

from sparkbook import preflight
from sparkbook.book.verdict import PASS, WARN
from sparkbook.preflight import Preflight
from sparkbook.preflight.parity import FACTS, rows
from test_remedies import bare, facts, params_with


def node(**kw):
    r = bare()
    r["facts"] = facts(**{"bios": "5.36_0ACUM018", "user": "nvidia", "uid": "1000", "gid": "1000", **kw})
    r["smi"] = {"driver": kw.get("driver", "580.95.05"), "cuda": "13.0", "gpus": [], "processes": []}
    r["image"], r["model"] = "sha256:" + "ab" * 32, {"config.json": {"size": 5, "sha256": "0" * 64}}
    return r


def test_a_planted_driver_and_uid_difference_are_marked_and_warned_and_the_rest_is_same():
    params = params_with()
    pf = Preflight({"spark-1": node(), "spark-2": node(driver="575.57.08", uid="1001")}, {}, {})
    table = {r["fact"]: r for r in rows(params, pf)}
    assert list(table) == list(FACTS)
    assert {f for f, r in table.items() if r["parity"] == "DIFFERS"} == {"driver", "UID:GID"}
    assert (table["UID:GID"]["spark-1"], table["UID:GID"]["spark-2"]) == ("1000:1000", "1001:1000")
    assert table["driver"]["spark-2"] == "575.57.08" and "NVIDIA/nccl#447" in table["driver"]["a mismatch"]
    assert "NVIDIA/nccl#354" in table["image (NCCL with it)"]["a mismatch"]
    judged = {c.check: c for c in preflight.checks(params, pf) if c.check.startswith("same ")}
    assert judged["same driver"].status == WARN and judged["same user"].status == WARN
    assert "nvidia (1000:1000)" in judged["same user"].observed and "nvidia (1001:1000)" in judged["same user"].observed
    assert "same UID and GID" in judged["same user"].remedy
    for same in ("same os", "same kernel", "same bios", "same docker", "same cuda"):
        assert judged[same].status == PASS, judged[same]
    # a node that does not show a fact (an older script, a tool missing) is left out, not a difference
    quiet = node()
    quiet["facts"]["bios"] = None
    pf = Preflight({"spark-1": node(), "spark-2": quiet}, {}, {})
    assert {r["fact"]: r["parity"] for r in rows(params, pf)}["BIOS"] == "same"
