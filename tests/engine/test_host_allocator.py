"""The CPU engine's glibc malloc settings: applied, and what they are for actually happens."""

from __future__ import annotations

import platform

import pytest

from tessel.engine.runner.host_allocator import keep_step_buffers_in_heap


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_settings_apply_and_are_idempotent() -> None:
    assert keep_step_buffers_in_heap()
    assert keep_step_buffers_in_heap()
