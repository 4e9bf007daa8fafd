"""`sb.commands`, E2B-style: run a command and stream its output, in the foreground or in the background.

    res = sb.commands.run("pip install x", on_stdout=print, timeout=300)   # blocks: CommandResult
    h = sb.commands.run("python server.py", background=True, on_stdout=log) # returns a CommandHandle at once
    h.send_stdin("quit\\n"); print(h.wait().exit_code); h.kill()

Output is streamed by the daemon (forkd_client.processes: NDJSON events) and is bytes end to end: callbacks get
text (UTF-8, decoded incrementally so a character split between chunks is whole), results carry the text and
the exact bytes (`stdout_bytes`). A result keeps at most `max_output` bytes per stream (`truncated`), the
callbacks see everything.

As in E2B, a command that exits non-zero raises CommandExitException (`exit_code`, `stdout`, `stderr`, `error`,
and the whole `result`) from `run()` and from a handle's `wait()`, and one killed by its `timeout` raises
TimeoutException (the output so far on `result`); `check=False` returns the CommandResult instead (`exit_code`,
`timed_out`). Both are ForkdErrors (TimeoutException a Timeout too).
"""

from __future__ import annotations

import codecs
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from forkd_client.errors import ForkdError, Timeout
from forkd_client.processes import RemoteProcesses

OnOutput = Callable[[str], Any]
KEEP = 16 << 20  # bytes per stream a result keeps by default


@dataclass
class CommandResult:
    exit_code: int
    stdout_bytes: bytes = b""
    stderr_bytes: bytes = b""
    truncated: bool = False
    timed_out: bool = False
    error: str | None = None

    @property
    def stdout(self) -> str:
        return self.stdout_bytes.decode("utf-8", "replace")

    @property
    def stderr(self) -> str:
        return self.stderr_bytes.decode("utf-8", "replace")

    def __getitem__(self, key: str) -> Any:  # dict access, as the wire models allow
        return getattr(self, key)


class _WithResult:
    """What a command's exception shows of its result: the output until the command ended."""

    result: CommandResult

    @property
    def stdout(self) -> str:
        return self.result.stdout

    @property
    def stderr(self) -> str:
        return self.result.stderr


class CommandExitException(_WithResult, ForkdError):
    """The command exited non-zero (E2B's name and attributes): `exit_code`, `stdout`, `stderr`, `error`, `result`."""

    def __init__(self, result: CommandResult, what: str = "command"):
        tail = result.stderr[-500:].rstrip() or result.error or ""
        super().__init__(f"{what} exited with code {result.exit_code}" + (f": {tail}" if tail else ""),
                         hint="pass check=False to get the result of a non-zero exit instead of this exception")
        self.result = result
        self.exit_code, self.error = result.exit_code, result.error


class TimeoutException(_WithResult, Timeout):
    """The command outlasted its `timeout` and was killed (E2B's name); `result` holds its output until then."""

    def __init__(self, result: CommandResult, timeout: float | None, what: str = "command"):
        super().__init__(f"{what} was killed after its timeout of {timeout} s",
                         hint="pass a longer timeout= (None: none), or check=False to get the partial result")
        self.result = result
        self.exit_code = result.exit_code


def checked(result: CommandResult, check: bool, timeout: float | None, what: str) -> CommandResult:
    """`result`, or its exception when `check` and the command timed out or exited non-zero."""
    if check and result.timed_out:
        raise TimeoutException(result, timeout, what)
    if check and result.exit_code != 0:
        raise CommandExitException(result, what)
    return result


@dataclass
class _Collector:
    on_stdout: OnOutput | None
    on_stderr: OnOutput | None
    keep: int
    out: bytearray = field(default_factory=bytearray)
    err: bytearray = field(default_factory=bytearray)
    truncated: bool = False
    decoders: dict = field(default_factory=lambda: {s: codecs.getincrementaldecoder("utf-8")("replace")
                                                     for s in ("stdout", "stderr")})

    def feed(self, stream: str, data: bytes) -> None:
        buf = self.out if stream == "stdout" else self.err
        room = self.keep - len(buf)
        self.truncated |= len(data) > room
        buf += data[:max(room, 0)]
        cb = self.on_stdout if stream == "stdout" else self.on_stderr
        if cb is not None and (text := self.decoders[stream].decode(data)):
            cb(text)

    def result(self, ev: dict) -> CommandResult:
        code = ev.get("exit_code")
        error = None if ev.get("type") == "exit" else (ev.get("detail") or "the stream ended early")
        return CommandResult(exit_code=code if isinstance(code, int) else -1, stdout_bytes=bytes(self.out),
                             stderr_bytes=bytes(self.err), truncated=self.truncated or bool(ev.get("truncated")),
                             timed_out=bool(ev.get("timed_out")), error=error)


def _drain(events: Iterator[dict], c: _Collector) -> CommandResult:
    for ev in events:
        if ev["type"] in ("stdout", "stderr"):
            c.feed(ev["type"], ev["data"])
        elif ev["type"] in ("exit", "error"):
            return c.result(ev)
    return c.result({"type": "error"})


class CommandHandle:
    """A started command: `pid`; `wait()` for its CommandResult; `send_stdin`, `kill`, `signal`."""

    def __init__(self, procs: RemoteProcesses, sandbox_id: str, events: Iterator[dict], collector: _Collector,
                 limit: float | None = None):
        self._procs, self._sb, self._events, self._c, self._limit = procs, sandbox_id, events, collector, limit
        first = next(events)
        self.pid: int | None = first.get("pid")
        self._result: CommandResult | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._result = _drain(self._events, self._c)
        except Exception as exc:  # noqa: BLE001 - reported by wait()
            self._result = self._c.result({"type": "error", "detail": str(exc)})

    def wait(self, timeout: float | None = None, check: bool = True) -> CommandResult:
        """Its result once it ended; `timeout`: seconds to wait here (Timeout if it still runs). A non-zero exit
        raises CommandExitException, a kill by its own timeout TimeoutException, unless `check=False`."""
        self._thread.join(timeout)
        if self._result is None:
            raise Timeout(f"command {self.pid} in sandbox {self._sb} still runs after {timeout} s",
                          hint="wait longer, or kill() it")
        return checked(self._result, check, self._limit, f"command {self.pid} in sandbox {self._sb}")

    def send_stdin(self, data: str | bytes, eof: bool = False) -> None:
        self._procs.send_stdin(self._sb, self.pid, data.encode() if isinstance(data, str) else data, eof)

    def close_stdin(self) -> None:
        self._procs.send_stdin(self._sb, self.pid, b"", eof=True)

    def kill(self) -> bool:
        """SIGKILL to the command's process group; False if it had already ended."""
        return self._procs.kill(self._sb, self.pid)

    def signal(self, sig: int | str = "SIGTERM") -> bool:
        return self._procs.signal(self._sb, self.pid, sig)

    def resize(self, rows: int, cols: int) -> None:
        self._procs.resize(self._sb, self.pid, rows, cols)


class ProcessCommands:
    """`sb.commands` of a Sandbox (its `controller` is the daemon's HTTP client)."""

    def __init__(self, sb: Any):
        self._sb = sb
        self._procs = RemoteProcesses(sb.controller)

    def run(self, cmd: str | list[str], background: bool = False, envs: dict[str, str] | None = None,
            cwd: str | None = None, user: str | None = None, on_stdout: OnOutput | None = None,
            on_stderr: OnOutput | None = None, timeout: float | None = 60, stdin: str | bytes | bool | None = None,
            pty: dict | None = None, max_output: int = KEEP, check: bool = True) -> CommandResult | CommandHandle:
        """Run `cmd` (a string goes through `bash -l -c` where the guest has bash, else /bin/sh -c; a list is the
        argv). `stdin`: data sent then closed, or True to keep it open for send_stdin. `timeout` (seconds, None:
        none) kills it. `background=True` returns a CommandHandle as soon as it started. A non-zero exit raises
        CommandExitException and a kill by `timeout` TimeoutException (here, or from the handle's wait()), unless
        `check=False`."""
        argv = list(cmd) if isinstance(cmd, list | tuple) else None
        env = {**getattr(self._sb, "envs", {}), **(envs or {})} or None  # the sandbox's envs, then the call's
        events = self._procs.stream(self._sb.id, argv, cmd=cmd if argv is None else None, env=env, cwd=cwd,
                                    user=user, stdin=stdin is not None and stdin is not False, pty=pty,
                                    timeout=timeout)
        handle = CommandHandle(self._procs, self._sb.id, events, _Collector(on_stdout, on_stderr, max_output),
                               limit=timeout)
        if isinstance(stdin, str | bytes) and handle.pid is not None:
            handle.send_stdin(stdin, eof=True)
        return handle if background else handle.wait(check=check)

    def connect(self, pid: int, on_stdout: OnOutput | None = None, on_stderr: OnOutput | None = None,
                max_output: int = KEEP) -> CommandHandle:
        """Attach to a running command (its output not read yet, then its exit)."""
        return CommandHandle(self._procs, self._sb.id, self._procs.attach(self._sb.id, pid),
                             _Collector(on_stdout, on_stderr, max_output))

    def list(self) -> list[dict]:
        """The commands the sandbox still holds: {pid, argv, tag, running, exit_code, started, pty}."""
        return self._procs.list(self._sb.id)

    def kill(self, pid: int) -> bool:
        return self._procs.kill(self._sb.id, pid)

    def send_stdin(self, pid: int, data: str | bytes, eof: bool = False) -> None:
        self._procs.send_stdin(self._sb.id, pid, data.encode() if isinstance(data, str) else data, eof)
