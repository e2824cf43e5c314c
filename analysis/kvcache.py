"""What fits of a KV cache grown by concatenation (issue 32, item 5): the cache's own bytes against the limit.

``analysis.causes.kv_cache_growth`` finds the cache (one stack group growing by the same bytes a token); this
module sizes the changes a user could make to it, each from the cache's bytes per token (layers x 2 x batch x
KV heads x head dim x dtype, measured as the growth itself) and the memory that must stay beside it (the weights
and the prefill's own peak: the whole prompt's logits):

- a preallocated (static) cache holds every token of the full length at once;
- half the batch halves the cache and the temporaries beside it, not the weights;
- a quantized cache stores each token in 8 bits (half a 16-bit cache's bytes) or 4 bits (a quarter), keeping
  the most recent ``QUANTIZED_RESIDUAL_TOKENS`` in full precision as Hugging Face's ``QuantizedCache`` does;
- an offloaded cache keeps the layers on the host but the one being computed, the next one being fetched and the
  current one's new copy (``OFFLOADED_GPU_LAYERS`` layers' keys and values on the GPU).

A change is offered only where its tokens reach past where the run died: "would fit" is measured, never assumed.
The cache is taken to be 16-bit (generate() keeps it in the model's dtype); a 32-bit cache gains twice as much
from quantizing, so the figures are the least it gains.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from analysis.decision import format_size

I64 = npt.NDArray[np.int64]

# Hugging Face's QuantizedCache keeps this many recent tokens unquantized (its residual_length default).
QUANTIZED_RESIDUAL_TOKENS = 128
# An offloaded cache on the GPU: the layer being computed, its new copy (the cache still grows by
# concatenation) and the next layer prefetched.
OFFLOADED_GPU_LAYERS = 3


@dataclass(frozen=True, slots=True)
class CacheRoom:
    """What must fit beside a preallocated cache: the memory live outside the cache while it grew."""

    resident: int  # the least live beside the cache (the weights and what stays between tokens)
    peak_beside: int  # the most live beside it (the resident part plus the prefill's or a token's own peak)
    prompt_tokens: int  # the prompt's length: the cache's first copy is the prompt's keys with one token more


@dataclass(frozen=True, slots=True)
class CacheFit:
    """Tokens (prompt included) each change to the cache lets fit within the limit; None where not measured."""

    tensors: int  # the cache's tensors: keys and values of every layer
    per_token: int  # bytes one token adds to the whole cache at this batch
    tokens_now: int  # the length the run reached at the OOM
    static: int | None  # a preallocated cache at this batch
    half_batch: int | None  # the same with half the batch
    quantized_8bit: int | None
    quantized_4bit: int | None
    offloaded: int | None  # None where the cache has too few layers for offloading to keep fewer on the GPU

    @property
    def static_fits(self) -> bool:
        """A static cache reaches past the OOM's length: then it is the change."""
        return self.static is not None and self.static > self.tokens_now + 1

    def reaches(self, tokens: int | None) -> bool:
        return tokens is not None and tokens > self.tokens_now + 1

    def to_figures(self) -> dict[str, int | None]:
        return {
            "tokens_that_fit_quantized_8bit": self.quantized_8bit,
            "tokens_that_fit_quantized_4bit": self.quantized_4bit,
            "tokens_that_fit_offloaded": self.offloaded,
        }


def cache_room(
    allocated: I64, start: I64, end: I64, size: I64, mine: npt.NDArray[np.intp], delta: int, oom_index: int
) -> CacheRoom:
    """Allocated memory outside the growing cache (allocations ``mine`` of the lifetimes ``start``, ``end``,
    ``size``), from its first allocation to the OOM: its least (the weights) and its most (the prefill's
    whole-prompt logits, a token's own temporaries). A static cache holds its full length through both."""
    first = int(start[mine[0]])
    prompt = max(0, int(size[mine[0]]) // max(1, delta) - 1)
    change = np.zeros(allocated.shape[0] + 1, np.int64)
    np.add.at(change, start[mine], size[mine])
    np.subtract.at(change, np.minimum(end[mine], allocated.shape[0]), size[mine])
    cache_live = np.cumsum(change[:-1])
    beside = allocated[first:oom_index] - cache_live[first:oom_index]
    if beside.size == 0:
        at = min(oom_index, cache_live.shape[0] - 1)
        held = (int(allocated[oom_index]) if 0 <= oom_index < allocated.shape[0] else 0) - int(cache_live[at])
        return CacheRoom(held, held, prompt)
    return CacheRoom(int(beside.min()), int(beside.max()), prompt)


def cache_fit(limit: int | None, room: CacheRoom, tensors: int, delta: int, tokens_now: int) -> CacheFit:
    """Tokens each change lets fit beside ``room`` within ``limit`` (None: nothing measured)."""
    per_token = tensors * delta
    if limit is None:
        return CacheFit(tensors, per_token, tokens_now, None, None, None, None, None)
    room_left = limit - room.peak_beside
    static = room_left // max(1, per_token)
    # Half the batch: the cache and the temporaries beside it halve, the weights do not.
    half = (limit - room.resident - (room.peak_beside - room.resident) // 2) // max(1, per_token // 2)
    residual = QUANTIZED_RESIDUAL_TOKENS * per_token

    def quantized(share: float) -> int:
        if room_left <= residual:
            return static
        return QUANTIZED_RESIDUAL_TOKENS + int((room_left - residual) // max(1.0, per_token * share))

    layers = tensors // 2
    offloaded = room_left // max(1, OFFLOADED_GPU_LAYERS * 2 * delta) if layers > OFFLOADED_GPU_LAYERS else None
    return CacheFit(tensors, per_token, tokens_now, static, half, quantized(0.5), quantized(0.25), offloaded)


def _smaller_cache_words(fit: CacheFit, hf: bool) -> tuple[str, str]:
    """(a sentence, a code comment) naming the quantized and offloaded caches that reach past the OOM's length."""
    said, lines = [], []
    if fit.reaches(fit.quantized_8bit) or fit.reaches(fit.quantized_4bit):
        q8, q4 = fit.quantized_8bit or 0, fit.quantized_4bit or 0
        said.append(f"a quantized cache fits about {q8:,} tokens in 8 bits and {q4:,} in 4 bits")
        lines.append(
            'cache_implementation="quantized", cache_config={"backend": "quanto", "nbits": 4}'
            if hf
            else "an 8-bit (fp8/int8) KV cache"
        )
    if fit.reaches(fit.offloaded):
        said.append(f"offloaded to the host (about {OFFLOADED_GPU_LAYERS} layers on the GPU) about {fit.offloaded:,}")
        lines.append('cache_implementation="offloaded"' if hf else "the cache offloaded to the host layer by layer")
    if not said:
        return "", ""
    return (
        f" A smaller cache would fit further: {'; '.join(said)} (the cache taken as 16-bit).",
        f"; or {' / '.join(lines)}",
    )


def kv_words(hf: bool, fit: CacheFit, delta: int, room: CacheRoom) -> tuple[str, str, str]:
    """(headline, fix title, fix line) of a cache grown by concatenation: a static cache where its bytes fit
    the length, else the batch or the number of new tokens that fit, and the quantized or offloaded caches
    that would fit, with the figures."""
    fits, half, tokens_now = fit.static, fit.half_batch, fit.tokens_now
    grows = (
        f"A cache grows by concatenation token by token ({fit.tensors} tensors, {format_size(delta)} each per token, "
        f"{tokens_now:,} tokens at the OOM)"
    )
    beside = f"beside the {format_size(room.peak_beside)} the weights and the prefill's own peak need"
    half_text = f"; with half the batch about {half:,}" if half is not None and half > 0 else ""
    if fit.static_fits and fits is not None:
        new_tokens = max(0, fits - room.prompt_tokens)
        headline = (
            f"{grows}: every token copies it into a larger block, so the old and the new copy live together and the "
            f"freed ones do not fit the next size. Preallocated once, {beside}, about {fits:,} tokens fit within the "
            f"limit (the prompt's {room.prompt_tokens:,} and up to {new_tokens:,} new ones){half_text}."
        )
        title = f"Preallocate the cache (a static cache), for at most {fits:,} tokens at this batch"
        if hf:
            line = (
                f'model.generate(..., cache_implementation="static", max_new_tokens=<at most {new_tokens}>)   '
                "# the cache allocated once"
            )
        else:
            line = (
                f"k_cache = torch.empty(batch, heads, max_len, head_dim)  # once, max_len <= {fits}; "
                "then k_cache[:, :, pos] = k"
            )
        return headline, title, line
    if fits is None:
        return (
            f"{grows}; without the limit, whether a preallocated cache would fit is not known.",
            "Preallocating the cache needs the limit to be sized: give the OOM message or the limit",
            "model.generate(..., max_new_tokens=<fewer>)   # or generate in smaller batches",
        )
    smaller, smaller_line = _smaller_cache_words(fit, hf)
    headline = (
        f"{grows}, and preallocated it would not fit either: {beside}, only about {max(0, fits):,} tokens fit within "
        f"the limit at this batch, fewer than the {tokens_now:,} reached{half_text}.{smaller}"
    )
    title = "A smaller batch or fewer new tokens: a preallocated cache does not fit either"
    new_tokens = max(0, fits - room.prompt_tokens)
    line = (
        f"model.generate(..., max_new_tokens=<at most {new_tokens}>)   # or half the batch: about "
        f"{max(0, half or 0):,} tokens fit{smaller_line}"
    )
    return headline, title, line
