"""Hunting many mutants on a few processes with no worker idle (``mutants.hunt_all``).

Theory of operation. A hunt runs the CI schedule against one mutant until its first violation; most
are caught in a few runs, a few need dozens (``docs/simulation.md``), and one process per mutant
leaves a worker idle while the longest hunt ends alone. So the schedule of each mutant is cut into
blocks (runs 1, 2-3, 4-7, 8-15, then ``BLOCK`` runs at a time), each run in a fresh forked process
(the mutant's patches applied there, ``mutants.hunt`` from the block's first run). A mutant's next
block is queued when its previous one passed; a worker with nothing queued takes, ahead of time,
the next block of a mutant still being hunted. A mutant is decided by its blocks in order: caught at
the first violation of the first block that found one, once every block before it passed; survived
when every block passed. Blocks launched past that are ignored. Every run is the same run as in one
sequential hunt (a run depends on its seed and profile only), so the seeds-to-catch are too.
"""

from __future__ import annotations

import multiprocessing
import queue
import time
from dataclasses import dataclass, field
from typing import Callable

__all__ = ["Hunt", "hunt_blocks", "BLOCK"]

BLOCK = 8       # runs per block past the first 15: at most this much is run past a catch, per worker


@dataclass(frozen=True, slots=True)
class Hunt:
    mutant: str
    caught_at: int | None           # seeds-to-catch: 1-based index in the schedule; None: survived
    profile: str | None
    seed: int | None
    violation: str | None
    runs: int
    wall_s: float


def blocks(total: int) -> list[tuple[int, int]]:
    """[start, stop) of each block of a schedule of ``total`` runs."""
    out, start, size = [], 0, 1
    while start < total:
        stop = min(total, start + size)
        out.append((start, stop))
        start, size = stop, min(size * 2, BLOCK)
    return out


@dataclass
class _Hunting:
    name: str
    done: dict[int, Hunt] = field(default_factory=dict)      # block index -> its Hunt
    launched: int = 0
    started: float = 0.0


def _run_block(args: tuple[Callable[..., Hunt], str, dict | None, int, int]) -> Hunt:
    run, name, budget, start, stop = args
    return run(name, budget, limit=stop, start=start)


def hunt_blocks(names: list[str], budget: dict[str, int] | None, total: int, workers: int,
                run: Callable[..., Hunt], progress: Callable | None = None) -> dict:
    """Hunt ``names`` (resolved mutants) over the first ``total`` runs of ``budget``'s schedule on
    ``workers`` processes, each block by ``run(name, budget, limit=stop, start=start)`` in a forked
    worker (``mutants.hunt``, a module-level function: it travels to the worker by name); returns
    name -> ``Hunt`` (see the module docstring)."""
    spans = blocks(total)
    state = {n: _Hunting(n) for n in names}
    ready = list(names)                 # mutants whose next block may start now, in registry order
    decided: dict[str, Hunt] = {}
    results: queue.SimpleQueue = queue.SimpleQueue()
    pool = multiprocessing.get_context("fork").Pool(workers, maxtasksperchild=1)
    running = 0

    def launch(h: _Hunting) -> None:
        nonlocal running
        index = h.launched
        h.launched += 1
        h.started = h.started or time.perf_counter()
        start, stop = spans[index]
        pool.apply_async(_run_block, ((run, h.name, budget, start, stop),),
                         callback=lambda r, i=index: results.put((h.name, i, r, None)),
                         error_callback=lambda e, i=index: results.put((h.name, i, None, e)))
        running += 1

    try:
        while len(decided) < len(names):
            while running < workers:
                if ready:
                    launch(state[ready.pop(0)])
                    continue
                ahead = [h for h in state.values() if h.name not in decided and h.launched < len(spans)]
                if not ahead:
                    break
                launch(min(ahead, key=lambda h: h.launched))
            name, index, hunt, error = results.get()
            running -= 1
            if error is not None:
                raise error
            h = state[name]
            if name in decided:
                continue
            h.done[index] = hunt
            verdict = _verdict(h, len(spans))
            if verdict is None:
                if hunt.caught_at is None and h.launched == index + 1 and h.launched < len(spans):
                    ready.append(name)
                continue
            caught = verdict.caught_at
            decided[name] = Hunt(name, caught, verdict.profile, verdict.seed, verdict.violation,
                                 caught if caught is not None else total,
                                 round(time.perf_counter() - h.started, 2))
            if name in ready:
                ready.remove(name)
            if progress is not None:
                progress(decided[name])
    finally:
        pool.terminate()
        pool.join()
    return decided


def _verdict(h: _Hunting, count: int):
    """The block that decides ``h`` (its first catch after passing blocks, or the last block when all
    passed), or None while undecided."""
    for index in range(count):
        hunt = h.done.get(index)
        if hunt is None:
            return None
        if hunt.caught_at is not None or index == count - 1:
            return hunt
    return None
