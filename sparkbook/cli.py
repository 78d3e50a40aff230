"""The ``sparkbook`` command."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from .book.errors import SparkbookError
from .lab.nodes import FAULTS
from .params import default_params_file
from .version import __version__


def _params_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("-p", "--params", default=None, metavar="FILE",
                   help="parameters file (default: $SPARKBOOK_PARAMS or parameters/lab.yaml)")


def _params(args: argparse.Namespace) -> Path:
    return Path(args.params) if args.params else default_params_file()


def cmd_run(args: argparse.Namespace) -> int:
    from .runbook.runner import run
    summary = run(_params(args), steps=args.steps, out=args.out, cell_timeout=args.cell_timeout,
                  kernel_name=args.kernel, notebooks_dir=args.notebooks,
                  keep_on_failure=args.keep_on_failure, verbose=args.verbose)
    width = max(len(s["name"]) for s in summary["steps"])
    print(f"\nrun folder: {summary['run_dir']}")
    for s in summary["steps"]:
        print(f"  {s['name']:<{width}}  {s['status']:<7}  {s['duration_s']:7.1f} s")
    print(f"report: {Path(summary['run_dir']) / 'report.html'}\nstatus: {summary['status'].upper()}")
    if summary["status"] == "interrupted":  # the shell's convention: 128 + the signal
        return 128 + signal.Signals[summary["signal"]].value
    return 0 if summary["status"] == "passed" else 1


def cmd_unlock(args: argparse.Namespace) -> int:
    from .nodes.lock import unlock
    from .notebook import open_cluster
    from .params import load
    params = load(_params(args))
    holder = unlock(params, open_cluster(params))
    print(f"deployment {params.name!r}: " + (f"broke the lock held by {holder}" if holder else
                                             f"no lock on the head {params.head.name}"))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from .record.report import build
    print(build(args.run_dir))
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from .record.compare import build
    print(build(args.run_dirs, args.out))
    return 0


def cmd_collect(args: argparse.Namespace) -> int:
    from .notebook import open_cluster
    from .record.bugreport import collect, target
    run_dir, params = target(args.run_dir, args.params)
    print(collect(run_dir, params, open_cluster(params)))
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from .book.redact import mask
    from .params import load
    from .record.status import report
    path = _params(args).expanduser().resolve()
    print(mask(report(load(path), path, args.run, nodes=not args.no_nodes)))
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    from .params import load
    p = load(_params(args))
    print(f"{_params(args)}: valid: deployment {p.name!r}, {len(p.nodes)} node(s) "
          f"({', '.join(f'{n.name}/{n.role}' for n in p.nodes)}), model {p.model.name}, "
          f"TP {p.serving.tensor_parallel_size} x PP {p.serving.pipeline_parallel_size}, "
          f"executor {p.serving.executor}")
    return 0


def cmd_preflight(args: argparse.Namespace) -> int:
    from . import preflight
    from .book.verdict import Verdict
    from .notebook import open_cluster
    from .params import load
    from .steps import preflight as step
    params = load(_params(args))
    verdict = Verdict(step.TITLE, step.checks(params, preflight.gather(params, open_cluster(params))))
    print(verdict.to_text())
    for c in [] if verdict.is_matrix else verdict.failures:  # the matrix lists them below itself
        print(f"FAIL {c.check} on {c.node}: {c.observed}\n  remedy: {c.remedy}")
    return 1 if verdict.failures else 0


def _nccl_bars(args: argparse.Namespace) -> tuple[float, float | None, str]:
    """The bars a pasted nccl-tests table is judged against (busbw GB/s, latency µs, and what they
    are): the DGX Spark pair's, built in, unless ``-p`` names a parameters file."""
    from .collectives.nccltests import PAIR_BARS, PAIR_BUSBW_GBPS, PAIR_LATENCY_US
    if args.params:
        from .params import load
        e = load(args.params).expectations
        busbw, latency, source = e.busbw_gbps, e.allreduce_latency_us, Path(args.params).name
    else:
        busbw, latency, source = PAIR_BUSBW_GBPS, PAIR_LATENCY_US, PAIR_BARS
    shown = f"{latency:g} us" if latency else "none"
    return busbw, latency, f"{source}: busbw >= {busbw:g} GB/s, small all-reduce <= {shown}"


def cmd_diagnose(args: argparse.Namespace) -> int:
    import json
    import textwrap

    from .collectives import nccltests
    from .facts import logread
    found, reports = 0, []
    for name in args.logs:
        source = "<stdin>" if name == "-" else name
        try:
            log = logread.read(name, source)  # line by line, in bounded memory
        except OSError as e:
            print(f"sparkbook: cannot read {name}: {e.strerror or e}", file=sys.stderr)
            return 2
        below = 0
        if run := nccltests.parse(log.table):  # a pasted nccl-tests table: judged as 02 judges its sweep
            text_out, below = nccltests.report(run, source, *_nccl_bars(args))
            if not args.json:
                print(text_out)
        hits, lines, reached = log.matches, log.lines, log.reached
        found += below + len(hits)
        if args.json:
            reports.append({"log": source, "lines": lines, "findings": [h.to_json() for h in hits],
                            "engine": reached.engine, "phase_reached": reached.phase,
                            "phase_line": reached.line, **({"nccl_tests_below_bar": below} if run else {})})
            continue
        print(f"{source}: " + (f"{len(hits)} known failure(s)" if hits else
                               f"no known failure ({lines} lines read)"))
        if reached.phase:
            print(f"  {reached.engine} start-up reached '{reached.phase}' at line {reached.line}: "
                  f"{reached.text[:120]}")
        for h in hits:
            print(f"  {h.name} at {h.where}" + (f" ({h.count} lines)" if h.count > 1 else "")
                  + (f", start-up phase: {h.phase}" if h.phase != "any" else "")
                  + f"; class {h.reason}, remedy {h.fix}" + (" (a catch-all: its cause lists the "
                                                             "possibilities)" if h.catch_all else ""))
            for label, value in (("cause", h.cause), ("evidence", h.evidence), ("detail", h.detail),
                                 ("remedy", h.remedy)):
                if value:
                    print(textwrap.fill(value, 100, initial_indent=f"    {label + ':':<10}",
                                        subsequent_indent=" " * 14, break_long_words=False))
    if args.json:
        print(json.dumps(reports, indent=2))
    return 1 if found else 0


def cmd_discover(args: argparse.Namespace) -> int:
    from .book.errors import CheckFailed
    from .steps import day_one
    try:
        day_one.discover(args.hosts, args.output, template=args.template, name=args.name, user=args.user,
                         port=args.port, key=args.key, known_hosts=args.known_hosts or [], force=args.force,
                         connect_timeout=args.connect_timeout)
    except CheckFailed as e:  # a node that did not answer: said on stdout with the tables, exit code 1
        print(e)
        return 1
    return 0


def cmd_fabric(args: argparse.Namespace) -> int:
    from .book.errors import CheckFailed
    from .steps import day_one
    verdict = day_one.fabric_step(_params(args), args.fabric_command, args.deadline)
    if args.fabric_command == "plan":
        print("fix what is said above, then plan again" if verdict.failures else
              "nothing written: `sparkbook fabric apply` applies it")
    try:
        day_one.conclude(verdict)
    except CheckFailed as e:
        print(e)
        return 1
    return 0


def cmd_service(args: argparse.Namespace) -> int:
    from .book.errors import CheckFailed
    from .steps import day_two
    try:
        out, verdict = day_two.service_step(_params(args), args.service_command, run=args.run,
                                            outputs=args.outputs, image=args.image, min_ratio=args.min_ratio)
        print(day_two.table(out).to_text())
        day_two.conclude(verdict)
    except CheckFailed as e:
        print(e)
        return 1
    return 0


def cmd_lab(args: argparse.Namespace) -> int:
    from .book.tables import Table
    from .lab import Lab, faults
    lab = Lab()
    if args.lab_command == "up":
        path = lab.up(args.nodes, unwired=args.unwired, vllm=args.vllm)
        print(f"parameters: {path}")
    elif args.lab_command == "reboot":
        from .lab.power import reboot
        reboot(lab, args.nodes)
    elif args.lab_command == "down":
        for line in lab.down():
            print(f"  removed {line}")
    elif args.lab_command == "status":
        rows = lab.status()
        print(Table.from_dicts(rows, title="lab").to_text() if rows else "lab: not up")
    elif args.lab_command == "image":
        from .lab import lab_params
        from .lab.image import build, ensure, stack
        image, st = lab_params()["runtime"]["image"], stack(args.vllm)
        if args.tag:  # another image beside the lab's: its model is the lab's own
            print(f"image: {args.tag} ({build(args.tag, force=args.force, st=st)})")
        else:
            if args.force:
                build(image, force=True, st=st)
            print(f"model: {ensure(image, st=st)}")
    elif args.lab_command == "fault":
        rec = faults.apply(lab, args.kind, args.node, port=args.port, rate=args.rate, seconds=args.seconds)
        print(f"lab: fault {rec['kind']} on {rec['node']}: applied")
    elif args.lab_command == "heal":
        healed = faults.heal(lab, args.kind)
        print("lab: healed " + (", ".join(f"{f['kind']} on {f['node']}" for f in healed) or "nothing"))
    return 0


def parser() -> argparse.ArgumentParser:
    from .preflight.checks import summary as checks_summary

    ap = argparse.ArgumentParser(
        prog="sparkbook", description="Runbook for multi-node vLLM on DGX Spark (and other GPU nodes).")
    ap.add_argument("--version", action="version", version=f"sparkbook {__version__}")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("run", help="run the numbered notebooks into a run folder",
                       description="Execute the numbered notebooks in order with papermill into a "
                       "private run folder; skip the steps after the first failing one, except "
                       "teardown, which still runs (see --keep-on-failure); write summary.json and "
                       "report.html. Ctrl-C or SIGTERM stops the running step, runs the teardown and "
                       "exits 130 or 143; a second signal skips the teardown. While a step that "
                       "changes the nodes is selected, the run holds the deployment's lock on the "
                       "head. Exit code 0 only when every step passed.")
    _params_arg(p)
    p.add_argument("--steps", help="comma-separated steps, by number or name (default: all)")
    p.add_argument("--out", metavar="DIR", help="run folder (default: outputs/<UTC time>-<name>/)")
    p.add_argument("--cell-timeout", type=float, default=3600, metavar="S",
                   help="seconds one cell may run (default: 3600)")
    p.add_argument("--kernel", default=None, help="Jupyter kernel name (default: the notebooks')")
    p.add_argument("--notebooks", default=None, metavar="DIR",
                   help="folder of numbered notebooks (default: the project's notebooks/)")
    p.add_argument("--keep-on-failure", action="store_true",
                   help="after a failed or interrupted step, skip teardown too: leave the "
                   "deployment running to look at it (08_teardown removes it later)")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="also papermill's lines (each cell's start and end) and the kernels' own "
                   "output, which otherwise go to logs/kernel-NN_name.log in the run folder")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("unlock", help="break the deployment's lock on the head",
                       description="Remove the lock that a run of the deployment holds on the head "
                       "(whoever holds it) and say whose it was. A run holds it while it changes the "
                       "nodes; break it only when that run is gone (a lock whose holder stopped "
                       "refreshing it is taken over without this).")
    _params_arg(p)
    p.set_defaults(func=cmd_unlock)

    p = sub.add_parser("report", help="rebuild report.html of a run folder",
                       description="Rebuild report.html from a run folder's summary.json and "
                       "executed notebooks.")
    p.add_argument("run_dir", type=Path, metavar="DIR")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("compare", help="compare run folders side by side in compare.html",
                       description="Write compare.html: the runs' key numbers side by side, their "
                       "benchmark, all-reduce and start-up plots overlaid, whether their fingerprints "
                       "make them comparable (and why not), and the history of every run folder of "
                       "the same deployment beside them (busbw and start-up time over time). A piece "
                       "a run lacks shows as absent. Prints the page's path.")
    p.add_argument("run_dirs", type=Path, nargs="+", metavar="RUN", help="run folders, two or more")
    p.add_argument("--out", type=Path, metavar="DIR", help="folder of compare.html (default: the first run's)")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("collect", help="write one archive for a bug report into a run folder",
                       description="Ask every node at once for what a bug report needs (versions "
                       "of the OS, kernel, driver, CUDA, Docker, ConnectX-7 firmware and of every "
                       "package in the serving image or venv; nvidia-smi -q; the kernel log; the logs, "
                       "Ray session logs and NCCL environment of this deployment's containers) and "
                       "archive it with the run folder's parameters, "
                       "verdicts, JSON files and logs, under a summary.md; secrets masked. A node "
                       "that does not answer is noted. Prints the archive's path.")
    p.add_argument("run_dir", type=Path, nargs="?", metavar="RUN",
                   help="run folder (default: the newest under outputs/, of -p's deployment if given)")
    p.add_argument("-p", "--params", default=None, metavar="FILE",
                   help="parameters file (default: the run folder's parameters.yaml)")
    p.set_defaults(func=cmd_collect)

    p = sub.add_parser("preflight", help="check the nodes before launch; exit 1 on any FAIL",
                       description="Run every preflight check on all nodes in parallel and print "
                       "the verdict table, one row per check and node. Exit code 1 when any check "
                       f"fails. The rows: {checks_summary()}.")
    _params_arg(p)
    p.set_defaults(func=cmd_preflight)

    p = sub.add_parser("discover", help="read the nodes and write a parameters file for them",
                       description="Ask every node, in one SSH round trip each and changing nothing, what it "
                       "is (OS, kernel, GPU, memory, the management interface) and what its CX-7 ports are "
                       "(cabled, speed, MTU, PCIe function, addresses, who persists them); then write a "
                       "parameters file: the nodes (hostnames, the first host the head) and their rails from "
                       "what was found, every other section from a template. What could not be decided is a "
                       "comment saying why. Exit code 1 when a node cannot be reached (nothing written).")
    p.add_argument("hosts", nargs="+", metavar="HOST", help="address, host name or ~/.ssh/config alias; the first is the head")
    p.add_argument("-o", "--output", default="parameters/discovered.yaml", help="the file to write (default: %(default)s)")
    p.add_argument("--force", action="store_true", help="replace the output file if it exists")
    p.add_argument("--template", help="the parameters file the other sections come from (default: "
                   "parameters/dgx-spark-pair.yaml, or dgx-spark-quad.yaml for more than two nodes)")
    p.add_argument("--name", default="discovered", help="the deployment's name (default: %(default)s)")
    p.add_argument("--user", help="SSH user on every node (default: ~/.ssh/config's, or yours)")
    p.add_argument("--port", type=int, help="SSH port on every node")
    p.add_argument("--key", help="private key file on this machine")
    p.add_argument("--known-hosts", action="append", metavar="FILE",
                   help="a known_hosts file read besides ~/.ssh/known_hosts (repeatable)")
    p.add_argument("--connect-timeout", type=float, default=10, help="seconds (default: %(default)s)")
    p.set_defaults(func=cmd_discover)

    p = sub.add_parser("fabric", help="the CX-7 rails' netplan file: plan, apply under a guard, restore",
                       description="sparkbook's netplan file on every node (/etc/netplan/40-sparkbook-fabric.yaml): "
                       "the parameters' rails, one subnet per rail, MTU as expected. plan: the diff, what else "
                       "changes, netplan's parser on the node; nothing written. apply: backs up, then a guard on "
                       "each node applies it and restores the backup by itself unless sparkbook confirms over a "
                       "fresh SSH connection with the rails as planned. restore: the newest change undone, files "
                       "byte-identical, addresses as before. The nodes' SSH to each other over the rails (host keys "
                       "read on each node, keys) is planned, added and removed with it. doctor: 01's fabric rows alone (who "
                       "persists each rail, DHCP, MTU, the RoCE GID by type, the path MTU to every peer). Exit code 1 "
                       "on any problem.")
    p.add_argument("fabric_command", choices=("plan", "apply", "restore", "doctor"))
    _params_arg(p)
    p.add_argument("--deadline", type=int, default=90, help="apply: seconds the guard waits for the "
                   "confirmation before it restores (default: %(default)s)")
    p.set_defaults(func=cmd_fabric)

    p = sub.add_parser("service", help="keep a deployment that passed 05 and 06 serving across crashes and reboots",
                       description="install: from the newest run of the deployment whose 05 and 06 passed (or "
                       "--run), every serving node's Ray container again, on the image pinned by ID, under "
                       "Docker's restart policy, with a supervisor that orders the start (the head's Ray, the "
                       "workers, then vllm serve) and restarts vllm serve when it ends; waits until vLLM answers. "
                       "status: the service containers and vLLM's API. remove: this user's service containers "
                       "of the deployment, nothing else. upgrade: the candidate image (--image, on the head) "
                       "through 03-07 and a gate against the service's run (no failed step, the same known "
                       "answers, single-user decode and peak throughput at least --min-ratio of the baseline's); "
                       "promoted when it passes, else rolled back to the previous image, which every node keeps. "
                       "Exit code 1 on any problem.")
    p.add_argument("service_command", choices=("install", "status", "remove", "upgrade"))
    _params_arg(p)
    p.add_argument("--run", metavar="DIR", help="install, upgrade: the run folder whose 05 and 06 passed "
                   "(default: the newest)")
    p.add_argument("--outputs", metavar="DIR", help="the folder of the deployment's run folders (default: outputs/); "
                   "an upgrade's runs go there too")
    p.add_argument("--image", metavar="REF", help="upgrade: the candidate image, present on the head")
    p.add_argument("--min-ratio", type=float, default=0.9, help="upgrade: the candidate's single-user decode and "
                   "peak throughput, at least this of the baseline's (default: %(default)s)")
    p.set_defaults(func=cmd_service)

    p = sub.add_parser("diagnose", help="name known failures in log files; exit 1 when one is found",
                       description="Read vLLM, NCCL, Ray, torch or Docker logs (files, or - for "
                       "stdin), from sparkbook's run folders or from a run made by hand, and name "
                       "each known failure with its cause, the evidence line (file:line) and the "
                       "remedy. No parameters file is needed. A pasted nccl-tests output "
                       "(all_reduce_perf, all_gather_perf) is also judged as 02_collectives judges its "
                       "sweep: busbw at the plateau and the small-message time, against the DGX Spark "
                       "pair's bars (built in) unless -p names a parameters file. Exit code 1 when a "
                       "known failure is found or a table is below a bar, 0 otherwise.")
    p.add_argument("logs", nargs="+", metavar="LOG", help="a log file, or - for stdin")
    p.add_argument("-p", "--params", default=None, metavar="FILE", help="the expectations for "
                   "nccl-tests tables (default: the DGX Spark pair's, built in)")
    p.add_argument("--json", action="store_true", help="the findings as JSON, one entry per log: each "
                   "with its evidence, its cause's class (reason: hardware, fabric, configuration, "
                   "version, resource, transient), its remedy's class (fix: setting, version, restart, "
                   "reboot, power-cycle, reseat-cable) and whether it is a catch-all")
    p.set_defaults(func=cmd_diagnose)

    from .lab.image import STACKS

    p = sub.add_parser("lab", help="the local lab of simulated DGX Spark nodes",
                       description="Build, inspect, break and remove the local lab: N simulated DGX "
                       "Spark nodes on this machine (network namespaces with their own sshd and "
                       "Docker daemon, fabric rails, replayed GPU and RDMA tools). Needs root.")
    lsub = p.add_subparsers(dest="lab_command", required=True, metavar="LAB_COMMAND")
    q = lsub.add_parser("up", help="build the lab (idempotent) and print its parameters file")
    q.add_argument("--nodes", type=int, default=2, help="number of nodes (default: 2)")
    q.add_argument("--unwired", action="store_true", help="fabric links cabled but without addresses, "
                   "at MTU 1500, nothing persisting them: a node fresh from the box (day one)")
    q.add_argument("--vllm", metavar="VERSION", help=f"the lab image's vLLM for CPU: {', '.join(STACKS)} "
                   "(default: the first), each with the Ray of its day")
    q = lsub.add_parser("reboot", help="restart nodes as machines restart: processes and runtime "
                        "state gone, only what is persisted (netplan files, disk) comes back")
    q.add_argument("nodes", nargs="+", metavar="NODE", help="e.g. spark-1")
    lsub.add_parser("down", help="remove everything the lab made")
    lsub.add_parser("status", help="each node's state")
    q = lsub.add_parser("image", help="build the lab's serving image and model (cached)")
    q.add_argument("--force", action="store_true", help="rebuild even when the inputs did not change")
    q.add_argument("--vllm", metavar="VERSION", help=f"its vLLM for CPU: {', '.join(STACKS)} (default: the first)")
    q.add_argument("--tag", metavar="REF", help="tag it REF instead of the lab's serving tag, which the running "
                   "lab keeps (e.g. an upgrade's candidate); no model is made")
    q = lsub.add_parser("fault", help="apply a reversible fault")
    q.add_argument("kind", choices=FAULTS)
    q.add_argument("--node", help="node to break (default: the first worker; the head for port-busy)")
    q.add_argument("--port", type=int, help="port-busy: the port (default: the API port); "
                   "firewall: the port whose TCP is dropped on the fabric (default: the Ray port)")
    q.add_argument("--rate", default="200mbit", help="slow-link, fec: the rate limit (default: 200mbit)")
    q.add_argument("--seconds", type=float, default=90, help="compile: how long the worker compiles (default: 90)")
    q = lsub.add_parser("heal", help="undo faults (all, or one kind)")
    q.add_argument("kind", nargs="?", choices=FAULTS)
    p.set_defaults(func=cmd_lab)

    p = sub.add_parser("status", help="where the deployment stands: its steps, its nodes now",
                       description="Print the state of every numbered step in the deployment's run "
                       "folder (passed, failed, interrupted or not run; when; its verdict's counts and "
                       "first failures), then what runs on the nodes now: sparkbook's containers per "
                       "node (all nodes asked at once; an unreachable node is a row that says so) and "
                       "the endpoint's health. The run folder: --run, else the deployment's newest "
                       "under outputs/ (a `sparkbook run` folder or outputs/interactive-<name>), read "
                       "as `sparkbook report` reads one: a piece that cannot be read is named, one line "
                       "each, and left out. Exit code 0; 2 when its summary.json cannot be read.")
    _params_arg(p)
    p.add_argument("--run", metavar="DIR", help="run folder (default: the deployment's newest)")
    p.add_argument("--no-nodes", action="store_true", help="the run folder only: ask no node")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("validate", help="check a parameters file",
                       description="Validate a parameters file; list every bad field by its path.")
    _params_arg(p)
    p.set_defaults(func=cmd_validate)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.func(args)
    except SparkbookError as e:
        print(f"sparkbook: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("sparkbook: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
