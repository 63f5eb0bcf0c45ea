import torch

from offline.data.sequences import Sequences
from retriever.windows import batches, make_windows


def test_make_windows_covers_every_training_target_once() -> None:
    seqs = Sequences.from_lists([[1, 2, 3, 4, 5, 6, 7], [8, 9], [10]])
    windows = make_windows(seqs.offsets, seqs.items, max_len=3)
    assert windows.tolist() == [[4, 5, 6, 7], [1, 2, 3, 4], [0, 0, 8, 9]]
    last = make_windows(seqs.offsets, seqs.items, max_len=3, mode="last")
    assert last.tolist() == [[4, 5, 6, 7], [0, 0, 8, 9]]
    targets = sorted(int(t) for w in windows for i, t in enumerate(w[1:]) if w[i] != 0)
    assert targets == [2, 3, 4, 5, 6, 7, 9]


def test_batches_are_trimmed_and_cover_every_window_once() -> None:
    windows = torch.tensor([[0, 0, 0, 1, 2], [0, 3, 4, 5, 6], [0, 0, 7, 8, 9], [0, 0, 0, 10, 11]])
    seen = []
    for batch in batches(windows, 2, torch.Generator().manual_seed(0)):
        assert (batch != 0).sum(1).max() == batch.shape[1]  # no all-padding column
        seen += [int(row[row != 0][0]) for row in batch]
    assert sorted(seen) == [1, 3, 7, 10]


def test_prefix_windows_end_at_every_training_target_once() -> None:
    seqs = Sequences.from_lists([[1, 2, 3, 4, 5], [8, 9], [10]])
    windows = make_windows(seqs.offsets, seqs.items, max_len=2, mode="prefixes")
    assert windows.tolist() == [[0, 1, 2], [1, 2, 3], [2, 3, 4], [3, 4, 5], [0, 8, 9]]
    assert sorted(windows[:, -1].tolist()) == [2, 3, 4, 5, 9]  # each target once, in the last column


def test_prefix_windows_of_short_data_keep_the_full_width() -> None:
    seqs = Sequences.from_lists([[1, 2], [3]])
    assert make_windows(seqs.offsets, seqs.items, max_len=4, mode="prefixes").tolist() == [[0, 0, 0, 1, 2]]
    assert make_windows(Sequences.from_lists([[3]]).offsets, Sequences.from_lists([[3]]).items, 4,
                        mode="prefixes").shape == (0, 5)
