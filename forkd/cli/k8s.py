"""Kubernetes commands: `forkd crds` and `forkd operator`. Like `forkd serve`, they exec the front end's own
process (`python -m forkd.operator ...`): front ends never import each other."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import typer

from forkd.cli.options import format_or_old_path
from forkd.cli.output import Fmt


def register(app: typer.Typer) -> None:
    app.command()(crds)
    app.command()(operator)


def crds(output_dir: Path | None = typer.Option(None, "--output-dir",
                                                 help="write one file per CRD here (default: print to stdout)"),
         output: str | None = typer.Option(None, "-o", "--output", help="output format: yaml (the default)")
         ) -> None:
    """Generate the CustomResourceDefinitions (forkd.dev/v1alpha1) from the spec models."""
    fmt, old_path = format_or_old_path(output, "--output-dir")
    if fmt not in (None, Fmt.yaml):
        raise typer.BadParameter("CRDs are printed as YAML", param_hint="-o")
    output_dir = output_dir or (Path(old_path) if old_path else None)
    argv = [sys.executable, "-m", "forkd.operator", "crds"]
    if output_dir is not None:
        argv += ["-o", str(output_dir)]
    os.execv(sys.executable, argv)


def operator(namespace: list[str] = typer.Option([], "-n", "--namespace",
                                                 help="watch this namespace; repeatable (default: all)"),
             liveness: str | None = typer.Option(None, help="liveness endpoint, e.g. http://0.0.0.0:8080/healthz"),
             verbose: bool = typer.Option(False, "--verbose")) -> None:
    """Run the Kubernetes operator (kopf): ForkParent/ForkLayer/ForkPool/ForkBranch resources are applied to the
    node daemon at $FORKD_DAEMON_SOCKET (default $FORKD_HOME/forkd.sock) and their status copied back."""
    argv = [sys.executable, "-m", "forkd.operator", "run"]
    for ns in namespace:
        argv += ["-n", ns]
    if liveness:
        argv += ["--liveness", liveness]
    if verbose:
        argv.append("--verbose")
    os.execv(sys.executable, argv)
