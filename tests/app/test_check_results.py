"""benchmarks/studies/check_results.py: every study table of RESULTS.md recomputed from the run files
kept in the repository; and, on a tiny study made here, that a changed figure, a stale summary, a
table without its comment or a comment naming the wrong rows each fail, naming the table and cell."""
import importlib.util
import json
import shutil

import pytest

from cli_helpers import TINY
from paths import ROOT
from study_helpers import study_data
from tinygrad_caps.models import cli
from tinygrad_caps.models.analysis.confidence import mean_and_spread, paired_difference, welch_difference

SPEC = importlib.util.spec_from_file_location("check_results", ROOT / "benchmarks" / "studies" / "check_results.py")
check_results = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(check_results)


def test_every_study_table_of_results_md_is_what_its_kept_run_files_give():
    problems = check_results.check(ROOT / "benchmarks" / "RESULTS.md", ROOT)
    assert problems == [], "\n".join(problems)


@pytest.fixture(scope="module")
def kept_study(tmp_path_factory):
    """A tiny gradient-modes study (3 configurations x 3 seeds, 2 epochs, gradflow logged) kept as RESULTS.md's
    studies are: its files under ROOT/benchmarks/studies/results/tiny, no checkpoints."""
    work = tmp_path_factory.mktemp("kept")
    out = work / "study"
    assert cli.main(["study", "run", "gradient-modes", "--out", str(out), *study_data(work), *TINY, "--seeds", "3",
                     "--epochs", "2", "--lr", "0.01", "--log-gradflow", "1", "--device", "cpu"]) == 0
    root = work / "root"
    kept = root / "benchmarks" / "studies" / "results" / "tiny"
    shutil.copytree(out, kept, ignore=shutil.ignore_patterns("checkpoints", "*.npz", "*.lock", "train.log"))
    return root, json.loads((kept / "summary.json").read_text())


def final_train_losses(root, config_id):
    """{seed: the final epoch's train loss} of a configuration of the kept study, read from its metrics.jsonl."""
    folder = root / "benchmarks" / "studies" / "results" / "tiny" / "runs" / config_id
    return {int(run.name.split("-")[1]): json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])["train_loss"]
            for run in sorted(folder.iterdir())}


def loss_comparison_table(root, first, second):
    """A comparison table of the final train loss, first minus second (their accuracies coincide on so
    little data), printed to six decimals."""
    a, b = final_train_losses(root, second), final_train_losses(root, first)
    row = lambda d: dict(mean_and_spread(list(d.values())), seeds=list(d), values=list(d.values()))  # noqa: E731
    welch, paired = welch_difference(row(a), row(b)), paired_difference(row(a), row(b))
    return ["", f"<!-- results: benchmarks/studies/results/tiny; comparisons: {first} - {second}; metric: train_loss;",
            "     columns: -, difference, welch, paired -->",
            "| comparison | train loss difference | Welch 95% | paired 95% |", "| --- | --- | --- | --- |",
            f"| detach minus full | {welch['difference']:+.6f} | [{welch['ci95'][0]:+.6f}, {welch['ci95'][1]:+.6f}] | "
            f"[{paired['ci95'][0]:+.6f}, {paired['ci95'][1]:+.6f}] |", ""]


def results_md(summary, figure_column="inner_share", root=None):
    """A RESULTS.md with the study's rows and one comparison, printed as RESULTS.md prints them."""
    rows = {row["config_id"]: row for row in summary["rows"]}
    lines = ["# Results", "", "<!-- results: benchmarks/studies/results/tiny; rows: routing1, routing3-full;",
             f"     columns: -, accuracy, ci95, train_loss, {figure_column} -->",
             "| configuration | test accuracy | 95% | train loss | inner share |", "| --- | --- | --- | --- | --- |"]
    for config_id in ("routing1", "routing3-full"):
        row = rows[config_id]
        low, high = row["ci95"]
        share = row["metrics"]["inner_share"]
        share_text = "-" if share["mean"] is None else f"{share['mean']:.3f} ± {share['std']:.3f}"
        lines.append(f"| {config_id} | {row['mean']:.4f} ± {row['std']:.4f} | [{low:.4f}, {high:.4f}] | "
                     f"{row['metrics']['train_loss']['mean']:.4f} | {share_text} |")
    comparison = next(c for c in summary["comparisons"] if (c["from"], c["to"]) == ("routing3-full", "routing3-detach"))
    w_low, w_high = comparison["ci95"]
    p_low, p_high = comparison["paired"]["ci95"]
    lines += ["", "<!-- results: benchmarks/studies/results/tiny; comparisons: routing3-detach - routing3-full;",
              "     columns: -, difference, welch, paired -->",
              "| comparison | difference | Welch 95% | paired 95% |", "| --- | --- | --- | --- |",
              f"| detach minus full | {comparison['difference']:+.4f} | [{w_low:+.4f}, {w_high:+.4f}] | "
              f"[{p_low:+.4f}, {p_high:+.4f}] |", ""]
    if root is not None:
        lines += loss_comparison_table(root, "routing3-detach", "routing3-full")
    return "\n".join(lines)


def check_text(root, text):
    path = root / "RESULTS.md"
    path.write_text(text)
    return check_results.check(path, root)


@pytest.mark.slow
def test_a_table_printed_from_the_run_files_passes(kept_study):
    root, summary = kept_study
    assert check_text(root, results_md(summary, root=root)) == []
    assert check_results.main(["--results", str(root / "RESULTS.md"), "--root", str(root)]) == 0


@pytest.mark.slow
def test_a_changed_figure_fails_naming_the_table_row_and_column(kept_study):
    root, summary = kept_study
    text = results_md(summary)
    row = next(r for r in summary["rows"] if r["config_id"] == "routing3-full")
    printed = f"{row['mean']:.4f} ± "
    changed = f"{row['mean'] + 0.0002:.4f} ± "
    lines = [line.replace(printed, changed) if line.startswith("| routing3-full") else line
             for line in text.splitlines()]
    problems = check_text(root, "\n".join(lines))
    assert len(problems) == 1 and "row 'routing3-full', column 'test accuracy'" in problems[0], problems
    assert problems[0].startswith("RESULTS.md:5")
    assert check_results.main(["--results", str(root / "RESULTS.md"), "--root", str(root)]) == 1


@pytest.mark.slow
def test_a_swapped_comparison_fails(kept_study):
    root, summary = kept_study
    table = "\n".join(loss_comparison_table(root, "routing3-detach", "routing3-full"))
    assert check_text(root, table) == []
    problems = check_text(root, table.replace("routing3-detach - routing3-full", "routing3-full - routing3-detach"))
    assert any("row 'routing3-full - routing3-detach', column 'train loss difference'" in p for p in problems), problems


@pytest.mark.slow
def test_a_stale_summary_json_fails(kept_study, tmp_path):
    root, summary = kept_study
    copy = tmp_path / "root"
    shutil.copytree(root, copy)
    path = copy / "benchmarks" / "studies" / "results" / "tiny" / "summary.json"
    stale = json.loads(path.read_text())
    stale["rows"][0]["mean"] += 0.01
    path.write_text(json.dumps(stale))
    problems = check_text(copy, results_md(summary))
    assert problems and "summary.json is not what its run files give" in problems[0]


@pytest.mark.slow
def test_an_interval_table_needs_its_comment_and_files_not_kept_is_one(kept_study):
    root, summary = kept_study
    bare = "| configuration | test accuracy | 95% |\n| --- | --- | --- |\n| a | 0.5 ± 0.1 | [0.3, 0.7] |\n"
    assert check_text(root, bare) == ["RESULTS.md:1: a study table without a results or files-not-kept comment"]
    assert check_text(root, "## Study: one seed\n\n| a | b |\n| --- | --- |\n| 1 | 2 |\n") == [
        "RESULTS.md:3: a study table without a results or files-not-kept comment"]
    assert check_text(root, "<!-- files not kept: deleted before files were kept -->\n" + bare) == []
    assert check_text(root, "| step | 100 |\n| --- | --- |\n| T | 0.1 |\n") == []  # no interval: no comment needed


@pytest.mark.slow
@pytest.mark.parametrize("damage, message", [
    (lambda t: t.replace("rows: routing1, routing3-full;", "rows: routing1;"), "names 1 rows, the table has 2"),
    (lambda t: t.replace("rows: routing1,", "rows: routing9,"), "the study has no configuration 'routing9'"),
    (lambda t: t.replace("columns: -, accuracy,", "columns: -, accuracy, -,"), "names 6 columns, the table has 5"),
    (lambda t: t.replace("columns: -, accuracy,", "columns: -, speed,"), "unknown column kind 'speed'"),
    (lambda t: t.replace("results/tiny; rows", "results/gone; rows"), "results/gone holds no study.json"),
])
def test_a_comment_that_does_not_fit_its_table_fails(kept_study, damage, message):
    root, summary = kept_study
    problems = check_text(root, damage(results_md(summary)))
    assert problems and message in problems[0], problems


def test_printed_numbers_match_to_half_a_unit_in_their_last_place():
    assert check_results.matches(check_results.printed_numbers("0.7917")[0], 0.79165)
    assert not check_results.matches(check_results.printed_numbers("0.7917")[0], 0.79164)
    assert check_results.matches(check_results.printed_numbers("1.3e-4")[0], 1.34e-4)
    assert not check_results.matches(check_results.printed_numbers("1.3e-4")[0], 1.36e-4)
    assert [v for v, _ in check_results.printed_numbers("[-0.0109, +0.0095]")] == [-0.0109, 0.0095]
    assert [v for v, _ in check_results.printed_numbers("0.885 (margin)")] == [0.885]
