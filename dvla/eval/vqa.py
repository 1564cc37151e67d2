"""`dvla vqa`: answer a question about an image, answer a file of questions, or measure
exact-match accuracy on a VQA split.

Examples:
  dvla vqa --checkpoint CKPT --image scene.png --question "how many objects are there?" --show_steps
  dvla vqa --checkpoint CKPT --questions questions.jsonl      # -> questions.answers.jsonl
  dvla vqa --checkpoint CKPT --dataset outputs/vqa_scenes --split test
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

from dvla.backbone.decoder import DecodeConfig
from dvla.checkpoint import resolve_checkpoint
from dvla.locks import exclusive_output
from dvla.processor import decode_answers
from dvla.training.precision import autocast, check_precision, resolve_precision
from dvla.types import VQA_CAMERA

MASK_SHOWN = "_"
EXAMPLES = 10  # the first questions of a split, saved with their images for a look


@dataclass
class VQAConfig:
    """Answer questions about images with a checkpoint trained on VQA scenes (alone or co-trained)."""

    # A checkpoint folder written by `dvla train`.
    checkpoint: str | None = None
    # One image file and one question ...
    image: str | None = None
    question: str | None = None
    # ... or a JSONL file, one {"image": path, "question": text, ...} per line (image paths relative
    # to the file's folder); answers go to --answers (default: <file>.answers.jsonl beside it), each
    # line the question's record with "answer" added ...
    questions: str | None = None
    answers: str | None = None
    # Replace an existing answers file.
    overwrite: bool = False
    # ... or a VQA scenes dataset folder and split, for accuracy overall and per question type.
    dataset: str | None = None
    split: str = "test"
    # Only the first N questions of the split (None = all).
    limit: int | None = None
    batch_size: int = 32
    # Print the answer block after every denoising step (which tokens were filled in when).
    show_steps: bool = False
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    # Where the accuracy report (vqa_<split>.json) and the --show_steps figure (answer_steps.png) go.
    output_dir: str = "outputs/vqa"
    # "bf16" autocast, "no" (fp32) or "auto" (bf16 where the CPU runs it natively; `dvla.training.precision`).
    mixed_precision: str = "auto"

    def __post_init__(self):
        if not self.checkpoint:
            raise ValueError("--checkpoint is required: a folder written by `dvla train`")
        single = self.image is not None or self.question is not None
        if sum([single, self.dataset is not None, self.questions is not None]) != 1:
            raise ValueError(
                "give one of: --image and --question, --questions FILE.jsonl, or --dataset (with --split)"
            )
        if single and (self.image is None or not self.question):
            raise ValueError("--image and --question go together")
        if self.batch_size < 1 or (self.limit is not None and self.limit < 1):
            raise ValueError("batch_size and limit must be >= 1")
        self.mixed_precision = check_precision(self.mixed_precision)


def load_vqa_policy(checkpoint: str, decode: DecodeConfig):
    from dvla.policy import DiffusionVLAPolicy, PolicyConfig

    policy = DiffusionVLAPolicy.from_pretrained(checkpoint, PolicyConfig(answer_decode=decode))
    if VQA_CAMERA not in policy.model.config.vision.cameras:
        raise ValueError(
            f"{checkpoint} was not trained on VQA scenes (its cameras are "
            f"{policy.model.config.vision.cameras}, no {VQA_CAMERA!r}); train with --vqa.root"
        )
    return policy


def load_image(path: str) -> torch.Tensor:
    """An image file -> (1, 3, H, W) float in [0, 1]."""
    from PIL import Image, UnidentifiedImageError

    if not Path(path).is_file():
        raise FileNotFoundError(f"no image file {path}")
    try:
        array = np.array(Image.open(path).convert("RGB"))  # a writable copy
    except (UnidentifiedImageError, OSError) as err:
        raise ValueError(f"{path} is not an image PIL can read (PNG, JPEG, ...): {err}") from err
    return torch.from_numpy(array).permute(2, 0, 1)[None].float() / 255


def _save_image(image: torch.Tensor, path: Path) -> Path:
    """(3, H, W) float in [0, 1] -> PNG."""
    from PIL import Image

    pixels = (image.permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
    Image.fromarray(pixels).save(path)
    return path


def format_steps(tokenizer, history: list[torch.Tensor], mask_id: int) -> list[str]:
    """One line per denoising step: the answer block (B=1) with hidden tokens as '_' and new ones marked."""
    lines, before = [], None
    for step, block in enumerate(history, start=1):
        ids = block[0].tolist()
        shown = []
        for k, token in enumerate(ids):
            text = MASK_SHOWN if token == mask_id else tokenizer.convert_ids_to_tokens(token)
            new = token != mask_id and (before is None or before[k] != token)
            shown.append(f"[{text}]" if new else text)
        lines.append(f"step {step}: {' '.join(shown)}")
        before = ids
    return lines


def answer_one(config: VQAConfig) -> str:
    policy = load_vqa_policy(config.checkpoint, config.decode)
    images = {VQA_CAMERA: load_image(config.image)}
    decode = replace(policy.answer_decode, record_history=config.show_steps)
    with _autocast(config):
        obs = policy.observation(images, [config.question], None)
        result = policy.model.answer(obs, decode)
    if config.show_steps:
        print("\n".join(format_steps(policy.tokenizer, result.history, policy.model.mask_id)))
        figure = plot_answer_steps(policy.tokenizer, result, policy.model.mask_id, config)
        print(f"how the answer formed: {figure}")
    return decode_answers(policy.tokenizer, result.tokens)[0]


def plot_answer_steps(tokenizer, result, mask_id: int, config: VQAConfig) -> Path:
    """<output_dir>/answer_steps.png: the answer block (B=1) after each step, shaded by confidence."""
    from dvla.eval.denoising_plot import plot_answer_forming, reveal_steps

    history = [block[0] for block in result.history]
    revealed = reveal_steps(history, mask_id)
    confidence = np.zeros(len(revealed))
    for step, scores in enumerate(result.confidence, start=1):
        at = revealed == step
        confidence[at] = scores[0].float().cpu().numpy()[at]
    tokens = [[tokenizer.convert_ids_to_tokens(t) if t != mask_id else "" for t in block.tolist()]
              for block in history]  # fmt: skip
    path = Path(config.output_dir) / "answer_steps.png"
    return plot_answer_forming(tokens, revealed, confidence, path, f"Q: {config.question}")


def read_questions(path: str) -> list[dict]:
    """The records of a questions JSONL file, each checked (a JSON object with an existing "image"
    file and a non-empty "question"); image paths are made absolute from the file's folder."""
    from PIL import Image, UnidentifiedImageError

    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"no questions file {path}")
    records = []
    for number, line in enumerate(file.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}, line {number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{where} is not JSON ({err.msg}); each line is one JSON object") from None
        question = record.get("question") if isinstance(record, dict) else None
        if not isinstance(question, str) or not question.strip():
            raise ValueError(f'{where}: needs {{"image": PATH, "question": TEXT}}, got {line[:120]}')
        if not isinstance(record.get("image"), str):
            raise ValueError(f'{where}: "image" must be a path to an image file')
        image = file.parent / record["image"]
        if not image.is_file():
            raise FileNotFoundError(f"{where}: no image file {image}")
        try:
            with Image.open(image) as opened:
                opened.verify()
        except (UnidentifiedImageError, OSError) as err:
            raise ValueError(f"{where}: {image} is not an image PIL can read: {err}") from None
        records.append({**record, "_image_file": str(image)})  # (dropped again from the answers)
    if not records:
        raise ValueError(f"{path} holds no questions")
    return records


def answer_questions(policy, records: list[dict], batch_size: int, progress: bool = True) -> list[str]:
    """Answers to `read_questions` records, `batch_size` at a time (images of one size per forward)."""
    from tqdm import tqdm

    answers: list[str | None] = [None] * len(records)
    starts = range(0, len(records), batch_size)
    for start in tqdm(starts, desc="vqa", unit="batch", disable=not progress):
        rows = range(start, min(start + batch_size, len(records)))
        images = {row: load_image(records[row]["_image_file"]) for row in rows}
        by_shape: dict[tuple, list[int]] = defaultdict(list)
        for row in rows:
            by_shape[tuple(images[row].shape)].append(row)
        for same in by_shape.values():
            batch = torch.cat([images[row] for row in same])  # (B, 3, H, W)
            got = policy.answer({VQA_CAMERA: batch}, [records[row]["question"] for row in same])
            for row, answer in zip(same, got, strict=True):
                answers[row] = answer
    return answers


def answer_file(config: VQAConfig) -> Path:
    """Answer every question of --questions; the answers file, written once all are answered."""
    records = read_questions(config.questions)
    source = Path(config.questions)
    out = Path(config.answers) if config.answers else source.with_name(f"{source.stem}.answers.jsonl")
    if out.exists() and not config.overwrite:
        raise FileExistsError(f"{out} exists; pass --overwrite to replace it, or --answers PATH")
    policy = load_vqa_policy(resolve_checkpoint(config.checkpoint), config.decode)
    with _autocast(config):
        answers = answer_questions(policy, records, config.batch_size)
    lines = []
    key = "predicted" if any("answer" in r for r in records) else "answer"  # keep a given answer
    for record, answer in zip(records, answers, strict=True):
        record = {k: v for k, v in record.items() if k != "_image_file"}
        lines.append(json.dumps({**record, key: answer}))
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(out)
    return out


def normalise(answer: str) -> str:
    return " ".join(answer.lower().split())


def evaluate(config: VQAConfig) -> dict:
    """Exact-match accuracy on a split, overall and per question type (holding output_dir)."""
    with exclusive_output(config.output_dir, "dvla vqa"):
        return _evaluate(config)


def _evaluate(config: VQAConfig) -> dict:
    from torch.utils.data import DataLoader, Subset
    from tqdm import tqdm

    from dvla.data import VQAScenes, collate

    checkpoint = resolve_checkpoint(config.checkpoint)
    policy = load_vqa_policy(checkpoint, config.decode)
    data = VQAScenes(config.dataset, config.split)
    if config.limit:
        data = Subset(data, range(min(config.limit, len(data))))
    loader = DataLoader(data, batch_size=config.batch_size, collate_fn=collate)
    right, total = defaultdict(int), defaultdict(int)
    mistakes, examples = [], []
    with _autocast(config):
        for batch in tqdm(loader, desc=f"vqa {config.split}", unit="batch"):
            answers = policy.answer(batch["images"], batch["question"])
            for q, truth, got, kind in zip(
                batch["question"], batch["answer"], answers, batch["question_type"], strict=True
            ):
                ok = normalise(got) == normalise(truth)
                right[kind] += ok
                total[kind] += 1
                if len(examples) < EXAMPLES:
                    examples.append({"question": q, "answer": truth, "predicted": got})
                if not ok and len(mistakes) < 20:
                    mistakes.append({"question": q, "answer": truth, "predicted": got})
    from dvla.eval.metrics import wilson_interval

    n, k = sum(total.values()), sum(right.values())
    report = {
        "checkpoint": str(checkpoint),
        "dataset": config.dataset,
        "split": config.split,
        "questions": n,
        "exact_match": k / n,
        "wilson95": list(wilson_interval(k, n)),
        "per_type": {t: {"questions": total[t], "exact_match": right[t] / total[t]} for t in sorted(total)},
        "decode_steps": policy.answer_decode.steps,  # at most one per answer token
        "examples": examples,
        "mistakes": mistakes,
    }
    out = Path(config.output_dir)
    (out / "examples").mkdir(parents=True, exist_ok=True)
    for i, example in enumerate(examples):
        example["image"] = str(_save_image(data[i]["images"][VQA_CAMERA], out / "examples" / f"{i}.png"))
    (out / f"vqa_{config.split}.json").write_text(json.dumps(report, indent=2))
    return report


def format_accuracy(report: dict) -> str:
    lines = [
        f"VQA {report['split']}: exact match {report['exact_match']:.1%} on {report['questions']} questions "
        f"(95% CI {report['wilson95'][0]:.1%}-{report['wilson95'][1]:.1%})",
        "| question type | questions | exact match |",
        "| --- | ---: | ---: |",
    ]
    lines += [f"| {t} | {v['questions']} | {v['exact_match']:.1%} |" for t, v in report["per_type"].items()]
    return "\n".join(lines)


def _autocast(config: VQAConfig):
    cpu = torch.device("cpu")
    return autocast(resolve_precision(config.mixed_precision, cpu), cpu)


def run(config: VQAConfig):
    if config.questions is not None:
        out = answer_file(config)
        print(f"answers: {out}")
        return out
    if config.dataset is not None:
        report = evaluate(config)
        print(format_accuracy(report))
        print(f"report: {Path(config.output_dir) / f'vqa_{config.split}.json'}")
        return report
    answer = answer_one(config)
    print(f"Q: {config.question}\nA: {answer}")
    return answer
