"""The startup heap freeze: frozen objects leave the collector's passes, and a later engine's
start hands them back so a dropped engine's reference cycles are still freed."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from tessel.engine.gc_freeze import freeze_startup_heap, release_frozen_heap


class Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the collector frees it


@pytest.fixture(autouse=True)
def thawed() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_a_frozen_cycle_is_left_alone_until_released() -> None:
    node = Node()
    ref = weakref.ref(node)
    freeze_startup_heap()
    assert gc.get_freeze_count() > 0
    del node
    gc.collect()
    assert ref() is not None  # frozen: full collections no longer walk it
    release_frozen_heap()
    assert gc.get_freeze_count() == 0 and ref() is None


def test_objects_made_after_the_freeze_are_still_collected() -> None:
    freeze_startup_heap()
    node = Node()
    ref = weakref.ref(node)
    del node
    gc.collect()
    assert ref() is None


def test_the_switch_turns_it_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TESSEL_GC_FREEZE", "0")
    freeze_startup_heap()
    assert gc.get_freeze_count() == 0


def test_an_engine_freezes_and_the_next_one_frees_what_was_dropped() -> None:
    from tessel.engine import LLM

    node = Node()
    ref = weakref.ref(node)
    first = LLM(None, num_blocks=8)
    assert gc.get_freeze_count() > 0
    del node
    gc.collect()
    assert ref() is not None
    LLM(None, num_blocks=8)
    assert ref() is None
    first.shutdown()
