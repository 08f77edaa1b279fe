"""A tool-calling agent loop with the official ``openai`` client against ``radixgen serve``.

Start a server first (this script starts nothing itself)::

    radixgen serve --port 30000
    python examples/agent_tools.py [--base-url http://127.0.0.1:30000/v1] [--max-tokens 64]

The first turn names the tool (``tool_choice`` = get_weather, so the call is guaranteed), later
turns let the model choose (``auto``); arguments are constrained by the tool's JSON schema, so
they always parse. The script runs each tool, returns the result, and prints the final answer.
"""

from __future__ import annotations

import argparse
import json

from openai import OpenAI

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "enum": ["Paris", "London", "Tokyo"]}},
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "convert_temperature",
            "description": "Convert a temperature in Celsius to Fahrenheit.",
            "parameters": {
                "type": "object",
                "properties": {"celsius": {"type": "number"}},
                "required": ["celsius"],
                "additionalProperties": False,
            },
        },
    },
]
FIRST_CHOICE = {"type": "function", "function": {"name": "get_weather"}}
WEATHER = {"Paris": (18, "sunny"), "London": (12, "rainy"), "Tokyo": (24, "cloudy")}


def run_tool(name: str, arguments: dict) -> str:
    if name == "get_weather":
        celsius, sky = WEATHER[arguments["city"]]
        return json.dumps({"city": arguments["city"], "celsius": celsius, "sky": sky})
    if name == "convert_temperature":
        return json.dumps({"fahrenheit": round(arguments["celsius"] * 9 / 5 + 32, 1)})
    return json.dumps({"error": f"unknown tool {name}"})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:30000/v1")
    parser.add_argument("--api-key", default="EMPTY")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--max-turns", type=int, default=3)
    args = parser.parse_args()
    client = OpenAI(base_url=args.base_url, api_key=args.api_key)
    model = client.models.list().data[0].id
    messages = [
        {"role": "system", "content": "You answer weather questions using the tools."},
        {"role": "user", "content": "What is the weather like in Paris right now?"},
    ]
    for turn in range(args.max_turns):
        response = client.chat.completions.create(
            model=model,
            messages=messages,
            tools=TOOLS,
            tool_choice=FIRST_CHOICE if turn == 0 else "auto",
            max_tokens=args.max_tokens,
            temperature=0,
        )
        message = response.choices[0].message
        if not message.tool_calls:
            print(f"assistant: {message.content}")
            break
        messages.append(
            {
                "role": "assistant",
                "content": message.content,
                "tool_calls": [c.model_dump() for c in message.tool_calls],
            }
        )
        for call in message.tool_calls:
            arguments = json.loads(call.function.arguments)
            result = run_tool(call.function.name, arguments)
            print(f"tool call: {call.function.name}({arguments}) -> {result}")
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    usage = response.usage
    cached = (
        getattr(usage.prompt_tokens_details, "cached_tokens", 0)
        if usage.prompt_tokens_details
        else 0
    )
    print(
        f"last turn: {usage.prompt_tokens} prompt tokens ({cached} cached), {usage.completion_tokens} generated"
    )


if __name__ == "__main__":
    main()
