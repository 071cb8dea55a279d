"""Run one (scenario, arm, seed) of the results harness and keep its result as JSON.

A finished run's JSON (`<data>/<scenario>/<arm>-seed<k>.json`) is its record:
the harness skips it when run again, so a sweep stopped midway (or over
several sessions) resumes where it stopped. Models, checkpoints and MLflow
stores go under `<work>/` and may be deleted; the JSON keeps what the tables
and curves need: the training curve per update, every evaluation per level,
and the cost (training wall time, env steps, sampled tokens).

An evaluation added to a scenario after a run was kept is run on that run's
final checkpoint; when `<work>/` no longer has it, the run is trained again
(seeded, so it should give the kept curve) and its JSON says whether it did.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import time
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from agentgym_core import hookimpl
from agentgym_core.tracking.mlflow_tracker import ARTIFACTS_DIR, STORE_FILE
from benchmarks.harness.cpu_share import CpuShare
from benchmarks.harness.spec import Arm, Scenario, eval_parts

CURVE_KEYS = {
    "success": "rollout/success_rate",
    "reward": "rollout/reward_mean",
    "turns": "rollout/turns_mean",
    "horizon": "rollout/horizon",
    "episodes": "rollout/episodes",
    "env_errors": "rollout/env_errors",
    "tokens": "rollout/generated_tokens",
    "seconds": "step_seconds",
    "loss": "train/loss",
    "expert_env_steps": "data/expert_env_steps",
    "roll_in_env_steps": "data/roll_in_env_steps",
    "takeovers_kept": "data/takeovers_kept",
}


@dataclass
class CurveRecorder:
    """A hook plugin that keeps each update's training metrics.

    With `log`, every point is also appended there as it comes, so the curve of
    a run that is killed and resumed from a checkpoint keeps its earlier updates.
    """

    points: list[dict[str, float]] = field(default_factory=list)
    log: Path | None = None

    @hookimpl
    def agentgym_after_update(self, step: int, metrics: dict[str, float]) -> None:
        """Keep the step's rollout numbers (train success, turns, horizon, tokens).

        The console has a line per update already (`agentgym train` prints them).
        """
        point = {"step": step}
        point.update({key: metrics[name] for key, name in CURVE_KEYS.items() if name in metrics})
        point.update(group_success(metrics))
        self.points.append(point)
        if self.log is not None:
            with self.log.open("a") as out:
                out.write(json.dumps(point) + "\n")


def group_success(metrics: dict[str, float]) -> dict[str, float]:
    """Training success per task group (`success/<group>`), so a run whose held-out success
    falls while its training success rises can be read task by task."""
    prefix, suffix = "rollout/group/", "/success_rate"
    return {
        f"success/{name[len(prefix) : -len(suffix)]}": value
        for name, value in metrics.items()
        if name.startswith(prefix) and name.endswith(suffix)
    }


def logged_points(log: Path) -> dict[int, dict[str, float]]:
    """Points an earlier process of this run logged, by step (a replayed step: its last)."""
    if not log.exists():
        return {}
    points = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    return {point["step"]: point for point in points}


def whole_curve(
    earlier: dict[int, dict[str, float]], points: list[dict[str, float]]
) -> tuple[list[dict[str, float]], float]:
    """This process's points after the earlier ones it did not replay; and those ones' seconds.

    A resumed run starts again from its last checkpoint, so the updates an
    earlier process made after that checkpoint are replayed here (resume is
    exact) and this process's copy is kept.
    """
    first = points[0]["step"] if points else None
    kept = [point for step, point in sorted(earlier.items()) if first is None or step < first]
    return kept + points, sum(point.get("seconds", 0.0) for point in kept)


@dataclass
class Paths:
    """Where results (kept) and working files (disposable) go."""

    data: Path
    work: Path

    def result(self, scenario: str, arm: str, seed: int) -> Path:
        """The JSON record of one run."""
        return self.data / scenario / f"{arm}-seed{seed}.json"

    def run_dir(self, scenario: str, arm: str, seed: int) -> Path:
        """Working folder of one run (checkpoints, MLflow store)."""
        return self.work / scenario / f"seed{seed}" / arm


def build_model(
    scenario: Scenario,
    seed: int,
    out: Path,
    host: Any,
    *,
    smoke: bool,
    sizes: dict[str, Any] | None = None,
) -> Path:
    """The seed's starting model: a tiny Qwen2 with a tokenizer trained on the env's text,
    or the scenario's pretrained model.

    `sizes`: the model's dimensions (default: the scenario's); the tokenizer is the
    same whatever the sizes, as it is trained on the same text.
    """
    from agentgym_core.modeling.tiny import TinyModelConfig, env_corpus, init_model

    if scenario.pretrained:  # a real model, the same for every seed
        from agentgym_core.modeling.fetch import fetch

        return fetch(scenario.pretrained, log=None)
    if (out / "config.json").exists():
        return out
    options = dict(scenario.arm_config(scenario.arms["untrained"], smoke=smoke)["env"])
    registration = host.registry.get("environment", options.pop("name"))
    env = registration.factory(registration.config.model_validate(options))
    try:
        corpus = dict(scenario.corpus)
        tasks = list(env.tasks("train"))[: corpus.pop("tasks", 300)]
        texts = env_corpus(env, tasks, seed=seed, **corpus)
    finally:
        env.close()
    sizes = scenario.model if sizes is None else sizes
    return init_model(texts, out, TinyModelConfig(**{**sizes, "seed": seed}))


def pipeline_config(
    scenario: Scenario,
    arm: Arm,
    seed: int,
    model: Path,
    run_dir: Path,
    *,
    smoke: bool,
    evals: list[str] | None = None,
) -> dict[str, Any]:
    """The full agentgym config of a run: the arm's config, paths, seed and stages.

    `evals`: the scenario's evaluations to run (default: all of them).
    """
    config = scenario.arm_config(arm, smoke=smoke)
    config.setdefault("run", {}).update(
        name=f"{scenario.name}-{arm.name}-seed{seed}", seed=seed, output_dir=str(run_dir)
    )
    config["model"] = {**config.get("model", {}), "path": str(model)}
    stages = [{"name": "train", "type": arm.stage}] if arm.train else []
    for name in scenario.evals if evals is None else evals:
        spec, env = eval_parts(scenario.evals[name])  # env: its own options, over the arm's
        if smoke:  # a few tasks, one sample: the smoke run checks the path, not the numbers
            spec = {**spec, "num_tasks": 4, "k": 1}
        stage = {"name": f"eval-{name}", "type": "eval", "eval": whole_eval(spec)}
        if env:
            stage["env"] = dict(env)
        stages.append(stage)
    config["stages"] = stages
    config["eval"] = dict(stages[-1]["eval"])  # the root must validate too (each block is whole)
    return config


def whole_eval(spec: dict[str, Any]) -> dict[str, Any]:
    """An evaluation's block with every key written out (defaults included).

    A stage's block is merged over the root's, which is the last evaluation's: a key
    that only the last one sets (say `constrained: false`) would reach every other.
    """
    from agentgym_core.config.schema import EvalConfig

    return EvalConfig.model_validate(spec).model_dump()


def run_pipeline_once(config: dict[str, Any], run_dir: Path, host: Any) -> tuple[list, list, float]:
    """Run the pipeline of `config` (written to `run_dir/harness.yaml`).

    Returns the stages, the whole training curve (earlier processes' updates
    too, when this one resumed a killed run) and the step seconds of those
    earlier updates.
    """
    from agentgym_core.config.load import load_config
    from agentgym_core.run.pipeline import run_pipeline

    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "harness.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    resolved = load_config(path, [], host.registry)
    log = run_dir / "curve.jsonl"
    earlier = logged_points(log)
    recorder = CurveRecorder(log=log)
    host.pm.register(recorder)
    try:
        stages = run_pipeline(resolved, host, show_progress=False)
    finally:
        host.pm.unregister(recorder)
    curve, earlier_seconds = whole_curve(earlier, recorder.points)
    return stages, curve, earlier_seconds


def eval_record(metrics: dict[str, float]) -> dict[str, Any]:
    """What a table needs of one evaluation: overall and per-group success and reward."""
    groups: dict[str, dict[str, float]] = {}
    for key, value in metrics.items():
        if key.startswith("group/"):
            _, group, name = key.split("/", 2)
            if name in ("success_rate", "mean_reward", "episodes"):
                groups.setdefault(group, {})[name] = value
    keep = ("success_rate", "mean_reward", "mean_turns", "episodes", "env_errors")
    return {**{key: metrics[key] for key in keep if key in metrics}, "groups": groups}


def cost(
    curve: list[dict[str, float]], train_seconds: float, explored: list[dict[str, float]] = ()
) -> dict[str, float]:
    """Training wall time, env steps (actions taken) and sampled tokens of a run.

    Env steps include the expert's when a stage made SFT data, and the model's in the
    episodes the expert took over (`expert.roll_in`). `explored`: an
    evolve stage's explorations (their `explore.json`), which play episodes
    outside the update curve.
    """
    steps = sum(
        p.get("turns", 0.0) * (p.get("episodes", 0.0) - p.get("env_errors", 0.0)) for p in curve
    )
    steps += sum(e.get("evolve/env_steps", 0.0) for e in explored)
    steps += sum(p.get("expert_env_steps", 0.0) for p in curve)  # making SFT data
    steps += sum(p.get("roll_in_env_steps", 0.0) for p in curve)  # the model's, taken over
    tokens = sum(p.get("tokens", 0.0) for p in curve)
    tokens += sum(e.get("evolve/sampled_tokens", 0.0) for e in explored)
    return {
        "train_seconds": round(train_seconds, 1),
        "updates": len(curve),
        "env_steps": round(steps),
        "sampled_tokens": round(tokens),
    }


def explorations(run_dir: Path) -> list[dict[str, float]]:
    """The exploration summaries of an evolve stage's rounds (none for other stages)."""
    from agentgym_core.run.evolve import EXPLORED

    paths = sorted((run_dir / "train").glob(f"round-*/{EXPLORED}"))
    return [json.loads(path.read_text()) for path in paths]


def machine() -> dict[str, Any]:
    """The conditions of a run: CPUs (their model, and whether they multiply bfloat16 in
    hardware: without, bfloat16 runs are several times slower), load when it started,
    versions."""
    from agentgym_core.modeling.cpu_bf16 import has_native_bf16

    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    return {
        "cpus": os.cpu_count(),
        "cpu_model": cpu_model(),
        "native_bf16": has_native_bf16(),
        "load_at_start": round(os.getloadavg()[0], 2),
        "python": platform.python_version(),
        "commit": commit,
    }


def cpu_model() -> str:
    """The CPU's model name (Linux), or the platform's processor string."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor()


def start_model(
    scenario: Scenario, arm: Arm, seed: int, paths: Paths, host: Any, *, smoke: bool
) -> Path:
    """The model an arm starts from: the seed's tiny model (sized as the arm says), or its
    `start` arm's checkpoint."""
    seed_dir = paths.work / scenario.name / f"seed{seed}"
    if arm.start == "scratch" and arm.model:
        sizes = scenario.arm_model(arm)
        return build_model(
            scenario, seed, seed_dir / f"model-{arm.name}", host, smoke=smoke, sizes=sizes
        )
    base = build_model(scenario, seed, seed_dir / "model", host, smoke=smoke)
    if arm.start == "scratch":
        return base
    checkpoint = final_checkpoint(paths, scenario.name, arm.start, seed)
    if checkpoint is None:  # the start arm's run was not kept here: train it (again)
        start = scenario.arms[arm.start]
        retrain(scenario, start, seed, paths, host, smoke=smoke)
        checkpoint = final_checkpoint(paths, scenario.name, arm.start, seed)
    return checkpoint


def final_checkpoint(paths: Paths, scenario: str, arm: str, seed: int) -> Path | None:
    """The model a kept run ended with, if the work folder still has it."""
    marker = paths.run_dir(scenario, arm, seed) / "final_checkpoint.txt"
    if not marker.exists():
        return None
    checkpoint = Path(marker.read_text().strip())
    return checkpoint if checkpoint.exists() else None


def run_arm(
    scenario: Scenario,
    arm: Arm,
    seed: int,
    paths: Paths,
    host: Any,
    *,
    smoke: bool = False,
) -> dict[str, Any]:
    """Run one arm for one seed, unless its result is kept already; returns the result."""
    result_path = paths.result(scenario.name, arm.name, seed)
    if result_path.exists():
        kept = json.loads(result_path.read_text())
        missing = [name for name in scenario.evals if name not in kept["evals"]]
        if missing:
            return add_evals(scenario, arm, seed, paths, host, kept, missing, smoke=smoke)
        return kept
    result = train_and_evaluate(scenario, arm, seed, paths, host, smoke=smoke)
    keep(paths, result)
    return result


def keep(paths: Paths, result: dict[str, Any]) -> None:
    """Write a result where the report and later sweeps find it."""
    path = paths.result(result["scenario"], result["arm"], result["seed"])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1))


def train_and_evaluate(
    scenario: Scenario, arm: Arm, seed: int, paths: Paths, host: Any, *, smoke: bool
) -> dict[str, Any]:
    """Run one arm for one seed from its start model; returns the result, not yet kept."""
    started = datetime.now(UTC).isoformat(timespec="seconds")
    conditions = machine()
    share = CpuShare()
    model = start_model(scenario, arm, seed, paths, host, smoke=smoke)
    run_dir = paths.run_dir(scenario.name, arm.name, seed)
    config = pipeline_config(scenario, arm, seed, model, run_dir, smoke=smoke)
    wall = time.perf_counter()
    stages, curve, earlier_seconds = run_pipeline_once(config, run_dir, host)
    conditions["others_cpu_share"] = share.others()
    trained = [s for s in stages if s.type != "eval"]
    if trained:
        (run_dir / "final_checkpoint.txt").write_text(str(trained[-1].model))
    result = {
        "scenario": scenario.name,
        "arm": arm.name,
        "seed": seed,
        "smoke": smoke,
        "started": started,
        "wall_seconds": round(time.perf_counter() - wall, 1),
        "machine": conditions,
        "config": config | {"run": {k: v for k, v in config["run"].items() if k != "output_dir"}},
        "curve": curve,
        "evals": {
            s.name.removeprefix("eval-"): eval_record(s.metrics) for s in stages if s.type == "eval"
        },
        "cost": cost(
            curve, earlier_seconds + sum(s.seconds for s in trained), explorations(run_dir)
        ),
    }
    if explored := explorations(run_dir):
        result["explorations"] = explored
    result["config"].pop("model", None)
    if arm.model:  # a student sized apart from the scenario's
        result["model"] = scenario.arm_model(arm)
    return result


def add_evals(
    scenario: Scenario,
    arm: Arm,
    seed: int,
    paths: Paths,
    host: Any,
    kept: dict[str, Any],
    missing: list[str],
    *,
    smoke: bool,
) -> dict[str, Any]:
    """Run the evaluations `missing` from a kept result on the model that run ended with.

    Without its checkpoint (or for an arm that does not train, whose start model is
    rebuilt), the run is trained and evaluated again instead: see `retrain`.
    """
    checkpoint = final_checkpoint(paths, scenario.name, arm.name, seed) if arm.train else None
    if checkpoint is None:
        return retrain(scenario, arm, seed, paths, host, smoke=smoke)
    run_dir = paths.run_dir(scenario.name, arm.name, seed) / "added-evals"
    evaluate_only = replace(arm, train=False)
    config = pipeline_config(
        scenario, evaluate_only, seed, checkpoint, run_dir, smoke=smoke, evals=missing
    )
    started = {"started": datetime.now(UTC).isoformat(timespec="seconds"), "machine": machine()}
    share = CpuShare()
    wall = time.perf_counter()
    stages, _, _ = run_pipeline_once(config, run_dir, host)
    started["machine"]["others_cpu_share"] = share.others()
    kept["evals"].update({s.name.removeprefix("eval-"): eval_record(s.metrics) for s in stages})
    seconds = round(time.perf_counter() - wall, 1)
    for name, stage in zip(missing, config["stages"], strict=True):
        kept.setdefault("added_evals", {})[name] = {
            **started,
            "wall_seconds": seconds,
            "model": "final checkpoint",
            "eval": stage["eval"],
            **({"env": stage["env"]} if "env" in stage else {}),
        }
    paths.result(scenario.name, arm.name, seed).write_text(json.dumps(kept, indent=1))
    return kept


REPRODUCED = ("success", "reward", "turns", "episodes", "tokens", "loss")
"""What a retrained run's curve must repeat, update by update, to be the kept run again: those
of them both runs recorded (an SFT run records only its loss; runs kept before the loss was
recorded, on 2026-11-28, none)."""


def retrain(
    scenario: Scenario, arm: Arm, seed: int, paths: Paths, host: Any, *, smoke: bool
) -> dict[str, Any]:
    """Train and evaluate a run again from scratch; with a kept result, say if it reproduced.

    `rerun_of` keeps the earlier run's start, commit and evaluations, and whether the
    new curve (`curve_compared`: what both recorded; `curve_equal` None: nothing, where
    either trained) and
    evaluations equal them. Runs are seeded, so they should; when they
    do not, the new numbers stand (the model evaluated is this one) and a warning says so.
    """
    path = paths.result(scenario.name, arm.name, seed)
    kept = json.loads(path.read_text()) if path.exists() else None
    clear_run_dir(paths.run_dir(scenario.name, arm.name, seed))
    result = train_and_evaluate(scenario, arm, seed, paths, host, smoke=smoke)
    if kept is not None:
        result["rerun_of"] = reproduction(kept, result, scenario.metric)
    keep(paths, result)
    rerun = result.get("rerun_of")
    if rerun and not (rerun["curve_equal"] and rerun["evals_equal"]):
        curve = "not compared" if rerun["curve_equal"] is None else rerun["curve_equal"]
        print(
            f"WARNING: {scenario.name} {arm.name} seed {seed} trained again does not repeat "
            f"its kept run, or its curve could not be compared (curve equal: {curve}, "
            f"evaluations: {rerun['evals']}); the new numbers replace the kept ones",
            flush=True,
        )
    return result


MLFLOW_STORE = (STORE_FILE, ARTIFACTS_DIR)
"""Kept when a run folder is cleared: MLflow keeps an open engine per SQLite file in a process."""


def clear_run_dir(run_dir: Path) -> None:
    """Remove what would make a run resume (checkpoints, curve log); keep its MLflow store."""
    if not run_dir.exists():
        return
    for entry in run_dir.iterdir():
        if entry.name in MLFLOW_STORE:
            continue
        if entry.is_dir():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def reproduction(kept: dict[str, Any], rerun: dict[str, Any], metric: str) -> dict[str, Any]:
    """How a rerun compares with the kept run it replaces (see `retrain`)."""

    def recorded(result: dict[str, Any]) -> set[str]:
        return {key for point in result["curve"] for key in point}

    compared = [key for key in REPRODUCED if key in recorded(kept) & recorded(rerun)]

    def trace(result: dict[str, Any]) -> list[dict[str, Any]]:
        return [{key: point.get(key) for key in compared} for point in result["curve"]]

    evals = {
        name: {"kept": record.get(metric), "rerun": rerun["evals"].get(name, {}).get(metric)}
        for name, record in kept["evals"].items()
    }
    return {
        "started": kept.get("started"),
        "commit": kept.get("machine", {}).get("commit"),
        "curve_equal": (
            trace(kept) == trace(rerun)
            if compared or not (kept["curve"] or rerun["curve"])
            else None
        ),
        "curve_compared": compared,
        "evals_equal": all(e["kept"] == e["rerun"] for e in evals.values()),
        "evals": evals,
    }
