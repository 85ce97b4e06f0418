"""A failed session keeps the Airflow stack's logs, never its secrets."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.harness.fixtures import keep_logs


def test_the_logs_are_kept_and_their_ends_printed(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "home"
    (home / "logs" / "dag_id=billing_nightly").mkdir(parents=True)
    (home / "logs" / "dag_id=billing_nightly" / "attempt=1.log").write_text("charged c-001\n")
    (home / "scheduler-a.log").write_text("".join(f"line {n}\n" for n in range(100)))
    (home / "scheduler-a.pid").write_text("4242\n")
    (home / "passwords.json").write_text('{"admin": "secret"}\n')
    (home / "airflow.cfg").write_text("[api_auth]\njwt_secret = secret\n")

    kept = keep_logs(home, into=tmp_path / "artifacts")

    assert (kept / "logs" / "dag_id=billing_nightly" / "attempt=1.log").read_text() == (
        "charged c-001\n"
    )
    assert (kept / "scheduler-a.log").exists()
    assert not (kept / "passwords.json").exists()
    assert not (kept / "airflow.cfg").exists()
    assert not (kept / "scheduler-a.pid").exists()
    err = capfd.readouterr().err
    assert str(kept) in err
    assert "line 99" in err
    assert "line 39" not in err  # only the end of each log
    assert "secret" not in err
