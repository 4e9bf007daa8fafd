"""The `forkd` command line (forkd.cli.tree holds the command tree, forkd.cli.verbs where each verb lives)."""

import sys


def main() -> None:
    """The `forkd` entry point: `--version` answered before anything is imported, every verb by forkd.cli.tree."""
    if sys.argv[1:] == ["--version"]:
        from forkd import __version__

        sys.stdout.write(f"forkd {__version__}\n")
        return
    from forkd.cli.tree import main as tree_main

    tree_main()
