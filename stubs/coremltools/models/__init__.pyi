from typing import Any

from coremltools import ComputeUnit

class MLModel:
    short_description: str
    author: str
    license: str
    version: str
    user_defined_metadata: dict[str, str]
    package_path: str | None
    def __init__(
        self,
        model: Any,
        is_temp_package: bool = False,
        mil_program: Any = None,
        skip_model_load: bool = False,
        compute_units: ComputeUnit = ...,
        weights_dir: str | None = None,
        function_name: str | None = None,
        optimization_hints: dict[str, Any] | None = None,
    ) -> None: ...
    def predict(
        self, data: dict[str, Any] | list[dict[str, Any]], state: Any = None
    ) -> dict[str, Any]: ...
    def save(self, save_path: str) -> None: ...
    def get_spec(self) -> Any: ...
    def get_compiled_model_path(self) -> str: ...

def __getattr__(name: str) -> Any: ...
