"""``ErrorFeedback``: residual memory per key around any codec (the overview is in
:mod:`codec.feedback`); the step it takes is :mod:`codec.feedback.step`'s (one tensor) and
:func:`codec.many.encode_step`'s (many tensors)."""

from __future__ import annotations

import numpy as np

from codec.dtypes import as_float_array, on_device
from codec.errors import CodecKeyError, CodecTypeError, CodecValueError
from codec.feedback.slot import Slot
from codec.frame import parse_frame
from codec.framebuffer import frame_out
from codec.feedback.state import check, saved
from codec import many, replay
from codec.context import where
from codec.many import hashable_key, joined, many_keys
from codec.feedback.runstep import ManyFeedback
from codec.feedback.step import Step, advance
from codec.pipeline import Codec, get_codec
from codec.stage import MAX_STEP
from codec.device import zeros
from codec.modes import ADD
from codec.ops import scatter, store


class ErrorFeedback:
    """Error feedback around ``codec`` (a Codec, spec string or config dict).

    ``momentum=m`` (0 <= m < 1, default 0: off) adds Deep Gradient Compression's momentum
    correction with momentum-factor masking: per key, ``u = m*u + x`` (in x's dtype, ``m``
    rounded to it); the codec encodes
    ``u + residual``; then ``u`` is zeroed where the frame sent values (everywhere for a
    dense codec).  Works with any codec.

    ``residuals=False`` keeps per key only the step and the stage state: ``encode`` is then
    ``codec.encode(x, key=key, step=<the key's step>)`` (with the key's stage state) and
    advances the step; nothing is fed back.  A key whose shape or dtype changes keeps its
    step and starts its stage state over.  Momentum needs residuals.

    >>> ef = ErrorFeedback("topk(ratio=0.01)", momentum=0.9)
    >>> frame = ef.encode(grad, key="layer1.weight")   # doctest: +SKIP
    """

    def __init__(self, codec, *, momentum: float = 0.0, residuals: bool = True):
        self.codec: Codec = get_codec(codec)
        if isinstance(momentum, bool) or not isinstance(momentum, (int, float)) or not 0 <= momentum < 1:
            raise CodecValueError(f"momentum: must be a number in [0, 1), got {momentum!r}")
        if not isinstance(residuals, (bool, np.bool_)):
            raise CodecTypeError(f"residuals: expected True or False, got {residuals!r}")
        if momentum and not residuals:
            raise CodecValueError("momentum: DGC's momentum correction feeds the residual, and residuals=False keeps none")
        self.momentum = float(momentum)
        self.residuals = bool(residuals)
        self._slots: dict = {}

    def encode(self, x, key=None, *, dtype=None, out=None) -> bytes:
        """Encode ``x`` plus the residual of ``key``; the new residual is what the frame missed.
        Without residuals: the frame of ``x`` at the key's step.  Advances the key's step.

        ``out``: a buffer to write the frame into (:meth:`codec.Codec.encode`); a frame that
        does not fit raises ValueError and changes no residual or step.

        ``x`` may be a device (CUDA) array for a codec whose stages take one (none, fp16,
        bf16, the sparsifiers): the residual (and the velocity) then lives on the device too (moved there once if it was not,
        as after :meth:`load_state_dict`), and the frame is the host's, byte for byte."""
        arr = self.codec.input(x, dtype, "x")  # a device array: viewed, its stages checked
        device = on_device(arr)
        dest = frame_out(out, (arr,))
        slot = self._claim(key, arr, "x")
        slot.follow(device)
        sections, finish = self._step.begin(arr, slot)
        frame = self.codec.frame(sections, arr.dtype, arr.shape, out=dest)
        finish(lambda: parse_frame(frame, verify_payload=False))()
        self._store((slot,))
        return frame

    def encode_many(self, tensors, keys=None, *, layout: str = "table", joint: bool = False, out=None, skip_missing: bool = False) -> bytes:
        """One many-tensor frame (:meth:`codec.Codec.encode_many`) of every tensor plus its
        key's residual, each tensor's step exactly what :meth:`encode` would do with it.

        ``tensors``: a dict name -> array, (name, array) pairs or a sequence of arrays, and
        ``skip_missing`` (leave out None values), as :meth:`codec.Codec.encode_many` takes
        them; ``keys`` default to the names or the positions 0, 1, ... (a sequence).  Every tensor is checked
        before anything changes, and on any error no residual or step changes.

        ``joint=True``: the whole-model variant (:meth:`codec.Codec.encode_many`): the flat
        concatenation of the tensors is ONE array under ONE key, ``keys`` (default None), with
        one residual of the concatenation's length: :meth:`encode` of the concatenation,
        framed with every tensor's shape.

        ``out``: a buffer to write the frame into, as for :meth:`encode`."""
        if not joint and out is None and layout == "table" and self.residuals and not self.momentum:
            got = replay.encode_lowrank_feedback(self.codec, tensors, keys, self._slots)
            if got is not None:  # PowerSGD's step replayed (codec.replay): installed as finish would
                frame, slots, accs, states = got
                for slot, acc, state in zip(slots, accs, states):
                    slot.commit(acc)
                    advance(slot, state)
                return frame
        names, arrays, lay, dest = many.prepared(self.codec, tensors, out, skip_missing)
        dev = bool(arrays) and on_device(arrays[0])
        if joint:
            arrays, named, keys = [joined(arrays)], ["tensors"], [hashable_key(keys)]
        else:
            if keys is None:
                keys = list(names) if names is not None else list(range(len(arrays)))
            keys = many_keys(keys, len(arrays))
            if len(set(map(hashable_key, keys))) != len(keys):
                raise CodecValueError("keys: every tensor needs its own key; a key appears twice")
            named = where(names, len(arrays))
        slots = [self._claim(k, a, w) for k, a, w in zip(keys, arrays, named)]  # checks all, changes nothing
        for s in slots:
            s.follow(dev)
        frame = many.encode_step(self.codec, arrays, lay, layout, dest, feedback=ManyFeedback(self._step, slots, named), joint=joint)
        self._store(slots)
        return frame

    def _get(self, key):
        """The slot of ``key``, or None; CodecTypeError naming ``key`` when it is not hashable."""
        try:
            return self._slots.get(key)
        except TypeError:
            raise CodecTypeError(f"key: must be hashable, got a {type(key).__name__}") from None

    def _claim(self, key, arr: np.ndarray, argname: str) -> Slot:
        """The slot ``arr`` is encoded with under ``key`` (:meth:`slot`), after :meth:`check`;
        a new one has its zero residual where ``arr`` lives."""
        slot = self._get(key)
        if slot is not None and slot.step <= MAX_STEP and slot.fits(arr.shape, arr.dtype):
            return slot  # (a training loop's step: the key's memory fits)
        self.check(key, arr.shape, arr.dtype, argname)
        return self.slot(key, arr.shape, arr.dtype, device=on_device(arr))

    def check(self, key, shape, dtype, argname: str = "x") -> None:
        """What :meth:`encode` checks before it changes anything, for a caller that must
        know first (a transport, before its collective): the key has steps left, and with
        residuals an array of ``shape`` and ``dtype`` fits the key's residual.  ValueError
        naming ``argname`` otherwise."""
        slot = self._get(key)
        if slot is None:
            return
        _check_steps(slot)
        if self.residuals and not slot.fits(shape, dtype):
            raise CodecValueError(
                f"{argname}: key {key!r} was {slot.dtype}{list(slot.shape)}, now {np.dtype(dtype)}{list(shape)}; "
                "call reset(key) to start it over"
            )

    @property
    def _step(self) -> Step:
        """The step this ErrorFeedback takes (:class:`codec.feedback.step.Step`)."""
        return Step(self.codec, self.momentum, self.residuals)

    def _store(self, slots) -> None:
        """Keep ``slots``, whose step has finished, as their keys' memory (in their order)."""
        for slot in slots:
            self._slots[slot.key] = slot

    def _fresh(self, key, shape, dtype, step: int = 0, device: bool = False) -> Slot:
        """A new slot for arrays of ``shape`` and ``dtype``: a zero residual (on the device with
        ``device``; none without residuals), no stage state, ``step``."""
        if self.residuals:
            if device:
                return Slot(key, zeros(shape, dtype), step)
            return Slot(key, np.zeros(shape, dtype), step)
        return Slot(key, None, step, shape=shape, dtype=dtype)

    # ------------------------------------------------------------ a step run by the caller
    def slot(self, key, shape, dtype, *, device: bool = False) -> Slot:
        """The slot of ``key`` for arrays of ``shape`` and ``dtype``, for a caller that runs the
        error-feedback step itself (the transport's two-round PowerSGD): the stored slot when
        it fits, else a new one (zero residual, no stage state, step 0; without residuals
        the step carries over), which is NOT stored: :meth:`keep` stores it.  Changes nothing.

        The caller forms ``acc`` from ``slot.residual``, installs the new residual with
        ``slot.take_spare()`` / ``slot.commit(...)``, keeps stage state in ``slot.state`` and
        advances ``slot.step`` by one per frame.  Unlike :meth:`encode`, a key whose shape or
        dtype changed starts over instead of raising.  ``device``: a new slot's residual is a
        device array."""
        dtype = np.dtype(dtype)
        shape = tuple(int(n) for n in shape)
        slot = self._get(key)
        if slot is not None:
            _check_steps(slot)
        if slot is not None and slot.fits(shape, dtype):
            return slot
        step = slot.step if slot is not None and not self.residuals else 0
        return self._fresh(key, shape, dtype, step, device)

    def keep(self, slot: Slot) -> None:
        """Store ``slot`` (from :meth:`slot`) as the memory of ``slot.key``, replacing any."""
        if not isinstance(slot, Slot) or (slot.residual is None) == self.residuals:
            raise CodecValueError(f"slot: expected a Slot {'with' if self.residuals else 'without'} a residual, as slot() makes")
        self._slots[slot.key] = slot

    def check_slot(self, slot: Slot, where: str) -> None:
        """Refuse (ValueError starting with ``where``) a loaded slot that passed every generic
        check but that this ErrorFeedback's step could not use; nothing by default.  A scheme
        that runs its own step and keeps stricter memory (the two-round PowerSGD's float32 or
        float64, finite residuals) overrides it."""

    # ------------------------------------------------------------ reading the memory
    def residual(self, key=None) -> np.ndarray | None:
        """The current residual of ``key`` (a read-only view); None without residuals.  A
        residual on the device is returned as the device array itself (device arrays have no
        read-only flag: do not write it)."""
        slot = self._get(key)
        if slot is None:
            raise CodecKeyError(f"key: no residual for {key!r}; encode it first")
        r = slot.residual
        if r is None or on_device(r):
            return r
        r = r.view()
        r.flags.writeable = False
        return r

    def add_residual(self, key, values, positions=None) -> None:
        """``residual[key] += values`` (at the flat ``positions`` when given, else everywhere).

        For what a codec sent but the transport did not deliver: gTop-k returns the values a
        rank selected that missed the global top-k, so they are sent later, as error feedback
        intends.  ``values`` are rounded once into the residual's dtype."""
        if not self.residuals:
            raise CodecValueError("add_residual: this ErrorFeedback keeps no residuals (residuals=False)")
        slot = self._get(key)
        if slot is None:
            raise CodecKeyError(f"key: no residual for {key!r}; encode it first")

        flat = slot.residual.reshape(-1)
        vals = as_float_array(values, None, "values").reshape(-1)
        if positions is None:
            if vals.size != flat.size:
                raise CodecValueError(f"values: has {vals.size} elements, the residual of {key!r} has {flat.size}")
            store(vals, flat, ADD)
            return
        pos = np.asarray(positions)
        if pos.ndim != 1 or pos.dtype.kind not in "iu" or pos.size != vals.size:
            raise CodecValueError(f"positions: expected a 1-D integer array as long as values, got {pos.dtype}{list(pos.shape)} for {vals.size} values")
        if pos.size and (pos.min() < 0 or pos.max() >= flat.size):
            raise CodecValueError(f"positions: must lie in [0, {flat.size}) for the residual of {key!r}")
        scatter(vals, pos, flat, ADD)

    def step(self, key=None) -> int:
        """How many frames ``key`` has produced."""
        slot = self._get(key)
        return 0 if slot is None else slot.step

    def keys(self) -> list:
        return list(self._slots)

    def reset(self, key=None, *, all: bool = False) -> None:
        """Forget ``key`` (or every key with ``all=True``)."""
        if all:
            self._slots.clear()
        else:
            self._slots.pop(key, None)

    def state_dict(self) -> dict:
        """Everything needed to resume: codec config and, per key, residual, step and stage state."""
        return {
            "codec": self.codec.get_config(),
            "momentum": self.momentum,
            "residuals": self.residuals,
            "slots": [saved(s) for s in self._slots.values()],
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` returned; the codec and momentum must be the same.

        The state is untrusted input: it is checked whole before anything is replaced (on
        error this ErrorFeedback keeps what it had) and its arrays are copied into fresh
        C-contiguous ones.  The rules are in the module docstring; a state breaking one raises
        ValueError naming the slot's key and the field."""
        codec, momentum, residuals, slots = check(state, self.codec, self.momentum, self.residuals, self.check_slot)
        self.codec, self.momentum, self.residuals, self._slots = codec, momentum, residuals, slots

    def __getstate__(self):
        return self.state_dict()

    def __setstate__(self, state):
        # unpickling: the codec, momentum and residuals come from the state, checked like the rest
        self.codec, self.momentum, self.residuals, self._slots = check(state, None, None, None, self.check_slot)

    def __repr__(self):
        m = f", momentum={self.momentum}" if self.momentum else ""
        r = "" if self.residuals else ", residuals=False"
        return f"ErrorFeedback({self.codec.spec!r}{m}{r}, keys={len(self._slots)})"


def _check_steps(slot: Slot) -> None:
    """ValueError when ``slot``'s key has used up its steps (``codec.stage.MAX_STEP``)."""
    if slot.step > MAX_STEP:
        raise CodecValueError(f"key: {slot.key!r} has made 2**62 frames, the most a step count allows; call reset(key) to start it over")


ErrorFeedback.__module__ = "codec.feedback"  # its public home (pickles and reprs name it there)
