import subprocess
import sys

from dvla.cli import main, normalize_args
from dvla.sim.command import CollectConfig


def test_normalize_args_accepts_dashes_spaces_and_bare_flags():
    args = ["--image-size", "64", "--resume", "--root=x", "--videos", "false", "--overwrite"]
    assert normalize_args(args, CollectConfig) == [
        "--image_size", "64", "--resume=true", "--root=x", "--videos", "false", "--overwrite=true",
    ]  # fmt: skip


def test_help_explains_every_option():
    out = subprocess.run(
        [sys.executable, "-m", "dvla.cli", "collect", "--help"], capture_output=True, text=True
    ).stdout
    for option in ("--tasks", "--suite", "--episodes", "--root", "--cameras", "--workers", "--resume"):
        assert option in out
    assert "Successful expert episodes to record per task" in out


def test_top_level_usage_lists_commands(capsys):
    assert main([]) == 0
    assert "collect" in capsys.readouterr().out
    assert main(["fly"]) == 2


def test_missing_required_option_is_a_message_not_a_traceback(capsys):
    assert main(["train", "--steps", "2"]) == 1
    err = capsys.readouterr().err
    assert "nothing to train on" in err and "Traceback" not in err
    assert main(["rollout", "--suite", "mt10"]) == 1
    assert "--checkpoint is required" in capsys.readouterr().err
    assert main(["vqa", "--checkpoint", "x"]) == 1
    assert "--image and --question, --questions FILE.jsonl, or --dataset" in capsys.readouterr().err
