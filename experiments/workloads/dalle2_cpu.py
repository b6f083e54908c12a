"""DALLE2 with its noise schedule as a plain CPU tensor attribute, as many diffusion samplers keep it:
every DDIM step indexes the CPU table and mixes the scalars into GPU work. Stock Inductor (torch 2.11)
fuses the CPU constant's indexing into a CUDA kernel whose launch fails; CGCT's cpu_inputs
pass copies the table to the GPU once per call, and the whole sampling loop runs there."""

from experiments.workloads.dalle2 import Model as _DALLE2


class Model(_DALLE2):
    name = "dalle2_cpu"
    acronyms = {}
    origin = "DALLE2 (in-house) with its schedule kept on the CPU: stock fails to launch, a case for CGCT"
    cpu_schedule = True
