"""Interleaved rounds for benchmarks that compare runs on a shared machine: the order each round runs them in, and
ratios paired within a round (load that moves during a run hits both sides of each ratio alike)."""

from __future__ import annotations

import contextlib
import multiprocessing
import statistics
from collections.abc import Callable, Sequence
from typing import Any


def round_order(count: int, round_: int) -> list[int]:
    """The indices ``0..count-1`` in the order round ``round_`` runs them: rotated by one every two rounds and
    reversed every other round, so that over the rounds each takes every place in a round (first, middle, last)
    alike; with two it alternates, with three six rounds run all six orders."""
    shift = (round_ // 2) % count if count else 0
    order = list(range(shift, count)) + list(range(shift))
    return order[::-1] if round_ % 2 else order


def paired_ratios(runs: Sequence[float], bases: Sequence[float]) -> list[float]:
    """Each round's figure over the base's figure in that same round."""
    return [run / base for run, base in zip(runs, bases, strict=True)]


def paired_median(runs: Sequence[float], bases: Sequence[float]) -> float:
    """The median over the rounds of the paired ratios."""
    return statistics.median(paired_ratios(runs, bases))


class Workers:
    """One child process per runner, each holding only its own model, driven in rounds from here. In one process the
    order models are loaded in moves their speed: of three sessions of the same with-past ONNX the last loaded
    decoded 1.10-1.20x the first, and the first model onnxruntime-genai loads decoded 8-14% slower than any after it
    (docs/benchmarks.md#seventh-run-one-process-per-folder-2026-12-04); a user's process holds one model, and so
    does each worker. ``make(*spec)`` (a module-level function, as a spawned child imports it) builds a runner in
    the child; calling ``workers(i, *args)`` runs runner ``i`` there and returns what it returned."""

    def __init__(self, make: Callable[..., Callable], specs: Sequence[tuple]) -> None:
        context = multiprocessing.get_context("spawn")
        self._pipes: list = []
        self._processes: list = []
        for spec in specs:
            here, there = context.Pipe()
            process = context.Process(target=_serve, args=(make, spec, there), daemon=True)
            process.start()
            self._pipes.append(here)
            self._processes.append(process)
        try:
            for index in range(len(specs)):
                self._answer(index)
        except RuntimeError:
            self.close()
            raise

    def __len__(self) -> int:
        return len(self._pipes)

    def __call__(self, index: int, *args: Any) -> Any:
        self._pipes[index].send(args)
        return self._answer(index)

    def _answer(self, index: int) -> Any:
        ok, value = self._pipes[index].recv()
        if not ok:
            raise RuntimeError(value)
        return value

    def close(self) -> None:
        for pipe, process in zip(self._pipes, self._processes, strict=True):
            with contextlib.suppress(OSError):  # a worker that could not build its runner has already gone
                pipe.send(None)
            process.join(timeout=60)

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def _serve(make: Callable[..., Callable], spec: tuple, pipe) -> None:
    """The child: build the runner, say it is ready, then run it for each request until told to stop."""
    try:
        run = make(*spec)
    except Exception as exc:  # sent to the parent, which raises it there
        pipe.send((False, f"{type(exc).__name__}: {exc}"))
        return
    pipe.send((True, None))
    while (args := pipe.recv()) is not None:
        try:
            pipe.send((True, run(*args)))
        except Exception as exc:  # one failed run is the parent's to report; the child keeps serving
            pipe.send((False, f"{type(exc).__name__}: {exc}"))


class InProcess:
    """``Workers``' interface with every runner built here, in ``specs``' order: what loading models together does
    to their speed (``benchmarks/load_order.py``, ``genai_folders_ab.py --same-process``)."""

    def __init__(self, make: Callable[..., Callable], specs: Sequence[tuple]) -> None:
        self._runners = [make(*spec) for spec in specs]

    def __len__(self) -> int:
        return len(self._runners)

    def __call__(self, index: int, *args: Any) -> Any:
        return self._runners[index](*args)

    def __enter__(self) -> InProcess:
        return self

    def __exit__(self, *_exc: object) -> None:
        self._runners.clear()


def in_rounds(runners: Workers | InProcess, rounds: int, prompt: Any, new: int,
              failed: Callable[[int, RuntimeError], None] | None = None) -> list[list[Any]]:
    """One warm-up run of each runner with 4 new tokens (the first run of a model allocates), then ``rounds`` rounds
    of every runner in turn in ``round_order``, ``new`` tokens after ``prompt``; each runner's results, round by
    round. A runner whose warm-up fails (a worker's ``RuntimeError``) is left out of the rounds, with no results, and
    its error passed to ``failed``; without ``failed`` the error is raised."""
    running = []
    for index in range(len(runners)):
        try:
            runners(index, prompt, 4)
        except RuntimeError as exc:
            if failed is None:
                raise
            failed(index, exc)
            continue
        running.append(index)
    results: list[list[Any]] = [[] for _ in range(len(runners))]
    for round_ in range(rounds):
        for place in round_order(len(running), round_):
            results[running[place]].append(runners(running[place], prompt, new))
    return results


def against_first(rates: list[list[float]]) -> list[tuple[float, float, float, float]]:
    """Per runner: its median, and the median and quartiles of its paired ratios to the first runner's."""
    rows = []
    for rate in rates:
        paired = paired_ratios(rate, rates[0])
        low, _, high = statistics.quantiles(paired, n=4) if len(paired) > 1 else paired * 3
        rows.append((statistics.median(rate), statistics.median(paired), low, high))
    return rows
