"""Kubernetes commands: `forkd crds` and `forkd operator`. Like `forkd serve`, they exec the front end's own
process (`python -m forkd.operator ...`): front ends never import each other."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    app.command()(crds)
    app.command()(operator)


def crds(output_dir: Path | None = typer.Option(None, "-o", "--output-dir",
                                                 help="write one file per CRD here (default: print to stdout)")
         ) -> None:
    """Generate the CustomResourceDefinitions (forkd.dev/v1alpha1) from the spec models."""
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
