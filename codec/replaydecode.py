"""The replayed decodes of frames whose header is their layout's though their codec is not
elementwise (:mod:`codec.replay` keeps the plans and matches the frames): which codecs make
such frames, and how each kind is written into the caller's arrays once the plan has
checked the payload's CRC-32C.

* :func:`decode_run`: a quantizer's run (:func:`reads_as_run`), read at once and written where
  each array lies.
* :func:`decode_keyed`: random-k with its values as they are (:func:`keyed`), every tensor's positions drawn from
  its key and its values written at them, one kernel call.
* :func:`decode_lowrank`: PowerSGD with its values as they are (:func:`lowrank`), every matrix's ``P Q^T`` with one
  ``expand_segments`` call, the other tensors' values copied.
* :func:`decode_pairs`: the other sparsifiers with their values as they are, whose header's
  sections change with each step: the sections read after the layout, the CRCs checked,
  every pair written with one kernel call (it takes the frame, not the payload).

Each takes the plan (a :class:`codec.replayplan.Replay`), the payload (read-only uint8), the
arrays' addresses and the arrays, and returns whether it wrote them; False sends the frame
to the general path, which then refuses and names what it refuses.  The replayed encodes
are here too: :func:`encode_keyed` (random-k's keys and values), :func:`encode_selected` (the
other sparsifiers' runs), :func:`encode_lowrank` (PowerSGD's power iterations in one
``power_segments`` call) and :func:`feedback_lowrank` (its error-feedback step); each
returns the frame, or None for the general path.  docs/api.md,
"Replayed steps".
"""

from __future__ import annotations

import numpy as np

from codec.errors import CodecError, CorruptFrameError
from codec.streams import key_hash
from codec.modes import SET, SUB
from codec.checksum import crc32c
from codec.context import Context
from codec.frame import _CRC, close_header, FLAG_PAYLOAD_CRC32C
from codec.framebuffer import new_bytes
from codec.kernels import backend, module
from codec.layout import LANES
from codec.manyframe.build import head_of
from codec.ops import addresses, readonly, scratch
from codec.runs import sparse_piece
from codec.stages.select.magnitude import run_positions, segments_picked
from codec.stages.transform.powersgd import STATE_Q, start_q, tiny

__all__ = ["decode_keyed", "decode_lowrank", "decode_pairs", "decode_run", "encode_keyed", "encode_lowrank", "encode_selected", "feedback_lowrank", "keyed", "lowrank", "pairs", "reads_as_run", "selected"]


def selected(c) -> bool:
    """Whether the codec ``c`` is a select stage other than a keyed one (top-k, DGC,
    gaussian-k, AdaComp, ...) with no transform or byte stage: its encoding is replayed
    (:func:`encode_selected`) with a header made for each step's sections (their kinds,
    widths and counts change with the data), when its stages code the layout's tensors as
    one run (``select_segments``, ``encode_kept``)."""
    return c.select is not None and not c.select.keyed and c.transform is None and not c.post


def reads_as_run(c) -> bool:
    """Whether the codec ``c`` decodes a many-tensor frame as one run of its value stage: a
    quantizer alone that reads runs (``run_bits``: qsgd, minmax, fp8, rangefloat), no select,
    transform or byte stage.  Its frames' headers are the layout's too (each tensor's
    sections' counts and widths follow from its size), so its decoding is replayed; its
    encoding is not (``Value.encode_run`` runs through the general path)."""
    if c.select is not None or c.transform is not None or c.post or c.value.elementwise:
        return False
    bits = getattr(c.value, "run_bits", None)
    return bits is not None and bits() is not None


def keyed(c) -> bool:
    """Whether the codec ``c`` is a keyed select stage (:attr:`codec.stage.Select.keyed`:
    random-k) with its values stored as they are (``none``), no transform or byte stage: its
    frames' headers are the layout's, so its decoding is replayed."""
    return c.select is not None and c.select.keyed and c.value.name == "none" and c.transform is None and not c.post


def pairs(c) -> bool:
    """Whether the codec ``c`` is a sparse codec (:func:`selected`) whose kept values are
    stored as they are (``none``): its frames are pairs, each tensor's index section then
    its values, whose header changes with the step; its decoding is replayed
    (:func:`decode_pairs`) and its replayed encoding writes the frame from the select
    stage's finds (:func:`_encode_pairs`)."""
    return selected(c) and c.value.name == "none"


def lowrank(c) -> bool:
    """Whether the codec ``c`` is a low-rank transform (:attr:`codec.stage.Transform.lowrank`:
    PowerSGD) with its values stored as they are (``none``), no select or byte stage: its
    frames' headers are the layout's (each tensor's one section counts its values or its
    ``r (n + m)`` coefficients), so its decoding is replayed, and its encoding
    (:func:`encode_lowrank`)."""
    return c.transform is not None and c.transform.lowrank and c.value.name == "none" and c.select is None and not c.post


def decode_run(plan, payload, addrs, views, check=None) -> bool:
    """A quantizer's run: read at once through the plan's run layout
    (:meth:`codec.stages.value.quantizer.Quantizer.read_planned`, which checks every
    section as ``read_run`` does) and decoded into each array where it lies
    (``write_segments``); False for a section it refuses or a run its kernel does not write
    directly.  ``check``: the frame's payload check, which the decode notes the codes' CRC in
    and tests their fields for (the caller verifies it)."""
    value = plan.codec.value
    try:
        got = value.read_planned(payload, plan.run, check is not None)
    except CorruptFrameError:
        return False
    return got is not None and value.write_segments(got, views, SET, check, addrs)


def decode_keyed(plan, payload, addrs, views) -> bool:
    """A keyed sparse frame: every tensor's key read and checked (the stage's ``keys_at``;
    each tensor's count of positions must be the plan's: its values sections' length), the
    kept values gathered from their sections, every tensor's positions drawn and the values
    written at them into each array where it lies with one kernel call (``scatter_keyed``);
    False for a key the stage refuses or a count that is not the plan's.  The keys that
    passed last are kept with the arrays they gave (``plan.memo``): the same key bytes again
    (the next frame at the same step) are not checked again."""
    select = plan.codec.select
    raw = payload[plan.keyspots].tobytes()  # (every tensor's key: seed, step, key hash)
    memo = plan.memo
    if memo is not None and memo[0] == raw:  # the keys checked before (a step of a training loop): their arrays again
        keys = memo[1]
    else:
        try:
            kstarts, keys = select.keys_at(payload, *plan.keys)
        except CorruptFrameError:
            return False
        if kstarts.tolist() != plan.kstarts.tolist():
            return False
        plan.memo = (raw, keys)
    kept = _spots(plan, payload)
    kept.flags.writeable = False
    select.scatter_keyed(kept, plan.kstarts, keys, plan.keys[1], addrs, plan.starts, plan.like, SET)
    return True


def _spots(plan, payload):
    """A keyed frame's kept values, gathered from their sections in ``payload`` (every
    section is whole items: a key is 24 bytes) by the ``scatter`` family's kernel: the
    payload follows a header of any length, so its items are seldom aligned, and NumPy's
    gather of BERT-base's 1.1M unaligned float32 items took 5.5 ms against 0.9 aligned."""
    kept = np.empty(plan.spots.size, plan.dtype)
    backend("scatter", kept).gather(payload.view(plan.dtype), plan.spots, kept)
    return kept


def decode_pairs(plan, frame, addrs) -> bool:
    """A sparse frame of index sections and raw values (a plan with ``pairs``: top-k,
    gaussian-k, DGC, threshold with their values as they are): the sections its header
    gives each tensor read from the bytes after the layout (``pairs.pair_sections``, which
    refuses what the parser would not read as it does), the header's CRC and the payload's
    CRC-32C checked, then every index section read and checked and every pair written into
    its array where it lies with one ``index_scatter_segments`` call (what
    ``manydecode._pairs_at_once`` does once the frame is parsed); False, nothing written,
    for anything refused (the general path then names it)."""
    import zlib


    at, sizes, derived, _ = plan.pairs
    bits = plan.dtype.itemsize * 8
    data = np.frombuffer(frame, np.uint8)
    data.flags.writeable = False
    count = sizes.size
    table = np.empty((count, 5), np.int64)
    values_at = np.empty(count, np.int64)
    counts = np.empty(count, np.int64)
    hl = module("pairs").pair_sections(data, at, sizes, derived, plan.crc, bits, table, values_at, counts)
    if hl < 0 or zlib.crc32(memoryview(frame)[: hl - _CRC.size]) != _CRC.unpack_from(frame, hl - _CRC.size)[0]:
        return False
    payload = data[hl:]
    if plan.crc and crc32c(payload) != _CRC.unpack_from(frame, hl - 2 * _CRC.size)[0]:
        return False
    table.flags.writeable = values_at.flags.writeable = counts.flags.writeable = False  # (kernels take their inputs read-only)
    return module("scatter").index_scatter_segments(payload, table, values_at, counts, addrs, plan.starts, plan.like) < 0


def encode_keyed(plan, views, step: int) -> bytes | None:
    """A keyed sparse frame's ``encode_many`` replayed (random-k, unscaled values as they
    are): the learned header, then in the payload each tensor's key (the codec's seed, the
    step, the key hash) and its values at the positions its key draws, every tensor's drawn
    with one kernel call (``random_positions_segments``) and gathered straight into the
    frame; None when the step keeps other counts than the plan's, or a kept value is not
    finite (the general path then names it)."""
    select = plan.codec.select
    at, sizes, _ = plan.keys
    kstarts = plan.kstarts
    if select.counts(sizes, step).tolist() != np.diff(kstarts).tolist():
        return None
    khash = key_hash(None)  # (a plain call's tensors have no keys)
    count = sizes.size
    pos = np.empty(int(kstarts[-1]), np.int64)
    if pos.size:
        steps = np.full(count, step % (1 << 64), np.uint64)
        backend("randomk", pos).random_positions_segments(pos, kstarts, sizes, np.full(count, select.seed, np.uint64), np.full(count, khash, np.uint64), steps)
    frame, out = new_bytes(plan.size)
    hl = plan.header_len
    payload = out[hl:]
    payload[at[:, None] + np.arange(24)] = np.array([select.seed, step, khash], "<u8").view(np.uint8)  # every key
    kept = np.empty(pos.size, plan.dtype)
    o = kstarts.tolist()
    for t in plan.kept:
        np.take(views[t].reshape(-1), pos[o[t] : o[t + 1]], out=kept[o[t] : o[t + 1]])
    if not np.isfinite(kept).all():
        return None
    backend("scatter", kept).put(kept, plan.spots, payload.view(plan.dtype))  # (every section is whole items: a key is 24 bytes; _spots)
    crc = crc32c(payload) if plan.crc else None
    plan.close(out, crc)
    return frame


def encode_selected(plan, views, step: int) -> bytes | None:
    """A sparse ``encode_many`` replayed (:func:`selected`): the tensors laid end to end in
    a reused buffer and selected in one call (the select stage's ``select_segments``, with
    their contexts at ``step``: a schedule holds), every kept value coded at once (the value
    stage's ``encode_kept``), then the header of the step's sections (the frame builder's,
    :func:`codec.manyframe.build.head_of`, which keeps the recent ones) and the payload as a
    run writes it (:func:`codec.runs.sparse_piece`: each tensor's index section, then its
    values), and its CRC-32C.  None when a stage declines the run or a value refuses (a NaN
    or inf: the general path then names it)."""
    c = plan.codec
    starts, layout, names = plan.selected
    flat = scratch(plan.count, plan.dtype)
    np.concatenate([v.reshape(-1) for v in views], out=flat)
    ctxs = [Context(shape, plan.dtype, step=step, name=w) for shape, w in zip(plan.shapes, names)]
    if plan.pairs is not None:  # index sections and values as they are: the frame written from the finds
        finds = c.select.find_segments(flat, starts, ctxs)
        if finds is None:
            return None
        if finds[3] is None:  # (the kept values are read where the finds point; AdaComp's come with them)
            return _encode_pairs(plan, flat, finds)
        picked = segments_picked(flat, starts, *finds)
    else:
        picked = c.select.select_segments(flat, starts, ctxs)
    if picked is None:
        return None
    _, kstarts, values, index = picked
    kept = c.value.encode_kept(values, kstarts, ctxs)
    if kept is None:
        return None
    entries, piece = sparse_piece(index, *kept)
    flag = FLAG_PAYLOAD_CRC32C if plan.crc else 0
    prefix, hl, payload_len = head_of(c.spec, layout, tuple(map(tuple, entries)), flag)
    frame, out = new_bytes(hl + payload_len)
    payload = out[hl:]
    try:
        piece.fill(payload)
    except CodecError:  # (a NaN under nonfinite=raise: the general path names its tensor)
        return None
    close_header(bytearray(prefix), out, hl, flag, None, crc32c(payload) if plan.crc else None)
    return frame


def feedback_pairs(plan, flat, ctxs):
    """An error-feedback step of a codec whose frames are pairs replayed (a plan with
    ``pairs``; every tensor of its layout in one run): ``flat`` the run's ``acc = x +
    residual`` laid end to end, ``ctxs`` its tensors' contexts (each key's step).  The select
    stage's finds in it (``find_segments``) written as the frame (:func:`_encode_pairs`),
    and the positions sent, counted from the run's first element
    (:func:`codec.stages.select.magnitude.run_positions`): the frame holds ``acc``'s values
    there as they are, so ``acc - decoded`` is ``acc`` with +0.0 there (``v - v`` of a finite
    ``v``; a NaN or inf makes the finds None).  Returns ``(frame, positions)``, or None (the
    general path then takes the step)."""
    starts = plan.selected[0]
    finds = plan.codec.select.find_segments(flat, starts, ctxs)
    if finds is None or finds[3] is not None:
        return None
    frame = _encode_pairs(plan, flat, finds)
    return None if frame is None else (frame, run_positions(starts, *finds[:3]))


def _encode_pairs(plan, flat, finds) -> bytes | None:
    """:func:`encode_selected` of a codec whose frames are pairs (a plan with ``pairs``: each
    tensor's index section, then its kept values as they are): the select stage's finds
    (``find_segments``' ``(room, pos, counts, None)``) written as the payload with one
    ``pairs.pair_payload`` call, which also gives every tensor's sections, and the header's
    patterns and counts after the layout's bytes with one ``pair_head`` call; the bytes ``select_segments``,
    ``encode_kept``, ``sparse_piece`` and ``head_of`` give, without their Python per step.
    None when a set's gaps need more than 56 bits (the general path then codes it)."""
    room, pos, counts, _ = finds
    kern = module("pairs")
    table = np.empty((counts.size, 6), np.int64)
    payload = np.empty(plan.pairs[3] + int(counts.sum()) * plan.dtype.itemsize, np.uint8)
    size = kern.pair_payload(flat, plan.selected[0], pos, room, counts, payload, table)
    head = np.empty(12 + 25 * counts.size, np.uint8)
    used = kern.pair_head(table, head) if size >= 0 else -1
    if used < 0:
        return None
    head = bytearray(plan.prefix) + head[:used].tobytes()
    hl = len(head) + (8 if plan.crc else 4)
    frame, out = new_bytes(hl + size)
    out[hl:] = payload[:size]
    close_header(head, out, hl, FLAG_PAYLOAD_CRC32C if plan.crc else 0, None, crc32c(out[hl:]) if plan.crc else None)
    return frame


def encode_lowrank(plan, found, step: int) -> bytes | None:
    """A PowerSGD ``encode_many`` replayed (:func:`lowrank`): the frame of
    :func:`_power_frame`, every matrix's power iteration from the ``Q`` a step without error
    feedback starts from (:func:`~codec.stages.transform.powersgd.start_q` with no warm
    ``Q``: the same every step with ``warm_start``, so the plan keeps them), the other
    tensors' values copied.  None when a matrix holds a NaN or inf (the general path then
    names it)."""
    addrs, tensors = found

    def passed(values):
        for t, a, b in plan.values:
            np.copyto(values[a:b], tensors[t].reshape(-1))

    got = _power_frame(plan, addrs, lambda: _starting_qs(plan, step), passed)
    return None if got is None else got[0]


def feedback_lowrank(plan, arrays, slots):
    """An error-feedback step of PowerSGD replayed (a plan with ``matrices``, learned from a
    frame of this layout; ``arrays`` the step's gradients in layout order, ``slots`` their
    keys' slots), each pass one kernel call for every tensor (the ``feedstep`` family):
    every ``acc = x + residual`` formed in its slot's spare (``add_segments``); the frame of
    :func:`_power_frame` over them, every matrix's power iteration from its key's starting
    ``Q`` (:func:`_warm_qs`), the other tensors' ``acc`` copied into it and subtracted from
    themselves (``pass_segments``); then every matrix's ``acc -= P Q^T`` in one pass
    (``lowrank.expand_segments`` with SUB).  Bit for bit the general step of each tensor.
    Returns ``(frame, accs, states)``, each tensor's new residual and stage state, which the
    caller installs; None (nothing installed, the spares' contents the only change) when
    the arrays are not what the plan was learned from, a residual or spare is not a plain
    C-contiguous array of the dtype, or a matrix holds a NaN or inf (the general path then
    names it)."""
    dt = plan.dtype
    if dt not in (np.float32, np.float64) or len(slots) != len(plan.shapes):
        return None
    found = plan._addresses(arrays, False)
    if found is None:
        return None
    accs, residuals = [s.take_spare() for s in slots], [s.residual for s in slots]
    for a in accs + residuals:
        if type(a) is not np.ndarray or a.dtype != dt or not a.flags.c_contiguous:
            return None
    steps = module("feedstep")
    at = addresses(accs)
    steps.add_segments(found[0], addresses(residuals), at, plan.starts, plan.like)
    vt, vstarts, vrun = plan.passing

    def passed(values):
        if vt.size:
            steps.pass_segments(values, vstarts, readonly(at[vt]), vrun, plan.like)

    got = _power_frame(plan, at, lambda: _warm_qs(plan, slots), passed)
    if got is None:
        return None
    frame, values = got
    index, firsts, ns, ms, rs = plan.matrices
    if index.size:
        backend("lowrank", plan.like).expand_segments(readonly(values), firsts, ns, ms, rs, readonly(at[index]), plan.like, SUB)
    states = [dict(s.state) for s in slots]
    if plan.codec.transform.warm_start:
        for t, v, n, m, r in zip(*(col.tolist() for col in plan.matrices)):
            states[t][STATE_Q] = values[v + n * r : v + (n + m) * r].reshape(m, r).copy()
    return frame, accs, states


def _power_frame(plan, addrs, starts, passed):
    """The frame of a low-rank plan's step: every matrix's power iteration (tensor ``t`` the
    array at ``addrs[t]``) in one ``power_segments`` call (bit for bit ``project``,
    ``orthogonalize`` and ``back_project`` of each) from ``starts()`` (the starting ``Q``s
    laid out, ``(qts, qstarts, guard)`` as :func:`_laid_out` gives them; asked only when the
    layout has a matrix), the other tensors' values written by ``passed(values)``, under the
    layout's header and the payload's CRC-32C.  Returns ``(frame, values)`` (the payload's
    coefficients, in the plan's dtype), or None when a matrix holds a NaN or inf."""
    index, firsts, ns, ms, rs = plan.matrices
    frame, out = new_bytes(plan.size)
    payload = out[plan.header_len :]
    values = payload.view(plan.dtype)  # (every section is whole items of the dtype: Replay)
    if index.size:
        picked = readonly(addrs[index])
        qts, qstarts, tiny = starts()
        if backend("lowrank", plan.like).power_segments(values, picked, plan.like, firsts, ns, ms, rs, qts, qstarts, LANES, tiny):
            return None
    passed(values)
    plan.close(out, crc32c(payload) if plan.crc else None)
    return frame, values


def _laid_out(plan, qs):
    """Starting ``Q``s as ``power_segments`` takes them: transposed and laid end to end
    (read-only), their offsets (the plan's ``qstarts``), and ``orthogonalize``'s epsilon
    guard for the plan's dtype."""
    qts = readonly(np.concatenate([q.T.reshape(-1) for q in qs] or [np.empty(0, plan.dtype)]))
    return qts, plan.qstarts, tiny(plan.dtype)


def _warm_qs(plan, slots):
    """Every matrix's starting ``Q`` of an error-feedback step, laid out as :func:`_laid_out`
    lays them: what :func:`~codec.stages.transform.powersgd.start_q` gives each from its
    key's state.  With ``warm_start``, every last ``Q`` that is a C-contiguous array of the
    matrix's shape and dtype is orthonormalised in one ``warm_starts`` call; ``start_q``
    itself gives the others and those that came out with a zero column (it then draws
    them)."""
    index, _, _, ms, rs = plan.matrices
    tr, dt = plan.codec.transform, plan.dtype
    rows = list(zip(index.tolist(), ms.tolist(), rs.tolist()))
    lasts = [slots[t].state.get(STATE_Q) for t, _, _ in rows]
    if not tr.warm_start:
        return _laid_out(plan, [start_q(q, m, r, dt, tr.seed, slots[t].key, slots[t].step, False) for q, (t, m, r) in zip(lasts, rows)])
    qstarts, guard = plan.qstarts, tiny(dt)
    warm = np.zeros(len(rows), np.int64)
    for k, (q, (_, m, r)) in enumerate(zip(lasts, rows)):
        if type(q) is np.ndarray and q.shape == (m, r) and q.dtype == dt and q.flags.c_contiguous:
            warm[k] = q.ctypes.data
    qts = np.empty(int(qstarts[-1]), dt)
    redo = (warm == 0) | (module("feedstep").warm_starts(readonly(warm), plan.like, ms, rs, qts, qstarts, guard) != 0)
    for k in np.flatnonzero(redo).tolist():
        t, m, r = rows[k]
        qts[qstarts[k] : qstarts[k + 1]] = start_q(lasts[k], m, r, dt, tr.seed, slots[t].key, slots[t].step, True).T.reshape(-1)
    return readonly(qts), qstarts, guard


def _starting_qs(plan, step: int):
    """Every matrix's starting ``Q`` of a step without error feedback, laid out
    (:func:`_laid_out`); kept in the plan with ``warm_start`` (the same every step)."""
    if plan.power is not None:
        return plan.power
    tr = plan.codec.transform
    _, _, ns, ms, rs = plan.matrices
    got = _laid_out(plan, [start_q(None, m, r, plan.dtype, tr.seed, None, step, tr.warm_start) for m, r in zip(ms.tolist(), rs.tolist())])
    if tr.warm_start:
        plan.power = got
    return got


def decode_lowrank(plan, payload, addrs, views) -> bool:
    """A low-rank frame (each tensor's section its values, or its matrix's ``P`` then
    ``Q``): every matrix's ``P Q^T`` formed into its array with one ``expand_segments`` call
    reading its coefficients where the payload holds them (bit for bit the general path's
    ``lowrank.expand``), every other tensor's values copied into its array."""
    index, firsts, ns, ms, rs = plan.matrices
    values = payload.view(plan.dtype)  # (every section is whole items of the dtype: Replay)
    for t, a, b in plan.values:
        np.copyto(views[t].reshape(-1), values[a:b])
    if index.size:
        picked = addrs[index]
        picked.flags.writeable = False
        backend("lowrank", plan.like).expand_segments(values, firsts, ns, ms, rs, picked, plan.like)
    return True
