"""A client's template (E2B's word) names a snapshot tag or a declared parent, layer or branch: Control.template.
No VMs: objects are applied but not reconciled, and their status is set as the reconciler would."""

from __future__ import annotations

from pathlib import Path

import pytest

from forkd.base.errors import Conflict, InvalidInput
from forkd.base.paths import Layout
from forkd.core.runtime import Runtime
from forkd.reconciler.control import Control
from forkd.spec.loader import load_paths
from forkd.spec.models import ForkParentStatus

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def control(tmp_path):
    c = Control(Runtime(Layout(tmp_path / "home")))
    loaded = load_paths([REPO / "specs/examples/pool.yaml"])  # the quickstart's spec: ForkParent `base`
    c.apply([(x.obj, "pool.yaml") for x in loaded], "test")
    yield c
    c.reconciler.close()


def test_the_quickstart_parent_is_the_sdk_examples_template(control):
    with pytest.raises(Conflict, match="template 'base' is ForkParent base.*no ready snapshot"):
        control.template("base")  # applied, not built yet
    control.objects.set_status("ForkParent", "base", ForkParentStatus(snapshot="base-0123abcd"))
    assert control.template("base") == "base-0123abcd"


def test_other_names_pass_through_and_bad_ones_are_refused(control):
    assert control.template("no-such-thing") == "no-such-thing"  # the spawn's NotFound names it
    with pytest.raises(InvalidInput):
        control.template("../etc")
