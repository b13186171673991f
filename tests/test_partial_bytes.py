"""Partial writes and row gathers count the bytes they touch (formulas/partial.py).

Two oracles: a closed form from the tensors' sizes, and the region written measured as the
destination elements that changed (the destination starts as NaN, every value written is a
number)."""

import pytest
import torch
import torch.nn.functional as F

from dispatch_flops import EXACT, NO_ARITHMETIC, FlopCounter


def counted(fn, operator):
    with FlopCounter() as fc:
        fn()
    return fc.by_operator()[operator], fc.records()


def changed_bytes(before, after) -> int:
    """Bytes of the destination elements a write changed (NaN to a number, or any change)."""
    changed = (before.isnan() & ~after.isnan()) | (~before.isnan() & (before != after))
    return int(changed.sum()) * after.element_size()


def nan_buffer(*shape, dtype=torch.float32):
    return torch.full(shape, float("nan"), dtype=dtype)


@pytest.mark.parametrize("rows,width,length", [(1, 8, 16), (10, 1024, 1024), (3, 5, 7)])
def test_index_copy_reads_source_and_index_writes_the_rows(rows, width, length):
    """A KV-cache update: index_copy_ of ``rows`` rows into a [length, width] buffer moves
    the rows and the index, not the buffer."""
    buf, src = nan_buffer(length, width), torch.randn(rows, width)
    idx = torch.randperm(length)[:rows]
    before = buf.clone()
    stats, _ = counted(lambda: buf.index_copy_(0, idx, src), "aten.index_copy_")
    assert stats.bytes_read == rows * width * 4 + rows * 8
    assert stats.bytes_written == rows * width * 4 == changed_bytes(before, buf)
    assert stats.flops == 0


def test_static_cache_style_update_along_a_middle_dim():
    """StaticCache writes keys at ``cache_position`` along dim 2 of [b, h, L, d]."""
    b, h, length, d, new = 2, 3, 12, 4, 1
    cache, keys = nan_buffer(b, h, length, d, dtype=torch.bfloat16), torch.randn(b, h, new, d)
    keys = keys.to(torch.bfloat16)
    before = cache.clone()
    stats, _ = counted(lambda: cache.index_copy_(2, torch.tensor([5]), keys),
                       "aten.index_copy_")
    assert stats.bytes_written == b * h * new * d * 2 == changed_bytes(before, cache)
    assert stats.bytes_read == b * h * new * d * 2 + 8


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_slice_assignment_reads_only_the_source(dtype):
    """``buf[:, 2:5] = x`` is a view and copy_: x read, the slice written, the buffer's old
    values never read."""
    buf, x = nan_buffer(6, 9, dtype=dtype), torch.randn(6, 3, dtype=torch.float32)
    before = buf.clone()

    def assign():
        buf[:, 2:5] = x

    stats, records = counted(assign, "aten.copy_")
    assert stats.bytes_read == x.nbytes
    assert stats.bytes_written == 6 * 3 * buf.element_size() == changed_bytes(before, buf)
    assert {r.category for r in records if r.operator == "aten.copy_"} == {NO_ARITHMETIC}


def test_copy_broadcast_source_is_read_once():
    """copy_ from a smaller (broadcast) source reads the source's own bytes."""
    buf, row = nan_buffer(5, 4), torch.randn(4)
    stats, _ = counted(lambda: buf.copy_(row), "aten.copy_")
    assert (stats.bytes_read, stats.bytes_written) == (row.nbytes, buf.nbytes)


@pytest.mark.parametrize("accumulate", [False, True])
def test_index_put_counts_the_indexed_region(accumulate):
    """``buf[idx] = v`` writes the indexed rows; accumulate=True also reads them."""
    n, d, k = 20, 6, 4
    buf = torch.zeros(n, d) if accumulate else nan_buffer(n, d)
    idx, values = torch.tensor([1, 7, 8, 19]), torch.randn(k, d)
    before = buf.clone()
    stats, _ = counted(lambda: buf.index_put_((idx,), values, accumulate=accumulate),
                       "aten.index_put_")
    region = k * d * 4
    assert stats.bytes_written == region == changed_bytes(before, buf)
    assert stats.bytes_read == idx.nbytes + values.nbytes + (region if accumulate else 0)
    assert stats.flops == (k * d if accumulate else 0)


def test_index_put_with_two_index_tensors_and_a_broadcast_value():
    """Two index tensors select elements of a 3-d buffer; a scalar-shaped value broadcasts."""
    buf = nan_buffer(4, 5, 3)
    i, j, value = torch.tensor([0, 2, 3]), torch.tensor([1, 1, 4]), torch.tensor(2.0)
    before = buf.clone()
    stats, _ = counted(lambda: buf.index_put_((i, j), value), "aten.index_put_")
    assert stats.bytes_written == 3 * 3 * 4 == changed_bytes(before, buf)
    assert stats.bytes_read == i.nbytes + j.nbytes + value.nbytes


@pytest.mark.filterwarnings("ignore:The reduce argument")
@pytest.mark.parametrize("reduce", [None, "add"])
def test_scatter_writes_one_element_per_index(reduce):
    """scatter_ writes where index points; it reads src where index reaches and, reducing,
    the destination there."""
    buf = torch.zeros(6, 5) if reduce else nan_buffer(6, 5)
    index = torch.stack([torch.randperm(6)[:3] for _ in range(5)], dim=1)  # [3, 5] distinct
    src = torch.randn(4, 5) + 10  # larger than index along dim 0: only index's part is read
    before = buf.clone()
    kwargs = {"reduce": reduce} if reduce else {}
    stats, _ = counted(lambda: buf.scatter_(0, index, src, **kwargs), "aten.scatter_")
    region = index.numel() * 4
    assert stats.bytes_written == region == changed_bytes(before, buf)
    assert stats.bytes_read == index.nbytes + index.numel() * 4 + (region if reduce else 0)


def test_scatter_add_and_index_add_read_the_region_they_add_into():
    buf = torch.zeros(8, 3)
    index = torch.tensor([[0, 1, 2], [5, 6, 7]])
    src = torch.ones(2, 3)
    stats, _ = counted(lambda: buf.scatter_add_(0, index, src), "aten.scatter_add_")
    assert (stats.flops, stats.bytes_written) == (6, 6 * 4)
    assert stats.bytes_read == index.nbytes + 6 * 4 + 6 * 4
    rows = torch.tensor([1, 4])
    stats, _ = counted(lambda: buf.index_add_(0, rows, src), "aten.index_add_")
    assert (stats.flops, stats.bytes_written) == (6, 6 * 4)
    assert stats.bytes_read == rows.nbytes + src.nbytes + 6 * 4


def test_out_of_place_twins_read_and_write_whole_tensors():
    """index_copy (not in place) makes a new tensor: the whole destination read and written."""
    buf, src, idx = torch.zeros(16, 4), torch.ones(2, 4), torch.tensor([3, 9])
    stats, _ = counted(lambda: buf.index_copy(0, idx, src), "aten.index_copy")
    assert stats.bytes_read == buf.nbytes + idx.nbytes + src.nbytes
    assert stats.bytes_written == buf.nbytes


@pytest.mark.parametrize("vocab,tokens", [(1000, 16), (8, 32)])
def test_embedding_reads_the_rows_it_looks_up(vocab, tokens):
    """At most one table row per lookup, never more than the table."""
    d = 12
    weight, ids = torch.randn(vocab, d), torch.randint(0, vocab, (2, tokens // 2))
    stats, records = counted(lambda: F.embedding(ids, weight), "aten.embedding")
    assert stats.bytes_read == min(tokens, vocab) * d * 4 + ids.nbytes
    assert stats.bytes_written == tokens * d * 4
    assert [r.category for r in records] == [NO_ARITHMETIC]


def test_embedding_bag_reads_rows_and_offsets():
    weight = torch.randn(500, 6)
    ids, offsets = torch.tensor([3, 9, 9, 40, 41]), torch.tensor([0, 2])
    stats, records = counted(lambda: F.embedding_bag(ids, weight, offsets, mode="sum"),
                             "aten._embedding_bag_forward_only")
    assert stats.bytes_read == 5 * 6 * 4 + ids.nbytes + offsets.nbytes
    assert stats.flops == 5 * 6
    assert {r.category for r in records if "embedding_bag" in r.operator} == {EXACT}
