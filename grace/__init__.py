"""GraCE: CUDA Graphs that just work for PyTorch 2 (CGCT, PI, SCG inside torch.compile)."""
