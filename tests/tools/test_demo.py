"""``seqloader demo``: the README's first command, end to end, and after an interruption."""
import pytest

from seqloader.tools import demo, synth


@pytest.mark.slow  # (the README's main command: .ci/run runs it anyway)
def test_demo_runs_end_to_end_and_again_after_an_interrupted_generation(tmp_path, monkeypatch,
                                                                        capsys):
    """An interrupted generation used to leave a half-written tree that the next run took
    as complete (and then failed on: 'split val ... has no images')."""
    real = synth.make_synthetic_imagenet

    def interrupted(root, **kw):
        real(root, **{**kw, "classes": 2, "per_class": 3, "val_per_class": 0})  # train only
        raise KeyboardInterrupt

    monkeypatch.setattr(synth, "make_synthetic_imagenet", interrupted)
    with pytest.raises(KeyboardInterrupt):
        demo.run_demo(tmp_path, progress=False)
    assert not (tmp_path / "imagenet").exists() and (tmp_path / "imagenet.partial").is_dir()
    monkeypatch.setattr(synth, "make_synthetic_imagenet", real)
    assert demo.run_demo(tmp_path, progress=False) == 0
    out = capsys.readouterr().out
    assert "train: 600 records, " in out and "2 broken file(s) skipped" in out, out
    assert "train: 600 records OK" in out and "val: 100 records OK" in out
    assert out.count("epoch") == 2 and not (tmp_path / "imagenet.partial").exists()
    assert demo.run_demo(tmp_path, progress=False) == 0  # idempotent: all done already


def test_demo_says_the_batch_shape_and_the_bars_bad_count_is_the_reports(tmp_path, monkeypatch,
                                                                         capsys):
    """It printed the last, partial batch's shape as the batch shape; the writer's bar
    kept the bad count of its last redraw (a second apart: "1 bad" where the report
    said 2)."""
    from seqloader import progress

    postfixes = []

    class Bar(progress.tqdm):
        def __init__(self, *a, **kw):
            self.label, self.said = kw.get("desc"), None
            super().__init__(*a, **kw)

        def set_postfix_str(self, s="", refresh=True):
            self.said = s
            super().set_postfix_str(s, refresh)

        def close(self):
            if self.label is not None:
                postfixes.append((self.label, self.said))
                self.label = None
            super().close()
    monkeypatch.setattr(progress, "tqdm", Bar)
    assert demo.run_demo(tmp_path, progress=False, classes=2, per_class=20, val_per_class=2,
                         size="small", batch_size=16) == 0
    out = capsys.readouterr().out
    assert "train: 40 records, " in out and "2 broken file(s) skipped" in out, out
    assert "epoch 0: 3 batches of (16, 3, 224, 224) (the last of 8), 40 images" in out, out
    assert ("train", "2 bad") in postfixes, postfixes
