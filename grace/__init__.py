"""GraCE: CUDA Graphs that just work for PyTorch 2.

    import torch
    compiled = torch.compile(model, backend="grace")   # no import of grace needed once installed
    print(grace.explain(model, *inputs))               # what was captured, what was not, and why
"""

from grace.backend import REPORTS, Options, grace_backend, reset  # noqa: F401  (registers backend="grace")
from grace.explain import copied_reasons, explain, explain_call, without_graph_reasons  # noqa: F401
