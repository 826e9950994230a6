#!/usr/bin/env bash
# The one check developers and CI run: install, lint, type-check, test.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install -q --disable-pip-version-check -e '.[test,litert]'
python -m ruff check agentik tests benchmarks
python -m mypy
python -m pytest "$@"
