"""The isolated children's shared network, which forkd.sandbox.netns builds and forkd.sandbox.firewall fences:
the host bridge forkd0 and its address plan (each child's namespace leases one address of BRIDGE_NET), the
namespace side's veth name, where address leases are kept, and NetworkError, which both raise."""

from __future__ import annotations

from pathlib import Path

from forkd.base.errors import ForkdError
from forkd.base.settings import settings

BRIDGE = "forkd0"
BRIDGE_ADDR = "10.200.0.1"
BRIDGE_NET = "10.200.0.0/16"
BRIDGE_PREFIX = 16
INNER_VETH = "veth0"


class NetworkError(ForkdError):
    pass


def leases_dir() -> Path:
    """$FORKD_RUN_DIR/leases: one file per leased address, naming its namespace, veth and FORKD_HOME."""
    return settings().run_dir / "leases"
