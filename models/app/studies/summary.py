"""A study's summary, from its plan (DIR/study.json) and its finished run folders: DIR/summary.json,
DIR/summary.md and (with matplotlib) DIR/summary.png.

summary.json: {"study", "metric": "test_accuracy", "epochs", "complete", "rows": [{"config_id",
"config" (the configuration's own options), "n", "seeds", "values" (each finished seed's
final-epoch test accuracy, in seed order), "mean", "std" (sample, ddof 1; null for one seed),
"ci95" (the Student-t 95% interval of the mean), "metrics": {name: {"n", "mean", "std", "ci95"}}
for the final train and test loss and the study's gradient-flow figures, "curves"}],
"comparisons": [...], "failed" (only where a run has failed: [{"config_id", "seed", "path", "error":
its last error line}] from RUN/failed.json), "classes": the number of classes of the runs' data (their config.json's
num_classes; null where no run has written one or they disagree): summary.png's chance level is 1/classes}.

The gradient-flow figures of a run are the means over the logged steps of its last epoch
(``gradflow.jsonl``; the last logged step before it where that epoch logged none) of each line's
value (``analysis.figures.line_values``); the built-in ones (``study_figure_names()`` adds those
registered with ``register_figure``):

    t_score          the network's T-score: the mean over routing layers of their last iteration's T
    d_score          the D-score of the hidden capsule layers (their mean; Peer et al.'s D-score)
    digit_d_score    DigitCaps' D (forced by the margin loss: not comparable to Peer et al.'s)
    inner_share      of the gradient norms reaching DigitCaps' u_hat through each path and iteration,
                     the share of the inner iterations' paths (r < R-1; none at 1 iteration)
    lowest_grad_norm the gradient norm reaching the lowest routing layer's u_hat, summed over paths
    mode_cosine      the cosine between the step's gradient (all parameters) and the other routing-
                     gradient mode's on the same batch and weights (``--log-mode-cosine``)

"comparisons" holds, for every two configurations whose options differ in one option only and that
have two or more seeds each, the difference of their mean test accuracies with its Welch 95%
interval, and whether that interval excludes 0 (the difference exceeds the seeds' spread); and,
over the seeds both have, the paired differences (seed by seed: the same seed gives both runs the
same batches and, where the option leaves the parameters' shapes alone, the same initial weights)
with their mean, sample sd and Student-t 95% interval ("paired").
"""
from __future__ import annotations

import io
import json
import math
from pathlib import Path

from tinygrad_caps.serialization import write_atomically

from ...analysis.confidence import mean_and_spread, paired_difference, welch_difference
from ...analysis.figures import line_values
from ...analysis.study_figures import DIGEST_KEY, plot_study_summary, png_text, summary_picture_digest
from ...errors import UsageError
from ..training.reporting import plural
from ..training.run_logs import read_json_lines, read_metrics
from ..training.run_folder import RunFolder
from .folder import StudyFolder, write_if_changed
from .outcome import Failure
from .plan import StudyPlan
from .registry import STUDIES
from .run_task import run_status

METRIC = "test_accuracy"
MATPLOTLIB_HINT = "pip install matplotlib, or pip install -e '.[viz]'"
LOSSES = ("train_loss", "test_loss")


def _last_epoch_lines(gradflow: list, epoch: int) -> list:
    lines = [line for line in gradflow if line.get("epoch") == epoch]
    if lines:
        return lines
    earlier = [line for line in gradflow if line.get("epoch", 0) <= epoch]
    return earlier[-1:]


def _mean(values):
    kept = [v for v in values if v is not None]
    return math.fsum(kept) / len(kept) if kept else None


def run_figures(run_dir: Path, epoch: int, names) -> dict:
    """{figure: the mean over the run's last-epoch logged steps} ({} without a gradflow.jsonl)."""
    path = RunFolder(run_dir).gradflow
    if not names or not path.exists():
        return {}
    lines = _last_epoch_lines([line for _, line in read_json_lines(path)], epoch)
    figures = [line_values(line, names) for line in lines]
    return {name: _mean([f[name] for f in figures]) for name in names}


def gradflow_curve(run_dir: Path, names, epochs: int) -> dict:
    """{"step": [...], figure: [...]} over every logged step of a run's first ``epochs`` epochs."""
    path = RunFolder(run_dir).gradflow
    if not names or not path.exists():
        return {}
    lines = [line for _, line in read_json_lines(path) if line.get("epoch", 0) <= epochs]
    figures = [line_values(line, names) for line in lines]
    return {"step": [line["step"] for line in lines], **{name: [f[name] for f in figures] for name in names}}


def _mean_curve(curves: list) -> dict:
    """Point-wise means of curves (dicts of lists, x first) at the x values all of them have (runs
    logged at different intervals meet only where their steps coincide)."""
    curves = [c for c in curves if c]
    if not curves:
        return {}
    x_name = next(iter(curves[0]))
    common = set(curves[0][x_name]).intersection(*(c[x_name] for c in curves[1:]))
    xs = [x for x in curves[0][x_name] if x in common]
    at = [{x: k for k, x in enumerate(c[x_name])} for c in curves]
    mean = {x_name: xs}
    for name in curves[0]:
        if name != x_name:
            mean[name] = [_mean([c[name][index[x]] for c, index in zip(curves, at)]) for x in xs]
    return mean


def _stats(values) -> dict:
    spread = mean_and_spread(values)
    return {k: spread[k] for k in ("n", "mean", "std", "ci95")}


def summarize(out, figures=None) -> dict:
    """The summary of the study in ``out`` (a StudyFolder or its path; not written: see
    ``write_summary``). ``figures``: the gradient-flow figures to report (default: those of the
    registered study, if it is registered)."""
    folder = StudyFolder.of(out)
    plan = StudyPlan.load(folder)
    if plan is None:
        raise UsageError(f"{folder} holds no study.json: is it a study folder?")
    if figures is None:
        figures = STUDIES[plan.study].figures if plan.study in STUDIES else ()
    epochs = plan.epochs
    rows, planned, done, failed = [], 0, 0, []
    for config in plan.configs:
        seeds, values, finals, figure_rows, learning, gradflow = [], [], [], [], [], []
        for run in config.runs:
            planned += 1
            run_folder = folder.run(run.config_id, run.seed)
            run_dir, metrics_path = run_folder.path, run_folder.metrics
            metrics = read_metrics(metrics_path) if metrics_path.exists() else []
            final = next((line for line in metrics if line["epoch"] == epochs), None)
            if final is None:
                check_unfinished(run_dir, metrics_path, epochs)
                failure = Failure.read(run_folder)
                if failure is not None:
                    failed.append({"config_id": run.config_id, "seed": run.seed, "path": run.path,
                                   "error": failure.error})
                continue
            done += 1
            seeds.append(run.seed)
            values.append(final[METRIC])
            finals.append(final)
            figure_rows.append(run_figures(run_dir, epochs, figures))
            learning.append({"epoch": [m["epoch"] for m in metrics if m["epoch"] <= epochs],
                             METRIC: [m[METRIC] for m in metrics if m["epoch"] <= epochs]})
            gradflow.append(gradflow_curve(run_dir, figures, epochs))
        row = {"config_id": config.config_id, "config": dict(config.options), "seeds": seeds, "values": values,
               **_stats(values)}
        row["metrics"] = {name: _stats([f[name] for f in finals]) for name in LOSSES}
        row["metrics"].update({name: _stats([f.get(name) for f in figure_rows]) for name in figures})
        row["curves"] = {"learning": _mean_curve(learning), "gradflow": _mean_curve(gradflow)}
        rows.append(row)
    summary = {"study": plan.study, "metric": METRIC, "epochs": epochs, "complete": planned == done,
               "runs_finished": done, "runs_planned": planned, "figures": list(figures), "rows": rows,
               "comparisons": comparisons(rows), "classes": study_classes(folder, plan)}
    if failed:  # (absent otherwise: the summary of a study without failures keeps its bytes)
        summary["failed"] = failed
    return summary


def study_classes(out, plan: StudyPlan):
    """The number of classes of the study's runs: the ``num_classes`` (a positive integer) their
    config.json files hold, or None where no run has written a readable one or the runs disagree.
    ``out``: the study folder (a StudyFolder or its path)."""
    folder, found = StudyFolder.of(out), set()
    for run in plan.runs():
        path = folder.run(run.config_id, run.seed).config
        try:
            classes = json.loads(path.read_text()).get("num_classes") if path.is_file() else None
        except (OSError, ValueError, AttributeError):
            classes = None
        if isinstance(classes, int) and not isinstance(classes, bool) and classes > 0:
            found.add(classes)
    return found.pop() if len(found) == 1 else None


def check_unfinished(run_dir: Path, metrics_path: Path, epochs: int) -> None:
    """A run whose metrics.jsonl has no line for epoch ``epochs`` has not finished it (it is left
    out of the summary), unless its checkpoint says it has: then its log was lost, and the summary
    would silently drop it, so that is a UsageError naming the run."""
    if run_status(run_dir, epochs) != "finished":
        return
    lost = "is missing" if not metrics_path.exists() else f"has no line for epoch {epochs}"
    raise UsageError(f"run {run_dir}: its checkpoint has finished epoch {epochs} but its {metrics_path.name} {lost}; "
                     "delete the run folder and continue the study with --resume to train it again")


def non_finite_field(value, where: str = "summary"):
    """The first field of ``value`` (dicts and lists of numbers) that holds NaN or an infinity, as
    ``rows[0].metrics.t_score.mean``, or None."""
    if isinstance(value, float) and not math.isfinite(value):
        return where
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        found = non_finite_field(item, f"{where}[{key}]" if isinstance(key, int) else f"{where}.{key}")
        if found is not None:
            return found
    return None


def summary_json(summary: dict, path) -> str:
    """summary.json's text; UsageError naming the field where a number is NaN or infinite (which
    JSON cannot hold: a run's log holds a non-finite value)."""
    field = non_finite_field(summary)
    if field is not None:
        raise UsageError(f"{path}: not written: {field} is not a finite number (a run's metrics.jsonl or "
                         "gradflow.jsonl holds a NaN or an infinity)")
    return json.dumps(summary, indent=2, allow_nan=False) + "\n"


def _differing_option(a: dict, b: dict):
    keys = set(a) | set(b)
    differing = [k for k in sorted(keys) if a.get(k) != b.get(k)]
    return differing[0] if len(differing) == 1 else None


def comparisons(rows: list) -> list:
    """The Welch and paired differences of every two rows one option apart (see the module docstring)."""
    found = []
    for i, a in enumerate(rows):
        for b in rows[i + 1:]:
            option = _differing_option(a["config"], b["config"])
            difference = welch_difference(a, b) if option else None
            if difference is not None:
                found.append({"from": a["config_id"], "to": b["config_id"], "option": option, **difference,
                              "paired": paired_difference(a, b)})
    return found


def _number(value, digits=4) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}f}" if 1e-3 <= abs(value) < 1e4 or value == 0 else f"{value:.2e}"


def _interval(ci) -> str:
    return "-" if ci is None else f"[{_number(ci[0])}, {_number(ci[1])}]"


def _mean_sd(stats: dict) -> str:
    if stats["mean"] is None:
        return "-"
    return _number(stats["mean"]) + ("" if stats["std"] is None else f" ± {_number(stats['std'])}")


def _options_text(options: dict) -> str:
    return ", ".join(f"{k}={json.dumps(v)}" for k, v in options.items()) or "(the shared options)"


def summary_markdown(summary: dict) -> str:
    """summary.json as Markdown: one row per configuration, then the comparisons."""
    figures = summary["figures"]
    lines = [f"# Study {summary['study']}: {summary['metric']} after {plural(summary['epochs'], 'epoch')}",
             "",
             f"{summary['runs_finished']} of {plural(summary['runs_planned'], 'run')} finished"
             + ("." if summary["complete"] else " (the others are not in the table)."),
             "Mean ± sample standard deviation over the seeds; 95%: the Student-t interval of the mean.",
             ""]
    if summary.get("failed"):
        lines += [f"Failed ({plural(len(summary['failed']), 'run')}; `study run --resume` trains them again):", ""]
        lines += [f"- {f['config_id']} seed {f['seed']}: {f['error']}" for f in summary["failed"]]
        lines.append("")
    lines += ["| configuration | options | n | test accuracy | 95% | values | train loss | test loss |"
              + "".join(f" {name} |" for name in figures),
              "| --- | --- | --- | --- | --- | --- | --- | --- |" + " --- |" * len(figures)]
    for row in summary["rows"]:
        values = ", ".join(f"{v:.4f}" for v in row["values"]) or "-"
        cells = [row["config_id"], _options_text(row["config"]), str(row["n"]), _mean_sd(row), _interval(row["ci95"]),
                 values, _mean_sd(row["metrics"]["train_loss"]), _mean_sd(row["metrics"]["test_loss"])]
        cells += [_mean_sd(row["metrics"][name]) for name in figures]
        lines.append("| " + " | ".join(cells) + " |")
    if summary["comparisons"]:
        lines += ["", "Configurations one option apart: difference of the mean test accuracies (second minus first) "
                      "with its Welch 95% interval, and the paired differences seed by seed with their Student-t 95% "
                      "interval; \"exceeds\": the interval excludes 0.", "",
                  "| from | to | option | difference | Welch 95% | exceeds | paired, mean ± sd | paired 95% | exceeds |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for c in summary["comparisons"]:
            paired = c.get("paired")
            paired_cells = (f"{_mean_sd(paired)} | {_interval(paired['ci95'])} | {'yes' if paired['exceeds_spread'] else 'no'}"
                            if paired else "- | - | -")
            lines.append(f"| {c['from']} | {c['to']} | {c['option']} | {c['difference']:+.4f} | {_interval(c['ci95'])} "
                         f"| {'yes' if c['exceeds_spread'] else 'no'} | {paired_cells} |")
    return "\n".join(lines) + "\n"


def write_summary(out, figures=None, redraw: bool = True) -> dict:
    """Write DIR/summary.json, summary.md and (with matplotlib) summary.png where they change;
    returns the summary with "written": the files written, "unchanged": those that held it already,
    and "not_drawn": the pictures not drawn, each with why and how to get it (without matplotlib).
    ``out``: the study folder (a StudyFolder or its path). ``redraw=False`` (``study run``) keeps a
    summary.png drawn from this summary by this code and matplotlib version (its digest, see
    ``summary_picture_digest``) without drawing it again; ``study summary`` draws it."""
    folder = StudyFolder.of(out)
    summary = summarize(folder, figures)
    texts = {folder.summary_json: summary_json(summary, folder.summary_json),
             folder.summary_md: summary_markdown(summary)}
    written, unchanged = [], []
    for path, text in texts.items():
        (written if write_if_changed(path, text) else unchanged).append(path)
    digest, path, not_drawn = summary_picture_digest(summary), folder.summary_png, []
    if not redraw and digest is not None and path.is_file() and png_text(path.read_bytes()).get(DIGEST_KEY) == digest:
        unchanged.append(path)
    else:
        picture = io.BytesIO()
        if not plot_study_summary(summary, picture, digest):
            not_drawn.append(f"{path} (it needs matplotlib: {MATPLOTLIB_HINT})")
        elif not path.exists() or path.read_bytes() != picture.getvalue():
            # whole or not at all: a kill while writing leaves the old picture, never half a new one
            write_atomically(path, lambda f: f.write(picture.getvalue()), usual_permissions=True)
            written.append(path)
        else:
            unchanged.append(path)
    return dict(summary, written=[str(p) for p in written], unchanged=[str(p) for p in unchanged], not_drawn=not_drawn)
