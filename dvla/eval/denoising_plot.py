"""How one action chunk forms over the denoising steps, as a PNG.

Three panels: the step at which each (time step, action dimension) value was revealed, the model's
confidence in it at that step, and each dimension's decoded trajectory after every step (hidden
values leave gaps). Written by `dvla rollout --show_denoising N`.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch


def reveal_steps(history: list[torch.Tensor], hidden: int) -> np.ndarray:
    """(T,) the 1-based step after which each position first holds a value (fixed ones count as 1)."""
    revealed = np.zeros(history[0].shape[0], dtype=int)
    for step, block in reversed(list(enumerate(history, start=1))):
        revealed[(block != hidden).cpu().numpy()] = step
    return revealed


def plot_chunk_forming(history, confidence, tokenizer, horizon: int, path: str | Path, title: str = "",
                       known_steps: int = 0) -> Path:  # fmt: skip
    """history / confidence: per step, (H*D,) value tokens and their confidence for one chunk;
    `tokenizer` maps tokens to normalised values (hidden = tokenizer.bins); `known_steps` were fixed
    before decoding (shown as step 0)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hidden, d = tokenizer.bins, tokenizer.action_dim
    steps = len(history)
    revealed = reveal_steps(history, hidden)
    revealed[: known_steps * d] = 0
    conf = np.full(revealed.shape, np.nan)
    for step in range(1, steps + 1):
        at = revealed == step
        conf[at] = confidence[step - 1].cpu().numpy()[at]
    cols = min(d, 7)
    rows = math.ceil(d / cols)
    fig = plt.figure(figsize=(2.2 * cols, 3.2 + 1.8 * rows))
    grid = fig.add_gridspec(2 + rows, cols, height_ratios=[1.2, 1.2] + [1.6] * rows)
    for row, (values, label, cmap) in enumerate(
        ((revealed, "revealed at step (0 = known)", "viridis"), (conf, "confidence when revealed", "magma"))
    ):
        ax = fig.add_subplot(grid[row, :])
        image = ax.imshow(values.reshape(horizon, d).T, aspect="auto", cmap=cmap, interpolation="nearest")
        ax.set_ylabel("dimension")
        ax.set_title(label, fontsize=9)
        fig.colorbar(image, ax=ax, fraction=0.02)
    ax.set_xlabel("chunk step")
    colours = plt.cm.viridis(np.linspace(0, 1, steps))
    for j in range(d):
        ax = fig.add_subplot(grid[2 + j // cols, j % cols])
        for step, block in enumerate(history):
            shown = block.cpu().clone()
            missing = shown == hidden
            values = tokenizer.decode(shown.masked_fill(missing, 0).view(horizon, d))[:, j].numpy()
            values[missing.view(horizon, d)[:, j].numpy()] = np.nan
            ax.plot(values, color=colours[step], lw=1, label=f"step {step + 1}")
        ax.set_title(f"dim {j}", fontsize=8)
        ax.set_ylim(-1.05, 1.05)
        ax.tick_params(labelsize=6)
    fig.axes[-1].legend(fontsize=6, loc="lower right")
    fig.suptitle(title or f"one chunk over {steps} denoising steps", fontsize=10)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path
