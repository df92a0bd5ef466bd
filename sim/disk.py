"""A deterministic simulated disk implementing the store's disk port (``rocketray.fs.Disk``).

Theory of operation
-------------------
Every file and directory has two layers: what the process sees (the page cache) and what is
durable.  ``pwrite`` and ``truncate`` change the cache and are remembered, in order, as the file's
*pending* operations; ``fsync`` of the file makes its current content durable (pending cleared).
``open(create=True)``, ``mkdir``, ``rename``, ``unlink`` and ``rmdir`` change the directory's cache
and are remembered as the directory's pending name operations; ``fsync_dir`` makes them durable.
A file's content and its name are independent: an fsynced file whose creation was never made
durable by a directory fsync can vanish, and an unlinked name can come back.

Crashes (``crash(mode)``):

* ``KILL`` (kill -9): the process dies, the kernel keeps the page cache, so nothing is lost; open
  handles die (using one raises :class:`SimCrash`).
* ``POWER_LOSS``: the page cache is thrown away.  For each file the seed picks what survives of
  its pending operations: none, all, or a prefix of them whose last one is torn (a write cut at a
  random byte; a truncate applied or not).  Each pending directory operation survives or not,
  independently, chosen by the seed; a rename is one operation, so the target names the old or
  the new file, never neither, and the source name goes only with it.

A crash can come between any two IO calls: every mutating call (open with create/truncate,
pwrite, truncate, fsync, fsync_dir, mkdir, rmdir, unlink, rename) is one *IO step*, numbered from
1 in ``steps``.  Before performing step ``n`` the disk asks its hook (``crash_at(n, mode)`` for a
fixed step or ``set_hook(fn)`` for any rule); if it says crash, the crash is applied and
:class:`SimCrash` is raised, so the step itself never happens.  Reads are not steps: a crash
before a read equals a crash before the next mutating call.

All randomness comes from the ``random.Random`` passed in; iteration orders are insertion
orders, so a seed replays the same crash outcome.
"""

from __future__ import annotations

import enum
import os
import posixpath
import random
from dataclasses import dataclass, field
from typing import Callable

__all__ = ["CrashMode", "SimCrash", "SimDisk", "SimFile"]


class CrashMode(enum.Enum):
    KILL = "kill"
    POWER_LOSS = "power_loss"


class SimCrash(BaseException):
    """The simulated process died (raised by the IO step the crash preempted, and by any use of a
    handle opened before the crash).  A BaseException, so ``except Exception`` does not swallow it."""

    def __init__(self, mode: CrashMode | None, step: int) -> None:
        super().__init__(f"simulated crash ({mode.value if mode else 'stale handle'}) at IO step {step}")
        self.mode = mode
        self.step = step


@dataclass(eq=False)
class _File:
    data: bytearray = field(default_factory=bytearray)
    durable: bytes = b""
    pending: list[tuple] = field(default_factory=list)  # ("w", offset, bytes) | ("t", size)
    mtime_ns: int = 0


@dataclass(eq=False)
class _Dir:
    entries: dict[str, "_File | _Dir"] = field(default_factory=dict)
    durable: dict[str, "_File | _Dir"] = field(default_factory=dict)
    pending: list[tuple] = field(default_factory=list)  # ("add", name, node) | ("del", name) | ("mv", src, dst, node)


def _apply(data: bytearray, op: tuple) -> None:
    if op[0] == "w":
        _, offset, chunk = op
        if offset > len(data):
            data.extend(bytes(offset - len(data)))
        data[offset:offset + len(chunk)] = chunk
    else:
        size = op[1]
        if size < len(data):
            del data[size:]
        else:
            data.extend(bytes(size - len(data)))


class SimFile:
    """A handle on a simulated file (implements ``rocketray.fs.DiskFile``)."""

    __slots__ = ("_disk", "_node", "_gen", "_closed")

    def __init__(self, disk: "SimDisk", node: _File) -> None:
        self._disk = disk
        self._node = node
        self._gen = disk.generation
        self._closed = False

    def _live(self) -> _File:
        if self._gen != self._disk.generation:
            raise SimCrash(None, self._disk.steps)
        if self._closed:
            raise ValueError("I/O on a closed simulated file")
        return self._node

    def pread(self, offset: int, length: int) -> bytes:
        node = self._live()
        if length <= 0:
            return b""
        return bytes(memoryview(node.data)[offset:offset + length])    # one copy, not two

    def pwrite(self, data: bytes | memoryview, offset: int) -> None:
        node = self._live()
        self._disk._step("pwrite", self)
        op = ("w", offset, bytes(data))
        _apply(node.data, op)
        node.pending.append(op)
        node.mtime_ns = self._disk.now_ns()

    def truncate(self, size: int) -> None:
        node = self._live()
        self._disk._step("truncate", self)
        op = ("t", size)
        _apply(node.data, op)
        node.pending.append(op)
        node.mtime_ns = self._disk.now_ns()

    def size(self) -> int:
        return len(self._live().data)

    def fsync(self) -> None:
        node = self._live()
        self._disk._step("fsync", self)
        node.durable = bytes(node.data)
        node.pending.clear()

    def prefetch(self, offset: int, length: int) -> None:
        """No page cache to fill."""

    def dup(self) -> "SimFile":
        self._live()
        return SimFile(self._disk, self._node)

    def mtime_ns(self) -> int:
        return self._live().mtime_ns

    def data_end(self, start: int, end: int) -> int:
        return max(start, min(end, len(self._live().data)))

    def close(self) -> None:
        self._closed = True


class SimDisk:
    """A simulated file system (implements ``rocketray.fs.Disk``); see the module docstring.

    ``rng`` decides what a power loss keeps; ``clock_ms`` (optional) gives file modification times
    (retention by age); ``cwd`` resolves relative paths.
    """

    def __init__(self, rng: random.Random, clock_ms: Callable[[], int] | None = None, cwd: str = "/") -> None:
        self.rng = rng
        self.clock_ms = clock_ms
        self.cwd = cwd
        self.root = _Dir()
        self.steps = 0          # IO steps performed (or preempted by a crash)
        self.generation = 0     # bumped by every crash: older handles are dead
        self.crashes: list[tuple[int, CrashMode]] = []
        self._hook: Callable[[int, str, str], CrashMode | None] | None = None
        self._parts: dict[str, tuple[str, ...]] = {}     # path -> its components (``_split``)

    # ------------------------------------------------------------------ crash control
    def set_hook(self, hook: Callable[[int, str, str], CrashMode | None] | None) -> None:
        """``hook(step, op, path)`` runs before every IO step; returning a mode crashes there."""
        self._hook = hook

    @property
    def armed(self) -> bool:
        """A crash is set to happen at some later IO step (``crash_at`` / a hook)."""
        return self._hook is not None

    def crash_at(self, step: int, mode: CrashMode) -> None:
        """Crash just before IO step number ``step`` (absolute, compare ``steps``); one shot."""
        def hook(n: int, _op: str, _path: str) -> CrashMode | None:
            if n == step:
                self._hook = None
                return mode
            return None
        self._hook = hook

    def crash_after(self, count: int, mode: CrashMode) -> None:
        """Crash before the ``count``-th IO step from now (1 = the very next one)."""
        self.crash_at(self.steps + count, mode)

    def _step(self, op: str, target: "SimFile | str") -> None:
        self.steps += 1
        if self._hook is not None:
            mode = self._hook(self.steps, op, target if isinstance(target, str) else "<fd>")
            if mode is not None:
                self.crash(mode)
                raise SimCrash(mode, self.steps)

    def crash(self, mode: CrashMode) -> None:
        """Apply a crash now (the caller discards every object of the dead process)."""
        self.generation += 1
        self.crashes.append((self.steps, mode))
        if mode is CrashMode.POWER_LOSS:
            self._lose_power()

    def _lose_power(self) -> None:
        rng = self.rng
        dirs: list[_Dir] = []
        files: list[_File] = []
        seen: set[int] = set()

        def collect(d: _Dir) -> None:
            if id(d) in seen:
                return
            seen.add(id(d))
            dirs.append(d)
            for node in list(d.entries.values()) + list(d.durable.values()) + [op[-1] for op in d.pending
                                                                                if op[0] != "del"]:
                if isinstance(node, _Dir):
                    collect(node)
                elif id(node) not in seen:
                    seen.add(id(node))
                    files.append(node)

        collect(self.root)
        for f in files:
            if f.pending:
                kept = bytearray(f.durable)
                choice = rng.randrange(3)  # 0 none, 1 all, 2 a prefix with the last op torn
                if choice == 1:
                    for op in f.pending:
                        _apply(kept, op)
                elif choice == 2:
                    k = rng.randrange(len(f.pending))
                    for op in f.pending[:k]:
                        _apply(kept, op)
                    last = f.pending[k]
                    if last[0] == "w":
                        _apply(kept, ("w", last[1], last[2][:rng.randrange(len(last[2]) + 1)]))
                    elif rng.randrange(2):
                        _apply(kept, last)
                f.durable = bytes(kept)
                f.pending = []
            f.data = bytearray(f.durable)
        for d in dirs:
            for op in d.pending:
                if rng.randrange(2):
                    if op[0] == "add":
                        d.durable[op[1]] = op[2]
                    elif op[0] == "del":
                        d.durable.pop(op[1], None)
                    else:
                        d.durable.pop(op[1], None)
                        d.durable[op[2]] = op[3]
            d.pending = []
            d.entries = dict(d.durable)

    # ------------------------------------------------------------------ paths
    def now_ns(self) -> int:
        return self.clock_ms() * 1_000_000 if self.clock_ms is not None else 0

    def _split(self, path: "str | os.PathLike[str]") -> tuple[str, ...]:
        key = os.fspath(path)
        parts = self._parts.get(key)
        if parts is None:       # a pure function of the path and the fixed ``cwd``: kept per path
            p = posixpath.normpath(posixpath.join(self.cwd, key))
            parts = self._parts[key] = tuple(part for part in p.split("/") if part)
        return parts

    def _lookup(self, parts: "tuple[str, ...]") -> "_File | _Dir | None":
        node: _File | _Dir = self.root
        for part in parts:
            if not isinstance(node, _Dir):
                return None
            nxt = node.entries.get(part)
            if nxt is None:
                return None
            node = nxt
        return node

    def _parent(self, path: "str | os.PathLike[str]") -> tuple[_Dir, str]:
        parts = self._split(path)
        if not parts:
            raise IsADirectoryError(os.fspath(path))
        parent = self._lookup(parts[:-1])
        if not isinstance(parent, _Dir):
            raise FileNotFoundError(os.fspath(path))
        return parent, parts[-1]

    # ------------------------------------------------------------------ the Disk port
    def open(self, path: "str | os.PathLike[str]", create: bool = False, truncate: bool = False,
             map_reads: bool = False) -> SimFile:
        parent, name = self._parent(path)
        node = parent.entries.get(name)
        if isinstance(node, _Dir):
            raise IsADirectoryError(os.fspath(path))
        if node is None:
            if not create:
                raise FileNotFoundError(os.fspath(path))
            self._step("create", os.fspath(path))
            node = _File(mtime_ns=self.now_ns())
            parent.entries[name] = node
            parent.pending.append(("add", name, node))
        elif truncate and node.data:
            self._step("truncate", os.fspath(path))
            op = ("t", 0)
            _apply(node.data, op)
            node.pending.append(op)
            node.mtime_ns = self.now_ns()
        return SimFile(self, node)

    def mkdir(self, path: "str | os.PathLike[str]") -> None:
        parent, name = self._parent(path)
        if name in parent.entries:
            raise FileExistsError(os.fspath(path))
        self._step("mkdir", os.fspath(path))
        node = _Dir()
        parent.entries[name] = node
        parent.pending.append(("add", name, node))

    def rmdir(self, path: "str | os.PathLike[str]") -> None:
        parent, name = self._parent(path)
        node = parent.entries.get(name)
        if not isinstance(node, _Dir):
            raise NotADirectoryError(os.fspath(path)) if node is not None else FileNotFoundError(os.fspath(path))
        if node.entries:
            raise OSError(f"directory not empty: {os.fspath(path)}")
        self._step("rmdir", os.fspath(path))
        del parent.entries[name]
        parent.pending.append(("del", name))

    def listdir(self, path: "str | os.PathLike[str]") -> list[str]:
        node = self._lookup(self._split(path))
        if not isinstance(node, _Dir):
            raise NotADirectoryError(os.fspath(path)) if node is not None else FileNotFoundError(os.fspath(path))
        return sorted(node.entries)

    def exists(self, path: "str | os.PathLike[str]") -> bool:
        return self._lookup(self._split(path)) is not None

    def is_dir(self, path: "str | os.PathLike[str]") -> bool:
        return isinstance(self._lookup(self._split(path)), _Dir)

    def unlink(self, path: "str | os.PathLike[str]") -> None:
        parent, name = self._parent(path)
        node = parent.entries.get(name)
        if node is None:
            raise FileNotFoundError(os.fspath(path))
        if isinstance(node, _Dir):
            raise IsADirectoryError(os.fspath(path))
        self._step("unlink", os.fspath(path))
        del parent.entries[name]
        parent.pending.append(("del", name))

    def rename(self, src: "str | os.PathLike[str]", dst: "str | os.PathLike[str]") -> None:
        sparent, sname = self._parent(src)
        dparent, dname = self._parent(dst)
        if sparent is not dparent:
            raise OSError("the simulated disk renames only within one directory")
        node = sparent.entries.get(sname)
        if node is None:
            raise FileNotFoundError(os.fspath(src))
        if sname == dname:
            return
        self._step("rename", os.fspath(src))
        del sparent.entries[sname]
        sparent.entries[dname] = node
        sparent.pending.append(("mv", sname, dname, node))

    def fsync_dir(self, path: "str | os.PathLike[str]") -> None:
        node = self._lookup(self._split(path))
        if not isinstance(node, _Dir):
            raise NotADirectoryError(os.fspath(path)) if node is not None else FileNotFoundError(os.fspath(path))
        self._step("fsync_dir", os.fspath(path))
        node.durable = dict(node.entries)
        node.pending.clear()

    # ------------------------------------------------------------------ inspection (tests, world)
    def read_bytes(self, path: "str | os.PathLike[str]") -> bytes:
        """What the process would read (the page cache), without an IO step."""
        node = self._lookup(self._split(path))
        if not isinstance(node, _File):
            raise FileNotFoundError(os.fspath(path))
        return bytes(node.data)

    def durable_bytes(self, path: "str | os.PathLike[str]") -> bytes | None:
        """The durable content under the durable name ``path`` (``None``: no durable name)."""
        node: _File | _Dir = self.root
        for part in self._split(path):
            if not isinstance(node, _Dir) or part not in node.durable:
                return None
            node = node.durable[part]
        return node.durable if isinstance(node, _File) else None

    def durable_prefix(self, path: "str | os.PathLike[str]") -> int:
        """How many leading bytes of the file at ``path``, as the process sees it, a power loss now
        keeps for certain: the common prefix of its cached and its durable content, 0 when its
        name is not durable (the simulator's checker, not the Disk port)."""
        parts = self._split(path)
        node = self._lookup(parts)
        if not isinstance(node, _File):
            return 0
        d: _File | _Dir = self.root
        for part in parts:
            if not isinstance(d, _Dir) or part not in d.durable:
                return 0
            d = d.durable[part]
        if d is not node:
            return 0
        data, durable = node.data, node.durable
        if len(durable) <= len(data):
            if data.startswith(durable):        # compared in place: no copy of either prefix
                return len(durable)
        elif durable.startswith(data):
            return len(data)
        i = 0
        while data[i] == durable[i]:
            i += 1
        return i

    def write_bytes(self, path: "str | os.PathLike[str]", data: bytes) -> None:
        """Tests: put a file in place durably (name and content), without IO steps."""
        parts = self._split(path)
        parent = self._lookup(parts[:-1])
        if not isinstance(parent, _Dir):
            raise FileNotFoundError(os.fspath(path))
        node = parent.entries.get(parts[-1])
        if not isinstance(node, _File):
            node = _File()
            parent.entries[parts[-1]] = node
            parent.durable[parts[-1]] = node
        node.data = bytearray(data)
        node.durable = bytes(data)
        node.pending = []
