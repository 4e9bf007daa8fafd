"""Priming: shell commands each new child runs once, after its reseed and before it counts as ready (Spawn.prime,
`forkd fork --prime`, ForkPool spec.child.prime; `true` when none are named, unless FORKD_PRIME=0), on the fake VMM
driver (tests/fake_vmm.py)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from forkd.base.errors import ForkdError, InvalidInput, ProtocolViolation
from forkd.core.requests import DEFAULT_PRIME, MAX_PRIME, Spawn, prime_of
from forkd.reconciler.control import Control
from forkd.sandbox.supervisor import Supervisor
from forkd.spec.loader import load_text
from forkd.vmm.agent_client import AgentTimeout
from tests.conftest import BASE_TAG, forkd_cli, qemu_pids
from tests.fake_vmm import on_fake_home, on_fake_rt  # noqa: F401 - fixtures: this module runs on the fake driver

MARK = "/root/primed"


@pytest.mark.parametrize("prime, field", [
    (("",), "prime.0"),
    (("x" * 4097,), "prime.0"),
    (("true",) * (MAX_PRIME + 1), "prime"),
])
def test_a_prime_the_rules_refuse_names_the_field(prime, field):
    with pytest.raises(InvalidInput) as exc:
        Spawn.of(tag="t", prime=prime)
    assert f"{field}:" in exc.value.message


def test_a_pool_with_too_many_prime_commands_is_refused_at_load():
    doc = ("apiVersion: forkd.dev/v1alpha1\nkind: ForkPool\nmetadata: {name: p}\n"
           f"spec: {{from: x, child: {{prime: {['true'] * (MAX_PRIME + 1)}}}}}\n")
    loaded, errors = load_text(doc, "pool.yaml")
    assert not loaded and errors
    assert "child.prime" in str(errors[0]) and "pool.yaml" in str(errors[0])


def test_a_primed_child_ran_its_commands_once_before_it_answered(rt, fake_base, monkeypatch):
    monkeypatch.setenv("FORKD_PRIME", "0")  # no default prime for the plain one
    plain = rt.fork(Spawn.of(tag=BASE_TAG, n=1))
    primed = rt.fork(Spawn.of(tag=BASE_TAG, n=2, prime=(f"echo $$ >> {MARK}", "true")))
    try:
        assert rt.exec(plain[0].id, ["test", "-e", MARK])["exit_code"] == 1  # not from the parent
        assert "prime" not in plain[0].timings_ms
        for r in primed:
            lines = rt.exec(r.id, ["cat", MARK])["stdout"].split()
            assert len(lines) == 1, lines  # once, in this child
            assert r.timings_ms["prime"] > 0
            assert rt.eval(r.id, "WARM_GLOBAL")["error"] is None  # the warm parent underneath
    finally:
        rt.kill([r.id for r in plain + primed])


@pytest.mark.parametrize("given, default_on, expect", [
    ((), True, DEFAULT_PRIME),  # none named: `true`, by default
    ((), False, ()),  # FORKD_PRIME=0
    (("pip list",), True, ("pip list",)),  # a spawn's own commands replace the default, never add to it
    (("pip list",), False, ("pip list",)),
])
def test_which_prime_commands_a_spawn_runs(given, default_on, expect):
    assert prime_of(given, default_on) == expect


def test_by_default_a_child_is_primed_and_forkd_prime_0_opts_out(rt, fake_base, monkeypatch):
    """FORKD_PRIME (on by default): a child whose spawn names no prime commands runs `true` before it answers."""
    monkeypatch.delenv("FORKD_PRIME", raising=False)
    assert DEFAULT_PRIME == ("true",)
    (primed,) = rt.fork(Spawn.of(tag=BASE_TAG, n=1))
    monkeypatch.setenv("FORKD_PRIME", "0")
    (plain,) = rt.fork(Spawn.of(tag=BASE_TAG, n=1))
    try:
        assert primed.timings_ms["prime"] > 0
        assert "prime" not in plain.timings_ms
    finally:
        rt.kill([primed.id, plain.id])


class _FailingAgent:
    """Stands in for a guest agent whose exec of `/bin/sh -c CMD` fails with `exc` (a guest without /bin/sh, one
    that hangs, one that breaks the protocol); the part under test is the supervisor's handling of it."""

    def __init__(self, exc: Exception):
        self.exc, self.ran = exc, []

    def run_shell(self, cmd, timeout, what, hint=None):
        self.ran.append(cmd)
        raise self.exc


@pytest.mark.parametrize("exc, fatal, raised", [
    (ForkdError("child c1: prime command 'true' exited 127: /bin/sh: not found"), True, True),
    (ForkdError("child c1: prime command 'true' exited 127: /bin/sh: not found"), False, False),
    (AgentTimeout("guest agent did not answer in time"), False, True),
    (ProtocolViolation("a frame over the limit"), False, True),
])
def test_a_default_prime_that_cannot_run_leaves_the_child_unprimed(exc, fatal, raised):
    """The default prime (fatal=False) that the guest cannot run ends the priming and the child answers; a named
    prime that fails (fatal), or a guest that hangs or breaks the protocol, fails the spawn."""
    agent = _FailingAgent(exc)
    vm, rec = SimpleNamespace(agent=agent), SimpleNamespace(id="c1")
    if raised:
        with pytest.raises(type(exc)):
            Supervisor._prime(vm, rec, ("true", "true"), 5.0, fatal=fatal)
    else:
        Supervisor._prime(vm, rec, ("true", "true"), 5.0, fatal=fatal)
    assert agent.ran == ["true"]


def test_a_failing_prime_fails_the_spawn_and_keeps_nothing(rt, fake_base, home):
    before_ids, before_vmms = {r.id for r in rt.children()}, set(qemu_pids(home))
    with pytest.raises(ForkdError) as exc:
        rt.fork(Spawn.of(tag=BASE_TAG, n=2, prime=("true", "echo boom >&2; exit 3")))
    msg = str(exc.value)
    assert "prime command 'echo boom >&2; exit 3' exited 3" in msg and "boom" in msg
    assert "spec.child.prime" in (exc.value.hint or "")
    assert {r.id for r in rt.children()} == before_ids
    assert set(qemu_pids(home)) <= before_vmms


def test_prime_is_refused_with_from_sandbox():
    res = forkd_cli("fork", "--from-sandbox", "c0123456789", "--prime", "true")
    assert res.returncode == 2 and "--prime applies to children of a snapshot" in res.stderr


def test_forkd_fork_prime_on_the_command_line(fake_base):
    res = forkd_cli("fork", "-t", BASE_TAG, "--prime", "exit 4", "-o", "json")
    assert res.returncode != 0
    assert "prime command 'exit 4' exited 4" in res.stderr
    res = forkd_cli("fork", "-t", BASE_TAG, "--prime", f"touch {MARK}", "-o", "json", check=True)
    child = json.loads(res.stdout)["children"][0]["id"]
    try:
        assert forkd_cli("exec", child, "--", "test", "-e", MARK).returncode == 0
    finally:
        forkd_cli("kill", child, check=True)


POOL = """\
apiVersion: forkd.dev/v1alpha1
kind: ForkParent
metadata: {name: primep}
spec: {memoryMiB: 256}
---
apiVersion: forkd.dev/v1alpha1
kind: ForkPool
metadata: {name: primepool}
spec: {from: primep, warm: 1, child: {prime: ["date +%s > /root/primed"]}}
"""


def test_a_pool_primes_its_warm_children(rt):
    loaded, errors = load_text(POOL, "pool.yaml")
    assert not errors, errors
    control = Control(rt)
    try:
        control.apply([(x.obj, f"{x.file}:{x.line}") for x in loaded], "test")
        ok, problems = control.reconciler.run_until_converged(180)
        assert ok, problems
        warm = [r for r in rt.children() if r.pool == "primepool" and r.status == "running"]
        assert len(warm) == 1
        assert rt.exec(warm[0].id, ["cat", MARK])["stdout"].strip().isdigit()
        assert warm[0].timings_ms["prime"] > 0
    finally:
        for kind, name in (("ForkPool", "primepool"), ("ForkParent", "primep")):
            control.delete(kind, name)
        control.reconciler.run_until_converged(60)
        left = [r.id for r in rt.children() if r.pool == "primepool"]
        if left:
            rt.kill(left)
        control.reconciler.close()
