"""The `/v1` wire models as the clients see them: forkd.service.wire, where the service that answers them keeps them."""

from forkd.service.wire import *  # noqa: F403 - the same names
from forkd.service.wire import Strict, child_view, sandbox_info, snapshot_info, snapshot_view  # noqa: F401
