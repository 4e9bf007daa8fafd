"""The `forkd` command line (forkd.cli.tree holds the command tree, forkd.cli.verbs where each verb lives,
forkd.cli.direct the verbs run before the tree is built)."""

import sys


def main() -> None:
    """The `forkd` entry point: `--version` answered before anything is imported, `--help` and the verbs that only
    read or stream through a daemon by forkd.cli.direct when it takes their command line whole, the rest by
    forkd.cli.tree."""
    argv = sys.argv[1:]
    if argv == ["--version"]:
        from forkd import __version__

        sys.stdout.write(f"forkd {__version__}\n")
        return
    from forkd.cli import direct

    code = direct.run(argv)
    if code is not None:
        sys.exit(code)
    from forkd.cli.tree import main as tree_main

    tree_main()
