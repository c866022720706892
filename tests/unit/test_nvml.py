import inspect

import pyarrow as pa
import pynvml as real
import pytest

from energysweep import energy
from energysweep.energy import nvml as es_nvml
from energysweep.hw import nvml as hw_nvml
from energysweep.tables.status import EnergyStatus

import fake_pynvml


def test_fake_matches_real_api():
    """Every faked function exists in the real pynvml with the same parameters."""
    fake = fake_pynvml.make_fake(fake_pynvml.h100s(1))
    for name in fake_pynvml.FAKED:
        assert hasattr(real, name), f"pynvml.{name} no longer exists"
        real_params = list(inspect.signature(getattr(real, name)).parameters)
        fake_params = list(inspect.signature(getattr(fake, name)).parameters)
        assert fake_params == real_params, f"{name}: fake {fake_params} != real {real_params}"
    # Errors raised are the real classes.
    err = real.NVMLError(real.NVML_ERROR_LIBRARY_NOT_FOUND)
    assert type(err).__name__ == "NVMLError_LibraryNotFound"


def test_everything_energysweep_calls_is_faked():
    import re

    src = inspect.getsource(hw_nvml)  # the only module that calls pynvml (test below)
    called = set(re.findall(r"pynvml\.(nvml[A-Za-z0-9_]+)\(", src))
    # The environment snapshot calls its queries by name from tables.
    called |= {fn for _, fn, *_ in hw_nvml.GPU_QUERIES + hw_nvml.SYSTEM_QUERIES}
    assert len(called) > 15
    assert called <= set(fake_pynvml.FAKED), called - set(fake_pynvml.FAKED)


def test_only_the_hardware_layer_talks_to_nvml():
    """pynvml is imported, and MIG slices are recognised, in energysweep.hw.nvml alone."""
    import ast
    from pathlib import Path

    src = Path(hw_nvml.__file__).resolve().parents[1]
    importers, mig = [], []
    for path in sorted(src.rglob("*.py")):
        text = path.read_text()
        for node in ast.walk(ast.parse(text)):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            if any(n.split(".")[0] == "pynvml" for n in names):
                importers.append(path.relative_to(src).as_posix())
        if '"MIG-"' in text:
            mig.append(path.relative_to(src).as_posix())
    assert importers == ["hw/nvml.py"]
    assert mig == ["hw/nvml.py"]


def test_one_mig_refusal_names_the_slices():
    hw_nvml.refuse_mig(None)
    hw_nvml.refuse_mig("0,GPU-4f0e1b3c")
    with pytest.raises(hw_nvml.MigSlice, match=r"\(MIG-a, MIG-b\): MIG slices have no energy"):
        hw_nvml.refuse_mig("MIG-a, MIG-b")


def test_every_source_implements_the_one_interface():
    from energysweep.energy import cputime, crosscheck, rapl, unavailable, unreadable, zeus
    from energysweep.energy.base import EnergySource

    sources = [
        es_nvml.NvmlSource,
        zeus.ZeusSource,
        crosscheck.CrossCheckSource,
        unavailable.UnavailableSource,
        unreadable.WithUnreadable,
        rapl.RaplSource,
        rapl.UnavailableHostSource,
        cputime.CpuTime,
    ]
    assert all(issubclass(cls, EnergySource) for cls in sources)

    class Half(EnergySource):
        def begin(self):
            pass

    with pytest.raises(TypeError, match="end"):  # a source without end() cannot be made
        Half()


def test_rank_gpu_uuid_from_torch(monkeypatch):
    """The rank's GPU by UUID as torch reports it (run.py's device -> UUID), GPU- prefixed."""
    import torch

    assert hw_nvml.gpu_uuids("cpu") == []
    seen = []

    def props(device):
        seen.append(device)
        return type("P", (), {"uuid": "4f0e1b3c-aaaa-bbbb-cccc-000000000001"})()

    monkeypatch.setattr(torch.cuda, "get_device_properties", props)
    assert hw_nvml.gpu_uuids("cuda:1") == ["GPU-4f0e1b3c-aaaa-bbbb-cccc-000000000001"]
    assert seen == [torch.device("cuda:1")]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert hw_nvml.torch_uuids() == ["GPU-4f0e1b3c-aaaa-bbbb-cccc-000000000001"] * 2
    assert seen[1:] == [0, 1]


def test_energy_delta_by_uuid(fake_nvml):
    mod = fake_nvml(fake_pynvml.h100s(2))
    g1 = mod.fake_gpus[1]
    src = es_nvml.NvmlSource([g1.uuid])
    src.begin()
    g1.energy_mj += 12_345
    mod.fake_gpus[0].energy_mj += 99_999  # another GPU: not ours
    src._start_ns -= 200_000_000  # a 200 ms window
    (r,) = src.end()
    assert (r.gpu_uuid, r.gpu_index, r.energy_mj, r.status) == (g1.uuid, 1, 12_345.0, "measured")
    assert r.gpu_pci_bus_id == g1.pci_bus_id
    src.close()


def test_short_window_flagged(fake_nvml):
    mod = fake_nvml(fake_pynvml.h100s(1))
    src = es_nvml.NvmlSource([mod.fake_gpus[0].uuid])
    src.begin()
    (r,) = src.end()
    assert r.status == EnergyStatus.SHORT_WINDOW
    assert r.energy_mj == 0.0 and "update period" in r.detail


def test_counter_backwards_is_an_error(fake_nvml):
    mod = fake_nvml(fake_pynvml.h100s(1))
    src = es_nvml.NvmlSource([mod.fake_gpus[0].uuid])
    src.begin()
    mod.fake_gpus[0].energy_mj -= 5
    with pytest.raises(es_nvml.CounterWentBackwards):
        src.end()


def test_no_driver_is_unavailable_not_zero(fake_nvml):
    fake_nvml(fake_pynvml.h100s(1), init_error=real.NVML_ERROR_LIBRARY_NOT_FOUND)
    src = energy.make_source("auto", "cuda:0", ["GPU-x"])
    (r,) = (src.begin(), src.end())[1]
    assert r.energy_mj is None and r.status == "unavailable"
    assert "NVMLError_LibraryNotFound" in r.detail
    with pytest.raises(real.NVMLError):
        energy.make_source("nvml", "cuda:0", ["GPU-x"])


def test_cpu_rank_is_unavailable():
    src = energy.make_source("auto", "cpu", [])
    src.begin()
    (r,) = src.end()
    assert r.energy_mj is None and r.status == "unavailable" and "no GPU" in r.detail
    with pytest.raises(RuntimeError, match="energy_source is nvml"):
        energy.make_source("nvml", "cpu", [])


@pytest.mark.parametrize(
    "cvd, expect",
    [
        (None, [0, 1, 2, 3]),
        ("0,1", [0, 1]),
        ("3,1", [3, 1]),  # reordered: CUDA order follows the variable
        ("", []),
        ("2,-1,3", [2]),  # CUDA stops at the first invalid index
    ],
)
def test_resolve_visible_indices(fake_nvml, cvd, expect):
    mod = fake_nvml(fake_pynvml.h100s(4))
    mod.nvmlInit()
    uuids = [g.uuid for g in mod.fake_gpus]
    assert hw_nvml.resolve_visible_gpus(cvd) == [uuids[i] for i in expect]


def test_resolve_visible_uuids_and_mig(fake_nvml):
    mod = fake_nvml(fake_pynvml.h100s(4))
    mod.nvmlInit()
    uuids = [g.uuid for g in mod.fake_gpus]
    assert hw_nvml.resolve_visible_gpus(f"{uuids[2]},{uuids[0][:12]}") == [uuids[2], uuids[0]]
    with pytest.raises(ValueError, match="MIG slices have no energy counter"):
        hw_nvml.resolve_visible_gpus("MIG-4f0e1b3c-aaaa-bbbb-cccc-000000000000")
    with pytest.raises(ValueError, match="matches 4 GPUs"):
        hw_nvml.resolve_visible_gpus("GPU-")


def test_gpu_without_energy_counter(fake_nvml):
    mod = fake_nvml(fake_pynvml.h100s(1))
    mod.fake_gpus[0].supports_energy = False  # pre-Volta: no counter
    src = energy.make_source("auto", "cuda:0", [mod.fake_gpus[0].uuid])
    (r,) = (src.begin(), src.end())[1]
    assert r.energy_mj is None and "NotSupported" in r.detail
    with pytest.raises(real.NVMLError_NotSupported):
        energy.make_source("nvml", "cuda:0", [mod.fake_gpus[0].uuid])


def test_unknown_source_named():
    with pytest.raises(ValueError, match="measurement.energy_source 'rapl'"):
        energy.make_source("rapl", "cuda:0", ["GPU-x"])


def test_gpu_snapshot_and_job_environment(fake_nvml):
    from energysweep.measure import provenance as envinfo
    from energysweep.tables import environment

    mod = fake_nvml(fake_pynvml.h100s(2))
    g = mod.fake_gpus[1]
    (snap,) = hw_nvml.gpu_snapshot([g.uuid])
    assert snap["index"] == 1 and snap["pci_bus_id"] == g.pci_bus_id
    assert snap["memory_total_bytes"] == 80 * 2**30 and snap["power_limit_mw"] == 700_000
    assert snap["max_sm_clock_mhz"] == 1980 and snap["compute_capability"] == [9, 0]
    assert snap["driver"] == "580.95.05" and snap["cuda_driver_version"] == 13000
    assert not [k for k in snap if k.endswith("_error")]
    g.temperature_c = 71
    end = hw_nvml.gpu_snapshot([g.uuid])
    # Two ranks on two nodes; rank 1 shares node0's GPU (counted once).
    starts = [
        {
            "rank": 0,
            "host": "node0",
            "local_rank": 0,
            "gpus": [snap],
            "host_info": {"host": "node0", "packages": {"zeus": "0.16.0"}, "slurm": {}},
        },
        {"rank": 1, "host": "node0", "local_rank": 1, "gpus": [snap], "host_info": None},
        {
            "rank": 2,
            "host": "node1",
            "local_rank": 0,
            "gpus": [],
            "host_info": {"host": "node1", "packages": {}, "slurm": {}},
        },
    ]
    env = envinfo.job_environment(
        starts, [{"rank": 0, "gpus": end}], "j1", "h", "0.1.0+gabc123def456.dirty", {"seed": 0}
    )
    assert env["gpu_count"] == 1 and env["host_count"] == 2
    (gpu,) = env["gpus"]
    assert gpu["ranks"] == [0, 1] and gpu["host"] == "node0"
    assert (gpu["temperature_start_c"], gpu["temperature_end_c"]) == (40, 71)
    assert env["git_commit"] == "abc123def456"
    (row,) = environment.environment_rows({"job_id": "j1", "environment": env})
    assert row["gpu_uuid"] == g.uuid and row["zeus_version"] == "0.16.0"
    assert row["gpu_temperature_end_c"] == 71 and row["seed"] == 0
    # Every row key is a column of the table's schema, and a snapshot's values fit its types.
    assert list(row) == environment.schema().names
    table = pa.Table.from_pylist([row], schema=environment.schema())
    assert table.column("gpu_temperature_end_c").to_pylist() == [71]


def test_mig_slice_is_unavailable_not_guessed(fake_nvml, monkeypatch):
    mod = fake_nvml(fake_pynvml.h100s(1))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-4f0e1b3c-aaaa-bbbb-cccc-000000000000")
    src = energy.make_source("auto", "cuda:0", [mod.fake_gpus[0].uuid])
    (r,) = (src.begin(), src.end())[1]
    assert r.energy_mj is None and "MIG" in r.detail
    with pytest.raises(energy.SourceUnavailable, match="MIG"):
        energy.make_source("nvml", "cuda:0", [mod.fake_gpus[0].uuid])
