"""A scenario of the results harness: one YAML file in `benchmarks/results/configs/`.

A scenario names the agentgym config every arm shares (`config`), the arms
(each a few overrides of it, e.g. its horizon schedule), the evaluations run
before and after training (each an `eval` block, plus `env:` options of its own
if it needs them), the tiny model to build, the seeds, and the paper's numbers
to print beside ours. Every arm of a seed starts from the
same model, unless it sizes its own (`model:`, over the scenario's); `start: <arm>`
arms start from that seed's checkpoint of the arm named (`start: sft`: the `sft` arm's).
`pretrained: NAME` starts every seed from a real model instead (`agentgym model fetch NAME`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from agentgym_core.config.stages import merge_blocks

CONFIGS = Path(__file__).resolve().parent.parent / "results" / "configs"
UNTRAINED = "untrained"


@dataclass
class Arm:
    """One way to train: overrides of the shared config, and where it starts."""

    name: str
    label: str
    overrides: dict[str, Any]
    start: str = "scratch"  # or an arm's name (`sft`): the seed's checkpoint of that arm
    train: bool = True  # False: evaluate the start model only (`untrained`, `sft` is trained)
    stage: str = "train"  # or "evolve": AgentEvol rounds (the `evolve` block of the overrides)
    model: dict[str, Any] = field(default_factory=dict)  # over the scenario's (a wider student)

    @property
    def stage_boundaries(self) -> list[int]:
        """Updates where a ScalingInter schedule lengthens the horizon (for the plot)."""
        scheduler = self.overrides.get("scheduler", {})
        stages = scheduler.get("stages", []) if scheduler.get("name") == "scaling_inter" else []
        return [stage["until_step"] for stage in stages[:-1]]


@dataclass
class Scenario:
    """Everything the harness needs to run and report one scenario."""

    name: str
    title: str
    why: str
    seeds: list[int]
    model: dict[str, Any]
    corpus: dict[str, Any]
    config: dict[str, Any]
    evals: dict[str, dict[str, Any]]
    arms: dict[str, Arm]
    metric: str = "success_rate"
    metric_label: str = "success"
    paper: dict[str, Any] = field(default_factory=dict)
    smoke: dict[str, Any] = field(default_factory=dict)
    compare: dict[str, list[str]] = field(default_factory=dict)
    """Arm -> arms it is compared with, seed by seed (the report's paired differences)."""
    pretrained: str | None = None
    """A real model every arm from scratch starts from (`agentgym model fetch` name), instead
    of the tiny model `model` and `corpus` size."""

    def arm_model(self, arm: Arm) -> dict[str, Any]:
        """The tiny model an arm from scratch starts from: the scenario's, with the arm's sizes."""
        return {**self.model, **arm.model}

    def arm_config(self, arm: Arm, *, smoke: bool = False) -> dict[str, Any]:
        """The agentgym config of one arm (without run paths, model path and stages).

        `smoke` overrides apply to every arm, and `smoke.arms.<name>` to that arm only.
        """
        config = merge_blocks(self.config, arm.overrides)
        if not smoke:
            return config
        shared = {k: v for k, v in self.smoke.items() if k != "arms"}
        return merge_blocks(
            merge_blocks(config, shared), self.smoke.get("arms", {}).get(arm.name, {})
        )


def load_scenario(name: str, directory: Path = CONFIGS) -> Scenario:
    """Read `<directory>/<name>.yaml`; unknown names list the scenarios there."""
    path = directory / f"{name}.yaml"
    if not path.exists():
        known = ", ".join(scenario_names(directory)) or "none"
        raise SystemExit(f"unknown scenario {name!r}; scenarios: {known}")
    data = yaml.safe_load(path.read_text())
    arms = {UNTRAINED: Arm(UNTRAINED, "untrained", {}, train=False)}
    for arm_name, spec in data.pop("arms").items():
        spec = dict(spec or {})
        arms[arm_name] = Arm(
            arm_name,
            spec.pop("label", arm_name),
            spec.pop("overrides", {}),
            start=spec.pop("start", "scratch"),
            stage=spec.pop("stage", "train"),
            model=spec.pop("model", {}),
        )
        if (stage := arms[arm_name].stage) not in ("train", "evolve"):
            raise SystemExit(f"{path}: arms.{arm_name}.stage: train or evolve, not {stage!r}")
        if spec:
            raise SystemExit(f"{path}: arms.{arm_name}: unknown keys {sorted(spec)}")
    for arm in arms.values():
        if arm.start != "scratch" and (arm.start not in arms or arm.start == UNTRAINED):
            trained = ", ".join(a for a in arms if a != UNTRAINED)
            raise SystemExit(
                f"{path}: arms.{arm.name}.start: scratch or an arm that trains ({trained}), "
                f"not {arm.start!r}"
            )
        if arm.model and arm.start != "scratch":
            raise SystemExit(
                f"{path}: arms.{arm.name}.model: only an arm from scratch builds its own model; "
                f"this one starts from {arm.start!r}'s checkpoint"
            )
    check_models(data.get("model", {}), arms, path)
    check_paper(data.get("paper", {}), path)
    check_evals(data.get("evals", {}), path)
    for first, others in data.get("compare", {}).items():
        unknown = sorted({first, *others} - set(arms))
        if unknown:
            known = ", ".join(arms)
            raise SystemExit(f"{path}: compare.{first}: unknown arms {unknown}; arms: {known}")
    return Scenario(name=name, arms=arms, **data)


def check_paper(paper: dict[str, Any], path: Path) -> None:
    """Each paper row is a name and one value per column.

    An unquoted comma in a YAML flow mapping (`{name: a (b, c), ...}`) ends the
    name and adds a key; caught here rather than printed as a cut-off row.
    """
    columns = len(paper.get("columns", []))
    for index, row in enumerate(paper.get("rows", [])):
        where = f"{path}: paper.rows.{index}"
        if set(row) != {"name", "values"}:
            raise SystemExit(f"{where}: keys must be name and values, got {sorted(map(str, row))}")
        if len(row["values"]) != columns:
            raise SystemExit(f"{where}: {len(row['values'])} values for {columns} columns")


def check_models(model: dict[str, Any], arms: dict[str, Arm], path: Path) -> None:
    """The scenario's model, and each arm's over it, are valid `TinyModelConfig`s."""
    from pydantic import ValidationError

    from agentgym_core.config.errors import pydantic_problems
    from agentgym_core.modeling.tiny import TinyModelConfig

    for where, sizes in [(("model",), model)] + [
        (("arms", arm.name, "model"), {**model, **arm.model}) for arm in arms.values() if arm.model
    ]:
        try:
            TinyModelConfig.model_validate(sizes)
        except ValidationError as error:
            problems = pydantic_problems(error, TinyModelConfig, where)
            raise SystemExit(f"{path}: " + "; ".join(map(str, problems))) from None


def check_evals(evals: dict[str, Any], path: Path) -> None:
    """Each evaluation is a valid `eval` block (split, k, max_turns, constrained, ...).

    Its `env` (a mapping) sets env options for that evaluation alone, merged over the
    arm's `env` block (say `list_actions: true`); the env plugin validates them when
    the run's config is loaded, with their stage's key path.
    """
    from pydantic import ValidationError

    from agentgym_core.config.errors import pydantic_problems
    from agentgym_core.config.schema import EvalConfig

    for name, spec in evals.items():
        spec, env = eval_parts(spec)
        if not isinstance(env, dict) or "name" in env:
            raise SystemExit(
                f"{path}: evals.{name}.env: a mapping of env options (the env's `name` "
                "is the arm's)"
            )
        try:
            EvalConfig.model_validate(spec)
        except ValidationError as error:
            problems = pydantic_problems(error, EvalConfig, ("evals", name))
            raise SystemExit(f"{path}: " + "; ".join(map(str, problems))) from None


def eval_parts(spec: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """An evaluation of a scenario split in two: its `eval` block, and its own env options."""
    block = dict(spec)
    return block, block.pop("env", {})


def scenario_names(directory: Path = CONFIGS) -> list[str]:
    """Every scenario with a YAML file."""
    return sorted(path.stem for path in directory.glob("*.yaml"))
