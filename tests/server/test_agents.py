"""openai-agents against the server, as its users first drive it: an agent with one
function tool, through both of its model types (chat completions and Responses),
streamed and not, on the tiny random models with the Hermes and the Qwen3.5-style XML
tool templates. `tool_choice="required"` makes the first turn a call (the grammar's
doing: the model is random); the agent runs the tool, sends its output back, and the
next turn (tool choice reset to auto) is the final answer."""

from __future__ import annotations

import asyncio
from typing import Literal

import pytest
from agents import (Agent, ModelSettings, OpenAIChatCompletionsModel, OpenAIResponsesModel, Runner, function_tool,
                    set_tracing_disabled)
from agents.items import MessageOutputItem, ToolCallItem, ToolCallOutputItem
from openai import AsyncOpenAI

from server_harness import ids, server

set_tracing_disabled(True)


@pytest.fixture(scope="module")
def base(tools_path, xml_tools_path):
    with server(tools_path, xml_tools_path, "--ctx-size", "2048") as b:
        yield b


def agent_with_tool(client: AsyncOpenAI, model: str, api: str, seen: list, end: int) -> Agent:
    @function_tool
    def get_weather(city: Literal["paris", "rome"]) -> str:
        """The weather in a city."""
        seen.append(city)
        return f"sunny in {city}"

    kind = OpenAIChatCompletionsModel if api == "chat" else OpenAIResponsesModel
    settings = ModelSettings(tool_choice="required", parallel_tool_calls=False, include_usage=True, max_tokens=120,  # the tiny vocabulary spells a call in ~60 tokens
                             extra_body={"chat_template_kwargs": {"enable_thinking": False},
                                         "logit_bias": {str(end): 5}})  # the answer ends (a call must close first)
    return Agent(name="weather", instructions="Answer with the tool's help.", tools=[get_weather],
                 model=kind(model=model, openai_client=client), model_settings=settings)


async def run(base: str, model: str, api: str, streamed: bool, seen: list, end: int):
    async with AsyncOpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0) as client:
        agent = agent_with_tool(client, model, api, seen, end)
        if not streamed:
            return await Runner.run(agent, "weather in paris?", max_turns=4)
        result = Runner.run_streamed(agent, "weather in paris?", max_turns=4)
        kinds = set()
        async for event in result.stream_events():
            kinds.add(event.type)
        assert "raw_response_event" in kinds and "run_item_stream_event" in kinds
        return result


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "streamed"])
@pytest.mark.parametrize("api", ["chat", "responses"])
@pytest.mark.parametrize("model", ["tiny-tools.gguf", "tiny-xml-tools.gguf"])
def test_an_agent_calls_its_tool_then_answers(base, tools_path, model, api, streamed):
    seen: list = []
    result = asyncio.run(run(base, model, api, streamed, seen, ids(tools_path)["<|im_end|>"]))
    assert len(seen) == 1 and seen[0] in ("paris", "rome")  # the call parsed, validated and ran once
    kinds = [type(i) for i in result.new_items]
    assert kinds[:2] == [ToolCallItem, ToolCallOutputItem] and isinstance(result.final_output, str)
    if result.final_output:  # (an empty answer has no message on chat completions)
        assert kinds[-1] is MessageOutputItem
    assert len(result.raw_responses) == 2  # the call's turn, then the answer's, with the output sent back
    assert result.raw_responses[1].usage.input_tokens > result.raw_responses[0].usage.input_tokens
