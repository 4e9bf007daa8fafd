"""Loaded by every Python started with this directory on PYTHONPATH (bench/soak.py --tracemalloc DIR puts it there):
in `forkd serve` alone, once it has started, trace Python allocations and write a snapshot to
$FORKD_SOAK_TRACEMALLOC/<pid>-<n>.snap every 30 s, with the traced total and the RSS in `rss.txt` beside them.
Compare two snapshots with `python3 bench/soak.py --tracemalloc-diff A B`. Allocations made by C code through
malloc (glibc arenas, Rust, zstd) are not traced: the RSS beside the traced total shows how much that is."""

import os
import sys

OUT = os.environ.get("FORKD_SOAK_TRACEMALLOC")
if OUT and "serve" in sys.argv:
    import threading
    import time
    import tracemalloc

    def _dump() -> None:
        time.sleep(60)  # after start-up: tracing slows it, and the rig waits only so long for the socket
        tracemalloc.start(12)
        n = 0
        while True:
            tracemalloc.take_snapshot().dump(os.path.join(OUT, f"{os.getpid()}-{n:03d}.snap"))
            with open("/proc/self/status") as f:
                rss = {k: v.split()[0] for k, _, v in (line.partition(":") for line in f) if k in ("VmRSS", "VmSwap")}
            with open(os.path.join(OUT, "rss.txt"), "a") as f:
                f.write(f"{os.getpid()} {n:03d} {time.strftime('%H:%M:%S')} traced_kib "
                        f"{tracemalloc.get_traced_memory()[0] >> 10} rss_kib {rss['VmRSS']} swap_kib {rss['VmSwap']}\n")
            n += 1
            time.sleep(30)

    threading.Thread(target=_dump, name="soak-tracemalloc", daemon=True).start()
