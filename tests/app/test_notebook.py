"""docs/notebooks/gradient-flow.ipynb runs from top to bottom (nbclient, in a kernel of this Python):
it loads the committed run files, checks each kept summary.json against them, redraws the headline
figures and trains a tiny model for one live gradflow report."""
import pytest

from paths import ROOT

pytestmark = pytest.mark.slow

NOTEBOOK = ROOT / "docs" / "notebooks" / "gradient-flow.ipynb"


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
    assert figures == 4
    assert any(text.startswith("routing-algorithms: 33 of 33 runs") for text in texts), texts
    assert any("recipe-ablation: 36 of 36 runs" in text for text in texts)
    assert any("cos(full, detach) of digit.weight's gradient" in text for text in texts)
