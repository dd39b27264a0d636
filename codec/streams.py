"""The keys of the counter-based random streams (docs/codecs.md, "The random stream").

A stochastic stage draws from ``stream = mix(mix(mix(seed) ^ key_hash(key)) ^ step)``, so a
frame depends only on its input, spec, tensor key and step: the same on every rank, for any
thread count, on the CPU and (later) on the GPU.  The kernels derive the stream themselves
(the ``rng`` kernel family); Python only hashes the key.
"""

from __future__ import annotations

import numpy as np

def key_hash(key) -> int:
    """64 bits of BLAKE2b over the key's text (str as is, integers in decimal, None empty),
    as UTF-8 (lone surrogates, which a Python str may hold, encoded as themselves)."""
    import hashlib

    if key is None:
        text = ""
    elif isinstance(key, str):
        text = key
    elif isinstance(key, (int, np.integer)) and not isinstance(key, bool):
        text = str(int(key))
    else:
        text = repr(key)
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little")


def stream(seed: int, ctx) -> np.uint64:
    """The frame's 64-bit stream for ``seed`` and the context's key and step."""
    from codec.kernels import backend

    return np.uint64(backend("rng").stream(np.uint64(seed), np.uint64(key_hash(ctx.key)), np.uint64(ctx.step % (1 << 64))))
