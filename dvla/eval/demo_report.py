"""`python -m dvla.eval.demo_report`: one markdown page from the demo's rollout and VQA reports."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from dvla.eval.rollout import format_report
from dvla.eval.vqa import format_accuracy


def demo_report(root: Path) -> str:
    rollout = json.loads((root / "rollout" / "report.json").read_text())
    vqa = json.loads((root / "vqa" / "vqa_test.json").read_text())
    lines = ["# dvla demo", ""]
    lines.append(format_report(rollout, relative_to=root).replace("# Rollout of", "## Rollout of"))
    lines += [
        "## Answers about VQA scenes",
        "",
        format_accuracy(vqa),
        "",
        "| image | question | truth | answer |",
    ]
    lines.append("| --- | --- | --- | --- |")
    for e in vqa["examples"]:
        image = Path(e["image"]).relative_to(root) if Path(e["image"]).is_relative_to(root) else e["image"]
        lines.append(f"| ![]({image}) | {e['question']} | {e['answer']} | {e['predicted']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--root", default="outputs/demo", type=Path)
    args = parser.parse_args()
    text = demo_report(args.root)
    (args.root / "REPORT.md").write_text(text)
    print(text)
    print(f"written to {args.root / 'REPORT.md'}")


if __name__ == "__main__":
    main()
