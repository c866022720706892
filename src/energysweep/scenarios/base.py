"""The point loop every scenario shares, and what both scenarios split prompts and sequences by.

A :class:`Scenario` runs the windows of one job on one rank: for each batch size (``point``) it
prepares the point, then measures ``workload.repetitions`` repetitions, each after a cooldown. A
failure at one batch size (OOM, error) is agreed across ranks and recorded as that point's status
(failed rows) and the job goes on; a failure on some ranks only, or in a collective, aborts the
job. Subclasses say what a point prepares and what one repetition measures.
"""

from __future__ import annotations

import socket
import time
import traceback
from abc import ABC, abstractmethod

from energysweep import dist
from energysweep.energy import CpuTime
from energysweep.gpu_setting.probe import SettingNotApplied
from energysweep.job.spec import LaunchedJob
from energysweep.measure import progress
from energysweep.measure.phase_clock import during, switch
from energysweep.measure.rows import failed_rows, model_parameters, window_rows
from energysweep.measure.warmup import max_seconds, warm_up
from energysweep.measure.window import measure_window
from energysweep.tables.phases import JobPhase, Phase
from energysweep.tables.status import Status
from energysweep.util import faults
from energysweep.util.oom import is_oom


def prompt_indices(iteration: int, batch_size: int, dp: int, dp_rank: int, n_prompts: int):
    """Prompt indices of one replica's batch: global batch ``iteration`` split contiguously."""
    global_batch = batch_size * dp
    start = iteration * global_batch + dp_rank * batch_size
    return [(start + j) % n_prompts for j in range(batch_size)]


# job.json timing.cooldown_skipped where no energy source reads a rank's windows (cool_down).
COOLDOWN_SKIPPED = "no energy source reads the windows (no GPU energy counter, no RAPL)"


class Scenario(ABC):
    """Runs the windows of one job on one rank.

    Attributes:
        name: the scenario's name in the job (``job.scenario``, the fault hook's ``scenario``).
        generations: rows of generations.parquet (inference; empty for training).
        window_ns_total: time spent inside measured windows (job.json ``timing.window_s``).
        warmups: each point's warm-up (job.json ``timing.warmup``; energysweep.measure.warmup).
        prepare_what: what :meth:`prepare` does, as the job's log says it (progress lines).
        rows_final: True where one process's rows are already the window's (a serving client
            measures every GPU): rank 0 writes them as they are instead of combining ranks
            (energysweep.measure.combine.combine_ranks).
    """

    name: str
    rows_final = False
    prepare_what = "warm-up"  # what prepare() does, for the job's log

    def __init__(
        self, job: LaunchedJob, ctx: dist.RankContext, backend, prompts: list[str], monitor
    ):
        self.job = job
        self.ctx = ctx
        self.backend = backend
        self.prompts = prompts
        self.wl = job.workload
        self.m = job.measurement
        self.monitor = monitor
        self.energy = monitor.energy
        self.host = monitor.host
        self.clock = monitor.clock
        self.sleep = monitor.sleep
        self.min_window_s = float(self.m.min_window_s)
        self.collective_timeout_s = float(job.limits.collective_timeout_s)
        self.cpu = CpuTime()
        self.window_ns_total = 0
        self.warmups: list[dict] = []
        # The shortest start-edge wait for counter refreshes so far (cool_down); None: none yet.
        self._align_s = 0.0
        self._aligned: float | None = None
        # Why the cooldowns were skipped (cool_down), None where they ran.
        self.cooldown_skipped: str | None = None
        self.generations: list[dict] = []
        self.params, self.params_method = model_parameters(job, ctx.model_dir)

    @abstractmethod
    def phases(self) -> list[Phase]:
        """The phases one repetition measures (the rows of a failed point)."""

    @abstractmethod
    def prepare(self, bs: int) -> None:
        """Everything before the first measured window of a point (batches, warm-up)."""

    @abstractmethod
    def repetition(self, bs: int, rep: int, cooldown_s: float) -> list[dict]:
        """This rank's rows of repetition ``rep`` (its cooldowns and windows)."""

    def end_point(self) -> None:  # noqa: B027 - an optional hook
        """Release what :meth:`prepare` made (runs whether the point succeeded or not)."""

    def is_fatal(self, exc: BaseException) -> bool:
        """True where a point's exception must end the job rather than become its status."""
        return False

    def close(self) -> None:  # noqa: B027 - an optional hook
        """Release what the scenario holds for the whole job."""

    def cool_down(self, seconds: float) -> None:
        """Idle before a window (``measurement.cooldown_s``), less the wait for the energy
        counters' refreshes at its start edge (the previous window's), which is idle too: the
        GPU still rests at least ``seconds`` before the edge, and the job waits once, not twice.

        Where no energy source reads this rank's windows (no GPU counter, no RAPL: CPU ranks on
        a machine without them), there is no power to settle: the cooldowns are skipped, as the
        idle baseline is, and job.json ``timing.cooldown_skipped`` says why.
        """
        if seconds > 0 and not (self.energy.available or self.host.available):
            if self.cooldown_skipped is None:
                self.cooldown_skipped = COOLDOWN_SKIPPED
                if self.ctx.rank == 0:
                    progress.say(f"cooldowns ({seconds:g} s before each window): skipped, "
                                 f"{COOLDOWN_SKIPPED}")  # fmt: skip
            return
        with during(JobPhase.COOLDOWN):
            self.sleep(max(0.0, seconds - self._align_s))

    def measured(self, step, min_iters: int, synchronize) -> dict:
        """The window rule (:func:`energysweep.measure.window.measure_window`) on this rank."""
        w = measure_window(
            step,
            min_iters,
            synchronize,
            min_window_s=self.min_window_s,
            clock=self.clock,
            energy=self.energy,
            host=self.host,
            cpu=self.cpu,
            settings=self.monitor.settings,
            node=self.monitor.node,
            processes=self.monitor.processes,
        )
        self.window_ns_total += w["end"] - w["start"]
        # The shortest wait so far: the next one is at least as long (two refreshes).
        self._align_s = w["align_s"] if self._aligned is None else min(self._aligned, w["align_s"])
        self._aligned = self._align_s
        return w

    def warm_up_until_steady(self, bs: int, step, synchronize, min_iterations: int) -> None:
        """Unmeasured iterations of ``step`` until iteration time is steady (bounded), recorded
        in :attr:`warmups` (energysweep.measure.warmup)."""
        bound = max_seconds(self.m.warmup_max_s, self.min_window_s)
        w = warm_up(step, synchronize, min_iterations=min_iterations, max_s=bound, clock=self.clock)
        self.warmups.append({"batch_size": bs, **w, "max_s": bound})
        if self.ctx.rank == 0:
            state = "steady" if w["steady"] else "not steady (bound reached)"
            print(
                f"warm-up, batch size {bs}: {w['iterations']} iterations in "
                f"{w['seconds']:.2f} s, {state}",
                flush=True,
            )

    def point(self, bs: int) -> list[list[dict]]:
        """All windows of one batch size: a list (one per repetition) of this rank's rows."""
        cooldown_s = float(self.m.cooldown_s)
        windows: list[list[dict]] = []
        error = None
        phase = switch(JobPhase.OTHER)  # job.json timing.phases_s; restored however it ends
        try:
            layout = (self.ctx.layout.tp, self.ctx.layout.pp, self.ctx.layout.dp)
            faults.inject(self.ctx.rank, bs, self.name, layout=layout)  # test-only; off unless set
            self.check_settings(bs)
            t_prepare = time.monotonic()
            with during(JobPhase.WARMUP):  # batches, warm-up (training: its model, a LOAD)
                self.prepare(bs)
            if self.ctx.rank == 0:
                took = time.monotonic() - t_prepare
                progress.say(
                    f"batch size {bs}: {self.prepare_what} done in {took:.1f} s; "
                    f"{self.wl.repetitions} repetition(s) next"
                )
            # The job's idle baseline: once, after the first warm-up, as the windows run.
            first_idle = not self.monitor._idle_done
            self.monitor.ensure_idle()
            if self.ctx.rank == 0 and first_idle and self.monitor._idle_done:
                m = self.monitor
                progress.say(progress.idle_line(m.idle_window_s, m.idle_gpu, m.idle_host))
            for rep in range(self.wl.repetitions):
                windows.append(self.repetition(bs, rep, cooldown_s))
        except Exception as exc:  # agreed across ranks: the point's status, or the job aborts
            if self.is_fatal(exc):
                raise
            error = self.point_error(exc, is_oom(exc))
        finally:
            self.end_point()
            switch(phase)
        return self.agree_on_failure(error, bs, windows)

    def check_settings(self, bs: int) -> None:
        """Fail the point, on every rank alike, where the job's GPU setting is not in effect.

        Collective (only in jobs that set a GPU setting): every rank's problems are gathered,
        so all ranks fail the point together and none of its windows runs.
        """
        if self.job.gpu is None:
            return
        mine = self.monitor.settings.problems()
        if mine and self.m.device == "auto" and self.ctx.device == "cpu":
            # auto is decided here, on the job's node (never where the workflow was loaded):
            # a node without a GPU fails the points that ask for a GPU setting, saying so.
            mine = [
                f"measurement.device auto found no CUDA GPU on {socket.gethostname()} (the "
                "ranks ran on CPUs), so there is no GPU to set or verify", *mine,
            ]  # fmt: skip
        problems = [p for rank in dist.gather(mine) for p in rank]
        if problems:
            raise SettingNotApplied(
                f"GPU setting ({self.job.gpu.label()}) is not in effect, so batch size {bs} was "
                f"not measured: {'; '.join(sorted(set(problems)))[:1500]}"
            )

    def point_error(self, exc: BaseException, oom: bool) -> tuple[str, str, bool]:
        """What :meth:`agree_on_failure` needs of a point's exception: (status, message, fatal).

        Fatal: a collective failed (timed out, peer gone); the process group is then unusable.
        """
        traceback.print_exc()
        return (
            Status.OOM if oom else Status.ERROR,
            f"{type(exc).__name__}: {exc}",
            dist.is_communication_failure(exc),
        )

    def agree_on_failure(
        self, error: tuple[str, str, bool] | None, bs: int, windows: list[list[dict]]
    ) -> list[list[dict]]:
        """``windows``, or failed rows for every repetition if every rank's point failed.

        Collective on the agreement group (:func:`energysweep.dist.agree`), which every rank
        reaches once per point whatever happened in it. A point that failed on *every* rank (an
        OOM at this batch size, a bad batch) becomes that point's status and the job goes on. A
        point that failed on some ranks only, or in a collective, means the others are (or were)
        waiting in a collective the failed rank never joined: the ranks are out of step, so the
        job aborts (:class:`energysweep.dist.JobAborted`). A rank that does not arrive within
        ``limits.collective_timeout_s`` (stuck or dead) aborts the job too.

        Raises:
            energysweep.dist.JobAborted: naming the ranks, their errors and the batch size.
        """
        try:
            outcomes = dist.agree(error)
        except Exception as exc:
            mine = f"this rank's point failed: {error[1]}" if error else "this rank's point is done"
            raise dist.JobAborted(
                f"rank {self.ctx.rank}: the ranks did not agree on batch size {bs} within "
                f"limits.collective_timeout_s={self.collective_timeout_s:g} s; another rank is "
                f"stuck or dead ({type(exc).__name__}: {str(exc).splitlines()[0][:300]}); {mine}. "
                "Aborting the job"
            ) from exc
        failed = {rank: e for rank, e in enumerate(outcomes) if e is not None}
        if not failed:
            return windows
        msg = "; ".join(sorted({e[1] for e in failed.values()}))[:2000]
        if len(failed) < len(outcomes) or any(e[2] for e in failed.values()):
            raise dist.JobAborted(
                f"batch size {bs} failed on rank(s) {sorted(failed)} of {len(outcomes)}: {msg}. "
                "A failure on some ranks only, or in a collective, leaves the ranks' collectives "
                "out of step, so the job cannot go on (a failure every rank sees, such as an OOM "
                "at this batch size, is recorded as the point's status instead). Aborting the job"
            )
        oom = any(e[0] == Status.OOM for e in failed.values())
        status = Status.OOM if oom else Status.ERROR
        return [self._failed_rows(bs, rep, status, msg) for rep in range(self.wl.repetitions)]

    def _rows(self, bs: int, rep: int, phase: Phase, w: dict) -> list[dict]:
        return window_rows(
            self.job, self.ctx, bs, rep, phase, w, self.monitor, (self.params, self.params_method)
        )

    def _failed_rows(self, bs: int, rep: int, status: str, msg: str) -> list[dict]:
        return failed_rows(
            self.job,
            self.ctx,
            bs,
            rep,
            status,
            msg,
            self.phases(),
            self.monitor,
            (self.params, self.params_method),
        )
