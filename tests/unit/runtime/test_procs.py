"""``procs.EarlySlot``: a server started early, claimed once by a later owner, stopped if replaced or unclaimed."""

from __future__ import annotations

from nemo_gym_adapter.runtime.procs import EarlySlot


class FakeServer:
    """A fake server: only counts its stops."""

    def __init__(self) -> None:
        self.stops = 0

    def stop(self) -> None:
        self.stops += 1


def test_a_parked_server_is_claimed_once_and_then_its_owners():
    slot: EarlySlot[FakeServer] = EarlySlot()
    server = FakeServer()
    slot.park(server)
    assert slot.peek() is server and slot.claim() is server and slot.claim() is None
    slot.drop(server)  # claimed: dropping it no longer stops it
    assert server.stops == 0


def test_an_unclaimed_server_is_stopped_when_dropped_and_another_ones_drop_leaves_it():
    slot: EarlySlot[FakeServer] = EarlySlot()
    server, other = FakeServer(), FakeServer()
    slot.park(server)
    slot.drop(other)
    slot.drop(None)
    assert server.stops == 0 and slot.peek() is server
    slot.drop(server)
    assert server.stops == 1 and slot.claim() is None


def test_parking_a_new_server_stops_the_one_before_but_not_itself():
    slot: EarlySlot[FakeServer] = EarlySlot()
    first, second = FakeServer(), FakeServer()
    slot.park(first)
    slot.park(first)
    assert first.stops == 0
    slot.park(second)
    assert first.stops == 1 and second.stops == 0 and slot.claim() is second


def test_waiting_for_a_server_reads_a_non_http_answer_as_not_ready_yet(tmp_path):
    """Before a server binds a port in the ephemeral range, a probe can connect to itself and read its own request
    back (BadStatusLine): that is "not up yet", not an error of the wait. Here the first connection is echoed, the
    second answered 200."""
    from nemo_gym_adapter.runtime.procs import ManagedProcess
    from tests.support.raw_http import ECHO, replying_server

    port, t = replying_server([ECHO, b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"])
    proc = ManagedProcess("sleeper", ["sleep", "30"], tmp_path / "sleeper.log")
    try:
        url = f"http://127.0.0.1:{port}/health"
        assert proc.wait_http_ready(url, timeout=20, interval=0.05) < 20
    finally:
        proc.stop()
    t.join(5)
    assert not t.is_alive()  # both connections were made: the echo did not end the wait
