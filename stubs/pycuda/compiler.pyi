from collections.abc import Sequence

from pycuda.driver import DeviceAllocation, Function, Module

class CompileError(Exception):
    msg: str
    command_line: str
    stdout: str | None
    stderr: str | None

class SourceModule:
    module: Module
    def __init__(
        self,
        source: str,
        nvcc: str = "nvcc",
        options: Sequence[str] | None = None,
        keep: bool = False,
        no_extern_c: bool = False,
        arch: str | None = None,
        code: str | None = None,
        cache_dir: str | bool | None = None,
        include_dirs: Sequence[str] = ...,
    ) -> None: ...
    def get_function(self, name: str) -> Function: ...
    def get_global(self, name: str) -> tuple[DeviceAllocation, int]: ...

def compile(
    source: str,
    nvcc: str = "nvcc",
    options: Sequence[str] | None = None,
    keep: bool = False,
    no_extern_c: bool = False,
    arch: str | None = None,
    code: str | None = None,
    cache_dir: str | bool | None = None,
    include_dirs: Sequence[str] = ...,
    target: str = "cubin",
) -> bytes: ...
