"""Every FORKD_* environment variable forkd reads, in one place: its type, default and what it does.

    from forkd.base.settings import settings
    settings().home            # Path of $FORKD_HOME, typed and validated

`settings()` reads the environment when called (tests and front ends set variables between calls) and returns a
frozen `Settings`; an unchanged environment gives back the same object. An empty (or blank) variable counts as
unset. A value that does not parse raises InvalidInput naming the variable. `describe()` lists them all for
`forkd config`, with secrets (FORKD_TOKEN) shown only as set/unset.
"""

from __future__ import annotations

import functools
import os
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, SecretStr, TypeAdapter, ValidationError

from forkd.base.errors import InvalidInput

PREFIX = "FORKD_"
LogLevel = Annotated[Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"], BeforeValidator(str.upper)]
_RUNAS_ALIASES = {"1": "per-child", "yes": "per-child"}  # the values of the opt-in days still mean per-child
VmmRunas = Annotated[Literal["per-child", "root"], BeforeValidator(lambda v: _RUNAS_ALIASES.get(v, v))]


def _env(default: Any, doc: str, secret: bool = False, **kw: Any) -> Any:
    return Field(default, description=doc, json_schema_extra={"secret": secret}, **kw)


class Settings(BaseModel):
    """Field `max_branches` is the variable FORKD_MAX_BRANCHES, and so on."""

    model_config = ConfigDict(frozen=True)

    # -- where state lives
    home: Path = _env(Path("/var/lib/forkd"), "state directory: images, snapshots, children, objects, the daemon "
                                              "socket and audit log")
    shm: Path = _env(Path("/dev/shm"), "tmpfs directory for flat memory images and memory staged while "
                                       "snapshotting (falls back to $FORKD_HOME when missing)")
    run_dir: Path = _env(Path("/run/forkd"), "host-wide runtime directory: network leases and the host lock")
    cgroup_root: Path = _env(Path("/sys/fs/cgroup"), "where the cgroup hierarchy is mounted")
    # -- the VMM and the host tools
    accel: Literal["kvm", "tcg"] | None = _env(None, "force the accelerator (kvm or tcg) instead of probing")
    vmm_driver: Literal["qemu", "fake"] = _env("qemu", "the VMM driver: qemu (real microVMs) or fake (ordinary "
                                               "host processes answering the guest protocol: tests only, no "
                                               "isolation; forkd/vmm/fake.py says what it does not model)")
    qemu: str = _env("qemu-system-x86_64", "QEMU system emulator binary (name on PATH or a path)")
    qemu_img: str = _env("qemu-img", "qemu-img binary for disk-backed snapshots")
    vmm_runas: VmmRunas = _env("per-child", "who the VMMs run as: per-child (default: each VMM, children and build "
                                            "VMMs alike, drops to a uid of its own with no capabilities once its "
                                            "files are open) or root (opt out: QEMU keeps root; see SECURITY.md)")
    vmm_uid_base: int = _env(1 << 28, "first uid/gid of the range VMMs drop to under FORKD_VMM_RUNAS=per-child: "
                                      "children take the lower half, build VMMs the upper half; forkd refuses a "
                                      "range that /etc/subuid or /etc/subgid also hands out", ge=1 << 16,
                             le=(1 << 32) - 2)
    vmm_uid_count: int = _env(1 << 29, "how many uids/gids that range holds (at least 2048; with fewer, two "
                                       "children share a uid more often)", ge=2048, le=1 << 31)
    vmm_jail: bool = _env(True, "jail each VMM that dropped root further: a child without a network device gets an "
                                "empty network namespace of its own (no host loopback service, no abstract socket), "
                                "and every dropped VMM is chrooted into an empty directory once its files are "
                                "open (no host path resolves for it); every VMM is born in a mount namespace and "
                                "a pid namespace of its own; 0 opts out of all three (SECURITY.md)")
    max_branches: int = _env(2, "live branches in flight at once per FORKD_HOME", ge=1)
    branch_live_capture: Literal["auto", "pages", "write-protect"] = _env(
        "auto", "how a live branch captures its source: auto (the pages it wrote since its restore, taken in a "
                "pause that grows with them, when they are few and the child has no disk; else the VMM's "
                "write-protect of all of guest RAM), pages (always by pages, however many; refused when it "
                "cannot be) or write-protect (always the VMM's)")
    host_python: str = _env("python3", "host Python that runs pip for `forkd image build --pip`")
    image_roots: str = _env("", "':'-separated directories a spec's image.oci.ref may name an image under, besides "
                                "$FORKD_HOME/image-sources (the path is resolved, symlinks included, and must stay "
                                "beneath one); `forkd from-image PATH` from the CLI takes any path")
    image_registries: str = _env("", "','-separated registries (HOST or HOST:PORT; docker.io for Docker Hub) a spec's "
                                     "image.oci.ref may pull docker://... images from (default: none); `forkd "
                                     "from-image docker://...` from the CLI may pull from any")
    insecure_registries: str = _env("", "','-separated registries of FORKD_IMAGE_REGISTRIES that specs pull from "
                                        "over plain HTTP or unverified TLS (default: none: TLS is verified)")
    debian_mirror: str = _env("http://deb.debian.org/debian", "Debian mirror for Debian-based images")
    # -- reaching a daemon
    url: str | None = _env(None, "daemon API over TCP, e.g. http://node:8889 (default: the local unix socket)")
    token: SecretStr | None = _env(None, "bearer token for the daemon's TCP API", secret=True)
    no_daemon: bool = _env(False, "1: run verbs in-process even when a daemon answers")
    daemon_socket: Path | None = _env(None, "the daemon socket the CLI, the operator, the forkd-client SDK and the MCP "
                                            "server reach (default $FORKD_HOME/forkd.sock, used when a daemon "
                                            "answers there); FORKD_URL wins over it")
    retry_attempts: int = _env(4, "how many times a client (the CLI, the SDK, the MCP server) sends a request that "
                                  "could not connect, or got 503 where a retry is safe, before it gives up", ge=1)
    retry_wait: float = _env(0.25, "seconds before a client's first retry; each next wait doubles (at most 4 s), "
                                   "with jitter", ge=0)
    hub: str | None = _env(None, "pack hub for push/pull: http://host:port/path or file:///dir")
    pack_max_bytes: int = _env(64 << 30, "unpack: the most bytes a pack may unpack to (the sum of its members' "
                                         "sizes; zeros count too)", ge=1 << 20)
    pack_max_ratio: int = _env(1000, "unpack: the most bytes written to disk per compressed byte read, past the "
                                     "first 64 MiB (zero pages are left as holes and not counted)", ge=1)
    # -- the Kubernetes operator
    nodes: str = _env("", "operator placement: NAME=SOCKET|URL,... of the node daemons (default: one, local)")
    node_pods: str = _env("", "operator: find the node daemons as the Ready pods NAMESPACE/LABEL-SELECTOR names (the "
                              "DaemonSet's), each at http://POD-IP:<its container port named api> (https when the "
                              "pod is annotated forkd.dev/api-scheme: https); FORKD_NODES wins over it")
    operator_interval: float = _env(10.0, "seconds between the operator's periodic reconciles of an object", gt=0)
    operator_retry: float = _env(10.0, "seconds before the operator retries a failed handler", gt=0)
    operator_delete_wait: float = _env(60.0, "seconds one attempt of the operator's delete handler waits", gt=0)
    pull_grace: float = _env(60.0, "seconds a node keeps a snapshot the operator pulled there before the object it "
                                   "belongs to is applied on that node (then unused pulls are collected)", ge=0)
    operator_release_retry: float = _env(2.0, "seconds before the operator's delete handler of a ForkParent or "
                                              "ForkLayer tries again while a pool or layer on the node still forks "
                                              "from it (they are deleted first)", gt=0)
    operator_registry: str = _env("", "operator: HOST[:PORT]/PATH of an OCI repository; when set, a ForkParent or "
                                      "ForkLayer is built on one node, pushed there as an artifact and pulled by "
                                      "digest on the others (TLS verified unless HOST is in "
                                      "FORKD_INSECURE_REGISTRIES; credentials where each daemon's skopeo looks); "
                                      "default: every node builds its own")
    # -- logging
    log_level: LogLevel | None = _env(None, "log level: DEBUG, INFO, WARNING, ERROR (default: INFO for the "
                                            "daemon and operator, WARNING for the CLI)")
    log_format: Literal["text", "json"] = _env("text", "log lines as text, or json (one object per line)")
    # -- the daemon's API over TCP (forkd serve --bind; SECURITY.md section 6)
    ca: Path | None = _env(None, "CA bundle (PEM) that clients trust for an https FORKD_URL, e.g. the daemon's "
                                 "self-signed --tls-cert (default: the system's CAs)")
    audit_denied_interval: float = _env(60.0, "seconds between the audit log's summary lines of refused "
                                              "unauthenticated requests (each summary carries their count)", gt=0)
    guest_io_threads: int = _env(64, "worker threads for the daemon's calls into guests (files, processes, exec), "
                                     "apart from the threads of its other routes: a slow guest holds these only",
                                 ge=1, le=4096)
    guest_io_per_child: int = _env(8, "guest calls (a stream counts while it is open) in flight at once for one "
                                      "child; past it the daemon answers 429 with Retry-After, naming the child",
                                   ge=1)
    guest_io_per_client: int = _env(32, "guest calls in flight at once for one client (a TCP peer address, or a "
                                        "unix socket peer process); past it: 429 with Retry-After", ge=1)
    # -- the daemon's build jobs (docs/jobs.md)
    jobs_running: int = _env(2, "builds (snapshots and images, each a job: POST /v1/snapshots/build/..., "
                                "/v1/images/...) the daemon runs at once; more wait queued", ge=1, le=256)
    jobs_queued: int = _env(16, "builds that wait queued while FORKD_JOBS_RUNNING run; one more is refused "
                                "(429, Busy) until one finishes", ge=0, le=10000)
    jobs_kept: int = _env(100, "finished jobs the daemon keeps listed (GET /v1/jobs, their records under "
                               "$FORKD_HOME/jobs), the newest; older ones are forgotten", ge=1, le=100000)
    # -- children's lifetimes and ownership
    kill_wait_seconds: float = _env(120.0, "seconds `forkd kill` waits for a child another operation is still "
                                           "starting (or stopping) before it gives up with a conflict", gt=0)
    sandbox_timeout: float = _env(300.0, "seconds a sandbox made by POST /v1/sandboxes, /fork or forkd fork "
                                         "(in-process or through the daemon; a daemon's sweeper enforces it) or "
                                         "claimed from a pool without child.ttlSeconds (forkd claim, POST "
                                         "/v1/pools/{name}/claim) lives unless the call says "
                                         "otherwise or set_timeout extends it; 0 = no timeout (idle pool children "
                                         "never expire until claimed)", ge=0)
    sweep_interval: float = _env(1.0, "seconds between the daemon's sweeps of expired sandboxes and of "
                                      "throw-away branch snapshots", gt=0)
    branch_ttl: float = _env(3600.0, "seconds an auto-named branch snapshot (made without a tag) is kept; it is "
                                     "never removed while a child runs on it or a layer is built on it", gt=0)
    # -- placement (the operator)
    node_memory_mib: int | None = _env(None, "memory (MiB) this node daemon offers to children, reported at GET "
                                              "/v1/node for the operator's placement (default: the host's "
                                              "MemAvailable)", gt=0)
    placement_child_mib: int = _env(128, "memory (MiB) the operator counts per warm child of a ForkPool without "
                                         "spec.child.memoryLimitMiB when it places the pool", gt=0)
    # -- density: what each VMM and guest costs
    tcg_tb_mib: int = _env(32, "TCG translation buffer per VMM in MiB (QEMU -accel tcg,tb-size=N): the code cache "
                               "each child fills as it runs; a child only touches what it translates", ge=1, le=2048)
    vmm_malloc_arena_max: int = _env(1, "glibc MALLOC_ARENA_MAX for VMM processes (0: glibc's default of 8 per "
                                        "core); one arena keeps less freed heap per QEMU thread (~1.5 MiB a child, "
                                        "bench/density.py --compare)", ge=0, le=64)
    vmm_detach: bool = _env(False, "move each child's VMM out of the daemon's own cgroups in every cgroup v1 "
                                   "hierarchy forkd does not limit (devices, freezer, pids, ...: to that "
                                   "hierarchy's root under FORKD_CGROUP_ROOT), so that stopping the daemon's "
                                   "container does not kill its children (the next daemon adopts them); the "
                                   "DaemonSet sets it. On cgroup v2 the child's one group is outside the "
                                   "daemon's already")
    vmm_ksm: bool = _env(False, "let the kernel's KSM merge identical pages across children (Linux 6.4+): VMMs "
                                "start mergeable (guest RAM, heap, TCG code buffer; PR_SET_MEMORY_MERGE) and "
                                "/sys/kernel/mm/ksm/run=1 must be set by the host's admin. Off by default: merged "
                                "pages are a timing side channel between children (SECURITY.md section 9)")
    idle_pageout_secs: float = _env(60.0, "seconds a running child's VMM must be idle (under 1 % of a core) before "
                                          "the daemon pages its private memory (TCG code buffer, heap, the guest "
                                          "pages it copied) out to the host's swap; 0 = never. Only to zram "
                                          "(compressed RAM) unless FORKD_IDLE_PAGEOUT_DISK; without swap nothing "
                                          "is paged out (`forkd doctor`: security:swap)", ge=0)
    idle_pageout_disk: bool = _env(False, "also page idle children out to a swap that is not zram (a disk, a file): "
                                          "guest memory, a tenant's secrets included, then reaches that disk "
                                          "(SECURITY.md section 9); encrypt it")
    idle_sleep: bool = _env(True, "with FORKD_IDLE_PAGEOUT_SECS: an idle child is also stopped (its vCPUs and its "
                                  "clock) when it is paged out, so it costs no CPU and faults nothing back until its "
                                  "next request, which resumes it and sets its clock first. Timers inside the guest "
                                  "fire late by the time it slept, and a process waiting without CPU (on the "
                                  "network) is frozen with it: 0 opts out for children that work between requests "
                                  "(forkd.sandbox.child)")
    prime: bool = _env(True, "each new child of a snapshot whose spawn names no prime commands of its own (ForkPool "
                             "spec.child.prime, forkd fork --prime) runs `true` once before it answers as ready, so "
                             "the guest code of a fork, an exec and a wait is translated at fork time, not on its "
                             "first request (under TCG; a paged-out child pages that code back in instead). It "
                             "costs each child that code in host memory (paged out with the rest when idle) and "
                             "its fork a little longer; a guest that cannot run it (no /bin/sh) answers unprimed; 0 "
                             "opts out (forkd.core.requests.PRIME_DOC)")
    page_in_on_request: bool = _env(True, "a request to a child whose VMM has memory in swap (idle page-out) first "
                                          "starts reading it back (FORKD_PAGE_IN_SCOPE) on another thread while "
                                          "the request runs (forkd.sandbox.child)")
    page_in_scope: Literal["code", "all"] = _env("code", "what a request's page-in reads back: code (TCG's "
                                                         "translation buffer, which a request runs again nearly "
                                                         "whole; the rest faults back as it is touched) or all "
                                                         "(every swapped page of the VMM's private mappings: ~2x "
                                                         "the host CPU per request, bench/density.py --compare)")
    guest_cmdline: str = _env("console=ttyS0 quiet panic=-1 nowatchdog nmi_watchdog=0 tsc=reliable clocksource=tsc "
                              "sysctl.vm.stat_interval=3600 sysctl.vm.dirty_writeback_centisecs=0 "
                              "sysctl.vm.compaction_proactiveness=0 sysctl.kernel.hung_task_timeout_secs=0 "
                              "workqueue.power_efficient=1 psi=0",
                              "guest kernel command line of parents booted from now on (children restore their "
                              "parent's running kernel and never read it); the default turns off the guest's "
                              "periodic wake-ups, each of which costs an idle child TCG time")

    @property
    def vmm_runas_per_child(self) -> bool:
        return self.vmm_runas == "per-child"

    @property
    def token_value(self) -> str | None:
        return self.token.get_secret_value() if self.token is not None else None


def env_name(field: str) -> str:
    return PREFIX + field.upper()


NAMES: dict[str, str] = {env_name(f): f for f in Settings.model_fields}  # variable name -> field name
_ADAPTERS = {f: TypeAdapter(info.rebuild_annotation()) for f, info in Settings.model_fields.items()}


def _parse(field: str, raw: str) -> Any:
    """One variable's value, typed; InvalidInput naming the variable when it does not parse."""
    try:
        return _ADAPTERS[field].validate_strings(raw)
    except ValidationError as exc:
        msg = "; ".join(e["msg"] for e in exc.errors())
        raise InvalidInput(f"{env_name(field)}={raw!r}: {msg}",
                           hint=f"fix or unset {env_name(field)} (`forkd config` lists every setting)") from None


def _current() -> tuple[tuple[str, str], ...]:
    get = os.environ.get
    return tuple((k, v) for k in NAMES if (v := get(k, "")).strip())


@functools.lru_cache(maxsize=8)
def _build(env: tuple[tuple[str, str], ...]) -> Settings:
    values = {NAMES[k]: _parse(NAMES[k], v) for k, v in env}
    return Settings.model_validate(values)


def settings() -> Settings:
    """The settings in effect now (read from the environment on every call; cached while it is unchanged)."""
    return _build(_current())


def read_one(field: str) -> Any:
    """One setting alone, e.g. read_one("log_level"): for readers that must not fail on another variable's bad
    value (logging is set up before anything else is read)."""
    raw = os.environ.get(env_name(field), "")
    return _parse(field, raw) if raw.strip() else Settings.model_fields[field].default


@dataclass(frozen=True)
class Described:
    name: str
    value: Any  # in effect; secrets: "set" / "unset"
    default: Any
    source: str  # env | default | invalid
    type: str
    doc: str


def _show(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    return value


def describe() -> list[Described]:
    """Every setting with its value in effect, default, source and doc; a bad value is reported, not raised."""
    env = dict(_current())
    out = []
    for field, info in Settings.model_fields.items():
        name = env_name(field)
        secret = bool((info.json_schema_extra or {}).get("secret"))
        source, value = ("env", env[name]) if name in env else ("default", info.default)
        if source == "env":
            try:
                value = _parse(field, value)
            except InvalidInput as exc:
                source, value = "invalid", exc.message
        if secret:
            value = "set" if source == "env" else "unset"
        out.append(Described(name, _show(value), None if secret else _show(info.default), source,
                             _type_name(info.annotation), info.description or ""))
    return out


def _type_name(annotation: Any) -> str:
    """`path`, `int`, `kvm|tcg`, `str?` (optional) ... for people reading `forkd config`."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    origin = typing.get_origin(annotation)
    if origin is Literal:
        return "|".join(map(str, args))
    if origin is Annotated:
        return _type_name(args[0])
    if args and len(args) < len(typing.get_args(annotation)):  # X | None
        return _type_name(args[0]) + "?"
    return {SecretStr: "secret"}.get(annotation, getattr(annotation, "__name__", str(annotation)).lower())
