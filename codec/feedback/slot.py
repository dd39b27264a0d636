"""A key's memory in an :class:`~codec.feedback.ErrorFeedback`: the residual, the step
count, stage state; :meth:`Slot.commit` is the one writer of a residual."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from codec.dtypes import on_device, readonly
from codec.errors import CodecTypeError
from codec.stage import Context
from codec.device import empty, host_copy, to_device


@dataclass
class Slot:
    """Per-key memory: the residual (the key's shape and dtype; None in an ErrorFeedback
    without residuals), the step count, stage state.  ``shape`` and ``dtype`` are the key's
    array shape and dtype: the residual's, given on their own when there is no residual."""

    key: Any
    residual: np.ndarray | None
    step: int = 0
    state: dict = field(default_factory=dict)
    #: DGC's momentum u (ErrorFeedback(momentum=m)); None without momentum
    velocity: np.ndarray | None = field(default=None, repr=False)
    #: a second residual-sized buffer the next step's ``acc`` is written into (not saved)
    spare: np.ndarray | None = field(default=None, repr=False)
    shape: tuple | None = field(default=None, repr=False)
    dtype: np.dtype | None = field(default=None, repr=False)
    #: where the residual (``at``), the spare (``spare_at``) and the velocity (``velocity_at``)
    #: lie when they are slices of one buffer shared with other keys, a run's ``(buffer,
    #: offset)`` (``codec.feedback.runstep``); None: a buffer of their own, or not known
    at: tuple | None = field(default=None, repr=False)
    spare_at: tuple | None = field(default=None, repr=False)
    velocity_at: tuple | None = field(default=None, repr=False)

    def __post_init__(self):
        if self.residual is not None:
            self.shape, self.dtype = self.residual.shape, self.residual.dtype
        elif self.shape is None or self.dtype is None:
            raise CodecTypeError("Slot: a slot without a residual needs shape and dtype")
        else:
            self.shape, self.dtype = tuple(int(n) for n in self.shape), np.dtype(self.dtype)

    def fits(self, shape, dtype) -> bool:
        """Whether this slot is for arrays of ``shape`` and ``dtype``."""
        return self.shape == tuple(shape) and self.dtype == np.dtype(dtype)

    def context(self, x: np.ndarray, name: str = "x") -> Context:
        """The stages' context for encoding ``x`` under this key: key, step and a copy of the
        stage state, which the step installs as ``state`` once it has succeeded (so a failed
        step leaves it as it was); ``name``: what errors call ``x``."""
        return Context(x.shape, x.dtype, key=self.key, step=self.step, state=dict(self.state), name=name)

    def read_residual(self) -> np.ndarray:
        """The residual as a step's kernels read it: flat and read-only (an input of the
        fused step, which writes the new residual into :meth:`take_spare`'s buffer;
        :meth:`commit` is its one writer), so every stage hands a kernel the signature the
        kernel tests compile."""
        return readonly(self.residual.reshape(-1))

    def take_spare(self) -> np.ndarray:
        """The residual-sized buffer for the step's ``acc``: the spare, made on first use.  It
        stays the spare until :meth:`commit` swaps it with the residual, so a step that fails
        or declines (a stage falling back to the generic step) leaves it for the next one and
        the residual intact."""
        if self.spare is None:
            if on_device(self.residual):
                self.spare = empty(self.residual.size, self.residual.dtype).reshape(self.residual.shape)
            else:
                self.spare = np.empty_like(self.residual)
        return self.spare

    def follow(self, device: bool) -> None:
        """Keep the residual (and the velocity) where the gradient lives: moved to the device
        (``device`` True) or to host memory with one copy when it is elsewhere, as after
        ``load_state_dict`` (whose arrays are host arrays) or when a key's gradients move.
        The spare is dropped."""
        if self.residual is None or on_device(self.residual) == device:
            return

        move = to_device if device else host_copy
        self.residual, self.at = move(self.residual), None
        if self.velocity is not None:
            self.velocity, self.velocity_at = move(self.velocity), None
        self.spare = self.spare_at = None

    def commit(self, residual: np.ndarray, *, keep_spare: bool = True, at: tuple | None = None) -> None:
        """Install ``residual`` (a buffer from :meth:`take_spare`, holding ``acc - decoded``)
        as the new residual; the old one becomes the spare, or is dropped with
        ``keep_spare=False`` (a caller that makes a fresh ``acc`` every step anyway, as the
        two-round PowerSGD does, keeps one buffer instead of two).  ``at``: where
        ``residual`` lies in a buffer shared with other keys (``(buffer, offset)``; the old
        residual's becomes the spare's).  The only writer of a residual."""
        if keep_spare:
            self.spare, self.spare_at = self.residual, self.at
        else:
            self.spare = self.spare_at = None
        self.residual, self.at = residual, at


Slot.__module__ = "codec.feedback"  # its public home (pickles and reprs name it there)
