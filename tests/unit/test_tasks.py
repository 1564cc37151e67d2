import pytest

from dvla.sim.recording import EpisodeRecord
from dvla.sim.seed_scheduler import SeedScheduler
from dvla.sim.tasks import EVAL_SEED_START, resolve_tasks, suites, task_description


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


def _drain(scheduler, outcome):
    """Run the scheduler to the end; outcome(task, seed) -> success."""
    order = []
    while job := scheduler.next_job():
        order.append(job)
        scheduler.done(*job, outcome(*job), 10)
    return order


def test_scheduler_records_the_first_successful_seeds():
    scheduler = SeedScheduler(["a", "b"], episodes=3)
    order = _drain(scheduler, lambda task, seed: not (task == "a" and seed in (1, 2)))
    assert scheduler.seeds == {"a": [0, 3, 4], "b": [0, 1, 2]}
    assert scheduler.failures["a"] == 2 and scheduler.short_tasks() == []
    assert len(order) == 8 and len(set(order)) == 8


def test_scheduler_never_has_more_in_flight_than_needed():
    scheduler = SeedScheduler(["a"], episodes=2)
    assert scheduler.next_job() == ("a", 0) and scheduler.next_job() == ("a", 1)
    assert scheduler.next_job() is None  # two in flight, two needed
    scheduler.done("a", 0, False, 5)
    assert scheduler.next_job() == ("a", 2)


def test_scheduler_resumes_without_repeating_seeds():
    recorded = [EpisodeRecord("a", 0, 12), EpisodeRecord("a", 2, 9)]
    scheduler = SeedScheduler(["a"], episodes=4, recorded=recorded, failures={("a", 1)})
    _drain(scheduler, lambda task, seed: True)
    assert scheduler.seeds["a"] == [0, 2, 3, 4]
    assert scheduler.failures["a"] == 1


def test_scheduler_gives_up_and_never_uses_evaluation_seeds():
    scheduler = SeedScheduler(["a"], episodes=5)
    order = _drain(scheduler, lambda task, seed: False)
    assert len(order) == scheduler.max_attempts == 15 and scheduler.short_tasks() == ["a"]
    near_limit = SeedScheduler(["a"], episodes=5, failures={("a", s) for s in range(EVAL_SEED_START - 2)})
    near_limit.max_attempts = 10_000
    order = _drain(near_limit, lambda task, seed: True)
    assert [seed for _, seed in order] == [EVAL_SEED_START - 2, EVAL_SEED_START - 1]
