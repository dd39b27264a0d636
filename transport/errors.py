"""The transport's errors, and how a failure on one rank reaches every rank.

Every step's first collective carries each rank's status (:data:`OK` or a reason code); a
scheme that fails after it sends the code in its own first message.  :func:`raise_failed`
then gathers every rank's reason and raises the same :class:`RankError` everywhere
(docs/transport.md, "Errors and failures").
"""

from __future__ import annotations

from codec import CodecError

__all__ = [
    "FAIL_OTHER",
    "FAIL_TYPE",
    "FAIL_VALUE",
    "MismatchError",
    "NO_DESC",
    "OK",
    "REASON_CHARS",
    "RankError",
    "RankTypeError",
    "raise_failed",
    "status_of",
]


class MismatchError(CodecError, ValueError):
    """Ranks called a collective step with different codecs, options or tensors."""


class RankError(CodecError, ValueError):
    """A step failed on one or more ranks (a non-finite input the codec cannot send, a bad
    argument): EVERY rank raises it, with the same message, naming the failing ranks and their
    reasons.  ``ranks``: the failing ranks; ``reasons``: rank -> ``"Type: message"``.  On the
    failing rank it is chained (``__cause__``) to the rank's own exception."""

    def __init__(self, message: str, ranks=(), reasons=None):
        super().__init__(message)
        self.ranks = list(ranks)
        self.reasons = dict(reasons or {})


class RankTypeError(RankError, TypeError):
    """:class:`RankError` whose first failing rank raised a TypeError (an unsupported dtype, an
    argument of the wrong type)."""


#: per-rank status carried by the step's first collective (docs/transport.md, "Errors and failures")
OK, FAIL_TYPE, FAIL_VALUE, FAIL_OTHER = 0, 1, 2, 3
#: or'ed into the status when the rank failed before it could describe its step
NO_DESC = 4
#: a reason longer than this is cut (it travels to every rank)
REASON_CHARS = 600


def status_of(exc: BaseException) -> int:
    """The reason code of an exception: FAIL_TYPE, FAIL_VALUE or FAIL_OTHER."""
    return FAIL_TYPE if isinstance(exc, TypeError) else FAIL_VALUE if isinstance(exc, ValueError) else FAIL_OTHER


def raise_failed(comm, mine, when: str):
    """Every rank: gather every rank's (status, reason) (``comm.allgather``) and raise the same
    :class:`RankError` (``RankTypeError`` when the first failing rank's error was a TypeError).
    ``mine``: this rank's exception, or None.  Call it on every rank of ``comm``, once every
    rank knows that some rank failed."""
    reason = None
    if mine is not None:
        reason = f"{type(mine).__name__}: {mine}"
        if len(reason) > REASON_CHARS:
            reason = reason[: REASON_CHARS - 3] + "..."
    every = comm.allgather((OK if mine is None else status_of(mine), reason))
    bad = [r for r, (s, _) in enumerate(every) if s]
    if not bad:  # cannot happen: a caller saw a failure
        raise RankError(f"a rank reported a failure {when} but none gave a reason")
    head = f"rank {bad[0]}" if len(bad) == 1 else f"ranks {', '.join(map(str, bad))}"
    detail = "; ".join(f"rank {r}: {every[r][1]}" for r in bad)
    msg = f"{head} of {len(every)} failed {when}, so every rank raises this: {detail}"
    cls = RankTypeError if every[bad[0]][0] == FAIL_TYPE else RankError
    raise cls(msg, bad, {r: every[r][1] for r in bad}) from mine
