"""`forkd config` without the settings model (forkd.cli.settings_table): its table is the model's, and every value
it reads on its own it reads as the model does; what it is not sure of goes to the model. No VM."""

from __future__ import annotations

from pathlib import Path

import pytest

from forkd.base import settings as model
from forkd.cli import settings_table as light

SAMPLES = ["x", "0", "1", "-1", "+1", "01", "007", "1_000", " 1", "1 ", "1.5", ".5", "1e3", "inf", "nan", "65536",
           "4294967294", "4294967295", "99999999999999999999", "0.0", "2048", "4096", "4097", "64", "65", "true",
           "True", "yes", "YES", "off", "no", "t", "f", "y", "n", "on", "2", "kvm", "tcg", "KVM", "qemu", "fake",
           "json", "text", "code", "all", "auto", "pages", "write-protect", "root", "per-child", "info", "/tmp/x/",
           "a//b", "./rel", "http://node:8889", "with space"]


def test_the_table_is_the_settings_models():
    """`python -m forkd.cli.settings_table` rewrites it when forkd.base.settings changes."""
    assert light.generate() == Path(light.__file__).read_text()
    assert [r[0] for r in light.ROWS] == list(model.NAMES)


def test_a_value_read_plainly_is_read_as_the_model_reads_it(monkeypatch):
    for name in model.NAMES:
        monkeypatch.delenv(name, raising=False)
    plain = {}
    for name, rule, bounds, *_ in light.ROWS:
        for raw in SAMPLES:
            try:
                got = light.read(rule, bounds, raw)
            except light.Unsure:
                continue
            monkeypatch.setenv(name, raw)
            [want] = [r for r in model.describe() if r.name == name]
            monkeypatch.delenv(name)
            assert want.source == "env", (name, raw, want.value)  # never a value the model refuses
            assert (got if rule != "secret" else "set", type(got)) == (want.value, type(want.value)), (name, raw)
            plain.setdefault(rule, set()).add(raw)
    assert set(plain) == {"str", "path", "secret", "bool", "int", "float", "choice"}  # each rule reads something


def test_light_rows_equal_the_models_rows(monkeypatch):
    monkeypatch.setenv("FORKD_ACCEL", "tcg")
    monkeypatch.setenv("FORKD_HOME", "/tmp/somewhere/")
    monkeypatch.setenv("FORKD_TOKEN", "secret")
    monkeypatch.setenv("FORKD_RETRY_WAIT", "0.5")
    assert light.describe() == [r.__dict__ for r in model.describe()]


@pytest.mark.parametrize("name,raw", [("FORKD_LOG_LEVEL", "info"), ("FORKD_MAX_BRANCHES", "0"),
                                      ("FORKD_NO_DAEMON", "maybe"), ("FORKD_RETRY_WAIT", "1e-3")])
def test_what_it_is_not_sure_of_goes_to_the_model(monkeypatch, name, raw):
    monkeypatch.setenv(name, raw)
    assert light.describe() is None
