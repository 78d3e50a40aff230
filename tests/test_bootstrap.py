"""scripts/bootstrap installs the system packages without leaving a service running that nobody
asked for (Debian starts openssh-server's sshd on port 22 as it installs it). Checked through its
--dry-run, with dpkg-query replaced: the real install changes the machine."""

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def dry_run(tmp_path, missing: set[str]) -> str:
    fake = tmp_path / "bin"
    fake.mkdir(exist_ok=True)
    (fake / "dpkg-query").write_text(
        "#!/bin/sh\n# the status of the last argument: installed unless listed\n"
        f'for p in {" ".join(sorted(missing)) or "-"}; do\n'
        '  eval "last=\\${$#}"\n  [ "$p" = "$last" ] && exit 1\ndone\n'
        "echo 'install ok installed'\n")
    (fake / "dpkg-query").chmod(0o755)
    r = subprocess.run(["bash", str(ROOT / "scripts" / "bootstrap"), "--dry-run"], capture_output=True,
                       text=True, timeout=60, env={**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"})
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_installs_with_service_starts_refused_and_disables_what_it_installed(tmp_path):
    out = dry_run(tmp_path, {"openssh-server", "docker.io", "containerd", "rsync"})
    assert "installing openssh-server docker.io rsync" in out  # containerd comes as docker.io's dependency
    assert "would run: DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssh-server docker.io rsync" in out
    if Path("/usr/sbin/policy-rc.d").exists():
        assert "/usr/sbin/policy-rc.d exists: left as it is" in out
    else:
        assert "would write /usr/sbin/policy-rc.d (exit 101)" in out
    if not (Path("/run/systemd/system").is_dir() or Path("/etc/init.d/ssh").exists()):
        return  # no init here that knows the services: nothing to stop or disable
    # said plainly: which services were kept off, and how to have them (containerd where this
    # machine's init knows it)
    said = next(ln for ln in out.splitlines() if "came with this install" in ln)
    assert "the services ssh docker" in said and "left stopped and disabled at boot" in said
    assert "systemctl enable --now ssh docker" in said
    assert out.index("apt-get install") < out.index("came with this install")


def test_services_of_packages_already_there_are_left_alone(tmp_path):
    out = dry_run(tmp_path, {"rsync"})  # openssh-server, docker.io and containerd already installed
    assert "installing rsync" in out
    assert "disable" not in out and "came with this install" not in out


def test_nothing_missing_changes_nothing(tmp_path):
    out = dry_run(tmp_path, set())
    assert "would run" not in out and "policy-rc.d" not in out
