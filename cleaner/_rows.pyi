from collections.abc import Callable
from typing import Any

def int_rows(
    rows: list[Any],
    name: str,
    n_shards: int,
    payload: Callable[[bytes], bytes],
    groups: list[list[tuple[Any, ...]]],
) -> list[int]: ...
def place_int(value: int, n_shards: int) -> int: ...
def digest64(data: bytes) -> int: ...
