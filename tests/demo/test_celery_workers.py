"""The demo stack's Celery setup: one Redis database per stack, Airflow's settings for it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from airflow_plugins.demo.celery_workers import CLAIM_KEY, CeleryConfig

redis = pytest.importorskip("redis")


@pytest.fixture
def configs() -> Iterator[list[CeleryConfig]]:
    made: list[CeleryConfig] = []
    yield made
    for config in made:
        config.release_broker()


def _redis_up() -> bool:
    client = redis.Redis(host="127.0.0.1", port=6379, socket_timeout=2)
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()


@pytest.mark.skipif(not _redis_up(), reason="no Redis on 127.0.0.1:6379 (scripts/services)")
def test_two_stacks_get_their_own_redis_database(configs: list[CeleryConfig]) -> None:
    first, second = CeleryConfig(), CeleryConfig()
    configs += [first, second]
    urls = {first.claim_broker("stack-1"), second.claim_broker("stack-2")}
    assert len(urls) == 2, urls
    db = first.redis_db
    client = redis.Redis(host="127.0.0.1", port=6379, db=db)
    try:
        client.set("queued-message", "x")
        first.release_broker()
        assert client.get("queued-message") is None, "a stopped stack leaves its queue behind"
        assert client.get(CLAIM_KEY) is None, "a stopped stack keeps its database claimed"
    finally:
        client.close()


def test_the_settings_are_celery_executors_on_the_claimed_broker() -> None:
    config = CeleryConfig(workers=("w1", "w2"), visibility_timeout=30, redis_db=3)
    env = config.env("postgresql+psycopg2://postgres@127.0.0.1:5432/meta")
    assert env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"
    assert env["AIRFLOW__CELERY__BROKER_URL"] == "redis://127.0.0.1:6379/3"
    assert env["AIRFLOW__CELERY__RESULT_BACKEND"].startswith("db+postgresql")
    assert env["AIRFLOW__CELERY__TASK_ACKS_LATE"] == "True"
    assert env["AIRFLOW__CELERY_BROKER_TRANSPORT_OPTIONS__VISIBILITY_TIMEOUT"] == "30"
    names = {config.worker_args(w)[3] for w in config.workers}
    assert len(names) == 2
    assert all(n.startswith(("w1@", "w2@")) for n in names)
    rabbit = CeleryConfig(broker="rabbitmq")
    assert rabbit.env("x")["AIRFLOW__CELERY__BROKER_URL"].startswith("amqp://")


@pytest.mark.skipif(not _redis_up(), reason="no Redis on 127.0.0.1:6379 (scripts/services)")
def test_a_worker_that_does_not_consume_does_not_answer_the_ready_ping(
    configs: list[CeleryConfig],
) -> None:
    """The stack's ready check when Celery's INFO line is not logged: a ping through the broker.
    Nobody consumes from a freshly claimed database, and a broker that is down answers for
    nobody (a worker answering is what every stack start on Celery waits for)."""
    config = CeleryConfig()
    configs.append(config)
    config.claim_broker("ping-test")
    assert config.answers_ping("worker-a") is False
    down = CeleryConfig(redis_port=1, redis_db=1)
    assert down.answers_ping("worker-a") is False
