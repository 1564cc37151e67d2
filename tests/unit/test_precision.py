"""`--mixed_precision auto | bf16 | no`: bf16 only where it is fast, and a bare `no` is understood."""

import warnings

import draccus
import pytest
import torch

from dvla.cli import normalize_args
from dvla.eval.rollout_config import RolloutConfig
from dvla.eval.vqa import VQAConfig
from dvla.training import precision
from dvla.training.config import TrainConfig, VQADataConfig
from dvla.training.precision import check_precision, cpu_has_fast_bf16, resolve_precision


def test_auto_is_bf16_on_gpus_and_native_bf16_cpus_else_fp32():
    cpu = torch.device("cpu")
    assert resolve_precision("auto", cpu) == ("bf16" if cpu_has_fast_bf16() else "no")
    assert resolve_precision("auto", torch.device("cuda")) == "bf16"
    assert resolve_precision("no", cpu) == "no"
    # this machine's answer agrees with the capability torch reports for it
    assert cpu_has_fast_bf16() <= (torch.backends.cpu.get_cpu_capability() == "AVX512")


def test_bf16_on_a_cpu_that_emulates_it_warns(monkeypatch):
    monkeypatch.setattr(precision, "cpu_has_fast_bf16", lambda: False)
    with pytest.warns(UserWarning, match="10x slower than fp32"):
        assert resolve_precision("bf16", torch.device("cpu")) == "bf16"
    monkeypatch.setattr(precision, "cpu_has_fast_bf16", lambda: True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert resolve_precision("bf16", torch.device("cpu")) == "bf16"
        assert resolve_precision("auto", torch.device("cpu")) == "bf16"


def test_command_line_no_means_fp32_and_bad_values_name_the_choices():
    args = ["--vqa.root", "x", "--mixed_precision", "no"]
    assert draccus.parse(TrainConfig, args=normalize_args(args, TrainConfig)).mixed_precision == "no"
    assert TrainConfig(vqa=VQADataConfig(root="x")).mixed_precision == "auto"  # the default
    assert check_precision(False) == "no"
    for make in (
        lambda: TrainConfig(vqa=VQADataConfig(root="x"), mixed_precision="fp16"),
        lambda: RolloutConfig(checkpoint="c", mixed_precision="fp16"),
        lambda: VQAConfig(checkpoint="c", dataset="d", mixed_precision="fp16"),
    ):
        with pytest.raises(ValueError, match="'auto', 'bf16', 'no'"):
            make()


def test_the_bf16_detection_can_be_overridden(monkeypatch):
    """DVLA_CPU_BF16=0 times the fp32 path of CPUs without native bf16 on any machine."""
    cpu = torch.device("cpu")
    monkeypatch.setenv("DVLA_CPU_BF16", "0")
    assert not cpu_has_fast_bf16() and resolve_precision("auto", cpu) == "no"
    monkeypatch.setenv("DVLA_CPU_BF16", "1")
    assert cpu_has_fast_bf16() and resolve_precision("auto", cpu) == "bf16"
