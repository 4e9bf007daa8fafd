"""`Service`: every verb forkd offers, on one node's Runtime and Control, the same for the daemon's routes
(forkd.api) and for in-process callers (forkd.client.local.LocalBackend). The verbs live in one module per
resource (children, snapshots, guest files and ports, the host); the declarative objects are the reconciler's
Control (`service.control`)."""

from __future__ import annotations

from typing import Any

from forkd.base.paths import Layout
from forkd.core.ports import PortGrants
from forkd.core.relay import Relay
from forkd.core.runtime import Runtime
from forkd.reconciler.control import Control
from forkd.service.children import Children
from forkd.service.guest import Guest
from forkd.service.host import Host
from forkd.service.jobs import Jobs, Limits
from forkd.service.listing import ChildView
from forkd.service.processes import LocalProcesses
from forkd.service.snapshots import Snapshots
from forkd.service.wire import child_view


class Service(Children, Snapshots, Guest, Host):
    """One node's verbs. `control`: the caller's Control (default: a new Runtime on $FORKD_HOME)."""

    def __init__(self, control: Control | None = None):
        self.control = control or Control(Runtime())
        self.grants = PortGrants()
        self.relay = Relay(self.rt)
        # the builds running as jobs; its limits are the settings as they are now, its records read on first use
        self.jobs = Jobs(self.rt.layout.jobs, Limits.from_settings())

    @classmethod
    def on(cls, layout: Layout) -> Service:
        """A service on `layout` whose reconciler is made on first use."""
        return cls(Control(Runtime(layout)))

    def reconcile_with(self, on_action: Any) -> Control:
        """The daemon's Control: its reconciler reports each action to `on_action(action, ok, message, ms)`."""
        from forkd.reconciler.engine import Reconciler

        self.control = Control(self.rt, reconciler=Reconciler(self.rt, on_action=on_action))
        return self.control

    @property
    def processes(self) -> LocalProcesses:
        """Processes in the children (start, stream, stdin, signal, wait, list, kill, console logs)."""
        return LocalProcesses(self.rt)

    @property
    def rt(self) -> Runtime:
        return self.control.rt

    def template(self, name: str) -> str:
        """The snapshot tag `name` stands for: a snapshot, or a ForkParent/ForkLayer/ForkBranch's ready one."""
        return self.control.template(name)

    def claim(self, pool: str, n: int = 1, lifetime: float | None = None) -> list[ChildView]:
        """`n` ready children of `pool`, each living `lifetime` (default the pool's ttl, else the node's)."""
        return [child_view(r) for r in self.control.claim(pool, n, lifetime=lifetime)]
