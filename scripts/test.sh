#!/usr/bin/env bash
# The one check developers and CI run: install, lint, type-check, test (on SQLite, then PostgreSQL).
set -euo pipefail
cd "$(dirname "$0")/.."
# Every extra: the suite tests the embedded engine (litert) and traces (otel) too.
python -m pip install -q --disable-pip-version-check -e '.[test,litert,otel]'
python -m ruff check agentik tests benchmarks
python -m mypy
python -m pytest "$@"
# The same suite again on PostgreSQL: the tests whose storage follows the engine (the runtime,
# web, A2A, client and reliability tests; tests/conftest.py picks them), each on a fresh schema.
AGENTIK_TEST_ENGINE=postgres python -m pytest "$@"
