"""Parsers of node tools, on real outputs captured on DGX Spark / GB10 systems."""

from pathlib import Path

import pytest

from conftest import field_sample
from sparkbook.facts import parsers

FIXTURES = Path(__file__).parent / "fixtures"


def fixture(name: str) -> str:
    lines = (FIXTURES / name).read_text().splitlines(keepends=True)
    assert lines[0].startswith("# source:")
    return "".join(lines[2:])


@pytest.mark.parametrize("n", range(1, 7))
def test_nvidia_smi_table_on_every_gb10_sample(n):
    out = parsers.parse_nvidia_smi_table(field_sample(f"nvidia-smi-{n}.txt"))
    assert out["driver"].startswith("580.") and out["cuda"].startswith("13.")
    assert out["gpus"] and all(g["name"] == "NVIDIA GB10" and g["memory"] is None for g in out["gpus"])


def test_nvidia_smi_table_sees_the_vllm_engine_holding_memory():
    procs = parsers.parse_nvidia_smi_table(field_sample("nvidia-smi-1.txt"))["processes"]
    assert {"gpu": 0, "pid": 577729, "type": "C", "name": "VLLM::EngineCore", "memory_mib": 89093} in procs


def test_nvidia_smi_table_of_four_interleaved_nodes():
    out = parsers.parse_nvidia_smi_table(field_sample("nvidia-smi-4.txt"))
    assert len(out["gpus"]) == 4 and out["driver"] == "580.126.09"


def test_ibdev2netdev_port0_cabled():
    out = parsers.parse_ibdev2netdev(field_sample("ibdev2netdev-1.txt"))
    assert out["rocep1s0f0"] == {"port": 1, "netdev": "enp1s0f0np0", "up": True}
    assert out["roceP2p1s0f1"] == {"port": 1, "netdev": "enP2p1s0f1np1", "up": False}


@pytest.mark.parametrize("name, up", [("ibdev2netdev-3.txt", {"rocep1s0f1", "roceP2p1s0f1"}),
                                      ("ibdev2netdev-4.txt", {"rocep1s0f0", "rocep1s0f1",
                                                              "roceP2p1s0f0", "roceP2p1s0f1"}),
                                      ("ibdev2netdev-5.txt", {"rocep1s0f1", "roceP2p1s0f1"})])
def test_ibdev2netdev_which_rails_are_up(name, up):
    out = parsers.parse_ibdev2netdev(field_sample(name))
    assert {hca for hca, v in out.items() if v["up"]} == up and len(out) == 4


def test_ibv_devinfo_four_functions_mtu_1500():
    out = parsers.parse_ibv_devinfo(field_sample("ibv_devinfo-1.txt"))
    assert sorted(out) == ["roceP2p1s0f0", "roceP2p1s0f1", "rocep1s0f0", "rocep1s0f1"]
    port = out["rocep1s0f1"]["ports"][1]
    # netdev MTU 1500 gives a RoCE active MTU of 1024: the degraded case preflight must catch
    assert (port["state"], port["active_mtu"], port["max_mtu"], port["link_layer"]) == (
        "PORT_ACTIVE", 1024, 4096, "Ethernet")
    assert out["rocep1s0f1"]["fw_ver"] == "28.45.4028" and out["rocep1s0f1"]["vendor_part_id"] == "4129"


def test_ibstat_active_and_down_ports():
    out = parsers.parse_ibstat(fixture("ibstat-gb10-1.txt"))
    up, down = out["roceP2p1s0f0"], out["roceP2p1s0f1"]
    assert up["ca_type"] == "MT4129" and up["firmware"] == "28.45.4028"
    assert (up["ports"][1]["state"], up["ports"][1]["physical_state"], up["ports"][1]["rate"]) == (
        "Active", "LinkUp", 200)
    assert (down["ports"][1]["state"], down["ports"][1]["physical_state"]) == ("Down", "Disabled")


@pytest.mark.parametrize("name, speed", [("ethtool-speed-grep-100g-1.txt", 100000),
                                         ("ethtool-speed-grep-200g-1.txt", 200000)])
def test_ethtool_speed_per_interface(name, speed):
    out = parsers.parse_ethtool(field_sample(name))
    assert {k: v["speed_mbps"] for k, v in out.items()} == {"enp1s0f1np1": speed, "enP2p1s0f1np1": speed}


def test_ethtool_full_output_link_down():
    out = parsers.parse_ethtool("Settings for enp1s0f1np1:\n\tSpeed: Unknown!\n\tDuplex: Unknown! (255)\n"
                                "\tLink detected: no\n")
    assert out == {"enp1s0f1np1": {"speed_mbps": None, "link": False}}


def test_nccl_roce_log():
    out = parsers.parse_nccl_log(fixture("nccl-roce-1.txt"))
    assert out["network"] == "IB" and out["hcas"] == ["mlx5_10", "mlx5_11"] and out["version"] == "2.19.3+cuda12.3"
    assert parsers.nccl_transport(out) == "rdma"


def test_nccl_spark_ib_plugin_channels():
    out = parsers.parse_nccl_log(fixture("nccl-ibext-spark-1.txt"))
    assert out["channels"] == {"NET/IBext_v10": 2} and set(out["hcas"]) <= {"rocep1s0f1", "roceP2p1s0f1"}
    assert parsers.nccl_transport(out) == "rdma"


def test_nccl_socket_fallback():
    out = parsers.parse_nccl_log(fixture("nccl-socket-1.txt"))
    assert out["network"] == "Socket" and out["no_ib_device"] and out["socket_ifs"] == ["eth0", "virbr0"]
    assert parsers.nccl_transport(out) == "socket"


def test_nccl_socket_channels_with_shm():
    out = parsers.parse_nccl_log(fixture("nccl-socket-2.txt"))
    assert out["channels"]["NET/Socket"] == 8 and out["channels"]["SHM"] == 2
    assert parsers.nccl_transport(out) == "socket"


def test_nccl_on_two_h200_of_one_host_is_intra_node_despite_using_network_socket():
    out = parsers.parse_nccl_log(fixture("nccl-p2p-h200x2-1.txt"))
    assert out["network"] == "Socket" and out["no_ib_device"] and out["version"] == "2.28.9+cuda13.0"
    assert set(out["channels"]) == {"P2P/CUMEM"}
    assert parsers.nccl_transport(out) == "intra-node"


def test_nccl_one_rank_without_hca():
    out = parsers.parse_nccl_log(fixture("nccl-1rank-h200-1.txt"))
    assert out["no_ib_device"] and out["channels"] == {}
    assert parsers.nccl_transport(out) == "socket"


def test_nvidia_smi_of_a_discrete_gpu():
    table = parsers.parse_nvidia_smi_table(fixture("nvidia-smi-h200-1.txt"))
    assert table["gpus"][0]["name"] == "NVIDIA H200" and table["gpus"][0]["memory"] == "0MiB / 143771MiB"
    assert table["driver"] == "580.159.04" and table["processes"] == []
    rows = parsers.parse_nvidia_smi_csv(fixture("nvidia-smi-query-h200-1.txt"))
    assert rows == [{"name": "NVIDIA H200", "driver_version": "580.159.04", "memory.total": "143771 MiB"}]
    xml = (FIXTURES / "nvidia-smi-q-x-h200-1.xml").read_text()
    assert "source:" in xml.splitlines()[1]
    assert parsers.parse_nvidia_smi_xml(xml) == {"driver": "580.159.04", "cuda": "13.0", "gpus": [
        {"name": "NVIDIA H200", "bus_id": "00000000:00:06.0", "memory_total_mib": 143771}]}


@pytest.mark.parametrize("brk", ["\r", "\v", "\f", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"])
def test_a_line_break_other_than_newline_does_not_start_a_section(brk):
    """A node's log line holding "x<break>@@ name" (a container's log, a process's output) stays a
    line of its section: only a line that begins with the marker after "\n" starts one."""
    out = f"@@ logs\nstarting\nx{brk}@@ facts\nforged=1\n@@ facts\nreal=1\n"
    assert parsers.parse_sections(out) == {"logs": f"starting\nx{brk}@@ facts\nforged=1", "facts": "real=1"}


def test_sections_of_output_with_crlf_line_ends():
    """A "\r" before the "\n" is the line end's (output through a terminal), not the line's."""
    assert parsers.parse_sections("@@ a\r\n1\r\n2\r\n@@ b\r\n3\r\n") == {"a": "1\n2", "b": "3"}
