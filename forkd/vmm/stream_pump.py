"""The branch stream's pump, run as its own process: `python -I -S stream_pump.py RFD WFD`.

It copies everything QEMU writes into the pipe RFD to the stream file WFD, until QEMU closes its end. It is a
process of its own, in a session of its own, so that it outlives the forkd process that started the branch: a
QEMU 7.2 background snapshot whose stream breaks (its reader gone, e.g. `kill -9` of the branching CLI or daemon)
stops resolving write-protect faults while guest RAM is still protected, and the source's vCPUs and main loop
hang for good in `handle_userfault` (seen in CI: the source answered a ping, then never an exec). With the pump
here, a killed branch still runs to the end of its stream, the source is freed, and the next start-up's recovery
marks the half-made snapshot failed.

A write that fails (no space left) is remembered and the rest of the pipe is drained (for the same reason). At the
end it prints one JSON line: {"copied": BYTES, "error": [ERRNO, MESSAGE] or null}. Standard library only, no
forkd import: it starts in a few ms, and nothing in it can be broken by the package it serves.
"""

import json
import os
import sys

CHUNK = 1 << 20
COPY_INSTEAD = (22, 95)  # EINVAL, EOPNOTSUPP: this file cannot be spliced into


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def pump(rfd: int, wfd: int) -> tuple[int, OSError | None]:
    copied, error, splice = 0, None, True
    while True:
        if error is not None:  # draining: QEMU must reach the end of its stream
            n = len(os.read(rfd, CHUNK))
        elif splice:
            try:
                n = os.splice(rfd, wfd, CHUNK)
            except OSError as exc:
                if exc.errno in COPY_INSTEAD:
                    splice = False
                else:
                    error = exc
                continue
        else:
            data = os.read(rfd, CHUNK)
            n = len(data)
            try:
                _write_all(wfd, data)
            except OSError as exc:
                error = exc
        if n == 0:
            return copied, error
        copied += n


def main(argv: list[str]) -> int:
    copied, error = pump(int(argv[1]), int(argv[2]))
    report = {"copied": copied, "error": None if error is None else [error.errno, error.strerror]}
    try:
        print(json.dumps(report), flush=True)
    except OSError:
        pass  # whoever started us is gone: the stream was still drained, which is what mattered
    return 0 if error is None else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
