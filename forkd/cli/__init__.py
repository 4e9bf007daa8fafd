"""The `forkd` command line (forkd.cli.main holds the command tree)."""

import sys


def main() -> None:
    """The `forkd` entry point: `--version` answered before anything is imported, every verb by forkd.cli.main."""
    if sys.argv[1:] == ["--version"]:
        from forkd import __version__

        sys.stdout.write(f"forkd {__version__}\n")
        return
    from forkd.cli.main import main as tree_main

    tree_main()
