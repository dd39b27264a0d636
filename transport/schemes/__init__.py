"""How a step moves, one module per scheme, and the ONE table that picks a scheme for a spec.

=============  =====================================  ==========================================
spec head      scheme                                 module
=============  =====================================  ==========================================
``none``       :class:`Dense`: MPI Allreduce          transport/schemes/dense.py
``gtopk``      :class:`GTopK`: the gTop-k merge tree  transport/schemes/gtopk.py
``powersgd``   :class:`TwoRound`: two-round PowerSGD  transport/schemes/powersgd.py
anything else  :class:`Allgather` of frames           transport/schemes/allgather.py
=============  =====================================  ==========================================

The head is the first stage of the spec (of a ``codec.Codec`` or config dict: of its
canonical spec).  A scheme may decline a spec its head names (:meth:`Scheme.takes`):
``none+zstd`` is the allgather of lossless frames, not MPI Allreduce.  Shared parts (the
:class:`Scheme` base, the pending-step protocol, :class:`Sums`, :func:`finish_sum`,
:func:`check_finite`) live in transport/schemes/base.py.  Nothing here imports the
Allreducer (transport/allreduce.py), which imports this package.

Adding a scheme: a module here with a :class:`Scheme` subclass (``prepare``, ``start``
returning a :class:`Pending`; any per-tensor memory in its ``codec.ErrorFeedback``,
``self.ef``, which the Allreducer's ``state_dict``/``load_state_dict`` save and check), one
entry in :data:`SCHEMES`, a section in docs/transport.md.
"""

from __future__ import annotations

import codec
from transport.schemes.allgather import Allgather, Framed
from transport.schemes.base import Pending, Scheme, Sums, check_finite, finish_sum
from transport.schemes.dense import Dense
from transport.schemes.gtopk import GTopK
from transport.schemes.powersgd import TwoRound

__all__ = [
    "Allgather",
    "DEFAULT",
    "Dense",
    "Framed",
    "GTopK",
    "Pending",
    "SCHEMES",
    "Scheme",
    "Sums",
    "TwoRound",
    "check_finite",
    "finish_sum",
    "scheme_for",
]

#: spec head -> scheme class; every other head runs :data:`DEFAULT`
SCHEMES: dict[str, type[Scheme]] = {"none": Dense, "gtopk": GTopK, "powersgd": TwoRound}
#: the scheme of every other codec: the allgather of frames
DEFAULT: type[Scheme] = Allgather


def scheme_for(codec_or_spec, reducer) -> Scheme:
    """The scheme that runs ``codec_or_spec`` (a spec string, config dict or ``codec.Codec``)
    for ``reducer``: :data:`SCHEMES` of its head, or :data:`DEFAULT`.  The only place a
    scheme is identified."""
    if isinstance(codec_or_spec, str):
        stages = codec.parse_spec(codec_or_spec)
    else:  # a config dict or Codec: its canonical spec (``gtopk`` is not a codec, so never here)
        codec_or_spec = codec.get_codec(codec_or_spec, checksum=reducer.checksum)
        stages = codec.parse_spec(codec_or_spec.spec)
    cls = SCHEMES.get(stages[0][0], DEFAULT)
    if not cls.takes(stages):
        cls = DEFAULT
    return cls(codec_or_spec, reducer)
