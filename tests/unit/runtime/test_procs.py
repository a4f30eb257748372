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
