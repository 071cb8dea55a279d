"""TRL's GRPOTrainer plays BabyAI through `environment_factory` (agentgym_core.integrations.trl).

A tiny from-scratch model on the real Qwen2 tokenizer with the Qwen2.5
family's chat template (TRL's copy, which renders tools), taught by a short
SFT to call the `act` tool, then 2 GRPO updates of TRL 1.16. What must hold:
every episode TRL scored replays in-process to the same return, TRL's logged
reward is those returns' mean, the observations the tool returned are in the
completions with `tool_mask` 0 (not trained on), and the weights moved.
"""

from __future__ import annotations

import inspect
import json

import pytest

pytest.importorskip("trl", reason="the `trl` extra: pip install -e '.[trl]' (make installs it)")
pytest.importorskip("agentgym_env_babyai")

import torch  # noqa: E402

from agentgym_core.config.errors import ConfigError  # noqa: E402
from agentgym_core.integrations.trl import environment_factory, task_rows  # noqa: E402

BABYAI = {"levels": ["GoToObj"]}
INSTRUCTION = "Go to the object your goal names."


@pytest.fixture(scope="module")
def single_thread():
    """One torch thread: two fight each other on a busy 2-core machine (5x slower here)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_the_adapter_plays_babyai_as_in_process():
    env_class = environment_factory("babyai", BABYAI, max_steps=30, seed=0)
    assert env_class.__name__ == "BabyaiEnv"
    tools = [
        name
        for name, _ in inspect.getmembers(env_class, predicate=inspect.isfunction)
        if not name.startswith("_") and name not in ("reset", "get_reward")
    ]
    assert tools == ["act"]  # TRL offers every other public method to the model as a tool
    rows = task_rows(env_class, "test", instruction=INSTRUCTION)
    registration_env = env_class.registration.factory(env_class.config)
    assert [row["task_id"] for row in rows] == list(registration_env.tasks("test"))
    assert rows[0]["prompt"][0] == {"role": "system", "content": INSTRUCTION}
    env = env_class()
    with pytest.raises(RuntimeError, match="act before reset"):
        env.act("turn left")
    task = rows[3]["task_id"]
    assert env.reset(task_id=task) == registration_env.reset(task)
    returned = 0.0
    while not env.done:
        action = env.env.expert_action()
        said = env.act(action)
        ours = registration_env.step(action)
        returned += ours.reward
        assert said.startswith(ours.observation)
    assert env.success is True and said.endswith("The episode succeeded.")
    assert env.get_reward() == pytest.approx(returned) and returned > 0
    assert "over" in env.act("turn left") and len(env.rewards) == len(env.actions)
    drawn = env_class()
    assert drawn.reset() and drawn.task_id in set(registration_env.tasks("train"))
    short = environment_factory("babyai", BABYAI, max_steps=1)()
    short.reset(task_id=task)
    short.act("turn left")
    assert short.done and "over" in short.act("turn left") and short.actions == ["turn left"]
    registration_env.close()
    with pytest.raises(ConfigError, match="env.levls"):
        environment_factory("babyai", {"levls": ["GoToObj"]})


def test_rollouts_of_a_seeded_class_draw_different_tasks_reproducibly():
    """Rows naming no task: each instance (one per rollout) takes the next draw of the class's
    seeded sequence (every instance drew the same task before), and the seed repeats it."""

    def drawn(seed: int) -> list[int]:
        env_class = environment_factory("babyai", BABYAI, seed=seed)
        tasks = []
        for _ in range(8):
            env = env_class()
            env.reset()
            tasks.append(env.task_id)
        return tasks

    first = drawn(0)
    assert len(set(first)) > 1
    assert drawn(0) == first and drawn(1) != first


def _tool_caller(folder, env_class, rows, steps: int = 80):
    """A tiny model on the real Qwen2 tokenizer that calls `act` ("go to <object> 1")."""
    from transformers import AutoTokenizer, GenerationConfig, Qwen2Config, Qwen2ForCausalLM
    from trl.chat_template_utils import qwen2_5_chat_template

    from agentgym_core.modeling.fetch import fetch

    tokenizer = AutoTokenizer.from_pretrained(fetch("tokenizer-qwen2", log=None))
    tokenizer.chat_template = qwen2_5_chat_template  # Qwen2.5-Instruct's, which renders tools
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    stops = tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    model.generation_config = GenerationConfig(eos_token_id=stops, pad_token_id=stops[1])
    env = env_class()
    examples = []
    for row in rows[:16]:
        observation = env.reset(task_id=row["task_id"])
        goal = observation.split("go to the ", 1)[1].split("\n", 1)[0]
        messages = [row["prompt"][0], {"role": "user", "content": observation}]
        prompt = tokenizer.apply_chat_template(
            messages, tools=[env.act], add_generation_prompt=True, tokenize=False
        )
        call = {"name": "act", "arguments": {"action": f"go to {goal} 1"}}
        reply = f"<tool_call>\n{json.dumps(call)}\n</tool_call><|im_end|>"
        examples.append(
            (tokenizer(prompt).input_ids, tokenizer(reply, add_special_tokens=False).input_ids)
        )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for step in range(steps):
        loss = torch.zeros(())
        for prompt_ids, reply_ids in (examples[(step * 4 + i) % len(examples)] for i in range(4)):
            hidden = model.model(torch.tensor([prompt_ids + reply_ids])).last_hidden_state
            logits = model.lm_head(hidden[0, len(prompt_ids) - 1 : -1])  # the reply's tokens only
            loss = loss + torch.nn.functional.cross_entropy(logits, torch.tensor(reply_ids))
        (loss / 4).backward()
        optimizer.step()
        optimizer.zero_grad()
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_trl_grpo_trains_through_environment_factory(tmp_path, single_thread):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    env_class = environment_factory("babyai", BABYAI, max_steps=4, seed=0)
    rows = task_rows(env_class, "train", instruction=INSTRUCTION)
    folder = _tool_caller(tmp_path / "tool-caller", env_class, rows)
    scored: list[dict] = []

    class BabyaiEnv(env_class):  # records what TRL's reward saw; same name, same reward column
        def act(self, action: str) -> str:
            """Take one action in the environment and see what happens.

            Args:
                action: The action to take, as the environment's actions are written.
            """
            said = super().act(action)
            self.said = [*getattr(self, "said", []), said]
            return said

        def get_reward(self) -> float:
            reward = super().get_reward()
            scored.append(
                {
                    "task": self.task_id,
                    "actions": list(self.actions),
                    "said": list(getattr(self, "said", [])),
                    "reward": reward,
                }
            )
            self.said = []
            return reward

    model = AutoModelForCausalLM.from_pretrained(folder)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    args = GRPOConfig(
        output_dir=str(tmp_path / "grpo"),
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=160,
        max_tool_calling_iterations=3,
        max_steps=2,
        learning_rate=1e-3,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        seed=0,
    )
    trainer = GRPOTrainer(
        model=model,
        processing_class=AutoTokenizer.from_pretrained(folder),
        args=args,
        train_dataset=Dataset.from_list(rows),
        environment_factory=BabyaiEnv,
    )
    batches: list[dict] = []
    generate = trainer._generate_and_score_completions

    def recording(inputs):
        out = generate(inputs)
        batches.append({"ids": out["completion_ids"], "tool_mask": out.get("tool_mask")})
        return out

    trainer._generate_and_score_completions = recording
    trainer.train()

    logged = [entry for entry in trainer.state.log_history if "rewards/BabyaiEnv/mean" in entry]
    assert len(logged) == 2 and len(scored) == 16 and len(batches) == 2
    local = env_class.registration.factory(env_class.config)
    try:
        for episode in scored:  # every episode TRL scored, replayed in-process
            local.reset(episode["task"])
            replayed = sum(local.step(action).reward for action in episode["actions"])
            assert replayed == pytest.approx(episode["reward"])
    finally:
        local.close()
    for update, entry in enumerate(logged):
        rewards = [episode["reward"] for episode in scored[update * 8 : (update + 1) * 8]]
        assert entry["rewards/BabyaiEnv/mean"] == pytest.approx(sum(rewards) / 8, abs=1e-6)
        assert entry["reward"] == pytest.approx(sum(rewards) / 8, abs=1e-6)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    episodes = iter(scored)
    observed = 0
    for batch in batches:
        assert batch["tool_mask"] is not None
        for ids, mask in zip(batch["ids"], batch["tool_mask"], strict=True):
            episode = next(episodes)
            untrained = tokenizer.decode(ids[mask == 0])
            for said in episode["said"]:  # each observation the tool returned: not trained on
                assert said in untrained
                observed += 1
            trained = tokenizer.decode(ids[(mask == 1) & (ids != tokenizer.pad_token_id)])
            assert "<tool_response>" not in trained
    assert observed >= 4, "the model called the tool too rarely to test the mask"
    assert any(r["reward"] > 0 for r in scored), "no episode succeeded: nothing to learn from"
    after = trainer.model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
