"""The `search` environment: answer a question by searching a local encyclopedia.

The agent acts with `search[query]` (the top-k passages come back) and
`answer[text]` (ends the episode). The reward is the exact match of that
answer with a gold answer, normalized as SQuAD does; token F1 goes in `info`.
The action space is open text, so `valid_actions()` is None and decoding is
not constrained, unless `action_space: spans` lists actions built from what the
agent has read (`agentgym_env_search.spans`). With `python: true` the agent also
has `python[code]`: the code runs in the core's sandbox
(`agentgym_core.api.PythonSandbox`) and what it prints comes back, for
arithmetic over the facts it found.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass

from agentgym_core.api import PythonSandbox, SandboxLimits, StepResult
from agentgym_env_search.config import SearchConfig
from agentgym_env_search.index import Searcher, shared_searcher
from agentgym_env_search.metrics import best_scores
from agentgym_env_search.qa import BUNDLED, QAItem, load_qa, split_of
from agentgym_env_search.spans import span_actions

INSTRUCTION = """Answer the question using a search engine over an encyclopedia.
Each turn, reply with exactly one action:
- search[query]: returns the {top_k} best-matching passages (title and text)
- answer[text]: your final answer, as short as possible (a name, a year, a place);
  this ends the episode
One search is often not enough: a passage may name the person, work or place you must search next.
Only the answer is scored, by exact match with the expected answer."""
PYTHON_TOOL = """- python[code]: runs Python (standard library, no network), returns what it prints;
  use it for arithmetic, e.g. python[print(1969 - 1889)]"""
INVALID = (
    "Invalid action. Reply with search[query] to look something up "
    "or answer[text] to give your final answer."
)
INVALID_WITH_PYTHON = (
    "Invalid action. Reply with search[query] to look something up, python[code] to "
    "compute, or answer[text] to give your final answer."
)
EXAMPLES = {
    "search": "search[Eiffel Tower]",
    "answer": "answer[Paris]",
    "python": "python[print(6 * 7)]",
}
OVER = "The episode is over."
MAX_QUERY_CHARS = 200
_ACTION = re.compile(r"\b(search|answer)\s*\[(.*?)\]", re.IGNORECASE | re.DOTALL)
_PYTHON = re.compile(r"\bpython\s*\[", re.IGNORECASE)


def parse_action(text: str, *, python: bool = False) -> tuple[str, str] | None:
    """(tool, argument) of the last `search[...]`, `answer[...]` (or `python[...]`), or None.

    The last one counts, so a model may think aloud before it acts. Code keeps
    its lines and runs to the text's last `]` (code has brackets of its own).
    """
    matches = list(_ACTION.finditer(text))
    code = list(_PYTHON.finditer(text)) if python else []
    if code and (not matches or code[-1].start() > matches[-1].start()):
        end = text.rfind("]")
        if end < code[-1].end():
            return None
        return "python", text[code[-1].end() : end].strip("\n")
    if not matches:
        return None
    tool, argument = matches[-1].groups()
    return tool.lower(), " ".join(argument.split())


def shorten(text: str, max_chars: int) -> str:
    """`text` cut to at most `max_chars` characters at a word boundary, with "..." if cut."""
    if len(text) <= max_chars:
        return text
    cut = text[: max_chars - 3]
    if " " in cut:
        cut = cut[: cut.rindex(" ")]
    return cut.rstrip() + "..."


@dataclass(frozen=True)
class _Dataset:
    """What every instance with the same config shares: the index and the questions."""

    searcher: Searcher
    items: tuple[QAItem, ...]


_datasets: dict[tuple[str | None, str | None, str | None], _Dataset] = {}
_datasets_lock = threading.Lock()


def _dataset(config: SearchConfig) -> _Dataset:
    qa_path = config.qa_path or BUNDLED[config.question_set]
    key = (config.corpus_path, str(qa_path), config.cache_dir)
    with _datasets_lock:
        if key not in _datasets:
            searcher = shared_searcher(config.corpus_path, config.cache_dir)
            items = tuple(load_qa(qa_path, searcher.corpus))
            _datasets[key] = _Dataset(searcher, items)
        return _datasets[key]


class SearchEnv:
    """One question per episode; task ids are positions in the QA file."""

    def __init__(self, config: SearchConfig) -> None:
        self.config = config
        data = _dataset(config)
        self.searcher, self.items = data.searcher, data.items
        self.sandbox = (
            PythonSandbox(SandboxLimits(wall_s=config.python_wall_s)) if config.python else None
        )
        self.item: QAItem | None = None
        self.queries: list[str] = []
        self.read: list[str] = []
        """The question and every observation since, the source of `spans` actions."""
        self.done = True
        self.success = False
        self.programs = 0

    # -- tasks -------------------------------------------------------------------

    def tasks(self, split: str) -> list[int]:
        """Positions of the questions whose text hashes into `split`."""
        if split not in ("train", "test"):
            raise ValueError(f"unknown split {split!r}; splits: train, test")
        fraction = self.config.test_fraction
        return [
            i for i, item in enumerate(self.items) if split_of(item.question, fraction) == split
        ]

    def task_group(self, task_id: int) -> str:
        """`single` or `multi` hop."""
        return self._item(task_id).group

    def instruction(self) -> str:
        """The tools and the answer format, shown once at the start of each conversation."""
        if self.config.instruction:
            return self.config.instruction
        text = INSTRUCTION.format(top_k=self.config.top_k)
        if self.sandbox is None:
            return text
        lines = text.splitlines()
        at = next(i for i, line in enumerate(lines) if line.startswith("- answer["))
        return "\n".join([*lines[:at], PYTHON_TOOL, *lines[at:]])

    def _item(self, task_id: int) -> QAItem:
        if isinstance(task_id, bool) or not isinstance(task_id, int):
            raise TypeError(f"task ids are int, got {task_id!r}")
        if not 0 <= task_id < len(self.items):
            raise ValueError(f"task {task_id} out of range: {len(self.items)} questions")
        return self.items[task_id]

    # -- episode -------------------------------------------------------------------

    def reset(self, task_id: int) -> str:
        """Start question `task_id`; the first observation is the question."""
        self.item = self._item(task_id)
        self.queries, self.done, self.success = [], False, False
        self.programs = 0
        self.read = [self.item.question]
        return f"Question: {self.item.question}"

    def valid_actions(self) -> list[str] | None:
        """None for free text; under `action_space: spans`, the actions built from `read`."""
        if self.config.action_space == "free":
            return None
        return span_actions(self.read, self.config.max_span_words, python=self.sandbox is not None)

    def step(self, action: str) -> StepResult:
        """Run a search, or score an answer and end the episode."""
        if self.done or self.item is None:
            return StepResult(OVER, 0.0, True, info={"success": self.success})
        parsed = parse_action(action, python=self.sandbox is not None)
        if parsed is None:
            invalid = INVALID if self.sandbox is None else INVALID_WITH_PYTHON
            return StepResult(invalid, 0.0, False, info={"success": False, "invalid": True})
        tool, argument = parsed
        result = self._act(tool, argument)
        self.read.append(result.observation)
        return result

    def _act(self, tool: str, argument: str) -> StepResult:
        if not argument.strip():
            note = f"{tool}[...] needs text inside the brackets, e.g. {EXAMPLES[tool]}."
            return StepResult(note, 0.0, False, info={"success": False, "invalid": True})
        if tool == "search":
            return self._search(argument[:MAX_QUERY_CHARS])
        if tool == "python":
            return self._python(argument)
        return self._answer(argument)

    def _python(self, code: str) -> StepResult:
        assert self.sandbox is not None
        self.programs += 1
        result = self.sandbox.run(code)
        text = shorten(result.text(), self.config.max_output_chars)
        info = {"success": False, "python_ok": result.ok, "timed_out": result.timed_out}
        return StepResult(f"Python output:\n{text}", 0.0, False, info=info)

    def _search(self, query: str) -> StepResult:
        self.queries.append(query)
        hits = self.searcher.search(query, self.config.top_k)
        if not hits:
            text = f"No passage matches search[{query}]. Try other words."
            return StepResult(text, 0.0, False, info={"success": False, "titles": []})
        lines = [f"Results of search[{query}]:"]
        titles = []
        for rank, hit in enumerate(hits, start=1):
            passage = self.searcher.passage(hit)
            titles.append(passage.title)
            body = shorten(passage.text, self.config.max_passage_chars)
            lines.append(f"({rank}) {passage.title}: {body}")
        return StepResult("\n".join(lines), 0.0, False, info={"success": False, "titles": titles})

    def _answer(self, answer: str) -> StepResult:
        assert self.item is not None
        em, f1 = best_scores(answer, self.item.answers)
        self.done, self.success = True, em == 1.0
        verdict = "correct" if self.success else "wrong"
        info = {
            "success": self.success,
            "em": em,
            "f1": f1,
            "answer": answer,
            "searches": len(self.queries),
            "programs": self.programs,
        }
        return StepResult(f"Your answer is {verdict}.", em, True, info=info)

    # -- expert ----------------------------------------------------------------------

    def expert_action(self) -> str:
        """The oracle: search each supporting title not searched yet, in order, then answer.

        For a computed answer with python[...] offered, it runs the question's
        program once before answering.
        """
        if self.item is None:
            raise RuntimeError("expert_action() before reset()")
        if not self.item.supporting_titles:
            raise ValueError(
                f"question {self.item.question!r} has no supporting_titles: the expert "
                "needs them to know what to search"
            )
        for title in self.item.supporting_titles:
            if title not in self.queries:
                return f"search[{title}]"
        if self.item.program and self.sandbox is not None and self.programs == 0:
            return f"python[{self.item.program}]"
        return f"answer[{self.item.answers[0]}]"

    def close(self) -> None:
        """Nothing to release: the index is shared by every instance in the process."""
        self.item = None
