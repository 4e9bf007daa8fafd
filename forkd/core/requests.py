"""The typed requests the core accepts: validated once, here, when they are made.

Front ends and the spec models build these (the spec's field types are the aliases below, so a rule is written
once); the core trusts what the type guarantees and does not check it again. A request that breaks a rule raises
InvalidInput naming the field and the rule (`Request.of(...)` turns pydantic's ValidationError into it).

  ParentBuild  boot a parent, warm it, pause it to a snapshot
  LayerBuild   restore a snapshot, run steps, store the pages that differ as a layer on it
  Compaction   write a chain head as a base snapshot under a new tag
  Branch       snapshot a running child (live, full or diff)
  Spawn        restore n children of a snapshot

Egress (what an isolated child may reach on the network) is declared here once: `none` (nothing: the default),
`internet` (public addresses only: never link-local, RFC 1918, CGNAT, loopback, multicast or the host), or
`{allow: ["CIDR:port", ...]}` (exactly those IPv4 destinations, TCP and UDP). IPv6 is always denied.
forkd.sandbox.firewall turns it into nftables rules.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Annotated, Any, Literal, Self

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from forkd.base.errors import InvalidInput
from forkd.base.names import check_tag

MAX_FORK = 1000
MIN_MEMORY_LIMIT_MIB = 64
MAX_EGRESS_RULES = 64
MAX_PRIME = 8
PRIME_DOC = ("shell commands each new child runs once, right after it is forked and before it answers as ready "
             "(before a pool counts or hands it out); a command that exits non-zero (or outlasts the spawn's "
             "timeout) fails the spawn, like any child that fails to start. Under TCG a child's first exec "
             "translates the guest's fork/exec code: priming moves that to fork time, so its first exec answers "
             "sooner, for more host memory per child while it is awake (docs/benchmarks.md). None given: `true` "
             "(FORKD_PRIME=0 turns that default off). At most 8, each 1-4096 characters")
DEFAULT_PRIME = ("true",)


def prime_of(given: tuple[str, ...], default_on: bool) -> tuple[str, ...]:
    """The prime commands a spawn runs: those it names, else DEFAULT_PRIME while FORKD_PRIME is on."""
    return given or (DEFAULT_PRIME if default_on else ())


def _module_name(name: str) -> str:
    if not name or not all(part.isidentifier() for part in name.split(".")):
        raise ValueError(f"{name!r} is not a module name")
    return name


def _tag(tag: str) -> str:
    try:
        return check_tag(tag)
    except InvalidInput as exc:
        raise ValueError(f"{exc.message} ({exc.hint})") from None


Tag = Annotated[str, AfterValidator(_tag)]
ModuleName = Annotated[str, AfterValidator(_module_name)]
MemoryMiB = Annotated[int, Field(ge=128, le=65536, description="guest RAM in MiB")]
Vcpus = Annotated[int, Field(ge=1, le=64, description="virtual CPUs")]
NetworkMode = Literal["none", "isolated"]
BranchMode = Literal["live", "diff", "full"]
MemoryLimitMiB = Annotated[int, Field(ge=MIN_MEMORY_LIMIT_MIB, description="the child's host memory limit in MiB")]
Labels = dict[str, str]
PrimeCommand = Annotated[str, Field(min_length=1, max_length=4096)]
Prime = Annotated[tuple[PrimeCommand, ...], Field(max_length=MAX_PRIME, description=PRIME_DOC)]


def _allow_rule(rule: str) -> str:
    """`CIDR:port` or `CIDR:lo-hi` (IPv4; a bare address is /32) -> its normal form `a.b.c.d/n:port[-hi]`."""
    net, sep, ports = rule.strip().rpartition(":")
    if not sep or not net or not ports:
        raise ValueError(f"{rule!r} is not CIDR:port (e.g. 10.0.0.0/8:5432 or 192.0.2.7:8000-8080)")
    try:
        cidr = ipaddress.ip_network(net, strict=True)
    except ValueError as exc:
        raise ValueError(f"{rule!r}: {exc}") from None
    if cidr.version != 4:
        raise ValueError(f"{rule!r}: children have no IPv6 egress (IPv6 is always denied); allow IPv4 addresses")
    lo, _, hi = ports.partition("-")
    if not (lo.isdigit() and (not hi or hi.isdigit())) or not 1 <= int(lo) <= int(hi or lo) <= 65535:
        raise ValueError(f"{rule!r}: the port must be 1-65535 or a range lo-hi within it")
    return f"{cidr}:{int(lo)}" + (f"-{int(hi)}" if hi and int(hi) != int(lo) else "")


AllowRule = Annotated[str, AfterValidator(_allow_rule)]
EgressMode = Literal["none", "internet"]


class EgressAllow(BaseModel):
    """Egress to exactly these IPv4 destinations (TCP and UDP), private or the host's bridge address included."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    allow: tuple[AllowRule, ...] = Field(min_length=1, max_length=MAX_EGRESS_RULES,
                                         description="CIDR:port or CIDR:lo-hi, e.g. 10.0.0.0/8:5432")


Egress = EgressMode | EgressAllow
EGRESS_DOC = ("what an isolated child may reach: none (nothing, the default), internet (public IPv4 addresses "
              "only: never link-local/metadata, RFC 1918, CGNAT or the host), or {allow: [CIDR:port, ...]} "
              "(exactly those; the host's 10.200.0.1 too if listed). IPv6 is always denied")


_EGRESS = TypeAdapter(Egress)


def parse_egress(value: Any, field: str = "egress") -> Egress:
    """A recorded or given egress ("none", "internet", {"allow": [...]}) as the type; InvalidInput naming `field`
    when it is none of those."""
    try:
        return _EGRESS.validate_python(value)
    except ValidationError as exc:
        raise invalid(field, exc) from None


def egress_json(egress: Egress) -> str | dict[str, list[str]]:
    """An egress as records and views show it: "none", "internet" or {"allow": [...]}."""
    return egress if isinstance(egress, str) else {"allow": list(egress.allow)}


class Request(BaseModel):
    """A frozen, validated request. Build it with `Kind.of(...)` to get InvalidInput instead of pydantic's error."""

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    @classmethod
    def of(cls, *, flags: dict[str, str] | None = None, **fields: Any) -> Self:
        """`flags` maps a field to what the caller's user typed for it (a CLI flag): errors then name that, and
        the value given, instead of the field."""
        try:
            return cls(**fields)
        except ValidationError as exc:
            raise (invalid(cls.__name__, exc) if flags is None else invalid_flags(flags, exc)) from None


def invalid_flags(flags: dict[str, str], exc: ValidationError) -> InvalidInput:
    """InvalidInput naming the flag and value that broke a rule (`--memory-mib 1: must be at least 128`)."""
    parts, named = [], []
    for err in exc.errors(include_url=False):
        field = str(err.get("loc", ("?",))[0])
        flag = flags.get(field, field)
        named.append(flag)
        value = err.get("input")
        shown = f" {value}" if isinstance(value, int | float | str) else ""
        parts.append(f"{flag}{shown}: {_rule(err)}")
    return InvalidInput("; ".join(parts), hint=f"fix {', '.join(dict.fromkeys(named))} and run the command again")


def _rule(err: dict) -> str:
    """pydantic's message as a rule: 'must be at least 128', not 'Input should be greater than or equal to 128'."""
    ctx = err.get("ctx") or {}
    kind = err.get("type")
    if kind == "greater_than_equal":
        return f"must be at least {ctx['ge']}"
    if kind == "less_than_equal":
        return f"must be at most {ctx['le']}"
    if kind == "greater_than":
        return f"must be more than {ctx['gt']}"
    if kind == "less_than":
        return f"must be less than {ctx['lt']}"
    if kind == "value_error":
        return str(ctx.get("error") or err.get("msg"))
    return str(err.get("msg", "invalid")).replace("Input should be", "must be")


def invalid(what: str, exc: ValidationError) -> InvalidInput:
    """InvalidInput naming every field that broke a rule (`memory_mib: Input should be >= 128`)."""
    parts = []
    for err in exc.errors(include_url=False):
        loc = ".".join(str(x) for x in err.get("loc", ())) or "request"
        parts.append(f"{loc}: {err.get('msg', 'invalid')}")
    return InvalidInput(f"invalid {what}: " + "; ".join(parts), hint="fix the field(s) named and try again")


class ParentBuild(Request):
    tag: Tag
    memory_mib: MemoryMiB = 512
    vcpus: Vcpus = 1
    warm_imports: tuple[ModuleName, ...] = ()
    warm_run: tuple[str, ...] = ()
    warm_exec: tuple[str, ...] = ()
    labels: Labels = Field(default_factory=dict)
    network: NetworkMode = "none"
    image_id: str | None = None
    boot_timeout: float = Field(90.0, gt=0)


class LayerBuild(Request):
    tag: Tag
    parent_tag: Tag
    run: tuple[str, ...] = ()
    imports: tuple[ModuleName, ...] = ()
    code: tuple[str, ...] = ()
    labels: Labels = Field(default_factory=dict)


class Compaction(Request):
    from_tag: Tag
    to_tag: Tag
    labels: Labels = Field(default_factory=dict)

    @model_validator(mode="after")
    def _new_tag(self) -> Self:
        if self.to_tag == self.from_tag:
            raise ValueError("compaction needs a new tag: to_tag must differ from from_tag")
        return self


class Branch(Request):
    child_id: str = Field(min_length=1, max_length=128)
    tag: Tag
    mode: BranchMode = "live"
    wait: bool = True
    timeout: float = Field(600.0, gt=0)
    labels: Labels = Field(default_factory=dict)
    tmp_dir: Path | None = None


class Spawn(Request):
    tag: Tag
    n: int = Field(1, ge=1, le=MAX_FORK)
    timeout: float = Field(60.0, gt=0)
    pool: str | None = None
    network: NetworkMode | None = None
    egress: Egress = "none"
    memory_limit_mib: MemoryLimitMiB | None = None
    allow_unconstrained: bool = False
    cpu_weight: int = Field(100, ge=1, le=10000)
    prime: Prime = ()
