"""The dataset of an offline stage (SFT, DPO): files, expert episodes, earlier stages' rollouts.

`StageData` is the `OfflineDataset` an offline algorithm reads its examples
from; the examples of step t are a pure function of (run.seed, t)
(`step_indices`).
"""

from __future__ import annotations

import functools
import glob
import random
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from agentgym_core import distributed
from agentgym_core.config.errors import ConfigError, Problem, dotted, pydantic_problems
from agentgym_core.data.agenttraj import (
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
from agentgym_core.data.trajfiles import read_jsonl
from agentgym_core.rollout.chat import ChatFormat
from agentgym_core.run.saved_rollouts import ROLLOUTS, read_rollouts, save_rollouts
from agentgym_core.types import Trajectory

ROLL_INS = "roll_in.jsonl"
"""The starting model's episodes that a stage's expert took over, kept for a rerun."""


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
            return read_jsonl(saved)
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
        out = [t for path in self.files(patterns, key) for t in read_jsonl(path)]
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
