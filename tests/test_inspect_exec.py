"""How the Inspect provider's `run_streamed` ends a command's stdin sender, on an in-memory sandbox (the
sandbox is a collaborator here, not the part under test; the real daemon path is in test_inspect_provider)."""

from __future__ import annotations

from typing import Any

import anyio
import anyio.lowlevel
import pytest
from forkd_client.inspect_exec import run_streamed

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


class _Commands:
    """A command that ends (exit or a broken stream) once its stdin sender has begun its request."""

    def __init__(self, end: dict):
        self.end = end
        self.began = anyio.Event()
        self.sent: list[str] = []

    def stream(self, cmd: list[str], **kw: Any):
        async def events():
            yield {"type": "start", "pid": 7}
            await self.began.wait()
            yield self.end
        return events()

    async def send_stdin(self, pid: int, data: bytes, eof: bool = False) -> None:
        self.began.set()
        try:
            for _ in range(50):  # a request in flight across many loop iterations
                await anyio.lowlevel.checkpoint()
        except anyio.get_cancelled_exc_class():
            self.sent.append("cancelled")
            raise
        self.sent.append("answered")

    async def kill(self, pid: int) -> bool:
        return True


class _Sandbox:
    def __init__(self, end: dict):
        self.commands = _Commands(end)


async def test_a_command_that_exits_leaves_its_stdin_request_to_be_answered_not_cancelled():
    """Cancelling that request could land in the iteration its reply arrives (anyio's UNIX stream then raises
    InvalidStateError from the loop), so once the command exits the sender is waited for."""
    sb = _Sandbox({"type": "exit", "exit_code": 1})
    out = await run_streamed(sb, ["false"], b"x" * 10, cwd=None, env=None, user=None, timeout=None, limit=1 << 16)
    assert (out.code, out.broken, sb.commands.sent) == (1, None, ["answered"])


async def test_a_broken_stream_cancels_the_stdin_sender():
    """The command's fate is unknown then; its stdin could block for good."""
    sb = _Sandbox({"type": "error", "title": "Gone", "detail": "lost"})
    out = await run_streamed(sb, ["cat"], b"x" * 10, cwd=None, env=None, user=None, timeout=None, limit=1 << 16)
    assert (out.broken, sb.commands.sent) == ("Gone: lost", ["cancelled"])
