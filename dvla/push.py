"""`dvla push --checkpoint CKPT --repo_id user/repo`: upload what a checkpoint needs to load
(weights, config, statistics, tokenizer; not the optimiser state) to the Hugging Face hub, with a
generated model card that carries the evaluation results given with `--results`."""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from dvla.checkpoint import (
    CONFIG_FILE,
    STATS_FILE,
    TOKENIZER_DIR,
    WEIGHTS_FILE,
    checkpoint_info,
    load_checkpoint,
    resolve_checkpoint,
)
from dvla.hub import is_repo_id

UPLOADED = (CONFIG_FILE, WEIGHTS_FILE, STATS_FILE, "step.json")  # and TOKENIZER_DIR, README.md


@dataclass
class PushConfig:
    """Upload a checkpoint to the hub: `dvla push --checkpoint CKPT --repo_id user/repo`."""

    # A checkpoint folder, or a training run's output_dir (its latest checkpoint).
    checkpoint: str | None = None
    # The hub model repo to create or update.
    repo_id: str | None = None
    # report.json files of `dvla rollout` or `dvla vqa` whose results go into the model card.
    results: list[str] = field(default_factory=list)
    private: bool = False
    # Write the folder that would be uploaded here instead of uploading (to look at the card first).
    dry_run: str | None = None
    commit_message: str = "Upload dvla checkpoint"

    def __post_init__(self):
        if not self.checkpoint:
            raise ValueError("--checkpoint is required: a folder written by `dvla train`")
        if not self.repo_id or not is_repo_id(self.repo_id) or "@" in self.repo_id:
            raise ValueError(f"--repo_id must be a hub model id user/repo, got {self.repo_id!r}")
        for path in self.results:
            if not Path(path).is_file():
                raise FileNotFoundError(f"no results file {path} (a report.json of dvla rollout or vqa)")


def stage(checkpoint: Path, folder: Path, results: list[dict], repo_id: str) -> Path:
    """Copy what loading needs into `folder` and write its README.md model card."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in UPLOADED:
        if (checkpoint / name).exists():
            shutil.copy2(checkpoint / name, folder / name)
    shutil.copytree(checkpoint / TOKENIZER_DIR, folder / TOKENIZER_DIR, dirs_exist_ok=True)
    (folder / "README.md").write_text(model_card(checkpoint, results, repo_id))
    return folder


def model_card(checkpoint: Path, results: list[dict], repo_id: str) -> str:
    """A model card: what the model is, what it was trained on, its results, how to run it."""
    model, _, _ = load_checkpoint(checkpoint)  # also checks that it loads before anything is uploaded
    config, backbone = model.config, model.backbone.config
    training = checkpoint_info(checkpoint)
    dataset = training.get("dataset") or ""
    env = {"aloha": "aloha", "sawyer": "metaworld"}.get(training.get("robot_type"), "metaworld")
    evaluated = [task for report in results for task in report.get("per_task", {})]
    which = (
        f"--tasks {','.join(dict.fromkeys(evaluated))}"
        if evaluated
        else "--suite " + ("all" if env == "aloha" else "mt10")
    )
    lines = ["---", "library_name: dvla", "pipeline_tag: robotics", "tags:"]
    lines += [f"  - {tag}" for tag in ("robotics", "vision-language-action", "masked-diffusion", "lerobot")]
    if is_repo_id(dataset):
        lines += ["datasets:", f"  - {dataset}"]
    start = f", from {config.backbone.init_from}" if config.backbone.init_from else ""
    parameters = sum(p.numel() for p in model.parameters()) / 1e6
    lines += [
        "---",
        "",
        f"# {repo_id.split('/')[-1]}",
        "",
        "A dvla vision-language-action policy: a masked-diffusion transformer backbone that fills in "
        "a whole action chunk in a few parallel denoising steps.",
        "",
        "| | |",
        "| --- | --- |",
        f"| action head | {config.head.type}, chunks of {config.chunk_size} steps |",
        f"| actions / state | {config.action_dim}-D / {config.state_dim}-D |",
        f"| cameras | {', '.join(config.vision.cameras)} ({config.vision.model_name}, "
        f"{config.vision.image_size} px high) |",
        f"| backbone | {backbone.hidden_size} wide, {backbone.num_hidden_layers} layers{start} |",
        f"| parameters | {parameters:.1f} M |",
        f"| trained on | {dataset or 'unknown'} ({training.get('robot_type') or 'robot'}, "
        f"{training.get('fps') or '?'} fps) |",
    ]
    tasks = training.get("tasks") or []
    if tasks:
        lines += ["", "Instructions it was trained on:", ""] + [f"- {t}" for t in tasks]
    if results:
        lines += ["", "## Results", "", *_results_table(results)]
    lines += [
        "",
        "## Use",
        "",
        "```bash",
        f"dvla rollout --checkpoint {repo_id} --env {env} {which} --episodes 50",
        "```",
        "",
        "```python",
        "from dvla.policy import DiffusionVLAPolicy",
        "",
        f'policy = DiffusionVLAPolicy.from_pretrained("{repo_id}")',
        "action = policy.select_action(images, [instruction], state)  # images {camera: (B, 3, H, W)}",
        "```",
        "",
    ]
    return "\n".join(lines)


def _results_table(results: list[dict]) -> list[str]:
    """Rows of a markdown table from `dvla rollout` and `dvla vqa` reports."""
    rows = ["| evaluation | result | 95% CI | n |", "| --- | ---: | ---: | ---: |"]
    for report in results:
        if "per_task" in report:  # dvla rollout
            decode = report.get("decode", {}).get("steps")
            for task, t in report["per_task"].items():
                low, high = t["wilson95"]
                steps = f", {decode} denoising step{'s' if decode != 1 else ''}" if decode else ""
                name = f"{task} success{steps}"
                rows.append(f"| {name} | {t['success_rate']:.0%} | {low:.0%}-{high:.0%} | {t['episodes']} |")
        elif "exact_match" in report:  # dvla vqa
            low, high = report["wilson95"]
            name = f"VQA exact match ({report['split']})"
            rows.append(
                f"| {name} | {report['exact_match']:.1%} | {low:.1%}-{high:.1%} | {report['questions']} |"
            )
        else:
            raise ValueError("a results file must be the report.json of dvla rollout or dvla vqa")
    return rows


def push(config: PushConfig) -> str:
    """Upload (or with dry_run, stage locally); the repo URL or the staged folder."""
    checkpoint = resolve_checkpoint(config.checkpoint)
    results = [json.loads(Path(p).read_text()) for p in config.results]
    if config.dry_run:
        if Path(config.dry_run).exists() and any(Path(config.dry_run).iterdir()):
            raise FileExistsError(f"--dry_run {config.dry_run} is not empty; give a new folder")
        folder = stage(checkpoint, Path(config.dry_run), results, config.repo_id)
        print(f"staged for {config.repo_id} (not uploaded): {folder}")
        return str(folder)
    from huggingface_hub import HfApi

    api = HfApi()
    with tempfile.TemporaryDirectory() as tmp:
        folder = stage(checkpoint, Path(tmp), results, config.repo_id)
        url = api.create_repo(config.repo_id, private=config.private, exist_ok=True, repo_type="model")
        if config.private:  # an existing repo keeps its visibility unless told
            api.update_repo_settings(config.repo_id, private=True)
        # the repo holds exactly this checkpoint afterwards: files of an earlier push are deleted
        api.upload_folder(repo_id=config.repo_id, folder_path=folder, commit_message=config.commit_message,
                          delete_patterns="*")  # fmt: skip
    print(f"uploaded {checkpoint} to {url}")
    return str(url)


def run(config: PushConfig) -> str:
    return push(config)
