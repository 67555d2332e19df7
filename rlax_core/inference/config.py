"""The engine's configuration types: how the engine is built, how one request samples, how a run
samples (``SamplingConfig``: the ``sampling:`` block of ``loop:`` and of every ``generation:``), and a
model with its sampling settings (``GenerationSpec``, the batch pipelines' ``generation:`` section).

``EngineConfig`` fixes every compiled shape (slots, pages, prompt buckets, steps per call), so an
engine built from it compiles a bounded set of programs and then never again. ``SamplingParams``
travels with each request and changes nothing that is compiled; ``SamplingConfig.params`` makes it
from a config and the engine it runs on.
"""

from __future__ import annotations

import dataclasses
from pathlib import PurePosixPath
from typing import ClassVar, Literal, Sequence

from rlax_core.config import require

AttentionImpl = Literal["auto", "pallas", "window", "reference"]
LoraMode = Literal["auto", "merged", "on_the_fly"]
Admission = Literal["on_demand", "reserve"]
OnNewVersion = Literal["continue", "recompute", "drain"]
Preemption = Literal["auto", "recompute", "swap"]
WeightDtype = Literal["bfloat16", "int8", "fp8"]
CacheDtype = Literal["float32", "bfloat16", "int8", "fp8"]
EIGHT_BIT = ("int8", "fp8")


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """Shapes and capacity of a rollout engine.

    num_slots: sequences decoded together (the decode batch).
    page_size / num_pages: the paged KV cache; a sequence holds ceil(len / page_size) pages. Page 0
      is reserved as a write sink for padding and idle slots, so num_pages - 1 pages hold sequences.
      "auto": what the chip holds after everything else (``planning.memory.plan_rollout``: the chip's
      memory less the stated headroom, the weights, the incoming version where swaps drain, the
      programs' temporaries), resolved when a run config with ``hardware.rollout`` is loaded.
    max_prompt_len / max_new_tokens: the longest prompt and completion a request may ask for.
    prefill_buckets: prompt lengths are padded up to the next bucket, so prefill compiles once per
      bucket (and per power-of-two prefill batch) and never for a new length.
    max_prefill_batch: prompts prefilled together by one compiled call at most (0: num_slots). A
      prefill's dense attention holds [batch, heads, bucket, bucket] float32 scores, so on long
      prompts this bounds the prefill's memory (the memory planner counts it).
    prefill_batch_growth: the ratio between the prefill (and continuation) batch sizes compiled: 2
      compiles 1, 2, 4, 8, 16 for a prefill batch of 16, 4 compiles 1, 4, 16. A larger ratio is fewer
      programs (seconds off every engine's start where compiles or cache loads dominate it, as on a
      laptop) for more padding in a call that falls between two sizes.
    decode_steps_per_call: tokens decoded per compiled call before control returns to Python to
      retire finished sequences and admit new ones.
    attention_impl: decode attention over the cache. "pallas": JAX's own paged-attention Pallas
      kernel for the backend reads pages in place (``pallas_attention``: the TPU kernel on TPU, the
      GPU kernel on GPU, the GPU kernel interpreted on CPU). "window": each decode call gathers the running sequences'
      pages into a dense window, decodes against it and writes it back (the fast path on CPU; it
      costs a transient num_slots x max_seq_len cache per call). "reference": plain jnp, gathering
      the pages at every layer of every step. "auto": Pallas on TPU and GPU, the window on CPU.
    replicas: engines per process (``ReplicatedEngine``), each with this config's slots and pages;
      0 = as many as the local devices hold (devices // chips_per_replica). On a CPU host the entry
      points make each core a device first (``rlax_core.utils.devices``). An ``Engine`` is one replica.
    tensor_parallel: devices one replica spans. Its weights are split over them by the trainer's
      logical-axis rules (attention by heads, MLP by columns) and its KV pool by KV head
      (``sharding``): each device holds 1/N of them where N divides the head counts. 1: one device.
      A host of 8 chips runs e.g. one replica at 8 or two at 4.
    expert_parallel: a mixture of experts' expert axis within a replica: the replica spans
      tensor_parallel x expert_parallel devices, each holding 1/expert_parallel of every sparse
      layer's experts (the rest of the model split by tensor_parallel only). Its experts run through
      the model's own expert-parallel forward (``models.moe.expert_parallel``). It must divide the
      experts; a dense model refuses it (``sharding.check_expert_parallel``). 1: every device holds
      every expert.
    lora_mode: how ``Engine.update_adapters`` applies an adapter version to the held base. "merged":
      W + alpha / rank * A @ B once per version (a decode step costs the base model's; the base's
      adapted kernels are held twice). "on_the_fly": x @ W + (x @ A) @ B in every adapted projection
      of every step (no merge at the swap, one copy of the weights). "auto": "merged" on every
      platform, the faster on CPU as ``benchmarks/adapter_serving.py`` measured it; TPU and GPU are
      not measured yet (``placement.lora_mode_for``).
    weight_dtype: the projections' kernels as the engine holds them. "bfloat16": as the weight
      version publishes them. "int8" / "fp8": quantized from each published version as the engine
      loads it (``lora.quantize_kernels``: a float32 scale per output channel; once per process and
      version, ``placement.held_weights``), and run as eight-bit x compute-dtype products with the
      scale applied to the product (``models.projections``). Embeddings, norms, a mixture's router
      and experts and the output head stay as published.
    cache_dtype: the KV pages' dtype. "int8" / "fp8": each token's key and value stored in eight
      bits with a float32 scale per KV head, written with the token into its page's scale rows
      (``kv_cache``); the attention paths fold the scales into their products.
    admission: how a sequence takes pages (``pages``). "on_demand": its prompt's pages plus one
      decode call's look-ahead when admitted, a page more as it crosses each page boundary; when the
      pool runs out the engine preempts the most recently queued running sequence (its pages freed,
      and swapped back or recomputed when it resumes: ``preemption``). "reserve": its
      whole budget (prompt + max_new_tokens, or an episode's tokens) up front, nothing preempted.
    preemption: how a preempted sequence's cache comes back (``preemption``). "recompute": its prompt
      and tokens so far are computed again into new pages; "swap": its pages (eight-bit pages with
      their scales) are copied to host memory and written back bit for bit into new pages, so its
      later tokens and log-probs are exactly those of a run without preemption. Recomputed keys can
      differ from the decoded ones in the last bits (another summation order), which eight-bit pages
      can round to another step; full-width pages carry it to the log-probs (~1e-6), where a draw
      within that of a token boundary picks the neighbour. "auto": "swap" for eight-bit caches,
      "recompute" otherwise (it holds no host copies).
    batch_invariant: a sample's numbers, bit for bit, do not depend on the sequences computed with
      it. Prompts are prefilled at one compiled batch size (``prefill_batch``, rows padded), a call
      holding prompts of one length bucket; continuations (an episode's turn, a recomputed
      preemption) run one sequence a call; the CPU's decode window runs at one width, the longest
      sequence's. Without it, XLA:CPU's matrix products, blocked by their number of rows, give a
      prompt prefilled beside three others keys that differ from its keys alone in the last bits
      (1.5e-5 for stories260K), its log-probs follow, and a sampled token whose draw lies that close
      to a token boundary parts (rarely: once in thousands of tokens at temperature 1). Off by
      default: calls run at the smallest power-of-two batch that holds their rows and the window at
      the width the running sequences need, so no call pays for padding (a lone long prompt padded to
      the prefill batch costs that batch's prefill). docs/inference.md has the measured costs.
    on_new_version: what ``update_weights`` does to running sequences. "continue": the new version is
      installed before the next decode call and they go on under it (their cache from the old one);
      "recompute": their prompts and tokens so far are recomputed under it first; "drain": admission
      pauses until they finish on their version (two versions resident meanwhile). Completions record
      the version of every token (``Completion.token_versions``).
    """

    num_slots: int = 16
    page_size: int = 16
    num_pages: int | Literal["auto"] = 512
    max_prompt_len: int = 256
    max_new_tokens: int = 256
    prefill_buckets: tuple[int, ...] = (16, 32, 64, 128, 256)
    decode_steps_per_call: int = 16
    attention_impl: AttentionImpl = "auto"
    cache_dtype: CacheDtype = "float32"
    weight_dtype: WeightDtype = "bfloat16"
    replicas: int = 1
    tensor_parallel: int = 1
    expert_parallel: int = 1
    max_prefill_batch: int = 0
    prefill_batch_growth: int = 2
    lora_mode: LoraMode = "auto"
    admission: Admission = "on_demand"
    on_new_version: OnNewVersion = "continue"
    preemption: Preemption = "auto"
    batch_invariant: bool = False

    def __post_init__(self):
        require(self.admission in ("on_demand", "reserve"), "admission", "must be on_demand or reserve")
        require(self.on_new_version in ("continue", "recompute", "drain"), "on_new_version",
                "must be continue, recompute or drain")
        require(self.preemption in ("auto", "recompute", "swap"), "preemption", "must be auto, recompute or swap")
        require(self.lora_mode in ("auto", "merged", "on_the_fly"), "lora_mode",
                "must be auto, merged or on_the_fly")
        require(self.weight_dtype in ("bfloat16", *EIGHT_BIT), "weight_dtype", "must be bfloat16, int8 or fp8")
        require(self.cache_dtype in ("float32", "bfloat16", *EIGHT_BIT), "cache_dtype",
                "must be float32, bfloat16, int8 or fp8")
        require(self.replicas >= 0, "replicas", "must be >= 0 (0: as many as the local devices hold)")
        require(self.max_prefill_batch >= 0, "max_prefill_batch", "must be >= 0 (0: num_slots)")
        require(self.prefill_batch_growth >= 2, "prefill_batch_growth",
                f"the ratio between compiled prefill batch sizes: an integer >= 2, got {self.prefill_batch_growth}")
        require(self.tensor_parallel >= 1, "tensor_parallel", "must be at least 1 (devices per replica)")
        require(self.expert_parallel >= 1, "expert_parallel", "must be at least 1 (1: no expert axis)")
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
            self.num_pages == "auto" or self.num_pages >= self.pages_per_sequence + 1,
            "num_pages",
            f"must hold the reserved sink page plus one longest sequence ({self.pages_per_sequence} pages of {self.page_size})",
        )

    @property
    def eight_bit(self) -> bool:
        """Whether the engine's weights or KV cache are eight-bit (its log-probs then differ more from
        the trainer's: the recommended preset corrects the mismatch)."""
        return self.weight_dtype in EIGHT_BIT or self.cache_dtype in EIGHT_BIT

    @property
    def swaps_preempted(self) -> bool:
        """Whether a preempted sequence's pages go to host memory and back (else it is recomputed)."""
        return self.preemption == "swap" or self.preemption == "auto" and self.cache_dtype in EIGHT_BIT

    @property
    def chips_per_replica(self) -> int:
        """Devices one replica spans: tensor_parallel x expert_parallel."""
        return self.tensor_parallel * self.expert_parallel

    @property
    def max_seq_len(self) -> int:
        return self.max_prompt_len + self.max_new_tokens

    @property
    def prefill_batch(self) -> int:
        """The most prompts one prefill call takes."""
        return min(self.num_slots, self.max_prefill_batch or self.num_slots)

    @property
    def prefill_batch_sizes(self) -> tuple[int, ...]:
        """The batch sizes prefill compiles for: powers of ``prefill_batch_growth`` below
        ``prefill_batch``, then ``prefill_batch``; batch-invariant, ``prefill_batch`` alone."""
        if self.batch_invariant:
            return (self.prefill_batch,)
        sizes, size = [], 1
        while size < self.prefill_batch:
            sizes.append(size)
            size *= self.prefill_batch_growth
        return (*sizes, self.prefill_batch)

    @property
    def pages_per_sequence(self) -> int:
        """Page-table width: pages of the longest sequence the engine accepts."""
        return -(-self.max_seq_len // self.page_size)

    @property
    def continuation_batch_sizes(self) -> tuple[int, ...]:
        """The batch sizes a continuation (``continuation.extend``: an episode's turn, a recomputed
        preemption) compiles for: as prefill's; batch-invariant, one row a call. Its rows are few and
        long (up to the largest bucket, attending over whole sequences), so padding them to a prefill
        batch would cost far more than the calls it saves (4x the run on ``engine_memory.py``)."""
        return (1,) if self.batch_invariant else self.prefill_batch_sizes

    def prefill_calls(self, lengths: Sequence[int], continuation: bool = False) -> list[tuple[list[int], int, int]]:
        """Rows of ``lengths`` tokens each, split into prefill (or ``continuation``) calls: (row
        indices, compiled batch, length bucket) per call, in row order, at most the largest batch size
        rows a call. Batch-invariant, a call holds rows of one bucket at the one compiled batch size,
        so a row's call shape is its own length's, whatever rows come with it."""
        sizes = self.continuation_batch_sizes if continuation else self.prefill_batch_sizes
        if not self.batch_invariant:
            groups = [list(range(start, min(start + sizes[-1], len(lengths))))
                      for start in range(0, len(lengths), sizes[-1])]
        else:
            by_bucket: dict[int, list[int]] = {}
            for row, length in enumerate(lengths):
                by_bucket.setdefault(self.bucket_for(length), []).append(row)
            groups = [rows[start:start + sizes[-1]] for rows in by_bucket.values()
                      for start in range(0, len(rows), sizes[-1])]
        return [(rows, next(b for b in sizes if b >= len(rows)), self.bucket_for(max(lengths[row] for row in rows)))
                for rows in groups]

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
class SamplingConfig:
    """How a run samples its model: the ``sampling:`` block of ``loop:`` (the rollouts) and of every
    ``generation:`` (filtering, evaluation). ``max_new_tokens`` 0 is the engine's budget
    (``engine.max_new_tokens``); ``stop_token_ids`` and ``stop_strings`` end a sample besides EOS."""

    samples_per_prompt: int = 8  # a group: GRPO-like advantages compare a prompt's samples; pass@k's n
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 0
    stop_token_ids: tuple[int, ...] = ()
    stop_strings: tuple[str, ...] = ()

    def __post_init__(self):
        require(self.samples_per_prompt >= 1, "samples_per_prompt", "at least 1")
        require(self.temperature >= 0, "temperature", ">= 0 (0 is greedy)")
        require(0 < self.top_p <= 1, "top_p", "in (0, 1]")
        require(self.top_k >= 0, "top_k", ">= 0 (0: no top-k filter)")
        require(self.max_new_tokens >= 0, "max_new_tokens", ">= 0 (0: the engine's max_new_tokens)")
        require(all(t >= 0 for t in self.stop_token_ids), "stop_token_ids", "token ids >= 0")
        require(all(self.stop_strings), "stop_strings", "non-empty strings")

    def budget(self, engine: EngineConfig) -> int:
        """New tokens a sample may take on ``engine``."""
        return self.max_new_tokens or engine.max_new_tokens

    def params(self, engine: EngineConfig) -> SamplingParams:
        """The engine's per-request settings for a sample on ``engine``."""
        return SamplingParams(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
                              max_new_tokens=self.budget(engine), samples_per_prompt=self.samples_per_prompt,
                              stop_token_ids=self.stop_token_ids, stop_strings=self.stop_strings)


# The keys a section held before its sampling settings moved into its ``sampling:`` block.
SAMPLING_KEYS = ("temperature", "top_p", "top_k", "max_new_tokens", "stop_token_ids", "stop_strings")


@dataclasses.dataclass(frozen=True)
class GenerationSpec:
    """A model and how to sample it; picklable, so Beam ships it to every worker."""

    RENAMED: ClassVar[dict[str, str]] = {"samples": "sampling.samples_per_prompt",
                                         **{key: f"sampling.{key}" for key in SAMPLING_KEYS}}

    # Hugging Face folder, llama2.c .bin or a folder holding one (local or gs://), a weight-store
    # version (weights:ROOT[@VERSION]) or an orbax checkpoint (checkpoint:DIR[@STEP]); see
    # rlax_core.policy.source
    model: str = ""
    tokenizer: str | None = None  # default: the model's folder
    name: str | None = None  # label in reports; default: the model folder's name
    sampling: SamplingConfig = SamplingConfig()
    seed: int = 0
    batch_size: int = 8  # prompts per engine call
    dtype: Literal["float32", "bfloat16"] = "float32"
    engine: EngineConfig = EngineConfig(max_prompt_len=256, max_new_tokens=256)
    # JAX's persistent compilation cache in each worker process (rlax_core.utils.compile_cache): a
    # second filter or evaluation of the same engine shapes loads its programs instead of compiling.
    compilation_cache: bool = True
    compilation_cache_dir: str = ""  # default: $RLAX_COMPILATION_CACHE_DIR, else ~/.cache/rlax/jax

    def __post_init__(self):
        require(self.batch_size >= 1, "batch_size", "at least 1")
        require(self.sampling.max_new_tokens <= self.engine.max_new_tokens, "sampling.max_new_tokens",
                f"at most engine.max_new_tokens={self.engine.max_new_tokens}")
        require(0 <= self.seed < 2**31, "seed", "in [0, 2**31)")

    @property
    def label(self) -> str:
        return self.name or PurePosixPath(self.model.rstrip("/")).name

    def params(self) -> SamplingParams:
        """Each request's sampling settings on this spec's engine."""
        return self.sampling.params(self.engine)
