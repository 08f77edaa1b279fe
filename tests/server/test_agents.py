"""An agent framework (OpenAI Agents SDK) completes a tool-calling turn through the server, with
its Chat Completions model and with its Responses model (the SDK's default model class)."""

from __future__ import annotations

from typing import Literal

import pytest
from server_testlib import API_KEY, MODEL, needs_grammar

agents = pytest.importorskip(
    "agents", reason="openai-agents is not installed (pip install -e '.[dev]')"
)

MODEL_CLASSES = {
    "chat-completions": lambda client: agents.OpenAIChatCompletionsModel(
        model=MODEL, openai_client=client
    ),
    "responses": lambda client: agents.OpenAIResponsesModel(model=MODEL, openai_client=client),
}


@needs_grammar
@pytest.mark.slow
@pytest.mark.parametrize("model_class", list(MODEL_CLASSES))
def test_agent_calls_a_tool_through_the_server(server_url, model_class):
    from openai import AsyncOpenAI

    agents.set_tracing_disabled(True)
    calls: list[str] = []

    @agents.function_tool
    def get_weather(city: Literal["Paris", "London", "Tokyo"]) -> str:
        """Current weather in a city."""
        calls.append(city)
        return f"Sunny in {city}"

    client = AsyncOpenAI(base_url=f"{server_url}/v1", api_key=API_KEY, max_retries=0)
    agent = agents.Agent(
        name="weather",
        instructions="Answer weather questions with the get_weather tool.",
        tools=[get_weather],
        model=MODEL_CLASSES[model_class](client),
        model_settings=agents.ModelSettings(tool_choice="required", max_tokens=24, temperature=0),
        tool_use_behavior="stop_on_first_tool",
    )
    result = agents.Runner.run_sync(agent, "What is the weather in Paris?", max_turns=2)
    assert len(calls) == 1 and calls[0] in ("Paris", "London", "Tokyo")
    assert result.final_output == f"Sunny in {calls[0]}"


@needs_grammar
@pytest.mark.slow
def test_a_streamed_responses_agent_runs_the_tool_and_answers(server_url):
    """The Responses model streamed (``Runner.run_streamed``): the tool runs, its output goes
    back as a function_call_output item and the model answers in a second turn."""
    import asyncio

    from openai import AsyncOpenAI

    agents.set_tracing_disabled(True)
    calls: list[str] = []

    @agents.function_tool
    def get_weather(city: Literal["Paris", "London", "Tokyo"]) -> str:
        """Current weather in a city."""
        calls.append(city)
        return f"Sunny in {city}"

    client = AsyncOpenAI(base_url=f"{server_url}/v1", api_key=API_KEY, max_retries=0)
    agent = agents.Agent(
        name="weather",
        instructions="Answer weather questions with the get_weather tool.",
        tools=[get_weather],
        model=agents.OpenAIResponsesModel(model=MODEL, openai_client=client),
        # after the tool ran, tool_choice goes back to auto (reset_tool_choice) for the answer
        model_settings=agents.ModelSettings(tool_choice="required", max_tokens=64, temperature=0),
        reset_tool_choice=True,
    )

    async def run() -> agents.RunResultStreaming:
        result = agents.Runner.run_streamed(agent, "What is the weather in Paris?", max_turns=3)
        async for _ in result.stream_events():
            pass
        return result

    result = asyncio.run(run())
    assert calls and isinstance(result.final_output, str)


@needs_grammar
@pytest.mark.slow
def test_a_responses_agent_with_an_output_type_gives_a_validated_object(server_url):
    """``output_type``: the Responses model asks for a strict ``text.format`` json_schema; the
    final output is the validated pydantic object."""
    from openai import AsyncOpenAI
    from pydantic import BaseModel

    class City(BaseModel):
        name: Literal["Paris", "London", "Tokyo"]
        country: str

    agents.set_tracing_disabled(True)
    client = AsyncOpenAI(base_url=f"{server_url}/v1", api_key=API_KEY, max_retries=0)
    agent = agents.Agent(
        name="cities",
        instructions="Answer with the capital city asked for.",
        model=agents.OpenAIResponsesModel(model=MODEL, openai_client=client),
        model_settings=agents.ModelSettings(max_tokens=48, temperature=0),
        output_type=City,
    )
    result = agents.Runner.run_sync(agent, "What is the capital of France?", max_turns=1)
    assert isinstance(result.final_output, City)
