"""iomode: which I/O mode a database is read with (NOTE [ direct I/O ])."""

import pytest

import seqloader.read.iomode as iomode


def test_choose():
    gib = 1 << 30
    assert iomode.choose("auto", 13 * gib, memory=24 * gib)
    assert not iomode.choose("auto", 11 * gib, memory=24 * gib)
    assert iomode.choose("direct", 1, memory=24 * gib)
    assert not iomode.choose("buffered", 100 * gib, memory=24 * gib)
    assert not iomode.choose("auto", 100 * gib, memory=0)  # unknown memory: the safe path
    with pytest.raises(ValueError, match=r"io must be one of 'auto', 'buffered', 'direct', got 'odirect'"):
        iomode.choose("odirect", 1)


@pytest.mark.parametrize("version", [1, 2])
def test_auto_honours_a_cgroup_memory_limit(tmp_path, version):
    """A SLURM job or container is charged for the page cache it fills: auto compares the
    database with the job's limit, not with the node's RAM."""
    gib = 1 << 30
    (tmp_path / "proc/self").mkdir(parents=True)
    if version == 2:
        (tmp_path / "proc/self/cgroup").write_text("0::/slurm/job_7\n")
        d = tmp_path / "sys/fs/cgroup/slurm/job_7"
        d.mkdir(parents=True)
        (d / "memory.max").write_text(f"{16 * gib}\n")
    else:
        (tmp_path / "proc/self/cgroup").write_text("5:cpu,cpuacct:/a\n4:memory:/slurm/job_7\n")
        d = tmp_path / "sys/fs/cgroup/memory/slurm/job_7"
        d.mkdir(parents=True)
        (d / "memory.limit_in_bytes").write_text(f"{16 * gib}\n")
    assert iomode.cgroup_memory_limit(str(tmp_path)) == 16 * gib
    assert iomode.physical_memory(str(tmp_path)) == min(16 * gib, iomode.physical_memory("/nonexistent"))
    (d / ("memory.max" if version == 2 else "memory.limit_in_bytes")).write_text(
        "max\n" if version == 2 else "9223372036854771712\n")
    assert iomode.cgroup_memory_limit(str(tmp_path)) is None
