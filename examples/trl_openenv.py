r"""TRL's GRPOTrainer trains on an agentgym environment served over OpenEnv.

The environment runs in its own process (`agentgym serve-env NAME --protocol
openenv`); TRL plays whole multi-turn episodes on it over OpenEnv WebSocket
sessions, with `openenv`'s own client, in the `rollout_func` below. This
is the TRL side of docs/openenv.md; nothing here is agentgym's trainer.

    .venv/bin/pip install trl==1.16.0          # or: pip install -e '.[trl]'
    .venv/bin/agentgym serve-env babyai --protocol openenv --port 8011 \
        -o 'levels=[GoToObj,GoToLocal]' &
    .venv/bin/agentgym model init --env babyai --out runs/models/babyai-tiny \
        -o 'levels=[GoToObj,GoToLocal]'
    .venv/bin/python examples/trl_openenv.py --url http://127.0.0.1:8011 \
        --model runs/models/babyai-tiny --out runs/trl-babyai --updates 20

Why a `rollout_func` and not TRL's `environment_factory` (for which
`agentgym_core.integrations.trl` adapts any env, docs/trl.md): the latter runs
an episode only while the model writes tool calls in its chat template's
format, which a model trained from scratch (or any model not tuned for tool
calling) never does. The rollout function plays every live episode one turn at a time:
`model.generate` over each conversation so far, then one OpenEnv `step` per
episode. Sampling is restricted to the actions the server lists in
`available_actions` (`prefix_allowed_tokens_fn`), as agentgym's constrained
decoding does; `--free-text` turns that off. Observation tokens go into the
completion with `env_mask` 0, as TRL documents, so the loss skips them.

Each dataset row names its task in the prompt ("train task 17"); the text the
model sees is the env's: its instruction (`/metadata`) and the observation
`reset(task_id=...)` returns.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

TASK = re.compile(r"^(train|test) task (\d+)$")


def task_prompt(split: str, task_id: int) -> list[dict[str, str]]:
    """A dataset row's prompt: it names the task; the rollout renders what the model sees."""
    return [{"role": "user", "content": f"{split} task {task_id}"}]


def env_facts(url: str, split: str = "train") -> tuple[str, list[int]]:
    """The env's instruction (`/metadata`'s description) and the task ids of `split`."""
    import httpx

    metadata = httpx.get(f"{url}/metadata", timeout=30).raise_for_status().json()
    tasks = httpx.get(f"{url}/tasks", params={"split": split}, timeout=30).raise_for_status()
    return metadata["description"], [int(t) for t in tasks.json()["tasks"]]


class Sessions:
    """OpenEnv WebSocket sessions, one per episode slot, kept open across updates."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.clients: list[Any] = []
        self.pool = ThreadPoolExecutor(max_workers=16, thread_name_prefix="openenv")

    def ensure(self, n: int) -> None:
        """At least `n` open sessions (each `SyncEnvClient` runs its own event loop)."""
        from openenv.core import GenericEnvClient

        while len(self.clients) < n:
            self.clients.append(GenericEnvClient(base_url=self.url).sync().connect())

    def reset(self, tasks: Sequence[int]) -> list[Any]:
        """One `reset(task_id=...)` per slot, concurrently."""
        self.ensure(len(tasks))
        calls = [
            self.pool.submit(c.reset, task_id=t) for c, t in zip(self.clients, tasks, strict=False)
        ]
        return [call.result() for call in calls]

    def step(self, slots: Sequence[int], actions: Sequence[str]) -> list[Any]:
        """One `step({"text": action})` per live slot, concurrently."""
        calls = [
            self.pool.submit(self.clients[i].step, {"text": a})
            for i, a in zip(slots, actions, strict=True)
        ]
        return [call.result() for call in calls]

    def close(self) -> None:
        """Close every session (the server frees its envs at once, not at idle expiry)."""
        for client in self.clients:
            client.close()
        self.clients.clear()
        self.pool.shutdown(wait=False)


def allowed_tokens(chat: Any, actions: Sequence[str]) -> Callable[[Sequence[int]], list[int]]:
    """Next-token ids that keep a sampled prefix on one of `actions` (ending in the stop token)."""
    sequences = [tuple(chat.action_ids(a)) for a in actions]

    def allowed(prefix: Sequence[int]) -> list[int]:
        n, head = len(prefix), tuple(prefix)
        return sorted({s[n] for s in sequences if len(s) > n and s[:n] == head})

    return allowed


def row_constraint(
    rules: Sequence[Callable[[Sequence[int]], list[int]]], width: int, stop: set[int], pad: int
) -> Callable[[int, Any], list[int]]:
    """`prefix_allowed_tokens_fn` for a left-padded batch of `width` prompt tokens per row."""

    def restrict(row: int, sequence: Any) -> list[int]:
        sampled = sequence[width:].tolist()
        if any(t in stop for t in sampled):
            return [pad]  # this row is done; the others go on
        return rules[row](sampled) or sorted(stop)

    return restrict


def openenv_rollout(
    url: str,
    tokenizer: Any,
    *,
    max_turns: int,
    max_new_tokens: int = 12,
    temperature: float = 1.0,
    constrained: bool = True,
) -> Callable[[list, Any], dict[str, Any]]:
    """A TRL `rollout_func` that plays each prompt's task to the end on the OpenEnv server.

    Returns, besides the ids and log-probabilities TRL needs, `env_mask` (1 on
    sampled tokens), `episode_reward` (the env's rewards summed, for a reward
    function) and `actions` (what each episode did, for checks and logs).
    """
    import torch

    from agentgym_core.rollout.chat import ChatFormat

    chat = ChatFormat(tokenizer)
    stop = set(chat.stop_ids)
    instruction, _ = env_facts(url)
    sessions = Sessions(url)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0

    def rollout(prompts: list, trainer: Any) -> dict[str, Any]:
        model = trainer.accelerator.unwrap_model(trainer.model)
        tasks = []
        for prompt in prompts:
            named = TASK.match(prompt[-1]["content"])
            if named is None:
                raise ValueError(f"prompt {prompt[-1]['content']!r} does not name a task")
            tasks.append(int(named[2]))
        first = sessions.reset(tasks)
        opening = [chat.prompt_ids(instruction, r.observation["text"]) for r in first]
        options = [r.observation.get("available_actions") for r in first]
        completion: list[list[int]] = [[] for _ in prompts]
        mask: list[list[int]] = [[] for _ in prompts]
        logprobs: list[list[float]] = [[] for _ in prompts]
        reward = [0.0 for _ in prompts]
        actions: list[list[str]] = [[] for _ in prompts]
        live = list(range(len(prompts)))
        for turn in range(max_turns):
            ids = [opening[i] + completion[i] for i in live]
            width = max(len(x) for x in ids)
            inputs = torch.tensor([[pad] * (width - len(x)) + x for x in ids])
            attention = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids])
            restrict = None
            if constrained:
                restrict = row_constraint(
                    [allowed_tokens(chat, options[i] or []) for i in live], width, stop, pad
                )

            with torch.no_grad():
                out = model.generate(
                    inputs,
                    attention_mask=attention,
                    do_sample=True,
                    temperature=temperature,
                    top_k=0,
                    top_p=1.0,
                    max_new_tokens=max_new_tokens,
                    pad_token_id=pad,
                    eos_token_id=sorted(stop),
                    prefix_allowed_tokens_fn=restrict,
                    output_scores=True,
                    return_dict_in_generate=True,
                )
            scores = torch.stack(out.scores, dim=1).log_softmax(-1)  # [live, new, vocab]
            sampled_rows = []
            for row, i in enumerate(live):
                new = out.sequences[row, width:].tolist()
                end = next((k + 1 for k, t in enumerate(new) if t in stop), len(new))
                sampled_rows.append(new[:end])
                completion[i] += new[:end]
                mask[i] += [1] * end
                logprobs[i] += [float(scores[row, k, t]) for k, t in enumerate(new[:end])]
                actions[i].append(chat.decode_action(new[:end]))
            results = sessions.step(live, [actions[i][-1] for i in live])
            still = []
            for i, result in zip(live, results, strict=True):
                reward[i] += float(result.reward or 0.0)
                if result.done or turn + 1 == max_turns:
                    continue
                delta = chat.observation_ids(result.observation["text"])
                completion[i] += delta
                mask[i] += [0] * len(delta)
                logprobs[i] += [0.0] * len(delta)
                options[i] = result.observation.get("available_actions")
                still.append(i)
            live = still
            if not live:
                break
        return {
            "prompt_ids": opening,
            "completion_ids": completion,
            "logprobs": logprobs,
            "env_mask": mask,
            "episode_reward": reward,
            "actions": actions,
        }

    rollout.sessions = sessions  # type: ignore[attr-defined]
    return rollout


def episode_reward(completions: list, episode_reward: list[float], **_: Any) -> list[float]:
    """TRL reward function: the env's reward, summed over the episode the rollout played."""
    return [float(r) for r in episode_reward]


def train(
    url: str,
    model_path: str | Path,
    out: str | Path,
    *,
    updates: int,
    tasks_per_update: int = 8,
    group_size: int = 8,
    max_turns: int = 6,
    max_new_tokens: int = 12,
    lr: float = 1e-3,
    seed: int = 0,
    constrained: bool = True,
    callbacks: Sequence[Any] = (),
) -> Any:
    """GRPO with TRL on the served env's train tasks; saves model and tokenizer to `out`."""
    import random

    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    _, train_tasks = env_facts(url)
    rng = random.Random(seed)
    rows = [
        {"prompt": task_prompt("train", t)}
        for _ in range(updates)
        for t in rng.sample(train_tasks, tasks_per_update)
    ]
    on_gpu = torch.cuda.is_available()
    config = GRPOConfig(
        output_dir=str(out),
        per_device_train_batch_size=tasks_per_update * group_size,
        num_generations=group_size,
        steps_per_generation=1,
        gradient_accumulation_steps=1,
        num_iterations=1,
        beta=0.0,
        max_completion_length=max_turns * max_new_tokens,
        temperature=1.0,
        learning_rate=lr,
        max_steps=updates,
        seed=seed,
        shuffle_dataset=False,
        use_cpu=not on_gpu,
        bf16=on_gpu,
        gradient_checkpointing=False,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    rollout = openenv_rollout(
        url,
        tokenizer,
        max_turns=max_turns,
        max_new_tokens=max_new_tokens,
        constrained=constrained,
    )
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(model_path),
        reward_funcs=episode_reward,
        args=config,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        rollout_func=rollout,
        callbacks=list(callbacks),
    )
    try:
        trainer.train()
    finally:
        rollout.sessions.close()
    trainer.save_model(str(out))
    tokenizer.save_pretrained(str(out))
    return trainer


def main(argv: list[str] | None = None) -> None:
    """Command line: train on a running server, save the model."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="the OpenEnv server (agentgym serve-env)")
    parser.add_argument("--model", required=True, help="a causal LM folder (agentgym model init)")
    parser.add_argument("--out", required=True, help="where the trained model is saved")
    parser.add_argument("--updates", type=int, default=20)
    parser.add_argument("--tasks", type=int, default=8, help="tasks per update")
    parser.add_argument("--group", type=int, default=8, help="episodes per task (GRPO group)")
    parser.add_argument("--turns", type=int, default=6, help="turn limit of an episode")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--free-text", action="store_true", help="no action constraint")
    args = parser.parse_args(argv)
    train(
        args.url.rstrip("/"),
        args.model,
        args.out,
        updates=args.updates,
        tasks_per_update=args.tasks,
        group_size=args.group,
        max_turns=args.turns,
        lr=args.lr,
        seed=args.seed,
        constrained=not args.free_text,
    )
    print(f"saved {args.out}; evaluate it with agentgym eval (docs/openenv.md)")


if __name__ == "__main__":
    main()
