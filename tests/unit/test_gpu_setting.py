"""GPU power limits and clocks: Slurm's vocabulary, apply / read back / restore through NVML
(the fake pynvml, built from the real module's errors), the launcher's guard, the ranks' probe,
and the config checks that refuse hostile values before any job."""

from __future__ import annotations

import copy
import io
import json
from pathlib import Path

import pynvml as real
import pytest
import yaml

from energysweep.gpu_setting import control as gs
from energysweep.gpu_setting.probe import SettingsProbe, refusals
from energysweep.gpu_setting.record import RECORD_ENV, SettingsRecord
from energysweep.job.gpu_freq import ClockSyntaxError, nearest, parse_clock
from energysweep.job.gpu_request import GpuRequest
from energysweep.job.sections import JobSpecError
from energysweep.job.spec import JobKey
from energysweep.launch import gpu_guard
from energysweep.sweep import config as es_config
from energysweep.sweep import gpu_axes

import fake_pynvml

ROOT = Path(__file__).resolve().parents[2]
SM = fake_pynvml.SM_CLOCKS_MHZ  # 1980 .. 345 in steps of 15 (descending, as NVML lists them)


# --------------------------------------------------------------------------- vocabulary
@pytest.mark.parametrize(
    "text, sm, mem",
    [
        ("medium", "medium", "high"),
        ("1410", "1410", "high"),
        (1410, "1410", "high"),
        ("low,memory=high", "low", "high"),
        ("memory=low", "high", "low"),
        ("memory=medium,highm1", "highm1", "medium"),
    ],
)
def test_slurm_gpu_freq_vocabulary_parses(text, sm, mem):
    spec = parse_clock(text)
    assert (spec.sm, spec.mem) == (sm, mem)


@pytest.mark.parametrize(
    "text",
    ["turbo", "", "medium,medium", "verbose", "-5", "0", "sm=1410", "memory=", "low;rm -rf", "١٢"],
)
def test_words_slurm_does_not_know_are_refused(text):
    with pytest.raises(ClockSyntaxError, match="--gpu-freq knows"):
        parse_clock(text)


def test_words_resolve_as_slurm_resolves_them():
    clocks = [1410, 1980, 1500, 1200, 900]  # any order: sorted high to low first
    assert nearest("high", clocks) == 1980
    assert nearest("highm1", clocks) == 1500
    assert nearest("medium", clocks) == 1410  # index (5 - 1) // 2 of the descending list
    assert nearest("medium", [1980, 1500, 1410, 1200]) == 1500  # index (4 - 1) // 2 = 1
    assert nearest("low", clocks) == 900
    assert nearest("1450", clocks) == 1500  # between: the next one up
    assert nearest("1410", clocks) == 1410  # exact
    assert (nearest("5000", clocks), nearest("100", clocks)) == (1980, 900)  # clamped
    assert nearest("highm1", [1200]) == 1200


# --------------------------------------------------------------------------- apply / restore
def _gpus(fake_nvml, n=2, **kw):
    gpus = fake_pynvml.h100s(n)
    for g in gpus:
        for k, v in kw.items():
            setattr(g, k, v)
    return fake_nvml(gpus).fake_gpus


def _apply(gpus, *args, **kw):
    from energysweep.hw import nvml

    with nvml.session():
        return gs.apply([g.uuid for g in gpus], *args, **kw)


def _restore(settings):
    from energysweep.hw import nvml

    with nvml.session():
        return gs.restore(settings)


def test_apply_sets_reads_back_and_restore_puts_previous_values_back(fake_nvml):
    gpus = _gpus(fake_nvml, privileged=True)
    gpus[1].power_limit_mw, gpus[1].app_mem_mhz, gpus[1].app_sm_mhz = 500_000, 2619, 1500
    settings = _apply(gpus, 300, "medium")
    medium = SM[(len(SM) - 1) // 2]
    for g, s in zip(gpus, settings, strict=True):
        assert (s.power_limit_status, s.clock_status, s.detail) == ("applied", "applied", [])
        assert (g.power_limit_mw, g.app_sm_mhz, g.app_mem_mhz) == (300_000, medium, 2619)
        assert (s.power_limit_target_w, s.sm_clock_target_mhz) == (300.0, medium)
        assert s.default_power_limit_w == 700.0 and s.default_sm_clock_mhz == 1980
    assert _restore(settings) == []
    assert (gpus[0].power_limit_mw, gpus[0].app_sm_mhz, gpus[0].app_mem_mhz) == (700_000, 0, 0)
    # A GPU whose clocks were not the defaults gets its own values back, not the defaults.
    assert (gpus[1].power_limit_mw, gpus[1].app_sm_mhz, gpus[1].app_mem_mhz) == (
        500_000,
        1500,
        2619,
    )


def test_no_permission_is_refused_with_nvml_error_and_nothing_changes(fake_nvml):
    gpus = _gpus(fake_nvml, n=1)  # a normal user: setters raise NVML_ERROR_NO_PERMISSION
    (s,) = _apply(gpus, 300, "low")
    assert (s.power_limit_status, s.clock_status) == ("refused", "refused")
    assert "NVMLError_NoPermission" in s.detail[0] and "SetPowerManagementLimit" in s.detail[0]
    assert "SetApplicationsClocks" in s.detail[1]
    assert (gpus[0].power_limit_mw, gpus[0].app_sm_mhz) == (700_000, 0)
    assert not (s.changed_power_limit or s.changed_clocks)


def test_out_of_range_watts_refused_before_the_setter(fake_nvml):
    gpus = _gpus(fake_nvml, n=1, privileged=True)
    (s,) = _apply(gpus, 100, None)  # the fake's range is 200-700 W
    assert s.power_limit_status == "refused" and "outside this GPU's range 200-700 W" in s.detail[0]
    assert s.clock_status == "unset"


def test_a_scripted_refusal_leaves_the_other_setting_restorable(fake_nvml):
    gpus = _gpus(
        fake_nvml,
        n=1,
        privileged=True,
        refuse={"nvmlDeviceSetApplicationsClocks": real.NVML_ERROR_NOT_SUPPORTED},
    )
    (s,) = _apply(gpus, 400, "high")
    assert (s.power_limit_status, s.clock_status) == ("applied", "refused")
    assert "NVMLError_NotSupported" in s.detail[0]
    assert gpus[0].power_limit_mw == 400_000
    assert _restore([s]) == [] and gpus[0].power_limit_mw == 700_000


def test_a_cap_below_the_set_limit_reads_back_not_applied(fake_nvml):
    gpus = _gpus(fake_nvml, n=1, privileged=True, external_cap_mw=250_000)
    (s,) = _apply(gpus, 300, None)
    assert s.power_limit_status == "not-applied"
    assert "enforced power limit 250 W, asked 300 W" in s.detail[0]


def test_slurm_route_only_verifies_the_clock(fake_nvml):
    """Under Slurm the clocks are --gpu-freq's: the job sets nothing and checks the read-back."""
    gpus = _gpus(fake_nvml, n=1, privileged=True)
    (s,) = _apply(gpus, None, "low", set_clock=False)
    assert s.clock_status == "not-applied" and gpus[0].app_sm_mhz == 0  # nobody set it
    assert "asked 345 / 2619 MHz" in s.detail[0]
    gpus[0].app_sm_mhz, gpus[0].app_mem_mhz = 345, 2619  # as slurmd's plugin would
    (s,) = _apply(gpus, None, "low", set_clock=False)
    assert s.clock_status == "applied" and not s.changed_clocks


# --------------------------------------------------------------------------- launcher guard
def test_guard_restores_when_the_job_fails_and_records_for_the_ranks(fake_nvml, tmp_path):
    gpus = _gpus(fake_nvml, privileged=True)
    request = GpuRequest(power_limit_w=350.0, clock="1410", power_limit_method="nvml")
    env, log = {}, io.StringIO()
    with pytest.raises(RuntimeError, match="rank 1 was killed"):
        with gpu_guard.applied(request, tmp_path, 2, env, log) as record:
            assert [g.power_limit_mw for g in gpus] == [350_000, 350_000]
            assert [g.app_sm_mhz for g in gpus] == [1410, 1410]
            raise RuntimeError("rank 1 was killed")
    assert [(g.power_limit_mw, g.app_sm_mhz, g.app_mem_mhz) for g in gpus] == [(700_000, 0, 0)] * 2
    assert SettingsRecord.load(env[RECORD_ENV]) == record
    assert [g.power_limit_status for g in record.gpus] == ["applied", "applied"]
    assert "gpu settings restored: ok" in log.getvalue()
    after = json.loads(log.getvalue().split("gpu settings after the job: ")[1].splitlines()[0])
    assert [(a["power_limit_mw"], a["app_clocks_mhz"]) for a in after] == [
        (700_000, [2619, 1980])
    ] * 2


def test_the_ranks_load_the_record_strictly(fake_nvml, tmp_path):
    """What the ranks read back is the launcher's record, typed; a record missing a key (or
    with one it does not know) fails loudly instead of reading as an empty setting."""
    _gpus(fake_nvml, n=1, privileged=True)
    request = GpuRequest(power_limit_w=300.0, clock=None, power_limit_method="nvml")
    env = {}
    with gpu_guard.applied(request, tmp_path, 1, env, io.StringIO()) as record:
        assert SettingsRecord.load(env[RECORD_ENV]).request == request
        data = json.loads(Path(env[RECORD_ENV]).read_text())
    for broken in ({k: v for k, v in data.items() if k != "gpus"}, {**data, "extra": 1}):
        path = tmp_path / "broken.json"
        path.write_text(json.dumps(broken))
        with pytest.raises(
            JobSpecError, match="missing keys \\['gpus'\\]|unknown keys \\['extra'\\]"
        ):
            SettingsRecord.load(path)
    assert record.gpus[0].power_limit_status == "applied"


def test_guard_without_a_request_touches_nothing(fake_nvml, tmp_path):
    env = {}
    with gpu_guard.applied(None, tmp_path, 1, env, io.StringIO()) as record:
        assert record is None
    assert env == {} and list(tmp_path.iterdir()) == []


def test_guard_without_nvml_records_why(fake_nvml, tmp_path):
    fake_nvml(fake_pynvml.h100s(1), init_error=real.NVML_ERROR_LIBRARY_NOT_FOUND)
    request = GpuRequest(power_limit_w=300.0, clock=None, power_limit_method="nvml")
    env = {}
    with gpu_guard.applied(request, tmp_path, 1, env, io.StringIO()) as record:
        assert record.error.startswith("NVML unavailable: NVMLError_LibraryNotFound")
    probe = SettingsProbe(request, [], environ=env)
    assert probe.problems() == [record.error]
    # Known before the model loads (energysweep.run, through measure.monitor.refused_settings).
    assert refusals(probe.record, probe.uuids) == [record.error]


# --------------------------------------------------------------------------- the ranks' probe
def _launched(fake_nvml, tmp_path, request, **kw):
    gpus = _gpus(fake_nvml, n=1, **kw)
    env = {}
    ctx = gpu_guard.applied(request, tmp_path, 1, env, io.StringIO())
    ctx.__enter__()
    return gpus, env, ctx


def test_probe_reads_back_around_windows_and_flags_a_change(fake_nvml, tmp_path):
    req = GpuRequest(power_limit_w=300.0, clock="medium", power_limit_method="nvml")
    gpus, env, ctx = _launched(fake_nvml, tmp_path, req, privileged=True)
    probe = SettingsProbe(req, [gpus[0].uuid], environ=env)
    assert probe.problems() == []
    before = probe.read()
    gpus[0].power_limit_mw = 700_000  # someone put the limit back during the window
    after = probe.read()
    cols = probe.columns(gpus[0].uuid, before, after)
    assert (cols["gpu_power_limit_target_w"], cols["gpu_sm_clock_target_mhz"]) == (300.0, 1170)
    assert (cols["gpu_power_limit_w"], cols["gpu_power_limit_end_w"]) == (300.0, 700.0)
    assert cols["gpu_power_limit_status"] == "not-applied" and cols["gpu_clock_status"] == "applied"
    assert cols["gpu_default_power_limit_w"] == 700.0
    assert "enforced power limit 700 W, asked 300 W" in cols["gpu_setting_detail"]
    assert probe.problems() == [f"{gpus[0].uuid}: enforced power limit 700 W, asked 300 W"]
    # A change during the job is no refusal in the launcher's record: the model still loads.
    assert refusals(probe.record, probe.uuids) == []
    probe.close()
    ctx.__exit__(None, None, None)


def test_probe_turns_a_refusal_into_a_problem_and_flagged_columns(fake_nvml, tmp_path):
    req = GpuRequest(power_limit_w=300.0, clock=None, power_limit_method="nvml")
    gpus, env, ctx = _launched(fake_nvml, tmp_path, req)  # unprivileged: refused
    probe = SettingsProbe(req, [gpus[0].uuid], environ=env)
    (problem,) = probe.problems()
    assert "NVMLError_NoPermission" in problem
    # The record says so: no model is loaded for the job.
    assert refusals(probe.record, probe.uuids) == [problem]
    cols = probe.point_columns()
    assert (cols["gpu_power_limit_status"], cols["gpu_clock_status"]) == ("refused", "unset")
    assert cols["gpu_power_limit_w"] == 700.0  # what it really ran at
    probe.close()
    ctx.__exit__(None, None, None)


def test_probe_without_a_request_still_reads_the_gpu_back(fake_nvml):
    gpus = _gpus(fake_nvml, n=1)
    probe = SettingsProbe(None, [gpus[0].uuid], environ={})
    now = probe.read()
    cols = probe.columns(gpus[0].uuid, now, now)
    assert (cols["gpu_power_limit_status"], cols["gpu_power_limit_target_w"]) == ("unset", None)
    assert cols["gpu_power_limit_w"] == 700.0 and cols["gpu_app_sm_clock_mhz"] == 1980
    assert probe.problems() == []
    cpu = SettingsProbe(None, [], environ={}).columns(None, None, None)
    assert cpu["gpu_power_limit_w"] is None and cpu["gpu_clock_status"] == "unset"


# --------------------------------------------------------------------------- config
def _config(**over):
    cfg = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    cfg.update(copy.deepcopy(over))
    return cfg


@pytest.mark.parametrize(
    "over, key",
    [
        ({"gpu": {"power_limit_w": [300, -5]}}, "gpu.power_limit_w[1]"),
        ({"gpu": {"power_limit_w": [0]}}, "gpu.power_limit_w[0]"),
        ({"facility": {"pue": {"value": 0.9}}}, "facility.pue.value"),
        ({"gpu": {"power_limit_method": "ipmitool"}}, "gpu.power_limit_method"),
    ],
)
def test_hostile_values_refused_by_the_schema_naming_the_key(over, key):
    with pytest.raises(es_config.ConfigError) as err:
        es_config.validate_schema(_config(**over))
    assert f"config key {key}:" in str(err.value)


@pytest.mark.parametrize(
    "over, needle",
    [
        (
            {"gpu": {"clock": ["medium", "turbo"]}},
            "config key gpu.clock[1]: 'turbo' is not a clock",
        ),
        (
            {"facility": {"carbon_intensity_g_per_kwh": {"value": 400, "low": 300, "high": 500}}},
            "config key facility.carbon_intensity_g_per_kwh.source",
        ),
        (
            {"facility": {"pue": {"value": 1.3, "source": "site", "year": 2025}}},
            "config key facility.pue.low/high",
        ),
        (
            {
                "facility": {
                    "pue": {"value": 1.3, "low": 1.4, "high": 1.5, "source": "s", "year": 2025}
                }
            },
            "the band must hold the value",
        ),
    ],
)
def test_hostile_values_refused_before_any_job_naming_the_key(over, needle):
    cfg = es_config.validate_schema(_config(**over))
    assert needle in "\n".join(gpu_axes.check(cfg))


def test_settings_are_grid_axes_and_skipped_on_cpu_with_the_reason():
    def grid(device, **gpu):
        cfg = es_config.validate_schema(
            _config(
                backends=["pytorch"],
                scenarios=["inference"],
                parallel={"tp": [1], "pp": [1], "dp": [1]},
                gpu=gpu,
                measurement={"device": device},
            )
        )
        return es_config.build_grid(cfg)

    axes = {"power_limit_w": [None, 300], "clock": [None, "low,memory=high"]}
    on_gpu = grid("cuda", **axes)
    got = sorted((j.wildcards()["power_limit_w"], j.wildcards()["gpu_clock"]) for j in on_gpu.jobs)
    assert got == [
        ("300", "low,memory=high"),
        ("300", "unset"),
        ("unset", "low,memory=high"),
        ("unset", "unset"),
    ]
    on_cpu = grid("cpu", **axes)
    (job,) = on_cpu.jobs
    assert job.wildcards() == {
        **on_gpu.jobs[0].wildcards(),
        "power_limit_w": "unset",
        "gpu_clock": "unset",
    }
    assert len(on_cpu.skipped) == 3
    assert all("runs the ranks on CPUs: there is no GPU" in s["reason"] for s in on_cpu.skipped)
    # No axis swept: no setting path parts at all (paths as before).
    assert "power_limit_w" not in grid("cuda").jobs[0].wildcards()


def test_an_nvml_power_limit_on_a_multi_node_layout_is_skipped_with_the_reason():
    def grid(method):
        cfg = es_config.validate_schema(
            _config(
                backends=["pytorch"],
                scenarios=["inference"],
                parallel={"tp": [1], "pp": [1], "dp": [2], "gpus_per_node": 1},
                gpu={"power_limit_w": [300], "clock": ["low"], "power_limit_method": method},
                measurement={"device": "cuda"},
            )
        )
        return es_config.build_grid(cfg)

    nvml = grid("nvml")
    assert (
        not nvml.jobs
        and "sets the power limit on the launcher's node only" in (nvml.skipped[0]["reason"])
    )
    assert len(grid("slurm-prolog").jobs) == 1


def test_a_job_asks_slurm_for_its_clock_and_the_prolog_for_its_limit():
    layout = {"model": "m", "backend": "pytorch", "scenario": "inference", "tp": 1, "pp": 1,
              "dp": 1}  # fmt: skip
    key = JobKey.from_strings({**layout, "power_limit_w": "300", "gpu_clock": "low,memory=high"})
    assert key.gpu_request(None) == GpuRequest(
        power_limit_w=300.0, clock="low,memory=high", power_limit_method=None
    )
    assert gpu_axes.slurm_extra(key) == "--gpu-freq=low,memory=high"
    unset = JobKey.from_strings({**layout, "power_limit_w": "unset", "gpu_clock": "unset"})
    assert unset.gpu_request("nvml") is None
    no_clock = JobKey.from_strings({**layout, "power_limit_w": "300", "gpu_clock": "unset"})
    assert gpu_axes.slurm_extra(no_clock) is None
    gpu = {"power_limit_w": [300], "clock": [], "prolog_constraint": "powercap_{watts}w"}
    cfg = {"gpu": {**gpu, "power_limit_method": "slurm-prolog"}}
    assert gpu_axes.constraint(key, cfg) == "powercap_300w"
    cfg["gpu"]["power_limit_method"] = "nvml"
    assert gpu_axes.constraint(key, cfg) is None


def test_under_slurm_the_guard_leaves_clocks_to_gpu_freq_and_says_so(
    fake_nvml, tmp_path, monkeypatch
):
    gpus = _gpus(fake_nvml, n=1, privileged=True)
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    monkeypatch.delenv("SLURM_GPU_FREQ", raising=False)  # the jobstep plugin drops it
    monkeypatch.setattr(gpu_guard, "job_tres_freq", lambda job: f"gpu:medium (job {job})")
    request = GpuRequest(power_limit_w=300.0, clock="medium", power_limit_method="nvml")
    with gpu_guard.applied(request, tmp_path, 1, {}, io.StringIO()) as record:
        assert gpus[0].app_sm_mhz == 0 and gpus[0].power_limit_mw == 300_000
    assert record.routes == {"power_limit": "nvml", "clock": "slurm-gpu-freq"}
    assert record.slurm_tres_freq == "gpu:medium (job 42)" and record.slurm_gpu_freq is None
    (g,) = record.gpus
    assert (g.power_limit_status, g.clock_status) == ("applied", "not-applied")
    assert "asked --gpu-freq=medium, but this step's SLURM_GPU_FREQ is not set" in g.detail[-1]
    assert not g.changed_clocks and gpus[0].power_limit_mw == 700_000


def test_the_jobs_gpu_frequency_request_as_scontrol_shows_it():
    import subprocess

    from energysweep.launch.slurm import job_tres_freq, restore_job_identity

    def run(text, rc=0):
        return lambda argv: subprocess.CompletedProcess(argv, rc, text, "")

    shown = "   Power=\n   TresFreq=gpu:medium,memory=high\n   TresPerJob=gres:gpu:1\n"
    assert job_tres_freq("71", run(shown)) == "gpu:medium,memory=high"
    account = "   Priority=1 Nice=0 Account=energysweep QOS=normal\n"
    env = {"SLURM_JOB_ID": "71", "PATH": "/bin"}
    assert restore_job_identity(env, run(account))["SLURM_JOB_ACCOUNT"] == "energysweep"
    assert "SLURM_JOB_ACCOUNT" not in restore_job_identity(env, run(account, rc=1))
    assert restore_job_identity({"PATH": "/bin"}, run(account)) == {"PATH": "/bin"}
    assert job_tres_freq("71", run("   Power=\n")) is None
    assert job_tres_freq("71", run(shown, rc=1)) is None
    assert job_tres_freq(None, run(shown)) is None
