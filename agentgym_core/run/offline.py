"""Offline training stages (SFT, DPO): a fixed dataset instead of rollouts.

A `train` stage whose algorithm says `needs.online = False` runs here. It
uses the online stage's Learner (model, AdamW, lr schedule, accelerate) and
the same checkpoints, so `stages: [sft, grpo, eval]` chain through
checkpoints and a resumed stage continues exactly: the examples of step t are
a pure function of (run.seed, t).

Saved rollouts: with `tracking.save_rollouts`, every trajectory of a stage
(each update's rollouts, or an eval stage's episodes) is written as JSONL
under `<run.output_dir>/rollouts/`; DPO's `pairs_from` reads them.
"""

from __future__ import annotations

import functools
import glob
import json
import random
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from agentgym_core import distributed, hookimpl
from agentgym_core.config.errors import ConfigError, Problem, dotted, pydantic_problems
from agentgym_core.data.agenttraj import (
    AgentTrajError,
    AgentTrajItem,
    Message,
    parse_items,
    tokenize,
    write_items,
)
from agentgym_core.data.expert import (
    ExpertEnvironment,
    ExpertRun,
    RollIn,
    cut_roll_in,
    expert_items,
    expert_items_in_processes,
)
from agentgym_core.data.relabel import relabelled_items
from agentgym_core.interfaces import OfflineAlgorithm
from agentgym_core.learner.learner import Learner
from agentgym_core.learner.sequence import Example, sequence_update
from agentgym_core.numerics import subnormals_flushed
from agentgym_core.plugins import PluginHost
from agentgym_core.rollout.chat import ChatFormat
from agentgym_core.run.components import build_components, load_configured_model
from agentgym_core.run.eval_stage import eval_settings
from agentgym_core.run.evaluate import EvalSettings, evaluate_model
from agentgym_core.run.kinds import StageContext, StageOutcome, last_metrics, raise_problems
from agentgym_core.run.rollout_step import rollout_settings
from agentgym_core.run.runtime import Checkpoints, open_learner, stage_progress
from agentgym_core.types import Trajectory

ROLLOUTS = "rollouts"
"""Sub-folder of a stage's output dir holding its saved trajectories."""
ROLL_INS = "roll_in.jsonl"
"""The starting model's episodes that a stage's expert took over, kept for a rerun."""

# -- saved rollouts ----------------------------------------------------------------------


def save_rollouts(path: Path, trajectories: Iterable[Trajectory]) -> Path:
    """Write trajectories as JSONL (`Trajectory.to_dict` per line), atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as out:
        for trajectory in trajectories:
            out.write(json.dumps(trajectory.to_dict(), ensure_ascii=False) + "\n")
    tmp.replace(path)
    return path


def read_rollouts(folder: Path) -> list[Trajectory]:
    """Every trajectory saved under `folder` (files in name order)."""
    return [t for path in sorted(folder.glob("*.jsonl")) for t in read_rollout_file(path)]


def read_rollout_file(path: Path) -> list[Trajectory]:
    """The trajectories of one JSONL file written by `save_rollouts`."""
    with path.open(encoding="utf-8") as lines:
        return [Trajectory.from_dict(json.loads(line)) for line in lines if line.strip()]


class RolloutRecorder:
    """Saves every trajectory of a stage: `step-000012.jsonl` per update, `eval-<split>.jsonl`."""

    def __init__(self, output_dir: Path) -> None:
        self.folder = Path(output_dir) / ROLLOUTS

    @hookimpl
    def agentgym_after_rollout(self, step: int, batch: Any, metrics: Mapping[str, float]) -> None:
        """Write the rollouts of update `step` (a resumed step overwrites its file)."""
        save_rollouts(self.folder / f"step-{step:06d}.jsonl", batch.trajectories)

    def save_evaluation(self, split: str, trajectories: Sequence[Trajectory]) -> Path:
        """Write an evaluation's episodes."""
        return save_rollouts(self.folder / f"eval-{split}.jsonl", trajectories)


def start_recording(resolved: Any, host: PluginHost) -> RolloutRecorder | None:
    """Register a recorder for this stage when `tracking.save_rollouts` is on."""
    if not resolved.root.tracking.save_rollouts:
        return None
    recorder = RolloutRecorder(Path(resolved.root.run.output_dir))
    host.pm.register(recorder, name=f"rollouts-{id(recorder)}")
    return recorder


def stop_recording(host: PluginHost, recorder: RolloutRecorder | None) -> None:
    """Unregister a recorder made by `start_recording` (None: nothing to do)."""
    if recorder is not None:
        host.pm.unregister(recorder)


# -- checks across stages ------------------------------------------------------------


def stage_algorithm(resolved: Any) -> Any | None:
    """A fresh instance of the config's algorithm (None without one)."""
    if "algorithm" not in resolved.components:
        return None
    registration, options = resolved.components["algorithm"]
    return registration.factory(options)


def is_offline(algorithm: Any) -> bool:
    """Whether an algorithm trains on a fixed dataset (`needs.online` False)."""
    return algorithm is not None and not algorithm.needs.online


def stage_prefix(resolved: Any, index: int) -> tuple[Any, ...]:
    """Key-path prefix of stage `index` in errors (`stages.1`), none for a config without stages."""
    return ("stages", index) if resolved.root.stages else ()


def source_problems(config: Any, prefix: Sequence[Any], earlier: Sequence[Any]) -> list[Problem]:
    """Every stage the config's offline algorithm reads from ran before and saves rollouts.

    Problems name the option (`stages.2.algorithm.pairs_from`) and the fix.
    """
    algorithm = stage_algorithm(config)
    if not is_offline(algorithm):
        return []
    before = {stage.name: stage for stage in earlier}
    problems = []
    for key, name in algorithm.source_stages().items():
        path = dotted((*prefix, "algorithm", key))
        if name not in before:
            known = ", ".join(before) or "none"
            problems.append(Problem(path, f"no earlier stage named {name!r} (earlier: {known})"))
        elif not before[name].config.root.tracking.save_rollouts:
            fix = dotted(("stages", before[name].index, "tracking.save_rollouts"))
            problems.append(
                Problem(path, f"stage {name!r} does not save its rollouts; set {fix}: true")
            )
    return problems


# -- the dataset services --------------------------------------------------------------


class StageData:
    """`OfflineDataset` for one stage: files, tokenization, expert episodes, earlier rollouts."""

    def __init__(
        self,
        resolved: Any,
        chat: ChatFormat,
        *,
        earlier: Mapping[str, Path],
        prefix: Sequence[Any],
        play: Callable[[str, int, int], list[Trajectory]] | None = None,
    ) -> None:
        self.resolved = resolved
        self.play = play
        """Plays (split, tasks, max_turns) with the stage's starting model: one sampled episode
        of each of the split's first tasks (what a roll-in takes over from)."""
        self.chat = chat
        self.earlier = dict(earlier)
        self.prefix = tuple(prefix)
        self.seed = resolved.root.run.seed
        self.output_dir = Path(resolved.root.run.output_dir)
        self.expert_env_steps = 0
        """Env steps the expert took to make this stage's data (a cost of the SFT rows)."""
        self.roll_in_env_steps = 0
        """Env steps the stage's model took in the episodes the expert took over."""
        self.takeovers: dict[str, int] = {}
        """Counts of the takeovers: episodes played, cut, diverged on replay, kept."""
        self.relabelled_copies = 0
        """Relabelled copies made (`relabelled`)."""

    def error(self, key: str, message: str) -> ConfigError:
        """A config error at `algorithm.<key>` of this stage."""
        path = dotted((*self.prefix, "algorithm", *([key] if key else [])))
        source = self.resolved.source
        return ConfigError([Problem(path, message)], str(source) if source else None)

    def files(self, patterns: Sequence[str], key: str) -> list[Path]:
        """Paths and globs (relative to the working directory), each matching at least one file."""
        found: list[Path] = []
        for index, pattern in enumerate(patterns):
            matches = sorted(Path(p) for p in glob.glob(pattern, recursive=True))
            matches = [p for p in matches if p.is_file()]
            if not matches:
                raise self.error(f"{key}.{index}", f"no file matches {pattern!r}")
            found.extend(matches)
        return found

    def sequence(self, messages: Sequence[Message], *, task_id: int = -1) -> Trajectory:
        """A conversation tokenized as a rollout of it."""
        ids, mask = tokenize(self.chat, messages)
        return Trajectory(
            task_id=task_id, group=0, token_ids=ids, loss_mask=mask, logprobs=[0.0] * len(ids)
        )

    def expert_items(
        self,
        *,
        episodes: int,
        split: str,
        max_turns: int,
        env_options: Mapping[str, Any],
        key: str,
        workers: int = 1,
    ) -> list[AgentTrajItem]:
        """Successful expert episodes of the first `episodes` tasks, also saved as expert.json.

        With `workers` above 1 the tasks are shared among as many processes, each with
        its own env (`expert_items_in_processes`).
        """
        run = self._expert_run(
            lambda env: self._split_tasks(env, split)[:episodes],
            max_turns=max_turns,
            env_options=env_options,
            key=key,
            workers=workers,
        )
        return self._keep(run, "expert.json", "expert")

    def takeover_items(
        self,
        *,
        episodes: int,
        split: str,
        roll_in_turns: int,
        max_turns: int,
        env_options: Mapping[str, Any],
        key: str,
        workers: int = 1,
    ) -> list[AgentTrajItem]:
        """DAgger-style items: the stage's model plays, the expert takes over; takeover.json.

        The starting model plays the first `episodes` tasks of `split` (one sampled
        episode each, at most `roll_in_turns` turns); each episode is cut at a seeded turn
        (`cut_roll_in`) and the expert finishes it from there in `max_turns` turns. The
        model's turns stay as context, the expert's are trained on; won takeovers are kept.
        """
        played = self._roll_ins(split, episodes, roll_in_turns, key)
        self.roll_in_env_steps += sum(len(t.turns) for t in played)
        cuts = [(t.task_id, cut_roll_in(t, self.seed)) for t in played]
        cuts = [(task, roll_in) for task, roll_in in cuts if roll_in is not None]
        run = self._expert_run(
            lambda env: [task for task, _ in cuts],
            max_turns=max_turns,
            env_options=env_options,
            key=key,
            workers=workers,
            roll_ins=[roll_in for _, roll_in in cuts],
        )
        self.takeovers = {
            "played": len(played),
            "cut": len(cuts),
            "diverged": run.diverged,
            "kept": len(run.items),
        }
        return self._keep(run, "takeover.json", "takeover")

    def relabelled(
        self, items: Sequence[AgentTrajItem], copies: int, key: str
    ) -> list[AgentTrajItem]:
        """`copies` copies of each item with the env's interchangeable words permuted.

        The env names its classes of words (`interchangeable_words()`); one made from the
        stage's env block is asked, then closed. Seeded by the run's seed.
        """
        if copies == 0 or not items:
            return []
        registration, options = self.resolved.components["env"]
        env = registration.factory(options)
        try:
            # by name, not isinstance: a protocol's answer is cached per class
            words = getattr(env, "interchangeable_words", None)
            if words is None:
                raise self.error(
                    key,
                    f"environment {registration.name!r} names no interchangeable words "
                    "(interchangeable_words()); it cannot relabel",
                )
            classes = words()
        finally:
            env.close()
        try:
            copied = relabelled_items(items, classes, copies, self.seed)
        except ValueError as exc:
            raise self.error(key, f"environment {registration.name!r}: {exc}") from None
        self.relabelled_copies += len(copied)
        return copied

    def _roll_ins(self, split: str, episodes: int, turns: int, key: str) -> list[Trajectory]:
        """The starting model's episodes: those kept in the stage's folder, or played now.

        Kept (`roll_in.jsonl`, as an evolve stage keeps its explorations), a stage that
        stopped later, or was resumed, takes over the same episodes without playing again.
        """
        saved = self.output_dir / ROLL_INS
        if saved.is_file():
            return read_rollout_file(saved)
        if self.play is None:
            raise self.error(key, "a roll-in needs the stage's model to play; none was given")
        played = self.play(split, episodes, turns)
        if distributed.is_main():
            save_rollouts(saved, played)
        return played

    def _split_tasks(self, env: Any, split: str) -> list[Any]:
        try:
            return list(env.tasks(split))
        except ValueError as exc:
            raise self.error("expert.split", str(exc)) from None

    def _expert_run(
        self,
        tasks_of: Callable[[Any], list[Any]],
        *,
        max_turns: int,
        env_options: Mapping[str, Any],
        key: str,
        workers: int,
        roll_ins: list[RollIn] | None = None,
    ) -> ExpertRun:
        """The expert's episodes of `tasks_of(env)`, in this process or `workers` of them."""
        registration, options = self.resolved.components["env"]
        merged = {**options.model_dump(), **env_options}
        try:
            validated = registration.config.model_validate(merged)
        except ValidationError as exc:
            problems = pydantic_problems(exc, registration.config, (*self.prefix, "algorithm", key))
            raise ConfigError(problems, str(self.resolved.source or "")) from None
        timeout_s = self.resolved.root.rollout.env_timeout_s
        env = registration.factory(validated)
        try:
            tasks = tasks_of(env)
            if not isinstance(env, ExpertEnvironment):
                raise self.error(
                    "expert",
                    f"environment {registration.name!r} has no expert_action(); "
                    "it cannot write experts",
                )
            if workers <= 1:
                run = expert_items(
                    env,
                    registration.name,
                    tasks,
                    max_turns=max_turns,
                    timeout_s=timeout_s,
                    roll_ins=roll_ins,
                )
        finally:
            env.close()
        if workers > 1:  # the processes make envs of their own
            run = expert_items_in_processes(
                functools.partial(registration.factory, validated),
                registration.name,
                tasks,
                workers=workers,
                max_turns=max_turns,
                timeout_s=timeout_s,
                roll_ins=roll_ins,
            )
        self.expert_env_steps += run.env_steps
        return run

    def _keep(self, run: ExpertRun, filename: str, what: str) -> list[AgentTrajItem]:
        """The run's items, validated, and written once to `filename` in the stage's folder."""
        items = parse_items(run.items, f"<{what} {self.resolved.components['env'][0].name}>")
        if distributed.is_main():  # every rank made the same items; one file
            write_items(items, self.output_dir / filename)
        return items

    def stage_rollouts(self, stage: str, key: str) -> list[Trajectory]:
        """Trajectories saved by the earlier stage `stage`, checked against this tokenizer."""
        if stage not in self.earlier:
            known = ", ".join(self.earlier) or "none"
            raise self.error(key, f"no earlier stage named {stage!r} (earlier: {known})")
        folder = self.earlier[stage] / ROLLOUTS
        trajectories = read_rollouts(folder) if folder.is_dir() else []
        if not trajectories:
            raise self.error(
                key, f"stage {stage!r} saved no rollouts in {folder} (tracking.save_rollouts)"
            )
        return self._fitting(trajectories, f"rollouts of {stage!r}", key)

    def rollout_files(self, patterns: Sequence[str], key: str) -> list[Trajectory]:
        """Trajectories in JSONL files (paths or globs), checked against this tokenizer."""
        out = []
        for path in self.files(patterns, key):
            with path.open(encoding="utf-8") as lines:
                out += [Trajectory.from_dict(json.loads(line)) for line in lines if line.strip()]
        return self._fitting(out, "the trajectories", key) if out else out

    def _fitting(self, trajectories: list[Trajectory], what: str, key: str) -> list[Trajectory]:
        vocab = len(self.chat.tokenizer)
        if max(max(t.token_ids, default=0) for t in trajectories) >= vocab:
            raise self.error(key, f"{what} hold token ids beyond this tokenizer ({vocab} tokens)")
        return trajectories


def step_indices(step: int, batch_size: int, count: int, seed: int) -> list[int]:
    """Example indices of update `step`: consecutive slices of seeded per-epoch permutations."""
    orders: dict[int, list[int]] = {}
    out = []
    for position in range(step * batch_size, (step + 1) * batch_size):
        epoch, offset = divmod(position, count)
        if epoch not in orders:
            orders[epoch] = list(range(count))
            random.Random(seed * 1_000_003 + epoch).shuffle(orders[epoch])
        out.append(orders[epoch][offset])
    return out


# -- the stage -------------------------------------------------------------------------


class OfflineStage:
    """Runs one `train` stage of an offline algorithm (the `offline` stage kind)."""

    def __init__(self, context: StageContext, options: Any = None) -> None:
        self.context = context
        self.resolved = context.config
        self.root = context.config.root
        # its sources were checked with the pipeline's other stages; a missing one names itself
        # when the data loads (`StageData`)
        raise_problems(_needs_offline(context.config, context.prefix), context.config)
        self.components = build_components(self.resolved)
        self.algorithm: OfflineAlgorithm = self.components.algorithm

    @staticmethod
    def check(
        config: Any, prefix: Sequence[Any] = (), earlier: Sequence[Any] = ()
    ) -> list[Problem]:
        """An offline algorithm (SFT, DPO), whose source stages ran before and save rollouts."""
        return _needs_offline(config, prefix) or source_problems(config, prefix, earlier)

    def run(self, *, show_progress: bool = True, quiet: bool = False) -> StageOutcome:
        """Train to `trainer.steps` on the algorithm's examples, resuming when allowed."""
        root, trainer, context = self.root, self.root.trainer, self.context
        output_dir = Path(root.run.output_dir)
        opened = open_learner(root, self.algorithm, context.start_model, output_dir)
        learner, history, first_step = opened.learner, opened.history, opened.first_step
        if first_step >= trainer.steps:  # finished earlier: a re-run pipeline moves on
            return StageOutcome(opened.weights, history, first_step, last_metrics(history))
        model = learner.unwrapped
        examples, dropped, data = self._examples(
            ChatFormat(opened.tokenizer, model.generation_config),
            # a resumed stage's learner has moved on: its data is played by the starting model
            functools.partial(self._play, model if first_step == 0 else None, opened.tokenizer),
        )
        if show_progress and distributed.is_main():
            print(f"[{root.run.name}] {len(examples)} examples ({dropped} left out)")
        checkpoints = Checkpoints(root, output_dir, context.host, opened.weights)
        progress = stage_progress(root, first_step, show=show_progress, quiet=quiet)
        try:
            for step in range(first_step, trainer.steps):
                start = time.perf_counter()
                metrics = self._step(step, learner, examples)
                metrics["step_seconds"] = time.perf_counter() - start
                metrics["data/examples"] = float(len(examples))
                if step == first_step:  # made once per (re)started stage
                    metrics.update(data_metrics(data))
                history.append(metrics)
                context.host.after_update(step, metrics)
                progress.update(step + 1, metrics)
                if checkpoints.due(step + 1):
                    checkpoints.save(step + 1, learner, opened.tokenizer, history)
                if trainer.eval_every and (step + 1) % trainer.eval_every == 0:
                    self._evaluate(step + 1, learner.unwrapped, opened.tokenizer, history)
        finally:
            progress.close()
        return StageOutcome(checkpoints.latest, history, first_step, last_metrics(history))

    def _examples(
        self, chat: ChatFormat, play: Callable[[str, int, int], list[Trajectory]]
    ) -> tuple[list[Example], int, StageData]:
        """The algorithm's examples that fit the context budget and train on something.

        Also returns how many were left out, and the data services that made them (what
        making them cost).
        """
        context = self.context
        data = StageData(
            self.resolved, chat, earlier=context.earlier, prefix=context.prefix, play=play
        )
        try:
            examples = self.algorithm.examples(data)
        except AgentTrajError as exc:
            raise data.error("", str(exc)) from None
        budget = self.root.rollout.max_context_tokens
        kept = [
            example
            for example in examples
            if all(len(s.token_ids) <= budget and sum(s.loss_mask[1:]) > 0 for s in example)
        ]
        if not kept:
            raise data.error(
                "",
                f"no training examples: {len(examples)} built, none with agent tokens "
                f"within rollout.max_context_tokens={budget}",
            )
        return kept, len(examples) - len(kept), data

    def _play(
        self, model: Any | None, tokenizer: Any, split: str, num_tasks: int, max_turns: int
    ) -> list[Trajectory]:
        """One sampled episode of each of the split's first tasks, as training rollouts sample.

        `model` None: the stage's starting weights, loaded for this (a resumed stage's
        learner holds later ones, and its data must be the first run's).
        """
        root = self.root
        if model is None:
            model, tokenizer = load_configured_model(root.model, self.context.start_model)
        settings = EvalSettings(
            split=split,
            num_tasks=num_tasks,
            max_turns=max_turns,
            seed=root.run.seed,
            env_recovery_s=root.rollout.env_recovery_s,
        )
        with subnormals_flushed():
            _, trajectories = self._episodes(model, tokenizer, settings)
        return trajectories

    def _step(self, step: int, learner: Learner, examples: list[Example]) -> dict[str, float]:
        size = self.algorithm.batch_size
        indices = step_indices(step, size, len(examples), self.root.run.seed)
        metrics = sequence_update(
            learner,
            self.algorithm,
            [examples[i] for i in indices],
            micro_batch_tokens=self.root.trainer.micro_batch_tokens,
            share_rows=learner.settings.share_rows,
        )
        out = {f"train/{k}": v for k, v in metrics.items()}
        out["train/epoch"] = (step + 1) * size / len(examples)
        return out

    def _evaluate(
        self, step: int, model: Any, tokenizer: Any, history: list[dict[str, float]]
    ) -> dict[str, float]:
        settings = eval_settings(self.root, self.components, steps=step, history=history)
        metrics, _ = self._episodes(model, tokenizer, settings)
        self.context.host.after_evaluation(step, settings.split, metrics)
        return metrics

    def _episodes(
        self, model: Any, tokenizer: Any, settings: EvalSettings
    ) -> tuple[dict[str, float], list[Trajectory]]:
        """The model's episodes of `settings`, and their metrics, with the stage's rollout."""
        rollout = rollout_settings(self.root, max_turns=settings.max_turns, seed=self.root.run.seed)
        return evaluate_model(
            model,
            tokenizer,
            self.components,
            settings,
            rollout,
            env_threads=self.root.rollout.env_threads,
        )


def data_metrics(data: StageData) -> dict[str, float]:
    """What making the stage's data cost: expert env steps, a roll-in's steps and counts, copies."""
    out = {}
    if data.expert_env_steps:
        out["data/expert_env_steps"] = float(data.expert_env_steps)
    if data.takeovers:
        out["data/roll_in_env_steps"] = float(data.roll_in_env_steps)
        out.update({f"data/takeovers_{k}": float(v) for k, v in data.takeovers.items()})
    if data.relabelled_copies:
        out["data/relabelled_copies"] = float(data.relabelled_copies)
    return out


def _needs_offline(config: Any, prefix: Sequence[Any]) -> list[Problem]:
    """An offline stage trains an offline algorithm."""
    if is_offline(stage_algorithm(config)):
        return []
    name = config.root.algorithm.name if config.root.algorithm else None
    return [
        Problem(
            dotted((*prefix, "algorithm", "name")),
            f"an offline stage trains an offline algorithm (sft, dpo); got {name!r}",
        )
    ]
