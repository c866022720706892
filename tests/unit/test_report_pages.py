"""The report's HTML pages: every summary column, escaped text, invalid rows, environment facts."""

from __future__ import annotations

import math
from html.parser import HTMLParser

import pandas as pd

from energysweep.figures.report_pages import environment_page, summary_page


class _Table(HTMLParser):
    """Header texts and rows (cell texts, row class) of the page's table(s)."""

    def __init__(self):
        super().__init__()
        self.headers, self.rows, self.scripts = [], [], 0
        self._cell = None
        self._in_th = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "tr" and "class" in a:
            self.rows.append({"class": a["class"], "cells": []})
        elif tag == "td":
            self._cell = ""
        elif tag == "th":
            self._in_th = True
            self.headers.append("")
        elif tag == "script":
            self.scripts += 1

    def handle_endtag(self, tag):
        if tag == "td":
            self.rows[-1]["cells"].append(self._cell)
            self._cell = None
        elif tag == "th":
            self._in_th = False

    def handle_data(self, data):
        if self._cell is not None:
            self._cell += data
        elif self._in_th:
            self.headers[-1] += data


def _parse(page: str) -> _Table:
    p = _Table()
    p.feed(page)
    return p


def test_summary_page_holds_every_column_and_row_key_first():
    s = pd.DataFrame(
        {
            "extra_metric": [1.0, 2.0],
            "model": ["m", "m"],
            "backend": ["pytorch", "vllm"],
            "scenario": ["inference"] * 2,
            "tp": [1, 2],
            "pp": [1, 1],
            "dp": [1, 1],
            "batch_size": [4, 4],
            "energy_per_output_token_j": [0.123456789, math.nan],
            "gpu_energy_status": ["measured", "unavailable"],
            "gpu_energy_detail": [None, "<no NVML & no GPU>"],
        }
    )
    t = _parse(summary_page(s))
    assert t.headers[:7] == ["model", "backend", "scenario", "tp", "pp", "dp", "batch_size"]
    assert set(t.headers) == set(s.columns) and len(t.rows) == 2
    row = dict(zip(t.headers, t.rows[1]["cells"], strict=True))
    assert row["energy_per_output_token_j"] == "—"  # null, never 0
    assert row["gpu_energy_detail"] == "<no NVML & no GPU>"  # escaped in the HTML, text intact
    assert "<no NVML" not in summary_page(s)
    first = dict(zip(t.headers, t.rows[0]["cells"], strict=True))
    assert first["energy_per_output_token_j"] == "0.1235"
    assert t.scripts == 1  # inline, self-contained: no src= anywhere
    assert " src=" not in summary_page(s)


def test_summary_page_marks_invalid_rows():
    s = pd.DataFrame(
        {
            "model": ["m"] * 3,
            "tp": [1, 2, 1],
            "valid": [True, False, True],
            "invalid_reasons": ["", "idle-drift;short-window", ""],
        }
    )
    page = summary_page(s)
    t = _parse(page)
    assert [r["class"] for r in t.rows] == ["", "invalid", ""]
    assert "1 invalid (red rows)" in page


def test_environment_page_states_gpus_versions_hash_and_config():
    env = pd.DataFrame(
        [
            {
                "job_id": "j1",
                "config_hash": "abc",
                "code_version": "0.1.0+g123",
                "git_commit": "123",
                "gpu_count": 1,
                "host_count": 1,
                "host": "n1",
                "cpu_model": "EPYC",
                "gpu_uuid": "GPU-1",
                "gpu_name": "NVIDIA H100",
                "driver": "570.1",
                "cuda_driver_version": 12080,
                "torch_version": "2.13.0",
                "vllm_version": "0.9",
                "slurm_job_id": "77",
            }
        ]
    )
    record = {
        "sweep_hash": "sweephash",
        "code_version": "0.1.0+g123",
        "config": {"backends": ["pytorch", "vllm"]},
    }
    skipped = pd.DataFrame({"tp": [4], "reason": ["tp*pp*dp=4 exceeds 2"]})
    page = environment_page(env, record, skipped)
    for needle in (
        "sweephash",
        "0.1.0+g123",
        "NVIDIA H100",
        "570.1",
        "GPU-1",
        "2.13.0",
        "vllm_version",
        "0.9",
        "77",
        "tp*pp*dp=4 exceeds 2",
        "- vllm",
    ):
        assert needle in page, needle
    cpu_only = environment_page(env.assign(gpu_uuid=None), record)
    assert "No GPU was used by any job" in cpu_only
