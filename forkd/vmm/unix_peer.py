"""Whether the server of a unix stream connection accepted it yet, asked of the kernel (sock_diag).

A connection a listener has not accepted waits in its backlog with a server end that has no socket inode; once
`accept()` gives it one, the kernel reports that inode as the client's peer (UNIX_DIAG_PEER). QEMU serves one
connection per chardev at a time and stops accepting while it serves one, so "accepted and not closed" means "the
one QEMU serves" (forkd.vmm.agent_client.AgentClient.owned), learned without a round trip through the guest.

One request and one reply of fixed layout (<linux/sock_diag.h>, <linux/unix_diag.h>), packed here: pyroute2's
DiagSocket asks the same, but its asyncio core costs 0.5-5 ms a query, a quarter of a `--no-wait` branch's budget.
"""

from __future__ import annotations

import os
import socket
import struct

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST = 1
NLMSG_ERROR = 2
UDIAG_SHOW_PEER = 0x4
UNIX_DIAG_PEER = 2
NO_COOKIE = 0xFFFFFFFF  # each half of the kernel's "any cookie": the socket is named by its inode alone
_HDR = struct.Struct("=IHHII")  # nlmsghdr: length, type, flags, seq, pid
_REQ = struct.Struct("=BBHIIIII")  # unix_diag_req: family, protocol, pad, states, ino, show, cookie[2]
_MSG = struct.Struct("=BBBBIII")  # unix_diag_msg: family, type, state, pad, ino, cookie[2]
_ATTR = struct.Struct("=HH")  # nlattr: length, type
MAX_REPLY = 4096


def accepted(sock: socket.socket) -> bool | None:
    """True once the listener at the other end accepted `sock`'s connection, False while it waits in the backlog
    (or its server end is gone), None when the kernel cannot say (no unix sock_diag here: ask otherwise)."""
    try:
        ino = os.fstat(sock.fileno()).st_ino
        body = _REQ.pack(socket.AF_UNIX, 0, 0, 0xFFFFFFFF, ino, UDIAG_SHOW_PEER, NO_COOKIE, NO_COOKIE)
        with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_SOCK_DIAG) as nl:
            nl.settimeout(1.0)
            nl.send(_HDR.pack(_HDR.size + len(body), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST, 1, 0) + body)
            reply = nl.recv(MAX_REPLY)
    except OSError:
        return None
    peer = _peer(reply, ino)
    return None if peer is None else peer != 0


def _peer(reply: bytes, ino: int) -> int | None:
    """The peer inode in a sock_diag reply about socket `ino` (0: a server end not accepted yet), None if the reply
    is an error or says nothing of it."""
    if len(reply) < _HDR.size + _MSG.size:
        return None
    length, kind, _, _, _ = _HDR.unpack_from(reply)
    if kind == NLMSG_ERROR or length > len(reply) or _MSG.unpack_from(reply, _HDR.size)[4] != ino:
        return None
    off = _HDR.size + _MSG.size
    while off + _ATTR.size <= length:
        alen, atype = _ATTR.unpack_from(reply, off)
        if alen < _ATTR.size or off + alen > length:
            return None
        if atype == UNIX_DIAG_PEER and alen >= _ATTR.size + 4:
            return struct.unpack_from("=I", reply, off + _ATTR.size)[0]
        off += (alen + 3) & ~3
    return None
