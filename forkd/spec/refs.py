"""How people name declarative objects: a resource word (`pools`, `pool`, `ForkPool`) and a `KIND/NAME` reference,
by the kinds' names alone (forkd.spec.kinds: no models loaded)."""

from __future__ import annotations

from forkd.base.errors import InvalidInput
from forkd.spec.kinds import KINDS, RESOURCE_NAMES


def resolve_kind(word: str) -> str:
    kind = RESOURCE_NAMES.get(word.lower()) or (word if word in KINDS else None)
    if not kind:
        raise InvalidInput(f"unknown resource type {word!r}", hint="use parents, layers, pools or branches")
    return kind


def parse_ref(ref: str) -> tuple[str, str]:
    """'pool/agents' or 'ForkPool/agents' -> ('ForkPool', 'agents')."""
    if "/" not in ref:
        raise InvalidInput(f"{ref!r}: expected KIND/NAME, e.g. pool/agents")
    word, name = ref.split("/", 1)
    return resolve_kind(word), name
