"""The configuration of the `forkd` Inspect sandbox provider (forkd_client.inspect_provider): a model, read from
a Task's `sandbox=("forkd", "forkd.yaml")` file or given as an object, with the names the provider gives what it
makes. Imports no inspect_ai, so it is tested without it.

    template: base          # the snapshot every sample forks from (or `pool:` a ForkPool to claim from)
    setup:                  # run once per task (as root) in a child of the template, then branched:
      - adduser -D agent    #   samples fork from that warm state, so setup never runs per sample
    user: agent             # who exec() and the file calls run as (default root)
    workdir: /home/agent    # relative paths and exec's default cwd (default: the user's home)
    lifetime_secs: 21600    # each child's deadline on the daemon, in case the eval dies before cleanup
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

PROVIDER_LABEL = "inspect.forkd.dev/provider"  # on every child the provider makes (value: PROVIDER)
TASK_LABEL = "inspect.forkd.dev/task"  # the task's slug
PROVIDER = "inspect"
TASK_PREFIX = "inspect-task-"  # tags of the per-task snapshots the provider branches (cli_cleanup removes them)
MAX_CONFIG = 1 << 20  # bytes of a config file read at most


class ForkdSandboxConfig(BaseModel):
    """Where samples come from, what runs once per task, and who runs the sample's commands."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    template: str | None = Field(None, description="snapshot tag samples fork from (default 'base' unless pool)")
    pool: str | None = Field(None, description="a ForkPool to claim each sample's child from instead")
    setup: tuple[str, ...] = Field((), description="shell commands run once per task as root, then branched")
    setup_timeout: float = Field(600, gt=0, description="seconds each setup command may take")
    user: str | None = Field(None, description="the default user of exec() and the file calls (default root)")
    workdir: str | None = Field(None, description="absolute; default the user's home from /etc/passwd")
    lifetime_secs: float = Field(6 * 3600, gt=0, le=30 * 86400, description="each child's deadline on the daemon")
    memory_limit_mib: int | None = Field(None, gt=0, description="each child's memory limit")
    url: str | None = Field(None, description="the daemon (default FORKD_URL, else the local socket)")
    token: str | None = Field(None, description="bearer token for url (default FORKD_TOKEN)")
    socket: str | None = Field(None, description="the daemon's unix socket")

    @model_validator(mode="before")
    @classmethod
    def _one_sandbox(cls, data: Any) -> Any:
        if isinstance(data, dict) and "services" in data:
            raise ValueError("'services': several named sandboxes per sample are not supported by the forkd sandbox "
                             "(a sample is one VM, forked from 'template'); drop 'services' and give that one "
                             "sandbox's template/setup, or try continuations inside a sample with env.fork(n)")
        return data

    @model_validator(mode="after")
    def _consistent(self) -> ForkdSandboxConfig:
        if self.template and self.pool:
            raise ValueError("give one of 'template' (a snapshot tag) or 'pool' (a ForkPool), not both")
        if self.pool and self.setup:
            raise ValueError("'setup' needs a 'template' to branch from; a pool's children are warmed by the pool "
                             "(put the setup in the pool's parent or layer)")
        if self.workdir is not None and not self.workdir.startswith("/"):
            raise ValueError(f"'workdir' must be an absolute path in the guest, not {self.workdir!r}")
        return self

    @property
    def source(self) -> str:
        return f"pool {self.pool}" if self.pool else f"snapshot {self.template or 'base'}"

    def key(self) -> str:
        """Equal configs share one per-task template."""
        return hashlib.sha256(self.model_dump_json().encode()).hexdigest()[:12]


def load_config(config: Any) -> ForkdSandboxConfig:
    """A Task's sandbox config: None (the defaults), a ForkdSandboxConfig, a dict, or a YAML file's path."""
    if config is None:
        return ForkdSandboxConfig()
    if isinstance(config, ForkdSandboxConfig):
        return config
    if isinstance(config, dict):
        return ForkdSandboxConfig.model_validate(config)
    if isinstance(config, str):
        return _from_file(Path(config))
    raise TypeError(f"the forkd sandbox takes a config file's path or a ForkdSandboxConfig, not {type(config).__name__}"
                    " (a compose file's several services are not supported: one VM per sample)")


def _from_file(path: Path) -> ForkdSandboxConfig:
    import yaml

    if path.name in ("compose.yaml", "compose.yml", "docker-compose.yaml", "docker-compose.yml", "Dockerfile"):
        raise ValueError(f"{path}: the forkd sandbox does not read Docker files; give a forkd config "
                         "(template, setup, user, workdir: see docs/inspect.md)")
    try:
        with path.open("rb") as f:
            text = f.read(MAX_CONFIG + 1)
    except OSError as exc:
        raise ValueError(f"cannot read the forkd sandbox config {path}: {exc.strerror}") from None
    if len(text) > MAX_CONFIG:
        raise ValueError(f"{path} is over {MAX_CONFIG} bytes: not a forkd sandbox config")
    data = yaml.safe_load(text) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a forkd sandbox config is a mapping (template, setup, user, ...)")
    try:
        return ForkdSandboxConfig.model_validate(data)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None


def slug(text: str, size: int = 40) -> str:
    """`text` as a tag or label value: lower case, [a-z0-9.-], at most `size` characters, never empty."""
    s = re.sub(r"[^a-z0-9.-]+", "-", text.lower()).strip("-.")[:size].strip("-.")
    return s or "task"
