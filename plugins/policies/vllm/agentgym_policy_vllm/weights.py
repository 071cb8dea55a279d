"""The learner's weights as vLLM loads them, and the probe that checks vLLM holds them.

Both vLLM policies sample from weights of their own (an engine, replicas),
loaded from a folder and then synced after every update. Anything that leaves
them on other weights than the learner's is silent: a LoRA adapter that never
reached vLLM, a reload that kept the old tensors, a replica started from
another checkpoint or dtype. So after every sync, and when a policy is built,
the sampler scores one fixed token sequence (prompt log-probabilities, before
any sampling parameter) and the learner scores it too; a mean absolute gap
above `policy.probe_tolerance` stops the run with `WeightsMismatch`.

No vLLM import here: the `vllm_server` policy runs where vLLM is not installed.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentgym_core.api import ChatFormat, PolicyError, full_weights

PROBE = ("Say what you see.", "A probe of the served weights.", "I see a probe.")
"""Instruction, observation and answer of the probe: one opening prompt and one action."""


class WeightsMismatch(PolicyError):
    """The sampler's log-probabilities of the probe are not the learner's.

    A `PolicyError`: the run stops with a one-line error naming the gap, not a traceback.
    """


def probe_ids(chat: ChatFormat) -> list[int]:
    """The probe's token ids: the chat template's prompt, then an answer and its end of turn.

    The answer's tokens matter most: training moves the log-probabilities of
    what the agent says more than those of the prompt.
    """
    instruction, observation, answer = PROBE
    return [*chat.prompt_ids(instruction, observation), *chat.action_tokens(answer)]


def learner_dtype(model: Any) -> str:
    """The learner's weights dtype by name ("float32", "bfloat16")."""
    return str(next(model.parameters()).dtype).removeprefix("torch.")


def learner_logprobs(model: Any, ids: Sequence[int]) -> list[float]:
    """The learner's log-probability of each token of `ids` after the first (temperature 1).

    In eval mode (no dropout), restored after. Every learner rank calls this
    (an FSDP forward is collective).
    """
    import torch

    training = model.training
    model.eval()
    try:
        device = next(model.parameters()).device
        tokens = torch.tensor([list(ids)], device=device)
        with torch.no_grad():
            logits = model(tokens).logits[0, :-1].float()
        picked = logits.log_softmax(-1).gather(1, tokens[0, 1:, None])
    finally:
        model.train(training)
    return picked[:, 0].cpu().tolist()


def check_probe(
    sampler: str, served: Sequence[float], learner: Sequence[float], tolerance: float
) -> float:
    """The mean absolute gap between two scorings of the probe; above `tolerance`, an error.

    `sampler` names what served it (a replica's URL, "the in-process vLLM engine").
    """
    gap = sum(abs(a - b) for a, b in zip(served, learner, strict=True)) / len(learner)
    if gap > tolerance:
        raise WeightsMismatch(
            f"{sampler} does not hold the learner's weights: its log-probabilities of a "
            f"{len(learner) + 1}-token probe differ from the learner's by {gap:.3g} on average "
            f"(policy.probe_tolerance={tolerance:g}). Check that it reloaded the synced weights "
            "(a reload that failed or kept the old tensors), that a LoRA adapter reached it "
            "(merged into the weights sent), and its dtype (a bfloat16 sampler against a "
            "float32 learner differs by more: raise policy.probe_tolerance)."
        )
    return gap


def save_weights(model: Any, folder: Path) -> None:
    """The learner's full weights (LoRA merged) and config in `folder`, written atomically.

    vLLM's in-place reload keeps a tied output layer that the file lacks, so
    `lm_head.weight` is written out as a copy of the embeddings.
    """
    from safetensors.torch import save_file

    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    weights = {name: tensor.detach().cpu().clone() for name, tensor in full_weights(model)}
    if "lm_head.weight" not in weights and "model.embed_tokens.weight" in weights:
        weights["lm_head.weight"] = weights["model.embed_tokens.weight"].clone()
    save_file(weights, str(tmp / "model.safetensors"))
    config = getattr(model, "get_base_model", lambda: model)().config
    config.save_pretrained(tmp)
    tmp.rename(folder)
