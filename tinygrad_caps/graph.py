"""Drawing the tape: the graph of Functions an output depends on, as Graphviz DOT text.

    dot = tc.graph.to_dot(loss, params=model)           # text, pure Python
    tc.graph.draw(loss, "graph.svg", params=model)       # .svg/.png/.pdf through Graphviz's dot

Nodes are the ops (boxes, their Function's name), the leaves that gradients reach (ellipses: a
parameter by its module path, e.g. ``digit.weight``, with shape and dtype) and the outputs
(double octagons). Edges follow the tape: one from each input of an op that needs a gradient (its
creator, or the leaf itself) to the op, labelled with the tensor's shape and dtype, and one from
the op that made each output to it. Ops recorded inside ``with tc.graph.scope(label):`` share a
label; ``cluster_routing`` draws the labels "routing iteration N" as boxes of their own (the
capsule routing marks each iteration so; where several routing layers each have an iteration N,
each gets its box, "routing iteration N (k of m)").

``show_backward`` draws the graph of the gradients too, as a ``create_graph=True`` backward builds
it (grad-of-grad): its ops filled orange in a box "backward", and inside it the ops that the
backward of a routing iteration's ops recorded in a box "routing iteration N, backward". Its edges
run the other way up (the gradient flows from the output down to the leaves, so each op's backward
sits at the height of the op), and the forward values a backward op reads come to it as dashed grey
edges that do not move it.

``expand`` folds repeated structure: "all" draws every op; a number N draws routing iteration N op
by op and each other iteration as one node ("routing iteration 1", "4 ops, folded"; and one for its
backward); "none" folds every iteration. Edges into and out of a folded iteration are drawn once
per pair of nodes they join.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from pathlib import Path

from .autograd.function import Function
from .autograd.grad_mode import _state
from .autograd.observers import Observer, observing
from .tensor import Tensor

FORMATS = (".svg", ".png", ".pdf")
ROUTING_SCOPE = "routing iteration"
EXPAND_WORDS = ("all", "none")
BACKWARD_FILL = "#fde2c8"


@contextlib.contextmanager
def scope(label: str):
    """Ops recorded inside take ``label`` (this thread; scopes nest, the innermost wins)."""
    previous, _state.scope = _state.scope, str(label)
    try:
        yield
    finally:
        _state.scope = previous


def to_dot(outputs, params=None, show_shapes: bool = True, show_backward: bool = False,
           cluster_routing: bool = True, expand="all") -> str:
    """Graphviz DOT text of the graph behind ``outputs`` (see the module docstring).

    Args:
        outputs: a Tensor or a list of Tensors (recorded: they require grad).
        params: a Module (its ``named_parameters``) or a {name: Tensor} dict naming leaves.
        show_shapes: label edges and leaves with shape and dtype (without: no shape anywhere, and
            leaves that ``params`` does not name are "leaf 0", "leaf 1", ...).
        show_backward: also draw the graph of the gradients of ``outputs`` (summed) with respect to
            every leaf, built with ``create_graph=True`` (the outputs' graph is kept).
        cluster_routing: draw ops in "routing iteration N" scopes inside one box per iteration.
        expand: "all" (every op), "none" (every routing iteration folded into one node, and its
            backward into another) or an iteration number N >= 1 (that iteration op by op, the
            others folded); folding needs ``cluster_routing``.
    Returns:
        The DOT text. A bad argument is a TypeError (a wrong type) or ValueError (no outputs, an
        output that does not require grad, an iteration the graph does not have) naming it.
    """
    outputs = _check_outputs(outputs)
    _check_flags(show_shapes=show_shapes, show_backward=show_backward, cluster_routing=cluster_routing)
    _check_expand(expand, cluster_routing)
    names = _leaf_names(params)
    graph = _Graph(names, show_shapes)
    forward_nodes = graph.add_outputs(outputs, "output")
    if isinstance(expand, int) and expand not in graph.iterations():
        found = graph.iterations()
        have = f"iterations {found[0]} to {found[-1]}" if found else "no routing iteration"
        raise ValueError(f"graph.to_dot: expand={expand}, but the graph has {have}; give one of them, \"all\" or "
                         "\"none\"")
    if show_backward:
        from .autograd.engine import grad

        leaves = list(graph.leaves.values())
        total = outputs[0].sum() if len(outputs) == 1 else sum(o.sum() for o in outputs)
        with observing(_BackwardOwners()) as owners:
            gradients = grad(total, leaves, create_graph=True, retain_graph=True, allow_unused=True)
        drawn = [(leaf, g) for leaf, g in zip(leaves, gradients) if g is not None and g.requires_grad]
        graph.backward = {id(fn) for fn in graph.walk([g for _, g in drawn])} - forward_nodes
        graph.owners = owners.owner
        graph.add_outputs([g for _, g in drawn], [f"d/d {graph.leaf_label(leaf)}" for leaf, _ in drawn],
                          gradients=True)
    return graph.render(cluster_routing, expand)


def routing_iterations(outputs) -> list:
    """The iteration numbers N of the "routing iteration N" scopes in the graph behind ``outputs``
    (a Tensor or a list of Tensors that require grad), sorted: what ``to_dot``'s ``expand`` takes."""
    graph = _Graph({}, False)
    graph.add_outputs(_check_outputs(outputs), "output")
    return graph.iterations()


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


def _check_expand(expand, cluster_routing: bool) -> None:
    """Raise TypeError or ValueError for an ``expand`` that is not "all", "none" or an integer >= 1,
    or that folds iterations without ``cluster_routing``."""
    if isinstance(expand, str):
        if expand not in EXPAND_WORDS:
            raise ValueError(f"graph.to_dot: expand must be \"all\", \"none\" or a routing iteration number, "
                             f"not {expand!r}")
    elif isinstance(expand, bool) or not isinstance(expand, int):
        raise TypeError(f"graph.to_dot: expand must be \"all\", \"none\" or an int, not {type(expand).__name__}")
    elif expand < 1:
        raise ValueError(f"graph.to_dot: expand must be a routing iteration number >= 1, got {expand}")
    if expand != "all" and not cluster_routing:
        raise ValueError(f"graph.to_dot: expand={expand!r} folds routing iterations, which needs cluster_routing=True")


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


class _BackwardOwners(Observer):
    """Which forward op's backward recorded each op of a ``create_graph`` backward: {id(op): forward op}."""

    sees_backward_ops = True

    def __init__(self):
        self.owner = {}

    def forward_recorded(self, fn, inputs, output, start) -> None:
        node = _state.backward_node
        if node is not None and output.creator is not None:
            self.owner[id(output.creator)] = node


class _Graph:
    def __init__(self, names, show_shapes):
        self.names, self.show_shapes = names, show_shapes
        self.ops, self.leaves, self.edges, self.outputs = {}, {}, [], []
        self.backward, self.owners, self.gradient_outputs = set(), {}, set()

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

    def add_outputs(self, tensors, labels, gradients: bool = False) -> set:
        """Add the graph behind ``tensors``; returns the ids of its ops (``gradients``: the outputs
        are the gradients of a backward)."""
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
            if gradients:
                self.gradient_outputs.add(node)
            source = _node_id(t.creator) if t.creator is not None else _node_id(t)
            if t.creator is None:
                self.leaves[id(t)] = t
            self.edges.append((source, node, ""))
        return added

    def iterations(self) -> list:
        """The numbers N of the "routing iteration N" scopes of the forward ops, sorted."""
        return sorted({_iteration(fn.scope) for fn in self.ops.values()
                       if id(fn) not in self.backward and _iteration(fn.scope) is not None})

    def leaf_label(self, t) -> str:
        """A leaf's name: its parameter name, else "leaf" and its shape (its number without shapes)."""
        if id(t) in self.names:
            return self.names[id(t)]
        return f"leaf {tuple(t.shape)}" if self.show_shapes else f"leaf {list(self.leaves).index(id(t))}"

    def _tensor_text(self, x) -> str:
        return f"{tuple(x.shape)} {x.dtype}" if self.show_shapes else ""

    def routing_boxes(self) -> dict:
        """{id(forward op): its box's label} for the ops in "routing iteration N" scopes: one box per
        connected group of ops sharing a label (each routing layer's iteration N), "routing
        iteration N (k of m)" where several groups share it, numbered in the order they were recorded."""
        members = {}
        for fn in self.ops.values():
            if id(fn) not in self.backward and _iteration(fn.scope) is not None:
                members.setdefault(fn.scope, []).append(fn)
        boxes = {}
        for scope, ops in members.items():
            groups = _connected(ops)
            for k, group in enumerate(sorted(groups, key=lambda g: min(fn.sequence for fn in g))):
                label = scope if len(groups) == 1 else f"{scope} ({k + 1} of {len(groups)})"
                boxes.update({id(fn): label for fn in group})
        return boxes

    def render(self, cluster_routing: bool, expand="all") -> str:
        lines = ["digraph tape {", '  rankdir=BT; node [fontname="Helvetica", fontsize=10]; '
                 'edge [fontname="Helvetica", fontsize=8];']
        # DOT names in the order the nodes were met (t0, t1, ... and f0, f1, ...): the same graph
        # gives the same text, whatever addresses its objects had
        names = {_node_id(t): f"t{k}" for k, t in enumerate(self.leaves.values())}
        names.update({_node_id(fn): f"f{k}" for k, fn in enumerate(self.ops.values())})
        for t in self.leaves.values():
            label = _escape(self.leaf_label(t)) + (f"\\n{_escape(self._tensor_text(t))}" if self.show_shapes else "")
            lines.append(f'  {names[_node_id(t)]} [shape=ellipse, style=filled, fillcolor="#dbe9f6", label="{label}"];')
        boxes = self.routing_boxes() if cluster_routing else {}
        homes = {}  # id(op) -> (backward?, its routing box's label or None)
        for fn in self.ops.values():
            backward = id(fn) in self.backward
            owner = self.owners.get(id(fn)) if backward else fn
            homes[id(fn)] = (backward, boxes.get(id(owner)) if owner is not None else None)
        folds = self._folds(homes, expand)
        folded = {}  # a fold's key -> the ops drawn as its one node
        clusters = {}  # (backward?, label) -> node lines
        loose = {False: [], True: []}
        for fn_id, fold in folds.items():
            folded.setdefault(fold, []).append(self.ops[fn_id])
        for fn in self.ops.values():
            backward, label = homes[id(fn)]
            if id(fn) in folds:
                continue
            style = f' style=filled, fillcolor="{BACKWARD_FILL}",' if backward else ""
            line = f'  {names[_node_id(fn)]} [shape=box,{style} label="{_escape(fn.name)}"];'
            (clusters.setdefault((backward, label), []) if label is not None else loose[backward]).append(line)
        groups = []
        for k, ((backward, text, _), ops) in enumerate(folded.items()):
            groups.append(f"g{k}")
            style = f' style=filled, fillcolor="{BACKWARD_FILL}",' if backward else ""
            loose[backward].append(f'  g{k} [shape=box3d,{style} label="{_escape(text)}\\n{_ops(len(ops))}, folded"];')
            for fn in ops:
                names[_node_id(fn)] = f"g{k}"
        lines.extend(loose[False])
        ordered = sorted(clusters.items(), key=lambda item: _box_order(*item[0]))
        for k, ((backward, label), members) in enumerate(ordered):
            if not backward:
                lines.extend(_cluster(f"cluster_{k}", label, members))
        if self.backward:
            inner = list(loose[True])
            for k, ((backward, label), members) in enumerate(ordered):
                if backward:
                    inner.extend("  " + line for line in _cluster(f"cluster_{k}", f"{label}, backward", members))
            lines.extend(_cluster(f"cluster_{len(ordered)}", "backward", inner))
        for node, label in self.outputs:
            lines.append(f'  {node} [shape=doubleoctagon, label="{_escape(label)}"];')
        lines.extend(self._edge_lines(names, groups))
        lines.append("}")
        return "\n".join(lines) + "\n"

    def _folds(self, homes: dict, expand) -> dict:
        """{id(op): (backward?, the text of the node it is folded into, a key)} of the ops ``expand``
        folds: each routing box it does not expand (its forward ops, and its backward's), and, unless
        everything is expanded, the backward of each other forward op (those of more than one op).
        In the order their nodes are drawn: forward first, routing boxes by iteration, then the
        backward of single ops as their first op was met."""
        folds, first = {}, {}
        for k, fn in enumerate(self.ops.values()):
            backward, label = homes[id(fn)]
            if label is not None and not _expanded(label, expand):
                fold = (backward, f"{label}, backward" if backward else label, None)
            elif backward and label is None and expand != "all" and id(fn) in self.owners:
                owner = self.owners[id(fn)]
                fold = (True, f"{owner.name} backward", id(owner))
            else:
                continue
            folds[id(fn)] = fold
            first.setdefault(fold, k)
        sizes = {}
        for fold in folds.values():
            sizes[fold] = sizes.get(fold, 0) + 1
        folds = {fn_id: fold for fn_id, fold in folds.items() if fold[2] is None or sizes[fold] > 1}  # one op: itself

        def order(item):
            backward, text, owner = item[1]
            return (backward, owner is not None, _iteration(text) or 0, "" if owner else text, first[item[1]])

        return dict(sorted(folds.items(), key=order))

    def _edge_lines(self, names, groups) -> list:
        """The DOT lines of the edges, each endpoint by its drawn name (a folded op by its folded
        node's). Edges inside a folded node are left out and edges touching one are drawn once per
        pair of nodes (their labels joined); a gradient's edge is drawn the other way up (dir=back),
        and a forward value read by a backward op as a dashed grey edge that does not rank it."""
        groups = set(groups)
        kept, labels = [], {}
        for source, target, label in self.edges:
            from_backward = source.startswith("f") and int(source[1:]) in self.backward
            to_backward = target.startswith("f") and int(target[1:]) in self.backward
            kind = "gradient" if from_backward else ("saved" if to_backward else "forward")
            source, target = names.get(source, source), names.get(target, target)
            if source == target:
                continue  # inside a folded node
            if source not in groups and target not in groups:
                kept.append((source, target, kind, [label] if label else []))
                continue
            key = (source, target, kind)
            if key not in labels:
                labels[key] = []
                kept.append((source, target, kind, labels[key]))
            if label and label not in labels[key]:
                labels[key].append(label)
        lines = []
        for source, target, kind, texts in kept:
            text = ", ".join(texts) if len(texts) <= 2 else f"{len(texts)} tensors"
            attributes = [f'label="{_escape(text)}"'] if text and kind != "saved" else []
            if kind == "gradient":
                source, target = target, source
                attributes.append('dir=back, color="#b35806"')
            elif kind == "saved":
                attributes.append('style=dashed, color="#999999"')
            lines.append(f"  {source} -> {target}" + (f" [{', '.join(attributes)}];" if attributes else ";"))
        return lines


def _ops(count: int) -> str:
    """"1 op", "4 ops"."""
    return f"{count} op" if count == 1 else f"{count} ops"


def _cluster(name: str, label: str, members: list) -> list:
    """A DOT subgraph box ``label`` around ``members`` (node lines, or nested boxes)."""
    return [f'  subgraph {name} {{ label="{_escape(label)}"; style=rounded; color="#888888";',
            *("  " + member for member in members), "  }"]


def _connected(ops: list) -> list:
    """``ops`` split into the groups that their edges among themselves connect (lists, in order)."""
    index = {id(fn): k for k, fn in enumerate(ops)}
    parent = list(range(len(ops)))

    def root(k):
        while parent[k] != k:
            parent[k] = parent[parent[k]]
            k = parent[k]
        return k

    for k, fn in enumerate(ops):
        for edge in fn.next:
            if isinstance(edge, Function) and id(edge) in index:
                parent[root(k)] = root(index[id(edge)])
    groups = {}
    for k, fn in enumerate(ops):
        groups.setdefault(root(k), []).append(fn)
    return list(groups.values())


def _iteration(scope):
    """N of a "routing iteration N" scope (also "routing iteration N (k of m)"), else None."""
    if not scope or not scope.startswith(ROUTING_SCOPE + " "):
        return None
    number = scope[len(ROUTING_SCOPE) + 1:].split(" ", 1)[0]
    return int(number) if number.isdigit() else None


def _expanded(label: str, expand) -> bool:
    """Whether the routing box ``label`` is drawn op by op under ``expand``."""
    return expand == "all" or (expand != "none" and _iteration(label) == expand)


def _node_id(node) -> str:
    return f"f{id(node)}" if isinstance(node, Function) else f"t{id(node)}"


def _box_order(backward: bool, label: str):
    """Boxes in iteration order ("routing iteration 2" before "routing iteration 10"), forward first."""
    return (backward, _iteration(label) or 0, label)


def _escape(text: str) -> str:
    return str(text).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
