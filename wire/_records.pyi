"""Types of the C extension built from wire/_records.c (see wire/batch.py)."""

from typing import Any, Callable, Mapping

CRC32: str

def scan(buf: Any, base_offset: int, mode: int, max_size: int, now_ms: int,
         next_queue_offsets: Mapping[tuple[str, int], int] | None, topic_of: Callable[[bytes, int], str],
         tag_of: Callable[[bytes], int], error_class: type[Exception]) -> tuple[int, int, list[list[Any]], str | None]: ...

def offsets(buf: Any) -> tuple[tuple[int, int], ...]: ...

def whole_length(buf: Any, max_bytes: int) -> int: ...

def encode(topic: bytes, props: bytes, body: bytes, queue_id: int, born_ms: int) -> bytes | None: ...
