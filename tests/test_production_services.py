"""The PostgreSQL and Redis fixtures give each test its own empty database."""

from __future__ import annotations

import psycopg
import redis

from tests.production_services import postgres_connections, postgres_url, redis_url

__all__ = ["postgres_url", "redis_url"]


def test_postgres_url_is_a_fresh_database(postgres_url: str) -> None:
    with psycopg.connect(postgres_url) as connection:
        tables = connection.execute(
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'"
        ).fetchone()
        assert tables == (0,)
        assert postgres_connections(postgres_url) == 1


def test_redis_url_is_an_empty_database_of_its_own(redis_url: str) -> None:
    database = redis.Redis.from_url(redis_url)
    assert database.dbsize() == 0
    assert not redis_url.endswith("/0")
    database.set("written", "1")
    assert database.dbsize() == 1
