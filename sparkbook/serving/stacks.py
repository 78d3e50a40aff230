"""A stalled node's workers sampled where they are (sparkbook/scripts/worker_stacks.sh; read by
sparkbook.facts.stacks): their threads, and their Python stacks from py-spy, a static binary from
PyPI that this machine fetches once per architecture (``user_cache("tools")``, its wheel checked
against the digest below), puts in the node's working folder and the script copies into the
container for the sample. Where it cannot be fetched (no index reachable) the threads alone are
read. py-spy reads another process's memory: a container whose host restricts ptrace (Ubuntu's
Yama, kernel.yama.ptrace_scope=1) lets it only with the SYS_PTRACE capability, and the sample
then says py-spy could not read the worker.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from ..book.project import user_cache
from ..facts.stacks import Sample, parse_sample
from ..nodes.remote import Cluster
from ..nodes.shell import script
from ..nodes.workdir import workdir
from ..params import Params
from .plan import plan

PYSPY = "0.4.3"
# The wheels' SHA-256 as PyPI served them (2026-12-06), by `uname -m`.
WHEELS = {
    "x86_64": ("manylinux2014_x86_64", "8a4277225f470d394a85cca0cdd944bef87f0097b6f20150a6dd3ac2e92806b8"),
    "aarch64": ("manylinux2014_aarch64", "bbcec46930d464b3bfc142d6d02ade4dd8ad5627823263b3eff0280e80c7c132"),
}


def pyspy_binary(arch: str) -> tuple[Path | None, str]:
    """py-spy for ``arch`` on this machine (fetched once), or None and why not."""
    if arch not in WHEELS:
        return None, f"no py-spy for {arch or 'an unknown architecture'}"
    binary = user_cache("tools") / f"py-spy-{PYSPY}-{arch}"
    if binary.is_file():
        return binary, ""
    platform, digest = WHEELS[arch]
    with tempfile.TemporaryDirectory() as tmp:
        r = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                            "--platform", platform, "-d", tmp, f"py-spy=={PYSPY}"],
                           capture_output=True, text=True, timeout=120)
        wheels = list(Path(tmp).glob("py_spy-*.whl"))
        if r.returncode != 0 or len(wheels) != 1:
            return None, f"py-spy {PYSPY} could not be fetched: {(r.stderr.strip() or 'no wheel')[-160:]}"
        if hashlib.sha256(wheels[0].read_bytes()).hexdigest() != digest:
            return None, f"py-spy {PYSPY}'s wheel for {arch} does not have its recorded digest"
        with zipfile.ZipFile(wheels[0]) as z:
            data = z.read(f"py_spy-{PYSPY}.data/scripts/py-spy")
    partial = binary.with_suffix(".part")
    partial.write_bytes(data)
    partial.chmod(0o755)
    partial.replace(binary)
    return binary, ""


def sample(params: Params, cluster: Cluster, node_name: str, run_dir: Path) -> Sample:
    """Where the workers of ``node_name``'s serving container are now; the raw sample is kept in
    the run folder (``logs/NODE/worker-stacks.txt``)."""
    node, container = params.node(node_name), plan(params).serving_container
    arch = cluster.run_on(node, ["uname", "-m"], timeout=30).stdout.strip()
    binary, why = pyspy_binary(arch)
    remote = ""
    if binary:
        remote = f"{workdir(params, node)}/tools/{binary.name}"
        if not cluster.put(binary, remote, [node], mode=0o755, timeout=120).ok:
            remote, why = "", "py-spy could not be copied to the node"
    r = cluster.run_on(node, script("worker_stacks.sh", container, *([remote] if remote else [])), timeout=120)
    text = r.stdout + (f"@@ no-py-spy {why}\n" if why and "@@ no-py-spy" not in r.stdout else "")
    out = run_dir / "logs" / node_name / "worker-stacks.txt"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    return parse_sample(text)


def where(params: Params, cluster: Cluster, node_name: str, run_dir: Path) -> str:
    """:func:`sample`'s summary; what went wrong instead, where sampling failed (the stalled
    deployment is removed after it either way)."""
    try:
        return sample(params, cluster, node_name, run_dir).summary()
    except (OSError, subprocess.SubprocessError, zipfile.BadZipFile, KeyError) as e:
        return f"its threads were not sampled: {e}"
