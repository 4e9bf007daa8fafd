"""What the reconciler's observation takes from the settings: the pull grace plan() is given is FORKD_PULL_GRACE
(on the fake driver: observe.actual reads a real runtime's store and children, none of which matters here)."""

from __future__ import annotations

from forkd.base.settings import Settings
from forkd.reconciler import observe
from forkd.reconciler.state import Actual
from tests.fake_vmm import on_fake_home, on_fake_rt  # noqa: F401 - fixtures: this module's home and runtime


def test_the_pull_grace_observed_is_the_setting(rt, settings_env):
    settings_env(pull_grace=5)
    assert observe.actual(rt).pull_grace == 5.0


def test_actuals_default_grace_is_the_settings_default():
    assert Actual().pull_grace == Settings.model_fields["pull_grace"].default
