"""`forkd-mcp`: an MCP server (stdio) that lets agents spawn, claim, drive, branch and kill forkd sandboxes
through a running daemon (see forkd.mcp.server)."""
