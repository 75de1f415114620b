"""The message templates of inbound triggers (issue 29 "Inbound triggers"): a trigger's
JSON body rendered into a session's first message by Jinja2's sandbox, strictly.

``template_check`` validates a template's syntax (``AgentTrigger.clean``, admin's form);
``message_render`` renders one with the delivery's body as ``body``. The environment is
``jinja2.sandbox.SandboxedEnvironment`` (no access to Python internals, ranges capped) with a
strict undefined: a field the body lacks is an error naming it
(``'pull_request' has no field 'title'``), never an empty string. Autoescaping is off: the
result is a plain-text message, not HTML. Inside the template a JSON object's keys are read
as fields before any method of Python's ``dict`` (``body.items`` is the key ``items``).

Below the models: it imports nothing of the app.
"""

from __future__ import annotations

from typing import Any, NoReturn

from jinja2 import StrictUndefined, TemplateError, TemplateSyntaxError
from jinja2.sandbox import SandboxedEnvironment

#: The name a template reads the delivery's JSON body under.
BODY_NAME = "body"


class TriggerTemplateError(ValueError):
    """A template that does not parse, or a render that failed (a missing field, a failing
    filter); the message names the field or the line, for a 400 or a form error."""


class _JsonObject(dict[str, Any]):
    """A JSON object of the body that knows where it sits (``path``: ``pull_request.head``)."""

    path: str


class _JsonArray(list[Any]):
    """A JSON array of the body that knows where it sits."""

    path: str


def _wrap(value: Any, path: str) -> Any:
    """``value`` (parsed JSON) with every object and array knowing its path."""
    if isinstance(value, dict):
        wrapped_object = _JsonObject(
            {key: _wrap(item, f"{path}.{key}" if path else str(key)) for key, item in value.items()}
        )
        wrapped_object.path = path or BODY_NAME
        return wrapped_object
    if isinstance(value, list):
        wrapped_array = _JsonArray(
            _wrap(item, f"{path}[{index}]" if path else f"[{index}]")
            for index, item in enumerate(value)
        )
        wrapped_array.path = path or BODY_NAME
        return wrapped_array
    return value


class _FieldUndefined(StrictUndefined):
    """``StrictUndefined`` whose message names the body's field: ``'pull_request' has no
    field 'title'``."""

    __slots__ = ()

    @property
    def _undefined_message(self) -> str:
        owner = self._undefined_obj
        name = self._undefined_name
        if self._undefined_hint:  # the sandbox's "access to attribute ... is unsafe"
            return self._undefined_hint
        if isinstance(owner, _JsonObject):
            return f"{owner.path!r} has no field {name!r}"
        if isinstance(owner, _JsonArray):
            return f"{owner.path!r} has no item {name!r}"
        message: str = super()._undefined_message
        return message

    def _fail_with_undefined_error(self, *args: Any, **kwargs: Any) -> NoReturn:
        super()._fail_with_undefined_error(*args, **kwargs)
        raise AssertionError("unreachable")  # StrictUndefined always raises


class _TriggerEnvironment(SandboxedEnvironment):
    """The sandbox, reading a JSON object's keys before its ``dict`` methods."""

    def getattr(self, obj: Any, attribute: str) -> Any:
        if isinstance(obj, _JsonObject):
            if attribute in obj:
                return obj[attribute]
            return self.undefined(obj=obj, name=attribute)
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        if isinstance(obj, _JsonObject):
            if argument in obj:
                return obj[argument]
            return self.undefined(obj=obj, name=argument)
        if isinstance(obj, _JsonArray) and isinstance(argument, int):
            try:
                return obj[argument]
            except IndexError:
                return self.undefined(obj=obj, name=str(argument))
        return super().getitem(obj, argument)


_ENVIRONMENT = _TriggerEnvironment(
    undefined=_FieldUndefined, autoescape=False, keep_trailing_newline=True
)


def template_check(*, source: str) -> None:
    """Parse ``source`` as a trigger template.

    Raises:
        TriggerTemplateError: The syntax is wrong; the message says where (line number).
    """
    try:
        _ENVIRONMENT.parse(source)
    except TemplateSyntaxError as error:
        raise TriggerTemplateError(f"Line {error.lineno}: {error.message}") from None


def message_render(*, source: str, body: dict[str, Any]) -> str:
    """Render ``source`` with ``body`` (a parsed JSON object) as ``body``.

    Returns:
        The rendered text.

    Raises:
        TriggerTemplateError: The template does not parse, reads a field the body lacks
            (``'pull_request' has no field 'title'``), or fails otherwise (a filter on the
            wrong type, a sandboxed operation).
    """
    try:
        template = _ENVIRONMENT.from_string(source)
        return template.render({BODY_NAME: _wrap(body, "")})
    except TemplateSyntaxError as error:
        raise TriggerTemplateError(f"Line {error.lineno}: {error.message}") from None
    except TemplateError as error:
        raise TriggerTemplateError(str(error.message or error)) from None
    except (TypeError, ValueError, ArithmeticError, LookupError) as error:
        raise TriggerTemplateError(f"The template failed: {error}") from None
