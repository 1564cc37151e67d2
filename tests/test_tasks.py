import pytest

from dvla.sim.tasks import EVAL_SEED_START, TRAIN_SEED_LIMIT, resolve_tasks, suites, task_description


def test_suites_have_the_expected_sizes():
    assert len(suites()["mt10"]) == 10
    assert len(suites()["mt50"]) == 50
    groups = [suites()[g] for g in ("easy", "medium", "hard", "very_hard")]
    assert sorted(t for g in groups for t in g) == sorted(suites()["mt50"])
    assert "pick-place-v3" in suites()["mt10"]


def test_resolve_tasks_by_name_and_suite():
    assert resolve_tasks("pick-place-v3, door-open-v3") == ["pick-place-v3", "door-open-v3"]
    assert resolve_tasks(suite="mt10") == list(suites()["mt10"])


@pytest.mark.parametrize(
    ("tasks", "suite", "message"),
    [
        ("pick-place-v9", None, "unknown MetaWorld task"),
        (None, "mt11", "unknown suite 'mt11'. Valid suites: mt10, mt50"),
        ("reach-v3", "mt10", "exactly one of"),
        (None, None, "exactly one of"),
        ("reach-v3,reach-v3", None, "duplicate"),
    ],
)
def test_bad_task_selection_is_an_error_that_lists_valid_names(tasks, suite, message):
    with pytest.raises(ValueError, match=message) as err:
        resolve_tasks(tasks, suite)
    if "unknown MetaWorld task" in message:
        assert "pick-place-v3" in str(err.value)


def test_instructions_come_from_lerobot():
    assert task_description("pick-place-v3") == "Pick and place a puck to a goal"


def test_training_seeds_never_reach_evaluation_seeds():
    assert TRAIN_SEED_LIMIT <= EVAL_SEED_START == 1000
