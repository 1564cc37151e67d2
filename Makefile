# dvla: two commands for a newcomer, `make demo` and `make test`.
# The first call bootstraps .venv from a Python >= 3.12 found on this machine.

SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export MUJOCO_GL ?= egl

.PHONY: venv test lint format demo bench-sim clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	@set -e; \
	if [ ! -x "$(PY)" ]; then \
		interp=$$(scripts/find_python.sh); \
		echo "creating $(VENV) with $$interp"; \
		"$$interp" -m venv $(VENV); \
	fi; \
	$(PY) -m pip install --quiet --upgrade pip; \
	$(PY) -m pip install --quiet -e ".[test]"; \
	touch $(STAMP)

test: $(STAMP)
	HF_HUB_OFFLINE=1 $(PY) -m ruff check .
	HF_HUB_OFFLINE=1 $(PY) -m ruff format --check .
	HF_HUB_OFFLINE=1 $(PY) -m pytest tests

lint: $(STAMP)
	$(PY) -m ruff check . && $(PY) -m ruff format --check .

format: $(STAMP)
	$(PY) -m ruff format . && $(PY) -m ruff check --fix .

# Collect -> train -> roll out with videos -> answer VQA questions -> report.
# Every stage resumes or skips finished work, so rerunning is cheap.
demo: $(STAMP)
	@$(PY) -m dvla.eval.demo_report --plan
	HF_HUB_OFFLINE=1 $(VENV)/bin/dvla collect --config_path configs/collect/demo.yaml
	HF_HUB_OFFLINE=1 $(VENV)/bin/dvla show --root outputs/demo/metaworld
	HF_HUB_OFFLINE=1 $(VENV)/bin/dvla collect --config_path configs/collect/vqa_demo.yaml
	HF_HUB_OFFLINE=1 $(VENV)/bin/dvla show --root outputs/demo/vqa_scenes
	HF_HUB_OFFLINE=1 $(VENV)/bin/dvla train --config_path configs/train/demo.yaml
	HF_HUB_OFFLINE=1 $(VENV)/bin/dvla rollout --checkpoint outputs/demo/train \
		--tasks drawer-close-v3,button-press-topdown-v3,window-close-v3 --episodes 10 --output_dir outputs/demo/rollout
	HF_HUB_OFFLINE=1 $(VENV)/bin/dvla vqa --checkpoint outputs/demo/train \
		--dataset outputs/demo/vqa_scenes --split test --output_dir outputs/demo/vqa
	HF_HUB_OFFLINE=1 $(VENV)/bin/dvla vqa --checkpoint outputs/demo/train \
		--image outputs/demo/vqa/examples/0.png --question "How many objects are there?" --show_steps
	HF_HUB_OFFLINE=1 $(PY) -m dvla.eval.demo_report --root outputs/demo

bench-sim: $(STAMP)
	HF_HUB_OFFLINE=1 $(PY) benchmarks/bench_sim.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
