"""Agent functions written against the OpenAI chat API, as users have them: the demo task
(the calculator env's problems) solved by an agent that runs its own tool.

    jaxrl-train rollout.agent=jaxrl_agents.serve.examples:calculator_agent

The agent knows nothing of this package's envs beyond the task's question: it sends the
question with an OpenAI ``tools`` schema, evaluates each ``calculator`` call itself, sends the
result back as a ``tool`` message and returns the model's first reply without a tool call.
"""

from __future__ import annotations

import json
from typing import Any

from jaxrl_agents.envs.calculator.arithmetic import evaluate, format_number
from jaxrl_agents.envs.tools import ToolError

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


def run_calculator(arguments: str) -> str:
    """One ``calculator`` call, as the agent's own tool: the result, or an error text worded
    as the calculator env words it (so the demo's two paths show the model the same text)."""
    try:
        expression = json.loads(arguments)["expression"]
        return format_number(evaluate(str(expression))[0])
    except ToolError as e:  # the arithmetic's own message ("invalid expression ...")
        return f"Error: {e}"
    except Exception as e:  # noqa: BLE001 - a tool error goes back to the model as text
        return f"Error: calculator failed: {type(e).__name__}: {e}"


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
            result = run_calculator(call.function.arguments)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return ""
