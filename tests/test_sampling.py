"""The `hf` policy's sampler: a request's tokens depend on its seed, not on its batch."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
import torch
from devices import DEVICES

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


@pytest.mark.parametrize("device", DEVICES)
def test_a_request_samples_the_same_alone_or_beside_others(device):
    sampler = _sampler()
    alone = [_request(3, max_new_tokens=6)]
    batched = [_request(9, max_new_tokens=6), _request(3, max_new_tokens=6)]
    generators = [sampler.generator(r.params, device) for r in batched]
    row_logits = torch.randn(6, VOCAB, generator=torch.Generator().manual_seed(1)).to(device)
    other = torch.randn(6, VOCAB, generator=torch.Generator().manual_seed(2)).to(device)
    alone_generators = [sampler.generator(alone[0].params, device)]
    for step in range(6):
        sampler.sample(alone, row_logits[step : step + 1], alone_generators)
        next_ids, real = sampler.sample(
            batched, torch.stack([other[step], row_logits[step]]), generators
        )
        assert next_ids.device.type == real.device.type == torch.device(device).type
    assert alone[0].tokens == batched[1].tokens
    assert alone[0].logprobs == batched[1].logprobs


def test_mixed_requests_sample_in_one_batch_as_each_does_alone():
    """Free, greedy and constrained rows (2, 3 and 1 candidates: a forced token draws no
    noise) are chosen in blocks; each row's tokens and log-probs equal its own run."""

    def requests() -> list[Request]:
        two = ActionConstraint(["a", "b"], [(3, 4, STOP), (5, STOP)])
        three = ActionConstraint(["a", "b", "c"], [(3, STOP), (6, 7, STOP), (8, STOP)])
        forced = ActionConstraint(["a"], [(9, 10, STOP)])
        return [
            _request(1, max_new_tokens=4),
            _request(2, two, max_new_tokens=4),
            _request(3, greedy=True, max_new_tokens=4),
            _request(4, three, max_new_tokens=4),
            _request(5, forced, max_new_tokens=4),
            _request(6, max_new_tokens=4, temperature=1.5),
        ]

    sampler = _sampler()
    logits = torch.randn(4, 6, VOCAB, generator=torch.Generator().manual_seed(11))
    batch = requests()
    generators = [sampler.generator(r.params) for r in batch]
    for step in range(4):
        sampler.sample(batch, logits[step], generators)
    for row, alone in enumerate(requests()):
        generator = [sampler.generator(alone.params)]
        for step in range(4):
            sampler.sample([alone], logits[step, row : row + 1], generator)
        assert (alone.tokens, alone.logprobs) == (batch[row].tokens, batch[row].logprobs), row
    assert batch[4].tokens == [9, 10, STOP] and batch[4].logprobs[1:] == [0.0, 0.0]
    assert len({tuple(r.tokens) for r in batch}) > 3  # the rows did not all draw alike


def _row_by_row(logprobs, allowed, params, generator):
    """The choice as the sampler once made it, one row at a time (the reference)."""
    if allowed is not None and len(allowed) == 1:
        return allowed[0]
    candidates = list(allowed) if allowed is not None else list(range(logprobs.shape[0]))
    scores = logprobs[candidates]
    if not params.greedy:
        uniform = torch.rand(scores.shape, generator=generator).clamp_(1e-20, 1.0)
        scores = scores - torch.log(-torch.log(uniform))
    return candidates[int(torch.argmax(scores))]


def test_block_choice_equals_row_by_row_choice_on_random_batches():
    """Ids and generators' states after: the same as choosing each row on its own, for free,
    greedy, constrained and forced rows, vocabularies not a multiple of the block width."""
    import random

    from agentgym_core.policies.sampling import _choose

    rng = random.Random(0)
    for _ in range(100):
        vocab, rows = rng.choice([50, 97, 768]), rng.randint(1, 24)
        logprobs = torch.log_softmax(torch.randn(rows, vocab) * rng.choice([0.1, 1.0, 5.0]), -1)
        params = [
            SamplingParams(greedy=rng.random() < 0.2, seed=rng.getrandbits(32)) for _ in range(rows)
        ]
        allowed = {
            row: tuple(rng.sample(range(vocab), rng.randint(1, 20)))
            for row in range(rows)
            if rng.random() < 0.3
        }
        live = sorted(rng.sample(range(rows), rng.randint(1, rows)))
        one = [torch.Generator().manual_seed(p.seed) for p in params]
        block = [torch.Generator().manual_seed(p.seed) for p in params]
        expected = [_row_by_row(logprobs[r], allowed.get(r), params[r], one[r]) for r in live]
        chosen = _choose(logprobs, live, [params[r] for r in live], allowed, block)
        assert chosen.tolist() == expected
        assert all(
            torch.equal(a.get_state(), b.get_state()) for a, b in zip(one, block, strict=True)
        )


def test_each_draw_is_the_gumbel_max_of_its_own_generator_over_its_allowed_ids():
    """Worked per row as the sampler promises: log-softmax of logits / temperature, masked
    to the allowed ids; the argmax of log-prob + Gumbel noise drawn from the request's
    generator over its candidates (all ids, or the allowed ones); greedy takes the argmax."""
    sampler = _sampler()
    constraint = ActionConstraint(["a", "b"], [(3, 4, STOP), (5, STOP)])
    batch = [
        _request(7, max_new_tokens=1, temperature=0.7),
        _request(8, constraint, max_new_tokens=3),
        _request(9, greedy=True, max_new_tokens=1),
        _request(10, max_new_tokens=1),
    ]
    batch[3].done = True
    logits = torch.randn(4, VOCAB, generator=torch.Generator().manual_seed(3))
    next_ids, real = sampler.sample(batch, logits, [sampler.generator(r.params) for r in batch])

    expected = []
    for row, (temperature, candidates, greedy) in enumerate(
        [(0.7, list(range(VOCAB)), False), (1.0, [3, 5], False), (1.0, list(range(VOCAB)), True)]
    ):
        scaled = logits[row] / temperature
        masked = torch.full_like(scaled, float("-inf"))
        masked[candidates] = scaled[candidates]
        logprobs = torch.log_softmax(masked, dim=-1)[candidates]
        if not greedy:
            noise = torch.rand(len(candidates), generator=torch.Generator().manual_seed(7 + row))
            logprobs = logprobs - torch.log(-torch.log(noise.clamp(1e-20, 1.0)))
        expected.append(candidates[int(torch.argmax(logprobs))])
    assert [r.tokens[0] for r in batch[:3]] == expected
    assert next_ids.tolist()[:3] == expected and real.tolist() == [1, 1, 1, 0]
    assert next_ids[3] == sampler.pad_id and batch[3].tokens == []
    first_logprob = torch.log_softmax(logits[0] / 0.7, dim=-1)[expected[0]]
    assert batch[0].logprobs == [float(first_logprob)]


def test_constrained_requests_finish_on_an_allowed_action_and_answer_its_text():
    sampler = _sampler()
    constraint = ActionConstraint(["a", "b"], [(3, 4, STOP), (5, STOP)])
    request = _request(4, constraint, max_new_tokens=2)
    _draw(sampler, [request], steps=3)
    assert request.done and tuple(request.tokens) in constraint.sequences
    result = sampler.result(request)
    assert result.text in ("a", "b") and result.token_ids == request.tokens
    assert all(allowed is not None for allowed in result.allowed)


@pytest.mark.parametrize("device", DEVICES)
def test_greedy_takes_the_most_likely_token_and_stops_at_the_stop_id(device):
    sampler = _sampler()
    request = _request(0, greedy=True, max_new_tokens=5)
    logits = torch.zeros(1, VOCAB, device=device)
    logits[0, STOP] = 10.0
    sampler.sample([request], logits, [sampler.generator(request.params, device)])
    assert request.tokens == [STOP] and request.done
    assert sampler.result(request).finished
