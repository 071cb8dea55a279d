"""What both vLLM policies do around a sample: the action constraint, and the turn it makes.

No vLLM import here: the `vllm_server` policy runs where vLLM is not installed.
"""

from __future__ import annotations

from collections.abc import Sequence

from agentgym_core.api import ActionConstraint, ChatFormat, Generation


class ActionTurns:
    """Builds each request's action constraint and turns sampled tokens into a `Generation`."""

    def __init__(self, chat: ChatFormat) -> None:
        self.chat = chat

    def constraint(self, allowed_actions: Sequence[str] | None) -> ActionConstraint | None:
        """The trie over the allowed actions' token sequences (None: free decoding)."""
        if allowed_actions is None:
            return None
        actions = list(dict.fromkeys(allowed_actions))
        return ActionConstraint(actions, [self.chat.action_tokens(a) for a in actions])

    def generation(
        self,
        tokens: Sequence[int],
        logprobs: Sequence[float],
        constraint: ActionConstraint | None,
        *,
        finished: bool,
        sampler: str | None = None,
    ) -> Generation:
        """The turn, with the mask the sampler applied replayed per token.

        With `sampler` named, a token outside the mask is an error naming it (a
        server started without the action processor); in process it cannot happen.
        """
        tokens = [int(t) for t in tokens]
        allowed: list[tuple[int, ...] | None] = [None] * len(tokens)
        text = None
        if constraint is not None:
            for index, token in enumerate(tokens):
                allowed[index] = constraint.allowed()
                if sampler is not None and token not in allowed[index]:
                    raise ValueError(
                        f"{sampler} sampled token {token} outside the allowed actions: start it "
                        "with --logits-processors agentgym_policy_vllm.logits:ActionTrieProcessor "
                        "(agentgym serve-policy does)"
                    )
                constraint.advance(token)
            if constraint.complete:
                text = constraint.matched_action()
        return Generation(
            token_ids=tokens,
            logprobs=[float(x) for x in logprobs],
            text=text if text is not None else self.chat.decode_action(tokens),
            allowed=allowed,
            finished=finished,
        )
