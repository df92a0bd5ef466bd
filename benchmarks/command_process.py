"""A benchmark's helper process driven by JSON commands: one command per line on its stdin, answers
on its stdout as lines marked with ``marker`` (Ray may write to stdout too), read by a thread so
that every wait has a timeout. Used by ``client-e2e`` (its producer and consumer workers) and
``controller-scale`` (its fleet of heartbeaters)."""

from __future__ import annotations

import json
import queue
import subprocess
import threading
from pathlib import Path
from typing import Any

__all__ = ["CommandProcess"]


class CommandProcess:
    """``argv`` run with ``env`` in ``cwd``, its stderr in ``log_path``; answers are the JSON after
    ``marker``. An answer with ``error`` raises; so does the process exiting."""

    def __init__(self, argv: list[str], env: dict, log_path: Path, marker: str, cwd: Path,
                 wait_s: float = 600.0) -> None:
        self.log_path = log_path
        self.marker = marker
        self.wait_s = wait_s
        self._log = open(log_path, "w")
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log,
                                     text=True, env=env, cwd=cwd)
        self._answers: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(self.marker):
                self._answers.put(json.loads(line[len(self.marker):]))
        self._answers.put(None)                      # EOF: the process exited

    def send(self, cmd: str, **args: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"cmd": cmd, "args": args}) + "\n")
        self.proc.stdin.flush()

    def receive(self, wait_s: float | None = None) -> dict:
        wait_s = self.wait_s if wait_s is None else wait_s
        try:
            answer = self._answers.get(timeout=wait_s)
        except queue.Empty:
            raise TimeoutError(f"process {self.proc.pid}: no answer in {wait_s} s\n{self._tail()}") from None
        if answer is None:
            raise RuntimeError(f"process {self.proc.pid} exited ({self.proc.wait()})\n{self._tail()}")
        if "error" in answer:
            raise RuntimeError(f"process {self.proc.pid} failed:\n{answer['error']}\n{self._tail()}")
        return answer

    def call(self, cmd: str, wait_s: float | None = None, **args: Any) -> dict:
        self.send(cmd, **args)
        return self.receive(wait_s)

    def _tail(self) -> str:
        self._log.flush()
        return self.log_path.read_text()[-3000:]

    def close(self) -> None:
        try:
            if self.proc.poll() is None:
                self.send("exit")
                self.proc.wait(60)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()
        self._log.close()
