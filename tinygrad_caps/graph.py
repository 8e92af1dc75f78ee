"""Drawing the tape: the graph of Functions an output depends on, as Graphviz DOT text.

    dot = tc.graph.to_dot(loss, params=model)           # text, pure Python
    tc.graph.draw(loss, "graph.svg", params=model)       # .svg/.png/.pdf through Graphviz's dot

Nodes are the ops (boxes, their Function's name), the leaves that gradients reach (ellipses: a
parameter by its module path, e.g. ``digit.weight``, with shape and dtype) and the outputs
(double octagons). Edges follow the tape: one from each input of an op that needs a gradient (its
creator, or the leaf itself) to the op, labelled with the tensor's shape and dtype, and one from
the op that made each output to it. Ops recorded inside ``with tc.graph.scope(label):`` share a
label; ``cluster_routing`` draws the labels "routing iteration N" as boxes of their own (the
capsule routing marks each iteration so). ``show_backward`` draws the graph of the gradients too,
as a ``create_graph=True`` backward builds it (grad-of-grad), its ops in a cluster "backward".
"""
from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from pathlib import Path

from .autograd.function import Function
from .autograd.grad_mode import _state
from .tensor import Tensor

FORMATS = (".svg", ".png", ".pdf")
ROUTING_SCOPE = "routing iteration"


@contextlib.contextmanager
def scope(label: str):
    """Ops recorded inside take ``label`` (this thread; scopes nest, the innermost wins)."""
    previous, _state.scope = _state.scope, str(label)
    try:
        yield
    finally:
        _state.scope = previous


def to_dot(outputs, params=None, show_shapes: bool = True, show_backward: bool = False,
           cluster_routing: bool = True) -> str:
    """Graphviz DOT text of the graph behind ``outputs`` (see the module docstring).

    Args:
        outputs: a Tensor or a list of Tensors (recorded: they require grad).
        params: a Module (its ``named_parameters``) or a {name: Tensor} dict naming leaves.
        show_shapes: label edges and leaves with shape and dtype (without: no shape anywhere, and
            leaves that ``params`` does not name are "leaf 0", "leaf 1", ...).
        show_backward: also draw the graph of the gradients of ``outputs`` (summed) with respect to
            every leaf, built with ``create_graph=True`` (the outputs' graph is kept).
        cluster_routing: draw ops in "routing iteration N" scopes inside one box per iteration.
    Returns:
        The DOT text. A bad argument is a TypeError (a wrong type) or ValueError (no outputs, an
        output that does not require grad) naming it.
    """
    outputs = _check_outputs(outputs)
    _check_flags(show_shapes=show_shapes, show_backward=show_backward, cluster_routing=cluster_routing)
    names = _leaf_names(params)
    graph = _Graph(names, show_shapes)
    forward_nodes = graph.add_outputs(outputs, "output")
    if show_backward:
        from .autograd.engine import grad

        leaves = list(graph.leaves.values())
        total = outputs[0].sum() if len(outputs) == 1 else sum(o.sum() for o in outputs)
        gradients = grad(total, leaves, create_graph=True, retain_graph=True, allow_unused=True)
        drawn = [(leaf, g) for leaf, g in zip(leaves, gradients) if g is not None and g.requires_grad]
        graph.backward = {id(fn) for fn in graph.walk([g for _, g in drawn])} - forward_nodes
        graph.add_outputs([g for _, g in drawn], [f"d/d {graph.leaf_label(leaf)}" for leaf, _ in drawn])
    return graph.render(cluster_routing)


def draw(outputs, path, params=None, **options) -> Path:
    """Write the drawing of ``to_dot(outputs, params, **options)`` to ``path`` (.svg, .png or .pdf)
    with Graphviz's ``dot`` program. Returns the path. A missing Graphviz is a RuntimeError saying
    how to install it; a format this dot lacks, one naming the formats it offers."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"graph.draw: path must be a file name (str or Path) ending in {', '.join(FORMATS)}, "
                        f"not {type(path).__name__}")
    path = Path(path)
    if path.suffix.lower() not in FORMATS:
        raise ValueError(f"graph.draw: {path.name} must end in {', '.join(FORMATS)}")
    text = to_dot(outputs, params, **options)
    dot = dot_program()
    if dot is None:
        raise RuntimeError("drawing a graph needs Graphviz's dot program: apt-get install graphviz (or brew "
                           "install graphviz); tinygrad_caps.graph.to_dot gives the DOT text without it")
    result = subprocess.run([dot, f"-T{path.suffix.lower()[1:]}", "-o", str(path)], input=text, text=True,
                            capture_output=True)
    if result.returncode != 0:
        offered = _offered_formats(result.stderr)
        if offered is not None:
            raise RuntimeError(f"Graphviz's dot here cannot write {path.suffix.lower()[1:]} ({path.name}); it "
                               f"offers: {', '.join(offered)}")
        last = (result.stderr.strip().splitlines() or [f"exit status {result.returncode}"])[-1]
        raise RuntimeError(f"dot failed on the graph: {last}")
    return path


def dot_program() -> str | None:
    """The path of Graphviz's ``dot``, or None where it is not installed."""
    return shutil.which("dot")


def dot_formats() -> tuple | None:
    """The output formats (``-T`` names: "svg", "png", ...) that Graphviz's ``dot`` offers here, from
    its answer to ``dot -T?``; None where dot is missing or its answer cannot be read."""
    dot = dot_program()
    if dot is None:
        return None
    try:
        result = subprocess.run([dot, "-T?"], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return _offered_formats(result.stderr + result.stdout)


def _offered_formats(message: str) -> tuple | None:
    """The formats listed after "Use one of:" in dot's unrecognised-format message (renderer
    suffixes such as ":cairo" dropped, sorted, each once), or None where the message has no list."""
    _, found, listed = message.partition("Use one of:")
    names = sorted({name.split(":")[0] for name in listed.split()})
    return tuple(names) if found and names else None


def tape_counts(outputs) -> dict:
    """{"ops", "leaves", "edges"} of the tape behind ``outputs``: what ``to_dot`` draws (edges: one per
    input of an op that needs a gradient, plus one per output)."""
    graph = _Graph({}, False)
    graph.add_outputs([outputs] if isinstance(outputs, Tensor) else list(outputs), "output")
    return {"ops": len(graph.ops), "leaves": len(graph.leaves), "edges": len(graph.edges)}


def _check_outputs(outputs) -> list:
    """``outputs`` (a Tensor or a non-empty list or tuple of Tensors that require grad) as a list."""
    if isinstance(outputs, Tensor):
        outputs = [outputs]
    elif isinstance(outputs, (list, tuple)):
        outputs = list(outputs)
    else:
        raise TypeError(f"graph.to_dot: outputs must be a Tensor or a list of Tensors, not {type(outputs).__name__}")
    if not outputs:
        raise ValueError("graph.to_dot: outputs is empty; give a Tensor or a list of at least one Tensor")
    for k, t in enumerate(outputs):
        if not isinstance(t, Tensor):
            raise TypeError(f"graph.to_dot: outputs[{k}] must be a Tensor, not {type(t).__name__}")
        if not t.requires_grad:
            raise ValueError(f"graph.to_dot: outputs[{k}] does not require grad; every output must be a Tensor "
                             "that requires grad (made with recording on)")
    return outputs


def _check_flags(**flags) -> None:
    """Raise TypeError for an option of ``to_dot`` that is not a bool (a string such as "no" is true)."""
    for name, value in flags.items():
        if not isinstance(value, bool):
            raise TypeError(f"graph.to_dot: {name} must be True or False, not {value!r}")


def _leaf_names(params) -> dict:
    """{id(leaf): name} of ``params``: None, a Module (its ``named_parameters``) or a {name: Tensor} dict."""
    if params is None:
        return {}
    if hasattr(params, "named_parameters"):
        return {id(t): name for name, t in params.named_parameters()}
    if not isinstance(params, dict):
        raise TypeError(f"graph.to_dot: params must be a Module or a {{name: Tensor}} dict, not "
                        f"{type(params).__name__}")
    for name, t in params.items():
        if not isinstance(name, str):
            raise TypeError(f"graph.to_dot: params' names must be strings, not {type(name).__name__} ({name!r})")
        if not isinstance(t, Tensor):
            raise TypeError(f"graph.to_dot: params[{name!r}] must be a Tensor, not {type(t).__name__}")
    return {id(t): name for name, t in params.items()}


class _Graph:
    def __init__(self, names, show_shapes):
        self.names, self.show_shapes = names, show_shapes
        self.ops, self.leaves, self.edges, self.outputs = {}, {}, [], []
        self.backward = set()

    def walk(self, tensors):
        """Every Function reachable from ``tensors``, each once (an explicit stack: any depth)."""
        found, stack = [], [t.creator for t in tensors if t.creator is not None]
        seen = set()
        while stack:
            fn = stack.pop()
            if id(fn) in seen:
                continue
            seen.add(id(fn))
            if fn.released:
                raise ValueError(f"graph.to_dot: the graph was freed by a backward (op {fn.name}); draw it first, "
                                 "or pass retain_graph=True to that backward")
            found.append(fn)
            stack.extend(edge for edge in fn.next if isinstance(edge, Function))
        return found

    def add_outputs(self, tensors, labels) -> set:
        """Add the graph behind ``tensors``; returns the ids of its ops."""
        labels = [labels] * len(tensors) if isinstance(labels, str) else labels
        added = set()
        for fn in self.walk(tensors):
            added.add(id(fn))
            if id(fn) in self.ops:
                continue
            self.ops[id(fn)] = fn
            for x, need, edge in zip(fn.inputs, fn.needs_grad, fn.next):
                if not need or edge is None:
                    continue
                if not isinstance(edge, Function):
                    self.leaves[id(edge)] = edge
                self.edges.append((_node_id(edge), _node_id(fn), self._tensor_text(x)))
        for t, label in zip(tensors, labels):
            node = f"o{len(self.outputs)}"
            self.outputs.append((node, f"{label}\n{self._tensor_text(t)}" if self.show_shapes else label))
            source = _node_id(t.creator) if t.creator is not None else _node_id(t)
            if t.creator is None:
                self.leaves[id(t)] = t
            self.edges.append((source, node, ""))
        return added

    def leaf_label(self, t) -> str:
        """A leaf's name: its parameter name, else "leaf" and its shape (its number without shapes)."""
        if id(t) in self.names:
            return self.names[id(t)]
        return f"leaf {tuple(t.shape)}" if self.show_shapes else f"leaf {list(self.leaves).index(id(t))}"

    def _tensor_text(self, x) -> str:
        return f"{tuple(x.shape)} {x.dtype}" if self.show_shapes else ""

    def render(self, cluster_routing: bool) -> str:
        lines = ["digraph tape {", '  rankdir=BT; node [fontname="Helvetica", fontsize=10]; '
                 'edge [fontname="Helvetica", fontsize=8];']
        # DOT names in the order the nodes were met (t0, t1, ... and f0, f1, ...): the same graph
        # gives the same text, whatever addresses its objects had
        names = {_node_id(t): f"t{k}" for k, t in enumerate(self.leaves.values())}
        names.update({_node_id(fn): f"f{k}" for k, fn in enumerate(self.ops.values())})
        for t in self.leaves.values():
            label = _escape(self.leaf_label(t)) + (f"\\n{_escape(self._tensor_text(t))}" if self.show_shapes else "")
            lines.append(f'  {names[_node_id(t)]} [shape=ellipse, style=filled, fillcolor="#dbe9f6", label="{label}"];')
        clusters = {}
        for fn in self.ops.values():
            style = ' style=filled, fillcolor="#fde2c8",' if id(fn) in self.backward else ""
            line = f'  {names[_node_id(fn)]} [shape=box,{style} label="{_escape(fn.name)}"];'
            if id(fn) in self.backward:
                clusters.setdefault("backward", []).append(line)
            elif cluster_routing and fn.scope and fn.scope.startswith(ROUTING_SCOPE):
                clusters.setdefault(fn.scope, []).append(line)
            else:
                lines.append(line)
        for k, (label, members) in enumerate(sorted(clusters.items(), key=lambda item: _scope_order(item[0]))):
            lines.append(f'  subgraph cluster_{k} {{ label="{_escape(label)}"; style=rounded; color="#888888";')
            lines.extend("  " + member for member in members)
            lines.append("  }")
        for node, label in self.outputs:
            lines.append(f'  {node} [shape=doubleoctagon, label="{_escape(label)}"];')
        for source, target, label in self.edges:
            source, target = names.get(source, source), names.get(target, target)
            lines.append(f'  {source} -> {target}' + (f' [label="{_escape(label)}"];' if label else ";"))
        lines.append("}")
        return "\n".join(lines) + "\n"


def _node_id(node) -> str:
    return f"f{id(node)}" if isinstance(node, Function) else f"t{id(node)}"


def _scope_order(label: str):
    """Clusters in iteration order ("routing iteration 2" before "routing iteration 10"), backward last."""
    number = label.rsplit(" ", 1)[-1]
    return (label == "backward", label.rstrip("0123456789"), int(number) if number.isdigit() else 0)


def _escape(text: str) -> str:
    return str(text).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


