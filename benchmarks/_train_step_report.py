"""train_step.py's figures derived from its timings, and its table: per (batch, precision), each
variant's time, host and GPU time, throughput against the GPU's peak and the copy bandwidth, and the
goals of the training-step issue beside each figure, met or not:

- time: our captured step (our eager one where nothing is captured) at most 1.0x PyTorch's fastest
  variant (moonshot 0.8x);
- memory: the bytes our captured step's graph keeps at most 1.1x our eager step's peak.
"""
from __future__ import annotations

TIME_GOAL, TIME_MOONSHOT, MEMORY_GOAL = 1.0, 0.8, 1.1
OURS = ("ours-eager", "ours-captured")
TORCH = ("torch-eager", "torch-graph", "torch-compile-reduce-overhead", "torch-compile-max-autotune")
# each variant's key in a row's flat fields ("<key>_s"), as the rows have always named them
KEYS = {"ours-eager": "ours", "ours-captured": "ours_graph", "torch-eager": "torch", "torch-graph": "torch_graph",
        "torch-compile-reduce-overhead": "torch_compile_reduce_overhead",
        "torch-compile-max-autotune": "torch_compile_max_autotune"}


def summarize(row: dict, cost, peak, copy_bandwidth: float | None) -> dict:
    """Add the derived figures to ``row`` (and return it).

    Args:
        row: train_step.py's row: "batch", "precision", "variants" {name: {"s": seconds per step, ...}
            or {"skipped": why}}.
        cost: step_cost.StepCost of the row's batch.
        peak: gpu_peaks.Peak of this GPU, or None (a CPU, or a GPU not in the table).
        copy_bandwidth: bytes/s of a device-to-device copy measured in the same run (None: not measured).
    Returns:
        ``row`` with, per timed variant, "tflops", "fraction_of_peak", "fraction_of_copy_bandwidth" (and
        "first_loss_diff", its first loss's distance from ours, where both are known);
        "cost" (GFLOP and MB per step, the peak used); "goal" (ours against PyTorch's fastest) and
        "memory" (captured against eager), each with its target and whether it is met (None: not measured).
    """
    precision = row["precision"]
    peak_flops = peak.flops(precision) if peak is not None else None
    ours_first = row["variants"].get("ours-eager", {}).get("first_loss")
    for figures in row["variants"].values():
        if figures.get("first_loss") is not None and ours_first is not None:
            figures["first_loss_diff"] = abs(figures["first_loss"] - ours_first)  # same weights and batch: rounding
        seconds = figures.get("s")
        if not seconds:
            continue
        figures["tflops"] = cost.flops / seconds / 1e12
        figures["fraction_of_peak"] = cost.flops / seconds / peak_flops if peak_flops else None
        figures["fraction_of_copy_bandwidth"] = cost.bytes / seconds / copy_bandwidth if copy_bandwidth else None
    row["cost"] = {"gflop": cost.flops / 1e9, "mb": cost.bytes / 1e6, "parameters": cost.parameters,
                   "peak": None if peak is None else peak.name,
                   "peak_kind": {"highest": "FP32", "high": "TF32"}[precision],
                   "peak_tflops": None if peak_flops is None else peak_flops / 1e12,
                   "copy_bandwidth_gb_s": None if copy_bandwidth is None else copy_bandwidth / 1e9}
    row["goal"] = time_goal(row["variants"])
    row["memory"] = memory_goal(row["variants"])
    return row


def timed(variants: dict, names) -> dict:
    """{name: seconds per step} of the ``names`` that were timed."""
    return {name: variants[name]["s"] for name in names if variants.get(name, {}).get("s")}


def time_goal(variants: dict) -> dict:
    """Our fastest step ("ours-captured" where it was timed, else "ours-eager") over PyTorch's fastest
    variant, with the goal (<= 1.0x) and the moonshot (<= 0.8x); ratio and "met" None when either is missing."""
    ours, theirs = timed(variants, OURS), timed(variants, TORCH)
    mine = "ours-captured" if "ours-captured" in ours else ("ours-eager" if ours else None)
    fastest = min(theirs, key=theirs.get) if theirs else None
    ratio = ours[mine] / theirs[fastest] if mine and fastest else None
    return {"ours": mine, "fastest_torch": fastest, "ratio": ratio, "target": TIME_GOAL,
            "met": None if ratio is None else ratio <= TIME_GOAL, "moonshot": TIME_MOONSHOT,
            "moonshot_met": None if ratio is None else ratio <= TIME_MOONSHOT}


def memory_goal(variants: dict) -> dict:
    """The bytes our captured step's graph keeps over our eager step's peak, with the goal (<= 1.1x),
    and PyTorch's eager peak and graph bytes beside them (None where not measured)."""
    def get(name, field):
        return variants.get(name, {}).get(field)

    eager, captured = get("ours-eager", "peak_bytes"), get("ours-captured", "graph_bytes")
    ratio = captured / eager if eager and captured is not None else None
    return {"ours_eager_peak_bytes": eager, "ours_captured_bytes": captured,
            "torch_eager_peak_bytes": get("torch-eager", "peak_bytes"), "torch_graph_bytes": get("torch-graph", "graph_bytes"),
            "captured_to_eager": ratio, "target": MEMORY_GOAL, "met": None if ratio is None else ratio <= MEMORY_GOAL}


def _met(value) -> str:
    return "not measured" if value is None else ("met" if value else "NOT met")


def _mb(value) -> str:
    return "-" if value is None else f"{value / 2 ** 20:.0f} MiB"


def variant_line(row: dict, name: str, figures: dict) -> str:
    """One variant of one row, as the table prints it."""
    head = f"B={row['batch']:<4} {row['precision']:<8} {name:<30}"
    if "skipped" in figures:
        return f"{head} skipped: {figures['skipped']}"
    line = f"{head} {figures['s'] * 1e3:8.2f} ms"
    if figures.get("host_s") is not None:
        line += f"  host {figures['host_s'] * 1e3:7.2f} ms  GPU {figures['gpu_s'] * 1e3:7.2f} ms"
    line += f"  {figures['tflops']:7.3g} TFLOP/s"
    if figures.get("fraction_of_peak") is not None:
        line += f" ({figures['fraction_of_peak']:.1%} of {row['cost']['peak_kind']} peak)"
    if figures.get("fraction_of_copy_bandwidth") is not None:
        line += f"  {figures['fraction_of_copy_bandwidth']:.1%} of copy BW"
    if figures.get("peak_bytes") is not None:
        line += f"  step peak {_mb(figures['peak_bytes'])}"
    if figures.get("graph_bytes") is not None:
        line += f"  graph keeps {_mb(figures['graph_bytes'])}"
    if figures.get("compile_s") is not None:
        line += f"  (compile {figures['compile_s']:.1f} s)"
    if figures.get("first_loss") is not None:
        line += f"  first loss {figures['first_loss']:.6f}"
        if figures.get("first_loss_diff") is not None and name != "ours-eager":
            line += f" (ours +- {figures['first_loss_diff']:.1e})"
    return line


def summary_lines(row: dict) -> list:
    """The row's cost and its two goals, each with its figure and whether it is met."""
    cost, goal, memory = row["cost"], row["goal"], row["memory"]
    head = f"B={row['batch']:<4} {row['precision']:<8}"
    peak = (f"peak {cost['peak']} {cost['peak_kind']} {cost['peak_tflops']:.1f} TFLOP/s" if cost["peak"]
            else "no datasheet peak for this device")
    bandwidth = (f"copy bandwidth {cost['copy_bandwidth_gb_s']:.0f} GB/s" if cost["copy_bandwidth_gb_s"]
                 else "copy bandwidth not measured")
    lines = [f"{head} cost: {cost['gflop']:.2f} GFLOP/step, {cost['mb']:.1f} MB/step at least; {peak}; {bandwidth}"]
    if goal["ratio"] is None:
        lines.append(f"{head} time goal (ours / PyTorch's fastest <= {goal['target']}x): not measured")
    else:
        lines.append(f"{head} time: {goal['ours']} / {goal['fastest_torch']} (PyTorch's fastest) = {goal['ratio']:.2f}x: "
                     f"goal <= {goal['target']}x {_met(goal['met'])}, moonshot <= {goal['moonshot']}x "
                     f"{_met(goal['moonshot_met'])}")
    if memory["captured_to_eager"] is None:
        lines.append(f"{head} memory goal (captured <= {memory['target']}x eager peak): not measured")
    else:
        lines.append(f"{head} memory: captured graph {_mb(memory['ours_captured_bytes'])} / eager peak "
                     f"{_mb(memory['ours_eager_peak_bytes'])} = {memory['captured_to_eager']:.2f}x: goal <= "
                     f"{memory['target']}x {_met(memory['met'])} (PyTorch: eager peak {_mb(memory['torch_eager_peak_bytes'])}, "
                     f"graph {_mb(memory['torch_graph_bytes'])})")
    return lines


def table(rows: list) -> list:
    """Every row's variants, then its cost and goals: the lines train_step.py prints."""
    lines = []
    for row in rows:
        for name, figures in row["variants"].items():
            lines.append(variant_line(row, name, figures))
        lines += summary_lines(row)
    return lines
