"""`python -m dvla.eval.demo_report`: one markdown page from the demo's rollout and VQA reports."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from dvla.eval.rollout import format_report
from dvla.eval.vqa import format_accuracy
from dvla.training.precision import resolve_precision

# Fresh-clone `make demo` after the venv, 2 CPU cores (docs/results/demo.md): a CPU with native bf16
# (Zen 4 EPYC), and the fp32 path with AVX2 kernels only (ATEN_CPU_CAPABILITY=avx2
# ONEDNN_MAX_CPU_ISA=AVX2 on the same machine), as CPUs without native bf16 run it.
EXPECTED_MINUTES = {"bf16": 18, "no": 20}


def plan() -> str:
    """What `make demo` will do here and about how long it takes."""
    precision = resolve_precision("auto", torch.device("cpu"))
    kind = (
        "bf16 autocast (native on this CPU)" if precision == "bf16" else "fp32 (this CPU has no native bf16)"
    )
    return (
        f"make demo: collect 60 expert episodes and 1000 VQA scenes, train 1800 steps in {kind}, roll out "
        f"30 episodes, answer 483 questions: about {EXPECTED_MINUTES[precision]} min on 2 cores. "
        "Every stage resumes; rerunning is cheap."
    )


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
    parser.add_argument("--plan", action="store_true", help="print what the demo does and its expected time")
    args = parser.parse_args()
    if args.plan:
        print(plan())
        return
    text = demo_report(args.root)
    (args.root / "REPORT.md").write_text(text)
    print(text)
    print(f"written to {args.root / 'REPORT.md'}")


if __name__ == "__main__":
    main()
