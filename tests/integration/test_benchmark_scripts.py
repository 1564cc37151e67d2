"""The benchmark scripts run end to end (smoke runs with --quick) and save what they print."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(script: str, *args: str) -> str:
    command = [sys.executable, str(ROOT / "benchmarks" / script), *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_bench_decode_times_every_decoding(tmp_path):
    out = tmp_path / "decode.json"
    stdout = _run("bench_decode.py", "--quick", "--hidden", "32", "--layers", "1", "--out", str(out))
    results = json.loads(out.read_text())
    modes = {r["mode"] for r in results["rows"]}
    assert modes == {"parallel", "autoregressive (KV cache)", "flow head (10 Euler steps)"}
    assert results["config"]["dtype"] in ("bf16", "fp32") and "--mixed_precision auto" in results["command"]
    assert all(r["ms"] > 0 for r in results["rows"]) and "4-step parallel decoding is" in stdout


def test_bench_data_compares_lerobots_path_with_dvlas(tmp_path):
    out = tmp_path / "data.json"
    stdout = _run("bench_data.py", "--quick", "--workdir", str(tmp_path / "data"), "--out", str(out))
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 3 and "| image features (PNG) |" in stdout
    for row in rows.values():
        assert row["frames"] == 80 and row["lerobot_item_with_chunk"] > 0
        assert row["cache_speedup"] == row["dvla_cache_one_process"] / row["lerobot_item_with_chunk"]


def test_bench_layout_times_every_token_layout(tmp_path):
    out = tmp_path / "layout.json"
    stdout = _run("bench_layout.py", "--quick", "--chunk", "4", "--out", str(out))
    results = json.loads(out.read_text())
    tokens = {r["layout"]: r["tokens"] for r in results["rows"]}
    assert tokens["discrete (1 value per token)"] == 4 * 14
    assert tokens["factored, 14 values per token (one per step)"] == 4
    assert all(r["train_samples_per_s"] > 0 and r["ms_1_steps"] > 0 for r in results["rows"])
    assert "| factored, 7 values per token | 8 |" in stdout
