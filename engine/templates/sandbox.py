"""The chat-template sandbox: jinja2 with a time and a size limit, rendered in the calling process.

`engine.templates.render.render_chat_template` is what callers use: it sends the
render to the renderer process (`engine.templates.process`), which runs
`render_in_this_process` from here. This module is the layer both stand on,
so neither imports the other. The limits are described in
`engine.templates.render`.
"""

from __future__ import annotations

import json
import re
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from datetime import datetime
from functools import lru_cache
from types import GeneratorType
from typing import TYPE_CHECKING, Any

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError

from engine.errors import EngineError

if TYPE_CHECKING:
    from _typeshed import TraceFunction  # sys.settrace's: (frame, event, arg) -> the frame's tracer or None

TIME_LIMIT_S = 5.0  # an honest template renders in milliseconds
MAX_CHARS = 8_000_000  # ~2M tokens: more than any model's context
_MAX_INT_BITS = 1 << 16  # integers a template may build (no 10**10**10)
_TEMPLATE_FILE = "<template>"  # the file name jinja2 compiles `from_string` templates under
_ADVICE = "the model cannot chat until it has a working template (a plain prompt, without the chat format, still works)"


class ChatTemplateError(EngineError, ValueError):
    """The model's chat template could not be rendered: broken, refused the conversation, or ran past a limit.

    A ValueError too, like `ContextLengthError`: callers that report bad input in words catch it.
    """


class _Overtime(BaseException):
    """Raised inside the template's frames when its time is up.

    A BaseException, so that no `except Exception` on the way (jinja2's own
    error handling, a filter) swallows it; `render_chat_template` turns it into
    a `ChatTemplateError`.
    """


class RanOutOfTime(ChatTemplateError):
    """The `ChatTemplateError` of a template stopped at its time limit (remembered: `engine.templates.render`)."""


class _TooLarge(Exception):
    """A value the template was about to build is over the size limit."""


_state = threading.local()  # the limits of the render under way on this thread


def _max_chars() -> int:
    return getattr(_state, "max_chars", MAX_CHARS)


def _size(value: Any, budget: int) -> int:
    """Roughly how many characters `str(value)` would make; stops counting once past `budget`.

    A walk, not `str()`: a list that holds itself twice forty levels deep is
    small in memory and astronomically long as text.
    """
    n, stack = 0, [value]
    while stack and n <= budget:
        v = stack.pop()
        if isinstance(v, str):
            n += len(v)
        elif isinstance(v, (list, tuple, set, frozenset)):
            n += 2 + 2 * len(v)
            if n <= budget:
                stack.extend(v)
        elif isinstance(v, dict):
            n += 2 + 4 * len(v)
            if n <= budget:
                stack.extend(v.keys())
                stack.extend(v.values())
        elif isinstance(v, int) and not isinstance(v, bool):
            n += v.bit_length() // 3 + 1
        else:
            n += 8
    return n


def _guard(*values: Any) -> None:
    limit = _max_chars()
    total = 0
    for v in values:
        total += _size(v, limit - total)
        if total > limit:
            raise _TooLarge()


def _guard_ints(values: Iterable[Any]) -> None:
    """Widths and counts (`center(10**9)`, `'%*d' % (10**9, 1)`): no argument may ask for more than the limit."""
    limit = _max_chars()
    for v in values:
        if isinstance(v, int) and not isinstance(v, bool) and abs(v) > limit:
            raise _TooLarge()


_PRINTF_WIDTH = re.compile(r"%[-+ #0]*(\d+|\*)?(?:\.(\d+|\*))?")
_FORMAT_WIDTH = re.compile(r"\{[^{}]*?:[^{}]*?(\d+)")
# Filters and str methods whose number arguments are widths or counts of the text they make.
_WIDTH_FILTERS = frozenset({"center", "indent", "wordwrap", "truncate"})
_WIDTH_METHODS = frozenset({"center", "ljust", "rjust", "zfill", "expandtabs"})


def _guard_printf(fmt: str, args: Any) -> None:
    """`'%0100000000d' % 1` and `'%*d' % (10**9, 1)` make a huge text from a short one."""
    stars = False
    for width, precision in _PRINTF_WIDTH.findall(fmt):
        for n in (width, precision):
            if n == "*":
                stars = True
            elif n and int(n) > _max_chars():
                raise _TooLarge()
    if stars:
        _guard_ints(args if isinstance(args, tuple) else (args,))


def _guard_str_format(fmt: str) -> None:
    """`'{:>100000000}'.format(1)`: a width in a format field."""
    if any(int(n) > _max_chars() for n in _FORMAT_WIDTH.findall(fmt)):
        raise _TooLarge()


def _guard_binop(operator: str, left: Any, right: Any) -> None:
    limit = _max_chars()
    if operator == "*":
        seq, count = (left, right) if isinstance(right, int) else (right, left)
        if isinstance(count, int) and isinstance(seq, (str, list, tuple)):
            if len(seq) * max(count, 0) > limit:
                raise _TooLarge()
        elif isinstance(left, int) and isinstance(right, int):
            if left.bit_length() + right.bit_length() > _MAX_INT_BITS:
                raise _TooLarge()
    elif operator == "**":
        if isinstance(left, int) and isinstance(right, int) and right > 0 and abs(left) > 1:
            if left.bit_length() * right > _MAX_INT_BITS:
                raise _TooLarge()
    elif operator == "%" and isinstance(left, str):
        _guard_printf(left, right)
        _guard(left, right)
    elif operator == "+" and isinstance(left, (str, list, tuple)) and isinstance(right, (str, list, tuple)):
        if len(left) + len(right) > limit:
            raise _TooLarge()


def _guard_replace(text: Any, old: Any, new: Any, count: Any = -1) -> None:
    """`s.replace('', s)` squares the length: work out the result's size before making it."""
    if isinstance(text, str) and isinstance(old, str) and isinstance(new, str):
        hits = len(text) + 1 if old == "" else text.count(old)
        if isinstance(count, int) and count >= 0:
            hits = min(hits, count)
        if len(text) + hits * max(0, len(new) - len(old)) > _max_chars():
            raise _TooLarge()


def _guard_join(separator: Any, items: Any) -> None:
    if isinstance(separator, str) and isinstance(items, (list, tuple)):
        if len(separator) * len(items) > _max_chars():
            raise _TooLarge()
        _guard(items)


class _LimitedSandbox(ImmutableSandboxedEnvironment):
    """jinja2's immutable sandbox, with the size checks above on operators, calls and output."""

    intercepted_binops = frozenset({"*", "**", "%", "+"})

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        _guard_binop(operator, left, right)
        return super().call_binop(context, operator, left, right)

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805 - jinja2's signature
        owner = getattr(__obj, "__self__", None)
        name = getattr(__obj, "__name__", "")
        if isinstance(owner, str) and name in _WIDTH_METHODS:
            _guard_ints(args)
            _guard_ints(kwargs.values())
        elif isinstance(owner, str) and name in ("format", "format_map"):
            _guard_str_format(owner)
        elif isinstance(owner, str) and name == "replace":
            _guard_replace(owner, *args[:3])
        elif isinstance(owner, str) and name == "join" and args:
            _guard_join(owner, list(args[0]) if isinstance(args[0], (set, frozenset, dict)) else args[0])
        result = super().call(__context, __obj, *args, **kwargs)
        if isinstance(result, (str, list, tuple, dict)):
            _guard(result)
        return result


def _limited_filter(name: str, f: Any) -> Any:
    """A filter whose arguments and result are held to the size limit (filters are not sandbox calls)."""

    def limited(*args: Any, **kwargs: Any) -> Any:
        # A generator (`range(n)|map(...)`) is counted as the filter consumes it, never consumed here.
        args = tuple(_counted(a) if isinstance(a, GeneratorType) else a for a in args)
        values = [a for a in args if not isinstance(a, (jinja2.runtime.Context, jinja2.nodes.EvalContext, jinja2.Environment))]
        if name in _WIDTH_FILTERS:
            _guard_ints(values[1:])
            _guard_ints(kwargs.values())
        elif name == "format" and values and isinstance(values[0], str):
            _guard_printf(values[0], tuple(values[1:]))
        _guard(*values[:1])
        if name == "replace" and len(values) >= 3:
            _guard_replace(*values[:4])
        elif name == "join" and values and isinstance(values[0], (list, tuple)):
            _guard_join(values[1] if len(values) > 1 else kwargs.get("d", ""), values[0])
        result = f(*args, **kwargs)
        if isinstance(result, (str, list, tuple, dict)):
            _guard(result)
        return result

    limited.__name__ = getattr(f, "__name__", name)
    for attr in ("jinja_pass_arg",):  # pass_context / pass_environment / pass_eval_context markers
        if hasattr(f, attr):
            setattr(limited, attr, getattr(f, attr))
    return limited


def _counted(items: Iterable[Any]) -> Iterable[Any]:
    """`items`, passed on one by one while their total size stays within the limit."""
    limit, total = _max_chars(), 0
    for x in items:
        total += _size(x, limit - total)
        if total > limit:
            raise _TooLarge()
        yield x


def _limited_join(seq: Iterable[Any]) -> str:
    """jinja2's `~` (`str_join`) with the size check: `ns.s ~ ns.s` forty times would not fit in memory."""
    items = list(seq)
    _guard(*items)
    return "".join(map(str, items))


def _limited_concat(parts: Iterable[Any]) -> str:
    """jinja2's `concat` for block captures and macro bodies, with the size check."""
    items = list(parts)
    _guard(*items)
    return "".join(items)


class _GenerationTag(jinja2.ext.Extension):
    """transformers' `{% generation %}…{% endgeneration %}`: marks the assistant's part; renders its body."""

    tags = {"generation"}

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Any) -> str:
        return caller()


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False) -> str:
    # jinja's own tojson escapes HTML characters; transformers' does not.
    _guard(x)
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _finalize(value: Any) -> Any:
    """Every `{{ value }}` passes here before it becomes text: a huge value is refused before `str()`."""
    if not isinstance(value, str):
        _guard(value)
    return value


@lru_cache(maxsize=16)
def _compile(template: str) -> jinja2.Template:
    env = _LimitedSandbox(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[jinja2.ext.loopcontrols, _GenerationTag],
        finalize=_finalize,
    )
    env.filters["tojson"] = _tojson
    env.filters = {name: _limited_filter(name, f) for name, f in env.filters.items()}
    env.globals.pop("lipsum", None)  # makes any amount of text in one untraced call; no template needs it
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    env.concat = _limited_concat  # type: ignore[method-assign]  # jinja2 calls it as an attribute: ours checks sizes
    compiled = env.from_string(template)
    # `~` calls the module-level `str_join` the compiled template imported: give it the checked one.
    compiled.root_render_func.__globals__["str_join"] = _limited_join
    compiled.root_render_func.__globals__["markup_join"] = _limited_join
    return compiled


def _deadline_tracer(deadline: float) -> TraceFunction:
    """A `sys.settrace` function that raises `_Overtime` in the template's frames once `deadline` passes."""

    def on_line(frame: Any, event: str, arg: Any) -> TraceFunction:
        if time.monotonic() > deadline:
            raise _Overtime()
        return on_line

    def on_call(frame: Any, event: str, arg: Any) -> TraceFunction | None:
        if time.monotonic() > deadline:
            raise _Overtime()
        return on_line if frame.f_code.co_filename == _TEMPLATE_FILE else None

    return on_call


def _overtime_message(time_limit_s: float) -> str:
    return (f"the model's chat template did not finish within {time_limit_s:g} s and was stopped "
            f"(it may loop without end); {_ADVICE}")


def render_in_this_process(template: str, variables: Mapping[str, Any], *, time_limit_s: float, max_chars: int) -> str:
    """Render in this process, under the trace-function time limit and the size checks only.

    What the renderer process runs; here where no renderer process can be started. A long C call
    or a loop inside a filter can outlast `time_limit_s` here: `render_chat_template` is the safe way.

    Raises:
        ChatTemplateError: as `render_chat_template` (`RanOutOfTime` when the time limit stopped it).
    """
    try:
        compiled = _compile(template)
    except jinja2.TemplateSyntaxError as e:
        raise ChatTemplateError(f"the model's chat template is not valid Jinja (line {e.lineno}: {e.message}); {_ADVICE}") from None
    except jinja2.TemplateError as e:
        raise ChatTemplateError(f"the model's chat template cannot be compiled ({e}); {_ADVICE}") from None
    except RecursionError:
        raise ChatTemplateError(f"the model's chat template is nested too deeply to compile; {_ADVICE}") from None
    return _render(compiled, variables, time_limit_s, max_chars)


def _render(compiled: jinja2.Template, variables: Mapping[str, Any], time_limit_s: float, max_chars: int) -> str:
    """Render under the time and size limits; every failure becomes one `ChatTemplateError`."""
    previous_trace = sys.gettrace()
    previous_limit = getattr(_state, "max_chars", None)
    _state.max_chars = max_chars
    out: list[str] = []
    length = 0
    sys.settrace(_deadline_tracer(time.monotonic() + time_limit_s))
    try:
        for piece in compiled.generate(**variables):
            length += len(piece)
            if length > max_chars:
                raise _TooLarge()
            out.append(piece)
    except _Overtime:
        raise RanOutOfTime(_overtime_message(time_limit_s)) from None
    except _TooLarge:
        raise ChatTemplateError(
            f"the model's chat template tried to build more than {max_chars:,} characters and was stopped; {_ADVICE}"
        ) from None
    except SecurityError as e:
        raise ChatTemplateError(f"the model's chat template tried something the sandbox forbids ({e}) and was stopped; {_ADVICE}") from None
    except jinja2.TemplateError as e:  # raise_exception(...) in the template, an undefined name, ...
        raise ChatTemplateError(f"the model's chat template refused this conversation: {e}") from None
    except RecursionError:
        raise ChatTemplateError(f"the model's chat template calls itself without end and was stopped; {_ADVICE}") from None
    except (TypeError, ValueError, LookupError, ArithmeticError, AttributeError, MemoryError) as e:
        raise ChatTemplateError(f"the model's chat template failed ({type(e).__name__}: {e}); {_ADVICE}") from None
    finally:
        sys.settrace(previous_trace)
        if previous_limit is None:
            del _state.max_chars
        else:
            _state.max_chars = previous_limit
    return "".join(out)
