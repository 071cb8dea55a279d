"""Write the bundled question set for the default corpus, deterministically.

    python plugins/envs/search/scripts/make_qa.py           # rewrites the bundled data/qa.jsonl
    python plugins/envs/search/scripts/make_qa.py --check   # exit 1 if the shipped file differs
    python plugins/envs/search/scripts/make_qa.py --set arithmetic   # data/qa_arithmetic.jsonl
    python plugins/envs/search/scripts/make_qa.py --set lifespans    # data/qa_lifespans.jsonl

Questions come from templates over facts that each summary states in its short
description ("English comic actor (1889-1977)", "1968 film by Stanley
Kubrick", "Capital and largest city of Mali", "City in Egypt"):

single hop  birth_year, death_year, work_year, creator, capital
multi hop   creator_birth_year, creator_death_year (work -> creator),
            place_capital (place -> the city described as its country's capital),
            born_first (two people), creator_born_first (two works -> two creators)

The `arithmetic` set asks for the years between two facts, so the answer is
computed, not read (each question carries the `program` that prints it):

one passage   lifespan (years from birth to death)
two passages  birth_gap (two people), creator_age_at_work (work -> creator: years
              from the creator's birth to the work), creator_lifespan (work -> creator)

Only the questions, the short answers and the titles of the supporting passages
are written; no passage text. A candidate is kept only if it is reachable:
searching each supporting title ranks that passage first, the answer occurs in
what the agent is shown of a supporting passage (its title and its text cut to
`max_passage_chars`), and each bridge entity occurs in the passage before it.
"""

from __future__ import annotations

import argparse
import random
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from agentgym_env_search.config import SearchConfig
from agentgym_env_search.corpus import Corpus, load_corpus
from agentgym_env_search.env import shorten
from agentgym_env_search.index import Searcher
from agentgym_env_search.qa import BUNDLED, QAItem, dumps_qa

SEED = 20250911
QUOTAS = {
    "birth_year": 70,
    "death_year": 40,
    "work_year": 30,
    "creator": 30,
    "capital": 40,
    "creator_birth_year": 45,
    "creator_death_year": 30,
    "place_capital": 40,
    "born_first": 70,
    "creator_born_first": 25,
}
"""Questions per template (fewer where the corpus has fewer reachable candidates)."""
ARITHMETIC_QUOTAS = {
    "lifespan": 50,
    "birth_gap": 60,
    "creator_age_at_work": 50,
    "creator_lifespan": 40,
}
"""Questions per template of the arithmetic set."""
LIFESPAN_QUOTAS = {"lifespan": 100_000}
"""The `lifespans` set: every reachable lifespan question, one per person (enough people that
a tiny model can learn to copy a name into its query and two years into python[...])."""
QUOTAS_OF = {"facts": QUOTAS, "arithmetic": ARITHMETIC_QUOTAS, "lifespans": LIFESPAN_QUOTAS}

LIFE = re.compile(r"\((?:born )?(\d{3,4}) ?[–-] ?(\d{3,4})\)$")
BORN = re.compile(r"\(born (\d{4})\)$")
WORK = re.compile(
    r"^(?:(?P<year>\d{4}) )?(?:[\w'’-]+ ){0,3}?"
    r"(?P<kind>film|novel|novella|painting|opera|play|poem|book|symphony|single|album|song"
    r"|sculpture|ballet|tragedy|comedy|treatise)"
    r"(?: (?:directed|written|composed|painted))? by (?P<creator>[A-Z][^,()]*)$"
)
CAPITAL = re.compile(
    r"^Capital(?: city| municipality)?(?:,? and (?:the )?(?:largest|most populous) city)?"
    r" (?:of|in) (?P<place>(?:the )?[^,()]+)$"
)
PLACE = re.compile(
    r"^(?:City|Town|Port city|City and municipality|Mountain|Mountain range|River|Lake|Island"
    r"|Volcano|Desert)\b[^,]* in (?P<where>.+)$"
)
COUNTRY = re.compile(r"(?i)\b(country|sovereign state|nation)\b")
VERB = {
    "film": "directed",
    "painting": "painted",
    "sculpture": "sculpted",
    "opera": "composed",
    "symphony": "composed",
    "ballet": "composed",
    "single": "recorded",
    "album": "recorded",
}
"""Who-made-it verb per kind of work; the rest were written."""
RELEASE = {
    "film": "released",
    "single": "released",
    "album": "released",
    "song": "released",
    "painting": "painted",
    "sculpture": "made",
    "symphony": "composed",
    "opera": "first performed",
    "ballet": "first performed",
    "play": "first performed",
    "tragedy": "first performed",
    "comedy": "first performed",
}
"""In-which-year verb per kind of work; the rest were published."""


@dataclass(frozen=True)
class Candidate:
    """A question before the reachability check.

    `bridges[i]` must appear in what is shown of passage i: the entity that leads
    from passage i to the next one (a creator's name, a country).
    """

    item: QAItem
    bridges: tuple[str, ...] = ()
    answer_in_last: bool = False
    """The answer must be in the last passage itself, not only in an earlier one's text."""
    operands: tuple[tuple[int, str], ...] = ()
    """(passage position, number): facts a computed answer is made of, each of which must be
    shown in that passage (the answer itself need not appear anywhere)."""


def display_name(title: str) -> str:
    """A title without its disambiguation: "Casablanca (film)" -> "Casablanca"."""
    return re.sub(r" \([^)]*\)$", "", title).split(", ")[0]


def _question(
    kind: str, question: str, answer: str, titles: list[str], program: str = ""
) -> QAItem:
    return QAItem(
        question=question, answers=[answer], supporting_titles=titles, kind=kind, program=program
    )


class Facts:
    """Facts parsed from the passages' descriptions, keyed by passage title."""

    def __init__(self, descriptions: dict[str, str], topics: dict[str, str]) -> None:
        self.people: dict[str, tuple[int, int | None]] = {}
        self.works: dict[str, tuple[str, int | None, str]] = {}
        self.capitals: dict[str, str] = {}
        self.places: dict[str, str] = {}
        for title, description in descriptions.items():
            self._parse(title, description, topics.get(title, ""))
        self._keep_unique_capitals()
        self.countries = {t for t, d in descriptions.items() if COUNTRY.search(d)}

    def _parse(self, title: str, description: str, topic: str) -> None:
        if topic == "People" and "(" not in title and "," not in title:
            if life := LIFE.search(description):
                born, died = int(life[1]), int(life[2])
                if born < died:
                    self.people[title] = (born, died)
            elif born_only := BORN.search(description):
                self.people[title] = (int(born_only[1]), None)
        if work := WORK.match(description):
            year = int(work["year"]) if work["year"] else None
            self.works[title] = (work["kind"], year, work["creator"].strip())
        if capital := CAPITAL.match(description):
            self.capitals[title] = capital["place"].strip()
        if place := PLACE.match(description):
            self.places[title] = place["where"].split(", ")[-1].removeprefix("the ").strip()

    def _keep_unique_capitals(self) -> None:
        """A place claimed by two cities ("Capital of X") gets no capital question."""
        claimed: dict[str, list[str]] = {}
        for city, place in self.capitals.items():
            claimed.setdefault(place.removeprefix("the "), []).append(city)
        self.capital_of = {
            place: cities[0] for place, cities in claimed.items() if len(cities) == 1
        }


def single_hop(facts: Facts) -> Iterator[Candidate]:
    """Birth and death years, work years and creators, capitals: one passage each."""
    for person, (born, died) in facts.people.items():
        yield Candidate(
            _question("birth_year", f"In which year was {person} born?", str(born), [person])
        )
        if died is not None:
            question = f"In which year did {person} die?"
            yield Candidate(_question("death_year", question, str(died), [person]))
    for work, (kind, year, creator) in facts.works.items():
        name = display_name(work)
        if year is not None:
            question = f"In which year was the {kind} {name} {RELEASE.get(kind, 'published')}?"
            yield Candidate(_question("work_year", question, str(year), [work]))
        question = f"Who {VERB.get(kind, 'wrote')} the {kind} {name}?"
        yield Candidate(_question("creator", question, creator, [work]))
    for city, place in facts.capitals.items():
        if facts.capital_of.get(place.removeprefix("the ")) == city:
            question = f"What is the capital of {place}?"
            yield Candidate(_question("capital", question, display_name(city), [city]))


def multi_hop(facts: Facts, rng: random.Random) -> Iterator[Candidate]:
    """Bridges (work -> creator, place -> country's capital) and comparisons of two people."""
    for work, (kind, _, creator) in facts.works.items():
        if creator not in facts.people:
            continue
        born, died = facts.people[creator]
        who = f"the person who {VERB.get(kind, 'wrote')} the {kind} {display_name(work)}"
        titles = [work, creator]
        item = _question("creator_birth_year", f"In which year was {who} born?", str(born), titles)
        yield Candidate(item, bridges=(creator,))
        if died is not None:
            item = _question(
                "creator_death_year", f"In which year did {who} die?", str(died), titles
            )
            yield Candidate(item, bridges=(creator,))
    for place, country in facts.places.items():
        city = facts.capital_of.get(country)
        if city is None or country not in facts.countries or place in facts.capitals:
            continue
        question = f"What is the capital of the country where {display_name(place)} is located?"
        item = _question("place_capital", question, display_name(city), [place, city])
        yield Candidate(item, bridges=(country, country), answer_in_last=True)
    yield from _born_first(facts, rng)
    yield from _creators_born_first(facts, rng)


def _born_first(facts: Facts, rng: random.Random) -> Iterator[Candidate]:
    people = sorted(facts.people)
    for _ in range(20 * QUOTAS["born_first"]):
        a, b = rng.sample(people, 2)
        if facts.people[a][0] == facts.people[b][0]:
            continue
        first = min((a, b), key=lambda p: facts.people[p][0])
        question = f"Who was born first, {a} or {b}?"
        yield Candidate(_question("born_first", question, first, [a, b]))


def _creators_born_first(facts: Facts, rng: random.Random) -> Iterator[Candidate]:
    works = sorted(w for w, (_, _, creator) in facts.works.items() if creator in facts.people)
    for _ in range(20 * QUOTAS["creator_born_first"]):
        w1, w2 = rng.sample(works, 2)
        c1, c2 = facts.works[w1][2], facts.works[w2][2]
        if c1 == c2 or facts.people[c1][0] == facts.people[c2][0]:
            continue
        first = min((c1, c2), key=lambda p: facts.people[p][0])
        k1, k2 = facts.works[w1][0], facts.works[w2][0]
        question = (
            f"Who was born first: the person who {VERB.get(k1, 'wrote')} the {k1} "
            f"{display_name(w1)}, or the person who {VERB.get(k2, 'wrote')} the {k2} "
            f"{display_name(w2)}?"
        )
        item = _question("creator_born_first", question, first, [w1, c1, w2, c2])
        yield Candidate(item, bridges=(c1, "", c2))


def arithmetic(facts: Facts, rng: random.Random) -> Iterator[Candidate]:
    """Years between two stated facts: the answer is computed, never read."""
    for person, (born, died) in facts.people.items():
        if died is not None:
            question = f"How many years passed between the birth and the death of {person}?"
            item = _question(
                "lifespan", question, str(died - born), [person], f"print({died} - {born})"
            )
            yield Candidate(item, operands=((0, str(born)), (0, str(died))))
    for work, (kind, year, creator) in facts.works.items():
        if creator not in facts.people:
            continue
        born, died = facts.people[creator]
        who = f"the person who {VERB.get(kind, 'wrote')} the {kind} {display_name(work)}"
        titles = [work, creator]
        if year is not None and 10 <= year - born <= 100:
            question = (
                f"How many years after the birth of {who} was it {RELEASE.get(kind, 'published')}?"
            )
            item = _question(
                "creator_age_at_work", question, str(year - born), titles, f"print({year} - {born})"
            )
            yield Candidate(item, bridges=(creator,), operands=((0, str(year)), (1, str(born))))
        if died is not None:
            question = f"How many years passed between the birth and the death of {who}?"
            item = _question(
                "creator_lifespan", question, str(died - born), titles, f"print({died} - {born})"
            )
            yield Candidate(item, bridges=(creator,), operands=((1, str(born)), (1, str(died))))
    people = sorted(facts.people)
    for _ in range(20 * ARITHMETIC_QUOTAS["birth_gap"]):
        a, b = rng.sample(people, 2)
        born_a, born_b = facts.people[a][0], facts.people[b][0]
        if born_a == born_b:
            continue
        question = f"How many years apart were {a} and {b} born?"
        program = f"print(abs({born_a} - {born_b}))"
        item = _question("birth_gap", question, str(abs(born_a - born_b)), [a, b], program)
        yield Candidate(item, operands=((0, str(born_a)), (1, str(born_b))))


def shown(searcher: Searcher, title: str, max_chars: int) -> str:
    """What a search result shows of the passage `title`: its title and cut text."""
    passage = searcher.corpus.passages[searcher.corpus.index_of(title)]
    return f"{passage.title}: {shorten(passage.text, max_chars)}"


def reachable(candidate: Candidate, searcher: Searcher, max_chars: int) -> bool:
    """Each title ranks first for its own query; bridges and the answer are in shown text."""
    item = candidate.item
    for title in item.supporting_titles:
        hits = searcher.search(title, 1)
        if not hits or searcher.corpus.passages[hits[0].index].title != title:
            return False
    texts = [shown(searcher, t, max_chars).lower() for t in item.supporting_titles]
    for text, bridge in zip(texts, candidate.bridges, strict=False):
        if bridge and bridge.lower() not in text:
            return False
    if not all("]" not in t for t in item.supporting_titles):
        return False  # search[...] could not carry it
    if candidate.operands:
        return all(number in texts[at] for at, number in candidate.operands)
    answer = item.answers[0].lower()
    if candidate.answer_in_last:
        return answer in texts[-1]
    return any(answer in text for text in texts)


def make_items(
    descriptions: dict[str, str],
    topics: dict[str, str],
    searcher: Searcher,
    max_chars: int,
    question_set: str = "facts",
) -> list[QAItem]:
    """Every template's reachable candidates, a seeded sample of each up to its quota."""
    rng = random.Random(SEED)
    facts = Facts(descriptions, topics)
    quotas = QUOTAS_OF[question_set]
    by_kind: dict[str, list[QAItem]] = {kind: [] for kind in quotas}
    seen: set[str] = set()
    if question_set == "facts":
        candidates = [*single_hop(facts), *multi_hop(facts, rng)]
    else:
        candidates = list(arithmetic(facts, rng))
    for candidate in candidates:
        item = candidate.item
        if item.kind not in by_kind or item.question in seen:
            continue
        if not reachable(candidate, searcher, max_chars):
            continue
        seen.add(item.question)
        by_kind[item.kind].append(item)
    chosen: list[QAItem] = []
    for kind, quota in quotas.items():
        pool = by_kind[kind]
        chosen.extend(rng.sample(pool, min(quota, len(pool))))
    return chosen


def _descriptions(corpus: Corpus) -> tuple[dict[str, str], dict[str, str]]:
    """Descriptions and topics from the OVOS file (the passage text starts with the former)."""
    import json

    data = json.loads(corpus.source.read_bytes())
    descriptions = {
        e["title"]: " ".join((e.get("description") or "").split()) for e in data.values()
    }
    topics = {e["title"]: e.get("topic") or "" for e in data.values()}
    return descriptions, topics


def build(cache_dir: Path | None = None, question_set: str = "facts") -> list[QAItem]:
    """A question set for the default corpus and the default passage length."""
    corpus = load_corpus(None)
    searcher = Searcher(corpus, cache_dir)
    descriptions, topics = _descriptions(corpus)
    max_chars = SearchConfig().max_passage_chars
    return make_items(descriptions, topics, searcher, max_chars, question_set)


def main(argv: list[str] | None = None) -> int:
    """Write (or `--check`) the bundled QA file."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", dest="question_set", choices=list(BUNDLED), default="facts")
    parser.add_argument("--out", type=Path, default=None, help="default: the bundled file")
    parser.add_argument("--check", action="store_true", help="compare with --out, write nothing")
    parser.add_argument("--cache-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    args.out = args.out or BUNDLED[args.question_set]
    items = build(args.cache_dir, args.question_set)
    quotas = QUOTAS_OF[args.question_set]
    summary = ", ".join(f"{k} {sum(i.kind == k for i in items)}" for k in quotas)
    if args.check:
        same = args.out.is_file() and args.out.read_text(encoding="utf-8") == dumps_qa(items)
        print(f"{len(items)} questions ({summary}): {'same as' if same else 'NOT'} {args.out}")
        return 0 if same else 1
    args.out.write_text(dumps_qa(items), encoding="utf-8")
    print(f"{len(items)} questions ({summary}) -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
