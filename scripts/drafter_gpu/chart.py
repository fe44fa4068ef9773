"""Loss and held-out tau against training time, from the `training.json` files `train.py`
writes, one line per run.

    python3 chart.py OUT.png LABEL=training.json [LABEL=training.json ...]
"""

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(out, runs):
    fig, (loss_ax, tau_ax) = plt.subplots(1, 2, figsize=(11, 4))
    for run in runs:
        label, path = run.split("=", 1)
        history = json.load(open(path))["history"]
        seconds = [h["seconds"] for h in history]
        loss_ax.plot(seconds, [h["loss"] for h in history], marker="o", label=label)
        tau_ax.plot(seconds, [h["tau"] for h in history], marker="o", label=label)
    loss_ax.set(xlabel="training seconds (H200)", ylabel="weighted loss since the last point", title="training loss")
    tau_ax.set(xlabel="training seconds (H200)", ylabel="tau (1 + accepted drafts)", title="held-out tau, teacher-forced chain of 15")
    for ax in (loss_ax, tau_ax):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
