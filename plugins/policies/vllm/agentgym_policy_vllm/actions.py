"""What both vLLM policies do around a sample: its parameters, the action constraint, the turn.

No vLLM import here: the `vllm_server` policy runs where vLLM is not installed.
"""

from __future__ import annotations

from collections.abc import Sequence

from agentgym_core.api import ActionConstraint, ChatFormat, Generation

NEUTRAL_SAMPLING = {
    "top_p": 1.0,
    "top_k": 0,
    "min_p": 0.0,
    "repetition_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
}
"""Every sampling parameter but temperature, pinned off in each request.

The learner scores a full softmax at the temperature; any other filter or
penalty samples another distribution. vLLM fills a parameter a request leaves
out from the checkpoint's `generation_config.json` (a real model's often sets
top_k and top_p), so none is left out. `top_k: 0` is vLLM 0.32's "off".
"""


class ActionTurns:
    """Builds each request's action constraint and turns sampled tokens into a `Generation`."""

    def __init__(self, chat: ChatFormat) -> None:
        self.chat = chat

    def constraint(self, allowed_actions: Sequence[str] | None) -> ActionConstraint | None:
        """The prefix matcher over the allowed actions' token sequences (None: free decoding)."""
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
        stopped: bool,
        sampler: str | None = None,
    ) -> Generation:
        """The turn, with the mask the sampler applied replayed per token.

        `stopped`: vLLM ended it on a stop token (finish reason "stop", not
        "length"). The turn is `finished` as the core's sampler decides: a
        constrained action once complete, free text when it ends on one of the
        chat's stop tokens; a turn cut at its length is not, and the rollout
        closes it. With `sampler` named, a token outside the mask is an error
        naming it (a server started without the action processor); in process
        it cannot happen.
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
            finished = constraint.complete
        else:
            finished = stopped and bool(tokens) and tokens[-1] in self.chat.stop_ids
        return Generation(
            token_ids=tokens,
            logprobs=[float(x) for x in logprobs],
            text=text if text is not None else self.chat.decode_action(tokens),
            allowed=allowed,
            finished=finished,
        )
