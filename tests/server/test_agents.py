"""An agent framework (OpenAI Agents SDK, chat-completions mode) completes a tool-calling turn."""

from __future__ import annotations

from typing import Literal

import pytest
from server_testlib import API_KEY, MODEL, needs_grammar

agents = pytest.importorskip(
    "agents", reason="openai-agents is not installed (pip install -e '.[dev]')"
)


@needs_grammar
def test_agent_calls_a_tool_through_the_server(server_url):
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
        model=agents.OpenAIChatCompletionsModel(model=MODEL, openai_client=client),
        model_settings=agents.ModelSettings(tool_choice="required", max_tokens=24, temperature=0),
        tool_use_behavior="stop_on_first_tool",
    )
    result = agents.Runner.run_sync(agent, "What is the weather in Paris?", max_turns=2)
    assert len(calls) == 1 and calls[0] in ("Paris", "London", "Tokyo")
    assert result.final_output == f"Sunny in {calls[0]}"
