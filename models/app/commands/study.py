"""``tinygrad-caps study list | run NAME | summary DIR``: the registered studies, training one over
its configurations and seeds (``study_runner``), and its summary (``study_summary``)."""
from __future__ import annotations

import shlex
import time
from pathlib import Path

from ...errors import UsageError
from ..progress import bars_wanted
from ..study_registry import STUDIES, get_study
from ..study_runner import (EXIT_TIME_LIMIT, STUDY_ONLY, continue_command, parse_seed_list, plan_study, train_runs,
                            write_plan)
from ..study_summary import summary_markdown, write_summary


def list_studies() -> str:
    """One line per registered study: its name, what it varies, its default budget and configurations."""
    width = max(len(name) for name in STUDIES)
    lines = []
    for name, study in STUDIES.items():
        count = len(study.configurations())
        lines.append(f"{name:<{width}}  {study.varies}; default {study.budget()}, {count} configurations")
    return "\n".join(lines)


def run(args) -> int:
    """Run the command for parsed ``args``; returns the exit status."""
    if args.study_command == "list":
        print(list_studies())
        return 0
    if args.study_command == "summary":
        summary = write_summary(args.out)
        print(summary_markdown(summary), end="")
        for path in summary["written"]:
            print(f"written: {path}")
        return 0
    return run_study(args)


def run_study(args) -> int:
    """``study run NAME``: plan (or continue) the study, train its runs, write its summary."""
    try:
        study = get_study(args.name)
    except KeyError as exc:
        raise UsageError(exc.args[0]) from None
    explicit = set(getattr(args, "explicit", set()))
    if args.seeds is not None and args.seed_list is not None:
        raise UsageError("give --seeds N or --seed-list S,S,..., not both")
    seeds = parse_seed_list(args.seed_list) if args.seed_list is not None else (
        list(range(args.seeds)) if args.seeds is not None else None)
    given = {k: v for k, v in vars(args).items() if k not in STUDY_ONLY}
    command = "tinygrad-caps " + shlex.join(getattr(args, "command_line", None) or ["study", "run", args.name])
    plan = plan_study(study, args.out, given, explicit - set(STUDY_ONLY), seeds=seeds, epochs=args.epochs,
                      parameters={"max_depth": args.max_depth} if args.max_depth is not None else {},
                      resume=args.resume, command=command)
    write_plan(Path(args.out), plan)
    deadline = time.monotonic() + 60 * args.max_minutes if args.max_minutes else None
    result = train_runs(plan, args.out, deadline, show_progress=bars_wanted(args.no_progress))
    summary = write_summary(args.out)
    print(summary_markdown(summary), end="")
    for path in summary["written"]:
        print(f"written: {path}")
    if result["stopped"]:
        print(f"stopped after {args.max_minutes:g} minutes with {result['finished']} of {result['total']} runs "
              f"finished; continue with: {continue_command(plan, args.out)}")
        return EXIT_TIME_LIMIT
    return 0
