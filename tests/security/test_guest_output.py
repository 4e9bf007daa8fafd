"""A guest's output quoted in forkd's errors (a failing prime or warm-up command: AgentClient.run_shell) is cut and
made printable: a hostile guest cannot put terminal escapes into a log line, a pool's status or a terminal that
shows the error (SECURITY.md section 1). Real VM."""

from __future__ import annotations

import pytest

from forkd.base.errors import ForkdError
from forkd.core.requests import Spawn
from tests.conftest import BASE_TAG

pytestmark = pytest.mark.vm


def test_guest_output_in_a_prime_error_is_cut_and_printable(rt, base):
    cmd = r"printf '\033]0;owned\007\033[2J%s' $(head -c 3000 /dev/zero | tr '\0' x) >&2; exit 5"
    with pytest.raises(ForkdError) as exc:
        rt.fork(Spawn.of(tag=BASE_TAG, prime=(cmd,)))
    first = exc.value.__cause__  # the child's own error (the fork's names how many failed)
    msg = first.message
    assert f"prime command {cmd!r} exited 5: " in msg
    said = msg.split(f"{cmd!r} exited 5: ", 1)[1]
    assert "\x1b" not in str(exc.value) and "\x07" not in str(exc.value)
    assert said.endswith("x" * 100) and len(said) <= 400
