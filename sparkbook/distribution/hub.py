"""The model from the Hugging Face hub onto the head (``model.source: hf``), before 03's model sync
copies it to the workers.

``scripts/hub_download.py`` runs on the head, in a throwaway container of the serving image (which
has ``huggingface_hub``) as the SSH user, so the files belong to that user, not to root; with
``runtime.kind: venv``, with the venv's python. The token travels in a mode-600 file in the head's
private working folder (:mod:`sparkbook.nodes.workdir`; ``--env-file``, removed right after), never on a
command line; ``HF_ENDPOINT`` of this machine's environment (a mirror, or the lab's local hub) is
passed on. The download resumes where a previous run stopped and fetches nothing that is already
there (see the script).
"""

from __future__ import annotations

import os
import shlex
import time
from dataclasses import asdict, dataclass
from typing import Callable

from ..book.errors import CheckFailed
from ..book.progress import Progress, bar, fraction_of
from ..book.redact import mask
from ..book.tables import human_bytes
from ..book.verdict import FAIL, PASS, SKIP, Check
from ..nodes.remote import Cluster
from ..nodes.shell import SCRIPTS, command_line, sh
from ..nodes import workdir
from ..nodes.workdir import prepare as prepare_workdir
from ..params import Params
from ..scripts.hub_download import parse_line
from ..serving.commands import token
from ..serving.containers import deployment_label, hf_env, named, owner_label, secrets_file, with_entrypoint
from ..serving.state import remove
from .lines import Lines

SCRIPT = SCRIPTS / "hub_download.py"
SHOWN_SCRIPT = '"$(cat sparkbook/scripts/hub_download.py)"'
CHECK = "model from the hub"

Say = Callable[[str], object]


def container(params: Params) -> str:
    """The download's throwaway container: this deployment's, no other's."""
    return named(params, "hub-download")


@dataclass
class HubOutcome:
    """One download of ``repo`` at ``revision`` into ``path`` on the head."""
    repo: str
    revision: str | None   # as asked (None: the default branch)
    path: str
    node: str
    endpoint: str | None = None   # HF_ENDPOINT passed on (None: the hub)
    commit: str | None = None     # the commit the revision named
    files: int = 0
    total: int = 0                # bytes of the revision's files
    fetched: int = 0              # bytes received from the hub in this run
    fetched_files: int = 0
    seconds: float = 0.0
    error: str | None = None
    kind: str | None = None       # what went wrong (hub_download.KINDS, or timeout)
    command: str = ""             # as run on the head, secrets masked

    def to_json(self) -> dict:
        return asdict(self)

    def summary(self) -> str:
        """``org/model@1a2b3c4: 1.2 GiB of 3.4 GiB fetched in 40 s (7 of 12 files)`` (a key number)."""
        if self.error:
            return f"{self.repo}: failed ({self.kind})"
        return (f"{self.repo}@{(self.commit or '')[:7]}: {human_bytes(self.fetched)} of "
                f"{human_bytes(self.total)} fetched in {self.seconds:.0f} s ({self.fetched_files} of "
                f"{self.files} files)")


def hub_endpoint() -> str | None:
    """Where the head downloads from: ``HF_ENDPOINT`` of this machine (None: huggingface.co)."""
    return os.environ.get("HF_ENDPOINT") or None


def download_command(params: Params, user: str, env_file: str | None, program: str) -> list[str]:
    """``hub_download.py`` (its text ``program``) on the head as ``user`` (``UID:GID``): in a
    container of the serving image with the model folder mounted, or with the runtime's venv."""
    m, rt, endpoint = params.model, params.runtime, hub_endpoint()
    args = [*([f"--revision={m.revision}"] if m.revision else []), "--", m.name, m.path]
    if rt.kind == "venv":
        env = ["env", f"HF_ENDPOINT={endpoint}"] if endpoint else []
        return [*env, f"{rt.venv}/bin/python", "-c", program,
                *(["--env-file", env_file] if env_file else []), *args]
    cmd = ["docker", "run", "--rm", "--pull", "never", "--name", container(params),
           "--label", deployment_label(params), "--label", owner_label(params.head), "--network", "host", "--user", user,
           *rt.docker_args, "-v", f"{m.path}:{m.path}", "-e", "HOME=/tmp"]
    if endpoint:
        cmd += ["-e", f"HF_ENDPOINT={endpoint}"]
    if env_file:
        cmd += ["--env-file", env_file]
    return cmd + with_entrypoint(rt.entrypoint, rt.image, ["python3", "-c", program, *args])


def shown(cmd: list[str], program: str) -> str:
    """The command as a person runs it on the head, the program read from its file, secrets masked."""
    return mask(command_line(cmd).replace(shlex.quote(program), SHOWN_SCRIPT))


def prepare(params: Params, cluster: Cluster) -> tuple[str | None, str | None]:
    """The model folder made on the head as the SSH user (so that Docker does not make it as root),
    a leftover download container removed; ``(UID:GID, None)`` or ``(None, what failed)``."""
    if params.runtime.kind == "docker":  # a leftover of an interrupted download (ours only)
        cluster.run_on(params.head, remove(params, container(params))(params.head), timeout=60)
    r = cluster.run_on(params.head, sh("mkdir -p -- {p} && id -u && id -g", p=params.model.path), timeout=60)
    ids = r.stdout.split()
    if not r.ok or len(ids) != 2:
        return None, r.summary()
    return ":".join(ids), None


def fetch_model(params: Params, cluster: Cluster, say: Say = print, show: bool = True) -> HubOutcome:
    """Download ``model.name`` at ``model.revision`` into ``model.path`` on the head; never raises
    for the download's failure (:func:`hub_checks` fails on it)."""
    m, head = params.model, params.head
    out = HubOutcome(m.name, m.revision, m.path, head.name, hub_endpoint())
    start = time.monotonic()
    user, why = prepare(params, cluster)
    if user is None:
        out.error, out.kind = f"cannot make {m.path} on {head.name}: {why}", "permission"
        out.command = f"mkdir -p -- {shlex.quote(m.path)}"
        return out
    secret = token(params)
    env_file = workdir.secrets_path(params, head) if secret else None
    program = SCRIPT.read_text()
    cmd = download_command(params, user, env_file, program)
    out.command = shown(cmd, program)
    say(f"downloading {m.name} at {m.revision or 'the default branch'} from "
        f"{out.endpoint or 'the hub'} into {m.path} on {head.name}")
    try:
        if secret:
            prepare_workdir(params, cluster, [head])
        with (secrets_file(cluster, [head], workdir.secrets_path(params, head), hf_env(secret)),
              Progress(f"{m.name} from {out.endpoint or 'the hub'}") as progress):
            def each(line: str) -> None:
                got = parse_line(line)
                if got and got[0] == "PROGRESS" and show:
                    p = got[1]
                    progress.update(head.name, bar(p["done"], p["total"], start)
                                    + f"  files {p['files_done']} of {p['files']}",
                                    fraction=fraction_of(p["done"], p["total"]))

            r = cluster.run_on(head, cmd, timeout=params.distribution.timeout_s, stream=Lines(each))
    except CheckFailed as e:  # the token file could not be written
        out.error, out.kind = mask(str(e)), "setup"
        return out
    out.seconds = round(time.monotonic() - start, 1)
    ends = [got[1] for got in map(parse_line, r.stdout.splitlines()) if got and got[0] == "DONE"]
    done = ends[-1] if ends else None
    if not done:
        out.error, out.kind = mask(r.summary()), "timeout" if r.timed_out else "setup"
        return out
    for k in ("commit", "files", "total", "fetched", "fetched_files", "error", "kind"):
        setattr(out, k, done.get(k))
    out.error = mask(out.error) if out.error else None
    return out


# ------------------------------------------------------------------------------ what it says

def remedy(params: Params, out: HubOutcome) -> str:
    m, env = params.model, params.model.hf_token_env
    where = out.endpoint or "https://huggingface.co"
    return {
        "auth": f"the hub refused the token: set ${env} on this machine to a valid token that can "
                f"read {m.name} (huggingface.co/settings/tokens), then run 03 again",
        "not-found": f"check model.name ({m.name!r}) on {where}; a private or gated repository also "
                     f"answers 'not found' without a token: set ${env} on this machine",
        "gated": f"accept the model's conditions on its page ({where}/{m.name}) with the account of "
                 f"${env}'s token, then run 03 again",
        "forbidden": f"the token in ${env} may not read {m.name}: give it read access (a fine-grained "
                     "token needs the repository), or accept the model's conditions",
        "revision": f"model.revision {m.revision!r} is not a commit, branch or tag of {m.name}: "
                    "check it on the model's page (Files and versions)",
        "network": f"the head could not reach {where}: check its internet access (proxy, DNS, "
                   "firewall) or set HF_ENDPOINT to a mirror it reaches; running 03 again resumes "
                   "where the download stopped",
        "disk": f"free space on {out.node} at {m.path} (or point model.path at a larger disk), then "
                "run 03 again: what arrived is kept",
        "permission": f"let the SSH user write {m.path} on {out.node}: `sudo mkdir -p {m.path} && "
                      f"sudo chown $USER {m.path}` there",
        "verify": "run 03 again: the damaged file was removed and is fetched again",
        "timeout": f"the download took longer than distribution.timeout_s "
                   f"({params.distribution.timeout_s:.0f} s): run 03 again (it resumes where it "
                   "stopped), or raise the limit",
        "setup": f"the download did not start: the serving image {params.runtime.image} must be on "
                 f"the head (02/03 put it there) and hold huggingface_hub; see the message",
    }.get(out.kind or "", "read the message; running 03 again resumes where the download stopped")


def hub_checks(params: Params, out: HubOutcome | None) -> list[Check]:
    """One row: the model downloaded onto the head (SKIP when the head holds it already)."""
    m, head = params.model, params.head.name
    if m.source != "hf" or out is None:
        return [Check(CHECK, head, SKIP, "model.source is head: the head holds the model")]
    expected = f"{m.name} at {m.revision or 'the default branch'} in {m.path}"
    if out.error:
        return [Check(CHECK, head, FAIL, out.error, expected, remedy(params, out), out.command)]
    seen = (f"commit {(out.commit or '')[:12]}: {out.files} files, {human_bytes(out.total)}; fetched "
            f"{human_bytes(out.fetched)} ({out.fetched_files} files) in {out.seconds:.0f} s")
    return [Check(CHECK, head, PASS, seen, expected)]
