"""docs/notebooks/gradient-flow.ipynb runs from top to bottom (nbclient, in a kernel of this Python):
it loads the committed run files, checks each kept summary.json against them, redraws the headline
figures and trains a tiny model for one live gradflow report. What it says and draws follows the
study folders the repository keeps: a study not kept yet is named as such and its figures are left out."""
import json

import pytest

from paths import ROOT

pytestmark = pytest.mark.slow

NOTEBOOK = ROOT / "docs" / "notebooks" / "gradient-flow.ipynb"
RESULTS = ROOT / "benchmarks" / "studies" / "results"
FIGURES_OF = {"routing-algorithms": 3, "recipe-ablation": 1}  # the figures the notebook draws from each study


def kept_summary(name: str):
    """A kept study's summary.json, or None where the repository does not keep the study."""
    folder = RESULTS / name
    return json.loads((folder / "summary.json").read_text()) if (folder / "study.json").is_file() else None


def test_the_gradient_flow_notebook_runs_from_top_to_bottom():
    nbformat = pytest.importorskip("nbformat", reason="nbclient is in the dev extra")
    nbclient = pytest.importorskip("nbclient", reason="nbclient is in the dev extra")
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    assert all(not cell.get("outputs") for cell in notebook.cells if cell.cell_type == "code"), \
        "commit the notebook without outputs"
    client = nbclient.NotebookClient(notebook, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(NOTEBOOK.parent)}})
    client.execute()
    texts = ["".join(output.get("text", "")) for cell in notebook.cells if cell.cell_type == "code"
             for output in cell.outputs]
    figures = sum("image/png" in output.get("data", {}) for cell in notebook.cells if cell.cell_type == "code"
                  for output in cell.outputs)
    kept = {name: kept_summary(name) for name in FIGURES_OF}
    assert figures == sum(count for name, count in FIGURES_OF.items() if kept[name] is not None)
    for name, summary in kept.items():
        line = (f"{name}: run files not in the repository yet" if summary is None else
                f"{name}: {summary['runs_finished']} of {summary['runs_planned']} runs, {summary['epochs']} epochs")
        assert any(line in text for text in texts), (line, texts)
    assert any("cos(full, detach) of digit.weight's gradient" in text for text in texts)
