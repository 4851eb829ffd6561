"""The one SIZE parser of the command line."""
import argparse

import pytest

from seqloader.cli import main
from seqloader.tools.sizes import size_arg


@pytest.mark.parametrize("text, n", [("4G", 4 << 30), ("512M", 512 << 20), ("1.5KiB", 1536),
                                     ("100000", 100000), (" 2gb ", 2 << 30), ("1T", 1 << 40)])
def test_sizes_parse_in_binary_units(text, n):
    assert size_arg(text) == n


@pytest.mark.parametrize("text", ["inf", "INF", "infG", "nan", "nanM", "-1G", "0", "0.5", "",
                                  "four", "4X"])
def test_a_size_that_is_not_a_finite_positive_number_is_a_clear_error(text):
    with pytest.raises(argparse.ArgumentTypeError, match="size") as e:
        size_arg(text)
    assert repr(text) in str(e.value)


@pytest.mark.parametrize("argv", [["preprocess", "src", "out", "--memory-budget", "inf"],
                                  ["export", "db.lmdb", "out", "--shard-size", "inf"]])
def test_the_commands_refuse_inf_in_one_line(argv, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "'inf' is not a finite size" in err and "Traceback" not in err
