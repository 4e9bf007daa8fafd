"""Text for a cell of a generated Markdown table (the reference pages): one line, pipes escaped, and brackets
outside code spans escaped so a synopsis like `[-w DIR]` is not read as a link."""

from __future__ import annotations

import re

_CODE_OR_BRACKET = re.compile(r"(`[^`]*`)|([\[\]])")


def text(s: str) -> str:
    """Brackets outside code spans escaped."""
    return _CODE_OR_BRACKET.sub(lambda m: m[1] or "\\" + m[2], s)


def cell(s: object) -> str:
    """One table cell: whitespace runs made one space, pipes and brackets (outside code) escaped."""
    return text(" ".join(str(s).split()).replace("|", "\\|"))
