"""A minimal Inspect sandbox provider over podman, for bench/inspect_eval.py only: Inspect's own `docker` provider
needs docker compose, which this machine does not have. Per sample: `podman run -d` of the benchmark's image (the
guest rootfs plus the staged workload, bench/lib/podman.py) running `sleep`, commands through `podman exec -i`,
files through `cat` in the container, and `podman rm -f` at sample cleanup: what the docker provider does per
sample, without compose's project and network. Registered as `bench-podman` when imported; the image and the cgroup
parent come from BENCH_PODMAN_IMAGE and BENCH_PODMAN_CGROUP."""

from __future__ import annotations

import os
from typing import Any, Literal, overload

import anyio
from inspect_ai.util import ExecResult, SandboxEnvironment, SandboxEnvironmentConfigType, sandboxenv

from bench.lib import podman

WORKDIR = "/root"


async def _podman(argv: list[str], data: bytes | None = None, timeout: float | None = None):
    with anyio.fail_after(timeout):
        return await anyio.run_process(["podman", *argv], input=data, check=False)


@sandboxenv(name="bench-podman")
class PodmanSandbox(SandboxEnvironment):
    """One sample's container."""

    def __init__(self, cid: str):
        super().__init__()
        self.cid = cid

    @classmethod
    async def sample_init(cls, task_name: str, config: SandboxEnvironmentConfigType | None,
                          metadata: dict[str, str]) -> dict[str, SandboxEnvironment]:
        argv = podman.run_argv(os.environ["BENCH_PODMAN_IMAGE"], os.environ.get("BENCH_PODMAN_CGROUP"), "-d",
                               "--workdir", WORKDIR)
        res = await anyio.run_process([*argv, "sleep", "86400"], check=False)
        if res.returncode != 0:
            raise RuntimeError(f"podman run failed: {res.stderr.decode(errors='replace')[-800:]}")
        return {"default": cls(res.stdout.decode().strip())}

    @classmethod
    async def sample_cleanup(cls, task_name: str, config: SandboxEnvironmentConfigType | None,
                             environments: dict[str, SandboxEnvironment], interrupted: bool) -> None:
        for env in environments.values():
            if isinstance(env, PodmanSandbox):
                await _podman(["rm", "-f", "-t", "0", env.cid])

    async def exec(self, cmd: list[str], input: str | bytes | None = None, cwd: str | None = None,
                   env: dict[str, str] | None = None, user: str | None = None, timeout: int | None = None,
                   timeout_retry: bool = True, concurrency: bool = True) -> ExecResult[str]:
        argv = ["exec", "-i", "--workdir", cwd if cwd and cwd.startswith("/") else f"{WORKDIR}/{cwd or ''}"]
        for k, v in (env or {}).items():
            argv += ["--env", f"{k}={v}"]
        if user:
            argv += ["--user", user]
        data = input.encode() if isinstance(input, str) else input
        res = await _podman([*argv, self.cid, *cmd], data, timeout)
        return ExecResult(success=res.returncode == 0, returncode=res.returncode,
                          stdout=res.stdout.decode("utf-8", "replace"), stderr=res.stderr.decode("utf-8", "replace"))

    async def write_file(self, file: str, contents: str | bytes) -> None:
        data = contents.encode() if isinstance(contents, str) else contents
        res = await self.exec(["sh", "-c", 'mkdir -p "$(dirname "$1")" && cat > "$1"', "w", file], data)
        if not res.success:
            raise RuntimeError(f"cannot write {file} in container {self.cid[:12]}: {res.stderr}")

    @overload
    async def read_file(self, file: str, text: Literal[True] = True) -> str: ...

    @overload
    async def read_file(self, file: str, text: Literal[False]) -> bytes: ...

    async def read_file(self, file: str, text: bool = True) -> Any:
        res = await _podman(["exec", "--workdir", WORKDIR, self.cid, "cat", file])
        if res.returncode != 0:
            raise FileNotFoundError(2, res.stderr.decode(errors="replace").strip(), file)
        return res.stdout.decode() if text else res.stdout
