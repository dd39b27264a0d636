"""The numbers that fix how work is cut and summed, so that frames do not depend on where they
were made (docs/kernels.md, "Layout").

Every float64 reduction a frame depends on (QSGD's bucket norms, signSGD's and TernGrad's
sums, the sparsifiers' mean and variance) runs in ``LANES`` column lanes over chunks of
``CHUNK`` values, and the caller adds the chunk results in order: the order depends on the
array length alone, so a NumPy reference, the Numba CPU kernels and a CUDA twin give the
same bits.  Bucketed quantizers work on groups of whole buckets of about ``CHUNK`` values
(:func:`bucket_groups`), which is also how QSGD's Elias streams are chunked in the frame.
Random bits are drawn by value index with one 64-bit block key per ``SPAN`` values.

Stages and kernels (every backend) import these names from here; nothing restates them.
This module imports nothing but ``math`` (no NumPy, no Numba): its functions are plain
arithmetic, so a kernel module can compile them with its own jit wrapper.
"""

from __future__ import annotations

import math

#: values per reduction chunk: the sums' chunks, the quantizers' work units (a block is cut
#: into pieces of at most CHUNK values) and the size of a bucket group
CHUNK = 1 << 16
#: column lanes of every float64 sum (passed to the kernels at run time, so the CPU loop
#: vectoriser packs them without reassociating anything)
LANES = 64
#: log2 of SPAN
SPAN_BITS = 16
#: values per block key of the random stream (the period of its 64-bit part)
SPAN = 1 << SPAN_BITS
#: 2**-32: 32 random bits to a uniform on [0, 1)
TO_UNIT = 2.0**-32


def chunks(n):
    """How many ``CHUNK``-value chunks ``n`` values make (the rows of a kernel's chunk sums)."""
    return (n + CHUNK - 1) // CHUNK


def group_buckets(bucket):
    """Buckets of ``bucket`` values per bucket group: whole buckets, about ``CHUNK`` values."""
    return max(1, CHUNK // bucket)


def bucket_groups(n, bucket):
    """(buckets, buckets per group, groups) of ``n`` values in buckets of ``bucket``: a group
    is the kernels' unit of parallel work and one chunk of QSGD's Elias streams."""
    nb = (n + bucket - 1) // bucket
    per = group_buckets(bucket)
    return nb, per, (nb + per - 1) // per


def feistel_half(n):
    """The bit width of each half of the Feistel permutation random-k draws positions in ``[0,
    n)`` with: half of ``h = max(2, bit_length(n - 1))``, rounded up (1 for ``n <= 4``), so
    the permutation's domain ``[0, 4**half)`` covers ``[0, n)``."""
    h = 2
    while (1 << h) < n:
        h += 1
    return (h + 1) // 2


def sample_rank(need, m, n):
    """How many of a sample's ``m`` largest magnitudes (out of ``n`` elements) a sparsifier's
    cut must leave above it so that, very likely, at least ``need`` of the ``n`` elements are:
    the sample's expectation with a margin of 20% and four binomial standard deviations, plus
    8; exactly ``need`` when the sample is the whole array.  At most ``m`` (the selection's
    result never depends on it, only its speed: a short cut is retried with every element)."""
    if m == n:
        return min(m, need)
    expect = need * m / n
    return min(m, math.ceil(1.2 * expect + 4 * math.sqrt(expect) + 8))
