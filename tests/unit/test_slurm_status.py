"""The cap on the Slurm plugin's status-check interval (energysweep.util.slurm_status): its
variable, its effect on an executor's property, and the real plugin it is written against."""

from __future__ import annotations

import inspect

import pytest

from energysweep.util import slurm_status


@pytest.mark.parametrize("value, seconds", [(None, None), ("", None), (" ", None), ("3", 3.0),
                                            ("0.5", 0.5)])  # fmt: skip
def test_the_variable_is_seconds_or_unset(value, seconds):
    env = {} if value is None else {slurm_status.ENV: value}
    assert slurm_status.max_interval(env) == seconds


@pytest.mark.parametrize("value", ["soon", "0", "-3", "inf", "nan"])
def test_anything_else_names_the_variable_and_the_fix(value):
    with pytest.raises(ValueError) as err:
        slurm_status.max_interval({slurm_status.ENV: value})
    assert f"{slurm_status.ENV}={value!r} is not a positive number" in str(err.value)
    assert "set it to e.g. 5, or unset it" in str(err.value)


class Remote:
    """Snakemake's RemoteExecutor's interval, as snakemake_interface_executor_plugins has it."""

    default = 30

    def __init__(self):
        self._next = None

    @property
    def next_seconds_between_status_checks(self):
        return self.default if self._next is None else self._next

    @next_seconds_between_status_checks.setter
    def next_seconds_between_status_checks(self, value):
        self._next = value


def test_every_interval_set_is_capped_and_none_still_means_the_default():
    class Executor(Remote):
        pass

    slurm_status.cap(Executor, 3)
    e = Executor()
    for value, got in ((2, 2), (3, 3), (12, 3), (180, 3), (None, 30)):
        e.next_seconds_between_status_checks = value
        assert e.next_seconds_between_status_checks == got
    plain = Remote()  # the base class is left as it was
    plain.next_seconds_between_status_checks = 180
    assert plain.next_seconds_between_status_checks == 180


def test_a_class_without_the_settable_property_is_refused():
    class Other:
        next_seconds_between_status_checks = 40

    with pytest.raises(TypeError, match="is not a settable property"):
        slurm_status.cap(Other, 3)


def test_contract_with_the_real_plugin():
    """The plugin still grows its interval by 10 s per idle check, up to 180 s, through the
    property this caps (a plugin that stops doing so makes the cap unneeded or wrong)."""
    from snakemake_executor_plugin_slurm import Executor

    source = inspect.getsource(Executor.check_active_jobs)
    assert "self.next_seconds_between_status_checks + 10" in source
    assert "max_sleep_time = 180" in source

    class Capped(Executor):  # a subclass: the real class stays as it is in this process
        pass

    slurm_status.cap(Capped, 3)
    e = Capped.__new__(Capped)
    e.next_seconds_between_status_checks = 180
    assert e.next_seconds_between_status_checks == 3
    assert Executor.next_seconds_between_status_checks.fset is not None
