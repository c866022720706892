"""One emulated GPU's shared state: an mmap'd file every process of the job can read.

``<state dir>/<host>/gpu<i>.state`` holds a header (owner, settings a privileged caller changed,
fault anchors) and an append-only ring of samples in columns (wall time ns, true energy mJ since
the node's epoch, power W, SM clock MHz, clock event reasons). The GPU's owner
(hw/emulated/owner.py) appends, and so does a reader that reads past the owner's newest sample
(one sample holding its power, hw/emulated/node.py), both under :meth:`GpuState.lock`; a writer
writes a sample before it raises the count, so a
reader that reads the count first sees only complete samples (x86 stores are not reordered, and
8-byte aligned loads and stores are whole). Readers never use the ``MARGIN`` oldest samples of a
full ring, which the owner may be overwriting.

A GPU nobody owns (no owner yet, or its owner exited) draws idle power from its last sample on.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import struct
import threading
import time
from pathlib import Path

import numpy as np

MAGIC = b"ESEMU\x00v1"
HEADER_BYTES = 4096
MARGIN = 1024  # oldest samples of a full ring that readers leave alone
COLUMNS = (
    ("t_ns", np.int64),
    ("energy_mj", np.float64),
    ("power_w", np.float64),
    ("clock_mhz", np.float64),
    ("reasons", np.int64),
)
# Header fields: name -> byte offset (8 bytes each, little-endian int64).
_FIELDS = {
    "count": 8,
    "capacity": 16,
    "owner_pid": 24,
    "attach_ns": 32,
    "power_limit_mw": 40,
    "locked_min_mhz": 48,
    "locked_max_mhz": 56,
    "app_mem_mhz": 64,
    "app_sm_mhz": 72,
}
_ANCHORS_AT, ANCHOR_SLOTS = 128, 64  # (occurrence int64, energy float64) per fault
_Q = struct.Struct("<q")
_D = struct.Struct("<d")


def gpu_file(state_dir: str | Path, host: str, index: int) -> Path:
    return Path(state_dir) / host / f"gpu{index}.state"


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (on this machine: the job's nodes share the process table)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class GpuState:
    """The mmap'd state of one emulated GPU (created on first open, zeroed = never owned)."""

    def __init__(self, path: str | Path, capacity: int):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        size = HEADER_BYTES + capacity * sum(np.dtype(t).itemsize for _, t in COLUMNS)
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
            created = True
        except FileExistsError:
            fd = os.open(self.path, os.O_RDWR)
            created = False
        try:
            if created:
                os.ftruncate(fd, size)
                head = bytearray(HEADER_BYTES)
                _Q.pack_into(head, _FIELDS["capacity"], capacity)
                os.pwrite(fd, bytes(head), 0)
                os.pwrite(fd, MAGIC, 0)  # last: marks the file complete
            else:
                self._wait_complete(fd)
            self._mm = mmap.mmap(fd, 0)
        finally:
            os.close(fd)
        self.capacity = self.get("capacity")
        self._lock_fd = os.open(self.path, os.O_RDWR)
        self._thread_lock = threading.Lock()
        self._cols = {}
        offset = HEADER_BYTES
        for name, dtype in COLUMNS:
            self._cols[name] = np.frombuffer(
                self._mm, dtype=dtype, count=self.capacity, offset=offset
            )
            offset += self.capacity * np.dtype(dtype).itemsize

    def _wait_complete(self, fd: int) -> None:
        deadline = time.monotonic() + 5
        while os.pread(fd, len(MAGIC), 0) != MAGIC:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.path} is not an emulated GPU state file")
            time.sleep(0.001)

    @contextlib.contextmanager
    def lock(self):
        """Exclusive appending, across the job's processes (flock) and threads: the owner's
        samples and a reader's hold sample (hw/emulated/node.py) never interleave."""
        with self._thread_lock:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    def since(self, count0: int) -> dict[str, np.ndarray]:
        """The samples appended after the first ``count0`` (column -> array; oldest first)."""
        count = self.get("count")
        idx = np.arange(max(count0, count - self.capacity + MARGIN), count) % self.capacity
        return {k: c[idx].copy() for k, c in self._cols.items()}

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._lock_fd)
        self._cols = {}
        try:
            self._mm.close()
        except BufferError:  # a numpy view still refers to it; the mapping goes with the process
            pass

    # ---------------------------------------------------------------------------- header
    def get(self, field: str) -> int:
        return _Q.unpack_from(self._mm, _FIELDS[field])[0]

    def set(self, field: str, value: int) -> None:
        _Q.pack_into(self._mm, _FIELDS[field], int(value))

    def anchor(self, slot: int) -> tuple[int, float]:
        """(occurrence + 1, energy mJ) recorded for fault ``slot`` (occurrence + 1 = 0: none)."""
        at = _ANCHORS_AT + 16 * slot
        return _Q.unpack_from(self._mm, at)[0], _D.unpack_from(self._mm, at + 8)[0]

    def set_anchor(self, slot: int, occurrence: int, energy_mj: float) -> None:
        at = _ANCHORS_AT + 16 * slot
        _D.pack_into(self._mm, at + 8, float(energy_mj))  # value first, then its key
        _Q.pack_into(self._mm, at, occurrence + 1)

    # ---------------------------------------------------------------------------- samples
    def append(self, t_ns, energy_mj, power_w, clock_mhz, reasons) -> None:
        """Append samples (scalars or equal-length arrays, in time order); owner only."""
        values = [
            np.atleast_1d(np.asarray(v)) for v in (t_ns, energy_mj, power_w, clock_mhz, reasons)
        ]
        n = len(values[0])
        for start in range(0, n, self.capacity - MARGIN):  # never lap the readers' window
            stop = min(n, start + self.capacity - MARGIN)
            count = self.get("count")
            idx = (count + np.arange(stop - start)) % self.capacity
            for (name, dtype), v in zip(COLUMNS, values, strict=True):
                self._cols[name][idx] = v[start:stop].astype(dtype)
            self.set("count", count + stop - start)  # after the samples: readers see them whole

    def segments(self) -> list[dict[str, np.ndarray]]:
        """The readable samples as at most two time-ordered column slices (older first)."""
        count = self.get("count")
        if count == 0:
            return []
        cap = self.capacity
        if count <= cap:
            return [{k: c[:count] for k, c in self._cols.items()}]
        head = count % cap
        older = (
            {k: c[head + MARGIN :] for k, c in self._cols.items()} if head + MARGIN < cap else None
        )
        newer = {k: c[:head] for k, c in self._cols.items()}
        skip = max(0, head + MARGIN - cap)  # the margin wrapped into the newer slice
        newer = {k: v[skip:] for k, v in newer.items()}
        return [s for s in (older, newer) if s is not None and len(s["t_ns"])]

    def last(self) -> dict | None:
        """The newest sample (column -> value), or None before the first."""
        count = self.get("count")
        if count == 0:
            return None
        i = (count - 1) % self.capacity
        return {k: c[i].item() for k, c in self._cols.items()}
