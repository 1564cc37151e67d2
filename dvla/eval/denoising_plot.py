"""How one action chunk, or one answer, forms over the denoising steps, as a PNG.

A chunk: three panels: the step at which each (time step, action dimension) value was revealed,
the model's confidence in it at that step, and each dimension's decoded trajectory after every
step (hidden values leave gaps). Written by `dvla rollout --show_denoising N`.
An answer: the answer block after every step, each token shaded by the model's confidence when it
was revealed. Written by `dvla vqa --show_steps`.
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
    return _save(fig, path, dpi=80)


def plot_answer_forming(tokens: list[list[str]], revealed: np.ndarray, confidence: np.ndarray,
                        path: str | Path, title: str = "") -> Path:  # fmt: skip
    """tokens: per step, the answer block's token texts ("" where hidden); revealed (T,): the
    1-based step each position was revealed at; confidence (T,): the model's confidence then."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps, width = len(tokens), len(revealed)
    fig, ax = plt.subplots(figsize=(1.0 + 0.9 * width, 0.8 + 0.45 * steps))
    shade = plt.cm.viridis
    for step, row in enumerate(tokens, start=1):
        for k, text in enumerate(row):
            shown = bool(text)
            colour = shade(float(confidence[k])) if shown else (0.92, 0.92, 0.92, 1.0)
            ax.add_patch(plt.Rectangle((k, step - 1), 0.95, 0.9, color=colour))
            new = revealed[k] == step
            label = text if shown else "_"
            ink = "white" if shown and confidence[k] < 0.6 else "black"
            ax.text(k + 0.47, step - 0.55, label[:8], ha="center", va="center", fontsize=8, color=ink,
                    fontweight="bold" if new else "normal")  # fmt: skip
    ax.set_xlim(0, width)
    ax.set_ylim(steps, 0)
    ax.set_yticks([s - 0.55 for s in range(1, steps + 1)], [f"step {s}" for s in range(1, steps + 1)])
    ax.set_xticks([])
    ax.tick_params(labelsize=8, length=0)
    for side in ax.spines.values():
        side.set_visible(False)
    bar = fig.colorbar(plt.cm.ScalarMappable(cmap=shade), ax=ax, fraction=0.03)
    bar.set_label("confidence when revealed", fontsize=7)
    ax.set_title(f"{title or f'an answer over {steps} denoising steps'} (bold: new)", fontsize=9)
    return _save(fig, path, dpi=100)


def _save(fig, path: str | Path, dpi: int) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path
