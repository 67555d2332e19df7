"""Weights in and out: Hugging Face safetensors folders (single file or sharded) and llama2.c ``.bin``.

    model = from_pretrained("Qwen2.5-0.5B/", dtype=jnp.bfloat16)    # or "gs://bucket/ckpt", "stories260K.bin"
    logits = model(input_ids, attention_mask)                       # float32 [B, S, V]
    save_pretrained(model, "out/", max_shard_size="2GB")            # transformers and vLLM load it unchanged

One table (``_hf_tensors``) maps every Hugging Face tensor name and ``[out, in]`` layout to our
parameter path and layout; loading and saving both read it. Loading is strict: a missing, extra or
mis-shaped tensor raises ``CheckpointError`` naming it. It streams: tensors are read one at a time
from memory-mapped files and written in place into their stacked per-layer parameter on the device,
so host memory holds the model once plus one tensor. A gs:// folder is first copied to a local
temporary folder (disk, not memory).

llama2.c checkpoints are read through the same table: their q/k projection rows are permuted from
llama2.c's interleaved RoPE pairs to Hugging Face's half-split layout (the model then runs with
``rope_interleaved=False``), or kept as they are with ``keep_interleaved_rope=True``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Callable, Iterator, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from rlax_core.config import InputError
from rlax_core.models.config import PUBLISHED_CONFIGS, ModelConfig
from rlax_core.models.transformer import Params, forward
from rlax_core.utils.paths import is_remote

SAFETENSORS_SINGLE = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"

# Buffers some old checkpoints carry that are recomputed, not learned.
_IGNORED_TENSORS = re.compile(r".*\.rotary_emb\.inv_freq$")


class CheckpointError(InputError):
    """A checkpoint is missing or does not match its config: names the path, tensor or key at fault."""


# ----------------------------------------------------------------------------- the name/layout table


@dataclasses.dataclass(frozen=True)
class _HFTensor:
    """One Hugging Face tensor (or one per layer, or per layer and expert) and where it lives in our params."""

    name: str  # "{layer}" stands for the layer index, "{expert}" for the expert's
    path: tuple[str, ...]  # per-layer tensors start with "layers" (stacked) or live in "layers_{i}" (unrolled)
    hf_shape: tuple[int, ...]
    to_ours: Callable[[np.ndarray], np.ndarray]
    to_hf: Callable[[np.ndarray], np.ndarray]
    layers: tuple[int, ...] = ()  # the layers holding it; () for a tensor outside the layers
    experts: int = 0  # > 0: one tensor per expert, stacked along our leading ``expert`` axis

    def slots(self, stacked: bool) -> Iterator[tuple[str, tuple[str, ...], tuple[int, ...]]]:
        """(Hugging Face name, our param path, the index of its slice in that param) for each tensor."""
        for layer in self.layers or [None]:
            if layer is None:
                path, lead = self.path, ()
            elif stacked:
                path, lead = self.path, (layer,)
            else:
                path, lead = (f"layers_{layer}", *self.path[1:]), ()
            for expert in range(self.experts) if self.experts else [None]:
                name = self.name.format(layer=layer, expert=expert)
                yield name, path, lead + (() if expert is None else (expert,))

    def leading_shape(self, stacked: bool, num_layers: int) -> tuple[int, ...]:
        """The axes our param has before the tensor's own: layers (stacked), then experts."""
        return ((num_layers,) if self.layers and stacked else ()) + ((self.experts,) if self.experts else ())


def _hf_tensors(config: ModelConfig) -> list[_HFTensor]:
    e, f, d = config.hidden_size, config.intermediate_size, config.head_dim
    same = lambda w: w  # noqa: E731
    every_layer = tuple(range(config.num_layers))
    sparse = config.moe_layers
    dense = tuple(i for i in every_layer if i not in sparse)

    def linear(out_features: int, in_features: int, ours_shape: tuple[int, ...]):
        # HF stores y = x @ W.T with W [out, in]; we keep [in, out] reshaped to named axes.
        return ((out_features, in_features),
                lambda w: np.ascontiguousarray(w.T).reshape(ours_shape),
                lambda k: np.ascontiguousarray(k.reshape(in_features, out_features).T))

    def layer_tensor(name: str, path: tuple[str, ...], *layout, layers=every_layer, experts=0) -> _HFTensor:
        return _HFTensor(f"model.layers.{{layer}}.{name}", ("layers", *path), *layout, layers=layers, experts=experts)

    tensors = [_HFTensor("model.embed_tokens.weight", ("embed_tokens", "embedding"), (config.vocab_size, e), same, same)]
    for proj, heads in (("q_proj", config.num_heads), ("k_proj", config.num_kv_heads), ("v_proj", config.num_kv_heads)):
        tensors.append(layer_tensor(f"self_attn.{proj}.weight", ("attn", proj, "kernel"), *linear(heads * d, e, (e, heads, d))))
        if config.qkv_bias:
            tensors.append(layer_tensor(f"self_attn.{proj}.bias", ("attn", proj, "bias"), (heads * d,),
                                        lambda b, h=heads: b.reshape(h, d), lambda b, h=heads: b.reshape(h * d)))
    tensors.append(layer_tensor("self_attn.o_proj.weight", ("attn", "o_proj", "kernel"),
                                *linear(e, config.num_heads * d, (config.num_heads, d, e))))
    if config.qk_norm:
        for norm in ("q_norm", "k_norm"):
            tensors.append(layer_tensor(f"self_attn.{norm}.weight", ("attn", norm, "scale"), (d,), same, same))
    for norm, ours in (("input_layernorm", "input_norm"), ("post_attention_layernorm", "post_attention_norm")):
        tensors.append(layer_tensor(f"{norm}.weight", (ours, "scale"), (e,), same, same))
    if dense:
        tensors.append(layer_tensor("mlp.gate_proj.weight", ("mlp", "gate_proj", "kernel"), *linear(f, e, (e, f)), layers=dense))
        tensors.append(layer_tensor("mlp.up_proj.weight", ("mlp", "up_proj", "kernel"), *linear(f, e, (e, f)), layers=dense))
        tensors.append(layer_tensor("mlp.down_proj.weight", ("mlp", "down_proj", "kernel"), *linear(e, f, (f, e)), layers=dense))
    if sparse:
        moe = config.moe
        experts, fe = moe.num_experts, moe.expert_intermediate_size
        # Mixtral's names: block_sparse_moe, and w1 / w3 / w2 for gate / up / down.
        block, names = (("block_sparse_moe", {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"})
                        if config.architecture == "mixtral" else ("mlp", {}))
        tensors.append(layer_tensor(f"{block}.gate.weight", ("moe", "router"), *linear(experts, e, (e, experts)),
                                    layers=sparse))
        for proj, (out_features, in_features) in (("gate_proj", (fe, e)), ("up_proj", (fe, e)), ("down_proj", (e, fe))):
            tensors.append(layer_tensor(f"{block}.experts.{{expert}}.{names.get(proj, proj)}.weight", ("moe", proj),
                                        *linear(out_features, in_features, (in_features, out_features)),
                                        layers=sparse, experts=experts))
        if moe.shared_expert_intermediate_size:
            fs = moe.shared_expert_intermediate_size
            for proj, (out_features, in_features) in (("gate_proj", (fs, e)), ("up_proj", (fs, e)), ("down_proj", (e, fs))):
                tensors.append(layer_tensor(f"mlp.shared_expert.{proj}.weight", ("moe", f"shared_{proj}"),
                                            *linear(out_features, in_features, (in_features, out_features)), layers=sparse))
            tensors.append(layer_tensor("mlp.shared_expert_gate.weight", ("moe", "shared_expert_gate"),
                                        *linear(1, e, (e, 1)), layers=sparse))
    tensors.append(_HFTensor("model.norm.weight", ("norm", "scale"), (e,), same, same))
    if config.score_head:  # a reward model: Hugging Face's score Linear(hidden, 1, bias=False), no classifier
        tensors.append(_HFTensor("score.weight", ("score", "kernel"), *linear(1, e, (e,))))
    elif not config.tie_word_embeddings:
        tensors.append(_HFTensor("lm_head.weight", ("lm_head",), *linear(config.vocab_size, e, (e, config.vocab_size))))
    return tensors


# ----------------------------------------------------------------------------- loading


TensorReader = Callable[[str], np.ndarray]


def load_params(names: set[str], read: TensorReader, config: ModelConfig, dtype=jnp.float32,
                source: str = "checkpoint") -> Params:
    """Build params from tensors by Hugging Face name: ``names`` is what the source holds, ``read`` gets one.

    Checks the names first (missing and extra fail before any read), then every shape as it reads.
    The layers come stacked, or unrolled when dense and sparse layers mix (``config.uniform_layers``).
    """
    table, stacked = _hf_tensors(config), config.uniform_layers
    expected = {name for tensor in table for name, _, _ in tensor.slots(stacked)}
    present = {name for name in names if not _IGNORED_TENSORS.match(name)}
    missing, extra = sorted(expected - present), sorted(present - expected)
    if missing:
        raise CheckpointError(f"{source}: missing tensor {missing[0]}" + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    if extra:
        hint = " (the config ties word embeddings)" if extra[0] == "lm_head.weight" else ""
        raise CheckpointError(f"{source}: unexpected tensor {extra[0]}{hint}" + (f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""))

    np_dtype = np.dtype(jnp.dtype(dtype))
    params: Params = {}
    for tensor in table:
        lead = tensor.leading_shape(stacked, config.num_layers)
        for name, path, index in tensor.slots(stacked):
            value = read(name)
            if tuple(value.shape) != tensor.hf_shape:
                raise CheckpointError(f"{source}: tensor {name} has shape {list(value.shape)}, "
                                      f"expected {list(tensor.hf_shape)} from the config")
            ours = tensor.to_ours(value).astype(np_dtype, copy=False)
            if not index:
                _set_path(params, path, jax.device_put(ours))
                continue
            try:
                whole = _get_path(params, path)
            except KeyError:
                whole = jnp.zeros((*lead, *ours.shape), np_dtype)
            _set_path(params, path, _write_slice(whole, ours, jnp.asarray(index, jnp.int32)))
    return params


@functools.partial(jax.jit, donate_argnums=0)
def _write_slice(whole: jax.Array, part: jax.Array, index: jax.Array) -> jax.Array:
    # Donated: the stacked parameter is updated in place, so host memory holds the params being
    # built plus one tensor, never a second copy of a whole stacked parameter.
    start = (*(index[i] for i in range(index.shape[0])), *(0 for _ in part.shape))
    return jax.lax.dynamic_update_slice(whole, part.reshape((1,) * index.shape[0] + part.shape), start)


def _set_path(tree: dict, path: tuple[str, ...], value) -> None:
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = value


def _get_path(tree: Mapping, path: tuple[str, ...]):
    for key in path:
        tree = tree[key]
    return tree


@contextlib.contextmanager
def local_copy(path: str) -> Iterator[Path]:
    """A local view of ``path``: itself, or a temporary copy of a remote (gs://, ...) folder or file."""
    if not is_remote(path):
        yield Path(path.removeprefix("file://"))
        return
    import fsspec

    fs, root = fsspec.core.url_to_fs(path)
    with tempfile.TemporaryDirectory(prefix="rlax-ckpt-") as tmp:
        if fs.isdir(root):
            for remote in fs.ls(root, detail=False):
                if fs.isfile(remote):
                    fs.get(remote, os.path.join(tmp, os.path.basename(remote)))
            yield Path(tmp)
        else:
            local = Path(tmp) / os.path.basename(root)
            fs.get(root, str(local))
            yield local


def load_safetensors_folder(folder: Path, config: ModelConfig, dtype=jnp.float32) -> Params:
    """Params from ``model.safetensors`` or the shards listed in ``model.safetensors.index.json``."""
    if (folder / SAFETENSORS_INDEX).exists():
        weight_map = json.loads((folder / SAFETENSORS_INDEX).read_text())["weight_map"]
        files = sorted(set(weight_map.values()))
    elif (folder / SAFETENSORS_SINGLE).exists():
        files = [SAFETENSORS_SINGLE]
    else:
        raise CheckpointError(f"{folder}: no {SAFETENSORS_SINGLE} or {SAFETENSORS_INDEX}")
    # safetensors is imported where it is read or written: the engine and the trainer import this
    # package on hosts that hold JAX alone (benchmarks/device_check.py's device machine).
    from safetensors import safe_open

    with contextlib.ExitStack() as stack:
        handles = {}
        for file in files:
            if not (folder / file).exists():
                raise CheckpointError(f"{folder}: shard {file} named in {SAFETENSORS_INDEX} is missing")
            handle = stack.enter_context(safe_open(folder / file, framework="numpy"))
            handles.update({name: handle for name in handle.keys()})
        return load_params(set(handles), lambda name: handles[name].get_tensor(name), config, dtype, str(folder))


# ----------------------------------------------------------------------------- llama2.c


_LLAMA2C_HEADER = 7  # int32: dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, max_seq_len


def llama2c_config(path: Path) -> ModelConfig:
    dim, hidden, layers, heads, kv_heads, vocab, max_len = (int(x) for x in np.fromfile(path, np.int32, _LLAMA2C_HEADER))
    return ModelConfig(
        architecture="llama", vocab_size=abs(vocab), hidden_size=dim, intermediate_size=hidden, num_layers=layers,
        num_heads=heads, num_kv_heads=kv_heads, head_dim=dim // heads, rope_theta=10000.0, rms_norm_eps=1e-5,
        # A negative vocab_size in the header means the classifier is stored separately.
        tie_word_embeddings=vocab > 0, max_position_embeddings=max_len,
        # llama2.c stories start with BOS and the model ends a story by emitting BOS again (run.c stops there).
        bos_token_id=1, eos_token_ids=(2, 1))


def _interleaved_to_half_split(w: np.ndarray, heads: int) -> np.ndarray:
    """Reorder projection rows [heads*D, in] from pairs (2i, 2i+1) to pairs (i, i + D/2), per head."""
    out_features, in_features = w.shape
    d = out_features // heads
    return w.reshape(heads, d // 2, 2, in_features).transpose(0, 2, 1, 3).reshape(out_features, in_features)


def load_llama2c(path: Path, dtype=jnp.float32, keep_interleaved_rope: bool = False) -> tuple[ModelConfig, Params]:
    """Read a llama2.c "version 0" checkpoint (memory-mapped) into Hugging Face names, then params."""
    config = llama2c_config(path)
    c = config
    d = c.head_dim
    shapes = [  # in file order
        ("tok_embeddings", (c.vocab_size, c.hidden_size)),
        ("rms_att", (c.num_layers, c.hidden_size)),
        ("wq", (c.num_layers, c.num_heads * d, c.hidden_size)),
        ("wk", (c.num_layers, c.num_kv_heads * d, c.hidden_size)),
        ("wv", (c.num_layers, c.num_kv_heads * d, c.hidden_size)),
        ("wo", (c.num_layers, c.hidden_size, c.num_heads * d)),
        ("rms_ffn", (c.num_layers, c.hidden_size)),
        ("w1", (c.num_layers, c.intermediate_size, c.hidden_size)),
        ("w2", (c.num_layers, c.hidden_size, c.intermediate_size)),
        ("w3", (c.num_layers, c.intermediate_size, c.hidden_size)),
        ("rms_final", (c.hidden_size,)),
        ("freq_cis_real", (c.max_position_embeddings, d // 2)),  # unused: RoPE is recomputed
        ("freq_cis_imag", (c.max_position_embeddings, d // 2)),
    ]
    if not c.tie_word_embeddings:
        shapes.append(("wcls", (c.vocab_size, c.hidden_size)))
    expected_bytes = 4 * (_LLAMA2C_HEADER + sum(int(np.prod(s)) for _, s in shapes))
    actual_bytes = path.stat().st_size
    if actual_bytes != expected_bytes:
        raise CheckpointError(f"{path}: {actual_bytes} bytes, but its header {llama2c_header_text(config)} "
                              f"implies {expected_bytes} (not a llama2.c version-0 checkpoint?)")
    data = np.memmap(path, np.float32, mode="r", offset=4 * _LLAMA2C_HEADER)
    arrays, offset = {}, 0
    for name, shape in shapes:
        size = int(np.prod(shape))
        arrays[name] = data[offset:offset + size].reshape(shape)
        offset += size

    def attention_rows(name: str, heads: int):
        return lambda i: (arrays[name][i] if keep_interleaved_rope else _interleaved_to_half_split(arrays[name][i], heads))

    layer_readers: dict[str, Callable[[int], np.ndarray]] = {
        "self_attn.q_proj.weight": attention_rows("wq", c.num_heads),
        "self_attn.k_proj.weight": attention_rows("wk", c.num_kv_heads),
        "self_attn.v_proj.weight": lambda i: arrays["wv"][i],
        "self_attn.o_proj.weight": lambda i: arrays["wo"][i],
        "input_layernorm.weight": lambda i: arrays["rms_att"][i],
        "post_attention_layernorm.weight": lambda i: arrays["rms_ffn"][i],
        "mlp.gate_proj.weight": lambda i: arrays["w1"][i],
        "mlp.down_proj.weight": lambda i: arrays["w2"][i],
        "mlp.up_proj.weight": lambda i: arrays["w3"][i],
    }
    readers: dict[str, Callable[[], np.ndarray]] = {
        "model.embed_tokens.weight": lambda: arrays["tok_embeddings"],
        "model.norm.weight": lambda: arrays["rms_final"],
    }
    if not c.tie_word_embeddings:
        readers["lm_head.weight"] = lambda: arrays["wcls"]
    for i in range(c.num_layers):
        for suffix, reader in layer_readers.items():
            readers[f"model.layers.{i}.{suffix}"] = lambda reader=reader, i=i: reader(i)
    if keep_interleaved_rope:
        config = dataclasses.replace(config, rope_interleaved=True)
    params = load_params(set(readers), lambda name: np.asarray(readers[name]()), config, dtype, str(path))
    return config, params


def llama2c_header_text(config: ModelConfig) -> str:
    return (f"(dim={config.hidden_size}, hidden_dim={config.intermediate_size}, n_layers={config.num_layers}, "
            f"n_heads={config.num_heads}, n_kv_heads={config.num_kv_heads}, vocab_size={config.vocab_size})")


# ----------------------------------------------------------------------------- the Model


_jit_forward = jax.jit(forward, static_argnames=("config", "remat"))


@dataclasses.dataclass(frozen=True)
class Model:
    """A config and its params; call it on token ids for float32 logits [batch, seq, vocab]."""

    config: ModelConfig
    params: Params

    def __call__(self, input_ids, attention_mask=None) -> jax.Array:
        input_ids = jnp.asarray(input_ids, jnp.int32)
        if attention_mask is not None:
            attention_mask = jnp.asarray(attention_mask, jnp.int32)
        return _jit_forward(self.params, self.config, input_ids, attention_mask=attention_mask)

    @property
    def dtype(self):
        return self.params["embed_tokens"]["embedding"].dtype


def _find_llama2c_bin(folder: Path) -> Path | None:
    candidates = sorted(p for p in folder.glob("*.bin") if not p.name.startswith("tok"))
    return candidates[0] if len(candidates) == 1 else None


def read_model_config(path: str | os.PathLike) -> ModelConfig:
    """The shape of the checkpoint at ``path`` without its weights (what the memory planner needs).

    A remote checkpoint whose folder is named like a published model (``PUBLISHED_CONFIGS``:
    ``gs://bucket/models/Qwen2.5-7B``) takes that model's published shape without a network read;
    any other is read from its ``config.json``.
    """
    path = str(path)
    name = path.rstrip("/").rsplit("/", 1)[-1]
    if is_remote(path):
        if name in PUBLISHED_CONFIGS:
            return PUBLISHED_CONFIGS[name]
        import fsspec

        with fsspec.open(f"{path.rstrip('/')}/config.json", "r") as handle:
            return ModelConfig.from_hf(json.load(handle))
    local = Path(path.removeprefix("file://"))
    if local.is_file() and local.suffix == ".bin":
        return llama2c_config(local)
    if (local / "config.json").is_file():
        return ModelConfig.from_hf(json.loads((local / "config.json").read_text()))
    llama2c = _find_llama2c_bin(local) if local.is_dir() else None
    if llama2c is not None:
        return llama2c_config(llama2c)
    raise CheckpointError(f"{path}: neither a config.json (Hugging Face) nor one llama2.c .bin file")


def from_pretrained(path: str | os.PathLike, dtype=jnp.float32, *, keep_interleaved_rope: bool = False) -> Model:
    """Load a Hugging Face folder (config.json + safetensors) or a llama2.c ``.bin`` (or a folder holding one).

    ``path`` may be local or remote (gs://...). ``dtype`` is a JAX dtype or its name ("bfloat16").
    ``keep_interleaved_rope`` applies to llama2.c only.
    """
    dtype = jnp.dtype(dtype)
    with local_copy(str(path)) as local:
        if local.is_file():
            if local.suffix != ".bin":
                raise CheckpointError(f"{path}: expected a checkpoint folder or a llama2.c .bin file")
            return Model(*load_llama2c(local, dtype, keep_interleaved_rope))
        if not local.is_dir():
            raise CheckpointError(f"{path}: no such file or folder")
        if (local / "config.json").exists():
            config = ModelConfig.from_hf(json.loads((local / "config.json").read_text()))
            return Model(config, load_safetensors_folder(local, config, dtype))
        llama2c = _find_llama2c_bin(local)
        if llama2c is not None:
            return Model(*load_llama2c(llama2c, dtype, keep_interleaved_rope))
        raise CheckpointError(f"{path}: neither a config.json (Hugging Face) nor one llama2.c .bin file")


# ----------------------------------------------------------------------------- saving


def hf_state_items(config: ModelConfig, params: Params) -> Iterator[tuple[str, Callable[[], np.ndarray], int]]:
    """(Hugging Face name, a function producing the tensor, its byte size), in Hugging Face order."""
    stacked = "layers" in params
    for tensor in _hf_tensors(config):
        for name, path, index in tensor.slots(stacked):
            value = _get_path(params, path)
            nbytes = int(np.prod(tensor.hf_shape)) * np.dtype(value.dtype).itemsize

            def produce(value=value, index=index, tensor=tensor):
                # np.asarray of a host-resident array is a view; slicing it on the host avoids
                # compiling one device slice per layer.
                return tensor.to_hf(np.asarray(value)[index])
            yield name, produce, nbytes
