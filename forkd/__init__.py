"""forkd: copy-on-write microVM sandboxes for AI-agent fan-out, with a declarative reconciler."""

__version__ = "0.1.0"
