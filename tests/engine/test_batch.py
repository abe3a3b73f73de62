"""The flattened batch (rows, slots, positions, logits rows, splitting into chunks) and
the thread policy decided at load."""

import pytest
import torch

from gguf_serve.engine.batch import Batch


def test_a_batch_flattens_sequences_and_names_its_logits_rows():
    b = Batch.of([(2, [5, 6, 7], 10), (0, [8], 3), (1, [9, 9], 0)], want=["last", "all", "none"])
    assert b.tokens.tolist() == [5, 6, 7, 8, 9, 9]
    assert b.slots.tolist() == [2, 2, 2, 0, 1, 1]
    assert b.positions.tolist() == [10, 11, 12, 3, 0, 1]
    assert b.rows.tolist() == [2, 3]
    assert [(s.slot, s.start, s.n, s.pos, s.end) for s in b.seqs] == [(2, 0, 3, 10, 13), (0, 3, 1, 3, 4),
                                                                      (1, 4, 2, 0, 2)]


@pytest.mark.parametrize("items, want, message", [
    ([(0, [], 0)], "last", "slot 0 has no tokens"),
    ([(0, [1], 0), (0, [2], 1)], "last", "slot 0 appears twice"),
    ([(0, [1], -1)], "last", "starts at position -1"),
    ([(0, [1], 0)], "first", "want must be 'last', 'all' or 'none'"),
    ([(0, [1], 0), (1, [1], 0)], ["last"], "2 items but 1 logits requests"),
])
def test_malformed_batches_are_refused(items, want, message):
    with pytest.raises(ValueError, match=message):
        Batch.of(items, want=want)


def test_split_keeps_order_positions_and_logits_rows():
    b = Batch.of([(0, list(range(7)), 4), (1, [1, 2, 3], 0)], want=["all", "last"])
    parts = b.split(4)
    assert [p.n_tokens for p in parts] == [4, 4, 2]
    assert torch.cat([p.tokens for p in parts]).tolist() == b.tokens.tolist()
    assert [[(s.slot, s.start, s.n, s.pos) for s in p.seqs] for p in parts] == [
        [(0, 0, 4, 4)], [(0, 0, 3, 8), (1, 3, 1, 0)], [(1, 0, 2, 1)]]
    rows = [r + 4 * i for i, p in enumerate(parts) for r in p.rows.tolist()]
    assert rows == b.rows.tolist()
    assert b.split(10) == [b]


def test_the_thread_policy_gives_torch_one_thread_except_in_blas_prefills():
    from gguf_serve.engine import kernels
    from gguf_serve.engine.kernels import cpu
    from gguf_serve.engine.threads import ThreadPolicy

    if cpu.load() is None:
        pytest.skip("native CPU kernels not built")
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        policy = ThreadPolicy.decide(torch.device("cpu"), kernels.settings(threads=2))
        rows = policy.kernels.cpu.gemv_max_rows
        assert policy.native and torch.get_num_threads() == 1
        with policy.run(rows):
            assert torch.get_num_threads() == 1  # integer kernels: the pool owns the cores
        with policy.run(rows + 1):
            assert torch.get_num_threads() == policy.threads  # torch's BLAS does the matmuls
        assert torch.get_num_threads() == 1
        other = ThreadPolicy.decide(torch.device("cpu"), kernels.settings("reference"))
        assert not other.native and "torch on" in other.describe()
    finally:
        torch.set_num_threads(before)
