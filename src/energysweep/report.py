"""Figures from the summary table (pure: summary in, PNG out)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd


def layout_label(row) -> str:
    return f"{row['model']} {row['backend']} tp{row['tp']} pp{row['pp']} dp{row['dp']}"


def plot_energy_per_token(summary: pd.DataFrame, out: str | Path) -> None:
    """Energy per output token and throughput vs batch size, one line per layout.

    Where no GPU energy was measured the energy panel says so instead of drawing zeros.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_e, ax_t) = plt.subplots(1, 2, figsize=(11, 4.2))
    summary = summary.copy()
    summary["layout"] = summary.apply(layout_label, axis=1)
    have_energy = summary["energy_per_output_token_j"].notna().any()
    for label, g in summary.groupby("layout", sort=True):
        g = g.sort_values("batch_size")
        if have_energy:
            ax_e.plot(g["batch_size"], g["energy_per_output_token_j"], marker="o", label=label)
        ax_t.plot(g["batch_size"], g["output_tokens_per_s"], marker="o", label=label)
    ax_e.set_title("GPU energy per output token")
    ax_e.set_xlabel("batch size per replica")
    ax_e.set_ylabel("J / output token")
    if have_energy:
        ax_e.set_xscale("log", base=2)
        ax_e.legend(fontsize=7)
    else:
        details = "; ".join(sorted(set(summary["gpu_energy_detail"].dropna())))[:120]
        ax_e.text(
            0.5, 0.5, "no GPU energy measured\n" + (details or "energy unavailable"),
            ha="center", va="center", transform=ax_e.transAxes, wrap=True,
        )
        ax_e.set_xticks([])
        ax_e.set_yticks([])
    ax_t.set_title("Throughput")
    ax_t.set_xlabel("batch size per replica")
    ax_t.set_ylabel("output tokens / s (all replicas)")
    ax_t.set_xscale("log", base=2)
    ax_t.legend(fontsize=7)
    devices = ",".join(sorted(set(summary["device"])))
    fig.suptitle(f"energysweep — devices: {devices}", fontsize=9)
    fig.tight_layout()
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
