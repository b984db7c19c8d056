"""float32 linear layers that multiply through oneDNN instead of the BLAS behind
``F.linear``, for float32 decoding on CPU.

Shapes: M rows, K inputs, O outputs; N ids, D an embedding's width.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from seqtrans import native
from seqtrans.runtime import buffers, environment
from seqtrans.runtime.system import MappedFile, mapped_file, release_mapped

#: The most rows a product runs through :func:`seqtrans.native.packed_linear_unchecked`
#: rather than oneDNN's call (where the layer's check passed): from about twice as many,
#: oneDNN's kernel is as fast (docs/speed.md, "A step's few rows").
NATIVE_ROWS = 8

#: The most bytes of a block of a packed weight (:func:`packed`) unless
#: ``SEQTRANS_PACK_BLOCK_MIB`` says otherwise; a weight of at most two is packed whole.
PACK_BLOCK_BYTES = 32 << 20


def onednn_available() -> bool:
    """Whether this PyTorch has oneDNN's linear operator (x86 and ARM builds have it)."""
    return bool(torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


class OneDNNLinear(nn.Module):
    """``y = x @ W.T + b`` through oneDNN's matrix multiply, for float32 decoding on CPU.

    PyTorch's ``F.linear`` calls the BLAS it was built with (Intel MKL in the x86 wheels),
    which on AMD processors runs well below oneDNN's speed for the same product
    (benchmarks/README.md). ``weight`` and ``bias`` are the tensors it was made from, shared;
    no gradient flows through the layer. ``forward(x [..., K]) -> [..., O]``.

    The product reads a copy of the weight in oneDNN's own blocked layout
    (:func:`packed`), made once with the layer: with the weight in its plain layout
    oneDNN rearranges it at every call, which made a decoding step's few rows take twice
    as long (docs/speed.md, "Packed float32 weights"). The copy costs the weight's memory
    again, for as long as the layer lives, unless the weight is a map of its file, whose
    pages are then given back; ``SEQTRANS_PACK_WEIGHTS=0`` (read when the layer is made)
    keeps none. A weight larger than :data:`PACK_BLOCK_BYTES` is packed in blocks of output
    rows, each multiplied on its own: the same bits as one product (each output's sum over
    K is the same), for one more pass over the output. Either way a row gets the same bits
    alone as in any batch, with any number of threads (tests/linear/test_onednn.py).

    oneDNN builds and caches a primitive for every row count it sees. Decoding sees
    thousands (batch rows x source lengths, beams shrinking as sentences end), which
    churns that cache and leaves the process's memory growing with every new shape, so
    the rows are padded up to :func:`row_bucket`'s few sizes. A single row is padded
    to two: oneDNN multiplies one row with a matrix-vector kernel that sums in another
    order, and a row must get the same bits alone as in a batch.

    Up to :data:`NATIVE_ROWS` rows skip oneDNN's call where the layer's check allows:
    :func:`seqtrans.native.packed_linear_unchecked` reads the packed copy in place and
    gives oneDNN's bits without the call's fixed cost (docs/speed.md, "A step's few rows").
    """

    def __init__(self, weight: Tensor, bias: Tensor | None = None, *,
                 packed_weight: Packed | None = None) -> None:
        super().__init__()
        self.weight = weight
        self.bias = bias
        # plain ints: read at every call, where a parameter's lookup through the module costs
        self.in_features, self.out_features = weight.size(1), weight.size(0)
        # packed_weight: another layer's copy of this weight (plus_bias), so it is not made twice
        self._packed = packed(weight) if packed_weight is None else packed_weight
        sizes = [block.size(0) for block in self._packed.blocks]
        # each block's own bias, a view of the layer's
        self._biases: list[Tensor | None] = [None] * len(sizes) if bias is None else list(bias.split(sizes))
        # whether a few rows' product goes through the native kernel: None until checked on first use
        self._native: bool | None = None
        self._addresses: list[tuple[int, int]] = []  # each packed block's address and rows, once checked

    @functools.cached_property
    def file_rows(self) -> FileRows | None:
        """Where the plain weight's pages were given back once packed (it is a map of its
        file), its rows read from the file: what a tied embedding looks up
        (:class:`FileEmbedding`) and :meth:`rows` copies. Opened on first use: most layers
        never read their plain weight again."""
        source = mapped_file(self.weight) if self._packed.released else None
        return None if source is None else FileRows(self.weight, source)

    @property
    def packed_weights(self) -> tuple[Tensor, ...]:
        """The weight as the product reads it, in blocks of its output rows (one unless it is
        larger than :data:`PACK_BLOCK_BYTES`): oneDNN's blocked copies, or the weight itself
        where none was made (:func:`packed`)."""
        return self._packed.blocks

    def rows(self, ids: Tensor) -> OneDNNLinear:
        """The layer of the output rows ``ids`` [O'] only (their weights copied), for a
        product restricted to them (a vocabulary shortlist)."""
        file_rows = self.file_rows
        weight = self.weight[ids].contiguous() if file_rows is None else file_rows(ids)
        return OneDNNLinear(weight, None if self.bias is None else self.bias[ids])

    def plus_bias(self, bias: Tensor) -> OneDNNLinear:
        """This layer's product with ``bias`` [O] added as the operator's last step, sharing its
        packed weight: the same bits as adding ``bias`` to its output afterwards
        (tests/linear/test_onednn.py), without a pass over the output of its own, which for a
        large vocabulary's logits costs as much as a step's other layers."""
        if self.bias is not None:
            raise ValueError("plus_bias: the layer already adds a bias")
        return OneDNNLinear(self.weight, bias, packed_weight=self._packed)

    #: ``forward(x, relu=True)`` applies max(0, .) as the product's own last step
    #: (seqtrans.model.layers.FeedForward): the same values, one pass over them fewer
    fuses_relu = True

    def forward(self, x: Tensor, *, relu: bool = False) -> Tensor:
        # A decoding step's products are small, so each operator called from Python around one
        # is a sizeable share of its time: the operator is given x as it comes (it flattens
        # the leading dims itself) wherever no padding is needed.
        post = "relu" if relu else "none"
        lead = x.shape[:-1]
        m = math.prod(lead)
        if m <= NATIVE_ROWS and (self._native or (self._native is None and self._check_native())):
            rows = x.reshape(m, x.size(-1))  # [M, K]
            return self._native_product(rows if rows.stride(-1) == 1 else rows.contiguous(), relu).view(
                *lead, self.out_features)
        padded = row_bucket(m)
        if padded == m:
            return self._blocks_product(x, post)  # [..., O]
        if m == 1 and x.dim() > 1:
            # the row twice, contiguous: the operator copies a strided view itself, more slowly
            return self._blocks_product(torch.cat([x, x]), post)[:1]  # [1, ..., O]
        rows = x.reshape(m, x.size(-1))  # [M, K]
        rows = torch.cat([rows, rows.new_zeros(padded - m, rows.size(1))])  # [M', K]
        y = self._blocks_product(rows, post)  # [M', O]
        return y[:m].view(*lead, y.size(1))

    def native_block(self) -> tuple[int, int] | None:
        """The address and output rows of the layer's one packed block where the native kernel
        gives its bits (checked once, as its own few rows' products check it), else None:
        what a native decoder step reads (:mod:`seqtrans.linear.native_step`)."""
        checked = self._native or (self._native is None and self._check_native())
        if len(self._packed.blocks) != 1 or not checked:
            return None
        return self._addresses[0]

    def _native_product(self, rows: Tensor, relu: bool) -> Tensor:
        """The product by the native kernel, each block's outputs written in place in its
        columns.  [M, K] -> [M, O]"""
        m, size = rows.size(0), self.out_features
        # a layer's few outputs: straight from the allocator (a vocabulary's go to reused memory)
        out = torch.empty(m, size) if m * size * 4 < buffers.MIN_BYTES else buffers.output(m, size)
        column = 0
        for (address, outputs), bias in zip(self._addresses, self._biases):
            native.packed_linear_unchecked(rows, address, outputs, bias, out, column, relu=relu)
            column += outputs
        return out

    def _check_native(self) -> bool:
        """Whether the native kernel gives this layer oneDNN's bits (it reads oneDNN's packing
        for AVX2 and sums as its kernel there does; another processor's oneDNN may pack or sum
        otherwise): tried once, on random rows, with and without relu, against oneDNN's own
        product of them; the answer is kept."""
        blocks = self._packed.blocks
        fits = (native.packed_linear_available() and self.in_features > 0
                and all(block.is_mkldnn and torch.ops.mkldnn._nbytes(block)
                        == -(-block.size(0) // native.PACKED_OUTPUTS) * native.PACKED_OUTPUTS
                        * self.in_features * 4 for block in blocks))
        if fits:
            self._addresses = [(torch.ops.mkldnn.data_ptr(block), block.size(0)) for block in blocks]
            generator = torch.Generator().manual_seed(0)
            probe = torch.randn(3, self.in_features, generator=generator)  # [3, K]
            with torch.no_grad():  # a copy may be made where gradients are on (its bias has one)
                fits = all(torch.equal(self._native_product(probe, relu).clone(),
                                       self._blocks_product(probe, post))
                           for relu, post in ((False, "none"), (True, "relu")))
        self._native = fits
        return fits

    def _blocks_product(self, x: Tensor, post: str) -> Tensor:
        """The product over the packed blocks, each block's outputs in its columns.  [..., K] -> [..., O]"""
        blocks = self._packed.blocks
        if len(blocks) == 1:
            return _product(x, blocks[0], self.bias, post)
        parts = [_product(x, block, bias, post) for block, bias in zip(blocks, self._biases)]
        # a large vocabulary's logits go to memory kept from the last step (seqtrans.runtime.buffers)
        return torch.cat(parts, dim=-1, out=buffers.output(*x.shape[:-1], self.out_features))  # [..., O]


def _product(x: Tensor, weight: Tensor, bias: Tensor | None, post: str) -> Tensor:
    """oneDNN's ``x @ weight.T + bias``, then ``post`` ("relu" or "none").  [..., K] -> [..., O]"""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, post, [], "")


#: The built products of distinct shapes ``seqtrans serve`` keeps (:func:`bound_primitive_caches`).
SERVER_PRIMITIVES = 128


def bound_primitive_caches(entries: int) -> dict[str, str]:
    """Have PyTorch's cache of built oneDNN products and oneDNN's own keep at most
    ``entries`` each, where the environment does not set them
    (:data:`~seqtrans.runtime.environment.PRIMITIVE_CACHES`); returns the capacities in force.

    Each product of a new shape (a weight's shape and a padded row count) is built once,
    its kernels compiled for it, and both caches keep it: about half a MiB, for up to 1,024
    shapes each by default. A server meets new row counts for as long as it runs (batches,
    beams, n-best lists and scores of every size), so its memory grew by that much again
    with each until the caches filled (docs/serving-load.md, "Memory under a mixed load").
    Both read their capacity once, when the first product is built: call this before."""
    for name in environment.PRIMITIVE_CACHES:
        if not environment.primitive_cache_capacity(name):
            environment.export(name, str(entries))
    return {name: environment.primitive_cache_capacity(name) for name in environment.PRIMITIVE_CACHES}


def row_bucket(m: int) -> int:
    """The row count a product of ``m`` rows runs at: ``m`` itself from 2 to 16 (2 for
    1), then the next multiple of 1/8 of the power of two below it (eight sizes per
    doubling, at most 1/8 more rows)."""
    if m <= 16:
        return max(m, 2)
    step = 1 << (m.bit_length() - 4)
    return -(-m // step) * step


@dataclass(frozen=True)
class Packed:
    """A weight [O, K] as the product reads it: ``blocks`` of its output rows in order,
    each an opaque copy in oneDNN's layout (or the weight itself, unpacked); ``released``:
    whether the plain weight's pages were given back (it is a map of its file)."""

    blocks: tuple[Tensor, ...]
    released: bool = False


def packed(weight: Tensor) -> Packed:
    """``weight`` [O, K] float32 in the blocked layout oneDNN's product reads fastest on this
    processor (opaque ``torch._mkldnn`` tensors that only ``_linear_pointwise`` reads), or
    ``weight`` itself where this PyTorch cannot make one or ``SEQTRANS_PACK_WEIGHTS=0`` says
    not to. A weight read from a map of its file (a run loaded for decoding) gives its pages
    back as each block is copied (:func:`seqtrans.runtime.system.release_mapped`), so that
    the weights are in memory once, in the packed layout, and never twice even while they
    are packed. The blocks are of :data:`PACK_BLOCK_BYTES` at most (``SEQTRANS_PACK_BLOCK_MIB``;
    ``0``: one block, faster where each product call costs most, the weight twice while it
    is packed), a weight of at most two blocks' bytes is one (its blocks' outputs would be
    gathered at every product, a pass over a vocabulary's logits, to save at most a block
    while it is packed), and of nearly equal rows,
    never one row alone (oneDNN multiplies a single output by another kernel, which sums in
    another order)."""
    reorder = getattr(torch.ops.mkldnn, "_reorder_linear_weight", None)
    if (reorder is None or weight.dtype != torch.float32 or weight.device.type != "cpu"
            or not environment.pack_weights()):
        return Packed((weight,))
    block = environment.pack_block_bytes(PACK_BLOCK_BYTES)
    size = weight.numel() * weight.element_size()
    count = 1 if block is None or size <= 2 * block else max(1, min(weight.size(0) // 2, -(-size // block)))
    blocks, released = [], False
    try:
        with torch.no_grad():
            for rows in weight.detach().tensor_split(count):  # [O_i, K] views, contiguous
                blocks.append(reorder(rows))
                # the product reads the copy alone: a weight mapped from its file need not stay resident
                released = release_mapped(rows) or released
    except RuntimeError:  # a layout oneDNN does not take: the plain product, still the same for every batch
        return Packed((weight,))
    released = release_mapped(weight) or released  # the pages across the blocks' edges
    return Packed(tuple(blocks), released)


class FileRows:
    """Rows of a table [V, D] that is a map of its file, read from the file (``pread``,
    :class:`~seqtrans.runtime.system.MappedFile`) rather than through the map: one row read
    through the map brings a whole folio of the file back into the resident set (2 MiB),
    so that a few hundred scattered lookups made a table whose pages were given back
    resident again. Made where no page of the table was written (its bytes are the
    file's: :func:`~seqtrans.runtime.system.mapped_file`); a table written since (its version
    moved) is read as it is. Called with ids [...]: their rows [..., D], bit for bit
    ``table[ids]``."""

    def __init__(self, table: Tensor, source: MappedFile) -> None:
        self.table = table
        self._source = source
        self._version = table._version

    def __call__(self, ids: Tensor) -> Tensor:
        if self.table._version != self._version:
            return self.table[ids]
        size, width = self.table.shape
        wanted = ids.reshape(-1).tolist()  # [N]
        if any(not 0 <= row < size for row in wanted):
            raise IndexError(f"row ids out of range for a table of {size} rows")
        # each distinct row read once: a wide beam's hypotheses mostly share their last tokens
        # (thousands of ids for a small target vocabulary's few rows), and a read is a system call
        distinct = list(dict.fromkeys(wanted))  # [U]
        out = self.table.new_empty(len(distinct), width)  # [U, D]
        row_bytes = width * self.table.element_size()
        buffer = out.numpy().data.cast("B")
        for i, row in enumerate(distinct):
            self._source.read_into(buffer[i * row_bytes:(i + 1) * row_bytes], row * row_bytes)
        if len(distinct) < len(wanted):
            where = {row: i for i, row in enumerate(distinct)}
            out = out[torch.tensor([where[row] for row in wanted])]  # [N, D]
        return out.view(*ids.shape, width)


class FileEmbedding(nn.Module):
    """An embedding table looked up from its file (:class:`FileRows`): the tied table of a
    float32 decoding copy, whose output projection reads the packed copy
    (:class:`OneDNNLinear`), so that the table stays resident once, packed, rather than
    coming back plain as decoding looks rows up. ``weight`` is the model's own, shared.
    ``forward(ids [...]) -> [..., D]``, the rows ``nn.Embedding`` gives.
    """

    def __init__(self, rows: FileRows) -> None:
        super().__init__()
        self.weight = rows.table
        self._rows = rows

    def forward(self, ids: Tensor) -> Tensor:
        return self._rows(ids)
