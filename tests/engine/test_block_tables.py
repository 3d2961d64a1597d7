"""The block-table array mirror: rows appended in place, grown, zeroed and reused."""

from __future__ import annotations

from tessel.engine.kv_cache.block_tables import BlockTables


def test_rows_grow_in_place_and_past_the_initial_shape() -> None:
    tables = BlockTables(rows=2, cols=2)
    tables.append("a", 0, [5, 6])
    tables.append("a", 2, [7])  # past the columns: the array widens
    for i in range(3):  # past the rows: the array deepens
        tables.append(f"r{i}", 0, [10 + i])
    assert tables.array[tables.row("a"), :3].tolist() == [5, 6, 7]
    assert [tables.array[tables.row(f"r{i}"), 0] for i in range(3)] == [10, 11, 12]
    assert len({tables.row(k) for k in ("a", "r0", "r1", "r2")}) == 4
    assert not tables.array[tables.row("r2"), 1:].any()


def test_a_released_row_is_zeroed_before_reuse() -> None:
    tables = BlockTables(rows=1, cols=4)
    tables.append("a", 0, [1, 2, 3, 4])
    row = tables.row("a")
    tables.release("a", 4)
    tables.release("a", 4)  # idempotent
    tables.append("b", 0, [9])
    assert tables.row("b") == row
    assert tables.array[row].tolist() == [9, 0, 0, 0]
