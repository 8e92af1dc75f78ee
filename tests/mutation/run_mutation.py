"""Mutation score of the suite without PyTorch, with cosmic-ray (``pip install -e ".[mutation]"``).

    python tests/mutation/run_mutation.py --out /tmp/mutation                  # every mutant
    python tests/mutation/run_mutation.py --out /tmp/mutation --sample 300     # a seeded sample

Mutates tinygrad_caps/ops/, tinygrad_caps/optim/, dynamic and uniform routing and their shared helpers
(models/capsnet/routing/dynamic.py, uniform.py, common.py), models/capsnet/losses.py and
models/capsnet/model.py, each module against its own fast test selection (SELECTIONS), in a copy of the
tree (the working tree is never modified) with PyTorch and CuPy hidden (tests/mutation/without_torch.py) and
the Hypothesis profile "mutation" (reproducible, no shrinking). ``--sample N`` draws N mutants in all,
each module's share proportional to its number of mutants (at least one), with ``--seed``.

Writes under ``--out``: one cosmic-ray session per module (``<module>.sqlite``, readable with
``cr-report``), ``summary.json`` (killed / survived / incompetent per module and in all) and
``survivors.md`` (every surviving mutant's diff). A timeout counts as killed (cosmic-ray's rule).
"""
from __future__ import annotations

import argparse
import json
import math
import pathlib
import random
import shlex
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from tree_copy import copy_tree, environment

FAST = ["tests/engine/test_op_arguments.py", "tests/engine/test_forward_values.py"]
OPTIM = ["tests/models/test_fixtures.py", "tests/app/test_defaults.py", "tests/engine/test_optim_arguments.py",
         "tests/engine/test_optim.py"]
MODELS = ["tests/models/test_routing_reference.py", "tests/models/test_fixtures.py", "tests/app/test_defaults.py",
          "tests/models/test_capsnet_layers.py", "tests/models/test_capsnet_semantics.py",
          "tests/models/test_official_conventions.py", "tests/models/test_capsnet_variants.py",
          "tests/models/test_squash_and_capsule_init.py"]

# module -> the tests that exercise it, fastest first (each run stops at the first failure)
SELECTIONS = {
    "tinygrad_caps/ops/_common.py": FAST + ["tests/engine/test_grad_shape_reduce.py",
                                            "tests/engine/test_grad_elementwise.py"],
    "tinygrad_caps/ops/activation.py": FAST + ["tests/engine/test_grad_elementwise.py", "tests/engine/test_grad_nn_ops.py"],
    "tinygrad_caps/ops/capsule.py": FAST + ["tests/models/test_routing_reference.py",
                                            "tests/engine/test_grad_capsule_ops.py"],
    "tinygrad_caps/ops/conv.py": ["tests/engine/test_op_arguments.py", "tests/engine/test_conv.py"],
    "tinygrad_caps/ops/elementwise.py": FAST + ["tests/engine/test_grad_elementwise.py"],
    "tinygrad_caps/ops/identity.py": FAST + ["tests/engine/test_grad_nn_ops.py", "tests/engine/test_grad_elementwise.py"],
    "tinygrad_caps/ops/linalg.py": FAST + ["tests/engine/test_grad_nn_ops.py"],
    "tinygrad_caps/ops/loss.py": FAST + ["tests/engine/test_grad_nn_ops.py"],
    "tinygrad_caps/ops/normalization.py": FAST + ["tests/engine/test_grad_nn_ops.py", "tests/engine/test_nn.py"],
    "tinygrad_caps/ops/reduce.py": FAST + ["tests/engine/test_grad_shape_reduce.py"],
    "tinygrad_caps/ops/shape.py": FAST + ["tests/engine/test_grad_shape_reduce.py", "tests/engine/test_grad_elementwise.py"],
    "tinygrad_caps/optim/optimizer.py": OPTIM,
    "tinygrad_caps/optim/lr_scheduler.py": OPTIM,
    "models/capsnet/routing/dynamic.py": MODELS,
    "models/capsnet/routing/uniform.py": MODELS,
    "models/capsnet/routing/common.py": MODELS + ["tests/models/test_routing_algorithms.py"],
    "models/capsnet/losses.py": MODELS,
    "models/capsnet/model.py": MODELS,
}
DEFAULT_SELECTION = FAST + ["tests/engine/test_grad_nn_ops.py", "tests/engine/test_grad_shape_reduce.py"]
TARGETS = ["tinygrad_caps/ops", "tinygrad_caps/optim", "models/capsnet/routing/dynamic.py",
           "models/capsnet/routing/uniform.py", "models/capsnet/routing/common.py", "models/capsnet/losses.py",
           "models/capsnet/model.py"]


def target_modules(tree: pathlib.Path) -> list[str]:
    modules = []
    for target in TARGETS:
        path = tree / target
        found = sorted(path.glob("*.py")) if path.is_dir() else [path]
        modules += [str(p.relative_to(tree)) for p in found if p.name != "__init__.py"]
    return modules


def selection(module: str, tree: pathlib.Path) -> list[str]:
    return [t for t in SELECTIONS.get(module, DEFAULT_SELECTION) if (tree / t).exists()]


def test_command(module: str, tree: pathlib.Path) -> str:
    tests = selection(module, tree)
    return shlex.join([sys.executable, "tests/mutation/without_torch.py", "--hide", "cupy", "--hide", "cupyx",
                       "-q", "-x", "-p", "no:cacheprovider",
                       "--hypothesis-profile", "mutation", *tests])


def write_config(module: str, tree: pathlib.Path, folder: pathlib.Path, timeout: float) -> pathlib.Path:
    config = folder / (module.replace("/", "_") + ".toml")
    config.write_text("\n".join([
        "[cosmic-ray]",
        f"module-path = {json.dumps(module)}",
        f"timeout = {timeout}",
        "excluded-modules = []",
        f"test-command = {json.dumps(test_command(module, tree))}",
        "[cosmic-ray.distributor]",
        'name = "local"', ""]))
    return config


def run(command, tree, **kw):
    return subprocess.run(command, cwd=tree, env=environment(tree), text=True, capture_output=True, **kw)


def init_session(module, tree, folder, timeout):
    config = write_config(module, tree, folder, timeout)
    session = folder / (module.replace("/", "_") + ".sqlite")
    session.unlink(missing_ok=True)
    result = run(["cosmic-ray", "init", str(config), str(session)], tree)
    if result.returncode != 0:
        raise RuntimeError(f"cosmic-ray init failed for {module}: {result.stderr}")
    return config, session


def job_ids(session):
    from cosmic_ray.work_db import WorkDB, use_db

    with use_db(str(session), WorkDB.Mode.open) as db:
        return sorted(item.job_id for item in db.pending_work_items)


def skip_all_but(session, keep):
    """Mark every work item not in ``keep`` as skipped (as cosmic-ray's own filters do)."""
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import WorkerOutcome, WorkResult

    with use_db(str(session), WorkDB.Mode.open) as db:
        skipped = [item.job_id for item in db.pending_work_items if item.job_id not in keep]
        db.set_multiple_results(skipped, WorkResult(worker_outcome=WorkerOutcome.SKIPPED, output="not sampled"))


def allocate(counts: dict, total: int | None) -> dict:
    """Each module's share of ``total`` mutants, proportional to its count, at least one (None: all)."""
    if total is None:
        return dict(counts)
    all_mutants = sum(counts.values())
    return {m: min(n, max(1, math.floor(total * n / all_mutants + 0.5))) for m, n in counts.items() if n}


def collect(module, session):
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import TestOutcome, WorkerOutcome

    tally = {"killed": 0, "survived": 0, "incompetent": 0, "not run": 0}
    survivors = []
    with use_db(str(session), WorkDB.Mode.open) as db:
        items = {item.job_id: item for item in db.work_items}
        for job_id, result in db.results:
            if result.worker_outcome == WorkerOutcome.SKIPPED:
                continue
            if result.worker_outcome != WorkerOutcome.NORMAL:
                tally["incompetent"] += 1
            elif result.test_outcome == TestOutcome.KILLED:
                tally["killed"] += 1
            elif result.test_outcome == TestOutcome.SURVIVED:
                tally["survived"] += 1
                spec = items[job_id].mutations[0]
                survivors.append(dict(module=module, line=spec.start_pos[0], operator=spec.operator_name,
                                      function=spec.definition_name, diff=result.diff))
            else:
                tally["incompetent"] += 1
        tally["not run"] = len(db.pending_work_items)
    return tally, survivors


def run_module(module, tree, folder, config, session, log):
    start = time.time()
    result = run(["cosmic-ray", "exec", str(config), str(session)], tree)
    tally, survivors = collect(module, session)
    log(f"{module}: {tally} in {time.time() - start:.0f} s" + (f"\n{result.stderr[-2000:]}" if result.returncode else ""))
    return module, tally, survivors


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder for the sessions and the reports")
    parser.add_argument("--sample", type=int, default=None, help="run N mutants in all (default: every one)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--modules", nargs="*", default=None, help="only these modules (paths as in SELECTIONS)")
    parser.add_argument("--workers", type=int, default=1, help="modules mutated at once, each in its own copy")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds per test run (a timeout counts as killed)")
    parser.add_argument("--report-only", action="store_true", help="only summarize the sessions already in --out")
    args = parser.parse_args(argv)
    out = pathlib.Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    log_file = open(out / "log.txt", "a")

    def log(message):
        print(message, flush=True)
        log_file.write(message + "\n")
        log_file.flush()

    if args.report_only:
        report_only(out, log)
        return 0
    base = copy_tree(out / "tree-0")
    modules = args.modules or target_modules(base)
    for command in sorted({test_command(m, base) for m in modules}):  # the unmutated tree passes every selection
        result = run(shlex.split(command), base)
        if result.returncode != 0:
            raise SystemExit(f"baseline fails: {command}\n{result.stdout[-3000:]}")
    log(f"baseline passes for {len(modules)} modules")
    sessions = {m: init_session(m, base, out, args.timeout) for m in modules}
    counts = {m: len(job_ids(s)) for m, (_, s) in sessions.items()}
    shares = allocate(counts, args.sample)
    rng = random.Random(args.seed)
    for module, (_, session) in sessions.items():
        ids = job_ids(session)
        skip_all_but(session, set(rng.sample(ids, shares.get(module, 0))))
    log(f"mutants: {sum(counts.values())} generated, {sum(shares.values())} to run: {shares}")

    # cosmic-ray edits the files in place: each worker mutates its own copy, its modules one after another
    trees = [base] + [copy_tree(out / f"tree-{k}") for k in range(1, args.workers)]
    order = sorted(modules, key=lambda m: -shares.get(m, 0))
    queues = [order[k::len(trees)] for k in range(len(trees))]

    def work(k):
        return [run_module(m, trees[k], out, *sessions[m], log) for m in queues[k]]

    results = []
    with ThreadPoolExecutor(len(trees)) as pool:
        for done in pool.map(work, range(len(trees))):
            results += done

    write_reports(out, results, counts, args.sample, args.seed, log)
    return 0


def write_reports(out, results, counts, sample, seed, log):
    summary = {"tool": "cosmic-ray", "sample": sample, "seed": seed, "generated": counts, "modules": {}}
    survivors = []
    for module, tally, found in sorted(results, key=lambda r: r[0]):
        summary["modules"][module] = tally
        survivors += found
    total = {k: sum(t[k] for t in summary["modules"].values()) for k in ("killed", "survived", "incompetent", "not run")}
    summary["total"] = total
    judged = total["killed"] + total["survived"]
    summary["score"] = total["killed"] / judged if judged else None
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    lines = [f"# Surviving mutants ({len(survivors)})", ""]
    for s in survivors:
        lines += [f"## {s['module']}:{s['line']} {s['operator']} in {s['function']}", "", "```diff", s["diff"] or "", "```", ""]
    (out / "survivors.md").write_text("\n".join(lines))
    log(f"score {summary['score']:.3f}: {total}" if judged else f"nothing judged: {total}")


def report_only(out, log):
    """Summaries from the sessions already in ``out`` (e.g. of a run stopped early: "not run" counts the rest)."""
    results, counts = [], {}
    from cosmic_ray.work_db import WorkDB, use_db

    for session in sorted(out.glob("*.sqlite")):
        with use_db(str(session), WorkDB.Mode.open) as db:
            items = list(db.work_items)
        if not items:
            continue
        module = str(items[0].mutations[0].module_path)
        counts[module] = len(items)
        tally, found = collect(module, session)
        results.append((module, tally, found))
    write_reports(out, results, counts, None, None, log)


if __name__ == "__main__":
    sys.exit(main())
