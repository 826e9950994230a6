"""The commit statement's typed row arrays (``pg.arrays``) reach PostgreSQL as the values they
hold: every element type, NULLs, empty arrays, non-ASCII text, extreme integers."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from agentik.storage.pg.arrays import Bools, Byteas, Float8s, Int8s, Texts

CASES: list[tuple[Any, str]] = [
    (Int8s([0, 1, -1, 2**63 - 1, -(2**63), 7]), "bigint[]"),
    (Int8s([3, 4]), "int[]"),
    (Float8s([0.0, -1.5, 1e300, 1]), "float8[]"),
    (Bools([True, False, True]), "boolean[]"),
    (Texts(["a", "", "ünïcødé ✓", None, "x" * 5000]), "text[]"),
    (Texts([None, None]), "text[]"),
    (Texts(["a", "b", None]), "text[]"),
    (Texts(["aa", "b", None, "c"]), "text[]"),
    (Byteas([b"1", None]), "bytea[]"),
    (Byteas([b"1", b"22", None]), "bytea[]"),
    (Byteas([b"", b"\x00\xff" * 300, b"abc"]), "bytea[]"),
    # the C-level paths of a column with no NULL: one value repeated, values of one length,
    # values of several lengths (same characters, other bytes: "ü" is two)
    (Texts(["c"] * 5), "text[]"),
    (Texts(["ü"] * 3), "text[]"),
    (Byteas([b"xy"] * 4), "bytea[]"),
    (Texts(["ab", "cd", "ef", "ab"]), "text[]"),
    (Texts(["ab", "üb", "ab"]), "text[]"),
    (Byteas([b"12", b"34"]), "bytea[]"),
    (Int8s([5]), "bigint[]"),
    (Int8s([]), "bigint[]"),
    (Texts([]), "text[]"),
    (Byteas([]), "bytea[]"),
]


@pytest.mark.parametrize(("value", "cast"), CASES, ids=[f"{c}-{len(v)}" for v, c in CASES])
def test_a_typed_array_arrives_as_the_values_it_holds(pg_url: str, value: Any, cast: str) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        row = conn.execute(f"SELECT %(x)b::{cast}", {"x": value}).fetchone()  # type: ignore[arg-type]
    assert row is not None
    assert row[0] == list(value)
