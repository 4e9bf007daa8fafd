"""Test temporaries short enough for a unix socket beneath them.

A socket's path holds at most 107 bytes (sun_path), and a daemon binds its socket under its home's tmp/ first
(forkd.api.daemon.bind_unix: `<home>/tmp/.sock-<owner>-<random>/s`, about 45 bytes). pytest's own base,
`/tmp/pytest-of-<user>/pytest-<n>/`, with pytest-xdist's `popen-gw<k>/` and a test's directory, left a home under
`tmp_path` no room for it: daemon-starting tests failed with "AF_UNIX path too long" on workers only. So a run
that names no --basetemp gets a fresh short one, `/tmp/fkp<random>` (its workers: `<it>/popen-gw<k>`), removed
after a run that passed (a failed run's is kept to look at).
"""

from __future__ import annotations

import shutil
import tempfile

import pytest

_MADE = pytest.StashKey[str]()


def short_basetemp(config: pytest.Config) -> None:
    """Give a run (the controller, or a run without workers) a fresh short --basetemp unless it names one."""
    if hasattr(config, "workerinput") or config.option.basetemp:
        return  # a worker gets its own under the controller's (pytest-xdist); a given one is the caller's
    config.option.basetemp = config.stash[_MADE] = tempfile.mkdtemp(prefix="fkp", dir="/tmp")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    made = session.config.stash.get(_MADE, None)
    if made is not None and exitstatus == 0:
        shutil.rmtree(made, ignore_errors=True)
