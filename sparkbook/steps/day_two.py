"""Day two, after 08 (notebooks/day_two.ipynb; `sparkbook service install|status|remove` over the
same functions): the deployment that passed 05 and 06 kept serving across crashes and reboots
(:mod:`sparkbook.serving.service`)."""

from __future__ import annotations

from pathlib import Path

from ..book.errors import CheckFailed
from ..book.project import project_root
from ..book.tables import Table, short_id
from ..book.verdict import Verdict
from ..notebook import conclude, open_cluster  # noqa: F401  (conclude: the notebook's and the CLI's)
from ..params import Params, load
from ..record import folder
from ..record.bugreport import runs
from ..record.expiry import when
from ..runbook import upgrade
from ..serving import service
from ..serving.plan import plan

TITLE = "day two"
COMMANDS = ("install", "status", "remove", "upgrade")
SERVE, SMOKE = "05_serve", "06_smoke_test"


def service_step(params_file: str | Path, command: str = "status", run: str | Path | None = None,
                 outputs: str | Path | None = None, image: str | None = None, min_ratio: float = upgrade.MIN_RATIO,
                 say=print) -> tuple[service.Service, Verdict]:
    """``install`` (from ``run``, else the newest run of the deployment in ``outputs`` whose 05 and
    06 passed), ``status``, ``remove``, or ``upgrade`` to ``image`` through the gate
    (:mod:`sparkbook.runbook.upgrade`); what it found, and the verdict's rows."""
    if command not in COMMANDS:
        raise ValueError(f"command: one of {', '.join(COMMANDS)}, not {command!r}")
    params = load(params_file)
    cluster = open_cluster(params)
    outputs = Path(outputs) if outputs else project_root() / "outputs"
    if command == "upgrade":
        if not image:
            raise CheckFailed("upgrade: name the candidate image (`--image REF`, present on the head)")
        where, _ = basis(params, outputs, run and Path(run))
        rows = upgrade.upgrade(Path(params_file), cluster, image, where, outputs, min_ratio, say=say)
        return service.status(params, cluster), Verdict("service upgrade", rows)
    if command == "install":
        where, served = basis(params, outputs, run and Path(run))
        out = service.install(params, cluster, where, served, say=say)
    elif command == "status":
        out = service.status(params, cluster)
    else:
        out = service.uninstall(params, cluster)
    return out, Verdict(f"service {command}", service.checks(params, out))


def basis(params: Params, outputs: Path, run_dir: Path | None = None) -> tuple[Path, str | None]:
    """The run the service is installed from: ``run_dir``, else the newest of the deployment's runs
    in ``outputs`` whose 05 and 06 passed; and the image ID they passed on (None when the run's
    fingerprint does not say). Refused when 05 or 06 did not pass there, or when 05 started vLLM
    from other parameters than these."""
    found = [Path(run_dir)] if run_dir else runs(Path(outputs), params.name)
    passed = []
    for d in found:
        try:
            serve, smoke = folder.verdict(d, SERVE), folder.verdict(d, SMOKE)
        except folder.Unreadable:
            continue
        if serve and smoke and not serve.failures and not smoke.failures:  # passed, warnings allowed
            passed.append((when(smoke.taken) or when(serve.taken), d))
    if not passed:
        where = f"run {run_dir}" if run_dir else f"any run of deployment {params.name!r} in {outputs}"
        raise CheckFailed(f"service: {SERVE} and {SMOKE} have not both passed in {where}: the service "
                          "keeps a deployment that passed them, so run 05 and 06 first "
                          "(`sparkbook run -p FILE --steps 05,06`)")
    d = max(passed, key=lambda x: x[0].timestamp() if x[0] else 0)[1]
    started = (folder.read(d, "serving.json") or {}).get("fingerprints", {})
    now = plan(params).serve_fingerprints()
    if started != now:
        raise CheckFailed(f"service: the parameters changed since {d.name}, where 05 and 06 passed (vllm serve's "
                          f"fingerprint {started or 'not recorded'} there, {now} now): run 05 and 06 with "
                          "these parameters first")
    fp = folder.fingerprint(d)
    return d, (fp.image.get("id") if fp else None)


def table(out: service.Service) -> Table:
    rows = [[node, s.name or "-", s.state or "none", str(s.restarts), str(s.engine_starts) if s.engine_starts else "-",
             s.started[:19] or "-", short_id(s.pinned) if s.pinned else "-"] for node, s in out.nodes.items()]
    return Table(["node", "container", "state", "Docker restarts", "vllm serve starts", "started", "image pinned"],
                 rows, title=f"service ({out.action})")
