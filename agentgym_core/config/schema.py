"""The root config model: one pydantic block per top-level YAML key.

Component blocks (`env`, `policy`, `algorithm`, `scheduler`) only hold a
`name` here; their other keys belong to the plugin and are validated against
the model it registered (see `agentgym_core.config.resolve`). Field
descriptions are the reference users read, so keep them exact.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from agentgym_core.config.block import Block as _Block
from agentgym_core.config.model_block import LoraConfig as LoraConfig
from agentgym_core.config.model_block import ModelConfig

COMPONENT_KINDS = {
    "env": "environment",
    "policy": "policy",
    "algorithm": "algorithm",
    "scheduler": "scheduler",
}
"""Config block -> registry kind of the component it names."""


class ComponentBlock(BaseModel):
    """A registered component: its `name` plus that plugin's own options."""

    model_config = ConfigDict(extra="allow")

    name: str = Field(min_length=1, description="Registered name of the plugin component.")

    @property
    def options(self) -> dict[str, Any]:
        """Every key but `name`, as written (validated later by the plugin's model)."""
        return dict(self.model_extra or {})


class RunConfig(_Block):
    """Identity of the run and where it writes."""

    name: str = Field("agentgym", min_length=1, description="Run name (MLflow run, folders).")
    output_dir: str | None = Field(
        None,
        min_length=1,
        description="Folder for checkpoints, logs and the resolved config; null: runs/<name>.",
    )
    seed: int = Field(0, ge=0, description="Seed of task sampling, generation and init.")

    @model_validator(mode="after")
    def _default_output_dir(self) -> RunConfig:
        if self.output_dir is None:
            self.output_dir = f"runs/{self.name}"
        return self


class RolloutConfig(_Block):
    """How episodes are played to collect training data."""

    concurrency: int = Field(64, gt=0, description="Most episodes in flight at once.")
    env_timeout_s: float = Field(
        30.0,
        gt=0,
        description="Seconds one env call (reset, step, ...) may run; only a call still running "
        "after that many seconds times out, making the episode env_error (a call that takes "
        "exactly env_timeout_s is not a timeout).",
    )
    max_context_tokens: int = Field(
        1024, gt=0, description="Token budget of one episode (prompt, actions, observations)."
    )
    max_new_tokens: int = Field(16, gt=0, description="Most tokens sampled in one agent turn.")
    temperature: float = Field(1.0, gt=0, description="Sampling temperature of training rollouts.")
    constrained: bool = Field(
        True, description="Restrict decoding to the env's valid actions where it lists them."
    )
    env_threads: int = Field(
        8,
        ge=0,
        description="Threads running environment calls (sync envs run off the event loop); 0 "
        "runs each call on the event loop itself: fastest for an in-process env whose calls "
        "take well under a millisecond (BabyAI), but no call can then time out "
        "(`env_timeout_s`) and a slow one holds up every episode.",
    )
    env_recovery_s: float = Field(
        300.0,
        ge=0,
        description="How long training and evaluation wait for an environment that is down "
        "(probing it with backoff) before they stop; 0: stop at once.",
    )
    env_error_retries: int = Field(
        3,
        ge=0,
        description="Times an episode that ended in env_error is played again (same task and "
        "seed), in training and evaluation alike: at once while few failed, after the env "
        "answers a probe when trainer.outage_fraction of them failed. What still fails: an "
        "outage stops training, an evaluation is partial.",
    )

    @model_validator(mode="after")
    def _turn_fits(self) -> RolloutConfig:
        if self.max_new_tokens >= self.max_context_tokens:
            raise ValueError(
                f"max_new_tokens ({self.max_new_tokens}) must be below "
                f"max_context_tokens ({self.max_context_tokens})"
            )
        return self


class TrainerConfig(_Block):
    """The update loop: batch shape, optimizer, checkpoints."""

    steps: int = Field(100, gt=0, description="Number of updates.")
    tasks_per_step: int = Field(8, gt=0, description="Distinct tasks sampled per update.")
    group_size: int = Field(
        8, gt=0, description="Episodes per task per update (GRPO/RLOO groups need > 1)."
    )
    lr: float = Field(1e-4, gt=0, description="Peak learning rate (AdamW).")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    lr_schedule: Literal["constant", "linear", "cosine"] = Field(
        "constant", description="Learning-rate decay after warmup, to 0 at the last step."
    )
    warmup_steps: int = Field(0, ge=0, description="Updates of linear warmup from 0 to `lr`.")
    epochs: int = Field(1, gt=0, description="Passes over each step's trajectories (PPO epochs).")
    mini_batches: int = Field(
        1, gt=0, description="Optimizer steps per epoch; trajectories are split evenly."
    )
    micro_batch_tokens: int = Field(
        8192, gt=0, description="Packed tokens per forward pass (gradient accumulation unit)."
    )
    row_tokens: int | None = Field(
        None,
        gt=0,
        description="Width of a packed row; null: the longest trajectory of the update "
        "(attention cost grows with the width, so wider rows only pay off for short sequences).",
    )
    logprob_chunk_tokens: int | None = Field(
        None,
        ge=0,
        description="Agent tokens the output head runs on at a time in the learner's forward "
        "passes: each chunk's [tokens, vocab] logits are made, used and, in the backward "
        "pass, made again rather than kept, so the logits' memory follows the chunk instead "
        "of the micro-batch's agent tokens, for one more head matmul. Worth it where the "
        "vocabulary is large (Qwen2.5: 151,936 ids; 1024 is a fair start; docs/gpu.md); "
        "null or 0: the head runs on all agent tokens at once. Values differ from those by "
        "float rounding only.",
    )
    packing: Literal["auto", "shared", "padded"] = Field(
        "auto",
        description="shared: several trajectories per row, each attending only to itself "
        "(transformers builds the block-diagonal mask from the restarting position ids under "
        "every kernel; no padding; fast where the kernel skips the masked blocks: "
        "flash_attention_2/3, flex_attention); padded: one per row, right-padded, plain causal "
        "attention (SDPA's fused kernels, which a dense block-diagonal mask loses; faster on "
        "the CPU); auto: shared under flash_attention_2/3 and flex_attention, else padded.",
    )
    share_prompts: bool | Literal["auto"] = Field(
        "auto",
        description="Trajectories that begin with the same prompt (a group's first turn) "
        "compute it once in the learner's forward pass: its keys and values are computed "
        "once and each trajectory's row attends to them (same values, fewer tokens); auto: "
        "on with one trajectory per row (packing: padded), sdpa or eager attention and one "
        "process; true where one of those is missing is an error.",
    )
    max_grad_norm: float | None = Field(
        1.0, gt=0, description="Gradient clipping norm; null: no clipping."
    )
    checkpoint_every: int = Field(
        50, ge=0, description="Save a checkpoint every N updates and at the end; 0: only at end."
    )
    keep_checkpoints: int | None = Field(
        None, gt=0, description="Keep only the newest N checkpoints; null: keep all."
    )
    eval_every: int = Field(0, ge=0, description="Evaluate every N updates; 0: never mid-run.")
    resume: bool = Field(
        True,
        description="Continue from the newest checkpoint in run.output_dir if any, and take "
        "a finished stage's outcome from its stage_outcome.json instead of running it again.",
    )
    max_staleness: int = Field(
        0,
        ge=0,
        description="Rollouts of the next updates play while the learner trains, on weights "
        "at most this many updates old (decoupled PPO corrects for it); 0: rollout, then "
        "update, in turn.",
    )
    behaviour_logprobs: Literal["auto", "recomputed", "sampler"] = Field(
        "auto",
        description="With max_staleness > 0: the behaviour log-probabilities decoupled PPO "
        "weighs against. sampler: as the policy reported them; their last bits depend on which "
        "requests shared a batch, so on timing. recomputed: one packed forward pass of the "
        "sampling weights over the finished batch, the same however it was batched (exact "
        "resume under any load). auto: recomputed for a policy that computes as the learner "
        "does (hf), the engine's own numbers otherwise (vllm: the weight then also corrects "
        "the engine's numerics).",
    )
    rollout_worker: Literal["thread", "process"] = Field(
        "thread",
        description="With max_staleness > 0: where rollouts play: a thread of this process "
        "(right when generation has its own device), or a child process with its own model "
        "copy (on a CPU, where a thread would share the interpreter lock with the learner).",
    )
    importance_cap: float = Field(
        2.0,
        ge=1,
        description="With max_staleness > 0: the bound of the behaviour importance weight "
        "pi_proximal / pi_behaviour (at least 1: a lower cap would shrink tokens the "
        "learner now likes better).",
    )
    importance_mode: Literal["truncate", "mask"] = Field(
        "truncate",
        description="With max_staleness > 0: truncate: a weight above importance_cap becomes "
        "the cap (truncated importance sampling, as IMPALA and verl); mask: the token is left "
        "out of the loss (weight 0, as AReaL).",
    )
    outage_fraction: float = Field(
        0.5,
        gt=0,
        le=1,
        description="An update whose episodes end in env_error this often (or more) is an "
        "outage: they are played again once the env answers (rollout.env_recovery_s, "
        "rollout.env_error_retries); one still an outage after that stops the run, untrained.",
    )

    @model_validator(mode="after")
    def _batch_fits(self) -> TrainerConfig:
        episodes = self.tasks_per_step * self.group_size
        if self.mini_batches > episodes:
            raise ValueError(
                f"mini_batches ({self.mini_batches}) exceeds the episodes per update "
                f"(tasks_per_step * group_size = {episodes})"
            )
        return self


class EvalConfig(_Block):
    """Evaluation on a held-out split, reporting Avg@k and Pass@k."""

    split: str = Field("test", min_length=1, description="Task split to evaluate.")
    num_tasks: int | None = Field(None, gt=0, description="First N tasks of the split; null: all.")
    env_error_retries: int | None = Field(
        None,
        ge=0,
        description="Times an episode that ended in env_error is played again, as in "
        "training; null: rollout.env_error_retries. What still fails makes the result partial.",
    )
    k: int = Field(1, gt=0, description="Samples per task (Avg@k, Pass@k).")
    max_turns: int | None = Field(
        None, gt=0, description="Turn limit; null: the scheduler's horizon at the last step."
    )
    greedy: bool = Field(False, description="Greedy decoding instead of sampling.")
    temperature: float = Field(1.0, gt=0, description="Sampling temperature when not greedy.")
    constrained: bool | None = Field(
        None,
        description="Restrict decoding to the env's valid actions; null: as rollout.constrained. "
        "false: the env gets exactly what the model writes, as a prompted LLM is measured.",
    )


class TrackingConfig(_Block):
    """Where metrics and trajectories go (MLflow)."""

    uri: str | None = Field(
        None, description="MLflow tracking URI; null: a SQLite store in run.output_dir."
    )
    experiment: str = Field("agentgym", min_length=1, description="MLflow experiment name.")
    log_trajectories: int = Field(
        8, ge=0, description="Trajectories logged per update and evaluation; 0: none."
    )
    log_eval_trajectories: int | None = Field(
        None,
        ge=0,
        description="Episodes of each evaluation logged as JSONL (for `agentgym view`); null: "
        "log_trajectories. MLflow traces keep to log_trajectories either way.",
    )
    traces: bool = Field(True, description="Also log trajectories as MLflow traces.")
    tags: dict[str, str] = Field(
        default_factory=dict, description="Extra MLflow tags set on the run."
    )
    save_rollouts: bool = Field(
        False,
        description="Write every trajectory of the stage (each update's rollouts, an eval "
        "stage's episodes) as JSONL under run.output_dir/rollouts; DPO's pairs_from reads them.",
    )
    frames: int = Field(
        0,
        ge=0,
        description="Episodes per update and per evaluation that keep a frame of the env's "
        "render() after reset and every turn (the logged ones first; images at most 256 px a "
        "side), for `agentgym view`; 0: none.",
    )


class EvolveConfig(_Block):
    """AgentEvol (AgentGym, arXiv 2406.04151), for a stage of `type: evolve`.

    Round 0 fine-tunes on the algorithm's data (behaviour cloning); each later
    round first explores the train tasks with the newest model, keeps the
    rewarded episodes, and fine-tunes on the data plus everything kept so far.
    """

    iterations: int = Field(
        2, ge=0, description="Explore-then-fine-tune rounds after the first fine-tune."
    )
    split: str = Field("train", min_length=1, description="Task split explored.")
    num_tasks: int | None = Field(None, gt=0, description="First N tasks of the split; null: all.")
    samples: int = Field(1, gt=0, description="Episodes per task in each exploration.")
    greedy: bool = Field(True, description="Greedy exploration (AgentGym's); false: sampling.")
    temperature: float = Field(1.0, gt=0, description="Sampling temperature when not greedy.")
    max_turns: int = Field(10, gt=0, description="Turn limit of an exploration episode.")
    min_reward: float | None = Field(
        None, description="Keep episodes with at least this reward; null: the successful ones."
    )
    per_task: int = Field(
        1, gt=0, description="Episodes kept per task and round (AgentGym keeps one)."
    )
    restart: Literal["start", "previous"] = Field(
        "start",
        description="Fine-tune each round from the stage's starting model (AgentGym's choice, "
        "against overfitting) or continue from the previous round's.",
    )


class StageConfig(_Block):
    """One step of a pipeline: partial overrides of the top-level blocks."""

    name: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$",
        description="Stage name; also the stage's sub-folder of run.output_dir.",
    )
    type: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$",
        description="A registered stage kind: `train` (then save; SFT and DPO too), `eval` "
        "(only evaluate), `evolve` (AgentEvol rounds, see `evolve`), or a plugin's "
        "(`agentgym plugins` lists them).",
    )
    options: dict[str, Any] | None = Field(
        None, description="Options of the stage's kind, validated by the kind's own model."
    )
    run: dict[str, Any] | None = Field(None, description="Overrides of `run`.")
    model: dict[str, Any] | None = Field(None, description="Overrides of `model`.")
    env: dict[str, Any] | None = Field(None, description="Overrides of `env`.")
    policy: dict[str, Any] | None = Field(None, description="Overrides of `policy`.")
    algorithm: dict[str, Any] | None = Field(None, description="Overrides of `algorithm`.")
    scheduler: dict[str, Any] | None = Field(None, description="Overrides of `scheduler`.")
    rollout: dict[str, Any] | None = Field(None, description="Overrides of `rollout`.")
    trainer: dict[str, Any] | None = Field(None, description="Overrides of `trainer`.")
    eval: dict[str, Any] | None = Field(None, description="Overrides of `eval`.")
    tracking: dict[str, Any] | None = Field(None, description="Overrides of `tracking`.")
    evolve: dict[str, Any] | None = Field(None, description="Overrides of `evolve`.")

    def overrides(self) -> dict[str, dict[str, Any]]:
        """The blocks this stage changes, keyed by block name."""
        skip = {"name", "type", "options"}
        return {k: v for k, v in self if k not in skip and v is not None}


class AgentGymConfig(_Block):
    """A whole run (or pipeline of stages): the root of every config file."""

    run: RunConfig = Field(default_factory=RunConfig, description="Name, output folder, seed.")
    model: ModelConfig = Field(description="The model to train or evaluate.")
    env: ComponentBlock = Field(description="Environment plugin and its options.")
    policy: ComponentBlock = Field(
        default_factory=lambda: ComponentBlock(name="hf"),
        description="Generation backend plugin and its options.",
    )
    algorithm: ComponentBlock | None = Field(
        None, description="Training algorithm plugin and its options; train stages need one."
    )
    scheduler: ComponentBlock | None = Field(
        None,
        description="Horizon scheduler plugin (turn limit per update) and its options; "
        "train stages need one, evaluation may use eval.max_turns instead.",
    )
    rollout: RolloutConfig = Field(default_factory=RolloutConfig, description="Episode play.")
    trainer: TrainerConfig = Field(default_factory=TrainerConfig, description="Update loop.")
    eval: EvalConfig = Field(default_factory=EvalConfig, description="Evaluation.")
    tracking: TrackingConfig = Field(default_factory=TrackingConfig, description="MLflow.")
    evolve: EvolveConfig = Field(
        default_factory=EvolveConfig, description="AgentEvol rounds of `type: evolve` stages."
    )
    stages: list[StageConfig] | None = Field(
        None, description="Pipeline stages run in order; null: one `train` stage."
    )

    @field_validator("stages")
    @classmethod
    def _unique_stage_names(cls, stages: list[StageConfig] | None) -> list[StageConfig] | None:
        names = [s.name for s in stages or []]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"stage names must be unique; used more than once: {twice}")
        return stages


def schema_defaults() -> dict[str, Any]:
    """Plain defaults of every block that has them, so `${}` can refer to unwritten keys."""
    out: dict[str, Any] = {}
    for name, field in AgentGymConfig.model_fields.items():
        if field.is_required() or name == "stages":
            continue
        value = field.get_default(call_default_factory=True)
        out[name] = value.model_dump(mode="json") if isinstance(value, BaseModel) else value
    out["run"]["output_dir"] = "runs/${run.name}"
    return out
