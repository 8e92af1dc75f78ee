"""Drawings of the tape (tinygrad_caps.graph): the DOT text has one node per op and per leaf and
one edge per recorded input and output, names parameters by their module path, boxes each routing
iteration, draws the gradients' graph on request; the ``graph`` command writes it. Pixels are not
checked: the structure is."""
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
