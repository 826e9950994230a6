"""The budgets of one model round, in tokens: the output budget, the summary budget and the
margin kept free for counting errors (see :mod:`agentik.context`)."""

from __future__ import annotations

from dataclasses import dataclass

#: default output budget: this share of the window ...
OUTPUT_SHARE = 4
#: ... but at most this many tokens (a 1,024-token model gets 256; a 128k one 4,096)
OUTPUT_CAP = 4096
#: summary budget: this share of the window, at most SUMMARY_CAP tokens
SUMMARY_SHARE = 8
SUMMARY_CAP = 1024
#: after a compaction the kept old turns use at most this share of the room left for history,
#: so the next turns have space before the next compaction
KEEP_SHARE = 0.5

@dataclass(frozen=True)
class Budget:
    """The numbers one decision uses, all in tokens."""

    window: int
    #: the output budget of a round
    output: int
    #: kept free for counting errors
    margin: int
    #: the most tokens a summary may take
    summary: int

    @property
    def min_output(self) -> int:
        """A round is only worth sending with at least this much room to answer."""
        return min(self.output, max(16, self.window // 32))

    @property
    def prompt_room(self) -> int:
        """Tokens the prompt may use with the full output budget."""
        return self.window - self.margin - self.output


def output_budget(window: int | None, configured: int | None) -> int | None:
    """The output budget per round: ``configured`` (AGENTIK_MAX_OUTPUT_TOKENS /
    AGENTIK_LITERT_MAX_OUTPUT_TOKENS) if set, else a quarter of the window capped at OUTPUT_CAP;
    None when neither is known (the server's own default applies)."""
    if configured:
        return configured if not window else min(configured, window)
    if not window:
        return None
    return max(1, min(window // OUTPUT_SHARE, OUTPUT_CAP))


def summary_budget(window: int, configured: int | None = None) -> int:
    """The most tokens a compaction summary may take."""
    if configured:
        return min(configured, max(1, window // 2))
    return max(16, min(window // SUMMARY_SHARE, SUMMARY_CAP))


def margin_for(window: int, *, exact: bool) -> int:
    """Tokens kept free for counting errors: small with the engine's own tokenizer (template
    tokens it adds, e.g. BOS), larger for an estimate."""
    if exact:
        return max(8, window // 64)
    return max(32, window // 16)


def make_budget(
    window: int,
    *,
    exact: bool,
    output: int | None = None,
    summary: int | None = None,
) -> Budget:
    out = output_budget(window, output)
    assert out is not None
    return Budget(window=window, output=out, margin=margin_for(window, exact=exact),
                  summary=summary_budget(window, summary))
