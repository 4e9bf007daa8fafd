"""The kinds' names a client uses without the models (forkd.spec.kinds) are the models' own: every model named,
under its own kind and apiVersion, with a plural and the short names `forkd get` takes. No VM."""

from __future__ import annotations

import typing

import pytest

from forkd.base.errors import InvalidInput
from forkd.spec import kinds, models
from forkd.spec.refs import parse_ref, resolve_kind


def test_every_model_is_a_kind_and_every_kind_a_model():
    assert tuple(models.MODELS) == kinds.KINDS
    for kind, model in models.MODELS.items():
        assert typing.get_args(model.model_fields["kind"].annotation) == (kind,)
        assert model.model_fields["apiVersion"].default == kinds.API_VERSION


def test_each_kind_has_a_plural_and_short_names():
    assert set(kinds.PLURALS) == set(kinds.KINDS)
    assert set(kinds.RESOURCE_NAMES.values()) == set(kinds.KINDS)
    for kind, plural in kinds.PLURALS.items():
        singular = kind.removeprefix("Fork").lower()
        assert {resolve_kind(w) for w in (plural, singular, kind, kind.lower())} == {kind}
        assert parse_ref(f"{singular}/x") == (kind, "x")


@pytest.mark.parametrize("word", ["pod", "Pools2", "ForkThing"])
def test_an_unknown_resource_word_is_refused(word):
    with pytest.raises(InvalidInput, match="unknown resource type"):
        resolve_kind(word)
