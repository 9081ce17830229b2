"""Figures for the Mixture-of-Experts chapter: the expert load of the tiny MoE GPT over training, with and
without the load-balancing loss. The run is saved to book/data/moe_expert_load.json (CPU, a few seconds a
configuration); the chapter plots the file, and ``python -m kernels_src.figures.moe`` writes it again."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ..model import data
from ..model.gpt import GPT
from ..model.reference import Config, init_params

PATH = Path(__file__).resolve().parents[2] / "book" / "data" / "moe_expert_load.json"
CFG = dict(vocab=data.VOCAB, ctx=32, width=32, heads=2, layers=2, mlp=2, experts=4, topk=2)


def expert_load_run(aux_lb: float, steps: int = 60, batch: int = 4, lr: float = 3e-3, seed: int = 0) -> dict:
    """Train the tiny MoE GPT on the course's text (CPU); return the loss and the slots per expert, per layer,
    at every step."""
    cfg = Config(**CFG, aux_lb=aux_lb)
    model = GPT(cfg, init_params(cfg, seed), "cpu")
    model.expert_load = []
    it = data.batches(data.encode(data.corpus()), batch, cfg.ctx, seed=seed)
    losses = [model.train_step(*next(it), lr) for _ in range(steps)]
    return {"aux_lb": aux_lb, "steps": steps, "batch": batch, "lr": lr, "loss": losses,
            "load": np.array(model.expert_load).tolist()}  # (layers, steps, E)


def write(path=PATH, aux=(0.0, 0.1), **kw) -> Path:
    runs = [expert_load_run(a, **kw) for a in aux]
    Path(path).write_text(json.dumps({"config": CFG, "runs": runs}))
    return Path(path)


def load(path=PATH) -> dict | None:
    p = Path(path)
    return json.loads(p.read_text()) if p.exists() else None


def plot_load(res: dict):
    import matplotlib.pyplot as plt

    runs = res["runs"]
    # 8.4 in: shown at about 0.9 of its size; titles on two lines and the legend below, never over the shares
    fig, axs = plt.subplots(len(runs), 3, figsize=(8.4, 3.0 * len(runs) + 0.5), squeeze=False)
    for row, run in zip(axs, runs):
        load = np.array(run["load"], float)
        for i in range(load.shape[0]):
            share = load[i] / load[i].sum(axis=1, keepdims=True)
            row[i].stackplot(np.arange(share.shape[0]), share.T, labels=[f"expert {e}" for e in range(share.shape[1])])
            row[i].set_title(f"layer {i}, load-balancing\nweight {run['aux_lb']}: share of slots", fontsize=9)
            row[i].set_xlabel("step")
        row[2].plot(run["loss"])
        row[2].set_title(f"training loss (with the\nweighted aux loss), weight {run['aux_lb']}", fontsize=9)
        row[2].set_xlabel("step")
    handles, labels = axs[0][0].get_legend_handles_labels()
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=9, frameon=False)
    return fig


if __name__ == "__main__":
    print(write())
