"""The real SmolLM2-135M-Instruct through the `hf` policy and the learner: what it samples is
what the learner scores, with LoRA, after a sync and after a resume; its template round-trips.

A tiny model with our own template hides what a real template and a real
`generation_config.json` do, so these run the real checkpoint (fetched once per
machine by `make pretrained`), in free text: the model writes its actions.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentgym_core.cli import main as agentgym
from agentgym_core.config.schema import ModelConfig
from agentgym_core.learner.forward import policy_forward, token_logprobs
from agentgym_core.learner.packing import pack
from agentgym_core.rollout.chat import PRIMING_REPLY, ChatFormat
from agentgym_core.run.runtime import load_training_model

pytestmark = [pytest.mark.pretrained, pytest.mark.agentgym_plugins("babyai", "grpo", "fixed")]
pytest.importorskip("peft")

SAMPLING_DEFAULTS = {
    "do_sample": True,
    "temperature": 0.3,
    "top_k": 5,
    "top_p": 0.5,
    "repetition_penalty": 1.3,
}
"""What a real checkpoint's generation_config.json may carry; a rollout must not apply it."""

TURNS = 2
NEW_TOKENS = 16
LORA = {"r": 8, "alpha": 16}


def _agentgym_babyai():
    """AgentGym's BabyAI, as the `babyai` plugin builds it for `levels: agentgym`."""
    from agentgym_env_babyai import BabyAIConfig
    from agentgym_env_babyai.plugin import make_babyai

    return make_babyai(BabyAIConfig(levels="agentgym", list_actions=True))


@pytest.fixture(scope="module")
def smollm2_with_sampling_defaults(smollm2_dir, tmp_path_factory) -> Path:
    """SmolLM2's folder (weights linked, not copied) with sampling defaults in its generation
    config, as many real checkpoints ship."""
    folder = tmp_path_factory.mktemp("smollm2-sampling")
    for file in smollm2_dir.iterdir():
        if file.name != "generation_config.json":
            os.symlink(file, folder / file.name)
    generation = json.loads((smollm2_dir / "generation_config.json").read_text())
    (folder / "generation_config.json").write_text(json.dumps(generation | SAMPLING_DEFAULTS))
    return folder


@pytest.fixture(scope="module")
def lora_runs(smollm2_with_sampling_defaults, tmp_path_factory):
    """Two LoRA GRPO updates in free text, then the same run resumed for a third."""
    from agentgym_core.testing.training import TinyModels, TinyTrainer

    tmp = tmp_path_factory.mktemp("smollm2-lora")
    train = TinyTrainer(tmp, TinyModels(tmp / "unused"), only=frozenset())
    config = {
        "model": {"path": str(smollm2_with_sampling_defaults), "lora": LORA},
        "env": {"name": "babyai", "levels": "agentgym", "list_actions": True},
        # zero-shot episodes mostly all fail, so the entropy bonus is what moves the adapter
        "algorithm": {"name": "grpo", "kl_coef": 0.0, "entropy_coef": 0.01},
        "scheduler": {"name": "fixed", "max_turns": TURNS},
        "rollout": {"constrained": False, "max_new_tokens": NEW_TOKENS},
        "trainer": {"steps": 2, "tasks_per_step": 2, "group_size": 2, "lr": 1e-3},
        "run": {"seed": 1},
    }
    first = train(config)
    resumed = train(
        {**config, "trainer": {**config["trainer"], "steps": 3}}, output_dir=first.output_dir
    )
    return first, resumed


@pytest.fixture(scope="module")
def free_text_batch(smollm2_with_sampling_defaults):
    """16 free-text BabyAI episodes of 3 turns through the `hf` policy, at temperature 1."""
    from agentgym_core.policies.hf import HFPolicy, HFPolicyConfig
    from agentgym_core.rollout.engine import EpisodeSpec, RolloutEngine, RolloutSettings

    folder = smollm2_with_sampling_defaults
    model = AutoModelForCausalLM.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    policy = HFPolicy(HFPolicyConfig(), model=model, tokenizer=tokenizer)
    chat = ChatFormat(tokenizer, model.generation_config)
    engine = RolloutEngine(_agentgym_babyai, policy, chat)
    episodes = [EpisodeSpec(task, group=task, sample=s) for task in range(4) for s in range(4)]
    settings = RolloutSettings(max_turns=3, max_new_tokens=NEW_TOKENS, constrained=False, seed=3)
    try:
        return model, engine.run(episodes, settings)
    finally:
        engine.close()
        policy.close()


@pytest.mark.timeout(1200)  # 16 real-model episodes: 558 s seen beside other runs on 2 cores
def test_hf_samples_what_the_learner_scores_with_a_checkpoints_sampling_defaults(
    free_text_batch,
):
    """Over 500+ free-text tokens at temperature 1: the sampler's log-probs are the learner's
    full-softmax ones; the checkpoint's top_k=5 / top_p=0.5 / temperature 0.3 do not apply.

    Scored as the CPU learner packs a batch by default: a row per episode, each task's
    prompt computed once for its four samples.
    """
    model, trajectories = free_text_batch
    (mb,) = pack(
        trajectories,
        row_tokens=None,
        micro_batch_tokens=1 << 20,
        share_rows=False,
        share_prompts=True,
    )
    mask = mb.mask.bool()
    with torch.no_grad():
        logprobs, _, last = policy_forward(model, mb, 1.0, hidden=True)
        logits = model.lm_head(last[mask]).float()  # [sampled tokens, vocab]
    learner = logprobs[mask]
    sampler = mb.sampler_logprobs[mask]
    assert learner.numel() >= 500
    assert float((learner - sampler).abs().mean()) < 1e-3
    targets = mb.targets[mask]
    head = torch.log_softmax(logits, -1).gather(1, targets[:, None]).squeeze(1)
    assert float((head - learner).abs().max()) < 1e-4  # the same positions' logits
    rank = (logits > logits.gather(1, targets[:, None])).sum(-1)
    assert int((rank >= SAMPLING_DEFAULTS["top_k"]).sum()) > 0  # impossible under top_k=5


def test_through_lora_updates_and_a_resume_the_sampler_scores_as_the_learner(lora_runs):
    """Each update's sampled tokens (after the previous update's sync, and after a resume)
    carry the learner's own log-probs, within 1e-3 mean absolute."""
    first, resumed = lora_runs
    assert all(h["train/sampler_logprob_diff"] < 1e-3 for h in first.history)
    assert resumed.resumed_from == 2 and len(resumed.history) == 3
    assert resumed.history[2]["train/sampler_logprob_diff"] < 1e-3
    assert resumed.history[2]["rollout/generated_tokens"] > 0


def test_merge_of_the_lora_checkpoint_scores_as_the_adapter(lora_runs, tmp_path):
    first, _ = lora_runs
    out = tmp_path / "merged"
    assert agentgym(["model", "merge", str(first.checkpoint), "--out", str(out)]) == 0
    block = ModelConfig(path=str(first.model_dir), lora=LORA)
    adapted, _ = load_training_model(block, first.model_dir, first.checkpoint)
    merged = AutoModelForCausalLM.from_pretrained(out)
    trajectories = first.batches[1].trainable[:2]
    (mb,) = pack(trajectories, row_tokens=None, micro_batch_tokens=1 << 20)
    with torch.no_grad():
        ours = token_logprobs(adapted, mb, 1.0)[0][mb.mask.bool()]
        theirs = token_logprobs(merged, mb, 1.0)[0][mb.mask.bool()]
        base = AutoModelForCausalLM.from_pretrained(first.model_dir)
        before = token_logprobs(base, mb, 1.0)[0][mb.mask.bool()]
    assert float((ours - theirs).abs().max()) < 1e-4
    assert float((ours - before).abs().mean()) > 1e-3  # the adapter learned something to merge


def test_the_trajectories_are_the_templates_rendering_of_the_conversation(lora_runs):
    """Token in, token out on the real tokenizer: the ids decode to ChatML's rendering of the
    episode, each sampled turn (or a cut turn closed with <|im_end|>) then its observation."""
    first, _ = lora_runs
    tokenizer = AutoTokenizer.from_pretrained(first.model_dir)
    chat = ChatFormat(tokenizer)
    end = chat.stop_ids[0]
    env = _agentgym_babyai()
    instruction = env.instruction()
    env.close()
    for traj in first.batches[0].trainable:
        turns = _sampled_turns(traj)
        assert len(turns) == len(traj.turns) >= 1
        messages = [
            {"role": "user", "content": instruction},
            {"role": "assistant", "content": PRIMING_REPLY},
            {"role": "user", "content": traj.first_observation},
        ]
        for ids, turn in zip(turns, traj.turns, strict=True):
            text = tokenizer.decode([t for t in ids if t != end])
            messages += [
                {"role": "assistant", "content": text},
                {"role": "user", "content": turn.observation},
            ]
        rendered = tokenizer.apply_chat_template(messages[:-1], tokenize=False)
        decoded = tokenizer.decode(traj.token_ids)
        assert rendered.startswith(decoded) and len(rendered) - len(decoded) <= 1
        prompt = chat.prompt_ids(instruction, traj.first_observation)
        assert traj.token_ids[: len(prompt)] == prompt


def _sampled_turns(traj) -> list[list[int]]:
    """Each run of sampled tokens (loss mask 1)."""
    turns: list[list[int]] = []
    previous = 0
    for token, mask in zip(traj.token_ids, traj.loss_mask, strict=True):
        if mask and not previous:
            turns.append([])
        if mask:
            turns[-1].append(token)
        previous = mask
    return turns


def test_a_process_that_closes_a_continuous_policy_exits_cleanly(smollm2_dir):
    """`close` waits for the decoder thread: one still alive when the interpreter exits
    aborted the process ("terminate called without an active exception"), as this
    script's exit did before the wait."""
    import subprocess
    import sys

    script = f"""
import asyncio
from agentgym_core.interfaces import SamplingParams
from agentgym_core.policies.hf import HFPolicy, HFPolicyConfig
from agentgym_core.run.components import load_model
model, tokenizer = load_model({str(smollm2_dir)!r}, "bfloat16")
policy = HFPolicy(HFPolicyConfig(batching="continuous"), model=model, tokenizer=tokenizer)
params = SamplingParams(max_new_tokens=4)
async def turns():
    prompts = [list(range(100, 150)), list(range(200, 260))]
    for _ in range(2):
        outs = await asyncio.gather(
            *(policy.generate(p, params, session=i) for i, p in enumerate(prompts))
        )
        prompts = [p + o.token_ids + [7] * 20 for p, o in zip(prompts, outs)]
asyncio.run(turns())
policy.close()
"""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env
    )
    assert done.returncode == 0, done.stderr[-2000:]
