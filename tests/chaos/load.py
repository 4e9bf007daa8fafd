"""The mixed load the harness kills at random points: every operation is the real `forkd` CLI against the rig's
home (through the daemon while it answers, in-process when it does not), picked by a seeded random generator.

Operations: claim, exec, kill, live branch, layer build, compaction, pack + unpack, apply (pool resized), rmi, and a
burst of concurrent claims, creates (fork) and kills against one pool."""

from __future__ import annotations

import json
import random
import threading
from collections import Counter
from dataclasses import dataclass, field

from tests.chaos.rig import ISOLATED, SPEC, Rig

POOL, PARENT = "cx-a", "cx-p"
KEEP_PER_KIND = 2  # generated snapshots kept per kind (ly-, cp-, br-): bounds the RAM and disk they hold
MAX_CLAIMED = 3  # claimed children the load keeps at once
ERROR_CHARS = 4000  # of a failed command's stderr kept in a violation


@dataclass
class LoadState:
    """What the load knows: claimed children nobody killed (must survive anything), every child id it saw,
    the snapshots it made, and the outcome of every operation."""

    isolated: bool = False
    parent_tag: str = PARENT  # the ForkParent's snapshot tag (set once it is built)
    claimed: set[str] = field(default_factory=set)
    seen: set[str] = field(default_factory=set)
    tags: list[str] = field(default_factory=list)
    counter: int = 0
    outcomes: Counter = field(default_factory=Counter)  # (op, "ok" | "exit N")
    errors: list[str] = field(default_factory=list)  # failures while the daemon was alive (samples)
    lock: threading.Lock = field(default_factory=threading.Lock)
    busy: set[str] = field(default_factory=set)  # claimed children an operation is using right now

    def take(self, rng: random.Random) -> str | None:
        """A claimed child no other operation is using (so no exec races a kill the load itself sent)."""
        with self.lock:
            free = sorted(self.claimed - self.busy)
            cid = rng.choice(free) if free else None
            if cid:
                self.busy.add(cid)
        return cid

    def give(self, cid: str) -> None:
        with self.lock:
            self.busy.discard(cid)

    def next_tag(self, prefix: str) -> str:
        with self.lock:
            self.counter += 1
            return f"{prefix}-{self.counter}"

    def pick(self, rng: random.Random, items) -> str | None:
        with self.lock:
            items = sorted(items)
        return rng.choice(items) if items else None


def error_text(res, limit: int = ERROR_CHARS) -> str:
    """A failed command's whole error (stderr, lines joined with ' | '); longer than `limit`, its start and its end
    (the first line names the step that failed, the last the files to read)."""
    text = " | ".join(line for line in res.stderr.strip().splitlines() if line.strip()) or "(no stderr)"
    return text if len(text) <= limit else f"{text[:limit // 2]} [...] {text[-limit // 2:]}"


def spec_text(warm: int, isolated: bool) -> str:
    return SPEC.format(warm=warm, max_children=8) + (ISOLATED if isolated else "")


class Load:
    def __init__(self, rig: Rig, state: LoadState):
        self.rig, self.s = rig, state
        self.ops = {"claim": (3, self.claim), "exec": (3, self.exec_), "kill": (2, self.kill),
                    "branch": (2, self.branch), "layer": (1, self.layer), "compact": (1, self.compact),
                    "pack": (1, self.pack), "apply": (1, self.apply), "rmi": (1, self.rmi),
                    "burst": (1, self.burst)}

    def run(self, rng: random.Random, stop: threading.Event) -> None:
        names = sorted(self.ops)
        weights = [self.ops[n][0] for n in names]
        while not stop.is_set():
            name = rng.choices(names, weights)[0]
            self.ops[name][1](rng)

    def _run(self, op: str, *args: str, timeout: float = 240.0):
        alive, gen = self.rig.daemon_pid() is not None, self.rig.starts
        res = self.rig.cli(*args, timeout=timeout, what=op)
        key = "ok" if res.returncode == 0 else f"exit {res.returncode}"
        with self.s.lock:
            self.s.outcomes[(op, key)] += 1
            if res.returncode == 1 and alive and self.rig.daemon_pid() is not None and gen == self.rig.starts:
                self.s.errors.append(f"{' '.join(args[:3])}: exit {res.returncode}: {error_text(res)}")
        return res

    def claim(self, rng: random.Random, pool: str | None = None) -> str | None:
        if len(self.s.claimed) >= MAX_CLAIMED and pool is None:
            return None
        pool = pool or ("cx-i" if self.s.isolated and rng.random() < 0.25 else POOL)
        res = self._run("claim", "claim", pool, "-o", "json")
        if res.returncode != 0:
            return None
        try:
            ids = [c["id"] for c in json.loads(res.stdout)["children"]]
        except (ValueError, KeyError, TypeError):
            return None
        with self.s.lock:
            self.s.claimed.update(ids)
            self.s.seen.update(ids)
        return ids[0] if ids else None

    def exec_(self, rng: random.Random) -> None:
        cid = self.s.take(rng)
        if cid:
            try:
                self._run("exec", "exec", "--timeout", "60", cid, "--", "sh", "-c", "echo $((6*7)) > /root/x")
            finally:
                self.s.give(cid)

    def kill(self, rng: random.Random, cid: str | None = None) -> None:
        cid = cid or self.s.take(rng)
        if cid:
            with self.s.lock:
                self.s.claimed.discard(cid)  # from here on it may legitimately be gone
            try:
                self._run("kill", "kill", cid)
            finally:
                self.s.give(cid)

    def branch(self, rng: random.Random) -> None:
        cid = self.s.take(rng)
        if cid:
            tag = self.s.next_tag("br")
            try:
                self._made(tag, self._run("branch", "branch", cid, "--tag", tag, "--mode", "live"))
            finally:
                self.s.give(cid)

    def layer(self, rng: random.Random, what: str = "layer"):
        tag = self.s.next_tag("ly")
        res = self._run(what, "snapshot", "diff", "--tag", tag, "--from", self.s.parent_tag, "--run",
                        f"echo {tag} > /root/layer")
        self._made(tag, res)
        return res

    def compact(self, rng: random.Random) -> None:
        src = self.s.pick(rng, [t for t in self.s.tags if t.startswith("ly-")])
        if src:
            tag = self.s.next_tag("cp")
            self._made(tag, self._run("compact", "snapshot", "compact", "--from", src, "--to", tag))

    def pack(self, rng: random.Random) -> None:
        src = self.s.pick(rng, [t for t in self.s.tags if t.startswith(("cp-", "br-"))])
        if src:
            path = self.rig.home.parent / f"{self.rig.home.name}-{src}.tar.zst"
            if self._run("pack", "pack", "--tag", src, "--output-file", str(path), "--level", "1").returncode == 0:
                self._run("unpack", "unpack", str(path))
            path.unlink(missing_ok=True)

    def apply(self, rng: random.Random) -> None:
        self.rig.apply(spec_text(rng.choice((2, 3)), self.s.isolated))
        with self.s.lock:
            self.s.outcomes[("apply", "ran")] += 1

    def rmi(self, rng: random.Random) -> None:
        for prefix in ("ly-", "cp-", "br-"):
            mine = [t for t in self.s.tags if t.startswith(prefix)]
            for tag in mine[:-KEEP_PER_KIND]:
                if self._run("rmi", "snapshot", "rm", tag).returncode in (0, 3):
                    with self.s.lock:
                        if tag in self.s.tags:
                            self.s.tags.remove(tag)

    def burst(self, rng: random.Random, n: int = 4) -> None:
        """Concurrent claims, a create (fork) and kills against one pool, all at once."""
        got: list[str] = []

        def one_claim() -> None:
            cid = self.claim(rng, pool=POOL)
            if cid:
                got.append(cid)

        def one_fork() -> None:
            res = self._run("fork", "fork", "--tag", self.s.parent_tag, "--count", "1", "-o", "json")
            if res.returncode == 0:
                try:
                    ids = [c["id"] for c in json.loads(res.stdout)["children"]]
                except (ValueError, KeyError, TypeError):
                    return
                with self.s.lock:
                    self.s.seen.update(ids)
                got.extend(ids)

        threads = [threading.Thread(target=one_claim) for _ in range(n - 1)] + [threading.Thread(target=one_fork)]
        victim = self.s.take(rng)
        if victim:
            threads.append(threading.Thread(target=self.kill, args=(rng, victim)))
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        kills = [threading.Thread(target=self.kill, args=(rng, c)) for c in got]
        for t in kills:
            t.start()
        for t in kills:
            t.join()

    def _made(self, tag: str, res) -> None:
        with self.s.lock:
            self.s.tags.append(tag)  # failed or not: a tag that exists must be ready or failed
