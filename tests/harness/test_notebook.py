import io

import pandas as pd
import pytest

nbformat = pytest.importorskip("nbformat")  # the dev extra; absent on the GPU machine
NotebookClient = pytest.importorskip("nbclient").NotebookClient

from tests.conftest import REPO

pytestmark = pytest.mark.slow  # a Jupyter kernel


def test_analysis_notebook_runs_and_its_speedups_are_fig9s():
    nb = nbformat.read(REPO / "notebooks" / "analysis.ipynb", as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(REPO / "notebooks")}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    assert any(o.get("output_type") == "display_data" and "image/png" in o.get("data", {}) for o in outputs)  # inline
    printed = next(o["text"] for o in reversed(outputs) if o.get("output_type") == "stream" and "pt2_cg" in o["text"])
    notebook = pd.read_csv(io.StringIO(printed), index_col=0)
    fig9 = pd.read_csv(REPO / "paper_figures" / "fig9_speedup.csv", index_col=0)
    fig9 = fig9.loc[[i for i in fig9.index if not i.startswith("geomean")]].add_suffix("_fig9")
    joined = notebook.join(fig9, how="outer")
    for v in ("pt2_cg", "grace"):
        pd.testing.assert_series_equal(joined[v], joined[f"{v}_fig9"].round(4), check_names=False, atol=1e-4)
