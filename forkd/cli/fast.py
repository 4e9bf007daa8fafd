"""`forkd exec` and `forkd logs`, the verbs scripts call in loops, kept light: with a daemon they need only the
standard library (http.client over the daemon's unix socket or TCP) and forkd.base.settings, not typer, rich,
httpx or the core, so `forkd exec` starts in well under the full CLI's time (bench/agent.py measures it).
Without a daemon they run in-process (forkd.client.processes.LocalProcesses). `forkd.cli.main` sends these two
verbs here first; anything this parser does not take goes to the full CLI. It reads the five FORKD_* variables
that locate the daemon itself (RAW below; declared in forkd.base.settings), falling back to settings() for any
value it does not take as is.

Exit codes of `forkd exec` (as docker's): the command's own code; 124 it timed out (--timeout); 125 forkd itself
failed (no such child, no daemon, bad arguments, the child died); 126 the command cannot be run; 127 it was not
found; 128+N it was killed by signal N.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import socket
import sys
import threading
from collections.abc import Iterator
from typing import Any

EXEC_HELP = __doc__.split("Exit codes", 1)[1].split(":", 1)[1].strip()
EXEC_FAILED, CANNOT_RUN, NOT_FOUND, TIMED_OUT = 125, 126, 127, 124
KEEPALIVE = 20.0


class Failure(Exception):
    """forkd itself failed: message and hint for stderr, exit 125 (exec) or the error's own code (logs)."""

    def __init__(self, message: str, hint: str | None = None, code: int = 1):
        super().__init__(message)
        self.message, self.hint, self.code = message, hint, code


# -- where the daemon is ----------------------------------------------------------------------------------
# The six variables that locate the daemon, read here WITHOUT forkd.base.settings (whose pydantic model costs
# more than the rest of `forkd exec` together). They are declared and documented there like every FORKD_*;
# here a value is taken only when it is unambiguous (blank = unset, as there), else settings() parses them all.
RAW = {"url": "FORKD_URL", "token": "FORKD_TOKEN", "home": "FORKD_HOME", "no_daemon": "FORKD_NO_DAEMON",
       "ca": "FORKD_CA", "daemon_socket": "FORKD_DAEMON_SOCKET"}
DEFAULT_HOME = "/var/lib/forkd"  # Settings.home's default
_BOOLS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}


def _light_settings() -> dict | None:
    env = os.environ
    vals = {k: v if (v := env.get(name, "")).strip() else None for k, name in RAW.items()}
    flag = (vals["no_daemon"] or "0").strip().lower()
    if flag not in _BOOLS or (vals["url"] and not vals["url"].startswith(("http://", "https://"))):
        return None
    return dict(vals, no_daemon=_BOOLS[flag], home=vals["home"] or DEFAULT_HOME)


def _full_settings() -> dict:
    from forkd.base.settings import settings

    s = settings()
    return {"url": s.url, "token": s.token_value, "home": str(s.home), "no_daemon": s.no_daemon,
            "ca": str(s.ca) if s.ca else None, "daemon_socket": str(s.daemon_socket) if s.daemon_socket else None}


# -- the daemon over http.client -----------------------------------------------------------------------
class _UnixConnection:
    """http.client.HTTPConnection over a unix socket."""

    def __new__(cls, path: str, timeout: float):
        import http.client

        class Conn(http.client.HTTPConnection):
            def connect(self) -> None:
                self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                self.sock.settimeout(self.timeout)
                self.sock.connect(path)
        return Conn("forkd", timeout=timeout)


class Daemon:
    """A daemon at `url` (TCP, bearer `token`, `ca` for https) or on the unix socket `sock`."""

    def __init__(self, url: str | None, sock: str | None, token: str | None, ca: str | None):
        self.url, self.sock, self.token, self.ca = url, sock, token, ca

    @classmethod
    def find(cls) -> Daemon | None:
        s = _light_settings() or _full_settings()
        if s["no_daemon"]:
            return None
        ca = s["ca"]
        if s["url"]:
            return cls(s["url"].rstrip("/"), None, s["token"], ca)
        if s["daemon_socket"]:  # named explicitly: that daemon or an error, as forkd.client.http.find_daemon
            return cls(None, s["daemon_socket"], s["token"], ca)
        sock = os.path.join(s["home"], "forkd.sock")
        if not os.path.exists(sock):
            return None
        d = cls(None, sock, s["token"], ca)
        try:
            d.request("GET", "/healthz", timeout=2.0)
        except Failure:
            return None
        return d

    def _conn(self, timeout: float) -> Any:
        import http.client
        from urllib.parse import urlsplit

        if self.sock:
            return _UnixConnection(self.sock, timeout)
        u = urlsplit(self.url)
        if u.scheme == "https":
            import ssl

            ctx = ssl.create_default_context(cafile=self.ca)
            return http.client.HTTPSConnection(u.hostname, u.port or 443, timeout=timeout, context=ctx)
        return http.client.HTTPConnection(u.hostname, u.port or 80, timeout=timeout)

    def _send(self, method: str, path: str, body: Any, timeout: float, params: dict | None = None) -> Any:
        from urllib.parse import quote, urlencode, urlsplit

        prefix = urlsplit(self.url).path.rstrip("/") if self.url else ""
        target = prefix + quote(path) + (f"?{urlencode(params)}" if params else "")
        headers = {"Content-Type": "application/json"} if body is not None else {}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        conn = self._conn(timeout)
        try:
            conn.request(method, target, body=json.dumps(body) if body is not None else None, headers=headers)
            resp = conn.getresponse()
        except OSError as exc:
            conn.close()
            raise Failure(f"cannot reach the forkd daemon at {self.sock or self.url}: {exc}",
                          "start it with 'forkd serve', or fix FORKD_URL / FORKD_DAEMON_SOCKET; FORKD_NO_DAEMON=1 runs "
                          "in-process",
                          6) from None
        if resp.status >= 400:
            raise self._problem(resp)
        return conn, resp

    @staticmethod
    def _problem(resp: Any) -> Failure:
        raw = resp.read()
        try:
            body = json.loads(raw)
        except ValueError:
            body = {"detail": raw.decode("utf-8", "replace")}
        codes = {400: 2, 401: 2, 404: 3, 409: 4, 422: 2, 503: 6, 504: 5}
        return Failure(body.get("detail") or f"HTTP {resp.status}", body.get("hint"), codes.get(resp.status, 1))

    def request(self, method: str, path: str, body: Any = None, timeout: float = 60.0,
                params: dict | None = None) -> Any:
        conn, resp = self._send(method, path, body, timeout, params)
        try:
            data = resp.read()
        finally:
            conn.close()
        return json.loads(data) if data else None

    def events(self, method: str, path: str, body: Any = None, params: dict | None = None) -> Iterator[dict]:
        conn, resp = self._send(method, path, body, KEEPALIVE * 3, params)
        try:
            while line := resp.readline():
                if line.strip():
                    ev = json.loads(line)
                    if isinstance(ev.get("data"), str):
                        ev["data"] = base64.b64decode(ev["data"])
                    yield ev
        except OSError as exc:
            raise Failure(f"the stream from the daemon broke: {exc}") from None
        finally:
            conn.close()


class RemoteProcs:
    """The few process calls `forkd exec` makes, through a Daemon."""

    def __init__(self, d: Daemon):
        self.d = d

    def stream(self, child: str, argv: list[str], *, timeout: float | None = None, **body: Any) -> Iterator[dict]:
        body = dict(body, argv=argv, timeout_secs=timeout)
        return self.d.events("POST", f"/v1/sandboxes/{child}/processes",
                             {k: v for k, v in body.items() if v is not None and v is not False})

    def send_stdin(self, child: str, pid: int, data: bytes, eof: bool = False) -> None:
        self.d.request("POST", f"/v1/sandboxes/{child}/processes/{pid}/stdin",
                       {"data": base64.b64encode(data).decode(), "eof": eof})

    def resize(self, child: str, pid: int, rows: int, cols: int) -> None:
        self.d.request("POST", f"/v1/sandboxes/{child}/processes/{pid}/resize", {"rows": rows, "cols": cols})

    def signal(self, child: str, pid: int, sig: str) -> None:
        self.d.request("POST", f"/v1/sandboxes/{child}/processes/{pid}/signal", {"signal": sig})

    def logs(self, child: str, offset: int) -> dict:
        res = self.d.request("GET", f"/v1/sandboxes/{child}/logs", params={"offset": offset})
        return dict(res, data=base64.b64decode(res["data"]))


def _procs() -> Any:
    d = Daemon.find()
    if d is not None:
        return RemoteProcs(d)
    from forkd.client.local import LocalBackend
    from forkd.client.processes import LocalProcesses

    return LocalProcesses(LocalBackend().rt)


# -- forkd exec --------------------------------------------------------------------------------------------
def exec_parser(with_cmd: bool = True) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="forkd exec", description="Run a command in a child and stream its output: "
                                "forkd exec [-i] [-t] [-e K=V] [-w DIR] ID -- CMD [ARGS...]",
                                epilog="exit codes: " + EXEC_HELP)
    p.add_argument("-i", "--interactive", action="store_true", help="pass this terminal's stdin to the command")
    p.add_argument("-t", "--tty", action="store_true", help="run the command on a PTY sized like this terminal")
    p.add_argument("-e", "--env", action="append", default=[], metavar="K=V", help="set a variable (repeatable)")
    p.add_argument("-w", "--workdir", "--cwd", dest="cwd", metavar="DIR", help="working directory in the guest")
    p.add_argument("-u", "--user", help="run as this guest user (name or uid)")
    p.add_argument("--timeout", type=_duration, metavar="DURATION",
                   help="how long before the command is killed (exit 124): 90 (seconds), 90s, 5m, 1h30m")
    p.add_argument("child", metavar="ID")
    if with_cmd:
        p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD")
    return p


def _duration(text: str) -> float:
    from forkd.base.durations import parse_duration

    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parse_exec(rest: list[str]) -> argparse.Namespace:
    """Options go anywhere before `--` (before or after the ID); without `--`, the first word after the ID starts
    the command (docker's rule), so `forkd exec ID --timeout 5 -- CMD` and `forkd exec --timeout 5 ID CMD` agree."""
    if "--" not in rest:
        return exec_parser().parse_args(rest)
    i = rest.index("--")
    args = exec_parser(with_cmd=False).parse_args(rest[:i])
    args.cmd = rest[i + 1:]
    return args


def _env(pairs: list[str]) -> dict[str, str] | None:
    env = {}
    for kv in pairs:
        k, sep, v = kv.partition("=")
        if not sep or not k:
            raise Failure(f"-e {kv!r} is not KEY=VALUE", "e.g. forkd exec -e DEBUG=1 ID -- CMD", 2)
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
        return f"stdin was cut after {self.sent} bytes: {self.error}"


def _gone(exc: Exception) -> bool:
    """Whether a stdin send was refused by the daemon as a request for a process that no longer reads it (a 400,
    404 or 409: its stdin closed, it exited); anything else (unreachable, busy, a server error) cut the input."""
    return isinstance(exc, Failure) and exc.code in (2, 3, 4)


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


def run_exec(args: argparse.Namespace) -> int:
    argv = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not argv:
        raise Failure("exec needs a command", "forkd exec ID -- CMD [ARGS...]", 2)
    procs = _procs()
    pty = None
    if args.tty:
        size = os.get_terminal_size(sys.stdout.fileno()) if os.isatty(1) else os.terminal_size((80, 24))
        pty = {"rows": size.lines, "cols": size.columns}
    events = procs.stream(args.child, argv, env=_env(args.env), cwd=args.cwd, user=args.user,
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
                    raise Failure(f"{cut} (the command exited {_exit_code(ev)} after reading only that much)",
                                  "its input was incomplete: run it again", EXEC_FAILED)
                return _exit_code(ev)
            elif kind == "error":
                raise Failure(ev.get("detail") or "the stream broke", ev.get("hint"))
        raise Failure("the stream ended without the command's exit", "check the child with 'forkd ls'")
    except KeyboardInterrupt:
        if pid is not None:
            procs.signal(args.child, pid, "SIGKILL")
        return 130
    finally:
        if restore:
            restore()


# -- forkd logs --------------------------------------------------------------------------------------------
def logs_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="forkd logs", description="Print a child's console log (its kernel and init "
                                "messages, and whatever the guest writes to /dev/console).")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing what the console writes next")
    p.add_argument("child", metavar="ID")
    return p


def run_logs(args: argparse.Namespace) -> int:
    import time

    procs = _procs()
    offset = 0
    while True:
        res = procs.logs(args.child, offset)
        sys.stdout.buffer.write(res["data"])
        sys.stdout.buffer.flush()
        offset = res["offset"]
        if not args.follow:
            return 0
        time.sleep(0.5)


def _fail(exc: Exception, code: int) -> int:
    msg = getattr(exc, "message", str(exc))
    sys.stderr.write(f"error: {msg}\n")
    if getattr(exc, "hint", None):
        sys.stderr.write(f"hint: {exc.hint}\n")
    return code


def run(argv: list[str]) -> int:
    """`forkd exec ...` / `forkd logs ...` (argv starts with the verb); returns the exit code."""
    verb, rest = argv[0], argv[1:]
    try:
        args = parse_exec(rest) if verb == "exec" else logs_parser().parse_args(rest)
    except SystemExit as exc:  # argparse printed usage or help
        return (EXEC_FAILED if verb == "exec" else 2) if exc.code else 0
    try:
        return run_exec(args) if verb == "exec" else run_logs(args)
    except Failure as exc:
        return _fail(exc, EXEC_FAILED if verb == "exec" else exc.code)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # a ForkdError from the in-process path
        from forkd.base.errors import ForkdError

        if not isinstance(exc, ForkdError):
            raise
        return _fail(exc, EXEC_FAILED if verb == "exec" else exc.exit_code)


def main() -> None:
    """The `forkd` entry point: exec and logs here, every other verb in the full CLI (forkd.cli.main)."""
    if sys.argv[1:2] in (["exec"], ["logs"]):
        sys.exit(run(sys.argv[1:]))
    from forkd.cli.main import main as full

    full()


if __name__ == "__main__":
    main()
