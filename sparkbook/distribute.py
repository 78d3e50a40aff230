"""Getting the serving image onto every node.

For now the plain streamed copy: the head's `docker save` piped over SSH (head to worker, on the
fabric) straight into the worker's `docker load`, no file on either side, workers in parallel.
"""

from __future__ import annotations

from .errors import CheckFailed
from .params import Node, Params
from .remote import Cluster, Result, Results, command_line, peer_ssh, sh


def image_ids(params: Params, cluster: Cluster) -> dict[str, str | None]:
    """The configured image's ID on every reachable node (None where absent)."""
    res = cluster.run(["docker", "image", "inspect", "--format", "{{.Id}}", params.runtime.image])
    return {n: (r.stdout.strip() if r.ok else None) for n, r in res.items()}


def stream_from_head(params: Params, cluster: Cluster, workers: list[Node]) -> Results:
    """`docker save | ssh worker docker load`, run on the head for each worker at once; one result
    per worker (in the head's session, so the results are keyed by worker)."""
    # each copy reports "NAME STATUS last-error-line" when it ends; its stderr file is removed
    script = "\n".join(
        ["d=$(mktemp -d)"]
        + [sh("( docker save {img} | ", img=params.runtime.image) + command_line(peer_ssh(w))
           + sh(' docker load >/dev/null 2>"$d"/{n}; echo {n} $? "$(tail -n 1 "$d"/{n})" ) &', n=w.name)
           for w in workers]
        + ["wait", 'rm -rf "$d"'])
    head = cluster.run(script, [params.head], timeout=params.ssh.command_timeout * 4)[params.head.name]
    results = Results()
    done = {p[0]: p[1:] for p in (ln.split(" ", 2) for ln in head.stdout.splitlines()) if len(p) >= 2}
    for w in workers:
        code = int(done[w.name][0]) if w.name in done else None
        seen = done.get(w.name, ["", ""])[-1].strip()
        shown = f"docker save {params.runtime.image} | ssh {w.peer_target} docker load"
        err = None if code == 0 else head.error or f"{shown} failed ({code}): {seen or 'no message'}"
        results[w.name] = Result(w.name, shown, code, duration=head.duration, error=err)
    return results


def ensure_image(params: Params, cluster: Cluster, say=print) -> dict[str, str | None]:
    """Make sure every node holds the head's image (sending it where absent or different)."""
    ids = image_ids(params, cluster)
    ref = ids.get(params.head.name)
    if ref is None:
        raise CheckFailed(f"{params.runtime.image} is not on the head {params.head.name}: pull or "
                          "build it there first (01_preflight says so too)")
    todo = [n for n in params.workers if ids.get(n.name) != ref]
    if not todo:
        say(f"image {params.runtime.image} ({ref.split(':')[-1][:12]}) is on every node")
        return ids
    say(f"sending {params.runtime.image} from {params.head.name} to {', '.join(n.name for n in todo)} "
        "(docker save | ssh | docker load, streamed)")
    stream_from_head(params, cluster, todo).check("copy the image to the workers",
                                                  "check head-to-worker SSH (01_preflight) and disk space")
    ids = image_ids(params, cluster)
    wrong = [n.name for n in params.nodes if ids.get(n.name) != ref]
    if wrong:
        raise CheckFailed(f"after the copy, {', '.join(wrong)} still hold(s) another image than the head")
    return ids
