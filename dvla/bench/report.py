"""The benchmark's markdown table, target verdicts and PNG plots (from the results dict of run.py)."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def plural_steps(steps: int) -> str:
    """A step count in words: 1 step, 4 steps."""
    return f"{steps} step{'' if steps == 1 else 's'}"


def _setting(label: str) -> str:
    """A decode setting's plot label ("1", "4", "AR") in words."""
    return "autoregressive" if label == "AR" else plural_steps(int(label))


def _wrap(command: str) -> str:
    """A long command on several lines, to fit under a plot."""
    return "\n".join(textwrap.wrap(command, 130, break_on_hyphens=False))


AR_NAME = "dvla discrete, autoregressive"
FEW_STEPS = 4  # "few-step" decoding: at most this many denoising forwards per chunk
AR_TARGET = ">= 8x lower latency per chunk than AR decoding (same model)"


def _steps(name: str) -> int | None:
    """The step count of a latency row named like "dvla discrete, 2 steps"; None for other rows."""
    match = re.fullmatch(r"dvla discrete, (\d+) steps?", name)
    return int(match.group(1)) if match else None


def _ar_ratios(latency: dict, default: str, skip_default: bool = False) -> str:
    """AR latency over that of each timed few-step setting (and the default), in words."""
    ar, top = latency[AR_NAME]["ms_per_chunk"], _steps(default) or 0
    rows = sorted(((_steps(n), r) for n, r in latency.items() if _steps(n) is not None), key=lambda x: x[0])
    kept = [(s, row) for s, row in rows if s <= max(top, FEW_STEPS) and not (skip_default and s == top)]
    return ", ".join(f"{plural_steps(s)}: {ar / row['ms_per_chunk']:.1f}x" for s, row in kept)


def _ar_target(latency: dict, default: str, sweep: list[dict], best_few: dict | None) -> list[dict]:
    """The AR-ratio target, judged at `best_few` (the best <= 4-step sweep setting) when the sweep ran,
    else at the default setting; latencies from the latency section, else from the sweep's own."""
    ar = latency.get(AR_NAME)
    sweep_ar = next((r for r in sweep if r["autoregressive"]), None)
    timed = best_few and latency.get(best_few["name"])
    if timed and ar:
        mine, theirs, source = timed["ms_per_chunk"], ar["ms_per_chunk"], "latency section"
    elif best_few and sweep_ar:
        mine, theirs, source = best_few["ms_batch1"], sweep_ar["ms_batch1"], "decode sweep"
    elif latency.get(default) and ar:
        mine, theirs = latency[default]["ms_per_chunk"], ar["ms_per_chunk"]
        value = f"{theirs / mine:.1f}x at {plural_steps(_steps(default))} ({mine:.1f} vs {theirs:.1f} ms)"
        others = _ar_ratios(latency, default, skip_default=True)
        value += f"; {others}" if others else ""
        return [{"target": AR_TARGET, "value": value, "reached": theirs / mine >= 8}]
    else:
        return []
    setting = plural_steps(best_few["steps"])
    value = f"{theirs / mine:.1f}x at {setting}, the best <= {FEW_STEPS}-step setting "
    value += f"({mine:.1f} vs {theirs:.1f} ms, {source})"
    if best_few["success"] < max(r["success"] for r in sweep) - 0.02:
        value += f"; {setting} is not within 2 points of the best success"
    if ar and latency.get(default):
        value += f"; {_ar_ratios(latency, default)}"
    return [{"target": AR_TARGET, "value": value, "reached": theirs / mine >= 8}]


def _paired(test: dict, first: str, second: str) -> str:
    """A paired comparison in words: who alone solved how many of the shared episodes, McNemar's p."""
    return (
        f"{test['first_only']} episodes solved by {first} only, {test['second_only']} by {second} only, "
        f"of {test['episodes']} (exact McNemar p = {test['p_value']:.2g})"
    )


def _ci(row: dict) -> str:
    low, high = row["wilson95"]
    return f"{_pct(low)}-{_pct(high)}"


def targets(results: dict) -> list[dict]:
    """Each target of the benchmark: {target, value, reached (True/False/None = not measured)}."""
    out = []
    sweep = results.get("decode", {}).get("rows", [])
    latency = {row["name"]: row for row in results.get("latency", {}).get("rows", [])}
    few = [r for r in sweep if not r["autoregressive"] and r["steps"] <= FEW_STEPS]
    best_few = max(few, key=lambda r: r["success"], default=None)  # the setting both sweep targets judge
    if sweep:
        best = max(sweep, key=lambda r: r["success"])
        few_text = f"best at <= 4 steps {_pct(best_few['success'])}" if best_few else "no <= 4-step setting"
        value = f"{few_text}, best overall {_pct(best['success'])} ({_setting(best['label'])})"
        if best_few and best_few is not best and best_few["wilson95"][1] >= best["wilson95"][0]:
            value += "; the two 95% intervals overlap, so the gap is not resolved at this episode count"
        out.append(
            {
                "target": "<= 4 denoising forwards per chunk within 2 points of the best success",
                "value": value,
                "reached": None if best_few is None else best_few["success"] >= best["success"] - 0.02,
            }
        )
    # the default decode setting (--default_steps); bench.json files without the key used 4 steps
    default = results.get("latency", {}).get("default", "dvla discrete, 4 steps")
    default_row = latency.get(default)
    sequential = results.get("latency", {}).get("sequential", AR_NAME)
    if sequential != AR_NAME and sequential in latency:  # a head with no autoregressive mode
        ar_rows = _ar_target({**latency, AR_NAME: latency[sequential]}, default, sweep, best_few)
        for row in ar_rows:
            row["value"] += "; the baseline is one value per forward (this head has no autoregressive mode)"
        out += ar_rows
    else:
        out += _ar_target(latency, default, sweep, best_few)
    peers = results.get("peers", {}).get("summary", {})
    ours = results.get("peers", {}).get("dvla")
    for policy, bound in (("act", 1.5), ("diffusion", 1 / 3)):
        if policy in peers and ours:
            theirs = peers[policy]
            value = f"dvla {_pct(ours['success'])} vs {policy} {_pct(theirs['success'])}"
            reached = ours["success"] >= theirs["success"]
            paired = theirs.get("paired_vs_dvla")
            if paired:  # the like-for-like count, on the episodes both ran
                value += f" ({_paired(paired, 'dvla', policy)})"
                reached = paired["first_only"] >= paired["second_only"]
            out.append({"target": f"success >= {policy} on the same tasks and budget", "value": value,
                        "reached": reached})  # fmt: skip
        peer_latency = latency.get(policy)
        if peer_latency and default_row:
            mine, theirs_ms = default_row["ms_per_chunk"], peer_latency["ms_per_chunk"]
            ratio = mine / theirs_ms
            out.append(
                {
                    "target": f"latency per chunk <= {bound:.2g}x {policy}'s",
                    "value": f"{ratio:.2f}x ({mine:.1f} vs {theirs_ms:.1f} ms)",
                    "reached": ratio <= bound,
                }
            )
    throughput = results.get("throughput")
    if throughput:
        fraction, dtype = throughput["fraction_of_matmul"], throughput["precision"]
        out.append(
            {
                "target": f"training at >= 30% of the measured {dtype} matmul rate",
                "value": f"{_pct(fraction)} ({throughput['flops_per_s'] / 1e12:.2f} of "
                f"{throughput['matmul_flops_per_s'] / 1e12:.2f} TFLOP/s)",
                "reached": fraction >= 0.30,
            }
        )
    return out


def markdown(results: dict) -> str:
    run = results["run"]
    lines = ["# dvla benchmark", "", f"Command: `{run['command']}`  "]
    if any(section in results for section in ("decode", "heads", "peers")):  # rollouts ran
        lines += [
            f"Checkpoint: `{run['checkpoint']}`; tasks: {', '.join(run['tasks'])}; {run['episodes']} "
            f"episodes per task and setting on seeds {run['seed_start']}-"
            f"{run['seed_start'] + run['episodes'] - 1}; at most {run['max_steps']} steps.  ",
            "Success is pooled over tasks with its Wilson 95% interval.  ",
        ]
    else:
        lines.append(f"Checkpoint: `{run['checkpoint']}`.  ")
    lines.append(f"Machine: {run['machine']}, torch {run['torch']}.")
    decode = results.get("decode")
    if decode:
        lines += [
            "",
            "## Decoding sweep (same model, same seeds)",
            "",
            "| decoding | denoising forwards | + prefix pass | ms / chunk (batch 1) | success | 95% CI | "
            + " | ".join(run["tasks"])
            + " |",
            "| --- | ---: | ---: | ---: | ---: | ---: |" + " ---: |" * len(run["tasks"]),
        ]
        for r in decode["rows"]:
            ms = f"{r['ms_batch1']:.1f}" if r.get("ms_batch1") is not None else "-"
            per_task = " | ".join(_pct(r["per_task"][t]) for t in run["tasks"])
            success = f"{_pct(r['success'])} | {_ci(r)} | {per_task}"
            lines.append(f"| {r['name']} | {r['steps']} | {r['forwards']:.0f} | {ms} | {success} |")
    heads = results.get("heads")
    if heads:
        lines += ["", "## Discrete vs flow action head", "", "| head | success | 95% CI | ms / chunk |"]
        lines += ["| --- | ---: | ---: | ---: |"]
        for r in heads["rows"]:
            lines.append(f"| {r['name']} | {_pct(r['success'])} | {_ci(r)} | {r['ms_batch1']:.1f} |")
        if heads.get("paired"):
            lines += ["", f"Paired on the same seeds: {_paired(heads['paired'], 'discrete', 'flow')}."]
    peers = results.get("peers")
    if peers:
        lines += [
            "",
            "## Peers (LeRobot, trained with lerobot-train, one model per task)",
            "",
            f"Budget: {peers['budget']}",
            "",
            "| policy | task | success | 95% CI | training s |",
            "| --- | --- | ---: | ---: | ---: |",
        ]
        for r in peers["rows"]:
            seconds = f"{r['train_seconds']:.0f}" if r.get("train_seconds") else "-"
            lines.append(f"| {r['policy']} | {r['task']} | {_pct(r['success'])} | {_ci(r)} | {seconds} |")
        for policy, r in peers["summary"].items():
            lines.append(f"| **{policy}** | all | **{_pct(r['success'])}** | {_ci(r)} | |")
        if peers.get("dvla"):
            r = peers["dvla"]
            lines.append(f"| **dvla** ({r['name']}) | all | **{_pct(r['success'])}** | {_ci(r)} | |")
        paired = [(p, r["paired_vs_dvla"]) for p, r in peers["summary"].items() if r.get("paired_vs_dvla")]
        if paired:
            lines += ["", "Paired on the same seeds:"]
            lines += [f"- dvla vs {policy}: {_paired(test, 'dvla', policy)}" for policy, test in paired]
    latency = results.get("latency")
    if latency:
        lines += [
            "",
            f"## Latency at batch 1 ({_precision(results)})",
            "",
            "| policy | forwards / chunk | ms / chunk | actions / chunk | ms / control step |",
            "| --- | ---: | ---: | ---: | ---: |",
        ]
        for r in latency["rows"]:
            lines.append(
                f"| {r['name']} | {r['forwards']} | {r['ms_per_chunk']:.1f} | {r['n_action_steps']} | "
                f"{r['ms_per_control_step']:.2f} |"
            )
        if latency.get("notes"):
            lines += ["", *[f"- {note}" for note in latency["notes"]]]
    t = results.get("throughput")
    if t:
        lines += [
            "",
            f"## Training throughput (default config, {_precision(results)})",
            "",
            f"{t['samples_per_s']:.1f} samples/s at batch {t['batch_size']} "
            f"({t['parameters'] / 1e6:.1f} M parameters, {t['flops_per_step'] / 1e9:.0f} GFLOP per step): "
            f"{t['flops_per_s'] / 1e12:.3f} TFLOP/s = **{_pct(t['fraction_of_matmul'])}** of the "
            f"measured {t['precision']} matmul rate ({t['matmul_flops_per_s'] / 1e12:.2f} TFLOP/s).",
        ]
    verdicts = targets(results)
    if verdicts:
        lines += ["", "## Targets", "", "| target | measured | reached |", "| --- | --- | --- |"]
        for v in verdicts:
            reached = {True: "yes", False: "**no**", None: "not measured"}[v["reached"]]
            lines.append(f"| {v['target']} | {v['value']} | {reached} |")
    if results.get("plots"):
        lines += ["", "## Plots", ""] + [f"![{Path(p).stem}]({Path(p).name})" for p in results["plots"]]
    return "\n".join(lines) + "\n"


def plots(results: dict, out: Path) -> list[str]:
    """Success vs forwards, success vs latency and a latency bar chart; returns the PNG paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

    run = results["run"]
    footer = (
        f"{_wrap(run['command'])}\n{len(run['tasks'])} task(s), {run['episodes']} episodes each, seeds from "
        f"{run['seed_start']}; bars: Wilson 95% interval"
    )
    paths = []
    rows = results.get("decode", {}).get("rows", [])
    for x_key, x_label, name in (
        ("forwards", "backbone forwards per chunk (prefix pass included)", "success_vs_forwards.png"),
        ("ms_batch1", "ms per chunk at batch 1", "success_vs_latency.png"),
    ):
        points = [r for r in rows if r.get(x_key) is not None]
        if not points:
            continue
        fig, ax = plt.subplots(figsize=(6.4, 4.4))
        for ar in (False, True):
            group = [r for r in points if r["autoregressive"] == ar]
            if not group:
                continue
            y = [100 * r["success"] for r in group]
            err = [
                [100 * (r["success"] - r["wilson95"][0]) for r in group],
                [100 * (r["wilson95"][1] - r["success"]) for r in group],
            ]
            ax.errorbar(
                [r[x_key] for r in group],
                y,
                yerr=err,
                fmt="s" if ar else "o-",
                capsize=3,
                label="autoregressive (KV cache)" if ar else "parallel diffusion decoding",
            )
            for r in group:
                xy = (r[x_key], 100 * r["success"])
                ax.annotate(r["label"], xy, textcoords="offset points", xytext=(4, 4))
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(FixedLocator(sorted({r[x_key] for r in points})))  # a tick per setting
        ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:.3g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel(x_label)
        ax.set_ylabel("success rate (%)")
        ax.set_ylim(-5, 105)
        ax.grid(alpha=0.3)
        ax.legend(loc="best")
        fig.text(0.01, 0.01, footer, fontsize=6, va="bottom")
        fig.tight_layout(rect=(0, 0.08, 1, 1))
        path = out / name
        fig.savefig(path, dpi=120)
        plt.close(fig)
        paths.append(str(path))
    latency = results.get("latency", {}).get("rows", [])
    if latency:
        fig, ax = plt.subplots(figsize=(6.4, 0.5 * len(latency) + 1.6))
        ax.barh([r["name"] for r in latency], [r["ms_per_chunk"] for r in latency])
        ax.set_xscale("log")
        ax.set_xlabel(f"ms per chunk at batch 1 ({_precision(results)})")
        ax.invert_yaxis()
        ax.grid(axis="x", alpha=0.3)
        fig.text(0.01, 0.01, _wrap(run["command"]), fontsize=6, va="bottom")
        fig.tight_layout(rect=(0, 0.05, 1, 1))
        path = out / "latency.png"
        fig.savefig(path, dpi=120)
        plt.close(fig)
        paths.append(str(path))
    return paths


def _precision(results: dict) -> str:
    """How the run computed: "bf16 autocast" or "fp32" (runs saved before the setting: bf16)."""
    return "fp32" if results.get("run", {}).get("precision") == "no" else "bf16 autocast"
