"""Reading a run's logs for ``tinygrad-caps plot``: ``metrics.jsonl`` (one line per epoch) and
``gradflow.jsonl`` (one line per logged step), each line checked for what the plots use.

A damaged line (bytes that are not UTF-8, not JSON, a value of the wrong type, a missing key, a
non-finite number, a line whose routing layers or iteration counts differ from the first line's)
raises UsageError naming the file, the line and the reason; so does a last line cut short without
its line end, as an interrupted run can leave it.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from ...errors import UsageError

METRIC_KEYS = ("train_loss", "test_loss", "train_accuracy", "test_accuracy")
ITERATION_KEYS = ("coupling_entropy", "grad_norm_sum", "grad_norm_agreement")


class BadLine(Exception):
    """Why one line is unusable (turned into a UsageError that names the file and the line)."""


def read_json_lines(path) -> list:
    """(line number, parsed value) for each non-blank line of the JSON-lines file ``path``; UsageError
    for a line that is not UTF-8 or not JSON, or for a cut last line."""
    path = Path(path)
    raw = path.read_bytes()
    pieces = raw.split(b"\n")
    last = max((k for k, piece in enumerate(pieces) if piece.strip()), default=-1)
    cut = not raw.endswith(b"\n") and last == len(pieces) - 1
    rows = []
    for k, piece in enumerate(pieces):
        if not piece.strip():
            continue
        number = k + 1
        try:
            rows.append((number, json.loads(piece.decode("utf-8"), parse_constant=_not_finite)))
        except BadLine as exc:
            raise UsageError(f"{path}: line {number}: {exc}") from None
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            if cut and k == last:
                raise UsageError(f"{path}: the last line ({number}) is incomplete (no line end, not JSON), as an "
                                 "interrupted run can leave it; remove that line to plot the rest") from None
            if isinstance(exc, UnicodeDecodeError):
                raise UsageError(f"{path}: line {number} is not UTF-8 text (byte {exc.start + 1} of the line)") from None
            raise UsageError(f"{path}: line {number} is not JSON ({exc.msg})") from None
    return rows


def read_metrics(path) -> list:
    """The lines of ``RUN/metrics.jsonl``, each a dict with a positive integer "epoch" (increasing from
    line to line) and the finite numbers METRIC_KEYS (accuracies in [0, 1])."""
    lines, previous = [], None
    for number, line in read_json_lines(path):
        try:
            _check_metrics_line(line, previous)
        except BadLine as exc:
            raise UsageError(f"{path}: line {number}: {exc}") from None
        previous = line["epoch"]
        lines.append(line)
    return lines


def read_gradflow(path) -> list:
    """The lines of ``RUN/gradflow.jsonl``, each a dict with a positive integer "step" and "layers": the
    same routing layers (by name) with the same number of iterations as the first line, each iteration
    with the finite numbers ITERATION_KEYS (the gradient norms >= 0 or null)."""
    lines, shape = [], None
    for number, line in read_json_lines(path):
        try:
            _check_gradflow_line(line)
            this = [(layer["name"], len(layer["iterations"])) for layer in line["layers"]]
            if shape is not None and this != shape:
                raise BadLine(f"its routing layers and iterations ({_describe(this)}) differ from the first "
                              f"line's ({_describe(shape)})")
        except BadLine as exc:
            raise UsageError(f"{path}: line {number}: {exc}") from None
        shape = this
        lines.append(line)
    return lines


def _not_finite(name):
    raise BadLine(f"{name} is not a finite number")  # json.loads would accept NaN and Infinity


def _describe(shape) -> str:
    return ", ".join(f"{name}: {count} iteration{'s' if count != 1 else ''}" for name, count in shape)


def _kind(value) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number")


def _object(value, what: str) -> dict:
    if not isinstance(value, dict):
        raise BadLine(f"{what} is {_kind(value)}, not a JSON object")
    return value


def _field(record: dict, key: str, where: str = ""):
    if key not in record:
        raise BadLine(f"{where}has no \"{key}\"")
    return record[key]


def _number(value, name: str, allow_null: bool = False):
    if value is None and allow_null:
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadLine(f"{name} is {_kind(value)}, not a number")
    if not math.isfinite(value):
        raise BadLine(f"{name} is {value}, not a finite number")
    return value


def _positive_integer(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise BadLine(f"{name} must be a positive integer, got {json.dumps(value)[:40]}")
    return value


def _check_metrics_line(line, previous_epoch) -> None:
    line = _object(line, "the line")
    epoch = _positive_integer(_field(line, "epoch"), '"epoch"')
    if previous_epoch is not None and epoch <= previous_epoch:
        raise BadLine(f"epoch {epoch} follows epoch {previous_epoch}; the epochs must increase")
    for key in METRIC_KEYS:
        value = _number(_field(line, key), f'"{key}"')
        if key.endswith("accuracy") and not 0 <= value <= 1:
            raise BadLine(f'"{key}" is {value}, outside [0, 1]')


def _check_gradflow_line(line) -> None:
    line = _object(line, "the line")
    _positive_integer(_field(line, "step"), '"step"')
    layers = _field(line, "layers")
    if not isinstance(layers, list) or not layers:
        raise BadLine(f"\"layers\" is {_kind(layers) if layers != [] else 'empty'}, not a list of routing layers")
    for k, layer in enumerate(layers):
        where = f"layers[{k}]"
        layer = _object(layer, where)
        if not isinstance(_field(layer, "name", f"{where} "), str):
            raise BadLine(f"{where}.name is {_kind(layer['name'])}, not a string")
        iterations = _field(layer, "iterations", f"{where} ")
        if not isinstance(iterations, list) or not iterations:
            raise BadLine(f"{where}.iterations is {_kind(iterations) if iterations != [] else 'empty'}, "
                          "not a list of routing iterations")
        for r, row in enumerate(iterations):
            at = f"{where}.iterations[{r}]"
            row = _object(row, at)
            _number(_field(row, "coupling_entropy", f"{at} "), f"{at}.coupling_entropy")
            for key in ("grad_norm_sum", "grad_norm_agreement"):
                value = _number(_field(row, key, f"{at} "), f"{at}.{key}", allow_null=True)
                if value is not None and value < 0:
                    raise BadLine(f"{at}.{key} is {value}; a gradient norm is >= 0 or null")
