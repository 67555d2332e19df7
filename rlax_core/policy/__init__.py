"""A policy to sample, evaluate or train from: where it comes from (``source``: a model folder, a
weight-store version, a checkpoint, a PEFT folder), shared by the rollout engine, the batch
pipelines and the trainer."""
