"""Multi-turn environments and tools.

Two layers: the token-level `Env` protocol (envs.base), and tool classes whose public methods
are the tools (envs.tools), run as an `Env` by `ToolEnv` (envs.tool_env) with tool calls parsed
in the Hermes/Qwen, the Llama 3.1+ bare-JSON or the plain format (envs.parse) and replies
rendered by a `Renderer` (envs.render). `PythonTool` (envs.sandbox) runs code in a limited process.
"""

from slipstream.envs.base import Env, EnvFactory, Observation, StepResult, resolve
from slipstream.envs.parse import ToolCall, ToolFormat, parse_tool_calls
from slipstream.envs.render import HermesRenderer, PlainRenderer, Renderer, encode_tail
from slipstream.envs.sandbox import PythonTool, SandboxLimits, SandboxResult, run_python
from slipstream.envs.tool_env import ToolEnv, row_kwargs
from slipstream.envs.tools import ToolReply, ToolSpec, call_tool, tool_specs

__all__ = [
    "Env",
    "EnvFactory",
    "HermesRenderer",
    "Observation",
    "PlainRenderer",
    "PythonTool",
    "Renderer",
    "SandboxLimits",
    "SandboxResult",
    "StepResult",
    "ToolCall",
    "ToolEnv",
    "ToolFormat",
    "ToolReply",
    "ToolSpec",
    "call_tool",
    "encode_tail",
    "parse_tool_calls",
    "resolve",
    "row_kwargs",
    "run_python",
    "tool_specs",
]
