"""Fuzzing gradcodec's parsers: seed corpus, structure-aware mutators, targets and the oracle.

Five parsers meet untrusted input (docs/robustness.md says what is promised for each):

==========  ===============================================  ==============================
target      input (bytes)                                    what is called
==========  ===============================================  ==============================
frame       a frame                                          codec.inspect, codec.decode,
                                                             decode(out=), Codec.decode_add
                                                             into zeros, codec.decode_sparse
container   a container (codec/container.py)                 unpack_frames, then every frame
                                                             as the frame target
many        u32 length, a layout (trusted: what the          codec.inspect, decode_many,
            receiver knows, as the transport does), then a   decode_many(out=),
            many-tensor frame (format v2, either form; the   decode_add_many into zeros,
            transport's per-rank message)                    decode_sparse_many
spec        spec text, UTF-8                                 codec.get_codec, then a small
                                                             encode / decode round trip
state       a pickle (restricted: numpy arrays and plain     ErrorFeedback.load_state_dict,
            containers) of {"codec", "momentum", "state"}    then one encode per key
==========  ===============================================  ==============================

The oracle (:func:`check`) runs one input through its target and classifies the outcome:
``ok``, an expected rejection (``CorruptFrameError``, ``UnknownCodecError``, ...), an
``invalid`` input (the harness could not even build the call, e.g. an unreadable pickle) or
a **finding**: any other exception, a decode whose shape or dtype differs from inspect's,
decode_add into zeros that differs from decode, decode_sparse inconsistent with decode, a
call above the memory bound (tracemalloc peak) or above the time bound, a state accepted
with an array that is not a plain C-contiguous float ndarray.  A crash (SIGSEGV, abort) or a
hang is caught one level up, by :func:`supervise`, which runs the loop in a child process.

The mutation loop (:func:`fuzz_loop`) takes a seed from :func:`seed_corpus` (every
registered codec and every pipeline of the conformance suite, over small arrays of every
dtype, with and without error feedback) and mutates it with the target's structure-aware
mutator: header field edits with the checksums recomputed (so the edit reaches the deep
parsers), section edits kept self-consistent, spec text edits (huge, negative, non-finite
parameters), bit flips, truncations and splices of two inputs.

``scripts/fuzz.py`` is the command line; tests/test_fuzz.py replays the regression corpus
(tests/fuzz_corpus/<target>/) and runs a bounded loop on every CI run.

The package, one module per job (this module re-exports their public names):

- ``checksums``: magic numbers, checksum flags, CRC-32C, checksum recomputation;
- ``formats``: frames and containers as editable fields, the state target's restricted pickles;
- ``seeds``: the specs and arrays seeds are made from; ``corpus``: the seed corpus of every target;
- ``mutators/``: ``byte_level`` (byte edits, the weighted choice), ``frame``, ``container``, ``many``,
  ``spec``, ``state``: one structure-aware mutator per target;
- ``findings``: the per-call bounds, :class:`Finding`, :class:`Outcome`, finding labels, the
  bounded call runner; ``oracles/``: ``frame``, ``container``, ``many``, ``spec``, ``state`` (and
  ``common``, the comparisons they share): one oracle per parser;
- ``targets``: the target table, :func:`mutate`, :func:`check`,
  the atheris target function;
- ``stats``: what a run did and its summary; ``loop``: the mutation loop and the supervised
  child (``python -m codec.fuzzing --child``, via ``__main__``); ``supervisor``: :func:`supervise`.

The bounds (``TIME_BOUND``, ``MEMORY_FLOOR``, ``MAX_ELEMENTS``) are read where they are
defined, in ``codec.fuzzing.findings``: change them there, not on this package.
"""

from __future__ import annotations

from codec.fuzzing.checksums import (
    CFLAG_CRC32C,
    CONTAINER_MAGIC,
    FLAG_CRC32,
    FLAG_CRC32C,
    FRAME_MAGIC,
    crc32c,
    fix_container_checksums,
    fix_many_checksums,
    fix_frame_checksums,
    frame_header_len,
)
from codec.fuzzing.formats import ContainerFields, FrameFields, dumps_state, loads_state, split_container, split_frame
from codec.fuzzing.seeds import DTYPES, EXTRA_PIPELINES, seed_arrays, seed_specs
from codec.fuzzing.corpus import Seeds, seed_corpus
from codec.fuzzing.mutators.byte_level import byte_mutation, weighted
from codec.fuzzing.mutators.spec import (
    CALL_LITERALS,
    FLOAT_LITERALS,
    INT_LITERALS,
    WORD_LITERALS,
    mutate_spec,
    mutate_spec_text,
)
from codec.fuzzing.mutators.frame import BITS, U64, mutate_frame
from codec.fuzzing.mutators.container import mutate_container
from codec.fuzzing.mutators.state import mutate_state
from codec.fuzzing.findings import Finding, MAX_ELEMENTS, MEMORY_FLOOR, Outcome, TIME_BOUND
from codec.fuzzing.oracles.frame import check_frame
from codec.fuzzing.oracles.container import check_container
from codec.fuzzing.oracles.spec import check_spec
from codec.fuzzing.oracles.state import check_state
from codec.fuzzing.targets import (
    CHECKS,
    MUTATORS,
    TARGETS,
    check,
    known_labels,
    mutate,
    target_function,
)
from codec.fuzzing.stats import Stats, format_stats, input_name
from codec.fuzzing.loop import EXTRAS_SAMPLE, MEMORY_MODES, MEMORY_SAMPLE, RSS_BOUND, child_main, fuzz_loop
from codec.fuzzing.supervisor import supervise

__all__ = [
    "TARGETS",
    "EXTRA_PIPELINES",
    "seed_specs",
    "Outcome",
    "check",
    "seed_corpus",
    "seed_arrays",
    "mutate",
    "fuzz_loop",
    "supervise",
    "fix_frame_checksums",
    "fix_container_checksums",
    "fix_many_checksums",
    "FrameFields",
    "split_frame",
    "ContainerFields",
    "split_container",
    "dumps_state",
    "loads_state",
]
