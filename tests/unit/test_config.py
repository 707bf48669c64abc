from yoke.config import Settings


def test_environment_and_overrides():
    env = {"YOKE_DATABASE_URL": "postgresql://x/y", "YOKE_TAIL_SWEEP_S": "0.5", "YOKE_PG_POOL_MAX": "4"}
    s = Settings.from_env(env)
    assert (s.database_url, s.tail_sweep_s, s.pg_pool_max) == ("postgresql://x/y", 0.5, 4)
    # Explicit arguments win over the environment; None means "not given".
    s = Settings.from_env(env, database_url="sqlite:///a.db", tail_sweep_s=None)
    assert (s.database_url, s.tail_sweep_s) == ("sqlite:///a.db", 0.5)
    assert Settings.from_env({}).database_url == "sqlite:///./.yoke/yoke.db"


def test_http_connection_settings():
    import pytest

    from yoke.http.connection_limits import ConnectionLimits

    s = Settings.from_env({"YOKE_HTTP_HEADER_TIMEOUT_S": "2.5", "YOKE_HTTP_MAX_CONNECTIONS": "50"}, http_body_timeout_s=7)
    assert (s.http_header_timeout_s, s.http_body_timeout_s, s.http_max_connections) == (2.5, 7, 50)
    defaults = Settings()
    assert (defaults.http_header_timeout_s, defaults.http_body_timeout_s, defaults.http_keep_alive_s,
            defaults.http_max_connections, defaults.http_max_head_bytes) == (10.0, 60.0, 5.0, 1000, 32768)
    for bad in ({"max_connections": 0}, {"header_timeout_s": -1}, {"max_head_bytes": True}):
        with pytest.raises(ValueError):
            ConnectionLimits(**bad)
