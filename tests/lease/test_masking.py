"""Masking against a table of hostile payloads: every secret is gone, nothing else is touched.

Each case is what a task could return, put in its DAG conf or raise: the secret must not appear
anywhere in the masked form, and the words that only look like secrets stay readable.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from airflow_plugins.lease import audit_payload, masking

SECRET = "S3cr3t-Value_42"
# (case, value, the secret texts that must be gone, the texts that must stay)
CASES: list[tuple[str, Any, list[str], list[str]]] = [
    ("api_key field", {"api_key": SECRET, "rows": 3}, [SECRET], ["rows"]),
    ("DSN in a result", {"conn": f"postgresql://u:{SECRET}@db/x"}, [SECRET], ["@db/x", "u:"]),
    *[
        (f"{name} field", {name: SECRET}, [SECRET], [name])
        for name in (
            "github_token",
            "api_token",
            "slack_token",
            "pwd",
            "pw",
            "jwt",
            "signing_key",
            "encryption_key",
            "fernet_key",
            "client_secret",
            "X-Api-Key",
            "accessToken",
            "db_password",
            "Authorization",
        )
    ],
    (
        "header pairs as lists",
        {"headers": [["Authorization", f"Bearer {SECRET}"], ["Accept", "text/plain"]]},
        [SECRET],
        ["Accept", "text/plain"],
    ),
    ("header pair, one letter", [["Authorization", "Bearer t"]], ["Bearer t"], ["Authorization"]),
    (
        "name/value header entries",
        {"headers": [{"name": "X-Auth-Token", "value": SECRET}, {"name": "Accept", "value": "a"}]},
        [SECRET],
        ["Accept"],
    ),
    ("bare Bearer string", f"called with Bearer {SECRET} and failed", [SECRET], ["failed"]),
    ("Basic credentials", f"Authorization: Basic {SECRET}", [SECRET], []),
    (
        "JSON inside a string (conf value)",
        {"conf": json.dumps({"password": SECRET, "customers": 12})},
        [SECRET],
        ["customers", "12"],
    ),
    (
        "a Connection's extra",
        {"extra": json.dumps({"keyfile_dict": {"private_key": SECRET}, "project": "p1"})},
        [SECRET],
        ["p1"],
    ),
    (
        "URL query parameters",
        f"GET https://api.example/v1?api_key={SECRET}&page=2&token={SECRET}x failed",
        [SECRET],
        ["page=2", "api.example/v1"],
    ),
    (
        "Slack webhook URL",
        {"url": f"https://hooks.slack.com/services/T0001/B0002/{SECRET}"},
        [SECRET, "T0001"],
        ["hooks.slack.com"],
    ),
    (
        "Discord webhook URL in text",
        f"post to https://discord.com/api/webhooks/123/{SECRET} timed out",
        [SECRET],
        ["timed out"],
    ),
    (
        "password with a slash",
        "postgresql://u:ab/cd" + SECRET + "@db:5432/x",
        ["ab/cd", SECRET],
        ["db:5432/x"],
    ),
    ("password with an @", f"postgresql://u:p@{SECRET}@db/x", [SECRET, "p@"], ["db/x"]),
    (
        "password with an escaped quote (libpq)",
        f"connection failed: host=db password='a\\'{SECRET}' user=app",
        [SECRET],
        ["host=db", "user=app"],
    ),
    (
        "password with a quote in a URL",
        {"target": f'postgresql://u:a"{SECRET}@db/x'},
        [SECRET],
        [],
    ),
    (
        "psycopg error text",
        f'connection to server at "db" (10.0.0.5), port 5432 failed: password={SECRET}',
        [SECRET],
        ["port 5432"],
    ),
    (
        "Python repr in an exception",
        f"KeyError in {{'user': 'app', 'passwd': '{SECRET}'}}",
        [SECRET],
        ["'user': 'app'"],
    ),
    (
        "PEM private key",
        f"-----BEGIN RSA PRIVATE KEY-----\nMIIE{SECRET}\n-----END RSA PRIVATE KEY-----",
        [SECRET],
        [],
    ),
    (
        "no over-masking",
        {"passenger_count": 4, "author": "ada", "compass": "north", "tokens_note": "x"},
        [],
        ["4", "ada", "north"],
    ),
    (
        "fencing tokens in prose stay",
        "superseded by token 1041 (attempt 2)",
        [],
        ["token 1041", "attempt 2"],
    ),
]


def _leaks(value: Any, gone: list[str], kept: list[str]) -> list[str]:
    shown = json.dumps(audit_payload.mask(value))
    audited = audit_payload.audit_text(value) or ""
    return [f"leaked {s!r}: {shown}" for s in gone if s in shown or s in audited] + [
        f"over-masked {k!r}: {shown}" for k in kept if k not in shown
    ]


def test_every_secret_in_the_table_is_masked_and_the_rest_is_kept() -> None:
    wrong = {case: leaks for case, *row in CASES if (leaks := _leaks(*row))}
    assert wrong == {}


def test_the_copy_of_airflows_sensitive_fields_matches_airflow() -> None:
    from airflow._shared.secrets_masker import DEFAULT_SENSITIVE_FIELDS

    assert frozenset(DEFAULT_SENSITIVE_FIELDS) == masking.AIRFLOW_SENSITIVE_FIELDS


def test_every_airflow_field_is_masked() -> None:
    for name in masking.AIRFLOW_SENSITIVE_FIELDS:
        assert masking.mask({name: SECRET}) == {name: masking.MASK}, name


def test_the_lease_package_does_not_import_airflow() -> None:
    code = "import sys, airflow_plugins.lease.masking; print('airflow' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
