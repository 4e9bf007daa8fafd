"""The Python SDK never swallows a failed kill on leaving `with Sandbox.create(...)` (issue 15, item 7): with no
exception in flight the failure is raised; with one, the original propagates unchanged and carries the failure as a
note. A real daemon on the fake VMM driver (tests/fake_vmm.py; the SDK and daemon are logic above it), stopped
inside the block, so the kill cannot reach it."""

from __future__ import annotations

import asyncio

import pytest

from forkd.base.errors import NotFound, Unavailable
from forkd.sdk import AsyncController, AsyncSandbox, Controller, Sandbox
from tests.conftest import BASE_TAG
from tests.fake_vmm import on_fake_base, on_fake_home, on_fake_rt  # noqa: F401 - fixtures: this module runs on the fake driver
from tests.test_api import start_api_daemon, stop_api_daemon


def test_a_failed_kill_on_exit_is_raised_or_noted(rt, home, base, tmp_path, monkeypatch):
    monkeypatch.setenv("FORKD_RETRY_WAIT", "0.01")  # the kill still retries the stopped daemon, without back-off
    made: list[str] = []
    try:
        d = start_api_daemon(home, tmp_path)
        with pytest.raises(Unavailable) as ei:  # nothing in flight: the kill's failure is raised
            with Sandbox.create(template=BASE_TAG, controller=Controller(url=d.url, token=d.token)) as sb:
                made.append(sb.id)
                stop_api_daemon(d)
        assert any(sb.id in n and "may still be running" in n for n in ei.value.__notes__), ei.value.__notes__

        d = start_api_daemon(home, tmp_path)
        with pytest.raises(ZeroDivisionError) as ei:  # an error in flight: it stays, the failure is a note
            with Sandbox.create(template=BASE_TAG, controller=Controller(url=d.url, token=d.token)) as sb:
                made.append(sb.id)
                stop_api_daemon(d)
                1 / 0  # noqa: B018
        assert any(sb.id in n and "Unavailable" in n for n in ei.value.__notes__), ei.value.__notes__

        d = start_api_daemon(home, tmp_path)

        async def async_exit() -> None:
            async with await AsyncSandbox.create(template=BASE_TAG,
                                                 controller=AsyncController(url=d.url, token=d.token)) as asb:
                made.append(asb.id)
                stop_api_daemon(d)

        with pytest.raises(Unavailable) as ei:
            asyncio.run(async_exit())
        assert any(made[-1] in n for n in ei.value.__notes__)
        assert all(rt.registry.get(cid).status == "running" for cid in made)  # reported, not silently leaked

        d = start_api_daemon(home, tmp_path)  # a kill that works: the block exits quietly
        with Sandbox.create(template=BASE_TAG, controller=Controller(url=d.url, token=d.token)) as sb:
            made.append(sb.id)
        stop_api_daemon(d)
        with pytest.raises(NotFound):
            rt.registry.get(made[-1])
    finally:
        rt.kill([c for c in made if c in {r.id for r in rt.registry.list()}])
