"""`dvla bench --quick` end to end (tiny dvla checkpoints, ACT and Diffusion Policy trained by
lerobot-train for 2 steps), its resumability, and the target verdicts."""

import json

import pytest
import torch
from test_train import tiny_train_config

from dvla.action_head import FlowHeadConfig
from dvla.bench.config import BenchConfig, PeerConfig
from dvla.bench.peers import DONE_FILE, task_episodes, train_args, train_peer
from dvla.bench.report import targets
from dvla.cli import main
from dvla.eval.metrics import mcnemar_exact, paired_comparison
from dvla.sim.tasks import task_description
from dvla.training.loop import train
from dvla.training.precision import resolve_precision

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
AMP = resolve_precision("auto", torch.device("cpu")) == "bf16"  # how the bench trains its peers here


@pytest.fixture(scope="module")
def checkpoints(tiny_dataset, tmp_path_factory):
    """A discrete-head and a flow-head tiny dvla checkpoint trained on the tiny dataset."""
    root, _ = tiny_dataset
    out = tmp_path_factory.mktemp("bench_train")
    discrete = train(tiny_train_config(root, out / "discrete", steps=2, tensorboard=False)).checkpoint
    config = tiny_train_config(root, out / "flow", steps=2, tensorboard=False)
    config.model.head = FlowHeadConfig()
    flow = train(config).checkpoint
    return discrete, flow


@pytest.fixture(scope="module")
def bench_run(checkpoints, tiny_dataset, tmp_path_factory):
    root, _ = tiny_dataset
    discrete, flow = checkpoints
    out = tmp_path_factory.mktemp("bench") / "out"
    args = ["bench", "--checkpoint", str(discrete), "--flow_checkpoint", str(flow), "--tasks", "reach-v3"]
    args += ["--quick", "--workers", "1", "--peers.dataset_root", str(root), "--output_dir", str(out)]
    assert main(args) == 0
    return args, out


def test_quick_bench_measures_every_section(bench_run):
    _, out = bench_run
    results = json.loads((out / "bench.json").read_text())
    tokens = 4 * 4  # chunk 4 x action dim 4
    rows = {r["name"]: r for r in results["decode"]["rows"]}
    assert set(rows) == {
        "dvla discrete, 1 step",
        "dvla discrete, 4 steps",
        f"dvla discrete, {tokens} steps",
        "dvla discrete, autoregressive",
    }
    assert rows["dvla discrete, 1 step"]["forwards"] == 2  # one denoising step + the prefix pass
    assert rows["dvla discrete, 4 steps"]["forwards"] == 5
    assert rows["dvla discrete, autoregressive"]["forwards"] == tokens + 1
    for row in rows.values():
        assert row["episodes"] == 1 and 0 <= row["wilson95"][0] <= row["success"] <= row["wilson95"][1]
        assert row["ms_batch1"] > 0
    heads = [r["name"] for r in results["heads"]["rows"]]
    assert heads[0].startswith("discrete") and heads[1].startswith("flow")
    peers = results["peers"]
    pairs = {(r["policy"], r["task"]) for r in peers["rows"]}
    assert pairs == {("act", "reach-v3"), ("diffusion", "reach-v3")}
    for row in peers["rows"]:
        assert row["train_seconds"] > 0 and "lerobot-train" in row["command"] and row["episodes"] == 1
    assert set(peers["summary"]) == {"act", "diffusion"} and peers["dvla"]["episodes"] == 1
    for policy in ("act", "diffusion"):  # dvla and the peer on the one shared episode
        paired = peers["summary"][policy]["paired_vs_dvla"]
        gap = peers["dvla"]["successes"] - sum(r["successes"] for r in peers["rows"] if r["policy"] == policy)
        assert paired["episodes"] == 1 and paired["first_only"] - paired["second_only"] == gap
    heads = results["heads"]
    assert heads["paired"]["episodes"] == 1
    assert heads["paired"]["first_only"] - heads["paired"]["second_only"] == (
        heads["rows"][0]["successes"] - heads["rows"][1]["successes"]
    )
    latency = {r["policy"] if r["policy"] != "dvla" else r["name"]: r for r in results["latency"]["rows"]}
    assert results["latency"]["default"] == "dvla discrete, 1 step"  # the policy's default decoding
    assert {"act", "diffusion", "dvla discrete, 1 step, no prefix cache"} <= set(latency)
    assert latency["dvla discrete, 4 steps"]["forwards"] == 5  # every other few-step sweep setting is timed
    assert latency["diffusion"]["forwards"] == 4  # the tiny peer's 4 denoising steps
    for row in latency.values():
        assert row["ms_per_control_step"] == pytest.approx(row["ms_per_chunk"] / row["n_action_steps"])
    t = results["throughput"]
    assert t["flops_per_step"] > 0 and t["samples_per_s"] > 0
    assert t["fraction_of_matmul"] == pytest.approx(t["flops_per_s"] / t["matmul_flops_per_s"])
    # every timing and the peers' training follow the precision rule of `dvla train`
    precision = resolve_precision("auto", torch.device("cpu"))
    assert (
        results["run"]["precision"] == precision
        and t["precision"] == {"bf16": "bf16", "no": "fp32"}[precision]
    )
    for row in peers["rows"]:
        assert f"--policy.use_amp={str(precision == 'bf16').lower()}" in row["command"]
    for name in ("success_vs_forwards.png", "success_vs_latency.png", "latency.png"):
        assert (out / name).read_bytes()[:8] == PNG_MAGIC
    md = (out / "bench.md").read_text()
    assert f"## Latency at batch 1 ({'bf16 autocast' if precision == 'bf16' else 'fp32'})" in md
    assert "## Targets" in md and "reach-v3" in md and "| act | reach-v3 |" in md
    assert "- dvla vs act: " in md and "exact McNemar p = " in md.split("## Discrete vs flow")[1]
    section = md.split("## Decoding sweep")[1].split("\n## ")[0]
    sweep = [line for line in section.splitlines() if line.startswith("| dvla discrete, ")]
    assert len(sweep) == 4
    assert "| 95% CI | reach-v3 |" in md and all(line.count("|") == 8 for line in sweep)  # 6 columns + 1 task


def test_bench_reuses_finished_work(bench_run, capsys):
    args, out = bench_run
    peer_record = out / "peers" / "act" / "reach-v3" / DONE_FILE
    before = peer_record.read_text()
    first = json.loads((out / "bench.json").read_text())
    assert main([*args, "--sections", "[decode,latency]"]) == 0
    assert "reusing" in capsys.readouterr().out
    again = json.loads((out / "bench.json").read_text())
    assert [r["success"] for r in again["decode"]["rows"]] == [r["success"] for r in first["decode"]["rows"]]
    timed = {r["policy"] for r in again["latency"]["rows"]}
    assert {"act", "diffusion"} <= timed  # the peers an earlier run trained are timed too
    assert main([*args, "--sections", "[peers]"]) == 0
    assert peer_record.read_text() == before  # not retrained


def test_peer_trained_with_other_settings_is_not_overwritten(bench_run, tiny_dataset, tmp_path):
    root, _ = tiny_dataset
    _, out = bench_run
    folder = out / "peers" / "act" / "reach-v3"
    episodes = [0, 1]  # the tiny dataset's reach-v3 episodes, as the bench found them
    config = PeerConfig(policies=["act"], dataset_root=str(root), steps=3, batch_size=4, size="tiny")
    with pytest.raises(FileExistsError, match="with --steps=2; .* with --steps=3$"):
        train_peer("act", "reach-v3", episodes, config, folder, (4, 2), "cpu", amp=AMP)
    config.steps, config.extra_args = 2, ["--policy.optimizer_lr=1e-4"]
    with pytest.raises(FileExistsError, match="to train with --policy.optimizer_lr=1e-4"):
        train_peer("act", "reach-v3", episodes, config, folder, (4, 2), "cpu", amp=AMP)
    config.extra_args = []
    with pytest.raises(FileExistsError, match="--policy.chunk_size=4 .*--policy.chunk_size=8"):
        train_peer(
            "act", "reach-v3", episodes, config, folder, (8, 4), "cpu", amp=AMP
        )  # another checkpoint's chunk
    # a record from before the arguments were kept, and a half-trained run started with other ones
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    record = json.loads((folder / DONE_FILE).read_text())
    (legacy / DONE_FILE).write_text(json.dumps({k: v for k, v in record.items() if k != "args"}))
    with pytest.raises(FileExistsError, match="older dvla"):
        train_peer("act", "reach-v3", episodes, config, legacy, (4, 2), "cpu", amp=AMP)
    partial = tmp_path / "partial"
    (partial / "checkpoints" / "last" / "training_state").mkdir(parents=True)
    (partial / "checkpoints" / "last" / "training_state" / "training_step.json").write_text('{"step": 1}')
    (tmp_path / "partial.args.json").write_text(json.dumps(["lerobot-train", "--steps=9"]))
    with pytest.raises(FileExistsError, match="partly trained with --steps=9"):
        train_peer("act", "reach-v3", episodes, config, partial, (4, 2), "cpu", amp=AMP)


def test_diffusion_warmup_fits_a_short_budget(tiny_dataset, tmp_path):
    root, _ = tiny_dataset
    for steps, warmup in ((300, 30), (20_000, 500)):  # a tenth of the budget, at most LeRobot's 500
        config = PeerConfig(dataset_root=str(root), steps=steps)
        args = train_args("diffusion", "reach-v3", [0], config, tmp_path, (16, 8), "cpu")
        assert f"--policy.scheduler_warmup_steps={warmup}" in args
    config.extra_args = ["--policy.scheduler_warmup_steps=7"]  # the user's flag comes last: it wins
    args = train_args("diffusion", "reach-v3", [0], config, tmp_path, (16, 8), "cpu")
    assert args.index("--policy.scheduler_warmup_steps=500") < args.index("--policy.scheduler_warmup_steps=7")


def test_policy_steps_give_one_peer_its_own_budget(tiny_dataset, tmp_path):
    root, _ = tiny_dataset
    config = PeerConfig(dataset_root=str(root), steps=300, policy_steps={"act": 400})
    act = train_args("act", "reach-v3", [0], config, tmp_path, (16, 8), "cpu")
    diffusion = train_args("diffusion", "reach-v3", [0], config, tmp_path, (16, 8), "cpu", amp=False)
    assert "--steps=400" in act and "--save_freq=100" in act
    assert "--policy.use_amp=true" in act and "--policy.use_amp=false" in diffusion  # fp32 where dvla is
    assert "--steps=300" in diffusion and "--policy.scheduler_warmup_steps=30" in diffusion


def test_peer_is_refused_on_a_task_it_was_not_trained_on(bench_run, tmp_path, capsys):
    _, out = bench_run
    peer = out / "peers" / "act" / "reach-v3"
    args = ["rollout", "--checkpoint", str(peer), "--tasks", "door-open-v3", "--output_dir", str(tmp_path)]
    assert main(args) == 1
    assert "not trained on ['door-open-v3']" in capsys.readouterr().err


def test_missing_task_in_peer_dataset(tiny_dataset):
    root, _ = tiny_dataset
    with pytest.raises(ValueError, match="no episodes of \\['pick-place-v3'\\]"):
        task_episodes(root, {"pick-place-v3": task_description("pick-place-v3")})
    episodes = task_episodes(root, {"reach-v3": task_description("reach-v3")})
    assert len(episodes["reach-v3"]) == 2


def test_peers_follow_dvla_chunking_or_their_own(tiny_dataset, tmp_path):
    root, _ = tiny_dataset
    assert PeerConfig().control(50) == (50, 25)  # dvla's receding horizon by default
    own = PeerConfig(dataset_root=str(root), chunk_size=100, n_action_steps=100)  # ACT's defaults
    assert own.control(50) == (100, 100)
    args = train_args("act", "reach-v3", [0], own, tmp_path, own.control(50), "cpu")
    assert "--policy.chunk_size=100" in args and "--policy.n_action_steps=100" in args
    with pytest.raises(ValueError, match="cannot exceed peers.chunk_size"):
        PeerConfig(chunk_size=10, n_action_steps=20)


def test_bench_config_errors(tmp_path):
    with pytest.raises(ValueError, match="--checkpoint is required"):
        BenchConfig()
    with pytest.raises(ValueError, match="unknown sections"):
        BenchConfig(checkpoint="x", sections=["speed"])
    with pytest.raises(ValueError, match="policy:task:folder"):
        PeerConfig(trained=["act:somewhere"])
    with pytest.raises(ValueError, match="unknown peer policies"):
        PeerConfig(policies=["pi0"])
    with pytest.raises(ValueError, match="peers.size"):
        PeerConfig(size="huge")
    with pytest.raises(ValueError, match="unknown policies \\['pi0'\\]"):
        PeerConfig(policy_steps={"pi0": 10})
    with pytest.raises(ValueError, match="must be >= 1"):
        PeerConfig(policy_steps={"act": 0})


def test_policy_steps_parse_from_the_command_line():
    import draccus

    from dvla.cli import normalize_args

    args = ["--checkpoint", "x", "--peers.steps", "285", "--peers.policy_steps", "{act: 380}"]
    config = draccus.parse(config_class=BenchConfig, args=normalize_args(args, BenchConfig))
    assert config.peers.steps_for("act") == 380 and config.peers.steps_for("diffusion") == 285
    quick = draccus.parse(config_class=BenchConfig, args=normalize_args([*args, "--quick"], BenchConfig))
    assert quick.peers.policy_steps == {} and quick.peers.steps_for("act") == 2  # quick trains 2 steps


def _results(best_few: float, ar_ms: float, peer_success: float, fraction: float) -> dict:
    def row(steps: int, success: float) -> dict:
        name, label = f"dvla discrete, {steps} steps", str(steps)
        common = dict(autoregressive=False, wilson95=[0, 1])
        return dict(name=name, steps=steps, label=label, success=success, **common)

    return {
        "decode": {"rows": [row(2, best_few - 0.1), row(4, best_few), row(16, 0.9)]},
        "latency": {
            "rows": [
                {"name": "dvla discrete, 4 steps", "ms_per_chunk": 10.0},
                {"name": "dvla discrete, autoregressive", "ms_per_chunk": ar_ms},
                {"name": "act", "ms_per_chunk": 8.0},
                {"name": "diffusion", "ms_per_chunk": 40.0},
            ]
        },
        "peers": {"summary": {"act": {"success": peer_success}}, "dvla": {"success": 0.5}},
        "throughput": {
            "precision": "bf16",
            "fraction_of_matmul": fraction,
            "flops_per_s": 1e12 * fraction,
            "matmul_flops_per_s": 1e12,
        },
    }


def test_target_verdicts():
    reached = {v["target"]: v["reached"] for v in targets(_results(0.89, 100.0, 0.4, 0.35))}
    assert reached["<= 4 denoising forwards per chunk within 2 points of the best success"] is True
    assert reached[">= 8x lower latency per chunk than AR decoding (same model)"] is True
    assert reached["success >= act on the same tasks and budget"] is True
    assert reached["latency per chunk <= 1.5x act's"] is True  # 10 / 8 = 1.25
    assert reached["latency per chunk <= 0.33x diffusion's"] is True  # 10 / 40
    assert reached["training at >= 30% of the measured bf16 matmul rate"] is True
    missed_verdicts = targets(_results(0.85, 70.0, 0.6, 0.2))
    missed = {v["target"]: v["reached"] for v in missed_verdicts}
    assert "best overall 90% (16 steps)" in missed_verdicts[0]["value"]
    assert "not resolved" in missed_verdicts[0]["value"]  # both intervals are [0, 1]
    apart = _results(0.5, 70.0, 0.6, 0.2)
    for row in apart["decode"]["rows"]:
        row["wilson95"] = [row["success"] - 0.05, row["success"] + 0.05]
    assert "not resolved" not in targets(apart)[0]["value"]  # 50% +- 5 and 90% +- 5 do not overlap
    few_best = targets(_results(0.95, 70.0, 0.6, 0.2))[0]  # 4 steps beat 16
    assert few_best["reached"] and "(4 steps)" in few_best["value"]
    assert "not resolved" not in few_best["value"]
    assert not any(missed[k] for k in missed if "diffusion" not in k and "act's" not in k)


def test_latency_targets_follow_the_default_setting():
    results = _results(0.89, 100.0, 0.4, 0.35)
    results["latency"]["rows"][0]["name"] = "dvla discrete, 2 steps"  # a run with --default_steps 2
    assert not any("AR decoding" in v["target"] for v in targets(results))
    results["latency"]["default"] = "dvla discrete, 2 steps"
    verdict = {v["target"]: v for v in targets(results)}
    assert verdict[">= 8x lower latency per chunk than AR decoding (same model)"]["value"].startswith("10.0x")
    assert verdict["latency per chunk <= 1.5x act's"]["reached"] is True


def test_ar_ratio_names_every_few_step_setting():
    results = _results(0.89, 70.0, 0.4, 0.35)
    del results["decode"]
    results["latency"]["rows"].insert(1, {"name": "dvla discrete, 1 step", "ms_per_chunk": 5.0})
    verdict = next(v for v in targets(results) if "AR decoding" in v["target"])
    assert verdict["value"] == "7.0x at 4 steps (10.0 vs 70.0 ms); 1 step: 14.0x"
    assert verdict["reached"] is False  # judged at the default setting when no sweep ran


def test_ar_ratio_at_a_one_step_default_names_the_few_step_settings_above_it():
    results = _results(0.89, 70.0, 0.4, 0.35)
    del results["decode"]
    latency = results["latency"]
    latency["default"] = "dvla discrete, 1 step"
    latency["rows"][1:1] = [
        {"name": "dvla discrete, 1 step", "ms_per_chunk": 5.0},
        {"name": "dvla discrete, 1 step, no prefix cache", "ms_per_chunk": 9.0},
        {"name": "dvla discrete, 2 steps", "ms_per_chunk": 7.0},
        {"name": "dvla discrete, 64 steps", "ms_per_chunk": 80.0},
    ]
    verdict = next(v for v in targets(results) if "AR decoding" in v["target"])
    assert verdict["value"] == "14.0x at 1 step (5.0 vs 70.0 ms); 2 steps: 10.0x, 4 steps: 7.0x"
    assert verdict["reached"] is True


def test_ar_ratio_is_judged_at_the_sweep_setting_that_keeps_success():
    results = _results(0.5, 70.0, 0.4, 0.35)  # 2 steps 40%, 4 steps 50%, 16 steps 90%
    results["latency"]["rows"].insert(1, {"name": "dvla discrete, 2 steps", "ms_per_chunk": 5.0})
    verdict = next(v for v in targets(results) if "AR decoding" in v["target"])
    assert verdict["value"].startswith("7.0x at 4 steps, the best <= 4-step setting (10.0 vs 70.0 ms, lat")
    assert "4 steps is not within 2 points of the best success" in verdict["value"]
    assert verdict["value"].endswith("2 steps: 14.0x, 4 steps: 7.0x") and verdict["reached"] is False
    for row, ms in zip(results["decode"]["rows"], (5.0, 10.0, 30.0), strict=True):
        row["ms_batch1"] = ms
    ar = {"name": "dvla discrete, autoregressive", "autoregressive": True, "steps": 64, "label": "AR"}
    results["decode"]["rows"].append({**ar, "success": 0.1, "wilson95": [0, 1], "ms_batch1": 90.0})
    del results["latency"]  # no latency section: the sweep's own timings
    verdict = next(v for v in targets(results) if "AR decoding" in v["target"])
    assert verdict["value"].startswith("9.0x at 4 steps, the best <= 4-step setting (10.0 vs 90.0 ms, decode")
    assert verdict["reached"] is True


def test_success_target_uses_the_paired_count():
    results = _results(0.89, 100.0, 0.4, 0.35)  # pooled: dvla 50% against act 40%
    act = results["peers"]["summary"]["act"]
    act["paired_vs_dvla"] = {"episodes": 10, "first_only": 1, "second_only": 2, "p_value": 1.0}
    verdict = next(v for v in targets(results) if v["target"].startswith("success >= act"))
    assert verdict["reached"] is False  # on the shared episodes act solved one more
    assert "1 episodes solved by dvla only, 2 by act only, of 10" in verdict["value"]


def test_paired_comparison_counts_discordant_episodes():
    first = {("reach-v3", seed): seed < 1015 for seed in range(1000, 1020)}  # 15 of 20
    second = {("reach-v3", seed): seed >= 1003 for seed in range(1000, 1020)}  # 17 of 20
    second[("drawer-close-v3", 1000)] = True  # not run by `first`: left out of the pairing
    paired = paired_comparison(first, second)
    assert (paired["episodes"], paired["first_only"], paired["second_only"]) == (20, 3, 5)
    assert paired["p_value"] == pytest.approx(2 * (1 + 8 + 28 + 56) / 2**8)  # 186 / 256
    assert mcnemar_exact(12, 3) == pytest.approx(2 * (1 + 15 + 105 + 455) / 2**15)  # two-sided, p = 1/2
    assert mcnemar_exact(0, 0) == 1.0 and mcnemar_exact(4, 4) == 1.0
    with pytest.raises(ValueError, match="discordant counts"):
        mcnemar_exact(-1, 2)
