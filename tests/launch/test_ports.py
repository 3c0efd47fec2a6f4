"""The ports this tool chooses lie outside the kernel's ephemeral range and are free."""

from __future__ import annotations

import random
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_nvrx.launch import ports
from pytest_nvrx.launch.ports import (
    DEFAULT_EPHEMERAL_RANGE,
    LOWEST_PORT,
    PORTS_SCRIPT,
    candidate_ports,
    ephemeral_range,
    free_port,
    shared_port,
)

#: A range of our own, not Linux's default: a test that passes with it read the range it was given.
SPAN = (30000, 60000)


def _outside(port: int, span: tuple[int, int]) -> bool:
    return port >= LOWEST_PORT and not span[0] <= port <= span[1]


def _bindable(port: int, host: str = "") -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def needs_room_outside() -> tuple[int, int]:
    """This host's range, skipping where it leaves no port outside it (then any port will do)."""
    span = ephemeral_range()
    if not candidate_ports(span):
        pytest.skip(f"this host's ephemeral range {span} leaves no port from {LOWEST_PORT} up")
    return span


class Scripted(random.Random):
    """A random source that picks the given ports in turn, then the last one forever; it
    records the candidates it was offered."""

    def __init__(self, *picks: int) -> None:
        super().__init__(0)
        self.picks = list(picks)
        self.offered: list[list[int]] = []

    def choice(self, seq):  # type: ignore[no-untyped-def]
        if not self.offered or self.offered[-1] != list(seq):
            self.offered.append(list(seq))
        assert self.picks[0] in seq, f"{self.picks[0]} is not a candidate"
        return self.picks.pop(0) if len(self.picks) > 1 else self.picks[0]


@pytest.fixture
def held() -> Iterator[int]:
    """A port outside SPAN that a socket listening on every address holds."""
    sock = socket.socket()
    sock.bind(("", free_port(ephemeral=SPAN)))
    sock.listen()
    try:
        yield int(sock.getsockname()[1])
    finally:
        sock.close()


def test_this_hosts_range_is_read() -> None:
    text = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
    assert ephemeral_range() == (int(text[0]), int(text[1]))


def test_the_range_file_is_what_decides(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "ip_local_port_range"
    path.write_text("40000\t50000\n")
    monkeypatch.setattr(ports, "EPHEMERAL_RANGE_FILE", path)
    assert ephemeral_range() == (40000, 50000)
    rng = Scripted(free_port(ephemeral=(40000, 50000)))
    free_port(rng=rng)
    offered = set(rng.offered[0])
    assert 39999 in offered and 50001 in offered and 35000 in offered
    assert not offered & set(range(40000, 50001))


@pytest.mark.parametrize("text", ["", "garbage", "1 2 3", "60999 32768", "0 10", "1000 70000"])
def test_an_unreadable_range_is_linuxs_default(tmp_path: Path, text: str) -> None:
    path = tmp_path / "ip_local_port_range"
    path.write_text(text)
    assert ephemeral_range(path) == DEFAULT_EPHEMERAL_RANGE
    assert ephemeral_range(tmp_path / "missing") == DEFAULT_EPHEMERAL_RANGE


def test_ports_chosen_are_outside_this_hosts_range_and_free() -> None:
    span = needs_room_outside()
    for _ in range(50):
        port = free_port()
        assert _outside(port, span), (port, span)
        assert _bindable(port)


def test_a_block_of_ports_stays_outside_the_range_at_both_ends() -> None:
    firsts = candidate_ports(SPAN, count=3)
    assert min(firsts) == LOWEST_PORT
    assert max(f for f in firsts if f < SPAN[0]) == SPAN[0] - 3  # its last port is 29999
    assert min(f for f in firsts if f > SPAN[1]) == SPAN[1] + 1
    assert max(firsts) == 65535 - 2  # its last port is 65535
    first = free_port(count=3, ephemeral=SPAN)
    assert all(_outside(p, SPAN) and _bindable(p) for p in range(first, first + 3))


def test_a_range_that_leaves_nothing_outside_falls_back_to_any_port_from_the_lowest() -> None:
    assert candidate_ports((1024, 65535)) == []
    assert candidate_ports((LOWEST_PORT, 65535)) == []
    for _ in range(20):
        port = free_port(ephemeral=(1024, 65535))
        assert LOWEST_PORT <= port <= 65535 and _bindable(port)


@pytest.mark.parametrize(
    ("only", "span"), [(65535, (LOWEST_PORT, 65534)), (LOWEST_PORT, (LOWEST_PORT + 1, 65535))]
)
def test_busy_ports_outside_fall_back_to_the_range(
    only: int, span: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A range that leaves one port outside, held: a port inside beats no run at all."""
    monkeypatch.setattr(ports, "ATTEMPTS", 3)
    assert candidate_ports(span) == [only]
    with socket.socket() as sock:
        try:
            sock.bind(("", only))
        except OSError:
            pytest.skip(f"port {only} is in use here")
        sock.listen()
        inside = free_port(ephemeral=(1024, 65535))
        rng = Scripted(only, only, only, inside)
        assert free_port(ephemeral=span, rng=rng) == inside
    assert rng.offered[0] == [only] and len(rng.offered[1]) == 65536 - LOWEST_PORT


def test_a_held_port_is_never_chosen(held: int) -> None:
    other = free_port(ephemeral=SPAN)
    assert free_port(ephemeral=SPAN, rng=Scripted(held, other)) == other


def test_a_port_held_on_one_address_is_busy_for_every_address() -> None:
    """The launcher's servers bind every address: a port held on 127.0.0.2 is not free."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.2", free_port(ephemeral=SPAN)))
        sock.listen()
        busy = int(sock.getsockname()[1])
        other = free_port(ephemeral=SPAN)
        assert free_port(ephemeral=SPAN, rng=Scripted(busy, other)) == other


def test_a_block_with_a_held_port_inside_is_never_chosen() -> None:
    first = free_port(count=2, ephemeral=SPAN)
    with socket.socket() as sock:
        sock.bind(("", first + 1))
        sock.listen()
        spare = free_port(count=2, ephemeral=SPAN)  # not ``first``: its second port is held now
        assert free_port(count=2, ephemeral=SPAN, rng=Scripted(first, spare)) == spare


def test_no_free_port_is_an_error_that_says_so(held: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ports, "ATTEMPTS", 5)
    with pytest.raises(
        OSError, match=r"no 1 free consecutive TCP port\(s\) on any address .* 10 tries"
    ):
        free_port(ephemeral=SPAN, rng=Scripted(held))


@pytest.mark.parametrize("count", [0, -1, 65536 - LOWEST_PORT + 1])
def test_an_impossible_count_is_refused(count: int) -> None:
    with pytest.raises(ValueError, match="count must be 1 to"):
        free_port(count=count)


def test_shared_port_is_the_same_for_one_key_and_below_the_default_range() -> None:
    assert shared_port("job-1") == shared_port("job-1")
    seen = {shared_port(f"job-{i}") for i in range(2000)}
    assert all(LOWEST_PORT <= p < DEFAULT_EPHEMERAL_RANGE[0] for p in seen)
    assert len(seen) > 1500  # spread, not one port


def test_the_script_prints_a_free_block_as_the_slurm_launch_runs_it(tmp_path: Path) -> None:
    """As SlurmLaunch runs it on the first node: the file by path (its own folder first on
    sys.path), from another directory, host "" and a count."""
    span = needs_room_outside()
    proc = subprocess.run(
        [sys.executable, str(PORTS_SCRIPT), "", "2"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    first = int(proc.stdout)
    assert all(_outside(p, span) and _bindable(p) for p in (first, first + 1))


def test_the_script_checks_the_host_it_is_given(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        busy = int(sock.getsockname()[1])
        calls: list[tuple[str, int]] = []

        def record(host: str, count: int) -> int:
            calls.append((host, count))
            return busy

        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(ports, "free_port", record)
            assert ports.main(["127.0.0.1", "3"]) == 0
            assert ports.main([]) == 0
    assert calls == [("127.0.0.1", 3), ("", 1)]
    assert capsys.readouterr().out.split() == [str(busy), str(busy)]
