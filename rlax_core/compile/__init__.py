"""Ahead-of-time compilation for TPU slices without a TPU: ``topology`` (a slice's devices from libtpu),
``programs`` (each role's programs lowered from abstract inputs), ``report`` (XLA's memory and cost
analyses, rooflines, the Mosaic kernels). ``rlax compile`` (pipelines/compile.py) drives them."""
