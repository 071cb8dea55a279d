"""The `hf` policy's sampler: a request's tokens depend on its seed, not on its batch."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import torch

from agentgym_core.interfaces import SamplingParams
from agentgym_core.policies.constraints import ActionConstraint
from agentgym_core.policies.sampling import Request, Sampler

VOCAB = 12
STOP = 0


def _sampler() -> Sampler:
    chat = SimpleNamespace(stop_ids=[STOP], decode_action=lambda ids: " ".join(map(str, ids)))
    return Sampler(chat, pad_id=11, seed=0)  # type: ignore[arg-type]


def _request(seed: int, constraint: ActionConstraint | None = None, **params) -> Request:
    loop = asyncio.new_event_loop()
    try:
        future = loop.create_future()
    finally:
        loop.close()
    return Request([1, 2], SamplingParams(seed=seed, **params), constraint, future)


def _draw(sampler: Sampler, batch: list[Request], steps: int) -> None:
    generators = [sampler.generator(r.params) for r in batch]
    logits = torch.randn(steps, len(batch), VOCAB, generator=torch.Generator().manual_seed(5))
    for step in range(steps):
        sampler.sample(batch, logits[step], generators)


def test_a_request_samples_the_same_alone_or_beside_others():
    sampler = _sampler()
    alone = [_request(3, max_new_tokens=6)]
    batched = [_request(9, max_new_tokens=6), _request(3, max_new_tokens=6)]
    generators = [sampler.generator(r.params) for r in batched]
    row_logits = torch.randn(6, VOCAB, generator=torch.Generator().manual_seed(1))
    other = torch.randn(6, VOCAB, generator=torch.Generator().manual_seed(2))
    alone_generators = [sampler.generator(alone[0].params)]
    for step in range(6):
        sampler.sample(alone, row_logits[step : step + 1], alone_generators)
        sampler.sample(batched, torch.stack([other[step], row_logits[step]]), generators)
    assert alone[0].tokens == batched[1].tokens
    assert alone[0].logprobs == batched[1].logprobs


def test_constrained_requests_finish_on_an_allowed_action_and_answer_its_text():
    sampler = _sampler()
    constraint = ActionConstraint(["a", "b"], [(3, 4, STOP), (5, STOP)])
    request = _request(4, constraint, max_new_tokens=2)
    _draw(sampler, [request], steps=3)
    assert request.done and tuple(request.tokens) in constraint.sequences
    result = sampler.result(request)
    assert result.text in ("a", "b") and result.token_ids == request.tokens
    assert all(allowed is not None for allowed in result.allowed)


def test_greedy_takes_the_most_likely_token_and_stops_at_the_stop_id():
    sampler = _sampler()
    request = _request(0, greedy=True, max_new_tokens=5)
    logits = torch.zeros(1, VOCAB)
    logits[0, STOP] = 10.0
    sampler.sample([request], logits, [sampler.generator(request.params)])
    assert request.tokens == [STOP] and request.done
    assert sampler.result(request).finished
