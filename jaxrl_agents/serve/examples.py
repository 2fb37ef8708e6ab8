"""Agent functions written against the OpenAI chat API, as users have them: the demo task
(the calculator env's problems) solved by an agent that runs its own tool.

    jaxrl-train rollout.agent=jaxrl_agents.serve.examples:calculator_agent

The agent knows nothing of this package's envs beyond the task's question: it sends the
question with an OpenAI ``tools`` schema, checks and evaluates each call itself (its error texts
worded as the calculator env's), sends the result back as a ``tool`` message and returns the
model's first reply without a tool call.
"""

from __future__ import annotations

import json
from typing import Any

from jaxrl_agents.envs.calculator.arithmetic import evaluate, format_number
from jaxrl_agents.envs.tools import InvalidCall, ToolError, check_call, truncate
from jaxrl_agents.types import ToolCall

SYSTEM = "Use the calculator tool for arithmetic. Reply with only the final number."
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string", "description": "e.g. 37*12-5"}},
                "required": ["expression"],
            },
        },
    }
]
MAX_TURNS = 6
MAX_CHARS = 200  # the calculator env's tool_output_max_chars (configs/env/calculator.yaml)


def run_tool(name: str, arguments: str) -> str:
    """One tool call, as the agent's own tool dispatch: the result, or an error text worded as
    the calculator env words it (``check_call``: unknown tool, bad arguments; the arithmetic's
    own message), cut at the env's 200 characters, so the demo's two paths show the model the
    same text."""
    try:
        call = ToolCall(name, json.loads(arguments))
        args = check_call(call, {"calculator": TOOLS[0]["function"]["parameters"]})
        return truncate(format_number(evaluate(args["expression"])[0]), MAX_CHARS)
    except (InvalidCall, ToolError) as e:  # ToolError: the arithmetic's ("invalid expression")
        return truncate(f"Error: {e}", MAX_CHARS)
    except Exception as e:  # noqa: BLE001 - a tool error goes back to the model as text
        return truncate(f"Error: calculator failed: {type(e).__name__}: {e}", MAX_CHARS)


async def calculator_agent(client: Any, task: Any) -> str:
    """Ask, run the tool calls, repeat; the final text is the answer."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": task.data["question"]},
    ]
    for _ in range(MAX_TURNS):
        out = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
        message = out.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return message.content or ""
        for call in message.tool_calls:
            result = run_tool(call.function.name, call.function.arguments)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return ""
