"""Masking of secrets in what the pages show and the audit records.

Starts from the field names Airflow's secrets masker hides (``AIRFLOW_SENSITIVE_FIELDS``, a copy
kept as data so this package never imports Airflow; a test checks it against the installed
Airflow) and adds names that Airflow misses. A key is secret when its normalised name contains
one of those names, or when one of its words is a short secret word (``pw``, ``pwd``, ``jwt``):
short words match whole, so ``passenger_count``, ``author`` and ``compass`` stay visible.

Inside strings it masks: a URL's password (which may hold ``/``, ``@`` or quotes), ``name=value``
and ``"name": "value"`` pairs of secret names (URL query parameters, libpq DSNs, JSON and Python
reprs in exception texts), ``Bearer``/``Basic`` credentials, webhook URLs whose path is the
secret (Slack, Discord, Teams), PEM private keys, and JSON documents held in a string. In lists,
a ``[name, value]`` pair (a header list) and a ``{"name": ..., "value": ...}`` entry are masked
by their name.
"""

from __future__ import annotations

import json
import re
from typing import Any

MASK = "***"

# A copy of airflow's DEFAULT_SENSITIVE_FIELDS (``airflow._shared.secrets_masker``): the names whose
# values Airflow hides in logs and the UI. tests/lease/test_masking.py compares the two.
AIRFLOW_SENSITIVE_FIELDS: frozenset[str] = frozenset(
    {
        "access_key",
        "access_token",
        "api_key",
        "apikey",
        "auth_header",
        "authorization",
        "bearer",
        "connection_string",
        "dsn",
        "passphrase",
        "passwd",
        "password",
        "private_key",
        "proxy",
        "proxy_password",
        "proxies",
        "secret",
        "service_account",
        "service_key",
        "token",
        "keyfile_dict",
        "webhook_url",
    }
)
# Names Airflow's list misses that hold secrets in DAG conf, results and exception texts.
EXTRA_SENSITIVE_FIELDS: frozenset[str] = frozenset(
    {
        "api_token",
        "github_token",
        "slack_token",
        "signing_key",
        "encryption_key",
        "fernet_key",
        "secret_key",
        "credential",
        "cookie",
        "signature",
        "session_id",
        "client_secret",
    }
)
# Matched only as a whole word of the name (``db_pwd``, ``jwt``), never inside another word.
SENSITIVE_WORDS: frozenset[str] = frozenset({"pw", "pwd", "pass", "jwt", "auth", "otp"})

SENSITIVE_FIELDS = AIRFLOW_SENSITIVE_FIELDS | EXTRA_SENSITIVE_FIELDS
_FIELDS = tuple(sorted(f.replace("_", "") for f in SENSITIVE_FIELDS))
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_WORD_SPLIT = re.compile(r"[^a-z0-9]+")

# scheme://user:password@host: the password runs to the last '@' of the URL's word, so a
# password holding '/', '@' or a quote is masked whole (a few characters more at worst).
_URL_PASSWORD = re.compile(
    r"(?P<head>\b[a-z][a-z0-9+.-]*://[^\s:/@'\"]*:)\S*@(?=[^\s@]*(?:\s|$))", re.IGNORECASE
)
_CREDENTIAL = re.compile(
    r"(?P<head>\bBearer\s+)[A-Za-z0-9._~+/=\-]+|(?P<basic>\bBasic\s+)[A-Za-z0-9+/=]{8,}",
    re.IGNORECASE,
)
# the start of a pair: a (quoted) name and '=' or ':'; the value is read after it
_PAIR_NAME = re.compile(r"(?P<q>[\"']?)(?P<name>[A-Za-z_][A-Za-z0-9_.\-]*)(?P=q)\s*[=:]\s*")
_PAIR_VALUE = re.compile(
    r"\"(?:\\.|[^\"\\])*\"|'(?:\\.|[^'\\])*'|"
    r"(?:(?:Bearer|Basic|Token|Digest)\s+)?[^\s&;,'\"}\])]+",
    re.IGNORECASE,
)
_WEBHOOK = re.compile(
    r"(?P<head>https?://(?:hooks\.slack\.com/(?:services|workflows|triggers)|"
    r"(?:[a-z0-9-]+\.)?discord(?:app)?\.com/api/webhooks|"
    r"[a-z0-9-]+\.webhook\.office\.com/webhookb2)/)(?P<path>[^\s?#'\"]+)",
    re.IGNORECASE,
)
_PEM = re.compile(
    r"-----BEGIN (?P<what>[A-Z ]*PRIVATE KEY)-----.*?(?:-----END (?P=what)-----|$)", re.DOTALL
)


def is_sensitive(name: str) -> bool:
    """Whether a field called ``name`` holds a secret (``X-Api-Key``, ``githubToken``, ``pwd``)."""
    words = [w for w in _WORD_SPLIT.split(_CAMEL.sub("_", name).lower()) if w]
    if any(w in SENSITIVE_WORDS for w in words):
        return True
    joined = "".join(words)
    return any(field in joined for field in _FIELDS)


def mask(value: Any) -> Any:
    """Returns a copy of ``value`` with its secrets masked (dicts, lists and strings within)."""
    if isinstance(value, dict):
        return _mask_dict(value)
    if isinstance(value, list | tuple):
        if (
            len(value) == 2
            and isinstance(value[0], str)
            and is_sensitive(value[0])
            and value[1] is not None
        ):
            return [value[0], MASK]
        return [mask(v) for v in value]
    if isinstance(value, str):
        return mask_text(value)
    return value


def _mask_dict(value: dict[Any, Any]) -> dict[Any, Any]:
    label = next(
        (value[k] for k in ("name", "key", "header") if isinstance(value.get(k), str)), None
    )
    named_secret = label is not None and is_sensitive(label)
    out: dict[Any, Any] = {}
    for k, v in value.items():
        if isinstance(k, str) and is_sensitive(k) and v is not None:
            out[k] = MASK
        elif named_secret and k == "value" and v is not None:
            out[k] = MASK
        else:
            out[k] = mask(v)
    return out


def mask_text(text: str) -> str:
    """``text`` with the secrets it holds masked (JSON held in it is masked as JSON)."""
    stripped = text.strip()
    if stripped[:1] in ("{", "[") and stripped[-1:] in ("}", "]"):
        try:
            parsed = json.loads(stripped)
        except ValueError:
            pass
        else:
            return json.dumps(mask(parsed))
    text = _PEM.sub(lambda m: f"-----BEGIN {m.group('what')}-----{MASK}", text)
    text = _WEBHOOK.sub(lambda m: m.group("head") + MASK, text)
    text = _URL_PASSWORD.sub(lambda m: m.group("head") + MASK + "@", text)
    text = _mask_pairs(text)
    return _CREDENTIAL.sub(lambda m: (m.group("head") or m.group("basic")) + MASK, text)


def _mask_pairs(text: str) -> str:
    """Masks the value of every ``name=value`` / ``name: value`` pair with a secret name."""
    out: list[str] = []
    at = 0
    while (found := _PAIR_NAME.search(text, at)) is not None:
        if not is_sensitive(found.group("name")):
            out.append(text[at : found.end()])
            at = found.end()
            continue
        value = _PAIR_VALUE.match(text, found.end())
        out.append(text[at : found.end()])
        if value is None:
            at = found.end()
            continue
        quote = value.group(0)[0] if value.group(0)[:1] in ("'", '"') else ""
        out.append(f"{quote}{MASK}{quote}")
        at = value.end()
    out.append(text[at:])
    return "".join(out)
