"""forkd's nftables rules for isolated children: the table in each child's namespace, the host's table, and
the per-child grants that open the host table for a child's leased address.

Egress (forkd.core.requests.Egress) is enforced twice, by tables forkd owns: in the child's namespace (exactly its
policy) and on the host (the same policy, keyed by the child's address: a floor that holds even if a namespace's
rules were changed). `none` (the default): nothing at all, not even the host. `internet`: public IPv4 only (never
BLOCKED_V4: link-local and cloud metadata, RFC 1918, CGNAT, loopback, multicast...; never a host address, since
traffic to the host is INPUT and only an allow list admits it). `{allow: [CIDR:port]}`: exactly those, the host's
10.200.0.1 included when named. Children cannot reach one another (bridge port isolation at layer 2, the namespace
input filter and the host forward filter behind it); the guest listens on nothing (the agent talks over
virtio-serial). The host's ip_forward is left as it is: with it off children reach at most the host.

A child's host grants are written down next to its address's lease (`<addr>.grants`) before they are loaded, so
whoever next leases or releases the address takes them back (forkd.sandbox.netns).
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

from forkd.base.procs import run
from forkd.sandbox.netlayout import BRIDGE, BRIDGE_NET, INNER_VETH, NetworkError, leases_dir
from forkd.vmm.driver import TAP_NAME

HOST_TABLE = "forkd_host"

# never reachable with `internet` egress: not globally routed, or the node's own neighbourhood (IANA special
# purpose: this network, RFC 1918, CGNAT, loopback, link-local incl. 169.254.169.254, IETF protocol assignments,
# benchmarking, multicast, reserved and broadcast). Only an allow list names one of these.
BLOCKED_V4 = ("0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16", "172.16.0.0/12",
              "192.0.0.0/24", "192.168.0.0/16", "198.18.0.0/15", "224.0.0.0/4", "240.0.0.0/4")
_BLOCKED = ", ".join(BLOCKED_V4)

NETNS_RULES = f"""
table inet forkd {{
  chain nat_out {{ type nat hook postrouting priority srcnat; policy accept;
    oifname "{INNER_VETH}" masquerade; }}
  chain filter_fwd {{ type filter hook forward priority filter; policy drop;
    iifname "{INNER_VETH}" oifname "{TAP_NAME}" ct state established,related accept;
    iifname "{TAP_NAME}" oifname "{INNER_VETH}" meta nfproto ipv4 jump egress; }}
  chain filter_in {{ type filter hook input priority filter; policy drop;
    iif "lo" accept;
    ct state established,related accept; }}
  chain egress {{
    ct state established,related accept;
{{egress}}
    drop; }}
}}
"""

HOST_RULES = f"""
table inet {HOST_TABLE} {{
  set blocked4 {{ type ipv4_addr; flags interval; elements = {{ {_BLOCKED} }}; }}
  set allow4 {{ type ipv4_addr . ipv4_addr . inet_proto . inet_service; flags interval; }}
  set internet4 {{ type ipv4_addr; }}
  chain filter_fwd {{ type filter hook forward priority filter; policy accept;
    iifname "{BRIDGE}" jump from_child;
    oifname "{BRIDGE}" ct state established,related accept;
    oifname "{BRIDGE}" drop; }}
  chain from_child {{
    oifname "{BRIDGE}" drop;
    meta nfproto ipv6 drop;
    ct state established,related accept;
    ip saddr . ip daddr . meta l4proto . th dport @allow4 accept;
    ip daddr @blocked4 drop;
    ip saddr @internet4 accept;
    drop; }}
  chain filter_in {{ type filter hook input priority filter; policy accept;
    iifname "{BRIDGE}" jump to_host; }}
  chain to_host {{
    ct state established,related accept;
    meta nfproto ipv6 drop;
    ip saddr . ip daddr . meta l4proto . th dport @allow4 accept;
    drop; }}
  chain nat_out {{ type nat hook postrouting priority srcnat; policy accept;
    ip saddr {BRIDGE_NET} oifname != "{BRIDGE}" masquerade; }}
}}
"""
LEGACY_HOST_TABLE = ("ip", HOST_TABLE)  # before egress: forward policy accept, any port of the bridge address
Egress = str | dict[str, list[str]]  # as recorded: "none" | "internet" | {"allow": ["CIDR:port", ...]} (validated
#                                      by forkd.core.requests.Egress before it gets here)


def _rule_parts(rule: str) -> tuple[str, str]:
    """"10.0.0.0/8:5432" -> ("10.0.0.0/8", "5432"); ports may be a range lo-hi."""
    cidr, _, ports = rule.rpartition(":")
    return cidr, ports


def netns_rules(egress: Egress) -> str:
    """The child namespace's table for `egress` (see the module doc)."""
    if egress == "internet":
        body = f"    ip daddr {{ {_BLOCKED} }} drop;\n    accept;"
    elif egress == "none":
        body = ""
    else:
        body = "\n".join(f"    ip daddr {c} meta l4proto {{ tcp, udp }} th dport {p} accept;"
                         for c, p in map(_rule_parts, _allow(egress)))
    return NETNS_RULES.replace("{egress}", body)


def host_grants(addr: str, egress: Egress) -> list[str]:
    """The host-table elements that let the child at `addr` out as `egress` allows ([] for none)."""
    if egress == "none":
        return []
    if egress == "internet":
        return [f"internet4 {{ {addr} }}"]
    return [f"allow4 {{ {addr} . {c} . {proto} . {p} }}" for c, p in map(_rule_parts, _allow(egress))
            for proto in ("tcp", "udp")]


def _allow(egress: Egress) -> list[str]:
    if not isinstance(egress, dict) or not isinstance(egress.get("allow"), list | tuple):
        raise NetworkError(f"egress {egress!r} is not none, internet or {{allow: [...]}}",
                           hint="build it with forkd.core.requests.Egress")
    return list(egress["allow"])


def load_rules(rules: str) -> None:
    """Load nft `rules` (a table, or element changes) in this thread's network namespace."""
    run(["nft", "-f", "-"], "loading forkd's nft rules", input=rules, error=NetworkError,
        hint="apt-get install nftables (scripts/setup.sh)")


def _grants_file(addr: str) -> Path:
    return leases_dir() / f"{addr}.grants"


def grant(addr: str, egress: Egress) -> None:
    """Let `addr` out through the host table as `egress` allows. The grants are written down (next to the lease)
    before they are loaded, so whoever next leases or releases the address can always take them back."""
    grants = host_grants(addr, egress)
    if not grants:
        return
    path = _grants_file(addr)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(grants, f)
    load_rules("".join(f"add element inet {HOST_TABLE} {g}\n" for g in grants))


def revoke(addr: str) -> None:
    """Take back the host grants of `addr`, if any (add-then-delete: no error for one already gone)."""
    path = _grants_file(addr)
    try:
        grants = json.loads(path.read_text())
    except FileNotFoundError:
        return
    except (OSError, ValueError):
        grants = []
    if grants:
        load_rules("".join(f"add element inet {HOST_TABLE} {g}\ndelete element inet {HOST_TABLE} {g}\n"
                     for g in grants))
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def ensure_host_table() -> None:
    """Load the host table unless it is loaded already, removing an older forkd's permissive table first. Call
    under the host lock (forkd.sandbox.netns.ensure_host)."""
    if not host_table_loaded():
        fam, name = LEGACY_HOST_TABLE  # an older forkd's table admitted every port of 10.200.0.1
        run(["nft", "delete", "table", fam, name], ok=None, error=NetworkError)
        load_rules(HOST_RULES)


def host_table_loaded() -> bool:
    return run(["nft", "list", "table", "inet", HOST_TABLE], ok=None, error=NetworkError,
               hint="apt-get install nftables (scripts/setup.sh)").returncode == 0


def posture() -> dict[str, object]:
    """What `forkd doctor` can report about egress on this host: forkd's host table (default deny from the
    bridge), an older forkd's permissive table still loaded, and the host's ip_forward."""
    legacy = run(["nft", "list", "table", *LEGACY_HOST_TABLE], ok=None, error=NetworkError).returncode == 0
    try:
        forward = Path("/proc/sys/net/ipv4/ip_forward").read_text().strip() == "1"
    except OSError:
        forward = False
    return {"host_table": host_table_loaded(), "legacy_table": legacy, "ip_forward": forward,
            "default_egress": "none"}
