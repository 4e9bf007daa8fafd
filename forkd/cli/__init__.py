"""The `forkd` command line: parses, calls a verb of forkd.client's backend, prints. No logic of its own."""
