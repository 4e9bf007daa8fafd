"""The one naming rule for tags and object names, used by every front end and layer."""

from __future__ import annotations

import re

from forkd.base.errors import InvalidInput

TAG_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,62}$"
_TAG_RE = re.compile(TAG_PATTERN)


def check_tag(tag: str, what: str = "tag") -> str:
    """Return `tag` if it matches TAG_PATTERN, else raise InvalidInput naming the rule."""
    if not isinstance(tag, str) or not _TAG_RE.match(tag):
        raise InvalidInput(
            f"invalid {what} {tag!r}",
            hint="use 1-63 characters: lowercase letters, digits, '.', '_' or '-', starting with a letter or digit",
        )
    return tag


# Object names (metadata.name of ForkParent, ForkPool, ...): DNS-label-like, at most 52 characters, so that
# "<name>-<10 hex digits>" (a parent's snapshot tag) still fits TAG_PATTERN.
NAME_PATTERN = r"^[a-z0-9]([a-z0-9-]{0,50}[a-z0-9])?$"
