"""langchain-openai's ChatOpenAI (unmodified) against the live server: structured output by both
methods, and a bound tool that the model calls."""

from __future__ import annotations

import pytest
from clients_testlib import API_KEY, EXTRACT, JOHN, MODEL, User

langchain_openai = pytest.importorskip(
    "langchain_openai", reason="langchain-openai is not installed (pip install -e '.[dev]')"
)


@pytest.fixture(scope="module")
def llm(server_url):
    return langchain_openai.ChatOpenAI(
        model=MODEL,
        base_url=f"{server_url}/v1",
        api_key=API_KEY,
        max_tokens=128,
        temperature=0,
        max_retries=0,
        timeout=120,
    )


@pytest.mark.slow
@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_with_structured_output(llm, method):
    user = llm.with_structured_output(User, method=method).invoke(EXTRACT)
    assert isinstance(user, User) and user == JOHN


@pytest.mark.slow
def test_bind_tools_produces_a_tool_call(llm):
    from langchain_core.tools import tool

    @tool
    def get_weather(city: str) -> str:
        """Current weather in a city."""
        return f"Sunny in {city}"

    message = llm.bind_tools([get_weather], tool_choice="get_weather").invoke(
        "What is the weather in Paris?"
    )
    [call] = message.tool_calls
    assert call["name"] == "get_weather" and call["args"] == {"city": "Paris"}
    assert get_weather.invoke(call["args"]) == "Sunny in Paris"
