"""Constrained action decoding inside vLLM: the core's allowed-token mask, as a logits processor.

vLLM's own structured outputs (`choice`) accept every tokenization of an
allowed string, and they do not report which tokens were allowed at each
step. The learner renormalizes over exactly the set the sampler allowed (the
canonical token sequences of the actions, see `agentgym_core.policies.constraints`),
so the importance ratio is only exact when the sampler used that same set.
This processor applies it: at each step, every token that does not continue
the generated prefix along some allowed sequence gets -inf. vLLM applies it
before temperature, which leaves the same support as the learner's
mask-after-temperature, and returns log-probabilities after it
(`logprobs_mode="processed_logprobs"`).

The allowed sequences travel with each request in `SamplingParams.extra_args`:
lists of ints in process, strings of ids through a server's `vllm_xargs`
(`vllm_server` policy), which accept no nested lists.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import AdapterLogitsProcessor

from agentgym_core.api import ActionConstraint
from agentgym_policy_vllm.xargs import EXTRA_ARG, decode_sequences

RowProcessor = Callable[[list[int], torch.Tensor], torch.Tensor]
"""vLLM's per-request form: (output token ids so far, this request's logits row) -> logits."""


def trie_mask(sequences: Sequence[Sequence[int]]) -> RowProcessor:
    """A per-request processor: keep only the tokens that continue `output_ids` on a sequence."""
    constraint = ActionConstraint([str(i) for i in range(len(sequences))], sequences)

    def apply(output_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
        constraint.prefix = list(output_ids)
        allowed = constraint.allowed()
        if not allowed:  # off every sequence: cannot happen while the mask holds; leave it be
            return logits
        keep = torch.as_tensor(allowed, device=logits.device)
        masked = torch.full_like(logits, float("-inf"))
        masked[keep] = logits[keep]
        return masked

    return apply


class ActionTrieProcessor(AdapterLogitsProcessor):
    """Applies `trie_mask` to the rows of requests that carry allowed sequences."""

    def is_argmax_invariant(self) -> bool:
        """It changes the greedy choice, so vLLM must apply it for greedy requests too."""
        return False

    def new_req_logits_processor(self, params: SamplingParams) -> RowProcessor | None:
        """The request's mask, or None when its decoding is free."""
        sequences = (params.extra_args or {}).get(EXTRA_ARG)
        return trie_mask(decode_sequences(sequences)) if sequences else None
