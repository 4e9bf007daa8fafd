"""The `forkd` command line: parses, calls forkd.core, prints. No logic of its own."""
