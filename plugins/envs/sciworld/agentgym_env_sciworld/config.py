"""Options of the `sciworld` environment."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from agentgym_env_sciworld.tasks import DEFAULT_TASK_TYPES, resolve_type

SIMPLIFICATIONS = (
    "teleportAction",
    "selfWateringFlowerPots",
    "openContainers",
    "openDoors",
    "noElectricalAction",
    "easy",
)
"""ScienceWorld's simplifications; `easy` turns on all of them."""


class SciWorldConfig(BaseModel):
    """Which ScienceWorld tasks to play, and how the simulator's JVM is run."""

    model_config = ConfigDict(extra="forbid")

    tasks: list[str] = Field(
        default_factory=lambda: list(DEFAULT_TASK_TYPES),
        min_length=1,
        description="Task types by name (`boil`) or number (`1-1`); default: the 23 types "
        "AgentGym uses (all but grow-plant/fruit, inclined planes and Mendelian genetics).",
    )
    max_variations: int | None = Field(
        None,
        gt=0,
        description="At most this many variations per task type and split (the first ones of "
        "ScienceWorld's split); null: all. Types range from 4 to 692 train variations.",
    )
    simplifications: list[str] = Field(
        default_factory=list,
        description="ScienceWorld simplifications, e.g. [openDoors] or [easy]; none by default, "
        "as in AgentGym and the paper.",
    )
    max_moves: int | None = Field(
        None,
        gt=0,
        description="End the episode (truncated) once the simulator has run more than this many "
        "moves (`wait` counts 10); null: no limit, the turn horizon ends episodes. The "
        "package's envStepLimit of 100 cuts the gold paths of tasks that wait (melting mercury "
        "takes about 140 moves).",
    )
    list_valid_actions: bool = Field(
        False,
        description="valid_actions() returns ScienceWorld's valid action-object combinations "
        "(300 to 9,000 strings, tens of ms to enumerate) so decoding can be constrained to "
        "them; false: None, free-text actions as in AgentGym.",
    )
    instruction: str | None = Field(
        None,
        description="Instruction prompt opening each conversation; null: the built-in one "
        "(the action syntax).",
    )
    recycle_after: int = Field(
        100,
        gt=0,
        description="Episodes one worker process (and its JVM) plays before it is replaced by a "
        "fresh one, which bounds the JVM's memory growth.",
    )
    jvm_heap_mb: int = Field(
        768,
        ge=128,
        description="Maximum Java heap of each simulator (-Xmx). Without it the JVM may take a "
        "quarter of the machine's memory (3.5 GB resident measured on a 24 GB machine).",
    )
    deterministic: bool = Field(
        True,
        description="Run the JVM with constant identity hash codes so objects are listed in a "
        "fixed order: the same task and actions give the same text in every process. "
        "False: ScienceWorld's own (process-dependent) order; steps about 20% faster.",
    )
    java: str = Field("java", min_length=1, description="The Java executable (17 works).")
    jvm_options: list[str] = Field(
        default_factory=list, description="Extra JVM options, e.g. [-XX:+UseSerialGC]."
    )
    call_timeout_s: float = Field(
        120.0,
        gt=0,
        description="Seconds one call to the worker may take (JVM start included); past it "
        "the worker is killed and the call raises.",
    )

    @field_validator("tasks")
    @classmethod
    def _known_tasks(cls, tasks: list[str]) -> list[str]:
        names = [resolve_type(t) for t in tasks]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"task types listed more than once: {twice}")
        return names

    @field_validator("simplifications")
    @classmethod
    def _known_simplifications(cls, values: list[str]) -> list[str]:
        for value in values:
            if value not in SIMPLIFICATIONS:
                raise ValueError(
                    f"unknown simplification {value!r}; valid: {', '.join(SIMPLIFICATIONS)}"
                )
        return values

    @model_validator(mode="after")
    def _electrical_tasks_keep_their_actions(self) -> SciWorldConfig:
        if "noElectricalAction" in self.simplifications:
            electrical = [t for t in self.tasks if "power-component" in t or "conductivity" in t]
            if electrical:
                raise ValueError(
                    f"simplification noElectricalAction removes the `connect` actions that "
                    f"tasks {electrical} need; drop it or those tasks"
                )
        return self

    def java_command_options(self) -> list[str]:
        """JVM options for the simulator process."""
        options = [f"-Xmx{self.jvm_heap_mb}m"]
        if self.deterministic:
            # hashCode=2: every identity hash is 1, so ScienceWorld's hash sets iterate in
            # insertion order instead of an order drawn from per-thread random state.
            options += ["-XX:+UnlockExperimentalVMOptions", "-XX:hashCode=2"]
        return options + list(self.jvm_options)
