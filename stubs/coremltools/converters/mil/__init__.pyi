from typing import Any

from coremltools.converters.mil import mil as mil
from coremltools.converters.mil.mil import Builder as Builder
from coremltools.converters.mil.mil import Function as Function
from coremltools.converters.mil.mil import Program as Program
from coremltools.converters.mil.mil import Var as Var

def __getattr__(name: str) -> Any: ...
