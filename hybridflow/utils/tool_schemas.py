"""OpenAI function-calling schemas and the tool response type (veRL's ``verl.tools.schemas`` names).

A tool's yaml entry carries its schema in OpenAI's format::

    tool_schema:
      type: function
      function:
        name: calc
        description: Evaluate an arithmetic expression.
        parameters: {type: object, properties: {expr: {type: string}}, required: [expr]}

It is what the chat template shows the model (``tools=[schema.model_dump(exclude_unset=True,
exclude_none=True)]``) and how a parsed call is matched to its tool (by ``function.name``). Parameter
schemas may carry more JSON-schema fields than the ones named here (``items``, ``minimum``, ...); they
are kept as given.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class OpenAIFunctionPropertySchema(BaseModel):
    """One parameter: its JSON type (or several), description and allowed values."""

    model_config = ConfigDict(extra="allow")

    type: str | list[str]
    description: str | None = None
    enum: list[Any] | None = None


class OpenAIFunctionParametersSchema(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: str
    properties: dict[str, OpenAIFunctionPropertySchema]
    required: list[str] = Field(default_factory=list)


class OpenAIFunctionSchema(BaseModel):
    name: str
    description: str
    parameters: OpenAIFunctionParametersSchema = Field(
        default_factory=lambda: OpenAIFunctionParametersSchema(type="object", properties={}, required=[])
    )
    strict: bool = False


class OpenAIFunctionToolSchema(BaseModel):
    type: str
    function: OpenAIFunctionSchema


class OpenAIFunctionParsedSchema(BaseModel):
    """A call as parsed from the model's text: the arguments still a JSON string."""

    name: str
    arguments: str


class OpenAIFunctionCallSchema(BaseModel):
    """A call with its arguments decoded."""

    name: str
    arguments: dict[str, Any]

    @staticmethod
    def from_openai_function_parsed_schema(parsed: OpenAIFunctionParsedSchema) -> tuple[OpenAIFunctionCallSchema, bool]:
        """(call, has_decode_error): arguments that are not a JSON object decode to ``{}`` and flag the error."""
        try:
            arguments = json.loads(parsed.arguments)
        except json.JSONDecodeError:
            return OpenAIFunctionCallSchema(name=parsed.name, arguments={}), True
        if not isinstance(arguments, dict):
            return OpenAIFunctionCallSchema(name=parsed.name, arguments={}), True
        return OpenAIFunctionCallSchema(name=parsed.name, arguments=arguments), False


class OpenAIFunctionToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: OpenAIFunctionCallSchema


class ToolResponse(BaseModel):
    """What a tool gives back to the conversation. hybridflow's rollout is text-only: a response with
    ``image`` or ``video`` is refused by the agent loop with a message saying so."""

    text: str | None = None
    image: list[Any] | None = None
    video: list[Any] | None = None

    @model_validator(mode="before")
    @classmethod
    def _media_are_lists(cls, values):
        if isinstance(values, dict):
            for key in ("image", "video"):
                if values.get(key) is not None and not isinstance(values[key], list):
                    raise ValueError(
                        f"ToolResponse.{key} must be a list (wrap a single item as [item]), "
                        f"got {type(values[key]).__name__}"
                    )
        return values

    def is_empty(self) -> bool:
        return not self.text and not self.image and not self.video

    def is_text_only(self) -> bool:
        return bool(self.text) and not self.image and not self.video
