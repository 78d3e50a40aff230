"""Day one's discovery (`sparkbook discover`): what a node's script output says, which ports are
cabled and which addresses a rail may take, the parameters file drafted from it (valid as written,
each undecided value a comment that says why, or not written with the fields and notes said), and
on the lab the file it writes for the lab's own nodes."""

import json
import re
from pathlib import Path

import pytest
import yaml

from conftest import field_sample
from sparkbook.book.errors import SparkbookError
from sparkbook.cli import main
from sparkbook.params import ParamsError, load, validate
from sparkbook.setup import discover, draft
from sparkbook.setup.discover import Found, Port

ROOT = Path(__file__).resolve().parents[1]
PAIR = (ROOT / "parameters" / "dgx-spark-pair.yaml").read_text()
SCRIPT = ROOT / "sparkbook" / "scripts" / "discover.sh"


def link(name, *addresses, up=True, mtu=9000):
    """One interface as `ip -j addr show` prints it: addresses as (ip, prefix, dynamic)."""
    return {"ifname": name, "mtu": mtu, "operstate": "UP" if up else "DOWN",
            "flags": ["BROADCAST", "MULTICAST", "UP", "LOWER_UP"] if up else ["NO-CARRIER", "BROADCAST", "UP"],
            "addr_info": [{"family": "inet", "local": ip, "prefixlen": p, **({"dynamic": True} if d else {})}
                          for ip, p, d in addresses]}


def spark_output(ibdev2netdev: str, links: list[dict], ports: dict[str, str] | None = None) -> str:
    return "\n".join(["@@ identity", "hostname=spark-fb97", "os=Ubuntu 24.04.3 LTS", "kernel=6.11.0-1016-nvidia",
                      "arch=aarch64", "bios=5.36_0ACUM018", "mgmt=10.0.0.15",
                      "@@ gpu", "NVIDIA GB10, [N/A], 580.95.05", "@@ meminfo", "MemTotal:       125514224 kB",
                      "@@ ibdev2netdev", ibdev2netdev,
                      *[ln for name, text in (ports or {}).items() for ln in (f"@@ port {name}", text)],
                      "@@ links", json.dumps(links)])


def test_a_spark_with_one_cable_in_port_0_has_its_f0_twins_cabled_and_link_local_is_no_rail_address():
    # ibdev2netdev of a Spark with one QSFP cable in port 0 (f0 twins Up, f1 Down), and the
    # link-local 169.254.x/16 address netplan gives a port (both from the same public README)
    links = [link("enP7s7", ("10.0.0.15", 24, False), mtu=1500),
             link("enp1s0f0np0", ("169.254.20.98", 16, False)), link("enP2p1s0f0np0", ("192.168.2.15", 24, False)),
             link("enp1s0f1np1", up=False), link("enP2p1s0f1np1", up=False)]
    ports = {"enp1s0f0np0": "firmware=28.45.4028 (NVD0000000087)\npci=0000:01:00.0\nspeed=200000\nnetplan=/etc/netplan/40-cx7.yaml ",
             "enP2p1s0f0np0": "pci=0002:01:00.0\nspeed=200000\nnm=Wired connection 2\nnm_method=manual",
             "enp1s0f1np1": "netplan=?/etc/netplan/50-cloud-init.yaml "}
    found = discover.parse("spark-a", spark_output(field_sample("ibdev2netdev-1.txt"), links, ports))
    assert (found.hostname, found.mgmt_interface, found.mem_gib) == ("spark-fb97", "enP7s7", 119.7)
    assert found.gpus[0]["name"] == "NVIDIA GB10" and found.gpus[0]["memory.total"] is None
    assert [p.netdev for p in found.cabled] == ["enp1s0f0np0", "enP2p1s0f0np0"]
    f0, f0_2 = found.cabled
    assert (f0.pci, f0.speed_mbps, f0.firmware, f0.mtu) == ("0000:01:00.0", 200000, "28.45.4028", 9000)
    assert f0.address is None and f0.owner == "netplan (/etc/netplan/40-cx7.yaml)"
    assert f0_2.address == ("192.168.2.15", 24)
    assert f0_2.owner == "NetworkManager (Wired connection 2, ipv4.method manual)"
    assert [p.up for p in found.ports if not p.cabled] == [False, False]
    # a stray line among nvidia-smi's rows: the GPU unseen, the rest read
    assert discover.parse("x", spark_output("", [], {}).replace("NVIDIA GB10, [N/A], 580.95.05", "WARNING: x")).gpus == []
    # a netplan file this user cannot read (mode 600) may persist the address: not "runtime only"
    f1 = next(p for p in found.ports if p.netdev == "enp1s0f1np1")
    assert f1.owners == ["netplan? (/etc/netplan/50-cloud-init.yaml not readable without root)"]


def port(netdev, hca, ip=None, prefix=24, dhcp=False, mtu=9000, owners=("netplan (/etc/netplan/40-cx7.yaml)",)):
    return Port(hca, netdev, True, carrier=True, operstate="UP", speed_mbps=200000, mtu=mtu, pci="0000:01:00.1",
                addresses=[(ip, prefix, dhcp)] if ip else [], owners=list(owners))


def spark(host, hostname, n, gpus=1):
    """A Spark whose cable sits in its second port, rails listed the other way round (ordered by subnet)."""
    return Found(host, identity={"hostname": hostname, "os": "Ubuntu 24.04", "kernel": "6.11", "arch": "aarch64"},
                 gpus=[{"name": "NVIDIA GB10", "memory.total": None, "driver_version": "580.95.05"}] * gpus,
                 mem_gib=119.7, mgmt_interface="enP7s7",
                 ports=[port("enP2p1s0f1np1", "roceP2p1s0f1", f"192.168.101.{n}"),
                        port("enp1s0f1np1", "rocep1s0f1", f"192.168.100.{n}")])


def test_a_pair_drafts_a_valid_file_with_hostnames_rails_by_subnet_and_the_templates_other_sections():
    d = draft.draft([spark("10.0.0.11", "spark-a", 11), spark("spark-b.lan", "spark-b", 12)], PAIR, name="mine",
                    user="nvidia", known_hosts=["~/.ssh/sparks_known_hosts"])
    p = d.params
    assert [(n.name, n.host, n.user, n.role) for n in p.nodes] == [
        ("spark-a", "10.0.0.11", "nvidia", "head"), ("spark-b", "spark-b.lan", "nvidia", "worker")]
    assert [(r.interface, str(r.ip), r.hca) for r in p.nodes[1].rails] == [
        ("enp1s0f1np1", "192.168.100.12", "rocep1s0f1"), ("enP2p1s0f1np1", "192.168.101.12", "roceP2p1s0f1")]
    assert d.layout == "direct pair, 2 nodes, 2 rails" and d.notes == []
    template = validate(yaml.safe_load(PAIR))
    assert (p.name, p.model, p.serving, p.runtime) == ("mine", template.model, template.serving, template.runtime)
    assert p.ssh.known_hosts == ["~/.ssh/sparks_known_hosts"]
    assert "# EDIT: address or ssh-config alias" not in d.text and "# spark-a: Ubuntu 24.04" in d.text
    assert validate(yaml.safe_load(d.text)) == p  # the text is the file: valid as written


def test_what_cannot_be_decided_is_a_comment_and_a_note_never_a_guess():
    a, b = spark("10.0.0.11", "spark", 11), spark("10.0.0.12", "spark", 12)  # the same hostname twice
    a.ports[0] = port("enP2p1s0f1np1", "roceP2p1s0f1", "10.9.9.9", dhcp=True, owners=())
    b.ports[0] = port("enP2p1s0f1np1", "roceP2p1s0f1", mtu=1500, owners=())
    b.ports[1].owners = []  # an address nothing persists
    a.ports[1].owners, a.ports[1].nm_method = [], "auto"  # set by hand on a profile that asks DHCP
    assert a.ports[1].owner.startswith("DHCP (NetworkManager's profile")
    d = draft.draft([a, b], PAIR, name="mine")
    assert [n.name for n in d.params.nodes] == ["node-1", "node-2"]
    assert [len(n.rails) for n in d.params.nodes] == [1, 1]
    assert "# - {interface: enP2p1s0f1np1, ip: UNDECIDED, prefix: 24, hca: roceP2p1s0f1}  # cabled, but its " \
           "address comes from DHCP" in d.text
    assert "cabled, but it has no IPv4 address" in d.text
    said = "\n".join(d.notes)
    for words in ("hostnames (spark, spark) are not distinct", "node-2: enP2p1s0f1np1 has MTU 1500, not 9000",
                  "node-1: enP2p1s0f1np1 is cabled but its address comes from DHCP",
                  "node-2: enp1s0f1np1's address 192.168.100.12/24 is set at runtime only",
                  "node-1: enp1s0f1np1's address 192.168.100.11/24 sits on a NetworkManager profile that asks DHCP"):
        assert words in said, (words, said)


def test_rails_not_on_every_node_are_left_out_and_a_node_without_any_leaves_the_others_commented():
    a, b = spark("10.0.0.11", "a", 11), spark("10.0.0.12", "b", 12)
    b.ports[0] = port("enP2p1s0f1np1", "roceP2p1s0f1", "10.5.5.5")  # the second twin on another subnet
    d = draft.draft([a, b], PAIR, name="mine")
    assert [[r.interface for r in n.rails] for n in d.params.nodes] == [["enp1s0f1np1"], ["enp1s0f1np1"]]
    assert d.layout == "direct pair, 2 nodes, 1 rail"
    assert "# - {interface: enP2p1s0f1np1, ip: 10.5.5.5, prefix: 24, hca: roceP2p1s0f1}  # its subnet " \
           "10.5.5.0/24 is not on every node" in d.text
    assert any(n.startswith("b: enP2p1s0f1np1 (10.5.5.5/24) is left out") for n in d.notes)
    # NVIDIA's netplan gives the ports link-local addresses: a node with no rail of its own yet
    b.ports = [port("enP2p1s0f1np1", "roceP2p1s0f1", "169.254.3.4", prefix=16), port("enp1s0f1np1", "rocep1s0f1")]
    d = draft.draft([a, b], PAIR, name="mine")
    assert [n.rails for n in d.params.nodes] == [[], []] and "    rails: []" in d.text
    assert "cabled, but it has only a link-local address" in d.text and "cabled, but it has no IPv4 address" in d.text


def test_a_file_that_cannot_validate_names_its_fields_and_what_was_noted():
    a, b = spark("10.0.0.11", "a", 11), spark("10.0.0.12", "b", 12)
    b.ports[1].mtu = 1500
    with pytest.raises(draft.DraftError) as e:
        draft.draft([a, b], PAIR, name="mine", user="-oProxyCommand=x")
    assert {f for f, _ in e.value.problems} == {"nodes[0].user", "nodes[1].user"}
    assert "NOTE b: enp1s0f1np1 has MTU 1500, not 9000" in str(e.value)


def test_four_nodes_from_the_pair_template_get_tp_4_and_a_ring_is_named_unsupported():
    d = draft.draft([spark(f"10.0.0.{i}", f"s{i}", i) for i in range(1, 5)], PAIR, name="four")
    assert d.params.serving.tensor_parallel_size == 4 and d.layout == "switch, 4 nodes, 2 rails"
    assert any("tensor_parallel_size set to 4" in n for n in d.notes)
    # three Sparks cabled in a ring: each cable its own subnet, a node's two rails reach different peers
    ring = []  # cables 1-2 on 10.0.0.0/24, 2-3 on 10.0.1.0/24, 1-3 on 10.0.2.0/24
    for i, (x, y) in enumerate([(0, 2), (0, 1), (1, 2)]):
        f = spark(f"10.9.0.{i + 1}", f"r{i}", i + 1)
        f.ports = [port("enp1s0f1np1", "rocep1s0f1", f"10.0.{x}.{i + 1}"),
                   port("enP2p1s0f1np1", "roceP2p1s0f1", f"10.0.{y}.{i + 1}")]
        ring.append(f)
    d = draft.draft(ring, PAIR, name="ring")
    assert d.layout.startswith("ring/mesh (unsupported)") and any("not supported yet" in n for n in d.notes)


def test_what_a_node_prints_cannot_change_the_files_structure():
    a, b = spark("10.0.0.11", "a", 11), spark("10.0.0.12", "b", 12)
    a.ports[1].netdev = "x}, role: head, y: {z"  # a hostile node's "netdev"
    with pytest.raises(ParamsError) as e:
        draft.draft([a, b], PAIR, name="mine")
    assert [f for f, _ in e.value.problems] == ["nodes[0].rails[0].interface"]
    with pytest.raises(ParamsError) as e:
        draft.draft([spark("10.0.0.11", "a", 11), b], PAIR, name="x\nlab: true")
    assert [f for f, _ in e.value.problems] == ["name"]


def test_the_parameters_rails_are_compared_with_what_is_cabled():
    a, b = spark("10.0.0.11", "a", 11), spark("10.0.0.12", "b", 12)
    params = draft.draft([a, b], PAIR, name="mine").params
    assert draft.differences(params, [a, b]) == []
    b.ports[1].addresses = [("192.168.100.99", 24, False)]
    b.ports.append(port("enp1s0f0np0", "rocep1s0f0", "192.168.50.12"))
    a.ports[0].carrier = False
    assert draft.differences(params, [a, b]) == [
        "a: rail enP2p1s0f1np1 is not cabled",
        "b: rail enp1s0f1np1 is 192.168.100.12/24 in the parameters, 192.168.100.99/24 on the node",
        "b: enp1s0f0np0 is cabled and has 192.168.50.12/24, but is no rail"]


def test_an_existing_file_is_kept_unless_forced_and_bad_hosts_are_one_error(tmp_path):
    d = draft.draft([spark("10.0.0.11", "a", 11), spark("10.0.0.12", "b", 12)], PAIR, name="mine")
    path = tmp_path / "mine.yaml"
    path.write_text("someone's file\n")
    with pytest.raises(SparkbookError, match="exists"):
        draft.write(d, path)
    assert path.read_text() == "someone's file\n"
    assert draft.write(d, path, force=True).read_text() == d.text
    with pytest.raises(ParamsError) as e:
        discover.connect(["10.0.0.1", "-oProxyCommand=touch /tmp/x"], port=70000)
    assert {f for f, _ in e.value.problems} >= {"nodes[1].host", "nodes[0].port"}


def test_the_script_reads_the_hcas_from_sysfs_where_ibdev2netdev_is_missing(tmp_path):
    import subprocess
    for hca, net, state in (("rocep1s0f1", "enp1s0f1np1", "4: ACTIVE"), ("rocep1s0f0", "enp1s0f0np0", "1: DOWN")):
        (tmp_path / hca / "device" / "net" / net).mkdir(parents=True)
        (tmp_path / hca / "ports" / "1").mkdir(parents=True)
        (tmp_path / hca / "ports" / "1" / "state").write_text(state + "\n")
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "SPARKBOOK_IB_SYSFS": str(tmp_path), "LC_ALL": "C"}
    out = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, check=True).stdout
    found = discover.parse("here", out)
    assert {(p.hca, p.netdev, p.up, p.present) for p in found.ports} == {
        ("rocep1s0f1", "enp1s0f1np1", True, False), ("rocep1s0f0", "enp1s0f0np0", False, False)}
    assert found.identity["kernel"] and found.mem_gib


# ------------------------------------------------------------------------------------ on the lab

def test_discover_on_the_lab_writes_the_labs_own_nodes(lab, params, tmp_path, capsys):
    """The lab's two nodes, asked by address with the lab's key: the file written holds the nodes
    of parameters/lab.yaml, rails and all, each with the netplan file that persists it (the lab's
    nodes have their own /etc/netplan); tests/test_dayone.py discovers nodes fresh from the box."""
    node = params.nodes[0]
    out = tmp_path / "lab.yaml"
    assert main(["discover", *(n.host for n in params.nodes), "--user", node.user, "--key", node.key,
                 "--known-hosts", params.ssh.known_hosts[0], "--template", str(ROOT / "parameters" / "lab.yaml"),
                 "--name", "lab", "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    written = load(out)
    assert [n.model_dump() for n in written.nodes] == [n.model_dump() for n in params.nodes]
    assert "layout: direct pair, 2 nodes, 2 rails" in printed
    assert "runtime only" not in printed
    assert out.read_text().count("netplan (/etc/netplan/60-lab-fabric.yaml)") == 4
    assert re.search(r"spark-2\s+enp1s0f0np0\s+rocep1s0f0\s+Down", printed)  # the uncabled twin, shown
