"""A copy of a training checkpoint with the raw weights instead of their moving average.

    python experiments/raw_weights.py outputs/train/mt10_goal outputs/train/mt10_goal_raw

Runs trained before dvla's EMA was bias-corrected hold an average that still weighs the first
steps' weights (0.999^k of them after k steps); their raw weights, which every training checkpoint
keeps, are the model without that bias. The copy loads like any checkpoint (rollout, vqa, probes).
"""

from __future__ import annotations

import argparse

from dvla.checkpoint import export_raw_weights


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("checkpoint", help="a training checkpoint or run folder (its latest checkpoint)")
    parser.add_argument("out", help="folder to write the copy to")
    args = parser.parse_args()
    print(f"wrote {export_raw_weights(args.checkpoint, args.out)}")


if __name__ == "__main__":
    main()
