"""Pydantic's validation errors, said the way a config file's author needs to hear them.

Each error becomes a :class:`Finding` whose path is a key path into the document as written
(the discriminated union's tag that pydantic inserts into ``loc`` is dropped) and whose message
says what was expected and what was found: ``expected an integer, got 'lots'``,
``unknown key (allowed: id, url, ...)``.
"""

from __future__ import annotations

import types
from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError

from gpugate.config.paths import Finding, KeyPath, describe

if TYPE_CHECKING:
    from pydantic_core import ErrorDetails

DISCRIMINATOR = "kind"

_EXPECTED = {
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "an integer",
    "float_type": "a number",
    "float_parsing": "a number",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "string_type": "a string",
    "list_type": "a list",
    "dict_type": "a mapping",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
}
# Filled with the error's ``ctx`` and ``got``, the offending value as :func:`describe` says it.
_TEMPLATES = {
    **{kind: f"expected {what}, got {{got}}" for kind, what in _EXPECTED.items()},
    "missing": "required key is missing",
    "greater_than": "expected a number greater than {gt}, got {got}",
    "greater_than_equal": "expected a number of at least {ge}, got {got}",
    "less_than": "expected a number less than {lt}, got {got}",
    "less_than_equal": "expected a number of at most {le}, got {got}",
    "too_short": "expected at least {min_length} item(s), got {actual_length}",
    "string_too_short": "expected a non-empty string",
    "literal_error": "expected {expected}, got {got}",
    "value_error": "{error}",
    "assertion_error": "{error}",
}


def schema_findings(exc: ValidationError, data: Any, root: type[BaseModel]) -> list[Finding]:
    """One finding per error of ``exc``, raised validating ``data`` as ``root``."""
    return [_finding(error, data, root) for error in exc.errors()]


def _finding(error: ErrorDetails, data: Any, root: type[BaseModel]) -> Finding:
    path = key_path(error["loc"], data)
    kind = error["type"]
    if kind == "extra_forbidden":
        model = model_at(root, path[:-1], data)
        allowed = ", ".join(model.model_fields) if model else "see the documentation"
        return Finding(path, f"unknown key (allowed: {allowed})")
    if kind in ("union_tag_not_found", "union_tag_invalid"):
        return _tag_finding(error, path, root)
    return Finding(path, message(error))


def message(error: ErrorDetails) -> str:
    """What was expected and what was found, for one pydantic error."""
    got = describe(error["input"])
    template = _TEMPLATES.get(error["type"])
    if template is None:
        return f"{error['msg']}, got {got}"
    ctx = {key: _plain(value) for key, value in error.get("ctx", {}).items()}
    return template.format(got=got, **ctx)


def _plain(value: Any) -> Any:
    """``100.0`` → ``100``: a bound reads as the author wrote it."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _tag_finding(error: ErrorDetails, path: KeyPath, root: type[BaseModel]) -> Finding:
    tags = ", ".join(f"'{tag}'" for tag in union_tags(root, path))
    where = (*path, DISCRIMINATOR)
    if error["type"] == "union_tag_not_found":
        return Finding(where, f"required key is missing (one of {tags})")
    got = describe(error.get("ctx", {}).get("tag"))
    return Finding(where, f"expected one of {tags}, got {got}")


def key_path(loc: tuple[int | str, ...], data: Any) -> KeyPath:
    """Pydantic's ``loc`` as a key path into ``data``, the document that was validated.

    Walks ``data`` along ``loc``: drops the union tag pydantic inserts after a runtime's index
    (the first ``loc`` entry equal to the runtime's ``kind``) and the ``[key]`` marker of a
    mapping key that failed; turns mapping keys into strings.
    """
    path: list[str | int] = []
    node, tag_skipped = data, True
    for index, part in enumerate(loc):
        if part == "[key]":
            continue
        is_last = index == len(loc) - 1
        if isinstance(node, list) and isinstance(part, int):
            path.append(part)
            node, tag_skipped = _item(node, part), False
        elif isinstance(node, Mapping) and not tag_skipped and not is_last:
            tag_skipped = True
            if node.get(DISCRIMINATOR) == part:
                continue
            path.append(str(part))
            node = _child(node, part)
        else:
            path.append(str(part))
            node, tag_skipped = _child(node, part), True
    return tuple(path)


def _child(node: Any, part: int | str) -> Any:
    if isinstance(node, Mapping):
        if part in node:
            return node[part]
        return next((value for key, value in node.items() if str(key) == str(part)), None)
    return None


def model_at(root: type[BaseModel], path: KeyPath, data: Any) -> type[BaseModel] | None:
    """The model class that validates the mapping at ``path`` of ``data``, if any."""
    annotation = annotation_at(root, path, data)
    return annotation if _is_model(annotation) else None


def union_tags(root: type[BaseModel], path: KeyPath) -> list[str]:
    """The tags a discriminated union at ``path`` accepts (``upstream``, ``push``, ...)."""
    annotation = _strip(annotation_at(root, path, None))
    members = get_args(annotation) if _is_union(annotation) else (annotation,)
    return [tag for member in members for tag in _tags_of(member)]


def annotation_at(root: type[BaseModel], path: KeyPath, data: Any) -> Any:
    """The type annotation of the value at ``path``; a union of models resolved by its tag."""
    annotation: Any = root
    node = data
    for part in path:
        annotation = _resolve(annotation, node)
        origin = get_origin(annotation)
        if isinstance(part, int) and origin is list:
            annotation = get_args(annotation)[0]
        elif _is_model(annotation) and part in annotation.model_fields:
            annotation = annotation.model_fields[part].annotation
        elif origin is dict:
            annotation = get_args(annotation)[1]
        else:
            return None
        node = _item(node, part)
    return _resolve(annotation, node)


def _item(node: Any, part: int | str) -> Any:
    if isinstance(node, list):
        return node[part] if isinstance(part, int) and 0 <= part < len(node) else None
    return _child(node, part)


def _resolve(annotation: Any, node: Any) -> Any:
    """Strip ``Annotated`` and ``| None``; pick a union's member by the node's tag."""
    annotation = _strip(annotation)
    if _is_union(annotation):
        members = [arg for arg in get_args(annotation) if arg is not type(None)]
        if len(members) == 1:
            return _strip(members[0])
        tag = node.get(DISCRIMINATOR) if isinstance(node, Mapping) else None
        chosen = [member for member in members if tag in _tags_of(_strip(member))]
        return _strip(chosen[0]) if chosen else annotation
    return annotation


def _strip(annotation: Any) -> Any:
    while get_origin(annotation) is Annotated:
        annotation = get_args(annotation)[0]
    return annotation


def _is_union(annotation: Any) -> bool:
    return get_origin(annotation) in (Union, types.UnionType)


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _tags_of(member: Any) -> tuple[str, ...]:
    if not _is_model(member) or DISCRIMINATOR not in member.model_fields:
        return ()
    field = member.model_fields[DISCRIMINATOR].annotation
    return get_args(field) if get_origin(field) is Literal else ()
