"""Replayed steps: a many-tensor step of a layout the codec has framed before, without the
general path's per-tensor Python (issue 33, "small tensors at a few microseconds each").

A training loop calls ``encode_many`` and ``decode_many`` on the same tensors every step.
For an elementwise codec whose value stage codes a run where its tensors lie
(:attr:`codec.stage.Value.segmented`: fp16 and bf16), one section of codes per tensor, no
byte stage, everything in the frame but the codes and the payload's CRC-32C is the layout's:
the header, the table, each tensor's place in the payload; so is a quantizer's header
(:func:`reads_as_run`: each tensor's section counts and widths follow from its size).
:class:`Replay` records that from a frame the general path made (``learn_encode``,
``learn_decode``); a later call that matches it is one kernel call over every tensor:

* ``encode`` (fp16, bf16): same codec, layout form, names (or count) and, per tensor, a
  plain C-contiguous aligned host ``ndarray`` (or contiguous CPU torch tensor) of the
  recorded shape and dtype; the codes written straight into a new frame from where each
  tensor lies (``encode_at``, checksummed as they are written), then the recorded header
  with the new CRCs.
* ``decode``: a ``bytes``/``bytearray`` frame of the recorded length whose header (every
  byte before the payload CRC) is the recorded one and whose header CRC holds, so parsing it
  would give the recorded frame again; fp16/bf16 codes decoded by ``write_at`` into the
  caller's arrays (checked as ``decode_many`` checks them) or new ones, the payload CRC-32C
  verified in the same pass (:class:`codec.payloadcheck.PayloadCheck`); a quantizer's run
  checked, read at once (``read_run``) and written where each array lies
  (``write_segments``).
* ``decode`` of a low-rank frame (PowerSGD with its values as they are, :func:`lowrank`:
  each tensor's values, or its matrix's ``r (n + m)`` coefficients): every matrix's ``P Q^T``
  formed with one ``expand_segments`` call, the other tensors' values copied; and its
  ``encode`` (tensors of a run's size): every matrix's power iteration in one
  ``power_segments`` call (:func:`codec.replaydecode.encode_lowrank`).
* ``decode`` of a keyed sparse frame (random-k with its values as they are, :func:`keyed`:
  a key and k values per tensor, k fixed by the size and step, so its header is the
  layout's too): every key checked at once (``keys_at``), then one kernel call draws every
  tensor's positions while it zeroes the arrays and writes the kept values at them
  (``scatter_keyed``).
* ``encode`` of a sparse codec, whose header changes with each step's index sections:
  random-k's keys and values (:func:`codec.replaydecode.encode_keyed`), or another select
  stage's run (:func:`codec.replaydecode.selected`: top-k, gaussian-k, DGC, AdaComp on
  tensors of a run's size) selected and coded at once, its header made for the step's
  sections (:func:`codec.replaydecode.encode_selected`).

How each of the last kinds is written is :mod:`codec.replaydecode`'s.

Nothing else changes: the frame is byte for byte the general path's (a plan is kept only if
its frame of the tensors it was learned from equals the general path's), and whatever a plan
does not match, or any error (a NaN under ``nonfinite=raise``, a damaged frame) falls back
to the general path, which raises as it always did.  Error feedback's steps are not replayed
(they update residuals: :mod:`codec.feedback.runstep`).  docs/api.md, "Replayed steps".
"""

from __future__ import annotations

import zlib

import numpy as np

from codec import manydecode, replaydecode
from codec.replaydecode import keyed, lowrank, reads_as_run, selected
from codec.runs import RUN_ELEMENTS
from codec.frame import _CRC, FLAG_PAYLOAD_CRC32C, close_header
from codec.framebuffer import new_bytes
from codec.manyframe.wire import CHECKSUM_FLAGS, FLAG_JOINT, FLAG_LAYOUT_HASH, FLAG_ZSTD
from codec.modes import SET
from codec.ops import remember
from codec.section import Encoding

__all__ = ["Replay", "decode", "decode_many", "encode", "learn_decode", "learn_encode", "replayable"]

#: plans kept per codec (encoding) and in all (decoding); the oldest goes first
KEEP = 8
#: decoding plans by frame length (a frame's length and header bytes find its plan)
_DECODES: dict = {}


class Replay:
    """What every frame of one layout coded by one codec holds, learned from one of them:
    the header bytes before the payload CRC (``prefix``), the header's and the frame's
    lengths, whether the payload carries a CRC-32C, the tensors' names, shapes, sizes,
    C-contiguous strides and dtype, where each starts in the run, and the dtype of their
    codes (fp16/bf16), or every tensor's section infos (a quantizer's run: ``infos``)."""

    __slots__ = ("codec", "prefix", "header_len", "size", "crc", "names", "shapes", "sizes", "strides", "starts", "dtype", "codes_dtype", "count", "infos", "values", "keys", "kstarts", "matrices", "like", "last", "run", "kept", "spots", "selected", "power", "keyspots", "memo")

    def __init__(self, codec, frame, mf, codes_dtype=None):
        from codec.ops import offsets, readonly

        lay = mf.layout
        self.codec = codec
        self.crc = bool(mf.flags & FLAG_PAYLOAD_CRC32C)
        self.header_len = mf.header_len
        self.prefix = bytes(frame[: mf.header_len - _CRC.size * (2 if self.crc else 1)])
        self.size = len(frame)
        self.names = lay.names
        self.shapes = tuple(lay.shapes)
        self.sizes = tuple(lay.sizes)
        self.dtype = lay.dtypes[0]
        self.strides = tuple(_c_strides(shape, self.dtype.itemsize) if n else None for shape, n in zip(self.shapes, self.sizes))
        self.starts = readonly(offsets(self.sizes))
        self.codes_dtype = codes_dtype
        self.count = sum(self.sizes)
        self.like = np.empty(0, self.dtype)  # (the kernels' dtype argument)
        #: the last plain ndarrays taken (weak references) and their addresses: the same
        #: arrays again need no address read (:meth:`_addresses`)
        self.last = None
        #: a quantizer's run or a keyed sparse frame (``codes_dtype`` None): every tensor's
        #: section infos, for ``read_run`` or ``positions_segments``
        self.infos = mf.tensor_sections if codes_dtype is None else None
        #: a keyed sparse frame: each tensor's kept values' (start, end) in the payload, their
        #: offsets in the run of kept values, and ``keys_at``'s key offsets, sizes and rooms
        self.values = self.keys = self.kstarts = self.matrices = self.run = self.selected = None
        #: a low-rank encode's starting Qs (codec.replaydecode.encode_lowrank), once known;
        #: a keyed frame's key bytes in the payload and the last keys that passed
        #: (codec.replaydecode.decode_keyed)
        self.power = self.keyspots = self.memo = None
        if codes_dtype is None and selected(codec):
            # a sparse codec (encoding only, codec.replaydecode.encode_selected): the run's
            # starts (writeable, as the general path's runs pass them), the layout and how
            # errors name the tensors
            from codec.context import where

            self.selected = (offsets(self.sizes), lay, where(lay.names, len(lay)))
        elif codes_dtype is None and lowrank(codec):
            # each tensor's one section: its values (passed through) or P then Q, at offsets
            # that are whole items of the dtype (checked when learned): the pass-through
            # tensors' (index, start, end) and the matrices' indices, first coefficients
            # (in items of the payload) and plans
            item = self.dtype.itemsize
            secs = mf.tensor_sections
            plans = [codec.transform.matrix(shape) for shape in self.shapes]
            self.values = [(t, s[0].offset // item, (s[0].offset + s[0].raw_len) // item) for t, (s, plan) in enumerate(zip(secs, plans)) if plan is None and s[0].raw_len]
            index = [t for t, plan in enumerate(plans) if plan is not None]
            ns, ms, rs = (readonly(np.array(col, np.int64)) for col in zip(*[plans[t] for t in index])) if index else (readonly(np.empty(0, np.int64)),) * 3
            self.matrices = (readonly(np.array(index, np.int64)), readonly(np.array([secs[t][0].offset // item for t in index], np.int64)), ns, ms, rs)
        elif codes_dtype is None and reads_as_run(codec):  # what reading the run takes from the layout alone
            self.run = codec.value.run_plan(mf.tensor_sections, list(self.sizes), self.dtype)
        elif codes_dtype is None and codec.select is not None:
            secs = mf.tensor_sections
            self.values = [(s[1].offset, s[1].offset + s[1].raw_len) for s in secs]
            self.kstarts = readonly(offsets([s[1].count for s in secs]))
            room = codec.value.most_values(np.array([8 * s[1].raw_len for s in secs], np.int64))
            self.keys = (readonly(np.array([s[0].offset for s in secs], np.int64)), readonly(np.array(self.sizes, np.int64)), readonly(room))
            # encoding (codec.replaydecode.encode_keyed): the tensors that keep values and each
            # kept value's item in the payload
            item = self.dtype.itemsize
            self.kept = [t for t, (a, b) in enumerate(self.values) if b > a]
            self.spots = readonly(np.concatenate([np.arange(a // item, b // item) for a, b in self.values] or [np.empty(0, np.int64)]).astype(np.int64))
            self.keyspots = readonly((self.keys[0][:, None] + np.arange(24)).reshape(-1))

    def _addresses(self, arrays, write: bool):
        """The data addresses of ``arrays`` (int64, read-only) and the arrays as ``ndarray``
        views, or None unless each is a plain ``ndarray`` (or a contiguous CPU torch tensor,
        through its NumPy view) of its tensor's shape, the dtype, C-contiguous and aligned
        (``write``: and writeable): what the general path takes as it is."""
        from codec.kernels.cpu._common import address_of

        dt, mask = self.dtype, self.dtype.itemsize - 1
        last = self.last
        if last is not None and len(arrays) == len(last[0]):
            # the same ndarrays as the last call: an array's buffer stays where it is while its
            # size does (``resize`` moves it only to change the size), so what can change is
            # what is checked here
            for a, ref, shape, strides in zip(arrays, last[0], self.shapes, self.strides):
                if ref() is not a or a.dtype is not dt or a.shape != shape or (strides is not None and a.strides != strides) or (write and not a.flags.writeable):
                    break
            else:
                return last[1], list(arrays)
        addrs, views = [], []
        for a, shape, strides in zip(arrays, self.shapes, self.strides):
            if type(a) is not np.ndarray:
                a = _torch_view(a)
                if a is None:
                    return None
            if type(a) is not np.ndarray or a.dtype is not dt or a.shape != shape or (strides is not None and a.strides != strides) or (write and not a.flags.writeable):
                return None
            views.append(a)
            addr = address_of(a)
            if addr & mask:
                return None
            addrs.append(addr)
        got = np.array(addrs, np.int64)
        got.flags.writeable = False
        if all(type(a) is np.ndarray for a in arrays):
            import weakref

            self.last = (tuple(weakref.ref(a) for a in arrays), got)  # (weak: a plan keeps no caller's array alive)
        return got, views

    # -------------------------------------------------------------- encoding
    def encode(self, arrays, step: int = 0) -> bytes | None:
        """The frame of ``arrays`` (in layout order) at ``step``, or None when they are not
        what the plan was learned from or a value refuses (the general path then runs and
        raises)."""
        if len(arrays) != len(self.shapes):
            return None
        found = self._addresses(arrays, False)
        if found is None:
            return None
        if self.selected is not None:  # a sparse codec
            return replaydecode.encode_selected(self, found[1], step)
        if self.matrices is not None:  # a low-rank frame (PowerSGD)
            return replaydecode.encode_lowrank(self, found, step)
        if self.codes_dtype is None:  # a keyed sparse frame (random-k)
            return replaydecode.encode_keyed(self, found[1], step)
        frame, out = new_bytes(self.size)
        hl = self.header_len
        ok, crc = self.codec.value.encode_at(out[hl:], found[0], self.starts, self.like, 0 if self.crc else None)
        if not ok:  # (a NaN under nonfinite=raise: the general path names its tensor)
            return None
        close_header(bytearray(self.prefix), out, hl, FLAG_PAYLOAD_CRC32C if self.crc else 0, None, crc)
        return frame

    # -------------------------------------------------------------- decoding
    def decode(self, frame, out):
        """The tensors of ``frame`` (whose header is this plan's: checked by the caller) into
        ``out`` (a dict or list as ``decode_many`` takes it; None: new arrays), or None when
        ``out`` is not what the fast path writes (the general path then checks it).  A damaged
        payload raises :class:`~codec.errors.CorruptFrameError` as ``decode_many`` does."""
        if out is None:
            items = [np.empty(shape, self.dtype) for shape in self.shapes]
        elif type(out) is dict:
            names = self.names
            if names is None or len(out) != len(names):
                return None
            try:
                items = [out[k] for k in names]
            except KeyError:
                return None
        elif type(out) in (list, tuple) and len(out) == len(self.sizes):
            items = out
        else:
            return None
        found = self._addresses(items, True)
        if found is None:
            return None
        if self.infos is not None:  # a frame of one of codec.replaydecode's kinds: its payload's CRC-32C first
            payload = self._payload(frame)
            if payload is None:
                return None
            kind = replaydecode.decode_lowrank if self.matrices is not None else replaydecode.decode_keyed if self.values is not None else replaydecode.decode_run
            return self._result(out, items) if kind(self, payload, *found) else None
        hl = self.header_len
        codes = np.frombuffer(frame, self.codes_dtype, self.count, hl)
        codes.flags.writeable = False  # (a bytearray's view: kernels take every input read-only)
        addrs, views = found
        crc = self.codec.value.write_at(codes, addrs, self.starts, self.like, SET, self.crc)
        if self.crc:  # the codes are the whole payload: their CRC-32C, formed as they were read, is the payload's
            if crc < 0:
                from codec.checksum import crc32c

                crc = crc32c(codes.view(np.uint8))
            if crc != _CRC.unpack_from(frame, hl - 2 * _CRC.size)[0]:
                from codec.payloadcheck import refuse

                refuse(views)  # NaN in the outputs, then CorruptFrameError, as decode_many does
        return self._result(out, items)


    def _payload(self, frame):
        """The payload of ``frame`` (read-only), or None when its CRC-32C does not hold (the
        general path then raises)."""
        from codec.checksum import crc32c

        hl = self.header_len
        payload = np.frombuffer(frame, np.uint8, self.size - hl, hl)
        payload.flags.writeable = False
        if self.crc and crc32c(payload) != _CRC.unpack_from(frame, hl - 2 * _CRC.size)[0]:
            return None
        return payload

    def _result(self, out, items):
        """What ``decode_many`` returns: ``out`` given, else the new arrays (a dict when the
        frame names its tensors)."""
        if out is not None:
            return out
        return items if self.names is None else dict(zip(self.names, items))


def _torch_view(x):
    """The NumPy view of a contiguous CPU torch tensor (:func:`codec.dtypes.torch_view`), or
    None for anything else (the general path then takes it)."""
    if not type(x).__module__.startswith("torch") or x.device.type != "cpu" or not x.is_contiguous():
        return None
    from codec.dtypes import torch_view

    return torch_view(x, "x")


def _c_strides(shape, itemsize: int) -> tuple:
    """The strides NumPy gives a new C-contiguous array of ``shape`` (not empty; a view
    with other strides on a dimension of 1 is left to the general path)."""
    strides = []
    for d in reversed(shape):
        strides.append(itemsize)
        itemsize *= d
    return tuple(reversed(strides))


def replayable(c) -> bool:
    """Whether the codec ``c``'s many-tensor steps can be replayed: an elementwise value stage
    alone that codes a run where its tensors lie, and no byte stage; or a keyed select stage
    with its values as they are, unscaled (random-k: :func:`codec.replaydecode.encode_keyed`);
    or another select stage (:func:`codec.replaydecode.encode_selected`); or a low-rank
    transform with its values as they are (PowerSGD: :func:`codec.replaydecode.encode_lowrank`,
    tensors of a run's size)."""
    return (c.elementwise and c.value.segmented and not c.post) or (keyed(c) and not getattr(c.select, "scale", False)) or selected(c) or lowrank(c)


def _encode_key(tensors, form):
    """The plan key of ``encode_many``'s ``tensors`` (the layout form, and the names or the
    count) and their values in order; ``(None, None)`` for another kind of input."""
    if type(tensors) is dict:
        return (form, tuple(tensors)), list(tensors.values())
    if type(tensors) in (list, tuple):
        return (form, len(tensors)), tensors
    return None, None


def encode(c, tensors, form: str, step: int = 0) -> bytes | None:
    """``c.encode_many(tensors, layout=form)`` replayed, or None (no plan, or the tensors do
    not match it: the general path runs)."""
    plans = c.__dict__.get("_replays")
    if not plans:
        return None
    key, values = _encode_key(tensors, form)
    entry = plans.get(key)
    if entry is None or entry[1] is None:
        return None
    return entry[1].encode(values, step)


def learn_encode(c, tensors, form: str, names, arrays, frame, step: int = 0) -> None:
    """After the general path framed ``tensors`` (a plain ``encode_many`` call; ``names``
    and ``arrays`` as it took them) into ``frame``: keep the plan of their layout (the latest
    layout under their names wins) when the codec's steps can be replayed and the plan gives
    the same bytes.  A list of ``(name, array)`` pairs is not learned: its key (the count)
    is a list of arrays' too, whose frame names nothing."""
    key, _ = _encode_key(tensors, form)
    if key is None or form != "table" or not replayable(c):  # (the hash form: its decoding needs the layout given)
        return
    if type(tensors) is not dict and names is not None:
        return
    plans = c.__dict__.setdefault("_replays", {})
    sig = tuple((a.shape, a.dtype) for a in arrays)
    if key in plans and plans[key][0] == sig:
        return
    plan = _learned(c, frame)
    remember(plans, key, (sig, plan if plan is not None and plan.encode(arrays, step) == frame else None), KEEP)


def decode_many(frame, out, parsed, *, codec=None, layout=None, max_elements=None, like=None):
    """``decode_many(frame, out)`` for both entry points (``codec.decode_many``,
    ``Codec.decode_many``, whose ``codec`` the frame must be): replayed when a learned header
    matches (no ``layout`` given), else ``parsed()`` (the codec and the parsed frame, checked
    as the caller checks them) decoded by the general path (:func:`codec.manydecode.decode`)
    and its header learned."""
    if layout is None:
        got = decode(frame, out, codec, like, max_elements)
        if got is not None:
            return got
    c, mf = parsed()
    got = manydecode.decode(c, mf, out, like=like)
    learn_decode(c, frame, mf)
    return got


def decode(frame, out, codec=None, like=None, max_elements=None):
    """``decode_many(frame, out)`` replayed, or None (the general path runs).  ``codec``: the
    codec the caller expects made the frame (``Codec.decode_many``)."""
    if like is not None or type(frame) not in (bytes, bytearray):
        return None
    plans = _DECODES.get(len(frame))
    if not plans:
        return None
    for plan in plans:
        if frame.startswith(plan.prefix):
            break
    else:
        return None
    if codec is not None and codec is not plan.codec and codec.spec != plan.codec.spec:  # (another codec decodes through the general path, as it did)
        return None
    if max_elements is not None and not (type(max_elements) is int and plan.count <= max_elements):
        return None
    hl = plan.header_len
    if zlib.crc32(memoryview(frame)[: hl - _CRC.size]) != _CRC.unpack_from(frame, hl - _CRC.size)[0]:
        return None
    return plan.decode(frame, out)


def learn_decode(c, frame, mf) -> None:
    """After the general path decoded ``frame`` (parsed: ``mf``, made by the codec ``c``):
    keep the plan of its header when its tensors can be replayed."""
    if type(frame) not in (bytes, bytearray) or selected(c) or not (replayable(c) or reads_as_run(c) or keyed(c) or lowrank(c)):  # (a sparse header changes: no decoding plan)
        return
    plans = _DECODES.get(len(frame), [])
    if any(frame.startswith(p.prefix) for p in plans):
        return
    plan = _learned(c, frame, mf)
    if plan is not None:
        remember(_DECODES, len(frame), [*plans, plan][-KEEP:], KEEP)


def _learned(c, frame, mf=None) -> Replay | None:
    """The plan of ``frame`` (a v2 frame the codec ``c`` made; ``mf`` it parsed), or None
    when its tensors are not one run of codes: one raw section per tensor, end to end, of
    one float32/float64 dtype, no joint or hashed layout, no zstd, a CRC-32C or none."""
    from codec.manyframe import parse_many

    if mf is None:
        mf = parse_many(frame)
    lay = mf.layout
    if mf.flags & (FLAG_JOINT | FLAG_LAYOUT_HASH | FLAG_ZSTD) or mf.flags & CHECKSUM_FLAGS not in (0, FLAG_PAYLOAD_CRC32C):
        return None
    if not len(lay) or len(set(lay.dtypes)) != 1 or lay.dtypes[0] not in (np.float32, np.float64):
        return None
    if lowrank(c):  # one raw section per tensor: its values, or its matrix's P then Q, in its dtype
        bits = lay.dtypes[0].itemsize * 8
        if c.transform.domain_dtype(lay.dtypes[0]) != lay.dtypes[0] or (len(frame) - mf.header_len) % (bits // 8):
            return None
        for secs, shape, n in zip(mf.tensor_sections, lay.shapes, lay.sizes):
            plan = c.transform.matrix(shape)
            want = n if plan is None else plan[2] * (plan[0] + plan[1])
            if len(secs) != 1 or secs[0].encoding != Encoding.RAW or secs[0].bits != bits or secs[0].count != want or secs[0].raw_len != secs[0].stored_len or secs[0].offset % (bits // 8):
                return None
        return Replay(c, frame, mf)
    if selected(c):  # tensors of a run's size (a segment's selection runs on one thread), stored raw
        if max(lay.sizes) > RUN_ELEMENTS or any(sec.encoding != Encoding.RAW for secs in mf.tensor_sections for sec in secs):
            return None
        return Replay(c, frame, mf)
    if keyed(c):  # a key then the values, raw, in the tensors' dtype, at whole items of it
        bits = lay.dtypes[0].itemsize * 8
        if (len(frame) - mf.header_len) % (bits // 8) or any(len(secs) != 2 or secs[1].encoding != Encoding.RAW or secs[1].bits != bits or secs[1].raw_len != secs[1].stored_len or secs[1].offset % (bits // 8) for secs in mf.tensor_sections):
            return None
        return Replay(c, frame, mf)
    if not c.elementwise:  # a quantizer's run: every section raw, and read_run takes them
        if any(sec.encoding != Encoding.RAW for secs in mf.tensor_sections for sec in secs):
            return None
        payload = np.frombuffer(frame, np.uint8, len(frame) - mf.header_len, mf.header_len)
        payload.flags.writeable = False
        from codec.errors import CorruptFrameError

        try:
            if c.value.read_run(payload, mf.tensor_sections, list(lay.sizes), lay.dtypes[0]) is None:
                return None
        except CorruptFrameError:
            return None
        return Replay(c, frame, mf)
    at = 0
    for secs, n in zip(mf.tensor_sections, lay.sizes):
        if len(secs) != 1 or secs[0].encoding != Encoding.RAW or secs[0].count != n or secs[0].offset != at or secs[0].raw_len != secs[0].stored_len:
            return None
        at += secs[0].raw_len
    if mf.header_len + at != len(frame):
        return None
    _, codes = c._read(mf.tensor(0))
    if not isinstance(codes, np.ndarray) or codes.itemsize * 8 != mf.tensor_sections[0][0].bits:
        return None
    return Replay(c, frame, mf, codes.dtype)
