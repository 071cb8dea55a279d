"""The output head in chunks of agent tokens (`trainer.logprob_chunk_tokens`).

Chunked, the learner's forward pass gives the log-probabilities, entropies and
gradients of the plain one (all agent tokens at once) up to float rounding,
with LoRA, shared prompts, constraints, a head with a bias, tied embeddings
and bf16; and it keeps far less for the backward pass.
"""

from __future__ import annotations

import random

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import (
    Gemma2Config,
    Gemma2ForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    PhiConfig,
    PhiForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from agentgym_core.learner.forward import policy_forward
from agentgym_core.learner.packing import pack
from agentgym_core.types import Trajectory

VOCAB = 512
SHAPE = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)


def qwen2_tied(vocab: int = VOCAB, **shape) -> Qwen2ForCausalLM:
    """Qwen2.5's layout: the output head is the input embedding."""
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=vocab, num_key_value_heads=2, tie_word_embeddings=True)
    config.update({**SHAPE, **shape})
    return Qwen2ForCausalLM(config)


def llama_untied() -> LlamaForCausalLM:
    torch.manual_seed(1)
    return LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, tie_word_embeddings=False, **SHAPE))


def phi_with_head_bias() -> PhiForCausalLM:
    torch.manual_seed(2)
    model = PhiForCausalLM(PhiConfig(vocab_size=VOCAB, **SHAPE))
    assert model.lm_head.bias is not None
    torch.nn.init.normal_(model.lm_head.bias, std=0.5)  # a bias that changes the values
    return model


MODELS = {"qwen2-tied": qwen2_tied, "llama": llama_untied, "phi-bias": phi_with_head_bias}


def _trajectory(rng: random.Random, vocab: int, prompt: list[int], turns: list[int]) -> Trajectory:
    """`prompt`, then agent turns of the given lengths with 3 env tokens after each."""
    ids, mask = list(prompt), [0] * len(prompt)
    for length in turns:
        ids += [rng.randrange(3, vocab) for _ in range(length + 3)]
        mask += [1] * length + [0] * 3
    traj = Trajectory(task_id=0, group=0, token_ids=ids, loss_mask=mask, logprobs=[0.0] * len(ids))
    first_action = len(prompt)  # the sampler chose among few ids there, the target among them
    traj.constraints[first_action] = tuple(sorted({ids[first_action], 3, 4, 5}))
    return traj


def trajectories(vocab: int = VOCAB, *, shared_prompt: bool = False) -> list[Trajectory]:
    rng = random.Random(4)
    prompt = [rng.randrange(3, vocab) for _ in range(30 if shared_prompt else 9)]
    turns = [[5, 4], [7], [3, 3, 2], [6, 2]]
    return [
        _trajectory(rng, vocab, prompt if shared_prompt else prompt[: 4 + i], t)
        for i, t in enumerate(turns)
    ]


def packed(vocab: int = VOCAB, **shape):
    (mb,) = pack(trajectories(vocab), row_tokens=None, micro_batch_tokens=1 << 20, **shape)
    return mb


def run(model, mb, chunk, *, hidden=False, entropy_grad=True):
    """Log-probs, entropy (and hidden state), and the gradients of a loss on them."""
    model.zero_grad()
    logprobs, entropy, last = policy_forward(
        model, mb, 0.7, chunk_tokens=chunk, hidden=hidden, entropy_grad=entropy_grad
    )
    weights = torch.linspace(-1, 1, mb.mask.numel()).view(mb.mask.shape)  # advantage-like
    loss = (weights * logprobs).sum()
    if entropy.requires_grad:
        loss = loss + 0.3 * entropy.sum()
    if last is not None:
        loss = loss + 0.01 * last.float().pow(2).sum()  # a value head's share
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    return logprobs.detach(), entropy.detach(), last, grads


def assert_same(plain, chunked, atol=1e-5, grad_rtol=0.0):
    """Values within `atol`; gradients within `atol` plus `grad_rtol` of their largest entry."""
    assert (plain[0] != 0).any()
    assert torch.allclose(chunked[0], plain[0], atol=atol), (chunked[0] - plain[0]).abs().max()
    assert torch.allclose(chunked[1], plain[1], atol=atol), (chunked[1] - plain[1]).abs().max()
    assert sorted(chunked[3]) == sorted(plain[3]) and plain[3]
    for name, grad in plain[3].items():
        difference = (chunked[3][name].float() - grad.float()).abs().max()
        assert difference <= atol + grad_rtol * grad.float().abs().max(), (name, float(difference))


def test_the_batch_has_what_the_chunks_must_handle():
    mb = packed()
    tokens = int(mb.mask.sum())
    assert tokens == 32 and tokens % 8 == 0 and tokens % 7 != 0  # chunks of 8 divide, of 7 not
    assert len(mb.constrained_at) == 4 and len(mb.input_ids) > 1


@pytest.mark.parametrize("architecture", sorted(MODELS))
@pytest.mark.parametrize("chunk", [1, 7, 8, 1000])
def test_chunks_give_the_plain_values_and_gradients(architecture, chunk):
    model = MODELS[architecture]()
    mb = packed()
    plain = run(model, mb, None)
    assert_same(plain, run(model, mb, chunk))


def test_constrained_positions_keep_their_allowed_ids():
    model, mb = qwen2_tied(), packed()
    logprobs, entropy, _, _ = run(model, mb, 3)
    for (row, column), ids in zip(mb.constrained_at, mb.constrained_ids, strict=True):
        # four allowed ids: log 4 bounds the entropy, and the target's log-prob is above log 1/50
        assert 0 < entropy[row, column] <= torch.log(torch.tensor(float(len(ids)))) + 1e-6
        assert logprobs[row, column] > -4


def test_shared_prompts_in_chunks():
    model = qwen2_tied()
    batches = pack(
        trajectories(shared_prompt=True),
        row_tokens=None,
        micro_batch_tokens=1 << 20,
        share_rows=False,
        share_prompts=True,
    )
    (mb,) = batches
    assert mb.prefixes is not None
    assert_same(run(model, mb, None), run(model, mb, 5))


def test_the_hidden_state_and_an_entropy_without_gradient():
    model, mb = llama_untied(), packed()
    plain = run(model, mb, None, hidden=True, entropy_grad=False)
    chunked = run(model, mb, 6, hidden=True, entropy_grad=False)
    assert torch.equal(plain[2], chunked[2])  # the value head reads the same states
    assert_same(plain, chunked)
    _, entropy, _ = policy_forward(model, mb, 1.0, chunk_tokens=6, entropy_grad=False)
    logprobs, with_grad, _ = policy_forward(model, mb, 1.0, chunk_tokens=6)
    assert not entropy.requires_grad and with_grad.requires_grad and logprobs.requires_grad


def test_lora_including_a_lora_output_head():
    peft = pytest.importorskip("peft")
    config = peft.LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "lm_head"], init_lora_weights=False
    )
    model = peft.get_peft_model(llama_untied(), config)
    assert type(model.get_base_model().get_output_embeddings()).__module__.startswith("peft")
    mb = packed()
    plain = run(model, mb, None)
    assert any("lm_head.lora_B" in name for name in plain[3])  # the head's adapter trains
    assert all("lora_" in name for name in plain[3])  # and nothing but adapters
    assert_same(plain, run(model, mb, 5))


def test_bf16_weights_and_bf16_autocast():
    """The values match; bf16 gradients of the head sum the chunks' parts, rounding each."""
    mb = packed()
    model = qwen2_tied().to(torch.bfloat16)
    assert_same(run(model, mb, None), run(model, mb, 4), grad_rtol=2**-6)
    model = qwen2_tied()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        plain, chunked = run(model, mb, None), run(model, mb, 4)
    assert_same(plain, chunked, grad_rtol=2**-6)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert policy_forward(model, mb, 1.0, chunk_tokens=4)[0].dtype == torch.float32


def test_no_grad_scoring_in_chunks():
    model, mb = qwen2_tied(), packed()
    with torch.no_grad():
        plain, _, _ = policy_forward(model, mb, 1.0)
        chunked, _, _ = policy_forward(model, mb, 1.0, chunk_tokens=5)
    assert torch.allclose(plain, chunked, atol=1e-5)


def test_a_model_without_a_plain_output_head_is_refused():
    torch.manual_seed(0)
    config = Gemma2Config(vocab_size=VOCAB, head_dim=8, num_key_value_heads=2, **SHAPE)
    assert config.final_logit_softcapping is not None
    model = Gemma2ForCausalLM(config)
    with pytest.raises(ValueError, match="final_logit_softcapping.*logprob_chunk_tokens null"):
        policy_forward(model, packed(), 1.0, chunk_tokens=4)

    class NoHead(torch.nn.Module):  # a wrapper that hides the model's output head
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, **kwargs):
            return self.inner(**kwargs)

    wrapped = NoHead(qwen2_tied())
    policy_forward(wrapped, packed(), 1.0)  # the plain path needs no head of its own
    with pytest.raises(ValueError, match="NoHead has no output head"):
        policy_forward(wrapped, packed(), 1.0, chunk_tokens=4)


# -- memory: what the backward pass keeps, and the largest tensor made ---------------------


class LargestTensor(TorchDispatchMode):
    """The most elements of any tensor an op made while open (forward and backward)."""

    def __init__(self) -> None:
        super().__init__()
        self.numel = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for value in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(value, torch.Tensor):
                self.numel = max(self.numel, value.numel())
        return out


def _memory(model, mb, chunk) -> tuple[int, int]:
    """(bytes autograd keeps for the backward pass, largest tensor made in forward and backward).

    Kept: every distinct storage a saved-tensor hook sees that is not a weight. A
    chunk's checkpoint keeps only its inputs, so its logits never reach the hook.
    """
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    kept: dict[int, int] = {}

    def pack_hook(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in weights:
            kept[storage.data_ptr()] = storage.nbytes()
        return tensor

    largest = LargestTensor()
    with largest:
        with torch.autograd.graph.saved_tensors_hooks(pack_hook, lambda tensor: tensor):
            logprobs, entropy, _ = policy_forward(model, mb, 1.0, chunk_tokens=chunk)
        (logprobs.sum() + entropy.sum()).backward()
    model.zero_grad()
    return sum(kept.values()), largest.numel


def test_chunks_keep_far_less_for_the_backward_pass():
    vocab = 50_000
    model = qwen2_tied(vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=1)
    rng = random.Random(0)
    trajs = [_trajectory(rng, vocab, [5, 6, 7], [40, 40]) for _ in range(2)]
    (mb,) = pack(trajs, row_tokens=None, micro_batch_tokens=1 << 20)
    tokens = int(mb.mask.sum())
    assert tokens == 160
    logits = tokens * vocab * 4  # one float32 [agent tokens, vocab] tensor: 32 MB
    plain_kept, plain_largest = _memory(model, mb, None)
    chunked_kept, chunked_largest = _memory(model, mb, 16)
    assert plain_kept > 2 * logits  # the logits, their log-softmax, its exp ...
    assert chunked_kept < logits / 20  # ... none of which a chunk keeps
    assert plain_largest == tokens * vocab
    assert chunked_largest == max(16 * vocab, vocab * 16)  # a chunk's logits, the head's gradient


# -- the setting: from the config to every forward pass of the learner ----------------------


def _root(trainer: dict):
    from agentgym_core.config.schema import AgentGymConfig

    return AgentGymConfig.model_validate(
        {
            "run": {"name": "chunks", "output_dir": "unused", "seed": 0},
            "model": {"path": "unused"},
            "env": {"name": "synthetic"},
            "algorithm": {"name": "grpo"},
            "trainer": trainer,
        }
    )


def test_the_setting_reaches_the_learner_settings():
    from pydantic import ValidationError

    from agentgym_core.run.runtime import learner_settings

    model = qwen2_tied()
    assert _root({}).trainer.logprob_chunk_tokens is None  # the plain path unless asked
    for given, expected in ((1024, 1024), (0, None), (None, None)):
        root = _root({"logprob_chunk_tokens": given})
        assert learner_settings(root, model).logprob_chunk_tokens == expected
        assert learner_settings(root, model, offline=True).logprob_chunk_tokens == expected
    with pytest.raises(ValidationError, match="logprob_chunk_tokens"):
        _root({"logprob_chunk_tokens": -1})


def test_a_ppo_update_with_a_reference_and_a_value_head_is_the_same_in_chunks(monkeypatch):
    """Scoring (reference), recomputed old log-probs (2 epochs) and the loss all run chunked."""
    from agentgym_algo_ppo import PPO, PPOConfig

    from agentgym_core.learner import forward
    from agentgym_core.learner.learner import Learner
    from agentgym_core.learner.scoring import score
    from agentgym_core.learner.settings import LearnerSettings
    from agentgym_core.types import TrajectoryBatch

    chunked_passes = []

    def counted(*args, **kwargs):
        chunked_passes.append(args[4])
        return scores_in_chunks(*args, **kwargs)

    scores_in_chunks = forward.scores_in_chunks
    monkeypatch.setattr(forward, "scores_in_chunks", counted)

    def update(chunk):
        model = qwen2_tied()
        algorithm = PPO(PPOConfig(critic="head", kl_coef=0.1, entropy_coef=0.01))
        settings = LearnerSettings(lr=1e-2, epochs=2, logprob_chunk_tokens=chunk)
        learner = Learner(model, algorithm, settings, reference=qwen2_tied())
        torch.nn.init.constant_(learner.critic.module.head.linear.weight, 0.1)
        batch = TrajectoryBatch(trajectories())
        for index, traj in enumerate(batch):
            traj.reward = float(index % 2)
        score(learner, batch.trajectories)
        algorithm.advantages(batch)
        metrics = learner.update(batch)
        return metrics, batch, [p.detach() for p in model.parameters()]

    plain, plain_batch, plain_weights = update(None)
    assert chunked_passes == []
    chunked, chunked_batch, chunked_weights = update(5)
    # the reference's scores, each trajectory's old log-probs, the loss of each epoch
    assert chunked_passes == [5] * (1 + len(plain_batch) + 2)
    for a, b in zip(plain_batch, chunked_batch, strict=True):
        assert b.ref_logprobs == pytest.approx(a.ref_logprobs, abs=1e-5)
    for key in ("loss", "value_loss", "grad_norm", "entropy"):
        assert chunked[key] == pytest.approx(plain[key], rel=1e-4, abs=1e-6), key
    for a, b in zip(plain_weights, chunked_weights, strict=True):
        assert (a - b).abs().max() < 1e-3, float((a - b).abs().max())
