from typing import Any

VERSION: tuple[int, int, int]
VERSION_TEXT: str

def __getattr__(name: str) -> Any: ...
