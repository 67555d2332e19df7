"""The weights' layout in the training forward, and back to the state's.

The state keeps the model's stacked layout (what checkpoints and weight versions hold). The forward
may run the layers unrolled (``trainer.scan_layers: false``: faster for shallow models on CPU) and
q/k/v and gate/up as one product each (``trainer.projections``: fused). Weights are converted once per
update, outside the micro-batch loop, so that the gradients accumulate in the forward's layout and
go back to the state's once.
"""

from __future__ import annotations

from typing import Any, Callable

from rlax_core.models.config import ModelConfig
from rlax_core.models.transformer import fuse_projections, stack_layers, unfuse_projections, unstack_layers


class ForwardLayout:
    """``to_forward`` / ``to_state`` of a policy tree, or of a critic's ``backbone`` (None passes)."""

    def __init__(self, model_config: ModelConfig, *, scan_layers: bool, fuse: bool):
        self.model_config, self.scan_layers, self.fuse = model_config, scan_layers, fuse

    def to_forward(self, tree: Any) -> Any:
        return _relayout(tree, self._forward)

    def to_state(self, tree: Any) -> Any:
        return _relayout(tree, self._state)

    def _forward(self, params: Any) -> Any:
        params = params if self.scan_layers else unstack_layers(params)
        return fuse_projections(params) if self.fuse else params

    def _state(self, tree: Any) -> Any:
        tree = unfuse_projections(tree, self.model_config) if self.fuse else tree
        return tree if self.scan_layers else stack_layers(tree)


def _relayout(tree: Any, convert: Callable[[Any], Any]) -> Any:
    if tree is None:
        return tree
    if "backbone" in tree:
        return {**tree, "backbone": convert(tree["backbone"])}
    return convert(tree)
