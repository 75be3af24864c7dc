"""Arguments and results described by a JSON Schema (MCP tools, LangChain tools built from a
schema), as pydantic models: checked against the schema, kept exactly as given (no coercion)."""

from __future__ import annotations

import copy
from typing import Any, ClassVar

import jsonschema
from pydantic import BaseModel, ConfigDict, model_validator
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import core_schema


class JsonSchemaModel(BaseModel):
    """A JSON object checked against a JSON Schema and kept exactly as given (no coercion).

    Subclasses (made by `schema_model`) carry the schema; it is also what the model is shown.
    """

    model_config = ConfigDict(extra="allow", frozen=True)
    json_schema: ClassVar[dict[str, Any]] = {"type": "object"}

    @model_validator(mode="before")
    @classmethod
    def _meets_schema(cls, data: Any) -> Any:
        if isinstance(data, BaseModel):
            data = data.model_dump(mode="json")
        validator = jsonschema.validators.validator_for(cls.json_schema)(cls.json_schema)
        errors = sorted(validator.iter_errors(data), key=lambda e: list(e.absolute_path))
        if errors:
            raise ValueError(
                "; ".join(
                    f"{'.'.join(str(p) for p in e.absolute_path) or '(object)'}: {e.message}"
                    for e in errors
                )
            )
        return data

    @classmethod
    def __get_pydantic_json_schema__(
        cls, schema: core_schema.CoreSchema, handler: Any
    ) -> JsonSchemaValue:
        return copy.deepcopy(cls.json_schema)


def schema_model(name: str, schema: dict[str, Any], *, closed: bool) -> type[JsonSchemaModel]:
    """A model for objects meeting `schema`. `closed`: names not in its properties are refused
    unless the schema itself allows more. A schema that is not valid JSON Schema raises."""
    if closed:
        schema = {"additionalProperties": False, **schema}
    jsonschema.validators.validator_for(schema).check_schema(schema)

    class Model(JsonSchemaModel):
        json_schema: ClassVar[dict[str, Any]] = schema

    Model.__name__ = Model.__qualname__ = name
    return Model
