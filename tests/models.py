"""Where the tests and benchmarks find the test models (small LiteRT-LM model files that are not
in the repository): ``AGENTIK_TEST_MODELS``, else ``../shared/models`` beside the checkout.
Tests that need one are skipped without it, saying which file they looked for."""

from __future__ import annotations

import os
from pathlib import Path

#: the directory of the test models
MODELS = Path(os.environ.get("AGENTIK_TEST_MODELS")
              or Path(__file__).resolve().parents[2] / "shared" / "models")
#: a tiny model with random weights: fast, for the engine's plumbing (answers are gibberish)
TINY = MODELS / "tiny-random.litertlm"
#: a real small model (Gemma 3 270M, int4; a 1,024-token window): for real answers
REAL = MODELS / "gemma3-270m-int4.litertlm"
