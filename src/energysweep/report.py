"""Figures from the summary table (pure: summary in, PNG out)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

# (scenario, energy column, energy label, throughput column, throughput label)
PANELS = [
    ("inference", "energy_per_output_token_j", "GPU energy per output token", "J / output token",
     "output_tokens_per_s", "Inference throughput", "output tokens / s (all replicas)"),
    ("training", "energy_per_train_token_j", "GPU energy per training token",
     "J / training token", "train_tokens_per_s", "Training throughput",
     "training tokens / s (global batch)"),
]


def layout_label(row) -> str:
    return f"{row['model']} {row['backend']} tp{row['tp']} pp{row['pp']} dp{row['dp']}"


def _no_energy(ax, rows: pd.DataFrame) -> str:
    """Say why there is no energy line instead of drawing zeros; returns the note."""
    details = "; ".join(sorted(set(rows["gpu_energy_detail"].dropna())))[:120]
    note = "no GPU energy measured\n" + (details or "energy unavailable")
    ax.text(0.5, 0.5, note, ha="center", va="center", transform=ax.transAxes, wrap=True)
    ax.set_xticks([])
    ax.set_yticks([])
    return note


def plot_energy_per_token(summary: pd.DataFrame, out: str | Path) -> dict[str, dict]:
    """Energy per token and throughput vs batch size, one line per layout.

    One row of two panels per scenario present: inference (per output token, generate windows)
    and training (per training token). Where no GPU energy was measured the energy panel says so
    instead of drawing zeros.

    Returns:
        Per scenario drawn: ``{"energy_lines": n, "throughput_lines": n, "note": str | None}``.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = summary.copy()
    summary["layout"] = summary.apply(layout_label, axis=1)
    scenario = summary["scenario"] if "scenario" in summary else "inference"
    panels = [p for p in PANELS if (scenario == p[0]).any()]
    fig, axes = plt.subplots(len(panels), 2, figsize=(11, 4.2 * len(panels)), squeeze=False)
    drawn: dict[str, dict] = {}
    for (name, e_col, e_title, e_unit, t_col, t_title, t_unit), (ax_e, ax_t) in zip(
        panels, axes, strict=True
    ):
        rows = summary[scenario == name]
        have_energy = rows[e_col].notna().any()
        for label, g in rows.groupby("layout", sort=True):
            g = g.sort_values("batch_size")
            if have_energy:
                ax_e.plot(g["batch_size"], g[e_col], marker="o", label=label)
            ax_t.plot(g["batch_size"], g[t_col], marker="o", label=label)
        ax_e.set_title(e_title)
        ax_e.set_xlabel("batch size per replica")
        ax_e.set_ylabel(e_unit)
        note = None
        if have_energy:
            ax_e.set_xscale("log", base=2)
            ax_e.legend(fontsize=7)
        else:
            note = _no_energy(ax_e, rows)
        drawn[name] = {"energy_lines": len(ax_e.get_lines()),
                       "throughput_lines": len(ax_t.get_lines()), "note": note}
        ax_t.set_title(t_title)
        ax_t.set_xlabel("batch size per replica")
        ax_t.set_ylabel(t_unit)
        ax_t.set_xscale("log", base=2)
        ax_t.legend(fontsize=7)
    devices = ",".join(sorted(set(summary["device"])))
    fig.suptitle(f"energysweep — devices: {devices}", fontsize=9)
    fig.tight_layout()
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return drawn
