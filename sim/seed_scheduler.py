"""Which (task, seed) episode a collection runs next."""

from __future__ import annotations

from collections import Counter

from dvla.sim.recording import EpisodeRecord
from dvla.sim.tasks import TRAIN_SEED_LIMIT


class SeedScheduler:
    """Hands out (task, seed) jobs so that each task ends with exactly `episodes` successes.

    Seeds are tried in increasing order from `seed_start` (default 0; evaluation seeds start at 1000
    and are never used);
    a task never has more jobs in flight than successes it still needs, so the recorded seeds are the
    first successful ones whatever the number of workers. A task gives up after `max_attempts`.
    """

    def __init__(
        self,
        tasks: list[str],
        episodes: int,
        recorded: list[EpisodeRecord] = (),
        failures: set[tuple[str, int]] = frozenset(),
        max_attempts: int | None = None,
        seed_start: int = 0,
    ):
        self.tasks, self.episodes = list(tasks), episodes
        # generous: an expert that succeeds half the time (ALOHA's) still fills its quota
        self.max_attempts = max_attempts or max(3 * episodes, episodes + 10)
        self.successes, self.failures, self.in_flight = Counter(), Counter(), Counter()
        self.lengths: dict[str, list[int]] = {t: [] for t in tasks}
        self.seeds: dict[str, list[int]] = {t: [] for t in tasks}
        self.tried: dict[str, set[int]] = {t: set() for t in tasks}
        self._next = dict.fromkeys(tasks, seed_start)
        for e in recorded:
            self.successes[e.task] += 1
            self.lengths[e.task].append(e.length)
            self.seeds[e.task].append(e.seed)
            self.tried[e.task].add(e.seed)
        for task, seed in failures:
            if task in self.tried and seed not in self.tried[task]:
                self.failures[task] += 1
                self.tried[task].add(seed)

    def next_job(self) -> tuple[str, int] | None:
        """The next (task, seed) to run, or None when nothing more may be started now."""
        for task in self.tasks:
            if self.successes[task] + self.in_flight[task] >= self.episodes:
                continue
            if self.successes[task] + self.failures[task] + self.in_flight[task] >= self.max_attempts:
                continue
            seed = self._next[task]
            while seed in self.tried[task]:
                seed += 1
            if seed >= TRAIN_SEED_LIMIT:
                continue
            self._next[task] = seed + 1
            self.tried[task].add(seed)
            self.in_flight[task] += 1
            return task, seed
        return None

    def done(self, task: str, seed: int, success: bool, length: int) -> None:
        self.in_flight[task] -= 1
        if success:
            self.successes[task] += 1
            self.lengths[task].append(length)
            self.seeds[task].append(seed)
        else:
            self.failures[task] += 1

    @property
    def total_in_flight(self) -> int:
        return sum(self.in_flight.values())

    def short_tasks(self) -> list[str]:
        """Tasks that ended with fewer successful episodes than asked for."""
        return [t for t in self.tasks if self.successes[t] < self.episodes]
