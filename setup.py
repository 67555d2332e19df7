"""RLAX on Beam: scalable, preemptible RL for LLM reasoning on JAX, orchestrated with Apache Beam.

Dataflow ships this package to its workers with ``--setup_file ./setup.py``; everything a worker
imports (the three packages and the YAML recipes under ``configs/``) must be listed here. The wheel
built from the sdist holds the same: ``rlax`` runs from any folder once installed.
"""
from setuptools import find_packages, setup

INSTALL_REQUIRES = [
    "apache-beam[gcp]==2.77.0",
    "jax>=0.7",
    "flax>=0.10",
    "optax",
    "orbax-checkpoint",
    "google-cloud-storage",
    "gcsfs",
    "xxhash",  # weight-store checksums (rlax_core.weights)
    "zstandard",  # weight-store deltas (rlax_core.weights.delta)
    "datasets",
    # Beam 2.77 needs pyarrow<26, numpy<2.5, protobuf<7; datasets needs pyarrow>=24.
    "pyarrow>=24,<26",
    "numpy<2.5",
    "protobuf<7",
    "pyyaml",
    "safetensors",
    "tokenizers",
    "sentencepiece",
    "jinja2",
    "math-verify[antlr4_13_2]",
    "datasketch",
    "tqdm",
    "rich",
    "tensorboardX",
    "matplotlib",
]

EXTRAS_REQUIRE = {
    "tpu": ["jax[tpu]"],  # Dataflow TPU workers (docker/Dockerfile, requirements/lock-tpu.txt)
    "gpu": ["jax[cuda12]"],  # Dataflow GPU workers (docker/Dockerfile, requirements/lock-gpu.txt)
    "test": ["pytest", "pytest-xdist", "pytest-timeout", "hypothesis"],
    # Weights & Biases beside TensorBoard (trainer.wandb.enabled; rlax_core.utils.wandb_logger).
    "wandb": ["wandb"],
    # Side-by-side benchmarks only: never imported by the library.
    "bench": ["torch", "transformers", "trl", "peft"],
}

setup(
    name="rlax-beam",
    version="0.1.0",
    description="Scalable, preemptible RL for LLM reasoning on JAX, orchestrated with Apache Beam",
    long_description=open("README.md", encoding="utf-8").read() if __import__("os").path.exists("README.md") else "",
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.11",
    # The recipes (configs/*.yaml at the repository root) are installed as pipelines/configs, where an
    # installed rlax finds them (pipelines.config.CONFIG_DIR): the same files, one copy in the repository.
    packages=find_packages(include=["rlax_core*", "transforms*", "pipelines*"]) + ["pipelines.configs"],
    package_dir={"pipelines.configs": "configs"},
    include_package_data=True,
    # rlax_core/compile/gpu_targets: XLA's GPU target descriptions, which rlax compile reads for GPU roles.
    package_data={"pipelines": ["assets/*/*"], "pipelines.configs": ["*.yaml"], "rlax_core.compile": ["gpu_targets/*.txtpb"]},
    install_requires=INSTALL_REQUIRES,
    extras_require=EXTRAS_REQUIRE,
    entry_points={"console_scripts": ["rlax = pipelines.cli:main"]},
)
