"""Domain errors are SeqloaderErrors and keep the built-in base a caller may catch."""
from __future__ import annotations

import pytest

from seqloader.errors import NotFoundError, OutputExistsError, SeqloaderError
from seqloader.format.files import find_database
from seqloader.write.preprocess import preprocess


def test_a_missing_database_is_a_seqloader_error_and_a_file_not_found(tmp_path):
    with pytest.raises(NotFoundError, match="does not exist") as e:
        find_database(tmp_path / "nope.lmdb")
    assert isinstance(e.value, SeqloaderError) and isinstance(e.value, FileNotFoundError)


def test_an_output_in_the_way_is_a_seqloader_error_and_a_file_exists(tmp_path):
    (tmp_path / "src" / "train" / "c").mkdir(parents=True)
    (tmp_path / "out").write_text("a file, not a folder")
    with pytest.raises(OutputExistsError, match="is a file") as e:
        preprocess(tmp_path / "src", tmp_path / "out")
    assert isinstance(e.value, SeqloaderError) and isinstance(e.value, FileExistsError)
