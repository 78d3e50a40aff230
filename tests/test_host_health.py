"""Host health in preflight (issue 17): driver and firmware alike and in range, GPU clocks held down
by power or heat (`nvidia-smi -q`), swap in use before the launch.
Parsers on real GB10 / DGX Spark outputs (the sources are named at each sample), each check failing
and passing, the lab's simulated `nvidia-smi -q`, and the `throttle` fault caught on the lab."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from sparkbook import preflight
from sparkbook.lab import faults, simhw
from sparkbook.params import ParamsError, validate
from sparkbook.preflight import host
from sparkbook.preflight.collect import Preflight, node_bundle, parse
from sparkbook.preflight.host_state import parse_host_state, parse_nvidia_smi_q
from sparkbook.nodes.remote import Cluster
from sparkbook.book.verdict import FAIL, PASS, SKIP, WARN

ROOT = Path(__file__).resolve().parents[1]
LAB = ROOT / "parameters" / "lab.yaml"
FIXTURES = Path(__file__).resolve().parent / "fixtures"
HEALTHY = {"Idle": True, **{r: False for r in simhw.REASONS if r != "Idle"}}


def fixture(name: str) -> str:
    lines = (FIXTURES / name).read_text().splitlines(keepends=True)
    assert lines[0].startswith("# source:"), f"{name}: first line must name the source"
    return "".join(lines[2:])


def params_with(**changes):
    """parameters/lab.yaml with some sections changed: {"expectations": {...}, "runtime": {...}}."""
    data = yaml.safe_load(LAB.read_text())
    for section, values in changes.items():
        data[section].update(values)
    return validate(data)


# source: https://github.com/ollama/ollama/issues/13552 (GB10, driver 580.95.05), tests/fixtures
GB10_Q = fixture("nvidia-smi-q-gb10-1.txt")
# source: https://github.com/NVIDIA/nvidia-docker/issues/1090 (issue text, an older driver's
# `nvidia-smi -q`: the section is still called "Clocks Throttle Reasons", two reasons N/A); excerpt
OLD_Q = """GPU 00000000:01:00.0
    Performance State               : P8
    Clocks Throttle Reasons
        Idle                        : Not Active
        Applications Clocks Setting : Not Active
        SW Power Cap                : Not Active
        HW Slowdown                 : Not Active
            HW Thermal Slowdown     : N/A
            HW Power Brake Slowdown : N/A
        Sync Boost                  : Not Active
        SW Thermal Slowdown         : Not Active
        Display Clock Setting       : Not Active
    FB Memory Usage
        Total                       : 4046 MiB
"""
# source: https://github.com/isc-projects/ethq/issues/8 (issue text, "ethtool -i output"): `ethtool -i`
# of a ConnectX-4 Lx port (mlx5_core, the driver of the Spark's ConnectX-7); verbatim
MLX5_ETHTOOL_I = """driver: mlx5_core
version: 3.0-1 (January 2015)
firmware-version: 14.23.1020
expansion-rom-version:
bus-info: 0000:af:00.0
supports-statistics: yes
supports-test: no
supports-eeprom-access: no
supports-register-dump: no
supports-priv-flags: no
"""
# ibv_devinfo on a DGX Spark (fw_ver 28.45.4028, board_id NVD0000000087), tested in place
SPARK_IBV_DEVINFO = ROOT.parent / "shared" / "field-samples" / "ibv_devinfo-1.txt"


# ------------------------------------------------------------------------------------- parsers

def test_a_real_gb10_nvidia_smi_q():
    [gpu] = parse_nvidia_smi_q(GB10_Q)
    assert gpu["bus_id"] == "0000000F:01:00.0" and gpu["pstate"] == "P0"
    # every reason Not Active; the counters below them (same names, in microseconds) are not reasons
    assert gpu["reasons"] == {r: False for r in simhw.REASONS}
    assert gpu["clocks"] == {} and gpu["max_clocks"] == {}  # this excerpt has no clocks


def test_the_older_throttle_reasons_section_and_na_reasons():
    [gpu] = parse_nvidia_smi_q(OLD_Q)
    assert gpu["pstate"] == "P8" and "HW Thermal Slowdown" not in gpu["reasons"]
    assert gpu["reasons"]["SW Power Cap"] is False and len(gpu["reasons"]) == 7


def test_the_lab_nvidia_smi_q_is_read_by_the_parser(monkeypatch):
    """The replayed nvidia-smi -q as the parser reads it: idle with no GPU process (this machine's
    own processes are the lab node's, so which there are is set here: a lab serving meanwhile
    would otherwise make the GPU busy), busy with one, throttled by the fault."""
    state = {"node": "spark-2", "gpu": {"name": "NVIDIA GB10", "count": 1, "driver": "580.95.05",
                                        "cuda": "13.0", "bus_id": "0000000F:01:00.0"}}
    monkeypatch.setattr(simhw, "gpu_processes", lambda: [])
    [gpu] = parse_nvidia_smi_q(simhw.smi_query(state))
    assert gpu["reasons"] == HEALTHY and gpu["clocks"]["SM"] == 2418 and gpu["max_clocks"]["SM"] == 3003
    monkeypatch.setattr(simhw, "gpu_processes", lambda: [{"pid": 7, "name": "VLLM::Worker", "mib": 900}])
    [gpu] = parse_nvidia_smi_q(simhw.smi_query(state))
    assert gpu["reasons"] == {**HEALTHY, "Idle": False}
    [gpu] = parse_nvidia_smi_q(simhw.smi_query({**state, "throttle": faults.THROTTLE}))
    assert {r for r, on in gpu["reasons"].items() if on} == {"HW Slowdown", "HW Power Brake Slowdown"}
    assert gpu["clocks"]["Graphics"] == 513


def test_the_host_sections_of_a_spark_report():
    # newer mlx5 firmware follows the version with the board's PSID in parentheses (a Spark's:
    # NVD0000000087, the board_id of the field sample above): the version is the first word
    with_psid = MLX5_ETHTOOL_I.replace("14.23.1020", "28.45.4028 (NVD0000000087)")
    stdout = "\n".join(["@@ smi", "nvidia-smi unavailable", "@@ host", "@@ smi-q", GB10_Q,
                        "@@ memlock", "unlimited unlimited", "@@ swap", "SwapTotal:      16777212 kB", "SwapFree:       16777212 kB",
                        "@@ ethtool-i enp1s0f1np1", MLX5_ETHTOOL_I, "@@ ethtool-i enP2p1s0f1np1", with_psid])
    state = parse(stdout)["host"]
    assert state["firmware"] == {"enp1s0f1np1": "14.23.1020", "enP2p1s0f1np1": "28.45.4028"}
    assert state["memlock"] == {"soft": "unlimited", "hard": "unlimited"}
    assert state["swap_kb"] == {"total": 16777212, "free": 16777212} and len(state["gpus"]) == 1
    assert parse_host_state({"memlock": "64 64", "smi-q": "nvidia-smi unavailable"})["gpus"] is None
    assert parse("@@ smi\nnvidia-smi unavailable\n")["host"] is None  # a report without the section: no host rows


def test_each_node_runs_host_state_with_its_rails():
    params = params_with()
    for node in params.nodes:
        part = dict(node_bundle(params, node).parts)["host"]
        assert part.name == "host_state.sh" and part.args == ("enp1s0f1np1", "enP2p1s0f1np1")


# ----------------------------------------------------------------------------- checks, no lab

def report(driver="580.95.05", firmware="28.45.4028", reasons=(), mhz=2418, memlock="unlimited",
           swap=(16 << 20, 16 << 20)):
    """One node's report as collect.parse makes it, with the host facts these checks read."""
    gpu = {"bus_id": "0000000F:01:00.0", "pstate": "P0", "reasons": {**HEALTHY, **{r: True for r in reasons}},
           "clocks": {"Graphics": mhz, "SM": mhz}, "max_clocks": {"Graphics": 3003, "SM": 3003}}
    return {"facts": {"driver": driver}, "ibstat": None, "ibv_devinfo": None,
            "host": {"gpus": [gpu], "memlock": {"soft": memlock, "hard": memlock},
                     "swap_kb": {"total": swap[0], "free": swap[1]},
                     "firmware": {"enp1s0f1np1": firmware, "enP2p1s0f1np1": firmware}}}


def rows(params, first=None, second=None):
    pf = Preflight({"spark-1": first or report(), "spark-2": second or report()}, {},
                   {"spark-1": "head", "spark-2": "worker"})
    return {(c.check, c.node): c for c in host.health(params, pf)}


def test_healthy_hosts_pass():
    got = rows(params_with(expectations={"driver": ">=580.95", "firmware": ">=28.45,<29"}))
    assert {k: c.status for k, c in got.items() if c.status != PASS} == {}
    assert got[("same driver", "all")].observed == "spark-1: 580.95.05 / spark-2: 580.95.05"
    assert got[("gpu clocks", "spark-1")].observed.startswith("P0, Graphics 2418 MHz of 3003")
    assert got[("firmware", "spark-2")].observed == "28.45.4028"


# Drivers differ across one cluster: 580.142 on two DGX Spark FEs, 580.159.03 on two GX10s of the
# same TP4 deployment, firmware "not collected" (https://github.com/tonyd2wild/DeepSeek-V4.1-Flash-vLLM-DGX-Spark/issues/1,
# "Setup"); an image built for driver 590.48 refused 580.159.03, the fix being the DGX OS update
# (https://github.com/eugr/spark-vllm-docker/issues/266, citing the DGX Spark release notes: 580.142);
# firmware left behind: a BIOS older than 2026-04 wires the second CX-7 controller at PCIe Gen5 x2
# until `fwupdmgr` updates it (https://github.com/tonyd2wild/DeepSeek-v4-Flash-Vision-Exp-DSpark-1M-NVFP4-KV-2x-DGX-Spark/pull/35).
def test_driver_and_firmware_differ_or_fall_outside_the_range():
    params = params_with(expectations={"driver": ">=580.95", "firmware": ">=28.45"})
    got = rows(params, report(), report(driver="580.82.09", firmware="28.39.1002"))
    assert got[("same driver", "all")].status == WARN and "apt full-upgrade" in got[("same driver", "all")].remedy
    assert got[("same firmware", "all")].status == WARN
    assert got[("driver", "spark-1")].status == PASS and got[("firmware", "spark-1")].status == PASS
    c = got[("driver", "spark-2")]
    assert (c.status, c.observed) == (FAIL, "580.82.09 outside >=580.95") and "reboot" in c.remedy
    assert got[("firmware", "spark-2")].status == FAIL and "fwupdmgr" in got[("firmware", "spark-2")].remedy


def test_a_version_that_does_not_parse_fails_naming_it():
    got = rows(params_with(expectations={"driver": ">=580.95"}), second=report(driver="N/A"))
    c = got[("driver", "spark-2")]
    assert c.status == FAIL and "N/A is not a version" in c.observed and "nvidia-smi" in c.remedy


def test_without_a_range_only_sameness_is_judged():
    got = rows(params_with(), second=report(driver="590.44.01"))
    assert ("driver", "spark-2") not in got and got[("same driver", "all")].status == WARN


def test_a_real_spark_firmware_read_from_ibv_devinfo_is_within_the_spark_range():
    """Without ethtool, the rails' HCAs in ibv_devinfo give the firmware: a real Spark's, tested in
    place (../shared/field-samples), within the range parameters/dgx-spark-pair.yaml sets."""
    if not SPARK_IBV_DEVINFO.exists():
        pytest.skip(f"field sample absent: {SPARK_IBV_DEVINFO}")
    from sparkbook.facts.parsers import parse_ibv_devinfo
    devices = parse_ibv_devinfo("".join(SPARK_IBV_DEVINFO.read_text().splitlines(keepends=True)[2:]))
    params = params_with(expectations={"firmware": yaml.safe_load(
        (ROOT / "parameters" / "dgx-spark-pair.yaml").read_text())["expectations"]["firmware"]})
    second = report()
    second["host"]["firmware"], second["ibv_devinfo"] = {}, devices
    assert host.firmware_of(params.nodes[1], second) == ["28.45.4028"]
    got = rows(params, second=second)
    assert got[("firmware", "spark-2")].status == PASS and got[("same firmware", "all")].status == PASS


@pytest.mark.parametrize("name", ["dgx-spark-pair.yaml", "dgx-spark-quad.yaml"])
def test_the_spark_ranges_pass_every_driver_sparks_report_and_fail_an_older_one(name):
    """The drivers of the nvidia-smi field samples (Sparks and GB10 OEM boxes, 580.82.09 to
    580.159.03, tested in place) are within the Spark parameters' range; a pre-release 575 is not."""
    import re
    samples = sorted((ROOT.parent / "shared" / "field-samples").glob("nvidia-smi-[0-9]*.txt"))
    if not samples:
        pytest.skip("field samples absent: ../shared/field-samples/nvidia-smi-*.txt")
    e = yaml.safe_load((ROOT / "parameters" / name).read_text())["expectations"]
    params = params_with(expectations={"driver": e["driver"], "firmware": e["firmware"]})
    drivers = {m for f in samples for m in re.findall(r"Driver Version: (\S+)", f.read_text())}
    assert {"580.82.09", "580.159.03"} <= drivers
    for v in drivers:
        assert rows(params, second=report(driver=v))[("driver", "spark-2")].status == PASS, v
    assert rows(params, second=report(driver="575.51.02"))[("driver", "spark-2")].status == FAIL


def test_firmware_falls_back_to_ibstat():
    second = report()
    second["host"]["firmware"] = {}
    second["ibstat"] = {"rocep1s0f1": {"firmware": "28.45.4028", "ports": {}},
                        "roceP2p1s0f1": {"firmware": "28.45.4028", "ports": {}}}
    assert rows(params_with(), second=second)[("same firmware", "all")].status == PASS


# The GB10 held at 500-850 MHz instead of ~2400 after a bad USB-C power negotiation, HW Power Brake
# or HW Slowdown active, fixed by unplugging the brick from wall and Spark for 60 s:
# https://github.com/parallelArchitect/spark-gpu-throttle-check/blob/641af288dc028eb40f2f4975c95f2495223190f9/README.md
# ("The Problem", "Fix for PD Throttling"); the 513 MHz cap (NVIDIA forum "Investigating 513MHz cap
# for GPU") and pl1/syspl1 limits: https://github.com/tonyd2wild/DeepSeek-V4.1-Flash-vLLM-DGX-Spark/issues/1;
# a GB10 stuck in a low-power state under load until complete AC power removal:
# https://github.com/Blackwellboy/model-serving-minefield/pull/55 (Trap 124).
# Heat: a GB10 at 81 C whose `nvidia-smi -q` counts 0.9 s of SW Thermal Slowdown,
# https://github.com/ollama/ollama/issues/13552; Spark shutdowns from overheating that stopped after
# `sudo nvidia-smi -lgc 0,2000`, https://github.com/MiaAI-Lab/DeepSeek-v4-Flash-DSpark-2x-DGX-Spark/issues/146.
@pytest.mark.parametrize("reasons, status, remedy", [
    (("HW Slowdown", "HW Power Brake Slowdown"), FAIL, "unplug the power brick"),
    (("HW Slowdown",), FAIL, "power delivery or heat"),
    (("HW Slowdown", "HW Thermal Slowdown"), FAIL, "clear the vents"),
    (("SW Thermal Slowdown",), WARN, "nvidia-smi -lgc"),
    (("SW Power Cap",), WARN, "stop what uses the GPU"),
])
def test_a_slowdown_reason_names_itself_and_its_remedy(reasons, status, remedy):
    got = rows(params_with(), second=report(reasons=reasons, mhz=513))
    c = got[("gpu clocks", "spark-2")]
    assert c.status == status and remedy in c.remedy and c.remedy.count("power-cycle") <= 1
    assert c.observed == f"P0, Graphics 513 MHz of 3003, SM 513 MHz of 3003: {', '.join(reasons)} active"
    assert got[("gpu clocks", "spark-1")].status == PASS


def test_normal_reasons_do_not_count():
    c = rows(params_with(), second=report(reasons=("Applications Clocks Setting",)))[("gpu clocks", "spark-2")]
    assert c.status == PASS and "no slowdown reason active (Idle, Applications Clocks Setting)" in c.observed


# swap: GB10 shares its 128 GB between the OS, the page cache and the GPU; owners report hosts
# wedged by memory exhaustion, with swap in use, rather than an OOM kill:
# https://github.com/AEON-7/vllm-ultimate-dgx-spark/issues/9 (host freezes; the last samples show
# 61-572 MiB of swap in use, 116,652-124,258 of 124,546 MiB used), https://github.com/NVIDIA/NemoClaw/issues/7127
# (MemAvailable down to 3.2 GiB, 2.16 GiB of swap in use),
# https://github.com/NVIDIA/open-gpu-kernel-modules/issues/1358 (silent whole-host wedge, power cycle).
def test_swap_in_use_before_the_launch_warns():
    got = rows(params_with(), first=report(swap=(16 << 20, (16 << 20) - (3 << 20))), second=report(swap=(0, 0)))
    c = got[("swap", "spark-1")]
    assert c.status == WARN and c.observed == "3.0 GiB of 16.0 GiB swap in use" and "swapoff" in c.remedy
    assert (got[("swap", "spark-2")].status, got[("swap", "spark-2")].observed) == (PASS, "no swap")
    assert rows(params_with())[("swap", "spark-1")].observed == "0.0 GiB of 16.0 GiB swap in use"


def test_a_rail_networkmanager_sets_by_dhcp_warns_with_the_nmcli_that_makes_it_static():
    # DGX OS's CX-7 ports come on NetworkManager profiles with ipv4.method auto (DHCP); nmcli -g
    # prints a field's value alone (nmcli(1)), as host_state.sh asks for it
    stdout = "\n".join(["@@ smi", "nvidia-smi unavailable", "@@ memlock", "unlimited unlimited",
                        "@@ nm enp1s0f1np1", "connection=--Wired connection 1", "method=auto",
                        "@@ nm enP2p1s0f1np1", "connection=rail2", "method=manual"])
    nm = parse(stdout)["host"]["nm"]
    assert nm == {"enp1s0f1np1": {"connection": "--Wired connection 1", "method": "auto"},
                  "enP2p1s0f1np1": {"connection": "rail2", "method": "manual"}}
    first = report()
    first["host"]["nm"] = nm

    def dhcp_rows(node_report):
        pf = Preflight({"spark-1": node_report, "spark-2": report()}, {}, {"spark-1": "head", "spark-2": "worker"})
        return [c for c in host.health(params_with(), pf) if c.check == "rail dhcp"]

    dhcp, static = dhcp_rows(first)
    assert dhcp.status == WARN and dhcp.node == "spark-1" and "'--Wired connection 1', ipv4.method auto" in dhcp.observed
    # the profile's name stays one argument after `id`, never an option
    assert "nmcli connection modify id '--Wired connection 1' ipv4.method manual ipv4.addresses 10.77.1.11/24" in dhcp.remedy
    assert "802-3-ethernet.mtu 9000" in dhcp.remedy and (static.status, static.remedy) == (PASS, "")
    # a method nmcli did not give (a profile it could not show): maybe DHCP, so not a PASS
    first["host"]["nm"] = {"enp1s0f1np1": {"connection": "cx7:0", "method": ""}}
    [unread] = dhcp_rows(first)
    assert unread.status == WARN and unread.observed.endswith("ipv4.method unknown")
    # nmcli absent, or rails NetworkManager does not manage: no row
    assert parse_host_state({"memlock": "1 1", "nm enp1s0f1np1": "nmcli unavailable"})["nm"] is None
    first["host"]["nm"] = {"enp1s0f1np1": {"connection": "", "method": ""}}
    assert dhcp_rows(first) == []


def test_a_report_without_the_host_section_gives_no_host_rows():
    bare = {"facts": {"driver": "580.95.05"}, "ibstat": None, "ibv_devinfo": None}
    got = rows(params_with(), bare, bare)
    assert set(got) == {("same driver", "all")}


# ------------------------------------------------------------------------------------- settings

def test_the_ranges_are_validated_as_pep_440_specifiers():
    assert params_with(expectations={"driver": ">=580.95,<590", "firmware": "~=28.45"}).expectations.firmware
    for field, bad in (("driver", "580.95"), ("firmware", ">= 28.45 or so")):
        with pytest.raises(ParamsError) as e:
            params_with(expectations={field: bad})
        assert [p for p, _ in e.value.problems] == [f"expectations.{field}"]
        assert "PEP 440" in e.value.problems[0][1] and bad in e.value.problems[0][1]


# ------------------------------------------------------------------------------------------ lab

def test_throttle_is_caught_on_its_node_only_and_heals(lab, params):
    def checked():
        pf = preflight.gather(params, Cluster.from_params(params))
        return {(c.check, c.node): c for c in preflight.checks(params, pf)}

    faults.apply(lab, "throttle")
    try:
        got = checked()
    finally:
        faults.heal(lab, "throttle")
    c = got[("gpu clocks", "spark-2")]
    assert c.status == FAIL and "HW Slowdown, HW Power Brake Slowdown active" in c.observed
    assert "513 MHz" in c.observed and "unplug the power brick" in c.remedy
    assert [k for k, v in got.items() if v.status == FAIL] == [("gpu clocks", "spark-2")]
    assert got[("gpu clocks", "spark-1")].status in (PASS, SKIP)  # SKIP: a lab older than `nvidia-smi -q`
    assert checked()[("gpu clocks", "spark-2")].status == PASS


# memlock: RDMA registers (pins) memory; below the limit NCCL fails with "ibv_reg_mr_iova2 failed
# with error Cannot allocate memory" while `ulimit -l` showed 8192 until limits.conf was raised:
# https://github.com/NVIDIA/nccl-tests/issues/206. Docker gives a container 64 MiB (8 MiB on other
# hosts) unless `--ulimit memlock=-1` (https://github.com/NVIDIA/cudf-spark/pull/7632): sparkbook
# passes it itself, so there is nothing on the node to check (no preflight row).
def test_sparkbooks_containers_get_an_unlimited_memlock():
    from sparkbook.serving.containers import docker_run
    params = params_with(runtime={"rdma": True})
    run = docker_run(params, params.nodes[0], "sparkbook-lab-x", ["true"])
    assert run[run.index("--ulimit") + 1] == "memlock=-1"
