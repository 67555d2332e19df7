"""Ahead-of-time compilation for TPU slices and NVIDIA GPUs without either: ``topology`` (a role's
devices: a TPU slice from libtpu, GPUs from ``gpu``, XLA's target descriptions in ``gpu_targets/``),
``programs`` (each role's programs lowered from abstract inputs), ``report`` (XLA's memory and cost
analyses, rooflines, the kernels in the compiled HLO). ``rlax compile`` (pipelines/compile.py) drives them."""
