"""CeleryExecutor for the demo stack: the broker, the result backend, the worker processes.

A stack on Celery runs real ``airflow celery worker`` processes (two by default), each with its
own Celery node name (``--celery-hostname worker-a@<host>``) and its own worker log server port,
on the machine's Redis (one database number per stack, claimed with ``SET NX``) or RabbitMQ as
broker, and the stack's metadata database as Celery's result backend (``db+postgresql://``).

Airflow's Celery defaults stay as a deployment has them: ``task_acks_late`` on (a message is
acknowledged when its task ends, so a worker lost mid-task has its task re-delivered) and a
prefetch of one. Only the visibility timeout, which Airflow sets to a day, can be shortened.
"""

from __future__ import annotations

import dataclasses
import socket
from collections.abc import Sequence

REDIS_HOST = "127.0.0.1"
REDIS_PORT = 6379
RABBITMQ_URL = "amqp://guest:guest@127.0.0.1:5672//"
WORKERS = ("worker-a", "worker-b")
#: ``[celery] celery_config_options`` of every component (see ``protection.celery_config``).
CELERY_CONFIG_OPTIONS = "airflow_plugins.protection.celery_config.CELERY_CONFIG"
# the key that marks a Redis database number as one stack's broker
CLAIM_KEY = "exactly-once:stack"
# database 0 is left to whoever else uses this Redis
FIRST_DB, LAST_DB = 1, 15


class BrokerUnavailable(RuntimeError):
    """No Redis database number was free, or the broker did not answer."""


@dataclasses.dataclass
class CeleryConfig:
    """How one stack uses Celery.

    Args:
        workers: the Celery node names of the worker processes (their ``--celery-hostname``
            is ``<name>@<host>``).
        broker: ``redis`` (the machine's Redis, a database number per stack) or ``rabbitmq``.
        concurrency: task slots of each worker.
        redis_port: the Redis server's port on 127.0.0.1 (default: the machine's, 6379).
        rabbitmq_url: the RabbitMQ broker's URL (default: the machine's, its ``/`` vhost).
        visibility_timeout: seconds Redis waits for an unacknowledged message before handing
            it out again (None: Airflow's default, a day).
        redelivery_guard: run every component with the plugin's Celery settings
            (``airflow_plugins.protection.celery_config``), so that a message re-delivered
            while its try runs does not fail that try; False keeps Airflow's defaults.
        extra_env: more settings for every component.
    """

    workers: Sequence[str] = WORKERS
    broker: str = "redis"
    concurrency: int = 4
    visibility_timeout: int | None = None
    redelivery_guard: bool = True
    extra_env: dict[str, str] = dataclasses.field(default_factory=dict)
    redis_port: int = REDIS_PORT
    rabbitmq_url: str = RABBITMQ_URL
    redis_db: int | None = None

    def node_name(self, worker: str) -> str:
        """The Celery node name of ``worker`` (what the task process reports as its worker)."""
        return f"{worker}@{socket.gethostname()}"

    def claim_broker(self, owner: str) -> str:
        """Claims a broker for one stack; returns its URL.

        Raises:
            BrokerUnavailable: Redis did not answer, or every database number is claimed.
        """
        if self.broker == "rabbitmq":
            return self.rabbitmq_url
        if self.broker != "redis":
            raise ValueError(f"broker must be redis or rabbitmq, not {self.broker!r}")
        import redis

        for db in range(FIRST_DB, LAST_DB + 1):
            client = redis.Redis(host=REDIS_HOST, port=self.redis_port, db=db, socket_timeout=5)
            try:
                if client.set(CLAIM_KEY, owner, nx=True):
                    # a claim a crashed stack left behind expires after a day
                    client.expire(CLAIM_KEY, 86400)
                    self.redis_db = db
                    return self.broker_url
            except redis.RedisError as exc:
                raise BrokerUnavailable(f"Redis at {REDIS_HOST}:{self.redis_port}: {exc}") from exc
            finally:
                client.close()
        raise BrokerUnavailable(f"every Redis database {FIRST_DB}-{LAST_DB} is claimed")

    @property
    def broker_url(self) -> str:
        """The broker URL of a claimed broker."""
        if self.broker == "rabbitmq":
            return self.rabbitmq_url
        if self.redis_db is None:
            raise BrokerUnavailable("no Redis database claimed yet")
        return f"redis://{REDIS_HOST}:{self.redis_port}/{self.redis_db}"

    def release_broker(self) -> None:
        """Empties and releases a claimed Redis database (queued messages included)."""
        if self.broker != "redis" or self.redis_db is None:
            return
        import redis

        client = redis.Redis(
            host=REDIS_HOST, port=self.redis_port, db=self.redis_db, socket_timeout=5
        )
        try:
            client.flushdb()
        except redis.RedisError:
            pass  # a Redis that is down keeps nothing anyway (no persistence here)
        finally:
            client.close()
        self.redis_db = None

    def answers_ping(self, worker: str, timeout: float = 1.0) -> bool:
        """True when ``worker`` answers a remote-control ping through the broker (it consumes
        from it). Needs the Celery extra and a claimed broker."""
        from celery import Celery
        from kombu.exceptions import OperationalError

        app = Celery(broker=self.broker_url)
        try:
            with app.connection_for_write() as conn:
                replies = app.control.ping(
                    destination=[self.node_name(worker)], timeout=timeout, connection=conn
                )
        except (OSError, OperationalError):
            return False  # the broker is down: no worker consumes from it
        finally:
            app.close()
        return bool(replies)

    def env(self, sqlalchemy_url: str) -> dict[str, str]:
        """The Airflow settings of every component for this Celery setup."""
        env = {
            "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
            "AIRFLOW__CELERY__BROKER_URL": self.broker_url,
            # Celery's database result backend takes an SQLAlchemy URL behind ``db+``
            "AIRFLOW__CELERY__RESULT_BACKEND": "db+" + sqlalchemy_url,
            "AIRFLOW__CELERY__WORKER_CONCURRENCY": str(self.concurrency),
            "AIRFLOW__CELERY__TASK_ACKS_LATE": "True",
            "AIRFLOW__CELERY__WORKER_ENABLE_REMOTE_CONTROL": "True",
        }
        if self.redelivery_guard:
            env["AIRFLOW__CELERY__CELERY_CONFIG_OPTIONS"] = CELERY_CONFIG_OPTIONS
        if self.visibility_timeout is not None:
            env["AIRFLOW__CELERY_BROKER_TRANSPORT_OPTIONS__VISIBILITY_TIMEOUT"] = str(
                self.visibility_timeout
            )
        env.update(self.extra_env)
        return env

    def worker_args(self, worker: str) -> list[str]:
        """The ``airflow`` arguments that start ``worker``."""
        return [
            "celery",
            "worker",
            "--celery-hostname",
            self.node_name(worker),
            "--concurrency",
            str(self.concurrency),
        ]
