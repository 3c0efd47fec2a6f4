"""The ports this tool chooses lie outside the kernel's ephemeral range and are free."""

from __future__ import annotations

import random
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_nvrx import ports
from pytest_nvrx.ports import (
    DEFAULT_EPHEMERAL_RANGE,
    LOWEST_PORT,
    PORTS_SCRIPT,
    candidate_ports,
    ephemeral_range,
    free_port,
    shared_port,
)


def _outside(port: int, span: tuple[int, int]) -> bool:
    return port >= LOWEST_PORT and not span[0] <= port <= span[1]


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class Scripted(random.Random):
    """A random source that picks the given ports in turn, then the last one forever."""

    def __init__(self, *picks: int) -> None:
        super().__init__(0)
        self.picks = list(picks)

    def choice(self, seq):  # type: ignore[no-untyped-def]
        assert self.picks[0] in seq, f"{self.picks[0]} is not a candidate"
        return self.picks.pop(0) if len(self.picks) > 1 else self.picks[0]


@pytest.fixture
def held() -> Iterator[int]:
    """A port outside the ephemeral range that a listening socket holds."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", free_port()))
    sock.listen()
    try:
        yield int(sock.getsockname()[1])
    finally:
        sock.close()


def test_this_hosts_range_is_read() -> None:
    text = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
    assert ephemeral_range() == (int(text[0]), int(text[1]))


@pytest.mark.parametrize("text", ["", "garbage", "1 2 3", "60999 32768", "0 10", "1000 70000"])
def test_an_unreadable_range_is_linuxs_default(tmp_path: Path, text: str) -> None:
    path = tmp_path / "ip_local_port_range"
    path.write_text(text)
    assert ephemeral_range(path) == DEFAULT_EPHEMERAL_RANGE
    assert ephemeral_range(tmp_path / "missing") == DEFAULT_EPHEMERAL_RANGE


def test_ports_chosen_are_outside_the_ephemeral_range_and_free() -> None:
    span = ephemeral_range()
    for _ in range(50):
        port = free_port()
        assert _outside(port, span), (port, span)
        assert _bindable(port)


def test_a_block_of_ports_stays_outside_the_range_at_both_ends() -> None:
    span = (30000, 60000)
    firsts = candidate_ports(span, count=3)
    assert min(firsts) == LOWEST_PORT
    assert max(f for f in firsts if f < span[0]) == span[0] - 3  # its last port is 29999
    assert min(f for f in firsts if f > span[1]) == span[1] + 1
    assert max(firsts) == 65535 - 2  # its last port is 65535
    first = free_port(count=3, ephemeral=span)
    assert all(_outside(p, span) and _bindable(p) for p in range(first, first + 3))


def test_a_range_that_leaves_nothing_outside_falls_back_to_any_port_from_the_lowest() -> None:
    assert candidate_ports((1024, 65535)) == range(LOWEST_PORT, 65536)
    assert LOWEST_PORT <= free_port(ephemeral=(1024, 65535)) <= 65535


def test_a_held_port_is_never_chosen(held: int) -> None:
    other = free_port()
    assert free_port(rng=Scripted(held, other)) == other


def test_a_block_with_a_held_port_inside_is_never_chosen() -> None:
    first = free_port(count=2)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", first + 1))
        sock.listen()
        spare = free_port(count=2)  # not ``first``: its second port is held now
        assert free_port(count=2, rng=Scripted(first, spare)) == spare


def test_no_free_port_is_an_error_that_says_so(held: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ports, "ATTEMPTS", 5)
    with pytest.raises(
        OSError, match=r"no 1 free consecutive TCP port\(s\) on 127\.0\.0\.1 .* 5 tries"
    ):
        free_port(rng=Scripted(held))


def test_shared_port_is_the_same_for_one_key_and_below_the_default_range() -> None:
    assert shared_port("job-1") == shared_port("job-1")
    seen = {shared_port(f"job-{i}") for i in range(2000)}
    assert all(LOWEST_PORT <= p < DEFAULT_EPHEMERAL_RANGE[0] for p in seen)
    assert len(seen) > 1500  # spread, not one port


def test_the_script_prints_a_free_port_as_a_slurm_node_runs_it(tmp_path: Path) -> None:
    """As the Slurm shim runs it: the file by path, from another directory, no package."""
    proc = subprocess.run(
        [sys.executable, "-I", str(PORTS_SCRIPT)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    port = int(proc.stdout)
    assert _outside(port, ephemeral_range())
