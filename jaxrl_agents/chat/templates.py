"""Chat template texts (Jinja, Hugging Face ``apply_chat_template`` dialect).

* :data:`TINY_CHAT_TEMPLATE` ships in ``assets/tiny_tokenizer/tokenizer_config.json``. It is the
  Qwen2.5 / Hermes layout made compact for a tiny model whose context is ~384 tokens: no default
  system prompt, the tool list as one compact JSON object per line (``{"name","description",
  "parameters"}`` of each function) and a one-line calling instruction.
* :data:`QWEN25_CHAT_TEMPLATE` is a Qwen2.5-Instruct-style Hermes template written for this package
  (same control flow and whitespace as the released one: default system prompt, ``<tools>`` block,
  tool results grouped into one ``user`` turn). Tests use it with the tiny vocabulary to show that
  the token-in/token-out renderer is not specific to the tiny template; users whose checkpoint has
  no template can pass it to :class:`~jaxrl_agents.chat.render.ChatFormat`.

Both render an assistant message as ``<|im_start|>assistant\\n`` + content, then one block per
tool call ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`` (blocks separated by
``\\n``, and separated from non-empty content by ``\\n``), then ``<|im_end|>\\n``. Tool-call
``arguments`` must be dicts when rendered (``ChatFormat`` converts OpenAI-style JSON strings).

``tojson`` is transformers' override (``json.dumps`` with ``ensure_ascii=False`` and optional
``separators``); :func:`jinja_environment` reproduces it so the tokenizer build script can render
without importing transformers.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from jaxrl_agents.types import Message

TINY_CHAT_TEMPLATE = (
    "{%- if messages and messages[0].role == 'system' %}"
    "{%- set system = messages[0].content %}{%- set rest = messages[1:] %}"
    "{%- else %}{%- set system = '' %}{%- set rest = messages %}{%- endif %}"
    "{%- if system or tools %}"
    "{{- '<|im_start|>system\\n' + system }}"
    "{%- if tools %}"
    "{%- if system %}{{- '\\n' }}{%- endif %}"
    "{{- 'Tools:' }}"
    "{%- for tool in tools %}"
    "{%- set fn = tool.function if tool.function is defined else tool %}"
    "{{- '\\n' + (fn | tojson(separators=(',', ':'))) }}"
    "{%- endfor %}"
    '{{- \'\\nCall a tool with <tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>\' }}'
    "{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in rest %}"
    "{%- if message.role == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' + (message.content or '') }}"
    "{%- for tc in (message.tool_calls or []) %}"
    "{%- set f = tc.function if tc.function is defined else tc %}"
    "{%- if message.content or not loop.first %}{{- '\\n' }}{%- endif %}"
    '{{- \'<tool_call>\\n{"name": "\' + f.name + \'", "arguments": \' }}'
    "{{- (f.arguments | tojson) + '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.first or loop.previtem.role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or loop.nextitem.role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- else %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

QWEN25_CHAT_TEMPLATE = """\
{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n\
You are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and \
arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \
\\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful \
assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or \
(message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

CHAT_TEMPLATES: dict[str, str] = {"tiny": TINY_CHAT_TEMPLATE, "qwen2.5": QWEN25_CHAT_TEMPLATE}
"""Templates by name, for configs (``chat.template=qwen2.5``)."""


def resolve_template(spec: str) -> str:
    """Template text of ``spec``: a name in :data:`CHAT_TEMPLATES`, or the path of a Jinja file
    (e.g. a model's ``chat_template.jinja``, or ``tokenizer_config.json`` whose
    ``chat_template`` is used). ``ValueError`` naming both options otherwise."""
    from pathlib import Path

    if spec in CHAT_TEMPLATES:
        return CHAT_TEMPLATES[spec]
    path = Path(spec).expanduser()
    if path.is_dir():
        for name in ("chat_template.jinja", "tokenizer_config.json"):
            if (path / name).is_file():
                return resolve_template(str(path / name))
    if path.is_file():
        text = path.read_text(encoding="utf-8")
        if path.suffix == ".json":
            data = json.loads(text)
            tpl = data.get("chat_template") if isinstance(data, dict) else None
            if isinstance(tpl, list):  # named templates: the default one
                tpl = next((t.get("template") for t in tpl if t.get("name") == "default"), None)
            if not isinstance(tpl, str) or not tpl:
                raise ValueError(f"{path} has no chat_template string")
            return tpl
        if not text.strip():
            raise ValueError(f"chat template file {path} is empty")
        return text
    raise ValueError(
        f"chat template {spec!r} is neither a shipped template "
        f"({', '.join(sorted(CHAT_TEMPLATES))}) nor an existing file or folder"
    )


def _tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Same signature and defaults as transformers' override of jinja's tojson.
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


@functools.cache
def jinja_environment() -> Any:
    """A sandboxed jinja2 environment configured like transformers' chat-template renderer."""
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
    )
    env.filters["tojson"] = _tojson
    return env


def render_template(
    template: str,
    messages: list[Message],
    *,
    tools: list[dict[str, Any]] | None = None,
    add_generation_prompt: bool = False,
) -> str:
    """Render ``template`` without transformers (used by the tokenizer build script)."""
    return _compiled(template).render(
        messages=messages, tools=tools, add_generation_prompt=add_generation_prompt
    )


@functools.lru_cache(maxsize=8)
def _compiled(template: str) -> Any:
    return jinja_environment().from_string(template)
