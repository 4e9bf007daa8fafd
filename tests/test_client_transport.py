"""The runtime's door to a daemon (forkd.client.http/api, the CLI's RemoteBackend) sends through the light client's
transport (forkd_client.http): a refused connect and a 503 to an idempotent request are retried, a 503 to a POST
is not, streams (NDJSON) are opened the same way, and what is finally raised is a forkd.base.errors kind with the
runtime's hint (how to run without a daemon). No VMs: a local HTTP server that answers 503 first."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from forkd_client.http import Retry

from forkd.base.errors import InvalidInput, Unavailable
from forkd.client.api import Client
from forkd.client.http import UNREACHABLE, Call
from forkd.client.processes import RemoteProcesses, to_line
from forkd.client.remote import RemoteBackend
from tests.http_stub import Draining as _Draining
from tests.http_stub import serving
from tests.test_api import free_port

FAST = Retry(attempts=4, first_wait=0.01)


@pytest.fixture
def draining() -> Iterator[str]:
    with serving(_Draining) as url:
        yield url


def test_the_clis_remote_backend_retries_a_503_but_never_a_post(draining):
    """The review's drift: the runtime's transport did not retry (RemoteBackend raised on the first 503)."""
    be = RemoteBackend(url=draining, token="t")
    be.api.retry = FAST
    assert be.children() == []  # GET /v1/children: a 503, then the answer
    assert _Draining.seen["GET", "/v1/children"] == 2
    with pytest.raises(Unavailable) as e:  # POST: it may have done part of its work, so it is never sent again
        be.gc(dry_run=True)
    assert _Draining.seen["POST", "/v1/gc"] == 1 and e.value.status == 503 and e.value.detail == "draining"
    assert e.value.exit_code == 6


def test_a_refused_connect_is_retried_then_unavailable_with_the_runtimes_hint():
    port = free_port()  # nothing listens there
    tries: list[int] = []

    class Counting(Retry):
        def wait(self, attempt: int) -> float:
            tries.append(attempt)
            return 0.01

    with pytest.raises(Unavailable) as e:
        Client(url=f"http://127.0.0.1:{port}", retry=Counting(attempts=3))._send(Call("POST", "/v1/gc"))
    assert tries == [0, 1] and "3 attempt(s)" in str(e.value)  # a refused connect never reached the daemon
    assert e.value.status is None and e.value.hint == UNREACHABLE and "FORKD_NO_DAEMON=1" in e.value.hint


def test_a_stream_is_opened_with_the_same_retries(draining):
    events = [{"type": "start", "pid": 7}, {"type": "stdout", "data": b"\x00hi\xff"},
              {"type": "exit", "exit_code": 0, "truncated": False, "timed_out": False}]
    _Draining.answers["/v1/sandboxes/c1/processes/7/output"] = (
        "application/x-ndjson", b"".join(to_line(ev) for ev in events))
    c = Client(url=draining, retry=FAST)
    got = list(RemoteProcesses(c).attach("c1", 7))
    assert got == events and _Draining.seen["GET", "/v1/sandboxes/c1/processes/7/output"] == 2
    with pytest.raises(Unavailable) as e:  # starting a process is a POST: a 503 is final
        list(RemoteProcesses(c).stream("c1", ["true"]))
    assert e.value.status == 503 and _Draining.seen["POST", "/v1/sandboxes/c1/processes"] == 1


def test_the_retry_budget_is_a_setting_every_client_reads(monkeypatch):
    """FORKD_RETRY_ATTEMPTS / FORKD_RETRY_WAIT set the defaults of every Retry (the CLI's, the SDK's) without code;
    a value that does not parse is refused naming the variable."""
    assert Retry().attempts == 4 and Retry().first_wait == 0.25
    monkeypatch.setenv("FORKD_RETRY_ATTEMPTS", "2")
    monkeypatch.setenv("FORKD_RETRY_WAIT", "0.01")
    port = free_port()
    with pytest.raises(Unavailable) as e:
        Client(url=f"http://127.0.0.1:{port}")._send(Call("GET", "/v1/sandboxes"))
    assert "2 attempt(s)" in str(e.value)
    assert Retry(attempts=5).first_wait == 0.01  # an explicit field still wins over the variable, the rest follow it
    monkeypatch.setenv("FORKD_RETRY_ATTEMPTS", "0")
    with pytest.raises(InvalidInput, match="FORKD_RETRY_ATTEMPTS='0' is less than 1"):
        Retry()
