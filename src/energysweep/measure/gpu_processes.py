"""Who else computes on a measured GPU: NVML's process list at both edges of every window.

A GPU's energy counter counts every process on it. Where another job or user computes on a
measured GPU during a window, the window's energy is not the job's (issue 27: two jobs of one
sweep measured one H200 at once and every point said ``ok``). Right before each window's start
edge and right after its end edge (outside the window's energy, as the GPU setting probe)
each rank lists the processes with a compute context on its GPUs
(``nvmlDeviceGetComputeRunningProcesses``); a process that is not the job's own
(energysweep.util.proctree: the launcher's process tree, or the job's mark) makes the row
``shared``, which the verdict turns into ``gpu_shared``.

Row columns (tables/shards.py): ``gpu_processes_status`` ok | shared | unverifiable (...) |
unavailable (...) | not-applicable (...), and ``gpu_processes_foreign`` (the other processes and
at which edge they were seen; null when none).
"""

from __future__ import annotations

from energysweep.hw import nvml as hw_nvml
from energysweep.util import proctree

OK = "ok"
SHARED = "shared"
NO_GPU = "not-applicable (no GPU measured)"


class ProcessProbe:
    """The process list of a rank's GPUs, read around every window.

    Args:
        gpu_uuids: the rank's measured GPUs.
        own: whether a pid is the job's (default :func:`energysweep.util.proctree.of_job`).
    """

    def __init__(self, gpu_uuids: list[str], own=proctree.of_job):
        self.gpu_uuids = list(gpu_uuids)
        self.own = own
        self._handles: dict[str, object] | None = None
        self._error: str | None = None
        if self.gpu_uuids:
            try:
                hw_nvml.init()
                self._handles = {u: hw_nvml.handle_by_uuid(u) for u in self.gpu_uuids}
            except hw_nvml.NVMLError as exc:
                self._error = f"unavailable (NVML: {exc})"

    def read(self) -> dict[str, list[int] | str]:
        """Per GPU the pids computing on it now, or why they could not be read."""
        if self._handles is None:
            return dict.fromkeys(self.gpu_uuids, self._error or NO_GPU)
        out: dict[str, list[int] | str] = {}
        for uuid, handle in self._handles.items():
            try:
                out[uuid] = hw_nvml.compute_pids(handle)
            except hw_nvml.NVMLError as exc:
                out[uuid] = f"unavailable (nvmlDeviceGetComputeRunningProcesses: {exc})"
        return out

    def columns(self, uuid: str | None, before: dict | None, after: dict | None) -> dict:
        """The row columns of GPU ``uuid`` from the lists read at the window's two edges."""
        if uuid is None or before is None or after is None:
            return {"gpu_processes_status": NO_GPU, "gpu_processes_foreign": None}
        seen: dict[int, list[str]] = {}
        for edge, lists in (("start", before), ("end", after)):
            pids = lists.get(uuid, NO_GPU)
            if isinstance(pids, str):
                return {"gpu_processes_status": pids, "gpu_processes_foreign": None}
            for pid in pids:
                seen.setdefault(pid, []).append(edge)
        if seen and not any(proctree.visible(p) for p in seen):
            # Another pid namespace (a container): the pids cannot be told apart here.
            return {
                "gpu_processes_status": f"unverifiable (pids {sorted(seen)} are not visible "
                "in this pid namespace)",
                "gpu_processes_foreign": None,
            }
        foreign = {p: e for p, e in seen.items() if not self.own(p)}
        text = "; ".join(f"pid {p} at {'+'.join(e)}" for p, e in sorted(foreign.items()))
        return {
            "gpu_processes_status": SHARED if foreign else OK,
            "gpu_processes_foreign": text or None,
        }

    def close(self) -> None:
        if self._handles is not None:
            self._handles = None
            hw_nvml.shutdown()
