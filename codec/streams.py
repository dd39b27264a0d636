"""The keys of the counter-based random streams (docs/codecs.md, "The random stream").

A stochastic stage draws from ``stream = mix(mix(mix(seed) ^ key_hash(key)) ^ step)``, so a
frame depends only on its input, spec, tensor key and step: the same on every rank, for any
thread count, on the CPU and (later) on the GPU.  The kernels derive the stream themselves
(the ``rng`` kernel family); Python only hashes the key.
"""

from __future__ import annotations

import functools

import numpy as np
from codec.kernels import backend

def key_text(key) -> str:
    """The text a key's stream is hashed from: str as is, integers in decimal, None empty,
    anything else its ``repr`` (so keys that compare equal but print differently, ``0.0``
    and ``-0.0``, have streams of their own)."""
    if key is None:
        return ""
    if isinstance(key, str):
        return key
    if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
        return str(int(key))
    return repr(key)


def key_hash(key) -> int:
    """64 bits of BLAKE2b over :func:`key_text`, as UTF-8 (lone surrogates, which a Python str
    may hold, encoded as themselves); a text hashed before is looked up (a many-tensor call
    hashes every tensor's key, the same ones every step)."""
    return _hash_text(key_text(key))


@functools.lru_cache(maxsize=4096)
def _hash_text(text: str) -> int:
    import hashlib

    return int.from_bytes(hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little")


def stream(seed: int, ctx) -> np.uint64:
    """The frame's 64-bit stream for ``seed`` and the context's key and step."""
    return np.uint64(backend("rng").stream(np.uint64(seed), np.uint64(key_hash(ctx.key)), np.uint64(ctx.step % (1 << 64))))
