"""A Hydra/OmegaConf config as the translator reads it: overrides applied, interpolations resolved, leaves.

Called by ``importer/translate.py``. verl and AReaL configs are OmegaConf YAML: ``${actor.path}`` refers to
another key, ``${oc.env:VAR}`` / ``${oc.env:VAR,default}`` (and verl's older ``${env:VAR}``) to the
environment, and runs pass ``key=value`` overrides on the command line. This module does what OmegaConf
would, with the standard library only, except for secrets: a value under a secret-looking key, or taken
from a secret-looking environment variable, is never read into the output; it becomes a ``Secret`` that
the tables may turn into a Secret reference (``kubectl create secret`` is printed), never a literal.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import yaml

_REF = re.compile(r"\$\{([^${}]+)\}")
_ENV = re.compile(r"^(?:oc\.env|env):([A-Za-z_][A-Za-z0-9_]*)(?:,(.*))?$")
_SELECT = re.compile(r"^oc\.select:\s*([^,\s]+)\s*(?:,(.*))?$")
"""``${oc.select:key, default}``: the key's value, or the default when the config has no such key."""
_SHELL_VAR = re.compile(r"^[A-Z][A-Z0-9_]*$")
"""``${TAOTOKEN_API_KEY}``: not a key of the config but a shell variable, as configs written for shells
and blog posts use it (OmegaConf would fail on it)."""
_FLOAT = re.compile(r"^[-+]?(?:\d+\.?\d*|\.\d+)[eE][-+]?\d+$")
"""``1e-6``: a float to OmegaConf (YAML 1.2), a string to PyYAML (YAML 1.1) unless written ``1.0e-6``."""
_SECRET = re.compile(
    r"(api_?key|token|secret|password|passwd|credentials?|access_?key|private_?key)$", re.IGNORECASE
)
_NOT_SECRET = re.compile(r"(^|_)(pad|eos|bos|unk|sep|cls|mask|stop|max|min|num|end)_token$", re.IGNORECASE)
_ENV_KEY = re.compile(r"^[A-Z][A-Z0-9_]*_KEY$")


def is_secret_name(name: str) -> bool:
    """A key or environment variable whose value is a secret: its name ends so (``admin_api_key``,
    ``HF_TOKEN``, ``WANDB_API_KEY``, ``AWS_SECRET_ACCESS_KEY``, ``password``; not ``max_token_len``,
    ``pad_token`` or ``prompt_key``)."""
    return bool(_SECRET.search(name) and not _NOT_SECRET.search(name)) or bool(_ENV_KEY.match(name))


def is_secret_key(dotted: str) -> bool:
    """A dotted key (``a.b[0].c``) under a secret-looking name at any level (``credentials.user`` too)."""
    return any(is_secret_name(part) for part in re.split(r"[.\[\]]+", dotted) if part)


@dataclasses.dataclass(frozen=True)
class Secret:
    """A secret the config holds: from environment variable ``env``, or written literally (``env`` None:
    never copied anywhere; ``key`` is the config key it was under)."""

    key: str
    env: str | None = None

    def __str__(self) -> str:
        return f"${{oc.env:{self.env}}}" if self.env else "<a literal secret, not shown>"

    __repr__ = __str__
    """Inside a list or map shown whole (``scheduling_spec: [{env_vars: {...}}]``) it shows the same."""


@dataclasses.dataclass(frozen=True)
class Unresolved:
    """An interpolation this machine cannot resolve (an unset environment variable, a missing key)."""

    text: str
    why: str

    def __str__(self) -> str:
        return self.text


class OverrideError(ValueError):
    """A command-line override that is not ``key=value``."""


def apply_overrides(config: dict[str, Any], overrides: Sequence[str]) -> None:
    """Hydra's ``a.b=value`` (``+a.b=``, ``++a.b=`` alike) and ``~a.b`` on ``config``, in place; values
    are YAML (``[a, b]``, ``true``, ``1e-6``)."""
    for item in overrides:
        if item.startswith("~"):
            *parents, last = item[1:].split("=")[0].split(".")
            node = _walk(config, parents, create=False)
            if isinstance(node, dict):
                node.pop(last, None)
            continue
        key, sep, text = item.lstrip("+").partition("=")
        if not sep or not key:
            raise OverrideError(f"override {item!r} is not key=value")
        *parents, last = key.split(".")
        node = _walk(config, parents, create=True)
        node[last] = yaml.safe_load(text) if text else None


def _walk(config: dict[str, Any], parts: Sequence[str], create: bool) -> Any:
    node: Any = config
    for part in parts:
        if not isinstance(node, dict):
            return None
        if part not in node or not isinstance(node[part], dict):
            if not create:
                return node.get(part)
            node[part] = {}
        node = node[part]
    return node


def leaves(config: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """``(dotted key, value)`` of every leaf, in the file's order; lists and empty mappings are leaves."""
    for key, value in config.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            yield from leaves(value, path + ".")
        else:
            yield path, value


def resolve(flat: Mapping[str, Any], env: Mapping[str, str]) -> dict[str, Any]:
    """Every leaf with its interpolations resolved (see the module docstring). A list or map leaf is
    resolved item by item, a secret inside it (``scheduling_spec[0].env_vars.WANDB_API_KEY``) replaced
    by its ``Secret``."""
    return {key: _value(key, value, flat, env, 0) for key, value in flat.items()}


def secrets_in(value: Any) -> list[Secret]:
    """Every ``Secret`` in a resolved value, nested lists and maps included."""
    if isinstance(value, Secret):
        return [value]
    if isinstance(value, Mapping):
        return [s for v in value.values() for s in secrets_in(v)]
    if isinstance(value, list):
        return [s for v in value for s in secrets_in(v)]
    return []


def _value(key: str, value: Any, flat: Mapping[str, Any], env: Mapping[str, str], depth: int) -> Any:
    secret_key = is_secret_key(key)
    if isinstance(value, Mapping):
        return {k: _value(f"{key}.{k}", v, flat, env, depth) for k, v in value.items()}
    if isinstance(value, list):
        items = [_value(f"{key}[{i}]", v, flat, env, depth) for i, v in enumerate(value)]
        unresolved = [v for v in items if isinstance(v, Unresolved)]
        return unresolved[0] if unresolved else items
    if not isinstance(value, str):
        return Secret(key) if secret_key and value is not None else value
    whole = _REF.fullmatch(value.strip())
    if whole is not None:
        return _interpolation(key, whole.group(1).strip(), flat, env, depth, secret_key)
    if _REF.search(value) is None:
        if secret_key and value:
            return Secret(key)
        return float(value) if _FLOAT.match(value) else value
    parts: list[str] = []
    last = 0
    for found in _REF.finditer(value):
        part = _interpolation(key, found.group(1).strip(), flat, env, depth, secret_key)
        if isinstance(part, Secret | Unresolved):
            return part
        parts += [value[last : found.start()], str(part)]
        last = found.end()
    return "".join(parts) + value[last:]


def _interpolation(
    key: str, ref: str, flat: Mapping[str, Any], env: Mapping[str, str], depth: int, secret_key: bool
) -> Any:
    if depth > 16:
        return Unresolved(f"${{{ref}}}", "interpolations nest more than 16 deep (a cycle?)")
    if (found := _ENV.match(ref)) is not None:
        var, default = found.group(1), found.group(2)
        if secret_key or is_secret_name(var):
            return Secret(key, var)
        if var in env:
            return env[var]
        if default is not None:
            return yaml.safe_load(default.strip()) if default.strip() else ""
        return Unresolved(f"${{{ref}}}", f"environment variable {var} is not set here")
    if (select := _SELECT.match(ref)) is not None:
        target, default = select.group(1), select.group(2)
        if target in flat or any(k.startswith(target + ".") for k in flat):
            return _interpolation(key, target, flat, env, depth + 1, secret_key)
        return yaml.safe_load(default.strip()) if default and default.strip() else None
    if ref in flat:
        return _value(key, flat[ref], flat, env, depth + 1)
    if subtree := {k[len(ref) + 1 :]: v for k, v in flat.items() if k.startswith(ref + ".")}:
        return _value(key, _nest(subtree), flat, env, depth + 1)  # ${actor.optimizer}: a whole map
    if _SHELL_VAR.match(ref) and (secret_key or is_secret_name(ref)):
        return Secret(key, ref)
    return Unresolved(f"${{{ref}}}", f"{ref} is not a key of the config (resolvers are not run)")


def _nest(flat: Mapping[str, Any]) -> dict[str, Any]:
    nested: dict[str, Any] = {}
    for dotted, value in flat.items():
        *parents, last = dotted.split(".")
        node = nested
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return nested
