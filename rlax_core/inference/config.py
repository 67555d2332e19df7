"""The engine's configuration types: how the engine is built, how one request samples, and a model with
its sampling settings (``GenerationSpec``, the batch pipelines' ``generation:`` section).

``EngineConfig`` fixes every compiled shape (slots, pages, prompt buckets, steps per call), so an
engine built from it compiles a bounded set of programs and then never again. ``SamplingParams``
travels with each request and changes nothing that is compiled.
"""

from __future__ import annotations

import dataclasses
from pathlib import PurePosixPath
from typing import Literal

from rlax_core.config import require

AttentionImpl = Literal["auto", "pallas", "window", "reference"]
LoraMode = Literal["auto", "merged", "on_the_fly"]


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """Shapes and capacity of a rollout engine.

    num_slots: sequences decoded together (the decode batch).
    page_size / num_pages: the paged KV cache; a sequence holds ceil(len / page_size) pages. Page 0
      is reserved as a write sink for padding and idle slots, so num_pages - 1 pages hold sequences.
    max_prompt_len / max_new_tokens: the longest prompt and completion a request may ask for.
    prefill_buckets: prompt lengths are padded up to the next bucket, so prefill compiles once per
      bucket (and per power-of-two prefill batch) and never for a new length.
    max_prefill_batch: prompts prefilled together by one compiled call at most (0: num_slots). A
      prefill's dense attention holds [batch, heads, bucket, bucket] float32 scores, so on long
      prompts this bounds the prefill's memory (the memory planner counts it).
    decode_steps_per_call: tokens decoded per compiled call before control returns to Python to
      retire finished sequences and admit new ones.
    attention_impl: decode attention over the cache. "pallas": JAX's own paged-attention Pallas
      kernel for the backend reads pages in place (``pallas_attention``: the TPU kernel on TPU, the
      GPU kernel on GPU, the GPU kernel interpreted on CPU). "window": each decode call gathers the running sequences'
      pages into a dense window, decodes against it and writes it back (the fast path on CPU; it
      costs a transient num_slots x max_seq_len cache per call). "reference": plain jnp, gathering
      the pages at every layer of every step. "auto": Pallas on TPU and GPU, the window on CPU.
    replicas: engines per process (``ReplicatedEngine``), each with this config's slots and pages;
      0 = as many as the local devices hold (devices // tensor_parallel). On a CPU host the entry
      points make each core a device first (``rlax_core.utils.devices``). An ``Engine`` is one replica.
    tensor_parallel: devices one replica spans. Its weights are split over them by the trainer's
      logical-axis rules (attention by heads, MLP by columns) and its KV pool by KV head
      (``sharding``): each device holds 1/N of them where N divides the head counts. 1: one device.
      A host of 8 chips runs e.g. one replica at 8 or two at 4.
    lora_mode: how ``Engine.update_adapters`` applies an adapter version to the held base. "merged":
      W + alpha / rank * A @ B once per version (a decode step costs the base model's; the base's
      adapted kernels are held twice). "on_the_fly": x @ W + (x @ A) @ B in every adapted projection
      of every step (no merge at the swap, one copy of the weights). "auto": the faster one as
      measured by ``benchmarks/adapter_serving.py`` (``Engine.resolve_lora_mode``).
    """

    num_slots: int = 16
    page_size: int = 16
    num_pages: int = 512
    max_prompt_len: int = 256
    max_new_tokens: int = 256
    prefill_buckets: tuple[int, ...] = (16, 32, 64, 128, 256)
    decode_steps_per_call: int = 16
    attention_impl: AttentionImpl = "auto"
    cache_dtype: Literal["float32", "bfloat16"] = "float32"
    replicas: int = 1
    tensor_parallel: int = 1
    max_prefill_batch: int = 0
    lora_mode: LoraMode = "auto"

    def __post_init__(self):
        require(self.lora_mode in ("auto", "merged", "on_the_fly"), "lora_mode",
                "must be auto, merged or on_the_fly")
        require(self.replicas >= 0, "replicas", "must be >= 0 (0: as many as the local devices hold)")
        require(self.max_prefill_batch >= 0, "max_prefill_batch", "must be >= 0 (0: num_slots)")
        require(self.tensor_parallel >= 1, "tensor_parallel", "must be at least 1 (devices per replica)")
        require(self.num_slots >= 1, "num_slots", "must be at least 1")
        require(self.page_size >= 1, "page_size", "must be at least 1")
        require(self.max_prompt_len >= 1, "max_prompt_len", "must be at least 1")
        require(self.max_new_tokens >= 1, "max_new_tokens", "must be at least 1")
        require(self.decode_steps_per_call >= 1, "decode_steps_per_call", "must be at least 1")
        require(len(self.prefill_buckets) > 0, "prefill_buckets", "must name at least one length")
        require(
            all(b >= 1 for b in self.prefill_buckets) and list(self.prefill_buckets) == sorted(set(self.prefill_buckets)),
            "prefill_buckets",
            "must be positive, strictly increasing lengths",
        )
        require(
            self.prefill_buckets[-1] >= self.max_prompt_len,
            "prefill_buckets",
            f"the largest bucket must hold max_prompt_len={self.max_prompt_len}",
        )
        require(
            self.num_pages >= self.pages_per_sequence + 1,
            "num_pages",
            f"must hold the reserved sink page plus one longest sequence ({self.pages_per_sequence} pages of {self.page_size})",
        )

    @property
    def max_seq_len(self) -> int:
        return self.max_prompt_len + self.max_new_tokens

    @property
    def prefill_batch(self) -> int:
        """The most prompts one prefill call takes."""
        return min(self.num_slots, self.max_prefill_batch or self.num_slots)

    @property
    def pages_per_sequence(self) -> int:
        """Page-table width: pages of the longest sequence the engine accepts."""
        return -(-self.max_seq_len // self.page_size)

    def bucket_for(self, prompt_len: int) -> int:
        """The padded prefill length of a prompt of ``prompt_len`` tokens."""
        for bucket in self.prefill_buckets:
            if bucket >= prompt_len:
                return bucket
        raise ValueError(f"prompt of {prompt_len} tokens exceeds max_prompt_len={self.max_prompt_len}")


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """How one prompt is sampled.

    temperature 0 is greedy (argmax). top_k 0 and top_p 1.0 switch those filters off.
    samples_per_prompt: samples drawn for the prompt (GRPO's group); sample i uses the key derived from
      (seed, prompt id, i).
    stop_token_ids: a sampled token in this set ends the sample (finish reason "stop"); it is kept
      as the last completion token so its log-prob is recorded.
    stop_strings: decoded text containing one of these ends the sample; the completion is cut after
      the token that completed the string. Needs the engine to have a tokenizer.
    ignore_eos: do not stop at the model's end-of-sequence ids (stop_token_ids still apply); benchmarks
      use it to force lengths.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    max_new_tokens: int = 64
    samples_per_prompt: int = 1
    stop_token_ids: tuple[int, ...] = ()
    stop_strings: tuple[str, ...] = ()
    ignore_eos: bool = False

    def __post_init__(self):
        require(self.temperature >= 0.0, "temperature", "must be >= 0 (0 means greedy)")
        require(self.top_k >= 0, "top_k", "must be >= 0 (0 means no top-k filter)")
        require(0.0 < self.top_p <= 1.0, "top_p", "must be in (0, 1] (1 means no nucleus filter)")
        require(self.max_new_tokens >= 1, "max_new_tokens", "must be at least 1")
        require(self.samples_per_prompt >= 1, "samples_per_prompt", "must be at least 1")
        require(all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids), "stop_token_ids", "must be token ids >= 0")
        require(all(isinstance(s, str) and s for s in self.stop_strings), "stop_strings", "must be non-empty strings")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def filtered(self) -> bool:
        """Whether top-k or top-p reshape the distribution (those need a sort over the vocabulary)."""
        return not self.greedy and (self.top_k > 0 or self.top_p < 1.0)


@dataclasses.dataclass(frozen=True)
class GenerationSpec:
    """A model and how to sample it; picklable, so Beam ships it to every worker."""

    # Hugging Face folder, llama2.c .bin or a folder holding one (local or gs://), a weight-store
    # version (weights:ROOT[@VERSION]) or an orbax checkpoint (checkpoint:DIR[@STEP]); see
    # rlax_core.training.policy_source
    model: str = ""
    tokenizer: str | None = None  # default: the model's folder
    name: str | None = None  # label in reports; default: the model folder's name
    samples: int = 8  # completions per prompt
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 64
    stop_strings: tuple[str, ...] = ()
    seed: int = 0
    batch_size: int = 8  # prompts per engine call
    dtype: Literal["float32", "bfloat16"] = "float32"
    engine: EngineConfig = EngineConfig(max_prompt_len=256, max_new_tokens=256)

    def __post_init__(self):
        require(self.samples >= 1, "samples", "at least 1")
        require(self.batch_size >= 1, "batch_size", "at least 1")
        require(self.max_new_tokens <= self.engine.max_new_tokens, "max_new_tokens",
                f"at most engine.max_new_tokens={self.engine.max_new_tokens}")
        require(0 <= self.seed < 2**31, "seed", "in [0, 2**31)")

    @property
    def label(self) -> str:
        return self.name or PurePosixPath(self.model.rstrip("/")).name

    def sampling(self) -> SamplingParams:
        return SamplingParams(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
                              max_new_tokens=self.max_new_tokens, samples_per_prompt=self.samples,
                              stop_strings=self.stop_strings)
