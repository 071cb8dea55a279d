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
        to the host, not a [rows, vocab] block per step. Each row's noise is drawn from
        its own generator, so a seed's draws do not depend on the batch.
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
        params = [batch[row].params for row in live]
        picks = _choose(logprobs, live, params, allowed_by_row, generators)
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
        if request.constraint is not None:
            finished = request.constraint.complete
        else:
            finished = bool(request.tokens) and request.tokens[-1] in self.chat.stop_ids
        return Generation(
            token_ids=request.tokens,
            logprobs=request.logprobs,
            text=text,
            allowed=request.allowed,
            finished=finished,
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


def _choose(
    logprobs: torch.Tensor,
    live: list[int],
    params: list[SamplingParams],
    allowed_by_row: dict[int, tuple[int, ...]],
    generators: list[torch.Generator],
) -> torch.Tensor:
    """The id each live row takes: Gumbel-max over its candidates, or greedy.

    A row's candidates are the whole vocabulary, or its allowed ids in their order
    when constrained (noise drawn only over those; none for a forced id). Rows are
    scored and chosen in two blocks, the unconstrained and the constrained, so a step
    costs a few tensor ops plus one noise fill per row, not a handful of ops per row.
    """
    device = logprobs.device
    picks = torch.empty(len(live), dtype=torch.long, device=device)
    free = [k for k, row in enumerate(live) if row not in allowed_by_row]
    if free:
        rows = [live[k] for k in free]
        scores = logprobs[rows]
        counts = [scores.shape[1]] * len(rows)
        picks[free] = _gumbel_argmax(
            scores, counts, [params[k] for k in free], [generators[row] for row in rows]
        )
    limited = [k for k, row in enumerate(live) if row in allowed_by_row]
    if limited:
        rows = [live[k] for k in limited]
        allowed = [allowed_by_row[row] for row in rows]
        counts = [len(ids) for ids in allowed]
        width = max(counts)
        index = torch.tensor([[*ids, *ids[:1] * (width - len(ids))] for ids in allowed])
        index = index.to(device)
        scores = logprobs[rows].gather(1, index)
        padding = torch.arange(width, device=device) >= torch.tensor(counts, device=device)[:, None]
        scores.masked_fill_(padding, float("-inf"))
        sampled = [
            params[k] if count > 1 else SamplingParams(greedy=True)  # forced: draw no noise
            for k, count in zip(limited, counts, strict=True)
        ]
        best = _gumbel_argmax(scores, counts, sampled, [generators[row] for row in rows])
        picks[limited] = index.gather(1, best[:, None]).squeeze(1)
    return picks


def _gumbel_argmax(
    scores: torch.Tensor,
    counts: list[int],
    params: list[SamplingParams],
    generators: list[torch.Generator],
) -> torch.Tensor:
    """Each row's argmax of its scores plus Gumbel noise (none for a greedy row).

    Row k draws `counts[k]` uniforms from its generator, the draws a 1-D
    `torch.rand(counts[k])` would make. The block is as wide as a multiple of 64 so
    every row starts on a whole vector of the elementwise kernels, and its logs round
    as a row of its own would.
    """
    rows, width = scores.shape
    padded = -(-width // 64) * 64
    uniform = torch.full((rows, padded), 0.5, device=scores.device)
    draws = zip(counts, params, generators, strict=True)
    for row, (count, sampling, generator) in enumerate(draws):
        if not sampling.greedy:
            uniform[row, :count].uniform_(generator=generator)
    gumbel = torch.log(-torch.log(uniform.clamp_(1e-20, 1.0)))[:, :width]
    greedy = [row for row, sampling in enumerate(params) if sampling.greedy]
    if greedy:
        gumbel[greedy] = 0.0
    return torch.argmax(scores - gumbel, dim=1)
