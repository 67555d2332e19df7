"""The shape of a decoder-only transformer: one frozen dataclass for Llama 2/3, Qwen2/2.5 and Qwen3, and
their mixture-of-experts kin Mixtral, Qwen2-MoE and Qwen3-MoE (``MoeConfig``).

``ModelConfig.from_hf(config_json_dict)`` reads a Hugging Face ``config.json`` in both the
transformers 4 layout (``rope_theta`` + ``rope_scaling``) and the transformers 5 layout
(``rope_parameters``). Any option that would change the model's math and that this code does not
implement (sliding windows, biases on the output projection, YaRN, ...) raises a ``ConfigError``
naming the key, so a checkpoint is never run with silently different numerics.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Literal, Mapping

from rlax_core.config import ConfigError, require

Architecture = Literal["llama", "qwen2", "qwen3", "mixtral", "qwen2_moe", "qwen3_moe"]

# Hugging Face `architectures` entries and `model_type` values we implement.
_HF_ARCHITECTURES: dict[str, Architecture] = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "MixtralForCausalLM": "mixtral",  # Llama with every MLP a mixture of experts
    "Qwen2MoeForCausalLM": "qwen2_moe",
    "Qwen3MoeForCausalLM": "qwen3_moe",
}
_HF_MODEL_TYPES: dict[str, Architecture] = {arch: arch for arch in _HF_ARCHITECTURES.values()}
# Sequence-classification reward models: the decoder with a one-label ``score`` head read at the last token.
_HF_SEQUENCE_CLASSIFIERS: dict[str, Architecture] = {
    "LlamaForSequenceClassification": "llama",
    "Qwen2ForSequenceClassification": "qwen2",
    "Qwen3ForSequenceClassification": "qwen3",
}
_MOE_ARCHITECTURES = ("mixtral", "qwen2_moe", "qwen3_moe")
INIT_STDDEV = 0.02  # Hugging Face's initializer_range for Llama and Qwen: the random init's matrices
_HF_CLASS_NAME = {arch: cls for cls, arch in _HF_ARCHITECTURES.items()}
_HF_SCORE_CLASS_NAME = {arch: cls for cls, arch in _HF_SEQUENCE_CLASSIFIERS.items()}


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """Long-context RoPE frequency scaling ("linear" as in Llama 2 long, "llama3" as in Llama 3.1+)."""

    rope_type: Literal["linear", "llama3"]
    factor: float
    # llama3 only: wavelengths above original/low_freq_factor are divided by `factor`, those below
    # original/high_freq_factor are kept, and the band between is interpolated.
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    def __post_init__(self):
        require(self.factor >= 1.0, "factor", "must be >= 1")
        if self.rope_type == "llama3":
            require(self.high_freq_factor > self.low_freq_factor, "high_freq_factor", "must exceed low_freq_factor")
            require(self.original_max_position_embeddings > 0, "original_max_position_embeddings", "must be > 0")


@dataclasses.dataclass(frozen=True)
class MoeConfig:
    """A sparse feed-forward: each token runs ``experts_per_token`` of ``num_experts`` SwiGLU experts.

    The router scores every expert with a softmax over ``x @ W_router`` (float32) and keeps the top k;
    their probabilities weight the experts' outputs, renormalised to sum to one when
    ``normalize_top_k`` (Hugging Face's ``norm_topk_prob``: Qwen3-MoE sets it, Qwen2-MoE does not).
    Layer i is sparse when ``(i + 1) % sparse_step == 0`` and i is not in ``dense_layers``
    (``decoder_sparse_step`` and ``mlp_only_layers``); the other layers keep the dense SwiGLU of
    ``ModelConfig.intermediate_size``. Qwen2-MoE adds a shared expert every token runs, its output
    scaled by ``sigmoid(x @ w_gate)``: ``shared_expert_intermediate_size`` > 0.
    """

    num_experts: int
    experts_per_token: int
    expert_intermediate_size: int
    normalize_top_k: bool = True
    sparse_step: int = 1
    dense_layers: tuple[int, ...] = ()
    shared_expert_intermediate_size: int = 0

    def __post_init__(self):
        require(self.num_experts > 0, "num_experts", "must be > 0")
        require(0 < self.experts_per_token <= self.num_experts, "experts_per_token",
                f"must lie in [1, num_experts={self.num_experts}]")
        require(self.expert_intermediate_size > 0, "expert_intermediate_size", "must be > 0")
        require(self.sparse_step >= 1, "sparse_step", "must be >= 1")
        require(all(isinstance(i, int) and i >= 0 for i in self.dense_layers), "dense_layers",
                "must be layer indices >= 0")
        require(self.shared_expert_intermediate_size >= 0, "shared_expert_intermediate_size", "must be >= 0")

    @property
    def expert_id_dtype(self) -> str:
        """The smallest unsigned integer that holds an expert id: how routed ids are stored."""
        return "uint8" if self.num_experts <= 2**8 else "uint16"


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Every number the forward pass needs. Field names follow the math, not one checkpoint format."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    architecture: Architecture = "llama"
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    # llama2.c rotates interleaved pairs (x[2i], x[2i+1]); Hugging Face rotates (x[i], x[i + D/2]).
    rope_interleaved: bool = False
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    qkv_bias: bool = False  # Qwen2
    qk_norm: bool = False  # Qwen3: RMSNorm over head_dim on q and k before RoPE
    max_position_embeddings: int = 2048
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    pad_token_id: int | None = None
    moe: MoeConfig | None = None  # a mixture of experts in the layers it names; None: every layer dense
    # A reward model: a one-label ``score`` head [hidden] read at the last real token, no classifier
    # (Hugging Face's ``*ForSequenceClassification``; rlax_core.training.reward_model scores with it).
    score_head: bool = False

    def __post_init__(self):
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                     "num_kv_heads", "head_dim", "max_position_embeddings"):
            require(getattr(self, name) > 0, name, "must be > 0")
        require(self.num_heads % self.num_kv_heads == 0, "num_kv_heads", "must divide num_heads")
        require(self.head_dim % 2 == 0, "head_dim", "must be even (RoPE rotates pairs)")
        require(self.rope_theta > 0, "rope_theta", "must be > 0")
        require(self.rms_norm_eps > 0, "rms_norm_eps", "must be > 0")
        for name in ("bos_token_id", "pad_token_id"):
            value = getattr(self, name)
            require(value is None or 0 <= value < self.vocab_size, name, f"must lie in [0, {self.vocab_size})")
        require(all(0 <= t < self.vocab_size for t in self.eos_token_ids), "eos_token_ids",
                f"must lie in [0, {self.vocab_size})")
        require(not self.score_head or self.architecture in _HF_SEQUENCE_CLASSIFIERS.values(), "score_head",
                f"reward models are {', '.join(_HF_SEQUENCE_CLASSIFIERS)}, not {self.architecture}")
        if self.moe is not None:
            outside = [i for i in self.moe.dense_layers if i >= self.num_layers]
            require(not outside, "moe.dense_layers", f"{outside} lie beyond the {self.num_layers} layers")
            # Each family's layout: Qwen2-MoE always has its shared expert, the others never; Mixtral's
            # config has one width (its experts') and every layer sparse, top-k renormalised.
            shared = self.moe.shared_expert_intermediate_size > 0
            require(shared == (self.architecture == "qwen2_moe") or self.architecture not in _MOE_ARCHITECTURES,
                    "moe.shared_expert_intermediate_size",
                    f"must be > 0 for qwen2_moe and 0 for the other families, not "
                    f"{self.moe.shared_expert_intermediate_size} for {self.architecture}")
            if self.architecture == "mixtral":
                require(self.uniform_layers and len(self.moe_layers) == self.num_layers and self.moe.normalize_top_k
                        and self.moe.expert_intermediate_size == self.intermediate_size, "moe",
                        "Mixtral makes every layer sparse, renormalises the top k and has experts of "
                        "intermediate_size")

    # ------------------------------------------------------------------ layer kinds

    def is_moe_layer(self, layer: int) -> bool:
        """Whether layer ``layer``'s feed-forward is the sparse mixture of experts (Hugging Face's rule)."""
        moe = self.moe
        return moe is not None and layer not in moe.dense_layers and (layer + 1) % moe.sparse_step == 0

    @property
    def moe_layers(self) -> tuple[int, ...]:
        """The indices of the sparse layers, in order: routed expert ids are stacked along them."""
        return tuple(i for i in range(self.num_layers) if self.is_moe_layer(i))

    @property
    def uniform_layers(self) -> bool:
        """Whether every layer has the same weights' shapes, so the layers can be one scanned block.
        A model mixing dense and sparse layers keeps them unrolled (``layers_0`` ..)."""
        return len(self.moe_layers) in (0, self.num_layers)

    # ------------------------------------------------------------------ derived sizes

    @property
    def eos_token_id(self) -> int | None:
        """The first end-of-sequence id (generation stops on any of ``eos_token_ids``)."""
        return self.eos_token_ids[0] if self.eos_token_ids else None

    @property
    def num_params(self) -> int:
        """Parameter count, embedding included (and the classifier once if untied), every expert counted."""
        return self._count_params(active_only=False)

    @property
    def num_active_params(self) -> int:
        """Parameters one token runs through: as ``num_params`` with k of each sparse layer's experts."""
        return self._count_params(active_only=True)

    def _count_params(self, active_only: bool) -> int:
        e, d = self.hidden_size, self.head_dim
        attention = e * d * (self.num_heads * 2 + self.num_kv_heads * 2)
        if self.qkv_bias:
            attention += d * (self.num_heads + 2 * self.num_kv_heads)
        if self.qk_norm:
            attention += 2 * d
        feed_forward = 0
        for layer in range(self.num_layers):
            if not self.is_moe_layer(layer):
                feed_forward += 3 * e * self.intermediate_size
                continue
            moe = self.moe
            experts = moe.experts_per_token if active_only else moe.num_experts
            feed_forward += e * moe.num_experts + experts * 3 * e * moe.expert_intermediate_size
            if moe.shared_expert_intermediate_size:
                feed_forward += 3 * e * moe.shared_expert_intermediate_size + e
        embeddings = self.vocab_size * e * (1 if self.tie_word_embeddings else 2)
        if self.score_head:  # the embedding and a [hidden] score head, no classifier
            embeddings = self.vocab_size * e + e
        return self.num_layers * (attention + 2 * e) + feed_forward + embeddings + e

    def flops_per_token(self, seq_len: int) -> float:
        """Forward FLOPs per token: 2 per weight multiply-add plus the attention score/value matmuls
        (a sparse layer counts the k experts a token runs, not all of them)."""
        # The embedding lookup is no matmul; the classifier (tied or not) is one of V x E.
        embeddings = self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)
        matmul_params = self.num_active_params - embeddings + self.vocab_size * self.hidden_size
        attention = 2 * 2 * self.num_layers * self.num_heads * self.head_dim * seq_len / 2  # causal: half
        return 2.0 * matmul_params + attention

    # ------------------------------------------------------------------ Hugging Face config.json

    @classmethod
    def from_hf(cls, hf: Mapping[str, Any]) -> "ModelConfig":
        """Build from a Hugging Face ``config.json`` dict (transformers 4 or 5 layout)."""
        architecture = _architecture(hf)
        _reject_unsupported(hf, architecture)
        score_head = any(name in _HF_SEQUENCE_CLASSIFIERS for name in hf.get("architectures") or [])
        if score_head:
            # transformers reads num_labels from id2label, and takes 2 labels when neither is written.
            labels = len(hf["id2label"]) if hf.get("id2label") else int(hf.get("num_labels", 2))
            if labels != 1:
                raise ConfigError("config.json id2label", f"a classification head with {labels} labels; a reward "
                                  "model's score head has exactly one (num_labels=1)")
        num_heads = int(hf["num_attention_heads"])
        hidden = int(_get(hf, "hidden_size"))
        rope_theta, rope_scaling = _rope(hf)
        eos = hf.get("eos_token_id")
        eos_ids = tuple(int(t) for t in (eos if isinstance(eos, (list, tuple)) else [eos] if eos is not None else []))
        try:
            return cls(
                architecture=architecture,
                vocab_size=int(_get(hf, "vocab_size")),
                hidden_size=hidden,
                intermediate_size=int(_get(hf, "intermediate_size")),
                num_layers=int(_get(hf, "num_hidden_layers")),
                num_heads=num_heads,
                num_kv_heads=int(hf.get("num_key_value_heads") or num_heads),
                head_dim=int(hf.get("head_dim") or hidden // num_heads),
                rope_theta=rope_theta,
                rope_scaling=rope_scaling,
                rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
                tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),  # transformers' default
                # Qwen2 always has q/k/v biases; Qwen2-MoE reads its qkv_bias (default true).
                qkv_bias=architecture == "qwen2" or (architecture == "qwen2_moe" and bool(hf.get("qkv_bias", True))),
                qk_norm=architecture in ("qwen3", "qwen3_moe"),
                max_position_embeddings=int(hf.get("max_position_embeddings", 2048)),
                bos_token_id=hf.get("bos_token_id"),
                eos_token_ids=eos_ids,
                pad_token_id=hf.get("pad_token_id"),
                moe=_moe_from_hf(hf, architecture),
                score_head=score_head,
            )
        except ConfigError as error:
            raise ConfigError(f"config.json {error.path}", error.message) from None

    def to_hf(self) -> dict[str, Any]:
        """The transformers ``config.json`` for this model (the transformers 4 layout, which 5 also reads)."""
        if self.rope_interleaved:
            raise ConfigError("rope_interleaved", "Hugging Face layouts rotate half-split pairs; "
                              "load llama2.c weights with their q/k rows permuted (the default) to save them")
        hf: dict[str, Any] = {
            "architectures": [_HF_SCORE_CLASS_NAME[self.architecture] if self.score_head
                              else _HF_CLASS_NAME[self.architecture]],
            "model_type": self.architecture,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": None,
            "tie_word_embeddings": self.tie_word_embeddings,
            "max_position_embeddings": self.max_position_embeddings,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": (list(self.eos_token_ids) if len(self.eos_token_ids) > 1 else self.eos_token_id),
            "pad_token_id": self.pad_token_id,
            "torch_dtype": "float32",
        }
        if self.rope_scaling is not None:
            hf["rope_scaling"] = {"rope_type": self.rope_scaling.rope_type, "factor": self.rope_scaling.factor}
            if self.rope_scaling.rope_type == "llama3":
                hf["rope_scaling"].update(
                    low_freq_factor=self.rope_scaling.low_freq_factor,
                    high_freq_factor=self.rope_scaling.high_freq_factor,
                    original_max_position_embeddings=self.rope_scaling.original_max_position_embeddings)
        if self.score_head:
            hf.update(id2label={"0": "LABEL_0"}, label2id={"LABEL_0": 0})
        if self.architecture == "llama":
            hf.update(attention_bias=False, mlp_bias=False)
        else:
            hf.update(use_sliding_window=False, sliding_window=None, attention_bias=self.qkv_bias)
        if self.architecture == "mixtral":
            hf.update(num_local_experts=self.moe.num_experts, num_experts_per_tok=self.moe.experts_per_token,
                      output_router_logits=False, router_aux_loss_coef=0.0, router_jitter_noise=0.0)
        elif self.moe is not None:
            moe = self.moe
            hf.update(num_experts=moe.num_experts, num_experts_per_tok=moe.experts_per_token,
                      moe_intermediate_size=moe.expert_intermediate_size, norm_topk_prob=moe.normalize_top_k,
                      decoder_sparse_step=moe.sparse_step, mlp_only_layers=list(moe.dense_layers),
                      output_router_logits=False, router_aux_loss_coef=0.0)
            if self.architecture == "qwen2_moe":
                hf.update(shared_expert_intermediate_size=moe.shared_expert_intermediate_size, qkv_bias=self.qkv_bias)
        return hf


def _get(hf: Mapping[str, Any], key: str) -> Any:
    if key not in hf or hf[key] is None:
        raise ConfigError(f"config.json {key}", "missing")
    return hf[key]


def _moe_from_hf(hf: Mapping[str, Any], architecture: Architecture) -> MoeConfig | None:
    """Qwen2-MoE and Qwen3-MoE's sparse layers; None for the dense families and for zero experts."""
    # transformers 5 saves Qwen3-MoE's expert count as num_local_experts (Mixtral's own name); the
    # published Qwen checkpoints say num_experts.
    experts_key = "num_experts" if "num_experts" in hf else "num_local_experts"
    if architecture not in _MOE_ARCHITECTURES or int(_get(hf, experts_key)) == 0:
        return None
    if architecture == "mixtral":
        return MoeConfig(num_experts=int(hf[experts_key]), experts_per_token=int(_get(hf, "num_experts_per_tok")),
                         expert_intermediate_size=int(_get(hf, "intermediate_size")), normalize_top_k=True)
    try:
        return MoeConfig(
            num_experts=int(hf[experts_key]),
            experts_per_token=int(_get(hf, "num_experts_per_tok")),
            expert_intermediate_size=int(_get(hf, "moe_intermediate_size")),
            normalize_top_k=bool(hf.get("norm_topk_prob", False)),  # transformers' default where it is left out
            sparse_step=int(hf.get("decoder_sparse_step", 1)),
            dense_layers=tuple(int(i) for i in hf.get("mlp_only_layers") or ()),
            # Qwen2-MoE always builds its shared expert; Qwen3-MoE has none.
            shared_expert_intermediate_size=(int(_get(hf, "shared_expert_intermediate_size"))
                                             if architecture == "qwen2_moe" else 0))
    except ConfigError as error:
        raise ConfigError(f"config.json {error.path}", error.message) from None


def _architecture(hf: Mapping[str, Any]) -> Architecture:
    names = hf.get("architectures") or []
    known = {**_HF_ARCHITECTURES, **_HF_SEQUENCE_CLASSIFIERS}
    for name in names:
        if name in known:
            return known[name]
    if names:
        raise ConfigError("config.json architectures",
                          f"unknown architecture {names}; supported: {', '.join(known)}")
    model_type = hf.get("model_type")
    if model_type in _HF_MODEL_TYPES:
        return _HF_MODEL_TYPES[model_type]
    raise ConfigError("config.json model_type",
                      f"unknown architecture {model_type!r}; supported: {', '.join(_HF_MODEL_TYPES)}")


def _reject_unsupported(hf: Mapping[str, Any], architecture: Architecture) -> None:
    """Options that change the math and are not implemented: fail naming the key."""

    def unsupported(key: str, allowed: str) -> None:
        raise ConfigError(f"config.json {key}", f"unsupported value {hf[key]!r}; supported: {allowed}")

    if hf.get("hidden_act", "silu") != "silu":
        unsupported("hidden_act", "'silu'")
    if hf.get("mlp_bias"):
        unsupported("mlp_bias", "false")
    # Qwen2 always has q/k/v biases (the config's attention_bias is not read by transformers for it);
    # Llama's attention_bias would also add an output-projection bias, Qwen3's the same.
    if architecture not in ("qwen2", "qwen2_moe") and hf.get("attention_bias"):
        unsupported("attention_bias", "false")
    if hf.get("use_sliding_window"):
        unsupported("use_sliding_window", "false")
    if architecture == "mixtral" and hf.get("sliding_window") is not None:  # Mixtral slides whenever it is set
        unsupported("sliding_window", "null")
    layer_types = hf.get("layer_types")
    if layer_types and any(t != "full_attention" for t in layer_types):
        unsupported("layer_types", "'full_attention' for every layer")
    if hf.get("pretraining_tp", 1) != 1:
        unsupported("pretraining_tp", "1")


def _rope(hf: Mapping[str, Any]) -> tuple[float, RopeScaling | None]:
    # transformers 5 keeps theta and scaling together in rope_parameters; 4 splits them.
    if isinstance(hf.get("rope_parameters"), Mapping):
        key, params = "rope_parameters", dict(hf["rope_parameters"])
    else:
        key, params = "rope_scaling", dict(hf.get("rope_scaling") or {})
        params.setdefault("rope_theta", hf.get("rope_theta", 10000.0))
    theta = float(params.get("rope_theta", hf.get("rope_theta", 10000.0)))
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type == "default":
        return theta, None
    if rope_type not in ("linear", "llama3"):
        raise ConfigError(f"config.json {key}.rope_type",
                          f"unsupported value {rope_type!r}; supported: 'default', 'linear', 'llama3'")
    fields = {f.name for f in dataclasses.fields(RopeScaling)} - {"rope_type"}
    kwargs = {name: params[name] for name in fields if name in params}
    try:
        return theta, RopeScaling(rope_type=rope_type, **kwargs)
    except ConfigError as error:
        raise error.under(f"config.json {key}") from None
    except TypeError as error:
        raise ConfigError(f"config.json {key}", str(error)) from None


# Published shapes (their Hugging Face config.json) of the models the production recipes name, so the
# memory planner can size a run without reading a remote checkpoint.
_QWEN25 = dict(architecture="qwen2", vocab_size=152064, qkv_bias=True, head_dim=128, rope_theta=1000000.0,
               rms_norm_eps=1e-6, tie_word_embeddings=False, bos_token_id=151643, eos_token_ids=(151643,))
PUBLISHED_CONFIGS: dict[str, ModelConfig] = {
    "Qwen2.5-7B": ModelConfig(hidden_size=3584, intermediate_size=18944, num_layers=28, num_heads=28, num_kv_heads=4,
                              max_position_embeddings=131072, **_QWEN25),
    # configs/qwen25_coder_7b_sql_dataflow_tpu.yaml: Qwen2.5-7B's shape, the instruct model's context and end token.
    "Qwen2.5-Coder-7B-Instruct": ModelConfig(hidden_size=3584, intermediate_size=18944, num_layers=28, num_heads=28,
                                             num_kv_heads=4, max_position_embeddings=32768,
                                             **{**_QWEN25, "eos_token_ids": (151645, 151643)}),
    "Qwen2.5-1.5B-Instruct": ModelConfig(hidden_size=1536, intermediate_size=8960, num_layers=28, num_heads=12,
                                         num_kv_heads=2, max_position_embeddings=32768,
                                         **{**_QWEN25, "vocab_size": 151936, "tie_word_embeddings": True,
                                            "eos_token_ids": (151645,)}),
    # The device check's model (benchmarks/device_check.py: random weights of this shape).
    "Qwen2.5-0.5B-Instruct": ModelConfig(hidden_size=896, intermediate_size=4864, num_layers=24, num_heads=14,
                                         num_kv_heads=2, max_position_embeddings=32768,
                                         **{**_QWEN25, "head_dim": 64, "vocab_size": 151936,
                                            "tie_word_embeddings": True, "eos_token_ids": (151645,)}),
    "QwQ-32B": ModelConfig(hidden_size=5120, intermediate_size=27648, num_layers=64, num_heads=40, num_kv_heads=8,
                           max_position_embeddings=40960, **{**_QWEN25, "eos_token_ids": (151645,)}),
    # An 8B reward model's shape (Llama 3.1 8B; its *ForSequenceClassification reward models, Skywork's
    # among them, keep it): docs/fleet.md's scoring stage.
    "Llama-3.1-8B": ModelConfig(architecture="llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                                num_layers=32, num_heads=32, num_kv_heads=8, head_dim=128, qkv_bias=False,
                                rope_theta=500000.0, rope_scaling=RopeScaling(rope_type="llama3", factor=8.0),
                                rms_norm_eps=1e-5, tie_word_embeddings=False, max_position_embeddings=131072,
                                bos_token_id=128000, eos_token_ids=(128001,)),
    # Every layer sparse (decoder_sparse_step 1, no mlp_only_layers): intermediate_size is unused.
    "Qwen3-30B-A3B": ModelConfig(architecture="qwen3_moe", vocab_size=151936, hidden_size=2048, intermediate_size=6144,
                                 num_layers=48, num_heads=32, num_kv_heads=4, head_dim=128, qkv_bias=False,
                                 qk_norm=True, rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=False,
                                 max_position_embeddings=40960, bos_token_id=151643, eos_token_ids=(151645,),
                                 moe=MoeConfig(num_experts=128, experts_per_token=8, expert_intermediate_size=768,
                                               normalize_top_k=True)),
}


def toy_config(**overrides: Any) -> ModelConfig:
    """A tiny random-init Qwen2-shaped model (GQA, q/k/v biases) for CPU tests of every RL path."""
    defaults: dict[str, Any] = dict(
        architecture="qwen2", vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2,
        num_heads=4, num_kv_heads=2, head_dim=16, qkv_bias=True, tie_word_embeddings=True,
        max_position_embeddings=512, bos_token_id=1, eos_token_ids=(2,), pad_token_id=0)
    defaults.update(overrides)
    return ModelConfig(**defaults)


def toy_moe_config(**overrides: Any) -> ModelConfig:
    """A tiny random-init Qwen3-MoE-shaped model: 4 experts, 2 per token, layer 0 dense
    (``mlp_only_layers``), q/k RMSNorm. ``moe=MoeConfig(...)`` replaces the experts' shape."""
    moe = MoeConfig(num_experts=4, experts_per_token=2, expert_intermediate_size=32, dense_layers=(0,))
    defaults: dict[str, Any] = dict(architecture="qwen3_moe", qkv_bias=False, qk_norm=True, num_layers=3, moe=moe)
    defaults.update(overrides)
    return toy_config(**defaults)


def rope_inverse_frequencies(config: ModelConfig):
    """Per-pair rotation speeds ``theta ** (-2i/D)``, with the config's long-context scaling applied."""
    import numpy as np

    inv_freq = 1.0 / (config.rope_theta ** (np.arange(0, config.head_dim, 2, dtype=np.float64) / config.head_dim))
    scaling = config.rope_scaling
    if scaling is None:
        return inv_freq
    if scaling.rope_type == "linear":
        return inv_freq / scaling.factor
    # llama3: keep high frequencies, slow low frequencies down by `factor`, interpolate between.
    original = scaling.original_max_position_embeddings
    wavelength = 2 * math.pi / inv_freq
    low_freq_wavelength = original / scaling.low_freq_factor
    high_freq_wavelength = original / scaling.high_freq_factor
    smooth = (original / wavelength - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor)
    blended = (1 - smooth) * inv_freq / scaling.factor + smooth * inv_freq
    return np.where(wavelength > low_freq_wavelength, inv_freq / scaling.factor,
                    np.where(wavelength < high_freq_wavelength, inv_freq, blended))
