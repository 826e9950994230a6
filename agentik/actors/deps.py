"""``Deps``: what every actor needs, built once by ``agentik.runtime.open_runtime``.

Plain data: the actors take from it, nobody patches into it. The registry's part of an actor's
life (passivation, forgetting) reaches the actor through ``ConversationHandle.keeper`` instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from agentik.config import Config
from agentik.llm.base import LiteLlm, ModelHealth
from agentik.storage.actor import Storage
from agentik.tools.base import ToolRegistry


@dataclass(frozen=True)
class Deps:
    config: Config
    storage: Storage
    llm: LiteLlm
    tools: ToolRegistry
    #: whether the model's server answers (the runtime asks it now and then: /readyz)
    model: ModelHealth = field(default_factory=ModelHealth)
