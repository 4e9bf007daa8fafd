"""The `forkd` Inspect AI sandbox provider (forkd_client.inspect_provider) held to Inspect's own conformance
suite (inspect_ai.util._sandbox.self_check: every check, no xfail) against a real child forked through a real
daemon, plus a real `inspect eval` end to end with Inspect's mock model (no network).

The suite runs with the config Inspect's own runner uses for docker (a non-root default user, so file
permissions hold): a `setup:` adds the user once per task and the samples fork from that branch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from forkd_client.inspect_config import TASK_PREFIX, ForkdSandboxConfig
from forkd_client.inspect_provider import ForkdSandboxEnvironment
from inspect_ai.util._sandbox.self_check import *  # noqa: F403 - Inspect's checks, collected here

from tests.conftest import BASE_TAG
from tests.test_api import start_api_daemon, stop_api_daemon

pytestmark = [pytest.mark.vm, pytest.mark.anyio]
TASKS = Path(__file__).resolve().parent / "inspect_tasks"
CONFIG = ForkdSandboxConfig(template=BASE_TAG, setup=("adduser -D -g self_check agent",), user="agent")


@pytest.fixture(scope="module")
def anyio_backend():
    return "asyncio"


@pytest.fixture(scope="module")
def daemon(home, base, tmp_path_factory):
    d = start_api_daemon(home, tmp_path_factory.mktemp("inspect"))
    yield d
    stop_api_daemon(d)


@pytest.fixture(scope="module")
async def module_env(daemon, anyio_backend):
    """One sample's sandbox for the whole suite, as Inspect's runner shares one: task_init -> sample_init, and
    at the end sample_cleanup -> task_cleanup, which must leave no child and no per-task snapshot behind."""
    task = "self-check"
    await ForkdSandboxEnvironment.task_init(task, CONFIG)
    envs = await ForkdSandboxEnvironment.sample_init(task, CONFIG, {})
    yield envs["default"]
    await ForkdSandboxEnvironment.sample_cleanup(task, CONFIG, envs, False)
    await ForkdSandboxEnvironment.task_cleanup(task, CONFIG, True)


@pytest.fixture
async def sandbox_env(module_env):
    return module_env


def _daemon_children(rt) -> list[str]:
    return [c.id for c in rt.children() if c.status == "running"]


async def test_fork_per_sample_and_cleanup_leaves_nothing(daemon, rt, anyio_backend):
    """Two samples are two children of the per-task branch (setup ran once, in neither of them); cleanup kills
    both and removes the branch."""
    task = "fork-per-sample"
    before = set(_daemon_children(rt))
    await ForkdSandboxEnvironment.task_init(task, CONFIG)
    a = (await ForkdSandboxEnvironment.sample_init(task, CONFIG, {}))["default"]
    b = (await ForkdSandboxEnvironment.sample_init(task, CONFIG, {}))["default"]
    assert a.sb.id != b.sb.id and {a.sb.id, b.sb.id} <= set(_daemon_children(rt))
    branch = a.sb.info.snapshot_tag
    assert branch.startswith(TASK_PREFIX) and b.sb.info.snapshot_tag == branch
    await a.write_file("mine.txt", "a")
    assert (await b.exec(["ls"])).stdout == ""  # b's home is its own: a's write is not there
    assert (await a.exec(["id", "-un"])).stdout == "agent\n" and a.workdir == "/home/agent"
    assert (await a.exec(["id", "-Gn"])).stdout == "agent\n"  # its own groups, never the agent's root group
    assert (await a.exec(["sh", "-c", "echo $HOME $USER"])).stdout == "/home/agent agent\n"
    await ForkdSandboxEnvironment.sample_cleanup(task, CONFIG, {"default": a}, False)
    await ForkdSandboxEnvironment.sample_cleanup(task, CONFIG, {"default": b}, True)
    await ForkdSandboxEnvironment.task_cleanup(task, CONFIG, True)
    assert set(_daemon_children(rt)) == before
    assert branch not in [s.tag for s in rt.snapshots()]


async def test_fork_inside_a_sample_tries_continuations(daemon, rt, anyio_backend):
    """env.fork(n): n sandboxes continuing from this instant (what the sample wrote is there), each its own
    (their writes diverge, the original keeps its state), killed when the block ends."""
    task = "fork-inside"
    await ForkdSandboxEnvironment.task_init(task, CONFIG)
    envs = await ForkdSandboxEnvironment.sample_init(task, CONFIG, {})
    env = envs["default"]
    try:
        await env.write_file("state.txt", "before")
        async with env.fork(2) as tries:
            ids = [t.sb.id for t in tries]
            assert [await t.read_file("state.txt") for t in tries] == ["before", "before"]
            for i, t in enumerate(tries):
                await t.write_file("state.txt", f"try {i}")
            assert [await t.read_file("state.txt") for t in tries] == ["try 0", "try 1"]
            assert (await tries[1].exec(["id", "-un"])).stdout == "agent\n"
        assert await env.read_file("state.txt") == "before"
        assert not set(ids) & set(_daemon_children(rt))
    finally:
        await ForkdSandboxEnvironment.sample_cleanup(task, CONFIG, envs, False)
        await ForkdSandboxEnvironment.task_cleanup(task, CONFIG, True)


async def test_exec_output_over_the_limit_stops_the_command(module_env):
    """Not in Inspect's suite: output past the exec limit raises OutputLimitExceededError with the output so far,
    and the command (here one that never ends by itself) is killed, not left writing."""
    from inspect_ai.util import OutputLimitExceededError
    from inspect_ai.util._sandbox.limits import override_max_exec_output_size

    with override_max_exec_output_size(4096), pytest.raises(OutputLimitExceededError) as e:
        await module_env.exec(["sh", "-c", "exec yes forkd-limit-marker"], timeout=120)
    assert "limit of 4 KiB was exceeded" in str(e.value)
    assert e.value.truncated_output.startswith("forkd-limit-marker\n") and len(e.value.truncated_output) == 4096
    left = await module_env.exec(["sh", "-c", "ps | grep forkd-limit-marker | grep -v grep"])
    assert left.stdout == "", left.stdout


async def test_exec_timeout_kills_what_the_command_started(module_env):
    """Not in Inspect's suite (its child-process check puts its `&` inside a comment): at the timeout the whole
    process group dies, so background children holding the output open end with it and TimeoutError comes."""
    with pytest.raises(TimeoutError):
        await module_env.exec(["sh", "-c", "sleep 613 & sleep 614; :"], timeout=2)
    left = await module_env.exec(["sh", "-c", "ps | grep 'sleep 61[34]' | grep -v grep"])
    assert left.stdout == "", left.stdout


def test_inspect_eval_end_to_end(daemon, home, tmp_path):
    """`inspect eval` of a task on sandbox="forkd" with the mock model: every sample's solver runs code in its
    child, the scorer reads the file it wrote; the log says every sample was scored correct."""
    logs = tmp_path / "logs"
    res = subprocess.run([sys.executable, "-m", "inspect_ai", "eval", "forkd_eval.py",
                          "--model", "mockllm/model", "--log-dir", str(logs), "--log-format", "json",
                          "--display", "plain", "--max-samples", "3"],
                         capture_output=True, text=True, timeout=900, cwd=TASKS,
                         env=dict(os.environ, FORKD_HOME=str(home)))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    [log] = list(logs.glob("*.json"))
    data = json.loads(log.read_text())
    assert data["status"] == "success", data.get("error")
    samples = data["samples"]
    assert len(samples) == 3
    assert all(s["scores"]["wrote_square"]["value"] == "C" for s in samples), [s["scores"] for s in samples]


def test_agent_loop_with_bash_and_python_tools(daemon, home, tmp_path):
    """Inspect's bash() and python() tools in a generate() loop, the mock model scripted to call each (in its own
    process, as a user runs an eval): the python call reads what the bash call wrote in the same child; the
    scorer reads the file python wrote."""
    logs = tmp_path / "logs"
    res = subprocess.run([sys.executable, str(TASKS / "forkd_agent.py"), BASE_TAG, str(logs)], capture_output=True,
                         text=True, timeout=900, env=dict(os.environ, FORKD_HOME=str(home)))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    [log] = list(logs.glob("*.json"))
    data = json.loads(log.read_text())
    assert data["status"] == "success", data.get("error")
    [sample] = data["samples"]
    assert sample["scores"]["answer_file"]["value"] == "C", sample["scores"]
    tools = [m for m in sample["messages"] if m["role"] == "tool"]
    assert [t["function"] for t in tools] == ["bash", "python"]
    assert [t["content"].strip() for t in tools] == ["root", "wrote 42"], tools
