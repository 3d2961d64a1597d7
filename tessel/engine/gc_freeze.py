"""Keep the cyclic garbage collector's full passes off the engine loop.

A loaded engine holds a few hundred thousand Python objects that live as long as it does
(modules, the tokenizer, compiled kernels, graphs). Every step allocates requests' deltas fast
enough to trigger collections, and a full (generation 2) one walks all of them: ~90 ms on the
dev CPU, a stall inside a decode step (``benchmarks/gc_pause.py``). Freezing them once the engine
is built takes them out of every later pass, as vLLM and SGLang do; reference counting still
frees whatever is dropped. ``TESSEL_GC_FREEZE=0`` turns it off.
"""

from __future__ import annotations

import gc
import os


def enabled() -> bool:
    return os.environ.get("TESSEL_GC_FREEZE", "1") != "0"


def freeze_startup_heap() -> None:
    """Collect once, then freeze everything alive: call when an engine (or a server around
    one) has finished starting."""
    if enabled():
        gc.collect()
        gc.freeze()


def release_frozen_heap() -> None:
    """Hand what an earlier engine froze back to the collector and collect it, so a dropped
    engine's reference cycles (and the device memory they hold) are gone before a new one
    sizes its KV cache from free memory."""
    if gc.get_freeze_count():
        gc.unfreeze()
        gc.collect()
