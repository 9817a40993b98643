"""mentor.lab.tensorboard: logging values to TensorBoard and reading every scalar back, and the errors for a logdir
without readable scalars."""

import numpy as np
import pytest

from mentor.lab.tensorboard import log_to_tensorboard, read_tensorboard


def test_tensorboard_round_trip(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(tmp_path))
    log_to_tensorboard(writer, {"step": 2.0, "accuracy": 0.5, "avg_loss": 1 / 3}, step=2)
    log_to_tensorboard(writer, {"accuracy": 0.75, "avg_loss": 0.125}, step=4)
    log_to_tensorboard(writer, {"accuracy": 1.0}, step=6, prefix="val/")
    writer.close()
    got = read_tensorboard(tmp_path)
    # TensorBoard stores scalars as float32: compare with the float32 rounding of what was written.
    f32 = lambda x: float(np.float32(x))  # noqa: E731
    assert got == {
        "train/accuracy": [(2, 0.5), (4, 0.75)],
        "train/avg_loss": [(2, f32(1 / 3)), (4, 0.125)],
        "val/accuracy": [(6, 1.0)],
    }


def test_read_tensorboard_merges_subdirectories(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    for name, value in (("a", 1.0), ("b", 2.0)):
        w = SummaryWriter(str(tmp_path / name))
        log_to_tensorboard(w, {"x": value}, step=1 if name == "a" else 0)
        w.close()
    assert read_tensorboard(tmp_path) == {"train/x": [(0, 2.0), (1, 1.0)]}


def test_read_tensorboard_reads_every_scalar(tmp_path):
    """TensorBoard's EventAccumulator keeps a sample of 10,000 scalars per tag by default; all are read back."""
    from torch.utils.tensorboard import SummaryWriter

    n = 10_001
    writer = SummaryWriter(str(tmp_path))
    for step in range(n):
        writer.add_scalar("train/x", float(step % 2), global_step=step)  # 0.0 and 1.0: exact in float32
    writer.close()
    assert read_tensorboard(tmp_path) == {"train/x": [(step, float(step % 2)) for step in range(n)]}


def test_log_to_tensorboard_rejects_non_writer():
    with pytest.raises(TypeError, match=r"writer must be a SummaryWriter \(with add_scalar\), not dict"):
        log_to_tensorboard({}, {"a": 1.0}, step=0)


def test_read_tensorboard_missing_or_empty(tmp_path):
    with pytest.raises(FileNotFoundError, match="no TensorBoard event files under .*pass the logdir"):
        read_tensorboard(tmp_path / "nothing-here")
    with pytest.raises(FileNotFoundError, match="no TensorBoard event files"):
        read_tensorboard(tmp_path)  # exists but empty


def test_read_tensorboard_refuses_garbage_and_empty_event_files(tmp_path):
    garbage = tmp_path / "garbage"
    garbage.mkdir()
    (garbage / "events.out.tfevents.1.host").write_bytes(b"\x00not an event file" * 10)
    with pytest.raises(ValueError, match=r"under '.*garbage'.*pass a logdir written by|hold no scalars"):
        read_tensorboard(garbage)
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "events.out.tfevents.2.host").write_bytes(b"")
    with pytest.raises(ValueError, match=r"under '.*empty' hold no scalars \(1 file\(s\) read\)"):
        read_tensorboard(empty)
