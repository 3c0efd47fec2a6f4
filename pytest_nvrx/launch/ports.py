"""TCP ports this tool chooses: a run's log server, a Slurm run's rendezvous, a test's store.

A port found free and let go is bound by its user a moment later. If it came from the kernel
(``bind`` to port 0) it lies in the kernel's ephemeral range, the range every outgoing connection
on the host draws its local port from: gloo's pairs, TCPStore clients, gRPC. Under load one of
those can take the port in that moment, and the launcher or store then fails with EADDRINUSE.
That happened in CI (a workload's store, port 43805).

So the ports chosen here lie outside that range: random, confirmed free by binding them once.
The kernel never hands them out on its own; only another explicit choice of the same port at the
same moment can collide.

Standard library only: a Slurm run runs this file on its first node as a script (``python
ports.py [HOST [COUNT]]`` prints the first of COUNT ports free there).
"""

from __future__ import annotations

import random
import socket
import sys
import zlib
from collections.abc import Sequence
from pathlib import Path

#: This file, run as a script on a Slurm node.
PORTS_SCRIPT = Path(__file__).resolve()
#: Where Linux keeps its ephemeral range ("32768\t60999" by default).
EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
#: Linux's default range: used when the file cannot be read, and for other hosts' ranges.
DEFAULT_EPHEMERAL_RANGE = (32768, 60999)
#: The lowest port chosen: the ports below it hold many services' registered ports.
LOWEST_PORT = 20000
#: Random tries before giving up; each one binds one candidate port.
ATTEMPTS = 200


def ephemeral_range(path: Path | None = None) -> tuple[int, int]:
    """This host's ephemeral port range, both ends included (Linux's default if unreadable)."""
    try:
        low, high = (int(field) for field in (path or EPHEMERAL_RANGE_FILE).read_text().split())
    except (OSError, ValueError):
        return DEFAULT_EPHEMERAL_RANGE
    return (low, high) if 0 < low <= high <= 65535 else DEFAULT_EPHEMERAL_RANGE


def candidate_ports(ephemeral: tuple[int, int], count: int = 1) -> list[int]:
    """First ports of ``count`` consecutive ports from LOWEST_PORT up that avoid ``ephemeral``
    (none when the range leaves no room)."""
    low, high = ephemeral
    last_first = 65536 - count
    below = range(LOWEST_PORT, min(low - count + 1, last_first + 1))
    above = range(max(high + 1, LOWEST_PORT), last_first + 1)
    return [*below, *above]


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(
    host: str = "",
    count: int = 1,
    *,
    ephemeral: tuple[int, int] | None = None,
    rng: random.Random | None = None,
) -> int:
    """The first of ``count`` consecutive TCP ports free on ``host`` now (``""``: on every
    address, as the launcher's servers bind), outside the ephemeral range.

    When the range leaves no room outside, or ATTEMPTS candidates there are busy, any ports from
    LOWEST_PORT up (a random pick in the range is no worse than the kernel's own); OSError when
    those are busy too."""
    if not 1 <= count <= 65536 - LOWEST_PORT:
        raise ValueError(f"count must be 1 to {65536 - LOWEST_PORT}, got {count}")
    span = ephemeral or ephemeral_range()
    pick = rng or random.SystemRandom()
    outside = candidate_ports(span, count)
    for candidates in (outside, range(LOWEST_PORT, 65537 - count)):
        for _ in range(ATTEMPTS if candidates else 0):
            first = pick.choice(candidates)
            if all(_bindable(host, port) for port in range(first, first + count)):
                return first
    raise OSError(
        f"no {count} free consecutive TCP port(s) on {host or 'any address'} from {LOWEST_PORT} "
        f"up after {2 * ATTEMPTS} tries (ephemeral range {span[0]}-{span[1]})"
    )


def shared_port(key: str) -> int:
    """A port every node derives alike from ``key`` (a run ID), below Linux's default ephemeral
    range: no node can ask the others whether it is free."""
    return LOWEST_PORT + zlib.crc32(key.encode()) % (DEFAULT_EPHEMERAL_RANGE[0] - LOWEST_PORT)


def main(argv: Sequence[str] | None = None) -> int:
    """``ports.py [HOST [COUNT]]``: print the first of COUNT (1) consecutive ports free on HOST
    (every address)."""
    args = list(sys.argv[1:] if argv is None else argv)
    host = args[0] if args else ""
    count = int(args[1]) if len(args) > 1 else 1
    print(free_port(host, count))
    return 0


if __name__ == "__main__":
    sys.exit(main())
