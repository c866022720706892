"""Every file of one job: :class:`JobDir` (the paths of its directory, spelled once) and
:class:`Outputs` (the files it writes, as the launched job carries them)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, kw_only=True)
class Outputs:
    """Every file one job writes (paths from :class:`JobDir`, or their staging copies).

    ``shards`` maps a batch size (as a string: a JSON key) to its repetitions' shard paths;
    ``emulated`` is the emulated node's state directory (measurement.device emulated), else None.
    """

    shards: dict[str, list[str]]
    job_table: str
    job_json: str
    generations: str
    power: str
    requests: str
    emulated: str | None

    def shard(self, batch_size: int, repetition: int) -> str:
        return self.shards[str(batch_size)][repetition]

    def paths(self) -> list[str]:
        """Every path: the shards (batch size outer, repetition inner), then the job's files (the
        emulated node's directory last, where there is one)."""
        files = [getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "shards"]
        return [p for reps in self.shards.values() for p in reps] + [f for f in files if f]

    def restaged(self, staging: Path, base: Path) -> Outputs:
        """The same outputs, each moved under ``staging`` (relative to ``base``)."""

        def move(p: str) -> str:
            return str(staging / Path(p).resolve().relative_to(base))

        files = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return dataclasses.replace(
            self,
            shards={bs: [move(p) for p in reps] for bs, reps in self.shards.items()},
            **{name: p and move(p) for name, p in files.items() if name != "shards"},
        )


def _file(name: str, doc: str) -> property:
    """A JobDir property: the path of ``name`` in the job's directory."""
    return property(lambda self: f"{self.root}/{name}", doc=doc)


@dataclass(frozen=True)
class JobDir:
    """Every path of one job: ``root`` is ``results/shards/<params>`` (may hold wildcards).

    The one place a job's file names are spelled; find a file by its property's name
    (:meth:`find`), never by its name.
    """

    root: str

    @classmethod
    def of(cls, job_json: str | Path) -> JobDir:
        """The directory of a job's ``job.json``."""
        return cls(str(Path(job_json).parent))

    @staticmethod
    def find(shards_dir: str | Path, file: str) -> list[Path]:
        """Every job's ``file`` (a property's name: ``"power"``, ``"job_json"``) below
        ``shards_dir``."""
        name = Path(getattr(JobDir("."), file)).name
        return sorted(Path(shards_dir).rglob(name))

    def shard(self, bs, rep) -> str:
        return f"{self.root}/bs~{bs}/rep~{rep}.parquet"

    def shards(self, batch_sizes, reps) -> list[str]:
        """Every per-window shard, batch size outer, repetition inner (Snakemake's expand)."""
        return [self.shard(bs, rep) for bs in batch_sizes for rep in reps]

    job_table = _file("shards.parquet", "The job's shards in one file: what the merge reads.")
    job_json = _file("job.json", "The job record; published last, it marks a complete job.")
    generations = _file("generations.parquet", "The generated token ids (for accuracy checks).")
    power = _file("power.parquet", "The power samples of the job's GPUs.")
    requests = _file("requests.parquet", "The engine backends' per-request timings.")
    spec_file = _file(".spec.json", "The launched job the ranks read (written by the launcher).")
    emulated = _file(
        "emulated",
        "measurement.device emulated only: the emulated node's settings and ground truth "
        "(<host>/truth-gpu<i>-<pid>.parquet); published with the job, read by tests and the "
        "benchmark, never by the pipeline.",
    )

    def outputs(self, batch_sizes, reps: int, *, emulated: bool) -> Outputs:
        """The job's :class:`Outputs`: shard paths per batch size, then the job's other files;
        ``emulated`` (measurement.device emulated): the emulated node's state directory too."""
        return Outputs(
            shards={str(bs): [self.shard(bs, r) for r in range(reps)] for bs in batch_sizes},
            job_table=self.job_table,
            job_json=self.job_json,
            generations=self.generations,
            power=self.power,
            requests=self.requests,
            emulated=self.emulated if emulated else None,
        )
