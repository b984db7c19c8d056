"""Native CPU kernels for decoding, built from C on the machine that uses them.

- :func:`beam_attention`: decoder self-attention over a key/value cache that the beam
  never copies (:class:`seqtrans.attention.cache.BeamKVCache`). PyTorch has no
  operator that attends through per-position row indices without first gathering the
  keys and values into a new tensor, which costs as much as the copy it replaces.
- :func:`quantize_rows` and :func:`dequantize`: the float passes around an int8 product
  (:class:`seqtrans.linear.int8.Int8Linear`), one pass each instead of PyTorch's five or
  six operators, giving the same bits as those.
- :func:`int8_product`: the exact int32 product of rows of unsigned bytes with an int8
  weight in its own layout, each block of weight rows read once for all the rows
  (AVX-512 VNNI or AVX2: :func:`int8_product_available`; with AVX2, a batch's many rows
  in tiles of rows by weight rows whose sums stay in registers); :func:`int8_linear`: a
  whole int8 layer for float rows in one call, those three passes.
- :func:`packed_linear_unchecked`: a float32 layer's product for a decoding step's few rows, reading
  the weight where oneDNN packed it and summing as oneDNN's kernel sums, the same bits
  without the tens of microseconds oneDNN's call costs before it multiplies.
- :func:`rms_norm`: RMSNorm (T5's) in one call, the mean of squares summed in the order
  PyTorch's CPU sum takes, so the same bits as ``F.rms_norm``, whose seven operators cost
  more to call than the pass at a decoding step's few rows.
- :func:`layer_norm`: LayerNorm in one call, its sums in a fixed order of its own (not
  ``F.layer_norm``'s bits: the int8 decoding copies use it in every path,
  :class:`seqtrans.model.norms.NativeLayerNorm`).
- :func:`topk_rows`: the few largest of each long row (beam search's candidates), in one
  pass that compares a block of elements with the k-th best so far at once, where
  ``torch.topk`` took a fifth of a small model's beam search.
- :func:`decoder_step`: a decoder's whole stack of int8 or packed float32 layers for a step's new position,
  in one call of the kernels above (:mod:`seqtrans.linear.native_step`), the same bits as
  the layers' own calls of them; :func:`decoder_sublayer`, one sub-layer of it, for layers
  whose norms only PyTorch computes with their bits (LayerNorm).
- :func:`beam_candidates`: each hypothesis's best extensions straight from a step's logits,
  its log-softmax, prefix, exclusions and top-k per row while the row is in the cache,
  without the [rows, vocabulary] scores that a large vocabulary's batch spends most of a
  step writing and reading back.

The source ships with the package (``kernels.c``) and is compiled the first time
a process needs it, with ``$CC`` (else ``cc``; ``$CC`` may carry arguments, split as a
shell would: ``CC="gcc -O2"``), ``-march=native`` and OpenMP where the
compiler takes them (:data:`OPTIONAL_FLAGS`), into the cache
directory (:func:`seqtrans.runtime.download.cache_dir`, under ``native/``), keyed by the
source, the compiler, its flags and the processor's features, so a copy built for
another machine is never loaded. It is written to a temporary name and renamed, so
concurrent processes never load half a file. A compile that runs past
:data:`BUILD_TIMEOUT_S` is stopped. A build that fails leaves a ``.failed`` file
beside where the library would be, keyed the same way, holding the compiler's
message, so that later processes do not compile again; delete it to retry. Where no
compiler works, or with ``SEQTRANS_NATIVE=0``, :func:`available` is False and decoding
uses PyTorch's operators alone: the same scores to float rounding, only slower.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shlex
import shutil
import subprocess
import tempfile
import threading
import weakref
from importlib import resources
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from seqtrans.runtime import buffers, environment
from seqtrans.runtime.download import cache_dir
from seqtrans.runtime.system import cpu_features

log = logging.getLogger(__name__)

SOURCE = "kernels.c"
# no reassociation or contraction of float arithmetic: the quantization kernels must give
# PyTorch's bits (kernels.c vectorizes its sums by hand)
FLAGS = ("-O3", "-fno-trapping-math", "-ffp-contract=off", "-shared", "-fPIC")
# tried in turn: the processor's own instructions and OpenMP (whose libgomp.so.1 is the
# one PyTorch has loaded, so the kernels share its running threads), then without each
OPTIONAL_FLAGS = (("-march=native", "-fopenmp"), ("-fopenmp",), ())
#: Seconds one compile may take before it is stopped (and counted as failed).
BUILD_TIMEOUT_S = 120.0

_lock = threading.Lock()
_library: ctypes.CDLL | None = None
_failed: str | None = None
# loaded library -> whether it has the int8 product; weak, so that a library let go (a test's
# other build) is forgotten rather than its id taken by the next one's
_int8_products: weakref.WeakKeyDictionary[ctypes.CDLL, bool] = weakref.WeakKeyDictionary()
_packed_linears: weakref.WeakKeyDictionary[ctypes.CDLL, bool] = weakref.WeakKeyDictionary()


def available() -> bool:
    """Whether the kernels can be used here: allowed (``SEQTRANS_NATIVE``) and built."""
    return environment.native_kernels() and _load() is not None


def unavailable_reason() -> str | None:
    """Why :func:`available` is False after a failed build, or None."""
    return _failed


def compiler() -> list[str]:
    """The C compiler's command: ``$CC`` split as a shell would, else ``cc`` or ``gcc``
    from the ``PATH`` (an empty list where there is none)."""
    if environment.c_compiler():
        return shlex.split(environment.c_compiler())
    found = shutil.which("cc") or shutil.which("gcc")
    return [found] if found else []


class BuildTimeout(OSError):
    """The compiler ran past :data:`BUILD_TIMEOUT_S`."""


def _key(*parts: str | bytes) -> str:
    """A short digest of ``parts``: the name of a build in the cache."""
    data = b"\0".join(p if isinstance(p, bytes) else p.encode() for p in parts)
    return hashlib.sha256(data).hexdigest()[:20]


def _build(command: list[str], source: Path, flags: tuple[str, ...]) -> Path:
    """The compiled library of ``source`` with ``flags``, from the cache or built now."""
    key = _key(source.read_bytes(), " ".join(command), " ".join(flags), cpu_features())
    target = cache_dir() / "native" / f"{source.stem}-{key}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    os.close(fd)
    try:
        try:
            done = subprocess.run([*command, *flags, str(source), "-o", tmp, "-lm"], capture_output=True,
                                  text=True, timeout=BUILD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise BuildTimeout(f"{shlex.join(command)} ran past {BUILD_TIMEOUT_S:g} s") from None
        if done.returncode != 0:
            raise OSError(f"{shlex.join(command)} failed: {done.stderr.strip()[-500:]}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def failure_marker(command: list[str], source: Path) -> Path:
    """Where a failed build of ``source`` with ``command`` on this processor is remembered."""
    key = _key(source.read_bytes(), " ".join(command), cpu_features())
    return cache_dir() / "native" / f"{source.stem}-{key}.failed"


def _build_any(command: list[str], source: Path) -> Path:
    """:func:`_build` with the first of :data:`OPTIONAL_FLAGS` the compiler takes; an
    OSError when none builds, or when an earlier process's build failed (its marker)."""
    marker = failure_marker(command, source)
    if marker.exists():
        reason = marker.read_text(encoding="utf-8", errors="replace").strip()
        raise OSError(f"an earlier build failed ({reason}); delete {marker} to try again")
    for extra in OPTIONAL_FLAGS:
        try:
            return _build(command, source, FLAGS + extra)
        except FileNotFoundError:
            raise  # no such compiler: nothing to remember
        except BuildTimeout as e:
            error: OSError = e
            break  # the other flags would take as long
        except OSError as e:
            error = e
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(str(error), encoding="utf-8")
    raise error


_P, _I, _F, _C = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_int
# each kernel's result and argument types, as kernels.c declares them
_SIGNATURES: dict[str, tuple[Any, list[Any]]] = {
    "seqtrans_beam_attention": (_C, [_P] * 7 + [_I] * 7 + [_F, _I]),
    "seqtrans_quantize_rows": (None, [_P, _I, _I, _I, _P, _P, _I, _I]),
    "seqtrans_dequantize": (None, [_P] * 6 + [_I] * 5),
    "seqtrans_int8_product_available": (_C, []),
    "seqtrans_int8_product": (None, [_P] * 3 + [_I] * 4),
    "seqtrans_int8_linear": (_C, [_P, _I, _I, _I, _P, _I, _P, _P, _P, _I, _I, _P, _I]),
    "seqtrans_packed_linear_available": (_C, []),
    "seqtrans_packed_linear": (None, [_P, _I, _I, _I, _P, _I, _P, _I, _P, _I, _I]),
    "seqtrans_rms_norm": (_C, [_P, _I, _I, _I, _P, _F, _I, _P, _I, _I]),
    "seqtrans_layer_norm": (None, [_P, _I, _I, _I, _P, _P, _F, _P, _I, _I]),
    "seqtrans_topk_rows": (_C, [_P, _I, _I, _I, _I, _P, _P, _I]),
    "seqtrans_decoder_step_available": (_C, []),
    "seqtrans_decoder_step": (_C, [_P, _P, _P, _I, _I, _P, _I]),
    "seqtrans_decoder_sublayer": (_C, [_P, _P, _I, _P, _P, _I, _I, _P, _I]),
    "seqtrans_beam_candidates": (_C, [_P, _I, _I, _I, _P, _I, _P, _I, *[_P] * 6, _I]),
}


def _load() -> ctypes.CDLL | None:
    global _library, _failed
    if _library is not None or _failed is not None:
        return _library
    with _lock:
        if _library is not None or _failed is not None:
            return _library
        command = compiler()
        try:
            if not command:
                raise OSError("no C compiler ($CC, cc or gcc)")
            with resources.as_file(resources.files(__package__) / SOURCE) as source:
                path = _build_any(command, source)
            library = ctypes.CDLL(str(path))
            for name, (result, arguments) in _SIGNATURES.items():
                function = getattr(library, name)
                function.restype, function.argtypes = result, arguments
        except (OSError, AttributeError) as e:
            _failed = str(e)
            log.warning("native decoding kernels unavailable (%s): decoding uses PyTorch operators only", e)
            return None
        _library = library
        return library


def _library_or_raise() -> ctypes.CDLL:
    library = _load()
    if library is None:
        raise RuntimeError(f"native kernels unavailable: {_failed}")
    return library


def beam_attention(q: Tensor, k: Tensor, v: Tensor, rows: Tensor, length: int, *, group: int = 1,
                   lengths: Tensor | None = None, scale: float | None = None,
                   bias: Tensor | None = None) -> Tensor:
    """Attention of one query per hypothesis over the first ``length`` positions, each
    read from the buffer row ``rows`` names: q [N, H, d]; k, v [P, H, L_max, d] (float32,
    contiguous, on the CPU); rows [N, >= length] int64 (contiguous rows) -> [N, H, d].
    Logits scaled by ``scale``, by default 1/sqrt(d). ``lengths`` [N] int64 (1 .. ``length``):
    each hypothesis's own number of positions instead (a padded source). ``group``: how many consecutive
    hypotheses belong to one sentence (the beam), which sets only the order of the work.
    ``bias`` [H, length] float32 (contiguous): added to every hypothesis's logits (a
    relative position bias). A hypothesis gets the same bits whatever the other rows.
    Only when :func:`available`."""
    _library_or_raise()
    n, heads, dim = q.shape
    if not (q.dtype == k.dtype == v.dtype == torch.float32 and rows.dtype == torch.int64):
        raise TypeError("beam_attention takes float32 queries, keys and values and int64 rows")
    if not (q.is_contiguous() and k.is_contiguous() and v.is_contiguous() and rows.stride(1) == 1):
        raise ValueError("beam_attention takes contiguous tensors")
    if k.shape != v.shape or k.size(1) != heads or k.size(3) != dim or rows.size(0) != n:
        raise ValueError(f"beam_attention: queries {tuple(q.shape)}, keys {tuple(k.shape)}, "
                         f"values {tuple(v.shape)}, rows {tuple(rows.shape)} do not match")
    if length < 1 or length > min(k.size(2), rows.size(1)):
        raise ValueError(f"beam_attention: length {length} outside 1..{min(k.size(2), rows.size(1))}")
    used = rows[:, :length]
    if n and (int(used.min()) < 0 or int(used.max()) >= k.size(0)):  # the kernel reads where they point
        raise ValueError(f"beam_attention: rows outside the {k.size(0)} buffer rows")
    if lengths is not None:
        if lengths.dtype != torch.int64 or lengths.shape != (n,) or not lengths.is_contiguous():
            raise ValueError(f"beam_attention: lengths {tuple(lengths.shape)} {lengths.dtype} for {n} rows")
        if n and (int(lengths.min()) < 1 or int(lengths.max()) > length):
            raise ValueError(f"beam_attention: lengths outside 1..{length}")
    if bias is not None and (bias.dtype != torch.float32 or bias.shape != (heads, length)
                             or not bias.is_contiguous()):
        raise ValueError(f"beam_attention: bias {tuple(bias.shape)} {bias.dtype} for {heads} heads and "
                         f"{length} positions (contiguous float32)")
    return beam_attention_unchecked(q, k, v, rows, length, group=group, lengths=lengths, scale=scale,
                                    bias=bias)


def beam_attention_unchecked(q: Tensor, k: Tensor, v: Tensor, rows: Tensor, length: int, *, group: int = 1,
                             lengths: Tensor | None = None, scale: float | None = None,
                             bias: Tensor | None = None) -> Tensor:
    """:func:`beam_attention` for arguments its caller built to be as it wants (a cache's
    own rows and a source's own lengths), without its checks: reading the rows' and the
    lengths' extremes back is four reductions a layer would pay at every step."""
    n, heads, dim = q.shape
    out = torch.empty_like(q)
    status = _library_or_raise().seqtrans_beam_attention(
        q.data_ptr(), k.data_ptr(), v.data_ptr(), rows.data_ptr(),
        None if lengths is None else lengths.data_ptr(), None if bias is None else bias.data_ptr(),
        out.data_ptr(), n, heads, dim, length,
        k.size(2), rows.stride(0), group, dim ** -0.5 if scale is None else scale, torch.get_num_threads())
    if status != 0:
        raise MemoryError("beam_attention could not allocate its working memory")
    return out


def quantize_rows(x: Tensor, *, unsigned: bool) -> tuple[Tensor, Tensor]:
    """:func:`seqtrans.linear.int8.quantize_rows` in one pass, the same bits:
    x [M, K] float32 (rows contiguous) -> (x_q [M, K] int8 or uint8, scale [M, 1] float32)."""
    library = _library_or_raise()
    if x.dtype != torch.float32 or x.dim() != 2 or x.stride(1) != 1:
        raise ValueError("quantize_rows takes a float32 matrix with contiguous rows")
    m, k = x.shape
    q = torch.empty(m, k, dtype=torch.uint8 if unsigned else torch.int8)
    scale = torch.empty(m, 1, dtype=torch.float32)
    library.seqtrans_quantize_rows(x.data_ptr(), m, k, x.stride(0), q.data_ptr(), scale.data_ptr(),
                                   int(unsigned), torch.get_num_threads())
    return q, scale


def dequantize(acc: Tensor, row_scale: Tensor, col_scale: Tensor, *, compensation: Tensor | None = None,
               bias: Tensor | None = None, relu: bool = False, bias_after: bool = False) -> Tensor:
    """((acc - compensation) * row_scale) * col_scale + bias (one fused multiply-add, or with
    ``bias_after`` the bias added in a rounding of its own, as to a layer's output) in
    one pass, then ``relu`` if asked, the same bits as those PyTorch operators, written over
    ``acc`` (the same size: no new tensor, whose fresh pages would cost more than the
    pass): acc [M, O] int32, row_scale [M, 1], col_scale [O], compensation [O] int32, bias
    [O] float32 (all contiguous) -> [M, O] float32, ``acc``'s storage."""
    library = _library_or_raise()
    m, o = acc.shape
    parts = [(acc, torch.int32), (row_scale, torch.float32), (col_scale, torch.float32),
             (compensation, torch.int32), (bias, torch.float32)]
    if any(t is not None and (t.dtype != dtype or not t.is_contiguous()) for t, dtype in parts):
        raise ValueError("dequantize takes contiguous int32 products and compensation, and float32 "
                         "scales and bias")
    per_column = [t for t in (col_scale, compensation, bias) if t is not None]
    if row_scale.numel() != m or any(t.numel() != o for t in per_column):
        raise ValueError(f"dequantize: a product of {m} x {o} with scales of {row_scale.numel()} and "
                         f"{col_scale.numel()}")
    out = acc.view(torch.float32)
    library.seqtrans_dequantize(acc.data_ptr(), None if compensation is None else compensation.data_ptr(),
                                row_scale.data_ptr(), col_scale.data_ptr(),
                                None if bias is None else bias.data_ptr(), out.data_ptr(), m, o,
                                int(relu), int(bias_after), torch.get_num_threads())
    return out


def int8_product_available() -> bool:
    """Whether :func:`int8_product` is built here (the processor has AVX-512 VNNI or AVX2)."""
    return environment.native_kernels() and built_with_int8_product()


def built_with_int8_product() -> bool:
    """Whether the library as loaded has :func:`int8_product`, whatever ``SEQTRANS_NATIVE``
    says now (for a caller that has just asked :func:`available`)."""
    library = _load()
    if library is None:
        return False
    known = _int8_products.get(library)  # asked once per library: a layer asks every call
    if known is None:
        known = _int8_products[library] = bool(library.seqtrans_int8_product_available())
    return known


def int8_product(x: Tensor, w: Tensor) -> Tensor:
    """``x @ w.T`` in int32, exact: x [M, K] uint8, w [O, K] int8 (rows contiguous, on the
    CPU) -> [M, O] int32, as ``torch._int_mm(x, w.t())``. Only when
    :func:`int8_product_available`."""
    library = _library_or_raise()
    if not built_with_int8_product():
        raise RuntimeError("int8_product needs AVX-512 VNNI or AVX2, which this build lacks")
    if (x.dtype != torch.uint8 or w.dtype != torch.int8 or x.dim() != 2 or w.dim() != 2
            or not x.is_contiguous() or not w.is_contiguous() or x.device.type != "cpu"
            or w.device.type != "cpu"):
        raise ValueError("int8_product takes contiguous uint8 rows and an int8 weight on the CPU")
    if x.size(1) != w.size(1):
        raise ValueError(f"int8_product: rows of {x.size(1)} against a weight of {tuple(w.shape)}")
    out = torch.empty(x.size(0), w.size(0), dtype=torch.int32)
    if out.numel():
        library.seqtrans_int8_product(x.data_ptr(), w.data_ptr(), out.data_ptr(), x.size(0), x.size(1),
                                      w.size(0), torch.get_num_threads())
    return out


def int8_linear(x: Tensor, w: Tensor, col_scale: Tensor, *, compensation: Tensor, bias: Tensor | None = None,
                relu: bool = False, bias_after: bool = False) -> Tensor:
    """:func:`quantize_rows` (unsigned), :func:`int8_product` and :func:`dequantize` in one
    call, the same bits: x [M, K] float32 (rows contiguous), w [O, K] int8, col_scale [O],
    compensation [O] int32 (128 times each weight row's sum), bias [O] float32 or None
    (``bias_after`` as :func:`dequantize` takes it) -> [M, O] float32. Only when
    :func:`int8_product_available`."""
    _library_or_raise()
    if not built_with_int8_product():
        raise RuntimeError("int8_linear needs AVX-512 VNNI or AVX2, which this build lacks")
    if x.dim() != 2 or w.dim() != 2 or x.device.type != "cpu" or w.device.type != "cpu":
        raise ValueError(f"int8_linear takes a matrix of rows and a weight matrix on the CPU, not "
                         f"{tuple(x.shape)} on {x.device} and {tuple(w.shape)} on {w.device}")
    k, o = x.size(1), w.size(0)
    if (x.dtype != torch.float32 or x.stride(1) != 1 or w.dtype != torch.int8 or not w.is_contiguous()
            or w.size(1) != k or col_scale.dtype != torch.float32 or compensation.dtype != torch.int32
            or (bias is not None and (bias.dtype != torch.float32 or not bias.is_contiguous()
                                      or bias.numel() != o))
            or not col_scale.is_contiguous() or not compensation.is_contiguous()
            or col_scale.numel() != o or compensation.numel() != o):
        raise ValueError(f"int8_linear: rows {tuple(x.shape)} {x.dtype} against a weight {tuple(w.shape)} "
                         f"{w.dtype} with scales, compensation and bias of its {o} outputs")
    return int8_linear_unchecked(x, w, col_scale, compensation=compensation, bias=bias, relu=relu,
                                 bias_after=bias_after)


def int8_linear_unchecked(x: Tensor, w: Tensor, col_scale: Tensor, *, compensation: Tensor,
                          bias: Tensor | None = None, relu: bool = False, bias_after: bool = False) -> Tensor:
    """:func:`int8_linear` for arguments already known to be as it wants (an int8 layer's
    own, with float32 rows), without its checks, which a small layer would pay at every step."""
    m, k = x.shape
    o = w.size(0)
    out = buffers.output(m, o)  # a large vocabulary's logits: in memory kept from the last step
    if out.numel() and _library_or_raise().seqtrans_int8_linear(
            x.data_ptr(), m, k, x.stride(0), w.data_ptr(), o, col_scale.data_ptr(), compensation.data_ptr(),
            None if bias is None else bias.data_ptr(), int(relu), int(bias_after), out.data_ptr(),
            torch.get_num_threads()):
        raise MemoryError("int8_linear could not allocate its working memory")
    return out


#: Outputs side by side in a block of a weight packed as :func:`packed_linear_unchecked` reads it.
PACKED_OUTPUTS = 64


def packed_linear_available() -> bool:
    """Whether :func:`packed_linear_unchecked` is built here (the processor has AVX2 and FMA)."""
    if not environment.native_kernels():
        return False
    library = _load()
    if library is None:
        return False
    known = _packed_linears.get(library)
    if known is None:
        known = _packed_linears[library] = bool(library.seqtrans_packed_linear_available())
    return known


def packed_linear_unchecked(x: Tensor, weight: int, outputs: int, bias: Tensor | None, out: Tensor,
                            column: int, *, relu: bool = False) -> None:
    """``out[:, column:column + outputs] = x @ W.T (+ bias, then max(0, .) with relu)`` for
    x [M, K] float32 (rows contiguous; any M, the fastest way for a few), W the weight
    of ``outputs`` rows at address ``weight`` in oneDNN's packing for AVX2
    (:data:`PACKED_OUTPUTS` outputs side by side at each k, past ``outputs`` padded to a
    whole block), out [M, O] float32 contiguous, bias [outputs] float32 or None. The same
    bits as oneDNN's product where its kernel sums as ``kernels.c`` says, which the caller
    checks (seqtrans.linear.onednn); without checks of its own: a layer calls it at every
    step. Only when :func:`packed_linear_available`."""
    m, k = x.shape
    _library_or_raise().seqtrans_packed_linear(
        x.data_ptr(), m, k, x.stride(0), weight, outputs, None if bias is None else bias.data_ptr(),
        int(relu), out.data_ptr() + column * out.element_size(), out.size(1), torch.get_num_threads())


def rms_norm(x: Tensor, weight: Tensor, eps: float, *, lanes: int) -> Tensor:
    """``(x * (1 / sqrt(mean(x^2) + eps))) * weight`` over the last dimension in one call,
    the mean's sum taken in the order PyTorch's CPU sum takes it with vectors of ``lanes``
    floats (8 with PyTorch's AVX2 kernels): then the same bits as ``F.rms_norm``, which
    :class:`seqtrans.model.norms.RMSNorm` checks before using it. x [..., D] float32 with
    contiguous rows, weight [D] float32 contiguous -> [..., D]."""
    d = x.size(-1)
    if (x.dtype != torch.float32 or weight.dtype != torch.float32 or weight.shape != (d,)
            or not weight.is_contiguous() or x.stride(-1) != 1 or x.device.type != "cpu"):
        raise ValueError(f"rms_norm takes float32 CPU rows [..., {d}] and a contiguous weight [{d}]")
    rows = x.reshape(-1, d)  # a view wherever the rows are evenly spaced
    out = torch.empty(x.shape)
    status = _library_or_raise().seqtrans_rms_norm(rows.data_ptr(), rows.size(0), d, rows.stride(0),
                                                   weight.data_ptr(), eps, lanes, out.data_ptr(), d,
                                                   torch.get_num_threads())
    if status != 0:
        raise ValueError(f"rms_norm: {lanes} lanes is not a vector width it sums in (1..16)")
    return out


def layer_norm(x: Tensor, weight: Tensor, bias: Tensor, eps: float) -> Tensor:
    """``((x - mean) * (1 / sqrt(var + eps))) * weight + bias`` over the last dimension in one
    call, the mean and the variance each summed in one fixed order of its own (``kernels.c``),
    so within float rounding of ``F.layer_norm`` but not its bits. x [..., D] float32 with
    contiguous rows, weight and bias [D] float32 contiguous -> [..., D]."""
    d = x.size(-1)
    if (x.dtype != torch.float32 or weight.dtype != torch.float32 or bias.dtype != torch.float32
            or weight.shape != (d,) or bias.shape != (d,) or not weight.is_contiguous()
            or not bias.is_contiguous() or x.stride(-1) != 1 or x.device.type != "cpu"):
        raise ValueError(f"layer_norm takes float32 CPU rows [..., {d}] and a contiguous weight and "
                         f"bias [{d}]")
    rows = x.reshape(-1, d)  # a view wherever the rows are evenly spaced
    out = torch.empty(x.shape)
    _library_or_raise().seqtrans_layer_norm(rows.data_ptr(), rows.size(0), d, rows.stride(0),
                                            weight.data_ptr(), bias.data_ptr(), eps, out.data_ptr(), d,
                                            torch.get_num_threads())
    return out


def _rows_for_k(x: Tensor, k: int, *, kernel: str) -> tuple[int, int]:
    """The shape [M, N] of the rows ``kernel`` ranks, after checking that ``x`` is a float32
    CPU matrix with contiguous rows and that ``k`` is within 1..N (a ValueError naming it)."""
    if x.dtype != torch.float32 or x.dim() != 2 or x.stride(1) != 1 or x.device.type != "cpu":
        raise ValueError(f"{kernel} takes a float32 CPU matrix with contiguous rows")
    m, n = x.shape
    if not 1 <= k <= n:
        raise ValueError(f"{kernel}: k = {k} for rows of {n}")
    return m, n


def topk_rows(x: Tensor, k: int) -> tuple[Tensor, Tensor] | None:
    """``x.topk(k, dim=1)`` for a float32 matrix with contiguous rows, in one pass over
    each row: (values [M, k], indices [M, k] int64), largest first, of equal values the
    lower index first (``torch.topk`` leaves their order unspecified). None where a row
    holds a NaN, which the caller ranks with ``torch.topk``. Only when :func:`available`."""
    library = _library_or_raise()
    m, n = _rows_for_k(x, k, kernel="topk_rows")
    values = torch.empty(m, k, dtype=torch.float32)
    index = torch.empty(m, k, dtype=torch.int64)
    nan = library.seqtrans_topk_rows(x.data_ptr(), m, n, x.stride(0), k, values.data_ptr(), index.data_ptr(),
                                     torch.get_num_threads())
    return None if nan else (values, index)


def beam_candidates(x: Tensor, prefix: Tensor, k: int, *, never: Tensor, only: Tensor | None = None,
                    banned_start: Tensor | None = None,
                    banned: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor] | None:
    """The ``k`` best next tokens of each hypothesis from its logits: for row r,
    ``(log_softmax(x[r]) + prefix[r])`` ranked as :func:`topk_rows` ranks (largest first, of
    equal values the lower column first), -inf at the columns excluded: ``never`` [E] (every
    row), all but ``only[r]`` where it is >= 0 (``only`` [M]; past the last column: none), and
    ``banned[banned_start[r]:banned_start[r+1]]`` (``banned_start`` [M+1]). The log-softmax is
    ``(x - max) - shift``, as torch's, with ``shift`` the log of the sum of ``exp(x - max)``,
    which differs from torch's in rounding only. x [M, N] float32 (contiguous rows), prefix [M]
    float32, the rest int64 contiguous -> (values [M, k], columns [M, k] int64, shift [M]);
    None where a row's largest logit is not finite (a NaN, +inf, no finite logit), which the
    caller leaves to torch's operators. Only when :func:`available`."""
    library = _library_or_raise()
    m, n = _rows_for_k(x, k, kernel="beam_candidates")
    ints = [t for t in (never, only, banned_start, banned) if t is not None]
    if (prefix.dtype != torch.float32 or prefix.shape != (m,) or not prefix.is_contiguous()
            or any(t.dtype != torch.int64 or not t.is_contiguous() for t in ints)
            or (only is not None and only.shape != (m,)) or (banned_start is None) != (banned is None)
            or (banned_start is not None and banned_start.shape != (m + 1,))):
        raise ValueError("beam_candidates: a float32 prefix per row and contiguous int64 exclusions "
                         "(banned_start of rows + 1 with banned)")
    values = torch.empty(m, k, dtype=torch.float32)
    index = torch.empty(m, k, dtype=torch.int64)
    shift = torch.empty(m, dtype=torch.float32)

    def address(t: Tensor | None) -> int | None:
        return None if t is None else t.data_ptr()

    bad = library.seqtrans_beam_candidates(
        x.data_ptr(), m, n, x.stride(0), prefix.data_ptr(), k, never.data_ptr(), never.numel(), address(only),
        address(banned_start), address(banned), values.data_ptr(), index.data_ptr(), shift.data_ptr(),
        torch.get_num_threads())
    return None if bad else (values, index, shift)


class StepLinear(ctypes.Structure):
    """An int8 layer, or (``packed``) a float32 one in oneDNN's packing, as
    :func:`decoder_step` reads it (``kernels.c``'s ``StepLinear``)."""

    _fields_ = [("w", ctypes.c_void_p), ("scale", ctypes.c_void_p), ("compensation", ctypes.c_void_p),
                ("bias", ctypes.c_void_p), ("outputs", ctypes.c_int64), ("bias_after", ctypes.c_int64),
                ("packed", ctypes.c_int64)]


class StepLayer(ctypes.Structure):
    """A decoder layer and this step's caches as :func:`decoder_step` reads them."""

    _fields_ = [("norm", ctypes.c_void_p * 3), ("norm_bias", ctypes.c_void_p * 3),
                *((name, StepLinear)
                  for name in ("qkv", "self_out", "cross_q", "cross_out", "inner", "outer")),
                ("cache_k", ctypes.c_void_p), ("cache_v", ctypes.c_void_p), ("sources", ctypes.c_void_p),
                ("capacity", ctypes.c_int64), ("sources_stride", ctypes.c_int64),
                ("cross_k", ctypes.c_void_p), ("cross_v", ctypes.c_void_p), ("cross_rows", ctypes.c_void_p),
                ("cross_lengths", ctypes.c_void_p), ("source_length", ctypes.c_int64)]


class StepModel(ctypes.Structure):
    """The shape and the model-wide parts of a decoder as :func:`decoder_step` reads them."""

    _fields_ = [*((name, ctypes.c_int64) for name in (
                    "layers", "d_model", "heads", "head_dim", "pre_norm", "lanes", "group", "has_final_norm",
                    "has_output_scale")),
                *((name, ctypes.c_float) for name in ("eps", "self_scale", "cross_scale", "output_scale")),
                ("final_norm", ctypes.c_void_p), ("final_norm_bias", ctypes.c_void_p)]


def decoder_step_available(kind: str) -> bool:
    """Whether :func:`decoder_step` is built here for layers of ``kind``: ``"int8"`` (it
    needs the int8 product) or ``"float32"`` (the packed float32 product)."""
    library = _load() if environment.native_kernels() else None
    built = 0 if library is None else int(library.seqtrans_decoder_step_available())
    return bool(built & {"int8": 1, "float32": 2}[kind])


def decoder_step(model: StepModel, layers: ctypes.Array[StepLayer], x: Tensor, position: int,
                 bias: Tensor | None) -> None:
    """x [N, D] float32 (contiguous), in place: ``model``'s layers for the new position
    ``position`` of each of N hypotheses, whose keys and values go into the caches
    ``layers`` point to; ``bias`` [H, position + 1] float32 (contiguous) added to the
    self-attention logits, or None. Without checks: the caller builds ``model`` and
    ``layers`` from a model and state it has checked (:mod:`seqtrans.linear.native_step`)."""
    status = _library_or_raise().seqtrans_decoder_step(
        ctypes.byref(model), layers, x.data_ptr(), x.size(0), position,
        None if bias is None else bias.data_ptr(), torch.get_num_threads())
    if status != 0:
        raise MemoryError("decoder_step could not allocate its working memory")


def decoder_sublayer(model: StepModel, layers: ctypes.Array[StepLayer], layer: int, which: int, h: Tensor,
                     x: Tensor, position: int, bias: Tensor | None) -> None:
    """x [N, D] float32 (contiguous) += sub-layer ``which`` (0 self-attention, its new keys
    and values into the cache; 1 cross-attention; 2 the feed-forward layer) of layer ``layer``
    of h [N, D] float32 (contiguous), what that sub-layer reads: one sub-layer of
    :func:`decoder_step`, for a step whose norms the caller computes. Without checks, as it."""
    entry = ctypes.byref(layers, layer * ctypes.sizeof(StepLayer))
    status = _library_or_raise().seqtrans_decoder_sublayer(
        ctypes.byref(model), entry, which, h.data_ptr(), x.data_ptr(), x.size(0), position,
        None if bias is None else bias.data_ptr(), torch.get_num_threads())
    if status != 0:
        raise MemoryError("decoder_sublayer could not allocate its working memory")
