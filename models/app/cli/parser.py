"""The ``tinygrad-caps`` parser, built from one module per command (``COMMANDS``: each has ``HELP``,
``add_arguments(parser)`` and ``run(args)``), and ``main``, which runs the command chosen. A user
error is one line and exit status 2, a bug its traceback and status 1 (``training.reporting``).
"""
from __future__ import annotations

import argparse
import importlib
import signal
import sys
import traceback

import tinygrad_caps as tc

from ..training.option_checks import use_command_device
from ..training.presets import preset_options
from ..training.reporting import report
from ..training.run_state import Interrupted

# the commands, in the order `tinygrad-caps --help` lists them; each is the module of that name here
COMMANDS = ("train", "study", "evaluate", "visualize", "gradflow", "graph", "plot")


EXPLICIT = "explicit"  # the parsed namespace's set of the destinations the command line gave
RECORDED_ACTIONS = (None, "store", "store_const", "store_true", "store_false", "append", "append_const", "count",
                    "extend")


def recording(action_class):
    """``action_class`` that also adds its destination to the namespace's ``explicit`` set when the
    command line gives its option (an abbreviation, ``--opt=value`` and a subcommand's option too)."""

    class Recorded(action_class):
        def __call__(self, parser, namespace, values, option_string=None):
            super().__call__(parser, namespace, values, option_string)
            if getattr(namespace, EXPLICIT, None) is None:
                setattr(namespace, EXPLICIT, set())
            getattr(namespace, EXPLICIT).add(self.dest)

    Recorded.__name__ = Recorded.__qualname__ = f"Recorded{action_class.__name__}"
    return Recorded


class OneLineErrorParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line on stderr (exit status 2), like every other user
    error, and whose parsed namespace says which options the command line gave (``explicit``)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for name in RECORDED_ACTIONS:
            self.register("action", name, recording(self._registry_get("action", name)))

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def parse_args(self, args=None, namespace=None):
        """As argparse's, but an unrecognized option is refused by the (sub)command it was given to,
        with the nearest option that command has (``--epcohs``: did you mean --epochs?)."""
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            command = _innermost_command(self, parsed)
            command.error(f"unrecognized arguments: {' '.join(extras)}{_nearest_options(command, extras)}")
        return parsed


def _innermost_command(parser, parsed):
    """The (sub)parser of the command ``parsed`` chose: ``tinygrad-caps study run``'s for ``study run``."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and getattr(parsed, action.dest, None) in action.choices:
            return _innermost_command(action.choices[getattr(parsed, action.dest)], parsed)
    return parser


def _nearest_options(parser, extras) -> str:
    """``"; did you mean --epochs?"`` for the options in ``extras`` that are near one of ``parser``'s."""
    import difflib

    known = [flag for action in parser._actions for flag in action.option_strings if flag.startswith("--")]
    guesses = []
    for extra in extras:
        if extra.startswith("--"):
            guesses += difflib.get_close_matches(extra.split("=", 1)[0], known, n=1, cutoff=0.7)
    return f"; did you mean {' or '.join(dict.fromkeys(guesses))}?" if guesses else ""


def make_parser():
    """The ``tinygrad-caps`` argument parser: one subcommand per module of ``COMMANDS``."""
    parser = OneLineErrorParser(prog="tinygrad-caps", description="Train and evaluate CapsNet on tinygrad-caps.")
    parser.add_argument("--debug", action="store_true", help="print the traceback of every error")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        command = importlib.import_module(f"{__package__}.{name}")
        command.add_arguments(sub.add_parser(name, help=command.HELP))
    for command in command_parsers(parser):
        add_shared_options(command)
    return parser


def command_parsers(parser) -> list:
    """Every (sub)command parser under ``parser``: ``train``, ..., ``study``, ``study run``, ..."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for command in action.choices.values():
                found += [command, *command_parsers(command)]
    return found


def add_shared_options(command) -> None:
    """The options every command takes, where it has not added them itself: ``--debug`` (before or
    after the command) and ``--no-progress`` (scripts pass it to every command; one that draws no
    bar accepts it and draws none)."""
    given = {flag for action in command._actions for flag in action.option_strings}
    command.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                         help="print the traceback of every error")
    if "--no-progress" not in given and not any(isinstance(a, argparse._SubParsersAction) for a in command._actions):
        command.add_argument("--no-progress", action="store_true", help="no progress bar (this command draws none)")


def parse_with_preset(parser, argv):
    """Parse ``argv`` once; ``args.explicit`` is the set of the destinations it gave. With ``train
    --preset NAME`` the preset's options take the place of the defaults, so options given on the
    command line still win."""
    args = parser.parse_args(argv)
    args.explicit = set(getattr(args, EXPLICIT, None) or ())
    if getattr(args, "preset", None):
        for name, value in preset_options(args.preset, args.dataset).items():
            if name not in args.explicit:
                setattr(args, name, value)
    return args


def resolve_checkpoint_folders(args) -> None:
    """``--checkpoint RUN`` (and visualize's ``--compare RUN``) given a run folder take its
    checkpoints/best.npz, as ``plot`` takes run folders; the file used is printed."""
    from ..training.checkpoints import checkpoint_of

    for dest in ("checkpoint", "compare"):
        given = getattr(args, dest, None)
        if given is None:
            continue
        chosen = checkpoint_of(given, f"--{dest}")
        if str(chosen) != str(given):
            print(f"{args.command}: --{dest} {given} is a run folder: using {chosen}")
            setattr(args, dest, str(chosen))


def main(argv=None) -> int:
    """Run one command with ``argv`` (default: the command line); returns the exit status (0, 1 for
    a bug, 2 for a user error, 128 + signal when stopped)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_with_preset(make_parser(), argv)
    if args.command in ("train", "study"):
        args.command_line = argv
    tc.tune_allocator()  # process-wide malloc tuning for large temporaries (TINYGRAD_CAPS_MALLOC_TUNING=0: off)
    try:
        resolve_checkpoint_folders(args)
        if getattr(args, "device", None) is not None and not getattr(args, "distributed", False):
            use_command_device(args.device)  # (each rank of a distributed run takes its own GPU)
        # cli/NAME.py runs command NAME
        return importlib.import_module(f"{__package__}.{args.command}").run(args)
    except KeyboardInterrupt as exc:  # train has saved its checkpoint already
        if args.debug:
            traceback.print_exc()
        return 128 + (exc.signum if isinstance(exc, Interrupted) else signal.SIGINT)
    except BrokenPipeError:  # whoever read stdout has gone: nothing is left to say
        return 128 + signal.SIGPIPE
    except Exception as exc:  # noqa: BLE001  (user errors are one line, bugs keep their traceback)
        return report(exc, args.command, args.debug)


if __name__ == "__main__":
    sys.exit(main())
