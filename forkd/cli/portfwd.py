"""`forkd port-forward ID PORT`: a local TCP port that reaches TCP PORT in a sandbox (raw bytes, any protocol)."""

from __future__ import annotations

import typer

from forkd.cli.output import Fmt, emit, err

HELP = """Listen on a local TCP port and carry each connection to TCP PORT in sandbox ID, raw bytes both ways
(like kubectl port-forward): for protocols other than HTTP (a database, SSH, a language server).

  forkd port-forward ID 5432                 a free local port, printed
  forkd port-forward ID 5432 --local 15432   127.0.0.1:15432 -> port 5432 in ID

It opens the port through the daemon (as `forkd port`: a grant of its own) and tunnels each connection in a
WebSocket on the port's URL; it runs until interrupted, then revokes its grant (other grants of the port stay).
Works for every sandbox, with a network device or not. Needs the daemon (over https: trusted through FORKD_CA).
Exit codes: 0 interrupted, 3 no such sandbox, 6 the daemon is not running."""


def port_forward(child: str = typer.Argument(..., help="id of a running sandbox"),
                 port: int = typer.Argument(..., min=1, max=65535, help="a TCP port the guest listens on"),
                 local: int = typer.Option(0, "--local", min=0, max=65535,
                                           help="the local port to listen on (0: a free one, printed)"),
                 address: str = typer.Option("127.0.0.1", "--address",
                                             help="the local address to listen on (anyone who reaches it reaches "
                                                  "the sandbox's port)"),
                 output: Fmt = typer.Option(Fmt.table, "-o", "--output", help="table, json (one line) or yaml: "
                                                                                  "where it listens")) -> None:
    import json
    import signal
    import socket
    import sys

    from forkd.cli.daemon import backend
    from forkd.client.portfwd import open_tunnel, serve

    b = backend()
    listener = socket.create_server((address, local))
    grant: dict = {}
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # stopped as a service is: revoke the grant too
    try:
        grant = b.port(child, port)
        host, bound = listener.getsockname()[:2]
        where = {"sandbox_id": child, "port": port, "listen": f"{host}:{bound}"}
        if output == Fmt.json:  # one line: a script reads it and learns where to connect
            print(json.dumps(where), flush=True)
        else:
            emit(where, output, [("ID", "left"), ("PORT", "right"), ("LISTEN", "left")],
                 [[child, str(port), f"{host}:{bound}"]])
            sys.stdout.flush()
        serve(listener, lambda: open_tunnel(b.api.endpoint.base_url, b.api.endpoint.socket, grant["path"]),
              lambda exc: err.print(f"port-forward: {exc}"))
    except KeyboardInterrupt:
        pass
    finally:
        listener.close()
        _revoke(b, child, grant.get("id"))


def _revoke(b, child: str, grant_id: str | None) -> None:
    """This run's grant, revoked as it stops (an older daemon gives no id: its grant stays)."""
    import contextlib

    from forkd.base.errors import ForkdError

    if grant_id:
        with contextlib.suppress(ForkdError):
            b.api.close_port(child, grant_id)


def register(app: typer.Typer) -> None:
    app.command("port-forward", help=HELP)(port_forward)
