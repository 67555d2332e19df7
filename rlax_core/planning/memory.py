"""The memory planner: bytes per chip of a rollout replica and of the trainer, against declared hardware.

    plan = plan_rollout(model_config, engine_config, hardware.rollout, dtype="bfloat16")
    print(plan.describe())          # weights, incoming weights, KV pool, activations, headroom
    refuse_unless_fits([plan, plan_trainer(...)])   # ConfigError with the numbers and the knobs

Weights and optimizer state are exact: every parameter's bytes divided by the mesh axes that split
it, by the same rules and mesh the engine and the trainer place it with (``rlax_core.parallel``). The
KV pool is exact. Activations are the dominant transient buffers of the programs as written,
counted per chip (formulas below, beside each); XLA may fuse some away, so they are an upper
estimate. A plan fits when its total stays within ``USABLE_FRACTION`` of the chip's memory: the
rest is left to XLA's own scratch, the runtime and fragmentation.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Mapping

import jax
import numpy as np
from jax.sharding import AbstractMesh

from rlax_core.config import ConfigError
from rlax_core.inference.config import EngineConfig
from rlax_core.inference.kv_cache import scale_pool_shape
from rlax_core.inference.placement import lora_mode_for
from rlax_core.inference.sharding import check_expert_parallel
from rlax_core.models.attention import attention_for_platform
from rlax_core.models.attention import fits as attention_fits
from rlax_core.models.config import ModelConfig
from rlax_core.models.lora import (EIGHT_BIT_FORMATS, adapter_logical_axes, decoding_adapters, init_adapters,
                                   quantize_kernels, quantized_logical_axes)
from rlax_core.models.lora_config import TARGETS, LoraConfig
from rlax_core.models.transformer import init_params, param_logical_axes, param_shapes
from rlax_core.parallel.mesh import MESH_AXES, mesh_shape, spec_for
from rlax_core.planning.hardware import CPU, GIB, SliceSpec, platform_of
from rlax_core.training.config import TrainerConfig
from rlax_core.utils.dtypes import dtype as dtype_named
from rlax_core.utils.dtypes import itemsize

USABLE_FRACTION = 0.9
# XLA's generated code per chip, as `rlax compile` measured it for the small Qwen2 recipe
# (tests/fixtures/compile): 1.4-2.6 MiB per engine program, 19-25 MiB for the trainer's update on
# v5e and v5p. An engine program's fixed scratch counts with its code: that recipe's decode on v5p
# held 3.7 MiB of temporaries beside 2.0 MiB of code, its logits a few KiB. A small model's programs
# are mostly code and scratch; a large one's, weights and activations.
ENGINE_CODE_BYTES = 4 * 2**20
TRAINER_CODE_BYTES = 24 * 2**20
_F32 = itemsize("float32")
_TPU_LANES = 128  # the minor tile of TPU HBM arrays: a row of a float32 array is read 128 numbers wide


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
    """Bytes per chip by kind for one role; ``knobs`` names the config key that shrinks each kind."""

    role: str
    model: str
    chip: str
    chips: int
    layout: str  # how the role's chips are used, e.g. "4 replicas x tensor_parallel 4"
    bytes_per_chip: int
    parts: dict[str, int]
    knobs: dict[str, str]
    num_pages: int = 0  # a rollout plan's KV pages (``engine.num_pages: auto`` resolved) and their size
    page_size: int = 0

    @property
    def total(self) -> int:
        return sum(self.parts.values())

    @property
    def usable(self) -> int:
        return int(self.bytes_per_chip * USABLE_FRACTION)

    @property
    def headroom(self) -> int:
        return self.usable - self.total

    @property
    def fits(self) -> bool:
        return self.headroom >= 0

    def describe(self) -> str:
        parts = ", ".join(f"{kind} {gib(size)}" for kind, size in self.parts.items())
        return (f"{self.role}: {self.model} on {self.chips} x {self.chip} ({self.layout}); per chip {parts}; "
                f"total {gib(self.total)} of {gib(self.usable)} usable ({gib(self.bytes_per_chip)} x "
                f"{USABLE_FRACTION:g}): headroom {gib(self.headroom)}")

    def advice(self) -> str:
        """The largest parts and the keys that shrink them."""
        largest = sorted(self.parts, key=self.parts.get, reverse=True)[:2]
        return "; ".join(f"{kind} ({gib(self.parts[kind])}): {self.knobs[kind]}" for kind in largest)


def gib(size: int) -> str:
    """A size in GiB, or in MiB below one GiB (a small model's parts would all read 0.00 GiB)."""
    return f"{size / GIB:.2f} GiB" if abs(size) >= GIB else f"{size / 2**20:.1f} MiB"


def _sharded_bytes(model: ModelConfig, dtype: str, mesh_sizes: tuple[int, ...]) -> int:
    """Bytes per chip of the model's parameters in ``dtype`` on a data x fsdp x expert x tensor mesh
    (a mixture of experts' experts split over ``expert``, by the same rules)."""
    shapes = param_shapes(model)
    return _tree_bytes(shapes, param_logical_axes(model), dtype, mesh_sizes)


def kv_bytes_per_head(model: ModelConfig, cache_dtype: str) -> int:
    """Bytes of one token's key (or value) for one KV head in the engine's pages: ``head_dim``
    numbers of ``cache_dtype``, and for an eight-bit cache their float32 scale (``inference.kv_cache``)."""
    if cache_dtype in EIGHT_BIT_FORMATS:
        return model.head_dim + _F32
    return model.head_dim * itemsize(cache_dtype)


def decode_kv_read_bytes(model: ModelConfig, engine: EngineConfig, context_lengths, kernel: str = "") -> int:
    """Bytes of KV pages one decode step's attention reads on one chip, which XLA's cost analysis
    does not see inside a Pallas call: for each running sequence of ``context_lengths`` tokens, its
    whole pages (ceil(length / page_size) of them: a kernel reads a page whole), keys and values,
    every layer, the chip's KV heads (all of them where ``tensor_parallel`` does not divide them),
    each head-token ``kv_bytes_per_head`` of ``engine.cache_dtype`` (an eight-bit one's scale with it).
    ``kernel="tpu"``: our eight-bit TPU kernel (``inference.pallas_eight_bit``) DMAs a page's
    ``page_size`` scales as one row of TPU HBM's 128-lane tiles, so a page of fewer than 128 tokens
    reads its scale row padded to 128 float32 numbers (the recipes' 128-token pages: exactly a row)."""
    tp = engine.tensor_parallel
    heads = model.num_kv_heads // tp if model.num_kv_heads % tp == 0 else model.num_kv_heads
    pages = sum(-(-int(length) // engine.page_size) for length in context_lengths)
    per_page = engine.page_size * kv_bytes_per_head(model, engine.cache_dtype)
    if kernel == "tpu" and engine.cache_dtype in EIGHT_BIT_FORMATS:
        per_page += (-(-engine.page_size // _TPU_LANES) * _TPU_LANES - engine.page_size) * _F32
    return 2 * model.num_layers * heads * pages * per_page


def _engine_weight_bytes(model: ModelConfig, engine: EngineConfig, dtype: str, sizes) -> tuple[int, int]:
    """(bytes per chip of the weights as the engine holds them, bytes of one layer's widest projection
    at full width, which a swap holds while quantizing it; 0 for a full-width engine). Eight-bit:
    every projection kernel one byte per number with a float32 scale per output channel
    (``lora.quantize_kernels``, ``inference.placement.held_weights``); the rest in ``dtype``."""
    if engine.weight_dtype not in EIGHT_BIT_FORMATS:
        return _sharded_bytes(model, dtype, sizes), 0
    make = lambda: init_params(model, jax.random.key(0), dtype_named(dtype))
    published = jax.eval_shape(make)
    held = jax.eval_shape(lambda: quantize_kernels(make(), engine.weight_dtype))
    axes = param_logical_axes(model)
    layers = [name for name in axes if name == "layers" or name.startswith("layers_")]
    def one_layer(layer, module, proj):  # a stacked kernel's slice: its leading ``layers`` axis dropped
        kernel, names = published[layer][module][proj]["kernel"], axes[layer][module][proj]["kernel"]
        if names[0] == "layers":
            kernel, names = jax.ShapeDtypeStruct(kernel.shape[1:], kernel.dtype), names[1:]
        return _tree_bytes(kernel, names, None, sizes)

    widest = max((one_layer(layer, module, proj) for layer in layers for (module, proj), _, _ in TARGETS.values()
                  if proj in axes[layer].get(module, {})), default=0)
    return _tree_bytes(held, quantized_logical_axes(axes), None, sizes), widest


def _targeted_kernels(model: ModelConfig, lora) -> tuple[dict, dict]:
    """The shapes and axes of the kernels LoRA adapts (the merged copies the trainer's forward holds)."""
    shapes = param_shapes(model)["layers"]
    axes = param_logical_axes(model)["layers"]
    picked = [TARGETS[t][0] for t in lora.targets]
    return ({p: shapes[m][p]["kernel"] for m, p in picked}, {p: axes[m][p]["kernel"] for m, p in picked})


def _tree_bytes(shapes, axes, dtype: str | None, mesh_sizes: tuple[int, ...]) -> int:
    """Bytes per chip of a tree of ``shapes`` in ``dtype`` (None: each leaf's own), each leaf placed by
    its logical ``axes``."""
    mesh = AbstractMesh(mesh_sizes, MESH_AXES)
    total = 0
    for names, leaf in zip(jax.tree.leaves(axes, is_leaf=lambda x: isinstance(x, tuple)), jax.tree.leaves(shapes)):
        spec = spec_for(names, leaf.shape, mesh)
        split = math.prod(mesh.shape[a] for entry in spec if entry for a in ((entry,) if isinstance(entry, str) else entry))
        total += int(np.prod(leaf.shape)) * (itemsize(dtype) if dtype else leaf.dtype.itemsize) // split
    return total


def scoring_model_parts(model: ModelConfig, batch: int, length: int, dtype: str,
                        name: str = "reward model") -> dict[str, int]:
    """Bytes on a chip of a model the scoring runs (a ``reward_model`` term's, ``name`` "reward model";
    a distillation teacher's, "teacher"): its weights whole (the scoring loads them on one device)
    and one forward's activations over [batch, length], one layer at a time as the engine's prefill,
    with dense attention's float32 scores and exponentials [B, H, T, T] (the forward is dense). A
    causal model (a teacher: no score head) adds its float32 logits and their log-softmax [B, T, V],
    from which it reads each token's log-prob."""
    act = itemsize(dtype)
    weights = model.num_params * act  # a score head's model: the embedding, the layers and [hidden]
    activations = batch * length * act * (3 * model.hidden_size + (model.num_heads + 2 * model.num_kv_heads)
                                          * model.head_dim + _feed_forward_width(model, 1, expert=1))
    activations += 2 * batch * model.num_heads * length * length * _F32
    if not model.score_head:
        activations += 2 * batch * length * model.vocab_size * _F32
    return {f"{name} weights": weights, f"{name} activations": activations}


def plan_rollout(model: ModelConfig, engine: EngineConfig, hardware: SliceSpec, dtype: str,
                 name: str = "model", lora: LoraConfig | None = None,
                 beside: Mapping[str, int] | None = None) -> MemoryPlan:
    """One engine replica's bytes per chip: it spans ``engine.chips_per_replica`` chips of a host
    (tensor_parallel x expert_parallel: a mixture of experts' experts split over the latter, the
    rest of the model, the KV pool and the activations over the former only).

    ``lora``: the adapters of a LoRA run's versions, which the engine applies as ``engine.lora_mode``
    resolves on this chip (``_engine_lora_parts``). ``beside``: what else the role's chips hold (a
    reward model's or a teacher's ``scoring_model_parts``), counted before the KV pool takes what is left.
    """
    tp, ep, chips = engine.tensor_parallel, engine.expert_parallel, engine.chips_per_replica
    if hardware.chips_per_host % chips:
        key = "engine.tensor_parallel" if ep == 1 else "engine.expert_parallel"
        raise ConfigError(key, f"tensor_parallel {tp} x expert_parallel {ep} = {chips} does not divide "
                          f"hardware.rollout.chips_per_host={hardware.chips_per_host}: a replica spans chips of one host")
    try:
        check_expert_parallel(ep, model)
    except ValueError as error:
        raise ConfigError("engine.expert_parallel", str(error)) from None
    weights, quantizing = _engine_weight_bytes(model, engine, dtype, (1, 1, ep, 1, tp))
    kv_split = tp if model.num_kv_heads % tp == 0 else 1
    heads_split = tp if model.num_heads % tp == 0 else 1
    act_bytes = itemsize(dtype)
    kv_per_token = 2 * model.num_layers * model.num_kv_heads // kv_split * kv_bytes_per_head(model, engine.cache_dtype)
    # Prefill, one layer at a time: the residual, its norm and the attention output [B, T, E]; q, k, v;
    # the MLP's gate, up and product [B, T, F]; with dense attention (the CPU's, or a bucket the flash
    # kernel cannot tile) the float32 scores and their exponentials [B, Hq, T, T]. B is the largest
    # prefill batch, T the largest prompt bucket.
    batch, length = engine.prefill_batch, engine.prefill_buckets[-1]
    # The replica's rows are whole on each chip (expert=1): under expert parallelism each chip takes
    # its share and gathers them all back before its experts run (``models.moe.expert_parallel``).
    prefill = batch * length * act_bytes * (
        3 * model.hidden_size + (model.num_heads // heads_split + 2 * model.num_kv_heads // kv_split) * model.head_dim
        + _feed_forward_width(model, tp, expert=1))
    impl = attention_for_platform(platform_of(hardware.chip))
    if impl == "dense" or not attention_fits(impl, length):
        prefill += 2 * batch * model.num_heads // heads_split * length * length * _F32
    # Decode: float32 logits, log-softmax, and the sort keys and indices of top-k / top-p [slots, V].
    decode = 4 * engine.num_slots * model.vocab_size * _F32
    if hardware.chip == CPU:  # the dense decode window: every layer's K and V of every slot, whole length
        decode += kv_per_token * engine.num_slots * engine.pages_per_sequence * engine.page_size
    replicas = hardware.chips // chips
    lora_parts = {} if lora is None or not lora.enabled else _engine_lora_parts(model, engine, hardware, dtype, lora)
    # Only a drained swap holds the next version beside the current one for long; continue and
    # recompute install it at once, the current one dropped first (``Engine.update_weights``).
    parts = {"weights": weights, **({"incoming weights": weights} if engine.on_new_version == "drain" else {}),
             **({"quantizing a version": quantizing} if quantizing else {}),
             "KV pool": 0, "activations": max(prefill, decode), **lora_parts,
             **({"compiled code": ENGINE_CODE_BYTES} if hardware.chip != CPU else {}), **(beside or {})}
    page_bytes = kv_per_token * engine.page_size
    usable = int(hardware.bytes_per_chip * USABLE_FRACTION)
    num_pages = (max(0, (usable - sum(parts.values())) // page_bytes) if engine.num_pages == "auto"
                 else engine.num_pages)
    parts["KV pool"] = num_pages * page_bytes
    if engine.cache_dtype in EIGHT_BIT_FORMATS:  # the scale pools' page axis is rounded up (a TPU tile's rows)
        heads = model.num_kv_heads // kv_split
        unused = scale_pool_shape(num_pages, engine.page_size, heads)[1] - num_pages
        parts["KV pool"] += 2 * model.num_layers * heads * unused * engine.page_size * _F32
    return MemoryPlan(
        role="rollout", model=name, chip=hardware.chip, chips=hardware.chips,
        layout=f"{replicas} replica(s) x tensor_parallel {tp}" + (f" x expert_parallel {ep}" if ep > 1 else ""),
        bytes_per_chip=hardware.bytes_per_chip, parts=parts, num_pages=num_pages, page_size=engine.page_size,
        knobs={"weights": "raise engine.tensor_parallel (chips per replica), or engine.expert_parallel (a "
                          "mixture of experts' experts)",
               "incoming weights": "raise engine.tensor_parallel (a swap holds the next version beside the current)",
               "quantizing a version": "raise engine.tensor_parallel (a swap holds one layer's projection of the "
                                       "published version at full width while it quantizes it)",
               "KV pool": "lower engine.num_pages (or page_size), or raise engine.tensor_parallel",
               "activations": "lower engine.max_prefill_batch or the largest prefill bucket (prefill), "
                              "or engine.num_slots (decode)",
               "merged kernels": "engine.lora_mode: on_the_fly, or adapt fewer trainer.lora.targets",
               "adapters": "lower trainer.lora.rank, or raise engine.tensor_parallel",
               "adapter activations": "lower engine.max_prefill_batch or the largest prefill bucket, or "
                                      "trainer.lora.rank",
               "compiled code": "nothing: XLA's generated code",
               "reward model weights": "loop.rewards.reward_model.dtype: bfloat16, or a smaller reward model",
               "reward model activations": "lower loop.rewards.reward_model.batch_size or max_length",
               "teacher weights": "loop.rewards.distillation.dtype: bfloat16, or a smaller teacher",
               "teacher activations": "lower loop.rewards.distillation.batch_size or max_length"})


def _feed_forward_width(model: ModelConfig, tensor: int, expert: int) -> int:
    """Activation elements per token of the widest feed-forward layer on one chip. Dense: the gate, up
    and product [F / tensor]. Sparse (``models.moe``): each of a token's k copies as a row [H], its
    gate, up and product [F_e / tensor] and its output [H]; under expert parallelism a chip holds the
    copies of every token gathered over the ``expert`` axis, since a dropless static-shape buffer
    must have room for all of them routed to its own experts."""
    def split(size: int) -> int:
        return size // tensor if size % tensor == 0 else size

    width = 3 * split(model.intermediate_size) if len(model.moe_layers) < model.num_layers else 0
    if model.moe is not None:
        moe = model.moe
        gathered = expert if moe.num_experts % expert == 0 else 1
        sparse = gathered * moe.experts_per_token * (2 * model.hidden_size + 3 * split(moe.expert_intermediate_size))
        sparse += 3 * split(moe.shared_expert_intermediate_size)
        width = max(width, sparse)
    return width


def _engine_lora_parts(model: ModelConfig, engine: EngineConfig, hardware: SliceSpec, dtype: str,
                       lora: LoraConfig) -> dict[str, int]:
    """What an engine applying adapter versions holds beyond the base (``inference/adapters.py``).

    Merged: the merged copies of the adapted kernels beside the base's own. On the fly: the scaled
    float32 adapters, the current version's and the incoming one's (on one device fused like the
    kernels, zero blocks included; under tensor parallelism split by their kernels' rules), and the
    prefill's x @ A, float32 [batch, bucket, rank] per adapted projection of one layer (decode's
    [num_slots, rank] is smaller).
    """
    sizes = (1, 1, engine.expert_parallel, 1, engine.tensor_parallel)
    one_device = engine.chips_per_replica == 1
    if lora_mode_for(engine.lora_mode, platform_of(hardware.chip)) == "merged":
        targets = set(lora.targets)
        if one_device:  # one device fuses q/k/v and gate/up: adapting one part merges the whole fused kernel
            for fused in ({"q", "k", "v"}, {"gate", "up"}):
                targets |= fused if targets & fused else set()
        kernels = _targeted_kernels(model, dataclasses.replace(lora, targets=tuple(sorted(targets))))
        return {"merged kernels": _tree_bytes(*kernels, dtype, sizes)}
    stacked = lambda: init_adapters(model, lora, jax.random.key(0))
    if one_device:
        fused = jax.eval_shape(lambda: decoding_adapters(stacked(), model, lora, fuse=True))
        adapters = sum(leaf.size * _F32 for leaf in jax.tree.leaves(fused))
    else:
        adapters = _tree_bytes(jax.eval_shape(stacked), adapter_logical_axes(lora), "float32", sizes)
    low_rank = engine.prefill_batch * engine.prefill_buckets[-1] * lora.rank * len(lora.targets) * _F32
    return {"adapters": 2 * adapters, "adapter activations": low_rank}


def plan_trainer(model: ModelConfig, trainer: TrainerConfig, hardware: SliceSpec, rows_per_step: int,
                 uses_reference: bool = False, uses_value_model: bool = False, name: str = "model") -> MemoryPlan:
    """The trainer's bytes per chip on its data x fsdp x tensor mesh over every trainer chip.

    ``rows_per_step``: sequences in one batch (groups per step x samples per group).
    """
    try:
        sizes = mesh_shape(trainer.mesh, hardware.chips)
    except ValueError as error:
        raise ConfigError("trainer.mesh", f"{error} (hardware.trainer declares {hardware.chips} chips)") from None
    data, fsdp, expert, context, tensor = sizes
    dtype = trainer.param_dtype
    params = _sharded_bytes(model, dtype, sizes)
    count_share = params // itemsize(dtype)  # parameters held per chip
    # The float32 accumulator of micro-batch gradients, one micro-batch's gradient in the param dtype,
    # and the float32 update AdamW makes of them.
    gradients = count_share * (2 * _F32 + itemsize(dtype))
    optimizer = 2 * count_share * _F32  # AdamW's two moments, float32 whatever the parameters' dtype (step.py)
    parts = {"parameters": params, "gradients": gradients, "optimizer state": optimizer}
    if trainer.lora.enabled:
        parts.update(_lora_parts(model, trainer, dtype, sizes, params))
    elif uses_reference:  # (with LoRA the frozen base is the reference)
        parts["reference policy"] = params
    if uses_value_model:  # a critic of the policy's size, with its own gradients and optimizer
        parts["value model"] = params + gradients + optimizer
    rows = math.ceil(rows_per_step / (trainer.mini_batches * trainer.micro_batches * data * fsdp * expert))
    length = trainer.row_tokens or trainer.max_seq_len  # packed rows (training.packing) hold row_tokens
    if trainer.micro_batch_tokens:  # micro-batches by tokens: each chip's share is fixed
        rows = trainer.micro_batch_tokens // trainer.row_tokens
    # Context parallelism (models.context) splits each row's tokens over ``context`` chips: every
    # token-wise activation is local, attention is a local query chunk against the gathered keys.
    local = length // context
    heads = model.num_heads // tensor if model.num_heads % tensor == 0 else model.num_heads
    act = itemsize(dtype)
    # Per micro-batch on one chip: the layers' saved inputs [rows, T, E] (all of each layer's
    # activations without remat; with remat, besides, the activations of the one layer the backward
    # recomputes at a time, and with a flash kernel each layer's kernel residuals, its output
    # [rows, T, heads x D] and softmax statistics [rows, heads, T]); one layer's backward: with dense
    # attention its float32 scores, probabilities and their gradient [rows, heads, T, T], with a
    # flash kernel (models.attention) the output, its gradient and the softmax statistics
    # [rows, heads, T, D]; and the float32 logits, log-softmax and their gradient [rows, T, V / tensor] (on GPU, see below).
    # The remat terms are what the QwQ-32B trainer's plan lacked against XLA (docs/memory.md): 12%
    # under it before, on the safe side since.
    whole_layer = rows * local * act * (4 * model.hidden_size + _feed_forward_width(model, tensor, expert))
    per_layer = rows * local * act * model.hidden_size if trainer.remat else whole_layer
    impl = attention_for_platform(platform_of(hardware.chip)) if trainer.attention == "auto" else trainer.attention
    gathered = 2 * rows * length * model.num_kv_heads * model.head_dim * act  # a layer's keys and values
    if context > 1 and impl != "splash":  # the chunk's dense scores against every key, and the gathered keys
        attention = 3 * rows * heads * local * length * _F32 + gathered
        impl = "dense"
    elif impl == "dense":
        attention = 3 * rows * heads * length * length * _F32
    else:  # flash: the local queries' terms; with context, the gathered keys and their copy turned to a chunk
        attention = rows * heads * local * (2 * model.head_dim * act + 2 * _F32) + (2 * gathered if context > 1 else 0)
    if trainer.remat and platform_of(hardware.chip) != "gpu":
        # XLA:TPU holds these (the QwQ-32B compile); XLA:GPU's programs stayed under the plan without
        # them (the GPU recipes' trainers at 1.05-1.11x XLA:GPU, docs/memory.md), and counting them
        # there would overstate its trainers by a fifth.
        residuals = rows * heads * local * (model.head_dim * act + _F32) if impl != "dense" else 0
        if context > 1 and impl != "dense":  # and the row's gathered keys and values the chunks' kernels read
            kv_heads = model.num_kv_heads // tensor if model.num_kv_heads % tensor == 0 else model.num_kv_heads
            residuals += 2 * rows * length * kv_heads * model.head_dim * act
        per_layer += residuals
        attention += whole_layer
    vocab = model.vocab_size // tensor if model.vocab_size % tensor == 0 else model.vocab_size
    # The logits of the whole row (``length``, not a context chip's ``local``): the forward puts them back
    # in row order (transformer._full_sequence), which gathers them from the context chips onto each.
    if platform_of(hardware.chip) == "gpu":
        # XLA:GPU writes the float32 logits once and reuses the buffer for their gradient; beside it
        # stands a micro-batch's float32 gradient of the whole LM head (not yet reduce-scattered over
        # fsdp). Read from the buffer assignments of the 1.5B (8 x A100) and 7B (8 x H100) GPU
        # recipes' update steps (docs/compile.md); XLA:TPU's programs hold three such logits buffers.
        logits = rows * length * vocab * _F32 + vocab * model.hidden_size * _F32
    else:
        logits = 3 * rows * length * vocab * _F32
    parts["activations"] = model.num_layers * per_layer + attention + logits
    if trainer.lora.on_the_fly:
        # Each adapted projection's x @ A, float32 [rows, T, rank] whole on every chip (the rank axis is
        # replicated, so the contraction's partial sums are reduced, not split): the backward of B needs
        # it. Saved for every layer without remat; with remat, for the one layer being recomputed.
        low_rank = rows * length * trainer.lora.rank * len(trainer.lora.targets) * _F32
        parts["adapter activations"] = (1 if trainer.remat else model.num_layers) * low_rank
    if hardware.chip != CPU:  # XLA:CPU's code lives in host memory beside the program
        parts["compiled code"] = TRAINER_CODE_BYTES
    return MemoryPlan(
        role="trainer", model=name, chip=hardware.chip, chips=hardware.chips,
        layout=f"mesh data {data} x fsdp {fsdp}{f' x expert {expert}' if expert > 1 else ''}"
               f"{f' x context {context}' if context > 1 else ''} x tensor {tensor}, "
               f"{rows} row(s) per chip per micro-batch",
        bytes_per_chip=hardware.bytes_per_chip, parts=parts,
        knobs={"parameters": "raise trainer.mesh.fsdp or trainer.mesh.tensor (or the chips)",
               "gradients": "raise trainer.mesh.fsdp or trainer.mesh.tensor",
               "optimizer state": "raise trainer.mesh.fsdp or trainer.mesh.tensor",
               "reference policy": "raise trainer.mesh.fsdp, or drop algorithm.kl_coef",
               "adapters": "lower trainer.lora.rank or raise trainer.mesh.fsdp",
               "merged kernels": "adapt fewer trainer.lora.targets, or raise trainer.mesh.fsdp",
               "merged kernel gradients": "adapt fewer trainer.lora.targets, or raise trainer.mesh.fsdp",
               "value model": "raise trainer.mesh.fsdp or trainer.mesh.tensor",
               "activations": "raise trainer.micro_batches (rows per chip) or trainer.mesh.tensor, set "
                              "trainer.remat, or lower trainer.max_seq_len",
               "adapter activations": "raise trainer.micro_batches, set trainer.remat, or lower trainer.lora.rank",
               "compiled code": "nothing: XLA's generated code"})


def _lora_parts(model: ModelConfig, trainer: TrainerConfig, dtype: str, sizes, base: int) -> dict[str, int]:
    """A LoRA trainer's parts: the frozen base (QLoRA: int8 kernels with float32 scales), float32
    adapters with their gradients and AdamW moments, and, when the forward merges (no dropout, a float
    base), the adapted kernels ``W + s A B`` in the base's dtype with their gradient, which the
    backward forms before contracting it to the adapters'. On the fly neither exists."""
    adapters = _tree_bytes(jax.eval_shape(lambda: init_adapters(model, trainer.lora, jax.random.key(0))),
                           adapter_logical_axes(trainer.lora), "float32", sizes)
    if trainer.lora.base_dtype == "int8":
        shapes = jax.eval_shape(lambda: quantize_kernels(init_params(model, jax.random.key(0), dtype_named(dtype))))
        base = _tree_bytes(shapes, quantized_logical_axes(param_logical_axes(model)), None, sizes)
    parts = {"parameters": base, "adapters": adapters, "gradients": 2 * adapters, "optimizer state": 2 * adapters}
    if not trainer.lora.on_the_fly:
        merged = _tree_bytes(*_targeted_kernels(model, trainer.lora), dtype, sizes)
        parts.update({"merged kernels": merged, "merged kernel gradients": merged})
    return parts


def refuse_unless_fits(plans: list[MemoryPlan]) -> None:
    """A ``ConfigError`` naming every plan that does not fit: its numbers and the knobs to turn."""
    failing = [plan for plan in plans if not plan.fits]
    if failing:
        raise ConfigError("hardware", " | ".join(
            f"{plan.describe()} -- does not fit; turn: {plan.advice()}" for plan in failing))


def auto_num_pages(model: ModelConfig, engine: EngineConfig, hardware: SliceSpec, dtype: str,
                   lora: LoraConfig | None = None, beside: Mapping[str, int] | None = None) -> EngineConfig:
    """``engine`` with ``num_pages: auto`` replaced by the pages its chips hold beside everything
    else (``plan_rollout``); a ``ConfigError`` when they do not hold the sink and one whole budget."""
    if engine.num_pages != "auto":
        return engine
    plan = plan_rollout(model, engine, hardware, dtype, lora=lora, beside=beside)
    pages = plan.num_pages
    if pages < engine.pages_per_sequence + 1:
        turn = f"turn: {plan.advice()}" if beside else "raise engine.tensor_parallel"
        raise ConfigError("engine.num_pages", f"auto: {hardware.chip}'s memory left beside the weights and "
                          f"programs holds {pages} pages of {engine.page_size}, under one sequence's "
                          f"{engine.pages_per_sequence} and the sink; {turn}" + (f" ({plan.describe()})" if beside else ""))
    return dataclasses.replace(engine, num_pages=pages)


def mean_occupancy(lengths: list[int]) -> float:
    """Completion tokens a running sequence holds on average over the engine's running time: a
    sequence of length L runs L steps holding 0..L of them, so longer ones weigh more, E[L^2] / 2 E[L]."""
    return sum(n * n for n in lengths) / (2 * sum(lengths))


def concurrent_sequences(num_pages: int, page_size: int, num_slots: int, prompt_tokens: int, budget_tokens: int,
                         occupancy_tokens: float, admission: str) -> int:
    """Sequences an engine decodes at once with this pool (its sink page aside). ``reserve``: the pool
    over whole budgets (prompt + ``budget_tokens``, whole pages). ``on_demand``: over what a running
    sequence holds on average, its prompt and ``occupancy_tokens`` (``mean_occupancy``) plus its
    look-ahead page; the cost of preemptions, which a full pool makes, is not counted."""
    if admission == "reserve":
        per_sequence = -(-(prompt_tokens + budget_tokens) // page_size) * page_size
    else:
        per_sequence = prompt_tokens + occupancy_tokens + page_size
    return max(1, min(num_slots, int((num_pages - 1) * page_size // per_sequence)))
