"""The `dvla` command line: `dvla <command> [--config_path FILE.yaml] [--key=value ...]`.

Options follow draccus (as in lerobot): a YAML file given by --config_path, overridden by --key=value
flags. For convenience `--key value`, `--key-with-dashes` and bare boolean flags (`--resume`) work too.
"""

from __future__ import annotations

import dataclasses
import sys
import typing
from collections.abc import Callable

import draccus
from draccus.utils import DecodingError, ParsingError

from dvla import push
from dvla.bench import config as bench_config
from dvla.bench import run as bench
from dvla.data import show
from dvla.eval import rollout, rollout_config, vqa
from dvla.serving import server as serve
from dvla.sim import command as collect
from dvla.training import config as train_config
from dvla.training import loop as train

Command = tuple[type, Callable, str]


def _commands() -> dict[str, Command]:
    return {
        "collect": (collect.CollectConfig, collect.run, "record scripted MetaWorld demos or VQA scenes"),
        "show": (show.ShowConfig, show.run, "summarise a LeRobot or VQA dataset and save a preview image"),
        "train": (train_config.TrainConfig, train.run, "train a DiffusionVLA on a LeRobot dataset"),
        "rollout": (rollout_config.RolloutConfig, rollout.run, "evaluate a checkpoint by MuJoCo rollouts"),
        "vqa": (vqa.VQAConfig, vqa.run, "answer questions about images, or score a VQA split"),
        "bench": (bench_config.BenchConfig, bench.run, "benchmark decoding, peers, latency and throughput"),
        "serve": (serve.ServeConfig, serve.run, "serve a checkpoint to robots (websockets, openpi's format)"),
        "push": (push.PushConfig, push.run, "upload a checkpoint to the Hugging Face hub with a model card"),
    }


def _bool_fields(config_class: type) -> set[str]:
    hints = typing.get_type_hints(config_class)
    return {f.name for f in dataclasses.fields(config_class) if hints[f.name] is bool}


def normalize_args(args: list[str], config_class: type) -> list[str]:
    """Map `--a-b` to `--a_b` and a bare boolean `--flag` to `--flag=true` for draccus."""
    bools = _bool_fields(config_class)
    out = []
    for i, arg in enumerate(args):
        if arg.startswith("--"):
            name, eq, value = arg[2:].partition("=")
            name = name.replace("-", "_")
            arg = f"--{name}{eq}{value}"
            next_is_value = i + 1 < len(args) and not args[i + 1].startswith("--")
            if name in bools and not eq and not next_is_value:
                arg += "=true"
        out.append(arg)
    return out


def config_error(err: BaseException) -> BaseException:
    """The error under draccus' wrappers: a config's own check (__post_init__) says what is wrong."""
    while isinstance(err, (DecodingError, ParsingError)) and (err.__cause__ or err.__context__) is not None:
        err = err.__cause__ or err.__context__
    return err


def _usage(commands: dict[str, Command]) -> str:
    lines = ["usage: dvla <command> [--config_path FILE.yaml] [--key=value ...]", "", "commands:"]
    lines += [f"  {name:<10} {help_}" for name, (_, _, help_) in commands.items()]
    lines += ["", "`dvla <command> --help` lists every option of a command."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = _commands()
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage(commands))
        return 0
    name, rest = argv[0], argv[1:]
    if name not in commands:
        print(f"dvla: unknown command {name!r}\n\n{_usage(commands)}", file=sys.stderr)
        return 2
    config_class, run, _ = commands[name]
    sys.argv[0] = f"dvla {name}"
    try:
        run(draccus.parse(config_class=config_class, args=normalize_args(rest, config_class)))
    except (ValueError, FileExistsError, FileNotFoundError, RuntimeError, DecodingError, ParsingError) as err:
        err = config_error(err)
        print(f"dvla {name}: error: {err}\n(`dvla {name} --help` lists every option)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
