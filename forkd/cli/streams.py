"""`forkd exec` and `forkd logs`: stream a command's output, or a child's console, through the daemon.

With a daemon they go through the CLI's light client (forkd.cli.daemon); without one they run in-process
(forkd.client.processes.LocalProcesses). Typer is imported only by register() (the verbs' declarations):
forkd.cli.direct runs them without it.

Exit codes of `forkd exec` (as docker's): the command's own code; 124 it timed out (--timeout); 125 forkd itself
failed (no such child, no daemon, bad arguments, the child died); 126 the command cannot be run; 127 it was not
found; 128+N it was killed by signal N.
"""

from __future__ import annotations

import base64
import os
import sys
import threading
from collections.abc import Iterator
from typing import Any

from forkd.base.errors import ForkdError, InvalidInput
from forkd.cli.daemon import Daemon

EXEC_HELP = " ".join(__doc__.split("Exit codes", 1)[1].split(":", 1)[1].split())
EXEC_FAILED, CANNOT_RUN, NOT_FOUND, TIMED_OUT = 125, 126, 127, 124
# exec's options that take a value (docker_argv must skip the value to find the child's id)
VALUED = {"-e", "--env", "-w", "--workdir", "--cwd", "-u", "--user", "--timeout"}
SHORT_VALUED = {"e", "w", "u"}


class RemoteProcs:
    """The few process calls `forkd exec` makes, through a Daemon."""

    def __init__(self, d: Daemon):
        self.d = d

    def stream(self, child: str, argv: list[str], *, timeout: float | None = None, **body: Any) -> Iterator[dict]:
        body = dict(body, argv=argv, timeout_secs=timeout)
        return self.d.events("POST", f"/v1/children/{child}/processes",
                             {k: v for k, v in body.items() if v is not None and v is not False})

    def send_stdin(self, child: str, pid: int, data: bytes, eof: bool = False) -> None:
        self.d.request("POST", f"/v1/children/{child}/processes/{pid}/stdin",
                       {"data": base64.b64encode(data).decode(), "eof": eof})

    def resize(self, child: str, pid: int, rows: int, cols: int) -> None:
        self.d.request("POST", f"/v1/children/{child}/processes/{pid}/resize", {"rows": rows, "cols": cols})

    def signal(self, child: str, pid: int, sig: str) -> None:
        self.d.request("POST", f"/v1/children/{child}/processes/{pid}/signal", {"signal": sig})

    def logs(self, child: str, offset: int) -> dict:
        res = self.d.request("GET", f"/v1/children/{child}/logs", params={"offset": offset})
        return dict(res, data=base64.b64decode(res["data"]))


def _procs() -> Any:
    d = Daemon.find()
    if d is not None:
        return RemoteProcs(d)
    from forkd.cli.config import setup_logging
    from forkd.client.local import LocalBackend
    from forkd.client.processes import LocalProcesses

    setup_logging()  # in-process: the runtime logs (forkd.cli.config.QUIET_VERBS)
    return LocalProcesses(LocalBackend().rt)


def docker_argv(rest: list[str]) -> list[str]:
    """exec's words with `--` after the child's id when the user left it out: docker's rule, the first word after
    the id starts the command, so `forkd exec -w /tmp ID ls -l` runs `ls -l`. Options go anywhere before `--`."""
    if "--" in rest:
        return rest
    i = 0
    while i < len(rest):
        word = rest[i]
        if word in VALUED:
            i += 2
            continue
        if word.startswith("--") or word.startswith("-") and len(word) > 1 and (
                word[-1] not in SHORT_VALUED or len(word) == 2 and word[1] not in SHORT_VALUED):
            i += 1
            continue
        if word.startswith("-") and len(word) > 1:  # a cluster ending in a valued short: -ie VALUE
            i += 2
            continue
        return [*rest[:i + 1], "--", *rest[i + 1:]]
    return rest


def _env(pairs: list[str]) -> dict[str, str] | None:
    env = {}
    for kv in pairs:
        k, sep, v = kv.partition("=")
        if not sep or not k:
            raise InvalidInput(f"-e/--env: {kv!r} is not KEY=VALUE (e.g. -e DEBUG=1)")
        env[k] = v
    return env or None


class StdinPump:
    """This terminal's stdin to the process, until EOF (then the process's stdin closes). A send that fails is
    kept (with the bytes delivered before it), never dropped: the command then saw only part of its input."""

    def __init__(self, procs: Any, child: str, pid: int):
        self.procs, self.child, self.pid = procs, child, pid
        self.sent, self.error, self.done = 0, None, False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            while data := os.read(0, 65536):
                self.procs.send_stdin(self.child, self.pid, data)
                self.sent += len(data)
            self.procs.send_stdin(self.child, self.pid, b"", eof=True)
            self.done = True
        except Exception as exc:  # noqa: BLE001 - reported after the command's exit (cut_short)
            self.error = exc

    def cut_short(self, exited: bool) -> str | None:
        """Why the command got only part of its input, or None. A send refused because the process had already
        exited is no cut (it stopped reading): only a failure while it still ran is."""
        if self.done or self.error is None or exited and _gone(self.error):
            return None
        return f"stdin was cut after {self.sent} bytes: {getattr(self.error, 'message', self.error)}"


def _gone(exc: Exception) -> bool:
    """Whether a stdin send was refused by the daemon as a request for a process that no longer reads it (a 400,
    404 or 409: its stdin closed, it exited); anything else (unreachable, busy, a server error) cut the input."""
    return isinstance(exc, ForkdError) and exc.exit_code in (2, 3, 4)


def _watch_size(procs: Any, child: str, pid: int) -> None:
    import signal

    def resized(*_: Any) -> None:
        size = os.get_terminal_size(sys.stdout.fileno())
        threading.Thread(target=procs.resize, args=(child, pid, size.lines, size.columns), daemon=True).start()
    signal.signal(signal.SIGWINCH, resized)


def _raw_tty() -> Any:
    """Put this terminal in raw mode; returns how to restore it (None when stdin is not a terminal)."""
    if not os.isatty(0):
        return None
    import termios
    import tty

    old = termios.tcgetattr(0)
    tty.setraw(0)
    return lambda: termios.tcsetattr(0, termios.TCSADRAIN, old)


def _exit_code(ev: dict) -> int:
    if ev.get("timed_out"):
        return TIMED_OUT
    code = ev.get("exit_code")
    if not isinstance(code, int):
        return EXEC_FAILED
    return 128 - code if code < 0 else code


def run_exec(args: Any) -> int:
    """Stream the command; its exit code (see the module's doc)."""
    argv = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not argv:
        raise InvalidInput("exec needs a command: forkd exec ID -- CMD [ARGS...]")
    procs = _procs()
    pty = None
    if args.tty:
        size = os.get_terminal_size(sys.stdout.fileno()) if os.isatty(1) else os.terminal_size((80, 24))
        pty = {"rows": size.lines, "cols": size.columns}
    events = procs.stream(args.child, argv, env=args.env, cwd=args.cwd, user=args.user,
                          stdin=args.interactive, pty=pty, timeout=args.timeout)
    restore, pid, pump = None, None, None
    out, err = sys.stdout.buffer, sys.stderr.buffer
    try:
        for ev in events:
            kind = ev.get("type")
            if kind == "start" and ev.get("pid") is not None:
                pid = ev["pid"]
                if args.interactive:
                    pump = StdinPump(procs, args.child, pid)
                if args.tty:
                    restore = _raw_tty() if args.interactive else None
                    _watch_size(procs, args.child, pid)
            elif kind in ("stdout", "stderr"):
                f = out if kind == "stdout" else err
                f.write(ev["data"])
                f.flush()
            elif kind == "exit":
                if ev.get("truncated"):
                    err.write(b"forkd: output truncated\n")
                cut = pump.cut_short(exited=True) if pump else None
                if cut:
                    raise ForkdError(f"{cut} (the command exited {_exit_code(ev)} after reading only that much)",
                                     "its input was incomplete: run it again")
                return _exit_code(ev)
            elif kind == "error":
                raise ForkdError(ev.get("detail") or "the stream broke", ev.get("hint"))
        raise ForkdError("the stream ended without the command's exit", "check the child with 'forkd ls'")
    except KeyboardInterrupt:
        if pid is not None:
            procs.signal(args.child, pid, "SIGKILL")
        return 130
    finally:
        if restore:
            restore()


def run_logs(child: str, follow: bool) -> None:
    import time

    procs = _procs()
    offset = 0
    while True:
        res = procs.logs(child, offset)
        sys.stdout.buffer.write(res["data"])
        sys.stdout.buffer.flush()
        offset = res["offset"]
        if not follow:
            return
        time.sleep(0.5)  # a poll interval: the console has no change feed


def exec_code(child: str, cmd: list[str] | None = None, interactive: bool = False, tty: bool = False,
              env: list[str] | None = None, cwd: str | None = None, user: str | None = None,
              timeout: float | None = None) -> int:
    """`forkd exec`: the command's exit code; forkd's own failures raised with exit code 125 (EXEC_FAILED)."""
    import types

    try:
        args = types.SimpleNamespace(child=child, cmd=cmd or [], interactive=interactive, tty=tty,
                                     env=_env(env or []), cwd=cwd, user=user, timeout=timeout)
        return run_exec(args)
    except ForkdError as exc:
        exc.exit_code = EXEC_FAILED  # forkd's own failure moves out of the way of the command's codes
        raise


def register(app: Any) -> None:
    """Declare `exec` and `logs` on `app` (a typer app): the flags forkd.cli.direct also parses."""
    import typer

    from forkd.cli.options import CHILD, timeout_option

    @app.command("exec", epilog="exit codes: " + EXEC_HELP)
    def exec_(child: str = CHILD,
              cmd: list[str] = typer.Argument(None, metavar="-- CMD [ARGS...]",
                                              help="the command and its arguments"),
              interactive: bool = typer.Option(False, "-i", "--interactive", help="pass this terminal's stdin to "
                                               "the command"),
              tty: bool = typer.Option(False, "-t", "--tty", help="run the command on a PTY sized like this "
                                       "terminal"),
              env: list[str] = typer.Option([], "-e", "--env", metavar="K=V", help="set a variable (repeatable)"),
              cwd: str | None = typer.Option(None, "-w", "--workdir", "--cwd", metavar="DIR",
                                             help="working directory in the guest"),
              user: str | None = typer.Option(None, "-u", "--user", help="run as this guest user (name or uid)"),
              timeout: str | None = timeout_option(None, "how long before the command is killed (exit 124)")
              ) -> None:
        """Run a command in a child and stream its output: forkd exec [-i] [-t] [-e K=V] [-w DIR] [-u USER]
        [--timeout DURATION] ID -- CMD [ARGS...]. Options go anywhere before `--`; without `--` the first word
        after ID starts the command.

        Exits with the command's code; 124 timed out, 125 forkd failed (no such child, no daemon, bad arguments),
        126 cannot run, 127 not found, 128+N killed by signal N."""
        raise typer.Exit(exec_code(child, cmd, interactive, tty, env, cwd, user, timeout))  # type: ignore[arg-type]

    @app.command("logs")
    def logs(child: str = CHILD,
             follow: bool = typer.Option(False, "-f", "--follow", help="keep printing what the console writes next")
             ) -> None:
        """Print a child's console log (its kernel and init messages, and whatever the guest writes to
        /dev/console)."""
        run_logs(child, follow)
