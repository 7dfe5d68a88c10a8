from typing import Any

from coremltools.converters import mil as mil

def __getattr__(name: str) -> Any: ...
