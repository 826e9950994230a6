"""How a test's trio run ends (tests/trio_runs.py), on a small suite run by pytest in a
subprocess: a trio test that hangs fails with "Timeout" in about its limit and the tests after it
still run on a clean trio loop; a hanging sync test fails through pytest-timeout's own handler; a
test marked slow gets conftest's SLOW_TIMEOUT; a skip inside trio keeps its reason."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

SUITE = '''
import time

import pytest
import trio


async def test_hangs_in_trio() -> None:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.sleep_forever)
        await trio.sleep_forever()


async def test_after_it() -> None:
    await trio.sleep(0.01)


def test_hangs_in_sync_code() -> None:
    time.sleep(60)


async def test_skips_inside_trio() -> None:
    await trio.sleep(0)
    pytest.skip("the reason it skips")


@pytest.mark.slow
def test_slow_gets_its_limit(request: pytest.FixtureRequest) -> None:
    assert request.node.get_closest_marker("timeout").args == (SLOW_TIMEOUT,)
'''


def test_a_hanging_test_fails_at_its_limit_and_the_next_runs(tmp_path: Path) -> None:
    (tmp_path / "pytest.ini").write_text(
        "[pytest]\ntrio_mode = true\ntimeout = 2\nmarkers =\n    slow: slow\n")
    (tmp_path / "conftest.py").write_text(
        "from tests.conftest import SLOW_TIMEOUT, pytest_collection_modifyitems  # noqa: F401\n"
        "pytest_plugins = ['tests.trio_runs']\n")
    (tmp_path / "test_suite.py").write_text(
        "from tests.conftest import SLOW_TIMEOUT\n" + SUITE)
    start = time.monotonic()
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rfs", "--tb=line", str(tmp_path)],
        cwd=tmp_path, capture_output=True, text=True, timeout=50, check=False,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )
    elapsed = time.monotonic() - start
    out = run.stdout + run.stderr
    assert "2 failed, 2 passed, 1 skipped" in out, out
    assert ": the reason it skips" in out, out  # pytest-trio 0.8 dropped it
    assert "FAILED test_suite.py::test_hangs_in_trio - Failed: Timeout (>2s)" in out, out
    assert "FAILED test_suite.py::test_hangs_in_sync_code - Failed: Timeout (>2" in out, out
    assert "inside a run" not in out and "must be called from async context" not in out, out
    assert elapsed < 30, elapsed
