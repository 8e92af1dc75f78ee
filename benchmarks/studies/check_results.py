"""Recompute every study table of benchmarks/RESULTS.md from the run files kept beside it, and fail on
any figure that does not match.

    python benchmarks/studies/check_results.py [--results benchmarks/RESULTS.md] [--root .]

A study table in RESULTS.md says where its figures come from in an HTML comment on the line above it
(invisible where the Markdown is rendered):

    <!-- results: benchmarks/studies/results/routing-algorithms; rows: dynamic-full, em-full;
         columns: -, accuracy, ci95, train_loss, inner_share -->
    <!-- results: benchmarks/studies/results/routing-algorithms; comparisons: em-detach - em-full;
         columns: -, difference, welch, paired -->
    <!-- files not kept: the run folders of this study were deleted before run files were kept -->

``rows`` names the configuration of each table row, in order; ``comparisons`` names each row's pair
"A - B" (A's mean minus B's); ``columns`` gives each column's kind ("-": a label, not checked):

    accuracy     "mean ± sd" of the runs' final test accuracy (the sd may be left out)
    ci95         "[low, high]": the Student-t 95% interval of that mean
    NAME         "mean" or "mean ± sd" of a run figure: train_loss, test_loss (the final epoch's), or a
                 gradient-flow figure of the study summary (t_score, d_score, digit_d_score,
                 inner_share, lowest_grad_norm, mode_cosine: the mean over the last epoch's logged steps)
    difference   A's mean test accuracy minus B's (comparisons)
    welch        "[low, high]": the Welch 95% interval of that difference (comparisons)
    paired       "[low, high]": the Student-t 95% interval of the seed-by-seed differences (comparisons)

``metric: NAME`` makes a comparison table compare another run figure than the test accuracy. A
printed number matches when it is the recomputed value rounded to the digits printed (half a unit
in the last printed place); a cell without a number ("-", "chance") matches a value that is absent
or has no spread. Every figure is recomputed from each run's metrics.jsonl and gradflow.jsonl (the
study's study.json names the runs), not read from summary.json; summary.json must agree with the
recomputation too. Every table whose header holds an interval (95%, Welch, paired) must carry one of
the two comments, and so must every table of a section headed "Study: ...". Exit status 0 when everything matches, 1 with one line per mismatch otherwise.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from tinygrad_caps.models.analysis.confidence import mean_and_spread, paired_difference, welch_difference
from tinygrad_caps.models.app.studies.summary import run_figures, summarize
from tinygrad_caps.models.app.training.run_logs import read_metrics

ROOT = Path(__file__).resolve().parents[2]
MARKER = re.compile(r"<!--\s*(results|files not kept)\s*:(.*?)-->", re.S)
NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
INTERVAL_HEADERS = ("95%", "welch", "paired")
LOSSES = ("train_loss", "test_loss")
FIGURES = ("t_score", "d_score", "digit_d_score", "inner_share", "lowest_grad_norm", "mode_cosine")
ROW_KINDS = ("-", "accuracy", "ci95", *LOSSES, *FIGURES)
COMPARISON_KINDS = ("-", "difference", "welch", "paired")


class Mismatch(Exception):
    """A figure of RESULTS.md that its run files do not give."""


def runs_of(folder: Path) -> dict:
    """{config_id: [{"seed", "test_accuracy", "train_loss", "test_loss", figure...}]} of the finished
    runs of the study in ``folder``, recomputed from their metrics.jsonl and gradflow.jsonl."""
    plan = json.loads((folder / "study.json").read_text())
    epochs = plan["epochs"]
    runs = {}
    for config in plan["configs"]:
        finished = []
        for run in config["runs"]:
            run_dir = folder / run["path"]
            metrics = read_metrics(run_dir / "metrics.jsonl") if (run_dir / "metrics.jsonl").exists() else []
            final = next((m for m in metrics if m["epoch"] == epochs), None)
            if final is None:
                continue
            figures = run_figures(run_dir, epochs, FIGURES)
            finished.append({"seed": run["seed"], "test_accuracy": final["test_accuracy"],
                             **{name: final[name] for name in LOSSES}, **figures})
        runs[config["config_id"]] = finished
    return runs


def row_of(runs: list, metric: str) -> dict:
    """{"n", "mean", "std", "ci95", "seeds", "values"} of ``metric`` over ``runs`` (absent values left out)."""
    kept = [r for r in runs if r.get(metric) is not None]
    return dict(mean_and_spread([r[metric] for r in kept]), seeds=[r["seed"] for r in kept],
                values=[r[metric] for r in kept])


def printed_numbers(cell: str) -> list:
    """The numbers printed in a table cell, each as (value, half a unit in its last printed place)."""
    found = []
    for text in NUMBER.findall(cell.replace("−", "-").replace(",", "")):
        mantissa, _, exponent = text.lower().partition("e")
        decimals = len(mantissa.split(".")[1]) if "." in mantissa else 0
        scale = 10.0 ** int(exponent) if exponent else 1.0
        found.append((float(text), 0.5 * 10.0 ** -decimals * scale))
    return found


def matches(printed, value) -> bool:
    number, half_unit = printed
    return value is not None and abs(number - value) <= half_unit * (1 + 1e-9) + 1e-15


def check_cell(cell: str, expected: list, where: str) -> None:
    """``cell``'s numbers against ``expected`` (the values it should print, in order, None for absent);
    a cell without numbers stands for values that are absent or without spread."""
    numbers = printed_numbers(cell)
    if not numbers:
        if not _without_spread(expected):
            raise Mismatch(f"{where}: prints no number, the run files give {_shown(expected)}")
        return
    if len(numbers) > len(expected):
        raise Mismatch(f"{where}: prints {len(numbers)} numbers ({cell.strip()!r}), expected at most {len(expected)}")
    for k, printed in enumerate(numbers):
        if not matches(printed, expected[k]):
            raise Mismatch(f"{where}: prints {cell.strip()!r}, the run files give {_shown(expected[:len(numbers)])}")


def _without_spread(expected: list) -> bool:
    """Values a cell may leave without a number: absent, a mean without spread, or an interval of no width."""
    kept = [v for v in expected if v is not None]
    return not kept or (len(expected) > 1 and (expected[1] == 0.0 or len(set(kept)) == 1))


def _shown(values) -> str:
    return ", ".join("-" if v is None else f"{v:.6g}" for v in values)


def parse_marker(text: str) -> dict:
    """The fields of a results comment: {"folder", "rows" | "comparisons", "columns", "metric"?}."""
    fields = [part.strip() for part in " ".join(text.split()).split(";") if part.strip()]
    spec = {"folder": fields[0]}
    for part in fields[1:]:
        key, _, value = part.partition(":")
        key = key.strip()
        if key not in ("rows", "comparisons", "columns", "metric"):
            raise Mismatch(f"results comment {text.strip()!r}: unknown field {key!r}")
        spec[key] = value.strip() if key == "metric" else [v.strip() for v in value.split(",")]
    if ("rows" in spec) == ("comparisons" in spec) or "columns" not in spec:
        raise Mismatch(f"results comment {text.strip()!r}: needs columns and one of rows or comparisons")
    return spec


def tables(lines: list) -> list:
    """(first line index, [rows as cell lists]) of every Markdown table: a "| ..." line followed by its
    separator row (dropped); cells split at pipes that are not escaped."""
    found, k = [], 0
    while k < len(lines):
        if re.match(r"\|\s", lines[k]) and k + 1 < len(lines) and re.match(r"\|\s*:?-", lines[k + 1]):
            start = k
            while k < len(lines) and lines[k].startswith("|"):
                k += 1
            rows = [[c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]] for line in lines[start:k]]
            found.append((start, [rows[0]] + rows[2:]))
        else:
            k += 1
    return found


def marker_above(lines: list, start: int):
    """The comment that ends on the line just above the table at ``start`` (blank lines skipped), or None."""
    k = start - 1
    while k >= 0 and not lines[k].strip():
        k -= 1
    if k < 0 or not lines[k].rstrip().endswith("-->"):
        return None
    end = k
    while k >= 0 and "<!--" not in lines[k]:
        k -= 1
    match = MARKER.search("\n".join(lines[k:end + 1]))
    return match


def check_table(spec: dict, header: list, body: list, root: Path, cache: dict, where: str) -> None:
    folder = root / spec["folder"]
    if folder not in cache:
        if not (folder / "study.json").is_file():
            raise Mismatch(f"{where}: {spec['folder']} holds no study.json")
        cache[folder] = runs_of(folder)
        check_summary(folder, cache[folder])
    runs = cache[folder]
    columns = spec["columns"]
    if len(columns) != len(header):
        raise Mismatch(f"{where}: the comment names {len(columns)} columns, the table has {len(header)}")
    names = spec.get("rows") or spec["comparisons"]
    if len(names) != len(body):
        raise Mismatch(f"{where}: the comment names {len(names)} rows, the table has {len(body)}")
    comparing = "comparisons" in spec
    allowed = COMPARISON_KINDS if comparing else ROW_KINDS
    for kind in columns:
        if kind not in allowed:
            raise Mismatch(f"{where}: unknown column kind {kind!r} (one of {', '.join(allowed)})")
    for name, cells in zip(names, body):
        expected = (comparison_values(name, runs, spec.get("metric", "test_accuracy"), where) if comparing
                    else row_values(name, runs, where))
        for kind, head, cell in zip(columns, header, cells):
            if kind != "-":
                check_cell(cell, expected[kind], f"{where}, row {name!r}, column {head!r}")


def row_values(config_id: str, runs: dict, where: str) -> dict:
    if config_id not in runs:
        raise Mismatch(f"{where}: the study has no configuration {config_id!r}")
    accuracy = row_of(runs[config_id], "test_accuracy")
    values = {"accuracy": [accuracy["mean"], accuracy["std"]], "ci95": accuracy["ci95"] or [None, None]}
    for name in (*LOSSES, *FIGURES):
        stats = row_of(runs[config_id], name)
        values[name] = [stats["mean"], stats["std"]]
    return values


def comparison_values(pair: str, runs: dict, metric: str, where: str) -> dict:
    first, sep, second = pair.partition(" - ")
    if not sep or first not in runs or second not in runs:
        raise Mismatch(f"{where}: {pair!r} is not 'A - B' of two configurations of the study")
    a, b = row_of(runs[second], metric), row_of(runs[first], metric)  # difference = first - second
    welch = welch_difference(a, b)
    paired = paired_difference(a, b)
    return {"difference": [None if welch is None else welch["difference"]],
            "welch": [None, None] if welch is None else welch["ci95"],
            "paired": [None, None] if paired is None else paired["ci95"]}


def check_summary(folder: Path, runs: dict) -> None:
    """summary.json must be what the run files give now (a stale or edited summary fails)."""
    kept = json.loads((folder / "summary.json").read_text())
    fresh = json.loads(json.dumps(summarize(folder, kept.get("figures", ()))))
    if kept != fresh:
        raise Mismatch(f"{folder}: summary.json is not what its run files give (rerun `tinygrad-caps study summary "
                       f"{folder}`)")


def check(results: Path, root: Path) -> list:
    """Every mismatch of ``results`` (RESULTS.md) against the run files under ``root``, one line each."""
    lines = results.read_text().splitlines()
    problems, cache = [], {}
    for start, rows in tables(lines):
        header, body = rows[0], rows[1:]
        where = f"{results.name}:{start + 1}"
        marker = marker_above(lines, start)
        heading = next((line for line in reversed(lines[:start]) if line.startswith("#")), "")
        needs = (any(h in " ".join(header).lower() for h in INTERVAL_HEADERS)
                 or heading.lstrip("#").strip().lower().startswith("study:"))
        if marker is None:
            if needs:
                problems.append(f"{where}: a study table without a results or files-not-kept comment")
            continue
        if marker.group(1) == "files not kept":
            continue
        try:
            check_table(parse_marker(marker.group(2)), header, body, root, cache, where)
        except Mismatch as exc:
            problems.append(str(exc))
    return problems


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "RESULTS.md")
    parser.add_argument("--root", type=Path, default=ROOT, help="the folder the comments' paths start from")
    args = parser.parse_args(argv)
    if not args.results.is_file():
        print(f"check_results: {args.results} is not a file", file=sys.stderr)
        return 2
    problems = check(args.results, args.root)
    for line in problems:
        print(line)
    checked = sum(1 for line in args.results.read_text().splitlines() if "<!-- results:" in line)
    print(f"check_results: {checked} tables checked, {len(problems)} mismatch{'es' * (len(problems) != 1)}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
