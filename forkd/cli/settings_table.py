"""`forkd config` without the settings model: each FORKD_* setting's name, default, type and doc, and how its value
reads, taken from forkd.base.settings (`python -m forkd.cli.settings_table` writes the table below again; the tests
check that it is current and that what this reads is what the model reads).

It reads only plain spellings it is sure of (a word of a choice, a decimal number within bounds, true/false and
their like, any text for a text or path); anything else sends the whole command to the model, which reads it or
says why not. So `forkd config` shows what the model would, without loading pydantic for the usual environment."""

from __future__ import annotations

import os
import re

# how a value reads: any text (str), a path, a secret (shown as set), true/false words (bool), a decimal int or
# float within `bounds`, one of `choices` (choice); model: only the settings model reads it
BOOLS = {"1": True, "on": True, "t": True, "true": True, "y": True, "yes": True,
         "0": False, "off": False, "f": False, "false": False, "n": False, "no": False}
_INT = re.compile(r"0|[1-9][0-9]{0,17}")
_FLOAT = re.compile(r"(?:0|[1-9][0-9]{0,14})(?:\.[0-9]{1,6})?")
_OPS = {"ge": lambda v, b: v >= b, "gt": lambda v, b: v > b, "le": lambda v, b: v <= b, "lt": lambda v, b: v < b}


class Unsure(Exception):
    """A value only the settings model reads."""


def read(rule: str, bounds: tuple, raw: str) -> object:
    """`raw` as the model reads it, shown as forkd.base.settings.describe shows it; Unsure when not certain."""
    if rule in ("str", "secret"):
        return raw
    if rule == "path":
        from pathlib import PurePosixPath

        return str(PurePosixPath(raw))
    if rule == "choice" and raw in bounds:
        return raw
    if rule == "bool" and raw in BOOLS:
        return BOOLS[raw]
    if rule in ("int", "float") and (_INT if rule == "int" else _FLOAT).fullmatch(raw):
        value = int(raw) if rule == "int" else float(raw)
        if all(_OPS[op](value, b) for op, b in bounds):
            return value
    raise Unsure(raw)


def describe() -> list[dict] | None:
    """Every setting as forkd.base.settings.describe() lists it (as dicts), or None when a value set needs the
    model to read it."""
    rows = []
    for name, rule, bounds, kind, default, doc in ROWS:
        raw = os.environ.get(name, "")
        source, value = ("env", raw) if raw.strip() else ("default", default)
        if source == "env":
            try:
                value = read(rule, bounds, raw)
            except Unsure:
                return None
        if rule == "secret":
            value = "set" if source == "env" else "unset"
        rows.append({"name": name, "value": value, "default": default, "source": source, "type": kind, "doc": doc})
    return rows


def rule_of(info: object) -> tuple[str, tuple]:
    """How `read` reads a field of forkd.base.settings.Settings (its pydantic FieldInfo)."""
    import typing
    from pathlib import Path

    from pydantic import SecretStr

    ann, args = info.annotation, typing.get_args(info.annotation)
    if type(None) in args and len(args) == 2:  # X | None: X's rule (blank is unset, never None)
        ann = args[0] if args[1] is type(None) else args[1]
    bounds = tuple((op, getattr(m, op)) for m in info.metadata for op in _OPS if hasattr(m, op))
    if len(bounds) != len(info.metadata):  # a validator of its own (an alias, a case): the model reads it
        return "model", ()
    if typing.get_origin(ann) is typing.Literal:
        return "choice", typing.get_args(ann)
    rules = {str: "str", Path: "path", SecretStr: "secret", bool: "bool", int: "int", float: "float"}
    return rules.get(ann, "model"), bounds


def generate() -> str:
    """This module's text, with ROWS as the settings model has them now."""
    from forkd.base.settings import Settings

    shown = {r.name: r for r in _defaults()}
    lines = []
    for field, info in Settings.model_fields.items():
        row = shown[f"FORKD_{field.upper()}"]
        rule, bounds = rule_of(info)
        lines.append(f"    ({row.name!r}, {rule!r}, {bounds!r}, {row.type!r},")
        if isinstance(row.default, str) and len(row.default) > 60:  # a long default: literals, as the doc's
            lines += [*_chunks(row.default)[:-1], _chunks(row.default)[-1] + ","]
        else:
            lines.append(f"     {row.default!r},")
        lines += _chunks(row.doc)
        lines[-1] += "),"
    with open(__file__) as f:
        text = f.read()
    start = text.index("\n", text.index("\nROWS: tuple[tuple, ...] = (") + 1) + 1
    end = text.index("\n)  # end of ROWS") + 1
    return text[:start] + "\n".join(lines) + "\n" + text[end:]


def _defaults() -> list:
    """forkd.base.settings.describe() for an environment that sets nothing (the defaults, as it shows them)."""
    from unittest import mock

    from forkd.base.settings import describe

    clean = {k: v for k, v in os.environ.items() if not k.startswith("FORKD_")}
    with mock.patch.dict(os.environ, clean, clear=True):
        return describe()


def _chunks(doc: str, width: int = 100) -> list[str]:
    """`doc` as adjacent string literals of at most about `width` characters, each line indented."""
    parts, cur = [], ""
    for word in re.findall(r"\S+\s*", doc) or [""]:
        if cur and len(cur) + len(word) > width:
            parts.append(cur)
            cur = ""
        cur += word
    parts.append(cur)
    return [f"     {p!r}" for p in parts]


# (name, rule, bounds or choices, type as shown, default as shown, doc): written by generate()
ROWS: tuple[tuple, ...] = (
    ('FORKD_HOME', 'path', (), 'path',
     '/var/lib/forkd',
     'state directory: images, snapshots, children, objects, the daemon socket and audit log'),
    ('FORKD_SHM', 'path', (), 'path',
     '/dev/shm',
     'tmpfs directory for flat memory images and memory staged while snapshotting (falls back to '
     '$FORKD_HOME when missing)'),
    ('FORKD_RUN_DIR', 'path', (), 'path',
     '/run/forkd',
     'host-wide runtime directory: network leases and the host lock'),
    ('FORKD_CGROUP_ROOT', 'path', (), 'path',
     '/sys/fs/cgroup',
     'where the cgroup hierarchy is mounted'),
    ('FORKD_ACCEL', 'choice', ('kvm', 'tcg'), 'kvm|tcg?',
     None,
     'force the accelerator (kvm or tcg) instead of probing'),
    ('FORKD_VMM_DRIVER', 'choice', ('qemu', 'fake'), 'qemu|fake',
     'qemu',
     'the VMM driver: qemu (real microVMs) or fake (ordinary host processes answering the guest protocol: '
     'tests only, no isolation; forkd/vmm/fake.py says what it does not model)'),
    ('FORKD_QEMU', 'str', (), 'str',
     'qemu-system-x86_64',
     'QEMU system emulator binary (name on PATH or a path)'),
    ('FORKD_QEMU_IMG', 'str', (), 'str',
     'qemu-img',
     'qemu-img binary for disk-backed snapshots'),
    ('FORKD_VMM_RUNAS', 'model', (), 'per-child|root',
     'per-child',
     'who the VMMs run as: per-child (default: each VMM, children and build VMMs alike, drops to a uid of '
     'its own with no capabilities once its files are open) or root (opt out: QEMU keeps root; see '
     'SECURITY.md)'),
    ('FORKD_VMM_UID_BASE', 'int', (('ge', 65536), ('le', 4294967294)), 'int',
     268435456,
     'first uid/gid of the range VMMs drop to under FORKD_VMM_RUNAS=per-child: children take the lower '
     'half, build VMMs the upper half; forkd refuses a range that /etc/subuid or /etc/subgid also hands '
     'out'),
    ('FORKD_VMM_UID_COUNT', 'int', (('ge', 2048), ('le', 2147483648)), 'int',
     536870912,
     'how many uids/gids that range holds (at least 2048; with fewer, two children share a uid more often)'),
    ('FORKD_VMM_JAIL', 'bool', (), 'bool',
     True,
     'jail each VMM that dropped root further: a child without a network device gets an empty network '
     'namespace of its own (no host loopback service, no abstract socket), and every dropped VMM is '
     'chrooted into an empty directory once its files are open (no host path resolves for it); every VMM '
     'is born in a mount namespace and a pid namespace of its own; 0 opts out of all three (SECURITY.md)'),
    ('FORKD_MAX_BRANCHES', 'int', (('ge', 1),), 'int',
     2,
     'live branches in flight at once per FORKD_HOME'),
    ('FORKD_BRANCH_LIVE_CAPTURE', 'choice', ('auto', 'pages', 'write-protect'), 'auto|pages|write-protect',
     'auto',
     'how a live branch captures its source: auto (the pages it wrote since its restore, taken in a pause '
     "that grows with them, when they are few and the child has no disk; else the VMM's write-protect of "
     'all of guest RAM), pages (always by pages, however many; refused when it cannot be) or '
     "write-protect (always the VMM's)"),
    ('FORKD_HOST_PYTHON', 'str', (), 'str',
     'python3',
     'host Python that runs pip for `forkd image build --pip`'),
    ('FORKD_IMAGE_ROOTS', 'str', (), 'str',
     '',
     "':'-separated directories a spec's image.oci.ref may name an image under, besides "
     '$FORKD_HOME/image-sources (the path is resolved, symlinks included, and must stay beneath one); '
     '`forkd from-image PATH` from the CLI takes any path'),
    ('FORKD_IMAGE_REGISTRIES', 'str', (), 'str',
     '',
     "','-separated registries (HOST or HOST:PORT; docker.io for Docker Hub) a spec's image.oci.ref may "
     'pull docker://... images from (default: none); `forkd from-image docker://...` from the CLI may '
     'pull from any'),
    ('FORKD_INSECURE_REGISTRIES', 'str', (), 'str',
     '',
     "','-separated registries of FORKD_IMAGE_REGISTRIES that specs pull from over plain HTTP or "
     'unverified TLS (default: none: TLS is verified)'),
    ('FORKD_DEBIAN_MIRROR', 'str', (), 'str',
     'http://deb.debian.org/debian',
     'Debian mirror for Debian-based images'),
    ('FORKD_URL', 'str', (), 'str?',
     None,
     'daemon API over TCP, e.g. http://node:8889 (default: the local unix socket)'),
    ('FORKD_TOKEN', 'secret', (), 'secret?',
     None,
     "bearer token for the daemon's TCP API"),
    ('FORKD_NO_DAEMON', 'bool', (), 'bool',
     False,
     '1: run verbs in-process even when a daemon answers'),
    ('FORKD_DAEMON_SOCKET', 'path', (), 'path?',
     None,
     'the daemon socket the CLI, the operator, the forkd-client SDK and the MCP server reach (default '
     '$FORKD_HOME/forkd.sock, used when a daemon answers there); FORKD_URL wins over it'),
    ('FORKD_RETRY_ATTEMPTS', 'int', (('ge', 1),), 'int',
     4,
     'how many times a client (the CLI, the SDK, the MCP server) sends a request that could not connect, '
     'or got 503 where a retry is safe, before it gives up'),
    ('FORKD_RETRY_WAIT', 'float', (('ge', 0),), 'float',
     0.25,
     "seconds before a client's first retry; each next wait doubles (at most 4 s), with jitter"),
    ('FORKD_HUB', 'str', (), 'str?',
     None,
     'pack hub for push/pull: http://host:port/path or file:///dir'),
    ('FORKD_PACK_MAX_BYTES', 'int', (('ge', 1048576),), 'int',
     68719476736,
     "unpack: the most bytes a pack may unpack to (the sum of its members' sizes; zeros count too)"),
    ('FORKD_PACK_MAX_RATIO', 'int', (('ge', 1),), 'int',
     1000,
     'unpack: the most bytes written to disk per compressed byte read, past the first 64 MiB (zero pages '
     'are left as holes and not counted)'),
    ('FORKD_NODES', 'str', (), 'str',
     '',
     'operator placement: NAME=SOCKET|URL,... of the node daemons (default: one, local)'),
    ('FORKD_NODE_PODS', 'str', (), 'str',
     '',
     "operator: find the node daemons as the Ready pods NAMESPACE/LABEL-SELECTOR names (the DaemonSet's), "
     'each at http://POD-IP:<its container port named api> (https when the pod is annotated '
     'forkd.dev/api-scheme: https); FORKD_NODES wins over it'),
    ('FORKD_OPERATOR_INTERVAL', 'float', (('gt', 0),), 'float',
     10.0,
     "seconds between the operator's periodic reconciles of an object"),
    ('FORKD_OPERATOR_RETRY', 'float', (('gt', 0),), 'float',
     10.0,
     'seconds before the operator retries a failed handler'),
    ('FORKD_OPERATOR_DELETE_WAIT', 'float', (('gt', 0),), 'float',
     60.0,
     "seconds one attempt of the operator's delete handler waits"),
    ('FORKD_PULL_GRACE', 'float', (('ge', 0),), 'float',
     60.0,
     'seconds a node keeps a snapshot the operator pulled there before the object it belongs to is '
     'applied on that node (then unused pulls are collected)'),
    ('FORKD_OPERATOR_RELEASE_RETRY', 'float', (('gt', 0),), 'float',
     2.0,
     "seconds before the operator's delete handler of a ForkParent or ForkLayer tries again while a pool "
     'or layer on the node still forks from it (they are deleted first)'),
    ('FORKD_OPERATOR_REGISTRY', 'str', (), 'str',
     '',
     'operator: HOST[:PORT]/PATH of an OCI repository; when set, a ForkParent or ForkLayer is built on '
     'one node, pushed there as an artifact and pulled by digest on the others (TLS verified unless HOST '
     "is in FORKD_INSECURE_REGISTRIES; credentials where each daemon's skopeo looks); default: every node "
     'builds its own'),
    ('FORKD_LOG_LEVEL', 'model', (), 'DEBUG|INFO|WARNING|ERROR|CRITICAL?',
     None,
     'log level: DEBUG, INFO, WARNING, ERROR (default: INFO for the daemon and operator, WARNING for the '
     'CLI)'),
    ('FORKD_LOG_FORMAT', 'choice', ('text', 'json'), 'text|json',
     'text',
     'log lines as text, or json (one object per line)'),
    ('FORKD_CA', 'path', (), 'path?',
     None,
     "CA bundle (PEM) that clients trust for an https FORKD_URL, e.g. the daemon's self-signed --tls-cert "
     "(default: the system's CAs)"),
    ('FORKD_AUDIT_DENIED_INTERVAL', 'float', (('gt', 0),), 'float',
     60.0,
     "seconds between the audit log's summary lines of refused unauthenticated requests (each summary "
     'carries their count)'),
    ('FORKD_GUEST_IO_THREADS', 'int', (('ge', 1), ('le', 4096)), 'int',
     64,
     "worker threads for the daemon's calls into guests (files, processes, exec), apart from the threads "
     'of its other routes: a slow guest holds these only'),
    ('FORKD_GUEST_IO_PER_CHILD', 'int', (('ge', 1),), 'int',
     8,
     'guest calls (a stream counts while it is open) in flight at once for one child; past it the daemon '
     'answers 429 with Retry-After, naming the child'),
    ('FORKD_GUEST_IO_PER_CLIENT', 'int', (('ge', 1),), 'int',
     32,
     'guest calls in flight at once for one client (a TCP peer address, or a unix socket peer process); '
     'past it: 429 with Retry-After'),
    ('FORKD_JOBS_RUNNING', 'int', (('ge', 1), ('le', 256)), 'int',
     2,
     'builds (snapshots and images, each a job: POST /v1/snapshots/build/..., /v1/images/...) the daemon '
     'runs at once; more wait queued'),
    ('FORKD_JOBS_QUEUED', 'int', (('ge', 0), ('le', 10000)), 'int',
     16,
     'builds that wait queued while FORKD_JOBS_RUNNING run; one more is refused (429, Busy) until one '
     'finishes'),
    ('FORKD_JOBS_KEPT', 'int', (('ge', 1), ('le', 100000)), 'int',
     100,
     'finished jobs the daemon keeps listed (GET /v1/jobs, their records under $FORKD_HOME/jobs), the '
     'newest; older ones are forgotten'),
    ('FORKD_KILL_WAIT_SECONDS', 'float', (('gt', 0),), 'float',
     120.0,
     'seconds `forkd kill` waits for a child another operation is still starting (or stopping) before it '
     'gives up with a conflict'),
    ('FORKD_SANDBOX_TIMEOUT', 'float', (('ge', 0),), 'float',
     300.0,
     'seconds a sandbox made by POST /v1/sandboxes, /fork or forkd fork (in-process or through the '
     "daemon; a daemon's sweeper enforces it) or claimed from a pool without child.ttlSeconds (forkd "
     'claim, POST /v1/pools/{name}/claim) lives unless the call says otherwise or set_timeout extends it; '
     '0 = no timeout (idle pool children never expire until claimed)'),
    ('FORKD_SWEEP_INTERVAL', 'float', (('gt', 0),), 'float',
     1.0,
     "seconds between the daemon's sweeps of expired sandboxes and of throw-away branch snapshots"),
    ('FORKD_BRANCH_TTL', 'float', (('gt', 0),), 'float',
     3600.0,
     'seconds an auto-named branch snapshot (made without a tag) is kept; it is never removed while a '
     'child runs on it or a layer is built on it'),
    ('FORKD_NODE_MEMORY_MIB', 'int', (('gt', 0),), 'int?',
     None,
     "memory (MiB) this node daemon offers to children, reported at GET /v1/node for the operator's "
     "placement (default: the host's MemAvailable)"),
    ('FORKD_PLACEMENT_CHILD_MIB', 'int', (('gt', 0),), 'int',
     128,
     'memory (MiB) the operator counts per warm child of a ForkPool without spec.child.memoryLimitMiB '
     'when it places the pool'),
    ('FORKD_TCG_TB_MIB', 'int', (('ge', 1), ('le', 2048)), 'int',
     32,
     'TCG translation buffer per VMM in MiB (QEMU -accel tcg,tb-size=N): the code cache each child fills '
     'as it runs; a child only touches what it translates'),
    ('FORKD_VMM_MALLOC_ARENA_MAX', 'int', (('ge', 0), ('le', 64)), 'int',
     1,
     "glibc MALLOC_ARENA_MAX for VMM processes (0: glibc's default of 8 per core); one arena keeps less "
     'freed heap per QEMU thread (~1.5 MiB a child, bench/density.py --compare)'),
    ('FORKD_VMM_DETACH', 'bool', (), 'bool',
     False,
     "move each child's VMM out of the daemon's own cgroups in every cgroup v1 hierarchy forkd does not "
     "limit (devices, freezer, pids, ...: to that hierarchy's root under FORKD_CGROUP_ROOT), so that "
     "stopping the daemon's container does not kill its children (the next daemon adopts them); the "
     "DaemonSet sets it. On cgroup v2 the child's one group is outside the daemon's already"),
    ('FORKD_VMM_KSM', 'bool', (), 'bool',
     False,
     "let the kernel's KSM merge identical pages across children (Linux 6.4+): VMMs start mergeable "
     '(guest RAM, heap, TCG code buffer; PR_SET_MEMORY_MERGE) and /sys/kernel/mm/ksm/run=1 must be set by '
     "the host's admin. Off by default: merged pages are a timing side channel between children "
     '(SECURITY.md section 9)'),
    ('FORKD_IDLE_PAGEOUT_SECS', 'float', (('ge', 0),), 'float',
     60.0,
     "seconds a running child's VMM must be idle (under 1 % of a core) before the daemon pages its "
     "private memory (TCG code buffer, heap, the guest pages it copied) out to the host's swap; 0 = "
     'never. Only to zram (compressed RAM) unless FORKD_IDLE_PAGEOUT_DISK; without swap nothing is paged '
     'out (`forkd doctor`: security:swap)'),
    ('FORKD_IDLE_PAGEOUT_DISK', 'bool', (), 'bool',
     False,
     "also page idle children out to a swap that is not zram (a disk, a file): guest memory, a tenant's "
     'secrets included, then reaches that disk (SECURITY.md section 9); encrypt it'),
    ('FORKD_IDLE_SLEEP', 'bool', (), 'bool',
     True,
     'with FORKD_IDLE_PAGEOUT_SECS: an idle child is also stopped (its vCPUs and its clock) when it is '
     'paged out, so it costs no CPU and faults nothing back until its next request, which resumes it and '
     'sets its clock first. Timers inside the guest fire late by the time it slept, and a process waiting '
     'without CPU (on the network) is frozen with it: 0 opts out for children that work between requests '
     '(forkd.sandbox.child)'),
    ('FORKD_PRIME', 'bool', (), 'bool',
     True,
     'each new child of a snapshot whose spawn names no prime commands of its own (ForkPool '
     'spec.child.prime, forkd fork --prime) runs `true` once before it answers as ready, so the guest '
     'code of a fork, an exec and a wait is translated at fork time, not on its first request (under TCG; '
     'a paged-out child pages that code back in instead). It costs each child that code in host memory '
     '(paged out with the rest when idle) and its fork a little longer; a guest that cannot run it (no '
     '/bin/sh) answers unprimed; 0 opts out (forkd.core.requests.PRIME_DOC)'),
    ('FORKD_PAGE_IN_ON_REQUEST', 'bool', (), 'bool',
     True,
     'a request to a child whose VMM has memory in swap (idle page-out) first starts reading it back '
     '(FORKD_PAGE_IN_SCOPE) on another thread while the request runs (forkd.sandbox.child)'),
    ('FORKD_PAGE_IN_SCOPE', 'choice', ('code', 'all'), 'code|all',
     'code',
     "what a request's page-in reads back: code (TCG's translation buffer, which a request runs again "
     "nearly whole; the rest faults back as it is touched) or all (every swapped page of the VMM's "
     'private mappings: ~2x the host CPU per request, bench/density.py --compare)'),
    ('FORKD_GUEST_CMDLINE', 'str', (), 'str',
     'console=ttyS0 quiet panic=-1 nowatchdog nmi_watchdog=0 tsc=reliable clocksource=tsc '
     'sysctl.vm.stat_interval=3600 sysctl.vm.dirty_writeback_centisecs=0 '
     'sysctl.vm.compaction_proactiveness=0 sysctl.kernel.hung_task_timeout_secs=0 '
     'workqueue.power_efficient=1 psi=0',
     "guest kernel command line of parents booted from now on (children restore their parent's running "
     "kernel and never read it); the default turns off the guest's periodic wake-ups, each of which costs "
     'an idle child TCG time'),
)  # end of ROWS

if __name__ == "__main__":
    text = generate()
    with open(__file__, "w") as f:
        f.write(text)
