"""Where the tests' throw-away clusters live: a RAM-backed directory when the machine has a
roomy one, else the system's temporary directory.

Creating and copying a cluster, and the WAL of a busy one, are disk writes; on a slow or
shared disk they are most of the cost of a replica pair or a Patroni cluster (a 46 MB copy:
about 1.2 s on this project's ext4 test machine, 0.08 s in ``/dev/shm``). Nothing in these
clusters must outlive the test process, so RAM is the right place when there is enough of
it. ``LEASEQ_TEST_SCRATCH_DIR`` names another parent directory (for example ``/var/tmp`` to
keep a failed run's files after a reboot). The test session's own server lives there too
when the session starts one (``tests/conftest.py``); its commits then wait for no disk.
"""

from __future__ import annotations

import os
import pathlib
import tempfile

#: A RAM-backed directory is used only with at least this much free room (clusters, WAL).
_MIN_FREE = 2 * 1024**3
_RAM_DIR = pathlib.Path("/dev/shm")


def scratch_parent(min_free: int = _MIN_FREE) -> pathlib.Path | None:
    """The parent directory for scratch clusters (None: the system's temporary directory);
    a RAM-backed one only with ``min_free`` bytes of room left."""
    configured = os.environ.get("LEASEQ_TEST_SCRATCH_DIR")
    if configured:
        return pathlib.Path(configured)
    try:
        room = os.statvfs(_RAM_DIR)
    except OSError:
        return None
    if room.f_bavail * room.f_frsize >= min_free and os.access(_RAM_DIR, os.W_OK | os.X_OK):
        return _RAM_DIR
    return None


def make_scratch(prefix: str) -> pathlib.Path:
    """A new empty directory that the unprivileged server account can pass through."""
    path = pathlib.Path(tempfile.mkdtemp(prefix=prefix, dir=scratch_parent()))
    path.chmod(0o755)  # mkdtemp makes it 700
    return path


__all__ = ["make_scratch", "scratch_parent"]
