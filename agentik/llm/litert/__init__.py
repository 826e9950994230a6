"""The embedded LiteRT-LM backend (docs/ARCHITECTURE.md "LLM backends", ``AGENTIK_LLM_BACKEND=litert``).

Only :mod:`agentik.llm.litert.engine` imports ``litert_lm`` (the optional extra:
``pip install -e '.[litert]'``, package ``litert-lm-api``), and only lazily, so the core works
without it. Every engine error is converted into the :class:`agentik.errors.LlmError` tree at the
boundary where it arises (load, create a conversation, a round).

Modules, from the bottom up:

- :mod:`~agentik.llm.litert.format` (pure): working memory as the engine's messages; the engine's
  streamed message dicts as deltas.
- :mod:`~agentik.llm.litert.round`: one generation in a worker thread. ``send_message_async`` (a
  *blocking* generator fed by a C++ thread) runs in a trio worker thread; each chunk is handed to
  the event loop with ``TrioToken.run_sync_soon`` over an unbounded memory channel, so the loop
  never blocks and the engine never waits for it. A cancelled round calls ``cancel_process()`` and
  waits until that thread has ended before the engine conversation is deleted.
- :mod:`~agentik.llm.litert.conversation`: :class:`LiteRtConversation` owns one engine
  conversation, kept across rounds so the engine reuses its KV cache. It also keeps the history in
  the engine's message format, so when its engine conversation must be dropped (a cancelled engine
  conversation only ever answers "CANCELLED" again, and one that failed is in an unknown state)
  the next round re-creates it seeded with that history.
- :mod:`~agentik.llm.litert.engine`: :class:`LiteRtLlm` owns the one ``litert_lm.Engine`` of the
  process. It is loaded once, lazily, by the first :meth:`LiteRtLlm.open` (or an explicit
  :meth:`LiteRtLlm.load`), in a worker thread. :meth:`LiteRtLlm.aclose` closes every conversation
  still open and only then the engine: an engine deleted under a live conversation segfaults the
  interpreter. A ``trio.CapacityLimiter`` (``max_concurrency``, default 1) is held for each round
  from the first prefill to the last token; excess rounds wait their turn. Measured on 2 cores,
  three concurrent rounds on one engine took longer than the same three in a row, hence the
  default.

Model formats: the tools are described to the engine only when the model file says it supports
function calling (``ModelInfo.llm.supports_function_calling()``); the engine never runs them
(``automatic_tool_calling=False``): its tool calls come out as :class:`~agentik.llm.base.ToolCallDelta` and go
through agentik's tool loop, results go back as ``tool_response`` parts. Images are dropped with
a warning: the engine is set up for text only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentik.llm.litert.conversation import LiteRtConversation
from agentik.llm.litert.engine import LiteRtLlm
from agentik.llm.litert.format import history_to_messages

__all__ = ["LiteRtConversation", "LiteRtLlm", "history_to_messages"]

if TYPE_CHECKING:  # static proof that the classes implement the backend protocol
    from agentik.llm.base import LiteConversation, LiteLlm

    def _implements(llm: LiteRtLlm, conv: LiteRtConversation) -> tuple[LiteLlm, LiteConversation]:
        return llm, conv
