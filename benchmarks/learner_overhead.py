"""Learner.update vs a bare torch loop on the same packed tokens (goal: <= 1.1x).

Both start from the same weights and train on the same trajectories (real
BabyAI episodes played once by the `hf` policy, advantages +-1): one GRPO
update, one optimizer step, the same micro-batches. The bare loop is what a
hand-written trainer would do: forward, masked log-softmax of the targets, the
clipped loss, backward, clip, AdamW step. It receives the micro-batches
already packed; the learner packs them itself, applies the sampler's action
constraints and computes the entropy, so all of that counts as learner
overhead. Every row but the last packs several trajectories per row (block-
diagonal attention); the last is `trainer.packing: padded`, what `auto` picks
without flash attention: one trajectory per row, plain causal attention.
Medians of wall time and of process CPU time (all threads), interleaved: on
a shared machine the CPU time is the steadier one.

    .venv/bin/python benchmarks/learner_overhead.py --repeats 7
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import statistics
import tempfile
import time
from pathlib import Path

import torch
from agentgym_algo_grpo import GRPO, GRPOConfig
from agentgym_env_babyai import BabyAIConfig, BabyAIEnv
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentgym_core.learner.learner import Learner
from agentgym_core.learner.losses import clipped_policy_loss
from agentgym_core.learner.packing import pack
from agentgym_core.learner.settings import LearnerSettings
from agentgym_core.modeling.tiny import TinyModelConfig, env_corpus, init_model
from agentgym_core.policies.hf import HFPolicy, HFPolicyConfig
from agentgym_core.rollout.chat import ChatFormat
from agentgym_core.rollout.engine import EpisodeSpec, RolloutEngine, RolloutSettings
from agentgym_core.types import TrajectoryBatch

LEVELS = ["GoToLocal", "PickupDist", "OpenDoor"]
SIZES = {
    "tiny": {},
    "small": {"hidden_size": 256, "num_layers": 4, "intermediate_size": 688},
}


def build_model(folder: Path, size: dict, texts: list[str]):
    init_model(texts, folder, TinyModelConfig(vocab_size=512, **size))
    return AutoModelForCausalLM.from_pretrained(folder), AutoTokenizer.from_pretrained(folder)


def trajectories(model, tokenizer, episodes: int, turns: int):
    """Real episodes, with fixed +-1 advantages so every one carries gradient."""
    config = BabyAIConfig(levels=LEVELS)
    policy = HFPolicy(HFPolicyConfig(), model=model, tokenizer=tokenizer)
    engine = RolloutEngine(
        lambda: BabyAIEnv(config), policy, ChatFormat(tokenizer, model.generation_config)
    )
    tasks = BabyAIEnv(config).tasks("train")[:episodes]
    specs = [EpisodeSpec(task, group=i) for i, task in enumerate(tasks)]
    out = engine.run(specs, RolloutSettings(max_turns=turns, seed=0, concurrency=episodes))
    engine.close()
    policy.close()
    for index, traj in enumerate(out):
        traj.advantages = [(1.0 if index % 2 else -1.0) * m for m in traj.loss_mask]
    return out


def bare_update(model, optimizer, micro_batches, *, agent_only=False) -> None:
    """One optimizer step written by hand.

    The plain loop takes the log-softmax over the logits of every position, as a
    hand-written trainer usually does; `agent_only` computes the logits at the
    agent tokens only (the learner's own trick), the leanest loop we could write.
    Neither applies the constraint mask nor computes the entropy.
    """
    model.train()
    normalizer = float(sum(mb.num_masked for mb in micro_batches))
    for mb in micro_batches:
        mask = mb.mask.bool()
        if agent_only:
            columns = mask.any(0).nonzero().squeeze(1)
            out = model(
                input_ids=mb.input_ids,
                position_ids=mb.position_ids,
                use_cache=False,
                logits_to_keep=columns,
            )
            logp = torch.log_softmax(out.logits[mask[:, columns]].float(), dim=-1)
            chosen = mask.float().masked_scatter(
                mask, logp.gather(1, mb.targets[mask].unsqueeze(1)).squeeze(1)
            )
        else:
            out = model(input_ids=mb.input_ids, position_ids=mb.position_ids, use_cache=False)
            logp = torch.log_softmax(out.logits.float(), dim=-1)
            chosen = logp.gather(2, mb.targets.unsqueeze(2)).squeeze(2)
        loss, _ = clipped_policy_loss(
            chosen, chosen.detach(), mb.advantages, mb.mask, normalizer, clip_low=0.2
        )
        loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def measure(size_name: str, size: dict, texts: list[str], args) -> list[tuple[str, float]]:
    with tempfile.TemporaryDirectory() as tmp:
        model, tokenizer = build_model(Path(tmp), size, texts)
    batch = trajectories(model, tokenizer, args.episodes, args.turns)
    settings = LearnerSettings(lr=1e-5, micro_batch_tokens=args.micro_batch_tokens, seed=0)
    learner = Learner(copy.deepcopy(model), GRPO(GRPOConfig()), settings)
    with_entropy = Learner(copy.deepcopy(model), GRPO(GRPOConfig(entropy_coef=0.01)), settings)
    padded = Learner(
        copy.deepcopy(model), GRPO(GRPOConfig()), dataclasses.replace(settings, share_rows=False)
    )
    bare_model = copy.deepcopy(model)
    bare_optimizer = torch.optim.AdamW(bare_model.parameters(), lr=1e-5)
    packed = pack(batch, row_tokens=None, micro_batch_tokens=args.micro_batch_tokens)

    variants = {
        "bare loop": lambda: bare_update(bare_model, bare_optimizer, packed),
        "bare loop, agent-token logits": lambda: bare_update(
            bare_model, bare_optimizer, packed, agent_only=True
        ),
        "Learner.update": lambda: learner.update(TrajectoryBatch(batch)),
        "Learner.update, entropy bonus": lambda: with_entropy.update(TrajectoryBatch(batch)),
        "Learner.update, padded rows": lambda: padded.update(TrajectoryBatch(batch)),
    }
    times: dict[str, list[float]] = {name: [] for name in variants}
    cpu: dict[str, list[float]] = {name: [] for name in variants}
    for run in variants.values():  # warm-up: allocator, first-call costs
        run()
    for _ in range(args.repeats):  # interleaved, so machine load hits every variant alike
        for name, run in variants.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            run()
            times[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
    tokens = sum(len(t.token_ids) for t in batch)
    print(f"\n{size_name}: {len(batch)} trajectories, {tokens} tokens, {len(packed)} micro-batches")
    return [(name, statistics.median(times[name]), statistics.median(cpu[name])) for name in times]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--micro-batch-tokens", type=int, default=8192)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    args = parser.parse_args()
    torch.manual_seed(0)
    env = BabyAIEnv(BabyAIConfig(levels=LEVELS))
    texts = env_corpus(env, env.tasks("train")[:200], max_turns=5)
    for size_name in args.sizes:
        rows = measure(size_name, SIZES[size_name], texts, args)
        bare, bare_cpu = rows[0][1], rows[0][2]
        print("| variant | wall s / update | vs bare loop | CPU s / update | vs bare loop |")
        print("|---|---|---|---|---|")
        for name, seconds, cpu in rows:
            print(
                f"| {name} | {seconds:.3f} | {seconds / bare:.2f}x | {cpu:.3f} | "
                f"{cpu / bare_cpu:.2f}x |"
            )


if __name__ == "__main__":
    main()
