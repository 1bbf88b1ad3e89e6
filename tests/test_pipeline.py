"""The one copy's binding (imgtool/pipeline): what moves is the destination's order less what it holds, checked
against what the source has, and a source is handed exactly that."""

from dataclasses import dataclass, field
from typing import List

import pytest

from imgtool.model import Digest
from imgtool.pipeline import Holding, Plan, Unheld, copy

A, B, C, D = (Digest.of(x) for x in (b"a", b"b", b"c", b"d"))


@dataclass(frozen=True)
class Data:
    note: str


@dataclass
class Source:
    blobs: frozenset
    what: str = "the source"
    started: List[Plan] = field(default_factory=list)
    read: List[Digest] = field(default_factory=list)

    def images(self):
        return []

    def has(self):
        return self.blobs

    def start(self, plan):
        self.started.append(plan)

    def chunks(self, digest, size, what):
        self.read.append(digest)
        yield b""

    def finish(self):
        return "stats"

    def cancel(self):
        pass


@dataclass
class Destination:
    order: tuple
    held: frozenset
    what: str = "the destination"
    checked: List[Plan] = field(default_factory=list)
    aborted: bool = False

    def plan(self, images):
        return Holding((), self.order, self.held, Data("mine"))

    def before(self, plan):
        self.checked.append(plan)

    def write(self, plan, source):
        for d in plan.moves:
            list(source.chunks(d, 0, "blob"))
        return plan.destination.note

    def abort(self):
        self.aborted = True


def test_only_what_the_destination_lacks_moves_in_its_order_and_its_own_data_comes_back():
    source, destination = Source(frozenset({A, B, C, D})), Destination((C, A, B, D), frozenset({A, D}))
    copied = copy(source, destination)
    assert copied.plan.moves == (C, B)
    assert source.started[0].moves == (C, B) and destination.checked[0].moves == (C, B)
    assert source.read == [C, B]
    assert copied.result == "mine" and copied.stats == "stats"


def test_a_destination_holding_everything_reads_nothing():
    source, destination = Source(frozenset({A, B})), Destination((A, B), frozenset({A, B}))
    copied = copy(source, destination)
    assert copied.plan.moves == () and source.read == []


def test_a_blob_neither_held_nor_in_the_source_is_refused_before_anything_moves():
    source, destination = Source(frozenset({A})), Destination((A, B), frozenset())
    with pytest.raises(Unheld) as e:
        copy(source, destination)
    assert e.value.message == (f"the source lacks 1 blob the destination needs and does not hold (first: {B}); "
                               "nothing was copied")
    assert e.value.exit_code == 1
    assert source.started == [] and destination.checked == [] and destination.aborted
