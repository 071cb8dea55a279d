"""The viewer's web app: server-rendered pages over one run, GET only.

Pages: `/` (stages, curves, eval results, the first episodes), `/episodes`
(filter, sort, page), `/episode/{id}?turn=N` (turn by turn), `/compare`
(one task under two stages side by side), `/raw/{path}` (a file of the run,
refused outside it). HTML is rendered on the server with Jinja2 (autoescaped)
so every page reads without JavaScript; the one script only adds keyboard
shortcuts. Nothing is loaded from outside the machine.
"""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import FileResponse, HTMLResponse
from fastapi.staticfiles import StaticFiles
from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup

from agentgym_core.evaluation.metrics import measured
from agentgym_core.view.charts import line_chart
from agentgym_core.view.index import PAGE_SIZE, SORTS, EpisodeIndex
from agentgym_core.view.store import CURVES, OutsideRun, Run, Stage, horizon_changes

HERE = Path(__file__).resolve().parent
FILTERS = ("stage", "step", "split", "level", "success", "termination", "min_turns", "max_turns")
_EVAL_KEY = re.compile(r"^eval/([^/]+)/success_rate$")
_RAW_SUFFIXES = (".jsonl", ".json", ".yaml", ".yml", ".txt", ".md")


def _templates() -> Environment:
    env = Environment(
        loader=FileSystemLoader(HERE / "templates"),
        autoescape=select_autoescape(["html"]),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["num"] = lambda v: "" if v is None else f"{v:.3g}"
    env.filters["exp"] = math.exp
    return env


def eval_results(stages: list[Stage]) -> tuple[list[str], list[dict[str, Any]]]:
    """`(levels, rows)`: per stage that evaluated, overall metrics and success per level.

    A row whose evaluation had env errors is `partial`, with `played` episodes
    of which `episodes` were measured; `partial_levels` the levels with errors.
    """
    levels: set[str] = set()
    rows = []
    for stage in stages:
        for key in sorted(stage.final):
            match = _EVAL_KEY.match(key)
            if not match:
                continue
            prefix = f"eval/{match[1]}/"
            per_level = {
                k.removeprefix(f"{prefix}group/").removesuffix("/success_rate"): v
                for k, v in stage.final.items()
                if k.startswith(f"{prefix}group/") and k.endswith("/success_rate")
            }
            levels.update(per_level)
            episodes, played = measured(stage.final, prefix)
            rows.append(
                {
                    "stage": stage.name,
                    "split": match[1],
                    "success_rate": stage.final.get(key),
                    "mean_reward": stage.final.get(f"{prefix}mean_reward"),
                    "avg_at_k": stage.final.get(f"{prefix}avg_at_k"),
                    "pass_at_k": stage.final.get(f"{prefix}pass_at_k"),
                    "k": stage.final.get(f"{prefix}k"),
                    "episodes": stage.final.get(f"{prefix}episodes"),
                    "played": played,
                    "partial": episodes != played or bool(stage.final.get(f"{prefix}partial")),
                    "levels": per_level,
                    "partial_levels": {
                        level
                        for level in per_level
                        if stage.final.get(f"{prefix}group/{level}/env_errors")
                    },
                }
            )
    return sorted(levels), rows


def curves(run: Run, stage: Stage) -> list[Markup]:
    """The overview's SVG charts of one train stage, ScalingInter boundaries marked."""
    series = run.metric_series(stage.run_id, list(CURVES.values()))
    boundaries = horizon_changes(series.get(CURVES["horizon"], []))
    return [
        Markup(line_chart(title, series.get(key, []), boundaries))  # noqa: S704 - escaped inside
        for title, key in CURVES.items()
    ]


def shown_path(path: Path) -> str:
    """`path` relative to the working directory when it lies below it (shorter, copyable)."""
    try:
        return str(path.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _query_string(params: dict[str, Any], **changes: Any) -> str:
    from urllib.parse import urlencode

    merged = {**params, **changes}
    return urlencode({k: v for k, v in merged.items() if v not in (None, "")})


def create_app(run_dir: str | Path, *, cache_dir: Path | None = None) -> FastAPI:
    """The viewer of the run at `run_dir` (its episodes indexed before this returns).

    Raises:
        FileNotFoundError: no MLflow store there.
    """
    run = Run(run_dir)
    index = EpisodeIndex(run, cache_dir=cache_dir)
    templates = _templates()

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        index.close()

    app = FastAPI(
        title="agentgym view", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan
    )
    app.state.run, app.state.index = run, index
    app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")
    shown = shown_path(run.root)
    commands = {"view": f"agentgym view {shown}", "ui": f"agentgym ui {shown}"}

    def version() -> str:
        """Changes whenever the run logs something: the store's content, the episodes indexed."""
        index.refresh()
        return f"{run.fingerprint()}-{index.count()}"

    def render(name: str, **context: Any) -> HTMLResponse:
        body = templates.get_template(name).render(
            run=run,
            run_name=run.name,
            run_path=shown,
            commands=commands,
            stages=index.stages,
            **context,
        )
        return HTMLResponse(body)

    @app.get("/api/version")
    def api_version() -> dict[str, str]:
        """What a live page polls: it reloads when this changes (see static/viewer.js)."""
        return {"version": version()}

    @app.get("/", response_class=HTMLResponse)
    def overview() -> HTMLResponse:
        live = version()
        levels, results = eval_results(index.stages)
        charts = {s.name: curves(run, s) for s in index.stages if s.kind == "train"}
        total, rows = index.query({})
        return render(
            "overview.html",
            counts=index.counts_by_stage(),
            charts=charts,
            levels=levels,
            results=results,
            total=total,
            rows=rows[:20],
            live_version=live,
        )

    @app.get("/episodes", response_class=HTMLResponse)
    def episodes(request: Request, sort: str = "stage", desc: int = 0, page: int = 1) -> Any:
        live = version()
        params = {k: request.query_params.get(k, "") for k in FILTERS}
        total, rows = index.query(params, sort=sort, desc=bool(desc), page=page)
        pages = max(1, -(-total // PAGE_SIZE))
        state = {**params, "sort": sort, "desc": desc or ""}
        return render(
            "episodes.html",
            params=params,
            facets=index.facets(),
            sorts=list(SORTS),
            sort=sort,
            desc=bool(desc),
            total=total,
            rows=rows,
            page=page,
            pages=pages,
            live_version=live,
            link=lambda **changes: "/episodes?" + _query_string(state, **changes),
        )

    @app.get("/episode/{episode_id}", response_class=HTMLResponse)
    def episode(episode_id: int, turn: int = 1) -> Any:
        found = index.episode(episode_id)
        if found is None:
            raise HTTPException(404, f"no episode {episode_id} in this run")
        row, data = found
        turns = data.get("turns") or []
        turn = min(max(turn, 1), max(len(turns), 1))
        return render("episode.html", row=row, data=data, turns=turns, turn=turn)

    @app.get("/compare", response_class=HTMLResponse)
    def compare(a: str = "", b: str = "", task: str = "", ka: int = 0, kb: int = 0) -> Any:
        index.refresh()
        names = [s.name for s in index.stages if s.kind == "eval"] or [s.name for s in index.stages]
        a = a or (names[0] if names else "")
        b = b or (names[-1] if names else "")
        side_a = {(r["split"], r["task_id"]): r for r in index.task_rows(a)}
        side_b = {(r["split"], r["task_id"]): r for r in index.task_rows(b)}
        tasks = [(key, side_a.get(key), side_b.get(key)) for key in {**side_a, **side_b}]
        tasks.sort(key=lambda t: ((t[1] or t[2])["level"], t[0][1]))
        shown = []
        if task:
            split, _, task_id = task.rpartition(":")
            for stage, k in ((a, ka), (b, kb)):
                ids = index.task_episodes(stage, split, int(task_id))
                found = index.episode(ids[min(k, len(ids) - 1)]) if ids else None
                shown.append({"stage": stage, "samples": len(ids), "k": k, "found": found})
        return render(
            "compare.html",
            names=[s.name for s in index.stages],
            a=a,
            b=b,
            task=task,
            tasks=tasks,
            shown=shown,
            ka=ka,
            kb=kb,
        )

    @app.get("/raw/{path:path}")
    def raw(path: str) -> FileResponse:
        try:
            target = run.inside(path)
        except OutsideRun as error:
            raise HTTPException(403, str(error)) from None
        if not target.is_file() or target.suffix not in _RAW_SUFFIXES:
            raise HTTPException(404, f"no readable file {path} in this run")
        return FileResponse(target, media_type="text/plain; charset=utf-8")

    return app
