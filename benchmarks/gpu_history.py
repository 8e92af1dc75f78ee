"""The GPU history: every gpu_check run's figures in ``benchmarks/history/gpu/<date>-<gpu>.json``, compared
with the last run on a GPU of the same model, so that no figure regresses unseen.

A history file::

    {"format": 1, "date": "2026-11-28", "gpu": "NVIDIA H200", "gpu_model": "nvidia-h200",
     "transcribed": null or where the figures were copied from (a file not written by gpu_check),
     "versions": {...}, "figures": {NAME: {"value": number or null, "unit": "ms", "better": "lower"
                                            | "higher" | null, "goal": "...", "note": "..."}}}

``better`` says which way a figure improves; a figure of someone else's (PyTorch's times) has none
and is only reported. ``value`` null: not measured, with the reason in ``note``.

    python benchmarks/gpu_history.py record OUTDIR [--history-dir benchmarks/history/gpu]
        (gpu_check.sh, after its summary: the figures of OUTDIR/gpu_summary.json into a new history
        file, also copied to OUTDIR; the comparison with the last file of the same GPU model into the
        summary, and printed)
    python benchmarks/gpu_history.py table FILE [FILE ...]
        (the figures of several runs side by side, with their goals: the table of RESULTS.md)

``python benchmarks/compare_gpu_runs.py OLD.json NEW.json`` compares two files (see it).
"""
from __future__ import annotations

import argparse
import datetime
import json
import re
import shutil
import sys
from pathlib import Path

FORMAT = 1
HISTORY_DIR = Path(__file__).resolve().parent / "history" / "gpu"
TOLERANCE = 0.10  # a time that grew, or a fraction that fell, by more than this is a regression

STEP_GOAL = "ours / PyTorch's fastest <= 1.0x (moonshot 0.8x)"
KERNEL_GOALS = {"capsule_predict": ">= 0.8", "capsule_grad (u and W)": ">= 0.5", "capsule_grad_u": ">= 0.5",
                "capsule_grad_w": ">= 0.5", "routing_agreement": ">= 0.6", "im2col (PrimaryCaps)": ">= 0.5"}
TORCH_NAMES = {"torch-eager": "PyTorch eager", "torch-graph": "PyTorch CUDA graph",
               "torch-compile-reduce-overhead": "torch.compile reduce-overhead",
               "torch-compile-max-autotune": "torch.compile max-autotune"}


def model_of(gpu: str) -> str:
    """The GPU model as a file name part: "NVIDIA H200" -> "nvidia-h200"."""
    return re.sub(r"[^a-z0-9]+", "-", (gpu or "unknown gpu").lower()).strip("-")


def figure(value, unit: str, better: str | None, goal: str = "", note: str = "") -> dict:
    """One figure's record (see the module docstring)."""
    out = {"value": None if value is None else float(value), "unit": unit, "better": better}
    if goal:
        out["goal"] = goal
    if note:
        out["note"] = note
    return out


def _count(text, word):
    found = re.search(rf"(\d+) {word}", text or "")
    return int(found.group(1)) if found else None


def figures_from_summary(summary: dict) -> dict:
    """The figures of a gpu_check summary (gpu_summary.json) under their history names."""
    found = {}
    figures = summary.get("figures", {})
    for row in figures.get("train_step_ms", []):
        head = f"step B={row['batch']} {row['precision']}"
        ms = row.get("ms") or {}
        skipped = row.get("skipped") or {}
        for name, label in (("ours-captured", "ours captured"), ("ours-eager", "ours eager")):
            if name in ms or name in skipped:
                found[f"{head}: {label} (ms)"] = figure(ms.get(name), "ms", "lower", note=skipped.get(name, ""))
        for name, label in TORCH_NAMES.items():
            if name in ms or name in skipped:
                compile_s = (row.get("compile_s") or {}).get(name)
                note = skipped.get(name, "") or (f"compile {compile_s} s" if compile_s else "")
                found[f"{head}: {label} (ms)"] = figure(ms.get(name), "ms", None, note=note)
        ours = ms.get("ours-captured") or ms.get("ours-eager")
        if ours and ms.get("torch-compile-reduce-overhead"):
            found[f"{head}: ours / torch.compile reduce-overhead"] = figure(
                ours / ms["torch-compile-reduce-overhead"], "x", "lower", "<= 1.0x (moonshot 0.8x)")
        if row.get("ratio_to_fastest_pytorch") is not None:
            found[f"{head}: ours / PyTorch's fastest"] = figure(
                row["ratio_to_fastest_pytorch"], "x", "lower", STEP_GOAL, note=f"fastest: {row.get('fastest_pytorch')}")
        if row.get("ours_fraction_of_peak") is not None:
            found[f"{head}: ours, fraction of the peak"] = figure(row["ours_fraction_of_peak"], "fraction", "higher")
        if row.get("memory_captured_to_eager") is not None:
            found[f"{head}: captured memory / eager peak"] = figure(row["memory_captured_to_eager"], "x", "lower",
                                                                    "<= 1.1")
    goals = figures.get("kernel_bandwidth_goals", {})
    for name, value in figures.get("kernel_fraction_of_copy_bandwidth", {}).items():
        variant = (figures.get("kernel_variants") or {}).get(name)
        goal = goals.get(name, {}).get("goal")
        found[f"kernel {name}: fraction of copy bandwidth"] = figure(
            value, "fraction", "higher", f">= {goal}" if goal else KERNEL_GOALS.get(name, ""),
            note=f"variant {variant}" if variant else "")
    fused = figures.get("fused_forward_speedup")
    if fused:
        found["fused routing forward / op-by-op"] = figure(fused["speedup"], "x", "higher", ">= 5x")
    for run, values in (figures.get("first_epoch_seconds") or {}).items():
        found[f"first epoch, {run} (s)"] = figure(values["epoch"], "s", "lower", "<= 5 s cold" if run != "warm" else "",
                                                  note=f"{values.get('new_cache_files')} new kernel cache files")
    if figures.get("epoch_seconds") is not None:
        found["Fashion-MNIST epoch, full model, B=100 (s)"] = figure(figures["epoch_seconds"], "s", "lower")
    tests = summary.get("gpu_tests") or ""
    if tests:
        found["GPU tests failed"] = figure((_count(tests, "failed") or 0) + (_count(tests, "error") or 0), "tests",
                                           "lower", "0")
        found["GPU tests passed"] = figure(_count(tests, "passed"), "tests", None)
    for tool, word in (("memcheck", "errors"), ("racecheck", "hazards")):
        line = (summary.get("sanitizers") or {}).get(tool)
        if line:
            count = _count(line, word)
            found[f"compute-sanitizer {tool}: {word}"] = figure(count if count is not None else _count(line, word[:-1]),
                                                              word, "lower", "0")
    return found


def history_record(summary: dict, date: str | None = None) -> dict:
    """A history file's content for a gpu_check summary."""
    versions = summary.get("versions", {})
    gpu = versions.get("gpu", "unknown GPU")
    date = date or (summary.get("date") or datetime.date.today().isoformat())[:10]
    return {"format": FORMAT, "date": date, "gpu": gpu, "gpu_model": model_of(gpu), "transcribed": None,
            "profile": summary.get("profile"), "passed": summary.get("passed"), "versions": versions,
            "figures": figures_from_summary(summary)}


def read(path) -> dict:
    """A history file (ValueError naming the file where it is not one)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: not a readable GPU history file ({exc})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("figures"), dict):
        raise ValueError(f"{path}: not a GPU history file of format {FORMAT}")
    return data


def history_files(folder=HISTORY_DIR) -> list:
    """The history files in ``folder``, oldest first (by date, then by name)."""
    folder = Path(folder)
    found = []
    for path in folder.glob("*.json") if folder.is_dir() else ():
        try:
            data = read(path)
        except ValueError:
            continue
        suffix = path.stem[len(f"{data['date']}-{data.get('gpu_model')}"):]  # "" or "-2", "-3" (free_name)
        sequence = int(suffix[1:]) if suffix[1:].isdigit() else 1
        found.append((data["date"], sequence, path.name, path))
    return [path for *_, path in sorted(found)]


def newest_of_model(model: str, folder=HISTORY_DIR):
    """The newest history file of GPU model ``model`` (model_of's form) in ``folder``, or None."""
    same = [path for path in history_files(folder) if read(path).get("gpu_model") == model]
    return same[-1] if same else None


def free_name(folder: Path, date: str, model: str) -> Path:
    """``<date>-<model>.json`` in ``folder``, or ``<date>-<model>-2.json`` (-3, ...) where taken."""
    path, n = folder / f"{date}-{model}.json", 2
    while path.exists():
        path, n = folder / f"{date}-{model}-{n}.json", n + 1
    return path


def compare(old: dict, new: dict, tolerance: float = TOLERANCE) -> dict:
    """Each figure of ``new`` against ``old``: {"rows": [{"name", "old", "new", "ratio", "better",
    "regression", "improvement"}], "regressions": [names]}. A regression: a figure that improves
    downwards grew by more than ``tolerance``, or one that improves upwards fell by more than it (from a
    measured value to an unmeasured one counts too); figures of someone else's are only reported."""
    rows, regressions = [], []
    names = list(new["figures"]) + [name for name in old["figures"] if name not in new["figures"]]
    for name in names:
        before, after = old["figures"].get(name, {}), new["figures"].get(name, {})
        a, b = before.get("value"), after.get("value")
        better = after.get("better", before.get("better"))
        ratio = b / a if a not in (None, 0) and b is not None else None
        regression = improvement = False
        if better == "lower" and a is not None and b is not None:
            regression = b > a * (1 + tolerance) if a else b > 0
            improvement = b < a * (1 - tolerance)
        elif better == "higher" and a is not None and b is not None:
            regression = b < a * (1 - tolerance)
            improvement = b > a * (1 + tolerance) if a else b > 0
        elif better and a is not None and b is None and name in new["figures"]:
            regression = True  # measured before, not now
        row = {"name": name, "old": a, "new": b, "ratio": ratio, "better": better, "regression": regression,
               "improvement": improvement, "old_note": before.get("note", ""), "new_note": after.get("note", ""),
               "goal": after.get("goal") or before.get("goal", ""), "unit": after.get("unit") or before.get("unit", "")}
        rows.append(row)
        if regression:
            regressions.append(name)
    return {"rows": rows, "regressions": regressions, "tolerance": tolerance}


def _value(value, unit) -> str:
    if value is None:
        return "-"
    if unit == "fraction":
        return f"{value:.3f}"
    if unit in ("tests", "errors", "hazards") or abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.4g}"


def comparison_lines(old: dict, new: dict, result: dict) -> list:
    """The comparison as text: one line per figure, its ratio new/old and a flag."""
    lines = [f"{'figure':<68} {'old':>10} {'new':>10} {'new/old':>8}  "
             f"(old: {old['date']} {old['gpu']}{', transcribed' if old.get('transcribed') else ''}; "
             f"new: {new['date']} {new['gpu']})"]
    for row in result["rows"]:
        ratio = "-" if row["ratio"] is None else f"{row['ratio']:.3f}"
        flag = "REGRESSION" if row["regression"] else ("better" if row["improvement"] else "")
        if row["better"] is None:
            flag = "(reported only)"
        note = row["new_note"] if row["new"] is None else ""
        lines.append(f"{row['name'][:68]:<68} {_value(row['old'], row['unit']):>10} {_value(row['new'], row['unit']):>10} "
                     f"{ratio:>8}  {flag}{'  ' + note[:80] if note else ''}")
    count = len(result["regressions"])
    lines.append(f"{count} regression{'s' if count != 1 else ''} beyond {result['tolerance']:.0%}"
                 + (": " + "; ".join(result["regressions"]) if count else ""))
    return lines


def markdown_table(records: list) -> list:
    """The figures of ``records`` (history contents, oldest first) side by side with their goals."""
    names = []
    for record in records:
        names += [name for name in record["figures"] if name not in names]
    head = "| figure | goal | " + " | ".join(
        f"{r['gpu']}, {r['date']}{' (transcribed)' if r.get('transcribed') else ''}" for r in records) + " |"
    lines = [head, "| --- | --- | " + " | ".join("---" for _ in records) + " |"]
    for name in names:
        goal = next((r["figures"][name].get("goal") for r in reversed(records) if name in r["figures"]
                     and r["figures"][name].get("goal")), "")
        cells = []
        for record in records:
            entry = record["figures"].get(name)
            if entry is None:
                cells.append("")
            elif entry["value"] is None:
                cells.append(entry.get("note", "not measured"))
            else:
                cells.append(_value(entry["value"], entry["unit"]) + (f" ({entry['note']})" if entry.get("note") else ""))
        lines.append(f"| {name} | {goal} | " + " | ".join(cells) + " |")
    return lines


def record_run(outdir, history_dir=HISTORY_DIR, date: str | None = None) -> dict:
    """gpu_check's last step: the history file of OUTDIR/gpu_summary.json (also copied to OUTDIR as
    ``history-<name>``), compared with the newest earlier file of the same GPU model; the comparison
    goes into the summary. Returns the comparison section."""
    outdir, history_dir = Path(outdir), Path(history_dir)
    summary_path = outdir / "gpu_summary.json"
    summary = json.loads(summary_path.read_text())
    record = history_record(summary, date)
    previous = newest_of_model(record["gpu_model"], history_dir)
    history_dir.mkdir(parents=True, exist_ok=True)
    path = free_name(history_dir, record["date"], record["gpu_model"])
    path.write_text(json.dumps(record, indent=1) + "\n")
    shutil.copyfile(path, outdir / f"history-{path.name}")
    section = {"file": str(path), "against": None, "regressions": [], "lines": []}
    if previous is not None:
        old = read(previous)
        result = compare(old, record)
        section.update(against=str(previous), regressions=result["regressions"],
                       lines=comparison_lines(old, record, result))
    else:
        section["lines"] = [f"no earlier history file of a {record['gpu']} in {history_dir}: nothing to compare"]
    summary["history"] = section
    summary_path.write_text(json.dumps(summary, indent=2))
    return section


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    record = commands.add_parser("record", help="gpu_check's summary into the history, compared with the last run")
    record.add_argument("outdir")
    record.add_argument("--history-dir", default=str(HISTORY_DIR))
    table = commands.add_parser("table", help="several runs side by side, as markdown")
    table.add_argument("files", nargs="+")
    args = parser.parse_args(argv)
    try:
        if args.command == "record":
            section = record_run(args.outdir, args.history_dir)
            print(f"history: {section['file']}")
            for line in section["lines"]:
                print(line)
            return 0
        for line in markdown_table([read(path) for path in args.files]):
            print(line)
        return 0
    except (OSError, ValueError) as exc:
        print(f"gpu_history.py: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
