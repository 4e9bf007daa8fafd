"""MkDocs hooks (mkdocs.yml `hooks:`): pages generated from the code at build time."""

from __future__ import annotations

from typing import Any

MARKER = "<!-- generated: cli -->"


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    """Put the CLI reference (forkd.cli.reference, from the command tree) where a page holds MARKER."""
    if MARKER not in markdown:
        return markdown
    from forkd.cli.reference import markdown as cli_reference

    body = cli_reference().split("\n", 1)[1]  # the page keeps its own title
    return markdown.replace(MARKER, body)
