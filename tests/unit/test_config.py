from yoke.config import Settings


def test_environment_and_overrides():
    env = {"YOKE_DATABASE_URL": "postgresql://x/y", "YOKE_TAIL_SWEEP_S": "0.5", "YOKE_PG_POOL_MAX": "4"}
    s = Settings.from_env(env)
    assert (s.database_url, s.tail_sweep_s, s.pg_pool_max) == ("postgresql://x/y", 0.5, 4)
    # Explicit arguments win over the environment; None means "not given".
    s = Settings.from_env(env, database_url="sqlite:///a.db", tail_sweep_s=None)
    assert (s.database_url, s.tail_sweep_s) == ("sqlite:///a.db", 0.5)
    assert Settings.from_env({}).database_url == "sqlite:///./.yoke/yoke.db"
