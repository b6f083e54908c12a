import pytest

nbformat = pytest.importorskip("nbformat")  # the dev extra; absent on the GPU machine
NotebookClient = pytest.importorskip("nbclient").NotebookClient

from tests.conftest import REPO


def test_analysis_notebook_runs():
    nb = nbformat.read(REPO / "notebooks" / "analysis.ipynb", as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(REPO / "notebooks")}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    assert any("records from" in o.get("text", "") for o in outputs)
