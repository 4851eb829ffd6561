"""The worker-process plumbing under the Loader, the writer and the tools alike: process
groups with one shutdown protocol and one error contract (:mod:`.processgroup`), the
ordered map over processes (:mod:`.processmap`, its shared-memory arena :mod:`.arena`) or
threads (:mod:`.threadmap`), and single-threaded, parent-bound workers (:mod:`.threads`).
It imports none of ``dataflow``, ``write``, ``tools`` or ``loader``."""
