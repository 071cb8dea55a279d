"""Sampling for the `hf` policy, shared by its static and continuous batching.

A `Request` is one episode's generation in progress. `Sampler` draws the next
token of every live request of a batch from the model's last logits:
temperature, then the constrained-decoding mask where a request is limited to
allowed actions, then greedy or Gumbel-max choice. Each request draws its
noise from its own generator, seeded by the request (`SamplingParams.seed`),
so its tokens do not depend on which other requests shared a step; that is
what lets the two batching modes give the same samples.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Hashable
from dataclasses import dataclass, field

import torch

from agentgym_core.interfaces import SamplingParams
from agentgym_core.policies.constraints import ActionConstraint, apply_allowed_mask
from agentgym_core.rollout.chat import ChatFormat
from agentgym_core.types import Generation


@dataclass
class Request:
    """One generation request and what has been sampled for it so far."""

    prompt: list[int]
    params: SamplingParams
    constraint: ActionConstraint | None
    future: asyncio.Future
    session: Hashable | None = None
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    allowed: list[tuple[int, ...] | None] = field(default_factory=list)
    done: bool = False
    loop: asyncio.AbstractEventLoop | None = None
    generator: torch.Generator | None = None
    fed: int = 0
    """Sampled tokens fed back to the model so far (continuous batching)."""


class Sampler:
    """Draws tokens for requests and turns a finished request into a `Generation`."""

    def __init__(self, chat: ChatFormat, pad_id: int, seed: int) -> None:
        self.chat = chat
        """Where the stop tokens and the action text come from."""
        self.pad_id = pad_id
        self._rng = random.Random(seed)

    def generator(
        self, params: SamplingParams, device: torch.device | str = "cpu"
    ) -> torch.Generator:
        """The noise source of one request, on the model's device.

        Its own seed, or the next of the sampler's seeds. A seed gives the same draws on
        one kind of device; a CUDA generator's stream differs from a CPU one's.
        """
        seed = params.seed if params.seed is not None else self._rng.getrandbits(63)
        return torch.Generator(device=device).manual_seed(seed)

    def sample(
        self, batch: list[Request], logits: torch.Tensor, generators: list[torch.Generator]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Sample one token per live row; returns the tokens and which rows sampled one.

        Runs where the logits are: on a GPU only the chosen ids and their log-probs cross
        to the host, not a [rows, vocab] block per step. Each row's noise is drawn and
        applied on its own, as before, so a seed's draws do not depend on the batch.
        """
        device = logits.device
        temps = torch.tensor([max(r.params.temperature, 1e-6) for r in batch], device=device)
        logits = logits / temps.unsqueeze(1)
        allowed_by_row = {
            row: r.constraint.allowed()
            for row, r in enumerate(batch)
            if r.constraint is not None and not r.done
        }
        rows = list(allowed_by_row)
        masked = apply_allowed_mask(logits, rows, [allowed_by_row[r] for r in rows])
        logprobs = torch.log_softmax(masked, dim=-1)
        live = [row for row, request in enumerate(batch) if not request.done]
        next_ids = torch.full((len(batch),), self.pad_id, dtype=torch.long, device=device)
        real = torch.zeros(len(batch), dtype=torch.long, device=device)
        if not live:
            return next_ids, real
        picks = torch.stack(
            [
                _pick(logprobs[row], allowed_by_row.get(row), batch[row].params, generators[row])
                for row in live
            ]
        )
        live_rows = torch.tensor(live, device=device)
        next_ids[live_rows], real[live_rows] = picks, 1
        chosen = logprobs[live_rows, picks]
        for row, token, logprob in zip(live, picks.tolist(), chosen.tolist(), strict=True):
            self._record(batch[row], token, logprob, allowed_by_row.get(row))
        return next_ids, real

    def result(self, request: Request) -> Generation:
        """What the policy answers for a finished request."""
        if request.constraint is not None and request.constraint.complete:
            text = request.constraint.matched_action()
        else:
            text = self.chat.decode_action(request.tokens)
        return Generation(
            token_ids=request.tokens,
            logprobs=request.logprobs,
            text=text,
            allowed=request.allowed,
            finished=request.done,
        )

    def _record(
        self, request: Request, token: int, logprob: float, allowed: tuple[int, ...] | None
    ) -> None:
        """Append a sampled token; a constrained action whose rest is forced is completed at once.

        A forced token is the only one allowed, so its constrained log-prob is
        exactly 0 for the sampler and the learner alike: no forward pass needed.
        """
        request.tokens.append(token)
        request.logprobs.append(logprob)
        request.allowed.append(allowed)
        if request.constraint is None:
            request.done = token in self.chat.stop_ids
        else:
            request.constraint.advance(token)
            for forced in request.constraint.forced_tail():
                request.constraint.advance(forced)
                request.tokens.append(forced)
                request.logprobs.append(0.0)
                request.allowed.append((forced,))
            request.done = request.constraint.complete
        if len(request.tokens) >= request.params.max_new_tokens:
            request.done = True


def _pick(
    logprobs: torch.Tensor,
    allowed: tuple[int, ...] | None,
    params: SamplingParams,
    generator: torch.Generator,
) -> torch.Tensor:
    """Greedy or Gumbel-max choice, drawing noise only over the allowed ids when constrained.

    A 0-d id tensor on the logits' device: reading it would wait for the device per row.
    """
    device = logprobs.device
    if allowed is not None and len(allowed) == 1:
        return torch.tensor(allowed[0], device=device)
    candidates = torch.tensor(allowed, device=device) if allowed is not None else None
    scores = logprobs if candidates is None else logprobs[candidates]
    if not params.greedy:
        uniform = torch.rand(scores.shape, generator=generator, device=device).clamp_(1e-20, 1.0)
        scores = scores - torch.log(-torch.log(uniform))
    best = torch.argmax(scores)
    return best if candidates is None else candidates[best]
