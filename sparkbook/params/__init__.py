"""The deployment description: one validated model of a parameters file.

A parameters file (YAML, in ``parameters/``) describes the nodes, the runtime, the model, how vLLM
serves it, the ports, what the hardware is expected to deliver and how to benchmark it. It is
validated as a whole before anything runs on a node; every bad field is reported by its path in a
single :class:`ParamsError`.
"""

from __future__ import annotations

import ipaddress
import os
import re
from pathlib import Path
from typing import Any, Literal, Mapping

import yaml
from pydantic import Field, ValidationError, field_validator

from ..book import redact
from ..book.errors import SparkbookError
from ..book.project import project_root
from .endpoint import API_HOSTS, destination, key_may_go
from .fields import (DAY, MAX_VALUES, AbsolutePath, Address, ApiUrl, DockerArgs, Image, KeyVariable, Login,
                     ModelPath, MountPath, NotOption, ServeArgs, TokenVariable, UniqueKeyLoader, Word,
                     field_message, field_path, read_bounded, too_many_values)
from .settings import (CONTEXT, GPUS, PARALLEL, Benchmark, Collectives, Distribution, Expectations, Section,
                       Smoke)

NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"
ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"
SHORT_SECRET = (f"refuse secrets shorter than {redact.MIN_LEN} characters (masking them would "
                "corrupt ordinary text): use a longer one")
SHOWN_PROBLEMS = 30  # one error stays readable: the rest are counted


class Rail(Section):
    """One fabric rail of a node: a RoCE netdev, its address and the HCA behind it."""

    interface: str = Field(pattern=r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,14}$")
    ip: ipaddress.IPv4Address
    prefix: int = Field(24, ge=1, le=32)
    hca: str | None = Field(None, pattern=r"^[A-Za-z0-9_][A-Za-z0-9._-]*$")

    @property
    def network(self) -> ipaddress.IPv4Network:
        return ipaddress.ip_interface(f"{self.ip}/{self.prefix}").network


class Node(Section):
    """A machine of the deployment and how to reach it."""

    name: str = Field(pattern=NAME_RE)
    host: str = Field(min_length=1, description="address or ~/.ssh/config alias")
    user: Login | None = None
    port: int | None = Field(None, ge=1, le=65535, description="the node's sshd port, on every "
                             "address of the node (this machine's SSH and the nodes' own use it)")
    key: NotOption | None = Field(None, description="private key file on this machine (it never "
                                  "leaves it: the nodes use their own keys between them)")
    role: Literal["head", "worker"] = "worker"
    local: bool = Field(False, description="the notebook machine itself: commands run without SSH")
    gpus: int | None = Field(None, ge=0, le=GPUS, description="overrides expectations.gpus_per_node")
    rails: list[Rail] = Field(default_factory=list)

    @property
    def fabric_address(self) -> str:
        """Where the other nodes reach this one: its first rail, else its host."""
        return str(self.rails[0].ip) if self.rails else self.host

    @property
    def peer_target(self) -> str:
        """``user@address`` for SSH from another node, over the fabric."""
        return f"{self.user}@{self.fabric_address}" if self.user else self.fabric_address

    @field_validator("host")
    @classmethod
    def _host_chars(cls, v: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9._:%\[\]-]+", v) or v.startswith("-"):
            raise ValueError("not a host name, address or ssh-config alias")
        return v


class SSH(Section):
    known_hosts: list[NotOption] = Field(
        default_factory=list, description="known_hosts files read besides ~/.ssh/known_hosts and the "
        "system's (/etc/ssh/ssh_known_hosts, or ssh_config's GlobalKnownHostsFile)")
    connect_timeout: float = Field(10, gt=0, le=300)
    command_timeout: float = Field(300, gt=0, le=DAY)
    parallel: int = Field(16, ge=1, le=PARALLEL, description="at most this many nodes are worked on at once")
    forward_agent: bool = Field(False, description="forward this machine's SSH agent to the nodes "
                                "(never by default, whatever ~/.ssh/config says)")


class Runtime(Section):
    kind: Literal["docker", "venv"] = Field("docker", description="docker (venv is reserved: not "
                                            "implemented yet)")
    image: Image | None = None
    venv: str | None = Field(None, description="reserved for runtime.kind venv (a virtualenv holding "
                             "vllm on every node), which is not implemented yet")
    container_name: str | None = Field(None, pattern=NAME_RE, description="vllm serve's container "
                                       "(default sparkbook-<name>-vllm)")
    gpus: bool = Field(True, description="pass --gpus all to containers")
    shm_size: str = Field("16g", pattern=r"^[0-9]{1,15}[bkmgBKMG]?$")
    privileged: bool = False
    rdma: bool = Field(True, description="give containers the RDMA devices (/dev/infiniband, IPC_LOCK)")
    ptrace: bool = Field(False, description="give containers SYS_PTRACE, so that a stalled start-up's "
                         "sample reads vLLM's workers' Python stacks with py-spy where the host's Yama "
                         "restricts ptrace (Ubuntu's default); without it the sample has their threads only")
    docker_root: AbsolutePath | None = Field(None, description="Docker data root, for the disk check")
    hf_cache: MountPath | None = Field(None, description="Hugging Face cache on every node, mounted "
                                       "into the serving container (absolute path)")
    nccl_ib_gid_index: int = Field(3, ge=0, le=255, description="RoCE v2 GID index for NCCL (3 on DGX OS)")
    entrypoint: str | None = Field(
        None, min_length=1,
        description="program every sparkbook container starts its command through (an image's "
        "entrypoint wrapper, e.g. /opt/nvidia/nvidia_entrypoint.sh); by default each command's own "
        "program is the entrypoint, whatever the image declares")
    docker_args: DockerArgs = Field(
        default_factory=list, description="extra `docker run` options for every sparkbook "
        "container, each one item `--flag=value` (or `--flag`); not the ones sparkbook sets itself")

    @field_validator("kind")
    @classmethod
    def _kind(cls, v: str) -> str:
        if v == "venv":
            raise ValueError("not implemented yet; use docker")
        return v

    @field_validator("venv")
    @classmethod
    def _venv(cls, v: str | None) -> str | None:
        if v is not None:
            raise ValueError("reserved for runtime.kind venv, which is not implemented yet: remove it")
        return v

    @field_validator("entrypoint")
    @classmethod
    def _entrypoint(cls, v: str | None) -> str | None:
        if v is not None and (v.startswith("-") or any(c.isspace() for c in v)):
            raise ValueError(f"must be one program (a path or a name), not {v!r}")
        return v


class ModelSpec(Section):
    name: Word = Field(min_length=1, description="the model's repository on the Hugging Face hub "
                       "(what model.source hf downloads)")
    path: ModelPath = Field(min_length=1, description="directory of the model on every node")
    source: Literal["head", "hf"] = Field(
        "head", description="head: the head already holds the model at model.path; hf: 03 "
        "downloads model.name at model.revision from the hub onto the head first (resumable)")
    revision: Word | None = Field(None, description="the hub revision (a commit, branch or tag) "
                                  "03's hub download fetches (model.source hf); pin a commit for "
                                  "runs that can be compared")
    hf_token_env: TokenVariable = Field(
        "HF_TOKEN",
        description="environment variable of the notebook machine holding the token",
    )
    needs_token: bool = False
    size_gb: float | None = Field(None, ge=0, le=100_000, description="the model's size on disk, GB: "
                                  "01's memory fit estimates the weights from it until the model is on "
                                  "the head")
    verify: Literal["configs", "all"] = Field(
        "all", description="what 01 and 03 compare by SHA-256 besides names and sizes: every file "
        "(each node's digests are cached by device, inode, size and times, so only new or changed "
        "files are read again), or only the config, tokenizer and index files")


class Serving(Section):
    engine: Literal["vllm"] = Field("vllm", description="the serving engine: vllm, the only one built "
                                    "(sparkbook/serving/vllm.py holds its names; SGLang is planned)")
    nodes: list[str] | None = Field(
        None, description="names of the nodes that serve, the head among them (default: all); "
        "the others still take part in preflight, the all-reduce and distribution")
    tensor_parallel_size: int = Field(1, ge=1, le=PARALLEL)
    pipeline_parallel_size: int = Field(1, ge=1, le=PARALLEL)
    executor: Literal["ray", "mp"] = "ray"
    max_model_len: int | None = Field(None, ge=16, le=CONTEXT)
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    served_model_name: Word | None = None
    reasoning_parser: Word | None = None
    tool_call_parser: Word | None = None
    extra_args: ServeArgs = Field(default_factory=list, description="more `vllm serve` options, "
                                  "each item one argument (no secret: --api-key, --hf-token)")
    env: dict[str, str] = Field(default_factory=dict, description="more environment of the serving "
                                "containers; a value named like a secret (HF_TOKEN...) is masked")
    startup_timeout: float = Field(1800, gt=0, le=DAY)
    stall_timeout: float = Field(
        600, gt=0, le=DAY, description="seconds without progress on any node (no new log line, no "
        "CPU used by vLLM) after which 05 calls the start-up stalled, naming the phase")
    ray_object_store_gb: float = Field(
        4, gt=0, le=1024, description="Ray's object store cap per node: on GB10 it comes out of the unified "
        "memory the model needs")
    drop_page_cache: bool = Field(False, description="drop the serving nodes' page cache just before 05 "
                                  "starts vLLM (root, or sudo -n: it never prompts); reported in 05")
    api_url: ApiUrl | None = Field(None, description="where this machine reaches the API (default "
                                "http://<head host>:<ports.api>); elsewhere, the API key goes "
                                "there only if $SPARKBOOK_API_HOSTS lists it")
    bind: Address | None = Field(None, description="the address vLLM's API listens on, on the head "
                                 "(default: the head's management address, which this machine "
                                 "reaches); 0.0.0.0 only when asked for")
    api_key_env: KeyVariable | None = Field(
        None, description="environment variable of this machine holding an API key (VLLM_API_KEY "
        "or a SPARKBOOK_ name): vLLM requires it (it reaches vLLM through its environment), 05/06/07 "
        "send it, and it is masked everywhere")

    @field_validator("env")
    @classmethod
    def _env_names(cls, v: dict[str, str]) -> dict[str, str]:
        bad = [k for k in v if not re.fullmatch(ENV_NAME, k)]
        if bad:
            raise ValueError(f"not environment variable names: {', '.join(map(repr, bad))}")
        lines = [k for k, value in v.items() if "\n" in value or "\0" in value]
        if lines:
            raise ValueError(f"values must be one line: {', '.join(lines)}")
        return v


class Ports(Section):
    api: int = Field(8000, ge=1, le=65535)
    ray: int = Field(6379, ge=1, le=65535)
    dashboard: int = Field(8265, ge=1, le=65535)
    master: int = Field(29501, ge=1, le=65535)


class Params(Section):
    """A whole deployment."""

    name: str = Field(pattern=NAME_RE)
    description: str = ""
    lab: bool = Field(False, description="the nodes are the local lab's (`sparkbook lab up`)")
    nodes: list[Node] = Field(min_length=1)
    ssh: SSH = Field(default_factory=SSH)
    runtime: Runtime = Field(default_factory=Runtime)
    model: ModelSpec
    serving: Serving = Field(default_factory=Serving)
    ports: Ports = Field(default_factory=Ports)
    expectations: Expectations = Field(default_factory=Expectations)
    collectives: Collectives = Field(default_factory=Collectives)
    distribution: Distribution = Field(default_factory=Distribution)
    benchmark: Benchmark = Field(default_factory=Benchmark)
    smoke: Smoke = Field(default_factory=Smoke)

    @property
    def head(self) -> Node:
        return next(n for n in self.nodes if n.role == "head")

    @property
    def workers(self) -> list[Node]:
        return [n for n in self.nodes if n.role != "head"]

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(f"no node named {name!r} (nodes: {', '.join(n.name for n in self.nodes)})")

    @property
    def serving_nodes(self) -> list[Node]:
        """The nodes that run serving containers (Ray or vllm serve): the head first (rank 0 with
        mp, where the API runs), then the others in the parameters' order."""
        names = self.serving.nodes
        return [self.head] + [n for n in self.workers if names is None or n.name in names]

    @property
    def by_address(self) -> dict[str, str]:
        """Node names by fabric address (how Ray and vLLM's logs name the nodes)."""
        return {n.fabric_address: n.name for n in self.nodes}

    @property
    def collectives_master(self) -> tuple[str, int]:
        """02's torch rendezvous: the head's fabric address, ``collectives.master_port`` or the
        port after ``ports.master`` (which vLLM's own rendezvous takes)."""
        return self.head.fabric_address, self.collectives.master_port or self.ports.master + 1

    @property
    def endpoint(self) -> str:
        """The OpenAI-compatible API's base URL as this machine reaches it."""
        url = self.serving.api_url or f"http://{self.head.host}:{self.ports.api}"
        return url.rstrip("/")

    @property
    def served_model(self) -> str:
        """The model's name in the API: what clients put in ``model``."""
        return self.serving.served_model_name or self.model.path

    def gpus_of(self, node: Node) -> int:
        return self.expectations.gpus_per_node if node.gpus is None else node.gpus


FIELDS = tuple(Params.model_fields)


class ParamsError(SparkbookError):
    """A parameters file that does not validate; lists every bad field by its path."""

    def __init__(self, source: str, problems: list[tuple[str, str]]):
        self.source = source
        self.problems = problems
        lines = [f"{source}: {len(problems)} invalid field{'s' if len(problems) != 1 else ''}"]
        lines += [f"  {path}: {msg}" for path, msg in problems[:SHOWN_PROBLEMS]]
        if len(problems) > SHOWN_PROBLEMS:
            lines.append(f"  (and {len(problems) - SHOWN_PROBLEMS} more)")
        super().__init__("\n".join(lines))


def _semantic_problems(p: Params) -> list[tuple[str, str]]:
    """Checks that span several fields: run only once every field is valid on its own."""
    problems: list[tuple[str, str]] = []
    heads = [i for i, n in enumerate(p.nodes) if n.role == "head"]
    if len(heads) != 1:
        problems.append(("nodes", f"exactly one node must have role 'head' (found {len(heads)})"))
    seen: dict[str, str] = {}
    for i, n in enumerate(p.nodes):
        if n.name in seen:
            problems.append((f"nodes[{i}].name", f"duplicate of {seen[n.name]} ({n.name!r})"))
        else:
            seen[n.name] = f"nodes[{i}].name"
    ips: dict[str, str] = {}
    for i, n in enumerate(p.nodes):
        ifaces: dict[str, str] = {}
        nets: dict[ipaddress.IPv4Network, str] = {}
        for j, r in enumerate(n.rails):
            here = f"nodes[{i}].rails[{j}]"
            if str(r.ip) in ips:
                problems.append((f"{here}.ip", f"address {r.ip} is also {ips[str(r.ip)]}"))
            else:
                ips[str(r.ip)] = f"{here}.ip"
            if r.interface in ifaces:
                problems.append((f"{here}.interface", f"duplicate of {ifaces[r.interface]}"))
            ifaces[r.interface] = f"{here}.interface"
            if r.network in nets:
                problems.append((f"{here}.ip", f"rail on the same subnet {r.network} as {nets[r.network]}: "
                                 "each rail needs its own subnet"))
            nets[r.network] = here
    if len({len(n.rails) for n in p.nodes}) > 1:
        problems.append(("nodes", "every node needs the same number of rails "
                         f"(found {', '.join(str(len(n.rails)) + ' on ' + n.name for n in p.nodes)})"))
    if p.distribution.transport == "tcp" and not p.nodes[0].rails:
        problems.append(("distribution.transport", "tcp listens on the fabric address only: the nodes need rails"))
    ports = p.ports.model_dump()
    for k, v in ports.items():
        others = [o for o, w in ports.items() if w == v and o != k]
        if others and k < others[0]:
            problems.append((f"ports.{k}", f"port {v} is also ports.{others[0]}"))
    if len(heads) == 1:
        problems += _serving_problems(p)
    if p.runtime.kind == "docker" and not p.runtime.image:
        problems.append(("runtime.image", "required when runtime.kind is 'docker'"))
    if p.serving.stall_timeout > p.serving.startup_timeout:
        problems.append(("serving.stall_timeout", f"{p.serving.stall_timeout:g} s is longer than "
                         f"serving.startup_timeout ({p.serving.startup_timeout:g} s): it could never fire"))
    return problems + _same_host_problems(p) + _secret_problems(p) + _key_destination_problems(p)


def _same_host_problems(p: Params) -> list[tuple[str, str]]:
    """One machine under two names (two nodes reached by SSH at the same host and port): each would
    be worked on twice, at once. Local nodes are not reached by SSH (tests run several)."""
    problems, seen = [], {}
    for i, n in enumerate(p.nodes):
        if n.local:
            continue
        where = (n.host.lower().rstrip("."), n.port or 22)
        if where in seen:
            j = seen[where]
            problems.append((f"nodes[{i}].host", f"node {n.name!r} is the same host as node "
                             f"{p.nodes[j].name!r} (nodes[{j}]): {n.host} port {where[1]}"))
        else:
            seen[where] = i
    return problems


def _secret_problems(p: Params) -> list[tuple[str, str]]:
    """Secrets too short to be masked: in this machine's environment (the variables the parameters
    name) or written in the parameters file (``serving.env``). Their values are never shown."""
    problems = []
    for field, name in (("model.hf_token_env", p.model.hf_token_env),
                        ("serving.api_key_env", p.serving.api_key_env)):
        value = os.environ.get(name) if name else None
        if value and len(value) < redact.MIN_LEN:
            problems.append((field, f"${name} on this machine holds a secret shorter than "
                             f"{redact.MIN_LEN} characters: {SHORT_SECRET}"))
    for name in secrets_written(p):
        if len(p.serving.env[name]) < redact.MIN_LEN:
            problems.append((f"serving.env.{name}", f"{name} is written in the parameters and "
                             f"shorter than {redact.MIN_LEN} characters: {SHORT_SECRET}"))
    return problems


def _key_destination_problems(p: Params) -> list[tuple[str, str]]:
    """The API key goes to the deployment's own API (the head at ports.api, where 05 starts it), or
    to a destination the operator lists in $SPARKBOOK_API_HOSTS, outside the parameters file."""
    name, url = p.serving.api_key_env, p.serving.api_url
    if not (name and url) or key_may_go(url, p.head.host, p.ports.api):
        return []
    host, port = destination(url)
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return [("serving.api_url", f"{where} is not this deployment's API ({p.head.host} port "
             f"{p.ports.api}: the head and ports.api), and the key of serving.api_key_env (${name}) "
             f"would be sent there: remove serving.api_url, or, if you trust {where}, list it in "
             f"${API_HOSTS} on this machine (not in the parameters file)")]


def secrets_written(p: Params) -> list[str]:
    """The names of ``serving.env`` entries that hold secrets (named like one, or like the
    variables the parameters name for the token and the API key)."""
    named = {p.model.hf_token_env, p.serving.api_key_env}
    return [k for k, v in p.serving.env.items() if v and (redact.NAMES.search(k.upper()) or k in named)]


def _serving_problems(p: Params) -> list[tuple[str, str]]:
    """The serving nodes, their GPUs, the parallel sizes and the executor against each other."""
    s, problems = p.serving, []
    names = {n.name for n in p.nodes}
    for i, name in enumerate(s.nodes or []):
        if name not in names:
            problems.append((f"serving.nodes[{i}]", f"no node named {name!r} (nodes: {', '.join(sorted(names))})"))
        elif s.nodes.index(name) != i:
            problems.append((f"serving.nodes[{i}]", f"{name!r} is named twice"))
    if s.nodes is not None and p.head.name not in s.nodes:
        problems.append(("serving.nodes", f"must include the head {p.head.name!r}: the Ray head and "
                         "vLLM's API run there"))
    if problems:
        return problems
    serving = p.serving_nodes
    gpus = [p.gpus_of(n) for n in serving]
    world = s.tensor_parallel_size * s.pipeline_parallel_size
    sizes = (f"tensor_parallel_size {s.tensor_parallel_size} x pipeline_parallel_size "
             f"{s.pipeline_parallel_size} = {world} GPUs")
    which = (f"the {len(serving)} serving nodes" + ("" if s.nodes else " (serving.nodes: all by default)")
             + f" have {sum(gpus)} GPUs")
    if len(serving) == 1 and sum(gpus) and world > sum(gpus):
        problems.append(("serving.tensor_parallel_size", f"{sizes}, but {which}"))
    elif len(serving) > 1 and sum(gpus) and world != sum(gpus):
        fewer = [k for k in range(1, len(serving)) if sum(gpus[:k]) == world]
        hint = (f"name {fewer[0]} node(s) in serving.nodes" if fewer
                else "change the parallel sizes")
        problems.append(("serving.tensor_parallel_size",
                         f"{sizes}, but {which}: across nodes every serving GPU takes one rank ({hint}, "
                         "or set pipeline_parallel_size to spread the layers)"))
    if s.executor == "mp" and len(serving) > 1 and len(set(gpus)) > 1:
        problems.append(("serving.executor", "mp puts the same number of ranks on every node, but the "
                         "serving nodes' GPUs differ (" + ", ".join(f"{n.name} {g}" for n, g in zip(serving, gpus))
                         + "): use ray, or serve on nodes with as many GPUs each"))
    elif s.executor == "mp" and len(serving) > 1 and world % len(serving):
        problems.append(("serving.executor", f"mp needs the world size ({world}) to divide evenly over "
                         f"the {len(serving)} serving nodes (vLLM's --nnodes)"))
    return problems


def validate(data: Any, source: str = "parameters") -> Params:
    """Validate a mapping (as read from YAML or injected by papermill) into :class:`Params`."""
    if not isinstance(data, Mapping):
        raise ParamsError(source, [("(top level)", "must be a mapping of fields")])
    if too_many_values(data):
        raise ParamsError(source, [("(top level)", f"more than {MAX_VALUES} values (an alias counts "
                                    "each time it is used): not a parameters file")])
    try:
        params = Params.model_validate(dict(data))
    except ValidationError as e:
        problems = [(field_path(err["loc"]), field_message(err)) for err in e.errors()]
        raise ParamsError(source, problems) from None
    # secret values are masked wherever sparkbook writes text: those of the environment variables
    # the parameters name, and those written in the parameters
    redact.protect(params.model.hf_token_env)
    if params.serving.api_key_env:
        redact.protect(params.serving.api_key_env)
    for name in secrets_written(params):
        if len(params.serving.env[name]) >= redact.MIN_LEN:
            redact.protect_value(params.serving.env[name])
    problems = _semantic_problems(params)
    if problems:
        raise ParamsError(source, problems)
    return params


def read(path: str | os.PathLike[str]) -> Any:
    """A parameters file's YAML, not yet validated (a key given twice is an error, not the last
    one silently kept)."""
    path = Path(path)
    try:
        text = read_bounded(path)
    except ValueError as e:
        raise ParamsError(str(path), [("(file)", str(e))]) from None
    try:
        return yaml.load(text, Loader=UniqueKeyLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "(file)"
        raise ParamsError(str(path), [(where, f"not valid YAML: {getattr(e, 'problem', e)}")]) from None


def load(path: str | os.PathLike[str]) -> Params:
    """Read and validate a parameters file."""
    return validate(read(path), str(path))


def default_params_file() -> Path:
    """``$SPARKBOOK_PARAMS`` when set, else ``parameters/lab.yaml`` of the project."""
    env = os.environ.get("SPARKBOOK_PARAMS")
    return Path(env).expanduser() if env else project_root() / "parameters" / "lab.yaml"
