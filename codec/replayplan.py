"""The plan of a replayed step (:mod:`codec.replay` keeps the plans and finds them): what every
frame of one layout coded by one codec holds, learned from one of them (:func:`learned`,
which says which frames a plan can be learned from), how a call's arrays are checked to be
the ones it was learned from (their addresses), and which kind of step writes them
(:mod:`codec.replaydecode` for every kind but fp16/bf16's codes).  docs/api.md, "Replayed
steps"."""

from __future__ import annotations

import zlib

import numpy as np

from codec import replaydecode
from codec.frame import _CRC, FLAG_PAYLOAD_CRC32C, SectionKind
from codec.framebuffer import new_bytes
from codec.manyframe.wire import CHECKSUM_FLAGS, FLAG_DERIVED, FLAG_JOINT, FLAG_LAYOUT_HASH, FLAG_ZSTD
from codec.modes import SET
from codec.replaydecode import keyed, lowrank, reads_as_run, selected
from codec.runs import RUN_ELEMENTS
from codec.section import Encoding
from codec.checksum import crc32c
from codec.context import where
from codec.dtypes import torch_view
from codec.errors import CorruptFrameError
from codec.manyframe import parse_many
from codec.manyframe.parse import read_header
from codec.ops import offsets, readonly
from codec.pack import INDEX_KINDS
from codec.payloadcheck import PayloadCheck, refuse

__all__ = ["Replay", "learned"]


class Replay:
    """What every frame of one layout coded by one codec holds, learned from one of them:
    the header bytes before the payload CRC (``prefix``), the header's and the frame's
    lengths, whether the payload carries a CRC-32C, the tensors' names, shapes, sizes,
    C-contiguous strides and dtype, where each starts in the run, and the dtype of their
    codes (fp16/bf16), or every tensor's section infos (a quantizer's run: ``infos``)."""

    __slots__ = ("codec", "prefix", "head_crc", "header_len", "size", "crc", "names", "shapes", "sizes", "strides", "starts", "dtype", "codes_dtype", "count", "infos", "values", "keys", "kstarts", "matrices", "like", "last", "run", "kept", "spots", "selected", "power", "keyspots", "memo", "pairs", "passing", "qstarts")

    def __init__(self, codec, frame, mf, codes_dtype=None):
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
        self.power = self.keyspots = self.memo = self.pairs = None
        #: a low-rank frame: its pass-through tensors' indices, first values (in items of the
        #: payload) and offsets in their run (what its error-feedback step hands
        #: ``pass_segments``), and its matrices' starting Qs' offsets (``power_segments``'
        #: ``qstarts``, in every replayed encode: codec.replaydecode)
        self.passing = self.qstarts = None
        if codes_dtype is None and selected(codec):
            # a sparse codec: its encoding (tensors of a run's size, whose selection runs on
            # one thread: codec.replaydecode.encode_selected) takes the run's starts
            # (writeable, as the general path's runs pass them), the layout and how errors
            # name the tensors; its decoding (codec.replaydecode.decode_pairs) reads each
            # frame's sections after the layout, which is all its prefix holds

            if max(self.sizes) <= RUN_ELEMENTS:
                self.selected = (offsets(self.sizes), lay, where(lay.names, len(lay)))
            self.pairs = _pairs_plan(codec, frame, mf)
            if self.pairs is not None:  # (its prefix ends with the layout: no header CRC continues from it)
                self.prefix = bytes(frame[: self.pairs[0]])
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
            self.passing = tuple(readonly(np.array(col, np.int64)) for col in ([t for t, _, _ in self.values], [a for _, a, _ in self.values])) + (readonly(offsets([b - a for _, a, b in self.values])),)
            self.qstarts = readonly(offsets((ms * rs).tolist()))
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
        #: the zlib CRC32 of the header bytes the plan records (``prefix``: up to the payload CRC,
        #: or a sparse frame's up to its layout), from which a frame's header CRC continues
        #: (:meth:`close`, :meth:`header_holds`)
        self.head_crc = zlib.crc32(self.prefix)

    def _addresses(self, arrays, write: bool):
        """The data addresses of ``arrays`` (int64, read-only) and the arrays as ``ndarray``
        views, or None unless each is a plain ``ndarray`` (or a contiguous CPU torch tensor,
        through its NumPy view) of its tensor's shape, the dtype, C-contiguous and aligned
        (``write``: and writeable): what the general path takes as it is."""
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
        from codec.kernels.cpu._common import address_of

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
        if self.codes_dtype is not None:  # fp16/bf16: the codes written where the frame holds them
            frame, out = new_bytes(self.size)
            ok, crc = self.codec.value.encode_at(out[self.header_len :], found[0], self.starts, self.like, 0 if self.crc else None)
            if not ok:  # (a NaN under nonfinite=raise: the general path names its tensor)
                return None
            self.close(out, crc)
            return frame
        if selected(self.codec):  # a sparse codec: not above a run's size
            return None if self.selected is None else replaydecode.encode_selected(self, found[1], step)
        if self.matrices is not None:  # a low-rank frame (PowerSGD)
            return replaydecode.encode_lowrank(self, found, step)
        return replaydecode.encode_keyed(self, found[1], step)  # a keyed sparse frame (random-k)

    def close(self, out, crc) -> None:
        """The header of a new frame of this plan into ``out[:header_len]`` (the frame's uint8
        view): the recorded prefix, the payload CRC-32C ``crc`` (a frame with one) and the
        header's CRC32, continued from the prefix's (what :func:`codec.frame.close_header`
        writes, without reading the prefix again).  Not for a sparse frame's plan (``pairs``:
        its header changes with the step)."""
        tail = _CRC.pack(crc) if self.crc else b""
        memoryview(out)[: self.header_len] = self.prefix + tail + _CRC.pack(zlib.crc32(tail, self.head_crc))

    def header_holds(self, frame) -> bool:
        """Whether the header CRC32 of ``frame``, which starts with the plan's prefix (found by
        it), holds: continued from the prefix's over the payload CRC after it."""
        hl = self.header_len
        return zlib.crc32(memoryview(frame)[len(self.prefix) : hl - _CRC.size], self.head_crc) == _CRC.unpack_from(frame, hl - _CRC.size)[0]

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
        if self.pairs is not None:  # a sparse frame: its header's sections read, checked, then its pairs written
            return self._result(out, items) if replaydecode.decode_pairs(self, frame, found[0]) else None
        if self.infos is not None and self.matrices is None and self.values is None:  # a quantizer's run: its payload checked as its codes are decoded
            check = self._check(frame)
            if not replaydecode.decode_run(self, self._payload(frame) if check is None else check.payload, *found, check):
                return None
            if check is not None:
                check.verify(found[1])  # NaN in the outputs, then CorruptFrameError, as decode_many does
            return self._result(out, items)
        if self.infos is not None:  # a frame of one of codec.replaydecode's other kinds: its payload's CRC-32C first
            payload = self._payload(frame)
            if payload is None:
                return None
            kind = replaydecode.decode_lowrank if self.matrices is not None else replaydecode.decode_keyed
            return self._result(out, items) if kind(self, payload, *found) else None
        hl = self.header_len
        codes = np.frombuffer(frame, self.codes_dtype, self.count, hl)
        if type(frame) is not bytes:
            codes.flags.writeable = False  # (a bytearray's view: kernels take every input read-only)
        addrs, views = found
        crc = self.codec.value.write_at(codes, addrs, self.starts, self.like, SET, self.crc)
        if self.crc:  # the codes are the whole payload: their CRC-32C, formed as they were read, is the payload's
            if crc < 0:
                crc = crc32c(codes.view(np.uint8))
            if crc != _CRC.unpack_from(frame, hl - 2 * _CRC.size)[0]:
                refuse(views)  # NaN in the outputs, then CorruptFrameError, as decode_many does
        return self._result(out, items)


    def _payload(self, frame):
        """The payload of ``frame`` (read-only), or None when its CRC-32C does not hold (the
        general path then raises)."""
        hl = self.header_len
        payload = np.frombuffer(frame, np.uint8, self.size - hl, hl)
        payload.flags.writeable = False
        if self.crc and crc32c(payload) != _CRC.unpack_from(frame, hl - 2 * _CRC.size)[0]:
            return None
        return payload

    def _check(self, frame):
        """The payload check of ``frame`` that its decode completes (a
        :class:`~codec.payloadcheck.PayloadCheck` of its read-only payload), None for a frame
        without a CRC-32C."""
        if not self.crc:
            return None
        hl = self.header_len
        payload = np.frombuffer(frame, np.uint8, self.size - hl, hl)
        payload.flags.writeable = False
        return PayloadCheck(payload, _CRC.unpack_from(frame, hl - 2 * _CRC.size)[0])

    def _result(self, out, items):
        """What ``decode_many`` returns: ``out`` given, else the new arrays (a dict when the
        frame names its tensors)."""
        if out is not None:
            return out
        return items if self.names is None else dict(zip(self.names, items))


def _pairs_plan(c, frame, mf) -> tuple | None:
    """What decoding a sparse codec's frame of this layout takes from the plan
    (:func:`codec.replaydecode.decode_pairs`): where its header's patterns start, the
    tensors' sizes (int64), whether they hold count rules (FLAG_DERIVED) and the most
    bytes every index section can take (a bitmap each: the
    replayed encode's bound, :func:`codec.replaydecode._encode_pairs`); None unless every
    tensor of a :func:`~codec.replaydecode.pairs` codec has an index section then its kept
    values in the layout's dtype (``_pairs_at_once``'s frames)."""
    bits = mf.layout.dtypes[0].itemsize * 8
    if not replaydecode.pairs(c) or any(len(s) != 2 or s[0].kind not in INDEX_KINDS or s[1].kind != SectionKind.VALUES or s[1].bits != bits for s in mf.tensor_sections):
        return None
    sizes = readonly(np.array(mf.layout.sizes, np.int64))
    return read_header(memoryview(frame)).table_end, sizes, bool(mf.flags & FLAG_DERIVED), int(((sizes + 7) // 8).sum())


def _torch_view(x):
    """The NumPy view of a contiguous CPU torch tensor (:func:`codec.dtypes.torch_view`), or
    None for anything else (the general path then takes it)."""
    if not type(x).__module__.startswith("torch") or x.device.type != "cpu" or not x.is_contiguous():
        return None

    return torch_view(x, "x")


def _c_strides(shape, itemsize: int) -> tuple:
    """The strides NumPy gives a new C-contiguous array of ``shape`` (not empty; a view
    with other strides on a dimension of 1 is left to the general path)."""
    strides = []
    for d in reversed(shape):
        strides.append(itemsize)
        itemsize *= d
    return tuple(reversed(strides))


def learned(c, frame, mf=None) -> Replay | None:
    """The plan of ``frame`` (a v2 frame the codec ``c`` made; ``mf`` it parsed), or None
    when its tensors are not one run of codes: one raw section per tensor, end to end, of
    one float32/float64 dtype, no joint or hashed layout, no zstd, a CRC-32C or none."""
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
    if selected(c):  # stored raw (its encoding: tensors of a run's size)
        if any(sec.encoding != Encoding.RAW for secs in mf.tensor_sections for sec in secs):
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
