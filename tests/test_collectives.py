"""02_collectives: the command builder, the hang diagnosis, the image copy the step records, and
real sweeps on the lab."""

import json
from pathlib import Path
from types import SimpleNamespace


from sparkbook.collectives import sweep as collectives
from sparkbook import notebook
from sparkbook.record import report
from sparkbook.distribution.image import ImageOutcome, Transfer
from sparkbook.params import load
from sparkbook.nodes.remote import Cluster
from sparkbook.steps import collectives as step

ROOT = Path(__file__).resolve().parents[1]
LAB = ROOT / "parameters" / "lab.yaml"


def test_command_for_the_spark_pair_uses_nccl_on_the_fabric():
    p = load(ROOT / "parameters" / "dgx-spark-pair.yaml")
    worker = p.nodes[1]
    cmd = collectives.command(p, worker)
    assert collectives.backend(p) == "nccl"
    assert ["--gpus", "all"] == cmd[cmd.index("--gpus"):cmd.index("--gpus") + 2]
    assert "/dev/infiniband" in cmd and "IPC_LOCK" in cmd
    assert "NCCL_IB_HCA=rocep1s0f1,roceP2p1s0f1" in cmd and "NCCL_SOCKET_IFNAME=enp1s0f1np1" in cmd
    assert "--master-addr=192.168.100.10" in cmd and "--node-rank=1" in cmd and "--nproc-per-node=1" in cmd
    assert cmd[cmd.index("--backend") + 1] == "nccl" and "NCCL_DEBUG=INFO" in cmd


def test_the_sweeps_container_is_the_deployments_and_sees_only_its_script():
    """Named after the deployment (a second deployment's sweep on the same nodes is another
    container) and labelled with it; the script from the private working folder, read-only."""
    p = load(ROOT / "parameters" / "dgx-spark-pair.yaml")
    cmd = collectives.command(p, p.head)
    script = "/tmp/sparkbook-nvidia/dgx-spark-pair/allreduce.py"
    assert cmd[cmd.index("--name") + 1] == "sparkbook-dgx-spark-pair-collectives"
    assert "sparkbook=dgx-spark-pair" in cmd and script in cmd
    assert [cmd[i + 1] for i, a in enumerate(cmd) if a == "-v"] == [f"{script}:{script}:ro"]


def test_lab_uses_gloo_without_gpu_or_rdma_flags():
    p = load(LAB)
    cmd = collectives.command(p, p.nodes[0])
    assert collectives.backend(p) == "gloo" and "--gpus" not in cmd and "/dev/infiniband" not in cmd
    assert cmd[cmd.index("--sizes") + 1] == ",".join(str(2**20 * 2**i) for i in range(6))
    assert cmd[cmd.index("--latency-sizes") + 1] == ",".join(str(2**i) for i in range(3, 17))


def test_last_phase_and_diagnosis():
    p = load(LAB)
    assert collectives.last_phase("") == "rendezvous"
    assert collectives.last_phase("PHASE started rank=0\nPHASE init-done rank=0\n") == "init-done"
    out = collectives.Sweep("gloo", phases={"spark-1": "rendezvous", "spark-2": "not started"},
                              logs={"spark-1": "", "spark-2": ""})
    phase, cause = collectives.diagnose(p, out)
    assert phase == "rendezvous" and "spark-1, spark-2" in cause and "10.77.1.11:29502" in cause
    out.phases = {"spark-1": "started", "spark-2": "started"}
    assert collectives.diagnose(p, out)[0] == "communicator init"
    out.phases = {"spark-1": "first-collective", "spark-2": "done"}
    phase, cause = collectives.diagnose(p, out)
    assert phase == "first collective" and "MTU" in cause


def test_a_sweep_that_stopped_fails_where_and_a_container_left_fails_the_cleanup():
    p = load(LAB)
    out = collectives.Sweep("gloo", phases={"spark-1": "started", "spark-2": "started"},
                            logs={"spark-1": "", "spark-2": ""}, timed_out=True, duration_s=300,
                            left_running=["spark-2"])
    found = {c.check: c for c in collectives.checks(p, out)}
    assert [(c.check, c.status) for c in found.values()] == [("cleanup", "FAIL"), ("all-reduce", "FAIL")]
    assert found["all-reduce"].observed.startswith("no result after 300 s (time limit reached); stuck in: "
                                                   "communicator init")
    assert found["cleanup"].node == "spark-2" and found["cleanup"].remedy.startswith("docker rm -f ")


def test_sweep_on_the_lab_through_the_notebook(full_run):
    """Both sweeps in one run of 02 (the README's runbook on the lab, tests/conftest.py's
    ``full_run``, whose collectives settings are parameters/lab.yaml's): small messages (8 B-64 KiB,
    reported, not judged: the lab sets no latency bar) then bandwidth, judged at its plateau."""
    out, summary = full_run
    assert {s["name"]: s["status"] for s in summary["steps"]}["02_collectives"] == "passed", summary
    data = json.loads((out / "collectives.json").read_text())
    rows, small = data["result"]["rows"], data["result"]["latency"]
    assert data["backend"] == "gloo" and data["result"]["world_size"] == 2
    assert [r["bytes"] for r in rows] == [2**20 * 2**i for i in range(6)]
    assert [r["bytes"] for r in small] == [2**i for i in range(3, 17)]
    assert all(r["correct"] and r["busbw_gbs"] > 0 and r["time_us"] > 0 for r in rows + small)
    assert (out / "collectives.csv").read_text().startswith("bytes,time_us,algbw_gbs,busbw_gbs,correct")
    assert (out / "collectives_latency.csv").read_text().startswith("bytes,time_us,algbw_gbs,busbw_gbs,correct")
    assert (out / "collectives.png").stat().st_size > 10_000
    assert (out / "collectives_latency.png").stat().st_size > 10_000
    verdict = json.loads((out / "verdicts" / "02_collectives.json").read_text())
    checks = {c["check"]: (c["status"], c["observed"]) for c in verdict["checks"]}
    assert checks["bus bandwidth"][0] == "PASS" and checks["bus bandwidth"][1].startswith("plateau ")
    assert checks["small-message latency"][0] == "SKIP" and " µs per all-reduce" in checks["small-message latency"][1]
    assert (out / "logs" / "spark-2" / "collectives.log").read_text().count("PHASE") >= 5


def test_a_rank_that_never_joins_fails_within_the_limit_and_leaves_nothing(lab, tmp_path):
    p = load(LAB)
    p = p.model_copy(update={"collectives": p.collectives.model_copy(update={"timeout_s": 20})})
    cluster = Cluster.from_params(p)
    out = collectives.run(p, cluster, tmp_path, omit=("spark-2",), say=lambda *_: None)
    assert out.timed_out and out.result is None and out.duration_s < 40
    fail = [c for c in collectives.checks(p, out) if c.status == "FAIL"][0]
    assert fail.check == "all-reduce" and "stuck in: rendezvous" in fail.observed
    assert "spark-2" in fail.remedy and "never joined" in fail.remedy
    assert (tmp_path / "logs" / "spark-1" / "collectives.log").exists()
    assert "no container on spark-2" in (tmp_path / "logs" / "spark-2" / "collectives.log").read_text()
    assert out.left_running == []
    left = cluster.run("docker ps -aq --filter name=sparkbook-lab-collectives; pgrep -f '[t]orchrun|[a]llreduce' || true")
    assert all(r.ok and r.stdout.strip() == "" for r in left.values()), {n: r.stdout for n, r in left.items()}


def test_verdict_on_a_real_two_gpu_run_reads_the_transport_from_the_channels():
    """Two H200 of one host, run as two torchrun 'nodes' (tests/fixtures/nccl-p2p-h200x2-1.txt):
    NCCL printed 'Using network Socket' but moved everything over P2P: no socket-fallback FAIL."""
    from sparkbook.facts.parsers import parse_nccl_log
    p = load(ROOT / "parameters" / "dgx-spark-pair.yaml")
    log = (Path(__file__).parent / "fixtures" / "nccl-p2p-h200x2-1.txt").read_text()
    rows = [{"bytes": 2**30, "time_us": 3352.8, "algbw_gbs": 320.25, "busbw_gbs": 320.25, "correct": True}]
    small = [{"bytes": 8, "time_us": 21.0, "algbw_gbs": 0.0, "busbw_gbs": 0.0, "correct": True}]
    out = collectives.Sweep("nccl", result={"world_size": 2, "rows": rows, "latency": small},
                              nccl={n.name: parse_nccl_log(log) for n in p.nodes},
                              phases={n.name: "done" for n in p.nodes})
    checks = collectives.checks(p, out)
    transport = [c for c in checks if c.check == "transport"]
    assert [c.status for c in transport] == ["PASS", "PASS"] and "P2P/CUMEM" in transport[0].observed
    assert {c.status for c in checks} == {"PASS"}
    socket = parse_nccl_log((Path(__file__).parent / "fixtures" / "nccl-socket-2.txt").read_text())
    out.nccl = {n.name: socket for n in p.nodes}
    assert [c.status for c in collectives.checks(p, out) if c.check == "transport"] == ["FAIL", "FAIL"]


def image_copy(p, copied: bool) -> ImageOutcome:
    """What 02 recorded of the image: the worker lacked it and got 4.12 GB of it, or held it."""
    head, worker = p.head.name, p.workers[0].name
    ids = {head: "sha256:" + "1" * 64, worker: "sha256:" + "1" * 64}
    return ImageOutcome(p.runtime.image, "head", head, ids[head], before={head: ids[head], worker: None},
                        after=ids, transfers=[Transfer(worker, "layer-skipping stream", sent=4_200_000_000,
                                                       wire=4_120_000_000, seconds=63.4)] if copied else [])


def test_the_image_copy_before_the_sweep_is_in_the_verdict_and_the_key_numbers(tmp_path):
    p = load(LAB)
    rows = [{"bytes": 2**25, "time_us": 900.0, "algbw_gbs": 37.3, "busbw_gbs": 37.28, "correct": True}]
    sweep = collectives.Sweep("gloo", result={"world_size": 2, "rows": rows},
                              phases={n.name: "done" for n in p.nodes}, duration_s=12)
    ctx = notebook.Context(p, "test", tmp_path, step)
    outcome = step.CollectivesOutcome(image_copy(p, copied=True), sweep)
    verdict = ctx.verdict(outcome)
    ctx.conclude(outcome)
    first = verdict.checks[0]
    assert (first.check, first.node, first.status) == ("serving image on every node", "all", "PASS")
    assert first.observed == "copied 4.12 GB to spark-2 in 63 s"
    assert verdict.title == "02 collectives" and verdict.status == "PASS"
    assert report.key_numbers(tmp_path) == [
        ("all-reduce bus bandwidth", "37.28 GB/s at 32 MiB, the plateau (gloo)"),
        ("image copied for the sweep", "spark-2: 4.12 GB in 63 s")]
    data = json.loads((tmp_path / "collectives.json").read_text())
    assert data["result"]["rows"] == rows and data["image"]["transfers"][0]["wire"] == 4_120_000_000
    assert (tmp_path / "collectives.csv").read_text().startswith("bytes,time_us,algbw_gbs,busbw_gbs,correct")

    held = step.checks(p, step.CollectivesOutcome(image_copy(p, copied=False), sweep))[0]
    assert held.observed == "already on every node"
    sweep.result["latency"] = [{"bytes": 8, "time_us": 812.5, "algbw_gbs": 0.0, "busbw_gbs": 0.0, "correct": True}]
    assert step.CollectivesOutcome(image_copy(p, copied=False), sweep).key_numbers() == [
        ("all-reduce bus bandwidth", "37.28 GB/s at 32 MiB, the plateau (gloo)"),
        ("all-reduce small-message latency", "812.5 µs (gloo)")]


def test_a_failed_image_copy_fails_02_and_the_sweep_does_not_run(tmp_path):
    p = load(LAB)
    image = image_copy(p, copied=True)
    image.after["spark-2"] = None
    image.errors["spark-2"] = "the stream ended without a result: exit code 255: Connection refused"
    image.transfers[0].error = image.errors["spark-2"]
    outcome = step.run(SimpleNamespace(params=p), image=image)  # nothing reaches a node
    assert outcome.sweep is None
    checks = step.checks(p, outcome)
    assert [(c.check, c.node, c.status) for c in checks] == [
        ("image ID", "spark-2", "FAIL"), ("all-reduce", "all", "SKIP")]
    assert "Connection refused" in checks[0].observed and "01_preflight" in checks[0].remedy
    outcome.save(tmp_path)
    assert json.loads((tmp_path / "collectives.json").read_text())["result"] is None
    assert not (tmp_path / "collectives.csv").exists() and step.table(outcome).rows == []
