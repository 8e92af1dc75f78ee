"""Drawings of the tape (tinygrad_caps.graph): the DOT text has one node per op and per leaf and
one edge per recorded input and output, names parameters by their module path, boxes each routing
iteration, draws the gradients' graph on request with each op's backward in its op's box and the
gradient's edges drawn down, and folds the iterations (and the backward of single ops) that
``expand`` does not draw op by op; the ``graph`` command writes it, folding by default. Pixels are
not checked: the structure is."""
import re
import shutil

import numpy as np
import pytest

import tinygrad_caps as tc
import tinygrad_caps.functional as F
from tinygrad_caps.models import CapsNet, capsule_loss
from tinygrad_caps.models import cli


def capsnet_loss(iterations=3):
    tc.manual_seed(0)
    model = CapsNet(conv1_channels=4, primary_types=2, routing_iterations=iterations)
    x = tc.tensor(np.random.default_rng(0).random((2, 1, 28, 28), dtype=np.float32))
    y = np.array([1, 7])
    out = model(x, y)
    return model, capsule_loss(out.lengths, out.reconstruction, x, y)


def nodes(dot, shape):
    return re.findall(rf"^\s*(\w+) \[shape={shape}", dot, re.M)


def test_a_small_graph_is_drawn_node_for_node():
    a = tc.tensor(np.ones((2, 3)), requires_grad=True)
    b = tc.tensor(np.ones((3,)), requires_grad=True)
    y = F.sum(F.relu(a * b))
    dot = tc.graph.to_dot(y, params={"a": a, "b": b})
    assert len(nodes(dot, "box")) == 3 and len(nodes(dot, "ellipse")) == 2  # Mul, ReLU, Sum; a, b
    assert len(re.findall(r"->", dot)) == 5 and '"a\\n(2, 3) float64"' in dot
    assert tc.graph.tape_counts(y) == {"ops": 3, "leaves": 2, "edges": 5}
    assert "(2, 3) float64" not in tc.graph.to_dot(y, show_shapes=False)


def test_the_text_is_the_same_for_the_same_graph_and_names_are_escaped():
    def graph():
        a = tc.tensor(np.ones(3), requires_grad=True)
        return F.sum(a * a), a

    (y1, a1), (y2, a2) = graph(), graph()
    assert tc.graph.to_dot(y1, params={"a": a1}) == tc.graph.to_dot(y2, params={"a": a2})
    for name in ('c\\', 'x\\"y', "\\N", 'say "hi"'):
        dot = tc.graph.to_dot(y1, params={name: a1}, show_shapes=False)
        label = re.search(r'^\s*t0 \[.*label="((?:[^"\\]|\\.)*)"\];$', dot, re.M)
        assert label is not None, dot
        assert re.sub(r"\\(.)", r"\1", label.group(1)) == name  # the label reads back as the name
    if shutil.which("dot"):
        import subprocess
        dot = tc.graph.to_dot(y1, params={'x\\"y': a1})
        assert subprocess.run(["dot", "-Tsvg"], input=dot, text=True, capture_output=True).returncode == 0


@pytest.mark.parametrize("iterations", [1, 3])
def test_capsnet_graph_matches_the_tape_and_boxes_each_routing_iteration(iterations):
    model, loss = capsnet_loss(iterations)
    dot = tc.graph.to_dot(loss, params=model)
    counts = tc.graph.tape_counts(loss)
    assert len(nodes(dot, "box")) == counts["ops"] and len(nodes(dot, "ellipse")) == counts["leaves"]
    assert len(re.findall(r"->", dot)) == counts["edges"]
    clusters = re.findall(r'subgraph cluster_\d+ \{ label="([^"]+)"', dot)
    assert clusters == [f"routing iteration {r + 1}" for r in range(iterations)]
    for name, _ in model.named_parameters():
        assert f'label="{name}\\n' in dot
    assert "cluster" not in tc.graph.to_dot(loss, params=model, cluster_routing=False)


def test_the_backward_graph_is_drawn_beside_the_forward_one():
    model, loss = capsnet_loss(2)
    forward = tc.graph.tape_counts(loss)
    dot = tc.graph.to_dot(loss, params=model, show_backward=True)
    assert 'label="backward"' in dot and len(nodes(dot, "box")) > 2 * forward["ops"]
    assert 'd/d digit.weight' in dot
    loss.backward()  # the drawing kept the graph alive for this


def test_a_freed_graph_and_an_unrecorded_output_are_refused():
    x = tc.tensor(np.ones(3), requires_grad=True)
    y = F.sum(x * x)
    y.backward()
    with pytest.raises(ValueError, match="freed"):
        tc.graph.to_dot(y)
    with pytest.raises(ValueError, match="requires grad"):
        tc.graph.to_dot(tc.tensor(np.ones(2)))


def test_scopes_nest_and_restore():
    x = tc.tensor(np.ones(2), requires_grad=True)
    with tc.graph.scope("outer"):
        a = x * 2
        with tc.graph.scope("inner"):
            b = a + 1
        c = b * b
    d = F.sum(c)
    assert (a.creator.scope, b.creator.scope, c.creator.scope, d.creator.scope) == ("outer", "inner", "outer", None)


@pytest.mark.skipif(shutil.which("dot") is None, reason="needs Graphviz's dot")
def test_draw_and_the_graph_command_write_pictures(tmp_path, capsys):
    model, loss = capsnet_loss(2)
    assert tc.graph.draw(loss, tmp_path / "g.svg", params=model).read_text().lstrip().startswith("<?xml")
    assert cli.main(["graph", "--out", str(tmp_path / "cmd.svg"), "--conv1-channels", "4", "--primary-types", "2",
                     "--device", "cpu", "--backward"]) == 0
    assert (tmp_path / "cmd.svg").exists() and "written:" in capsys.readouterr().out


def test_the_graph_command_writes_dot_text_and_refuses_what_it_cannot_draw(tmp_path, capsys, monkeypatch):
    assert cli.main(["graph", "--out", str(tmp_path / "g.dot"), "--conv1-channels", "4", "--primary-types", "2",
                     "--device", "cpu"]) == 0
    assert (tmp_path / "g.dot").read_text().startswith("digraph tape {")
    monkeypatch.setattr(tc.graph, "dot_program", lambda: None)
    capsys.readouterr()
    for out, message in (("g.svg", "needs Graphviz"), ("g.txt", ".dot file")):
        assert cli.main(["graph", "--out", str(tmp_path / out), "--device", "cpu"]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and message in lines[0]
        assert not (tmp_path / out).exists()


def test_without_shapes_no_shape_is_written_not_even_the_leaves():
    a = tc.tensor(np.ones((2, 3)), requires_grad=True)
    b = tc.tensor(np.ones((3,)), requires_grad=True)
    y = F.sum(F.relu(a * b))
    for dot in (tc.graph.to_dot(y, show_shapes=False), tc.graph.to_dot(y, show_shapes=False, show_backward=True)):
        assert "(2, 3)" not in dot and "(3,)" not in dot and "float64" not in dot
        assert 'label="leaf 0"' in dot and 'label="leaf 1"' in dot  # unnamed leaves told apart by number
    assert 'label="leaf (2, 3)\\n(2, 3) float64"' in tc.graph.to_dot(y)  # with shapes, as before


def test_bad_arguments_name_the_argument_and_what_was_given(tmp_path):
    a = tc.tensor(np.ones(3), requires_grad=True)
    y = F.sum(a * a)
    for outputs in ([], ()):
        for backward in (False, True):
            with pytest.raises(ValueError, match="outputs is empty"):
                tc.graph.to_dot(outputs, show_backward=backward)
    with pytest.raises(TypeError, match=r"outputs\[1\] must be a Tensor, not int"):
        tc.graph.to_dot([y, 3])
    with pytest.raises(TypeError, match="outputs must be a Tensor or a list of Tensors, not float"):
        tc.graph.to_dot(1.5)
    with pytest.raises(ValueError, match=r"outputs\[0\] does not require grad"):
        tc.graph.to_dot([tc.tensor(np.ones(2))])
    with pytest.raises(TypeError, match=r"params must be a Module or a \{name: Tensor\} dict, not list"):
        tc.graph.to_dot(y, params=[a])
    with pytest.raises(TypeError, match=r"params\['a'\] must be a Tensor, not ndarray"):
        tc.graph.to_dot(y, params={"a": a.data})
    with pytest.raises(TypeError, match="params' names must be strings, not int"):
        tc.graph.to_dot(y, params={0: a})
    with pytest.raises(TypeError, match="show_shapes must be True or False, not 'no'"):
        tc.graph.to_dot(y, show_shapes="no")
    with pytest.raises(TypeError, match="show_backward must be True or False, not None"):
        tc.graph.to_dot(y, show_backward=None)
    with pytest.raises(TypeError, match="path must be a file name .* not NoneType"):
        tc.graph.draw(y, None)
    with pytest.raises(ValueError, match="outputs is empty"):
        tc.graph.draw([], tmp_path / "g.svg")
    assert not (tmp_path / "g.svg").exists()


def fake_dot(folder, formats="canon dot pdf svg xdot"):
    """A ``dot`` on PATH that writes svg and pdf only, answering anything else as Graphviz does."""
    folder.mkdir()
    script = folder / "dot"
    script.write_text("#!/bin/sh\n"
                      'case "$1" in -Tsvg|-Tpdf) cat > /dev/null; shift; echo "<svg/>" > "$2"; exit 0;; esac\n'
                      f'echo "Format: \\"${{1#-T}}\\" not recognized. Use one of: {formats}" >&2\nexit 1\n')
    script.chmod(0o755)
    return str(folder)


def test_a_format_dot_lacks_is_named_with_the_ones_it_offers(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", fake_dot(tmp_path / "bin"))
    assert tc.graph.dot_formats() == ("canon", "dot", "pdf", "svg", "xdot")
    a = tc.tensor(np.ones(3), requires_grad=True)
    with pytest.raises(RuntimeError, match=r"cannot write png \(g.png\); it offers: canon, dot, pdf, svg, xdot"):
        tc.graph.draw(F.sum(a * a), tmp_path / "g.png")


def test_the_graph_command_refuses_a_format_dot_lacks_before_any_work(tmp_path, capsys, monkeypatch):
    from tinygrad_caps.models.app.cli import graph as command

    monkeypatch.setenv("PATH", fake_dot(tmp_path / "bin", "canon dot pdf:cairo svg svg:core xdot"))
    monkeypatch.setattr(command, "graph_loss", lambda *args: pytest.fail("the model was run"))
    assert cli.main(["graph", "--out", str(tmp_path / "g.png"), "--device", "cpu"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1
    assert "cannot write png; it offers canon, dot, pdf, svg, xdot (use .svg, .pdf or .dot)" in lines[0]
    assert not (tmp_path / "g.png").exists()


@pytest.mark.parametrize("out", ["new/", "new.svg/", "new.dot/", "folder", "folder/", "folder.svg"])
def test_the_graph_command_refuses_a_folder_in_one_line_before_any_work(tmp_path, capsys, monkeypatch, out):
    from tinygrad_caps.models.app.cli import graph as command

    (tmp_path / "folder").mkdir()
    (tmp_path / "folder.svg").mkdir()
    monkeypatch.setattr(command, "graph_loss", lambda *args: pytest.fail("the model was run"))
    monkeypatch.chdir(tmp_path)
    assert cli.main(["graph", "--out", out, "--device", "cpu"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and f"--out {out} is a folder" in lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder", "folder.svg"]
    assert list((tmp_path / "folder").iterdir()) == [] and list((tmp_path / "folder.svg").iterdir()) == []


# ----- the backward drawing: routing boxes kept, gradients the other way up, folded iterations -----

def clusters_of(dot):
    """{box label: (its node names, the labels of the boxes it sits in)}, read from the DOT text."""
    found, stack = {}, []
    for line in dot.splitlines():
        opened = re.match(r'\s*subgraph cluster_\d+ \{ label="([^"]+)"', line)
        if opened:
            stack.append(opened.group(1))
            found[stack[-1]] = ([], tuple(stack[:-1]))
        elif line.strip() == "}" and stack:
            stack.pop()
        elif stack:
            node = re.match(r"\s*(\w+) \[shape=", line)
            if node:
                found[stack[-1]][0].append(node.group(1))
    return found


def node_labels(dot):
    """{node name: its label, unescaped} of the DOT text."""
    return {name: label.replace("\\n", "\n") for name, label in
            re.findall(r'^\s*(\w+) \[shape=[^\n]*?label="((?:[^"\\]|\\.)*)"\];$', dot, re.M)}


def edges_of(dot):
    """[(source, target, attributes text)] of the DOT text."""
    return re.findall(r"^\s*(\w+) -> (\w+)(?: \[(.*)\])?;$", dot, re.M)


def forward_routing_ops(loss):
    """{"routing iteration N": number of recorded ops in that scope} of the forward graph."""
    counts = {}
    stack, seen = [loss.creator], set()
    while stack:
        fn = stack.pop()
        if id(fn) in seen:
            continue
        seen.add(id(fn))
        if fn.scope and fn.scope.startswith("routing iteration"):
            counts[fn.scope] = counts.get(fn.scope, 0) + 1
        stack.extend(e for e in fn.next if isinstance(e, tc.autograd.Function))
    return counts


def test_the_backward_drawing_keeps_each_routing_iteration_in_its_box_and_boxes_its_backward():
    model, loss = capsnet_loss(3)
    dot = tc.graph.to_dot(loss, params=model, show_backward=True)
    boxes = clusters_of(dot)
    for scope, count in forward_routing_ops(loss).items():  # the forward boxes stay whole and apart
        members, parents = boxes[scope]
        assert len(members) == count and parents == (), scope
        backward_members, backward_parents = boxes[f"{scope}, backward"]
        assert backward_members and backward_parents == ("backward",), scope
    labels = node_labels(dot)
    backward_ops = {name for label, (members, parents) in boxes.items() if label == "backward" or parents
                    for name in members}
    assert len(backward_ops) > 2 * tc.graph.tape_counts(loss)["ops"]
    # a gradient flows down the picture: every edge out of a backward op is drawn the other way up
    # (dir=back, its DOT edge from target to source); a forward value it reads is a dashed grey edge
    for source, target, attributes in edges_of(dot):
        if target in backward_ops and "dir=back" in attributes:
            assert source in backward_ops or labels[source].startswith("d/d ")
        if source not in backward_ops and target in backward_ops:
            assert "style=dashed" in attributes or "dir=back" in attributes
    assert any("style=dashed" in attributes for _, _, attributes in edges_of(dot))
    assert tc.graph.to_dot(loss, params=model, show_backward=True) == dot  # the same text each time


def test_an_ops_backward_goes_in_the_box_of_the_op():
    rng = np.random.default_rng(0)
    x = tc.tensor(rng.standard_normal((2, 3)), requires_grad=True)
    with tc.graph.scope("routing iteration 1"):
        s = F.softmax(x, axis=1)
    y = F.sum(s * tc.tensor(rng.standard_normal((2, 3))))
    dot = tc.graph.to_dot(y, params={"x": x}, show_backward=True)
    labels, boxes = node_labels(dot), clusters_of(dot)
    assert [labels[n] for n in boxes["routing iteration 1"][0]] == ["Softmax"]
    inside = boxes["routing iteration 1, backward"][0]  # y * (gy - sum(gy * y)), as create_graph records it
    assert sorted(labels[n] for n in inside) == ["Mul", "Mul", "Sub", "Sum"]
    assert boxes["backward"][0] == [] and boxes["routing iteration 1, backward"][1] == ("backward",)  # nothing else
    gradient = [(s, t) for s, t, a in edges_of(dot) if "dir=back" in a]
    assert len(gradient) == 4 and ("o1", inside[0]) in gradient  # d/d x comes out of the first Mul
    saved = [(s, t) for s, t, a in edges_of(dot) if "style=dashed" in a]
    assert {s for s, _ in saved} == {boxes["routing iteration 1"][0][0]}  # the backward reads softmax's output
    folded = node_labels(tc.graph.to_dot(y, params={"x": x}, show_backward=True, expand="none"))
    assert {"routing iteration 1\n1 op, folded", "routing iteration 1, backward\n4 ops, folded"} <= set(folded.values())


def test_folding_draws_one_iteration_op_by_op_and_each_other_as_one_node():
    model, loss = capsnet_loss(3)
    assert tc.graph.routing_iterations(loss) == [1, 2, 3]
    forward = forward_routing_ops(loss)
    dot = tc.graph.to_dot(loss, params=model, expand=2)
    labels = node_labels(dot)
    folded = {label: name for name, label in labels.items() if "folded" in label}
    assert set(folded) == {f"routing iteration {n}\n{forward[f'routing iteration {n}']} ops, folded" for n in (1, 3)}
    assert re.findall(r"shape=box3d", dot) and len(nodes(dot, "box3d")) == 2
    assert len(clusters_of(dot)["routing iteration 2"][0]) == forward["routing iteration 2"]
    drawn = len(re.findall(r"\[shape=box,", dot)) + sum(int(re.search(r"(\d+) ops", label).group(1)) for label in folded)
    assert drawn == tc.graph.tape_counts(loss)["ops"]  # every op drawn, or counted in its folded node
    pairs = [(s, t) for s, t, _ in edges_of(dot) if s in folded.values() or t in folded.values()]
    assert len(pairs) == len(set(pairs)) and all(s != t for s, t in pairs)  # once per pair, no loop
    everything = tc.graph.to_dot(loss, params=model, expand="all")
    assert "box3d" not in everything and everything == tc.graph.to_dot(loss, params=model)
    none = tc.graph.to_dot(loss, params=model, expand="none")
    assert len(nodes(none, "box3d")) == 3 and "cluster" not in none


def test_the_folded_backward_is_one_node_per_iteration_and_per_other_op():
    model, loss = capsnet_loss(3)
    dot = tc.graph.to_dot(loss, params=model, show_backward=True, expand=2)
    labels = node_labels(dot)
    assert "routing iteration 1, backward" in "".join(labels.values())
    assert any(label.startswith("routing iteration 3, backward\n") and label.endswith(" ops, folded")
               for label in labels.values())
    assert "routing iteration 2, backward" in clusters_of(dot)  # the expanded one keeps its ops
    per_op = [label for label in labels.values() if re.match(r"\w+ backward\n\d+ ops, folded$", label)]
    assert per_op and all(int(re.search(r"(\d+) ops", label).group(1)) >= 2 for label in per_op)
    full = tc.graph.to_dot(loss, params=model, show_backward=True)
    assert len(labels) < 0.7 * len(node_labels(full))


def test_two_routing_layers_get_a_box_each_per_iteration():
    tc.manual_seed(0)
    model = CapsNet(conv1_channels=4, primary_types=2, routing_iterations=2, hidden_capsules=[(4, 4)])
    x = tc.tensor(np.random.default_rng(0).random((2, 1, 28, 28), dtype=np.float32))
    y = np.array([1, 7])
    out = model(x, y)
    loss = capsule_loss(out.lengths, out.reconstruction, x, y)
    clusters = re.findall(r'subgraph cluster_\d+ \{ label="([^"]+)"', tc.graph.to_dot(loss, params=model))
    assert clusters == [f"routing iteration {r} ({k} of 2)" for r in (1, 2) for k in (1, 2)]
    labels = node_labels(tc.graph.to_dot(loss, params=model, expand=1)).values()
    assert sum(label.startswith("routing iteration 2 (") and "folded" in label for label in labels) == 2


def test_expand_is_checked():
    model, loss = capsnet_loss(3)
    with pytest.raises(ValueError, match=r"expand=5, but the graph has iterations 1 to 3"):
        tc.graph.to_dot(loss, expand=5)
    with pytest.raises(ValueError, match="expand must be \"all\", \"none\" or a routing iteration number, not 'some'"):
        tc.graph.to_dot(loss, expand="some")
    with pytest.raises(ValueError, match="expand must be a routing iteration number >= 1, got 0"):
        tc.graph.to_dot(loss, expand=0)
    for wrong in (2.0, True, None):
        with pytest.raises(TypeError, match="expand must be"):
            tc.graph.to_dot(loss, expand=wrong)
    with pytest.raises(ValueError, match="needs cluster_routing=True"):
        tc.graph.to_dot(loss, cluster_routing=False, expand=2)
    a = tc.tensor(np.ones(3), requires_grad=True)
    assert tc.graph.routing_iterations(F.sum(a * a)) == []
    with pytest.raises(ValueError, match="the graph has no routing iteration"):
        tc.graph.to_dot(F.sum(a * a), expand=1)


def test_the_graph_command_folds_by_default_and_expands_on_request(tmp_path, capsys):
    tiny = ["--conv1-channels", "4", "--primary-types", "2", "--device", "cpu"]
    assert cli.main(["graph", "--out", str(tmp_path / "g.dot"), "--backward", *tiny]) == 0
    out = capsys.readouterr().out
    assert "routing iteration 2 op by op, 1 and 3 folded, and the backward of each other op" in out
    folded = (tmp_path / "g.dot").read_text()
    assert "routing iteration 2, backward" in folded and "box3d" in folded
    assert cli.main(["graph", "--out", str(tmp_path / "all.dot"), "--backward", "--expand", "all", *tiny]) == 0
    assert "every op drawn" in capsys.readouterr().out
    everything = (tmp_path / "all.dot").read_text()
    assert "box3d" not in everything and len(node_labels(folded)) < 0.7 * len(node_labels(everything))
    assert cli.main(["graph", "--out", str(tmp_path / "one.dot"), "--routing-iterations", "1", *tiny]) == 0
    assert "routing iteration 1 op by op" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--expand", "5"], "--expand 5: this model's graph has routing iterations 1 to 3; use one of them, all or none"),
    (["--expand", "2", "--routing-iterations", "1"], "--expand 2: this model's graph has one routing iteration (1)"),
    (["--expand", "0"], "argument --expand: must be all, none or a routing iteration number >= 1, got 0"),
    (["--expand", "some"], "argument --expand: must be all, none or a routing iteration number, got 'some'"),
])
def test_the_graph_command_refuses_a_bad_expand_in_one_line(tmp_path, capsys, argv, message):
    status = None
    try:
        status = cli.main(["graph", "--out", str(tmp_path / "g.dot"), "--conv1-channels", "4", "--primary-types", "2",
                           "--device", "cpu", *argv])
    except SystemExit as exc:
        status = exc.code
    lines = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(lines) == 1 and message in lines[0], lines
    assert list(tmp_path.iterdir()) == []
