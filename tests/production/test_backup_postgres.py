"""The PostgreSQL backup procedure of docs/production/backups.md, as written:
pg_dump under load as a backup role with BYPASSRLS, the database and its
runtime role gone, restored into a new database (pg_restore
--no-privileges), `yoke migrate` as the owner recreating the runtime role and
its grants, then every count checked: instance states, events, a copy
subscription's cursor."""

from __future__ import annotations

import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Iterator

import pytest

from tests.cli.conftest import yoke
from tests.conftest import PG_ADMIN_URL, admin_sql, with_database
from tests.http.conftest import run_apart, start_server, stop_server
from tests.production.test_backup_sqlite import APP, FAST, KEYS, Load, events, instances, listed, wait_idle
from yoke.store.postgres.store import with_user


@pytest.fixture
def roles() -> Iterator[dict[str, str]]:
    """An owner (the migrating login), a runtime role and a backup role: cluster-wide, dropped after."""
    tag = uuid.uuid4().hex[:8]
    made = {"owner": f"yoke_own_{tag}", "runtime": f"yoke_rt_{tag}", "backup": f"yoke_bk_{tag}"}
    run_apart(admin_sql(
        f'CREATE ROLE "{made["owner"]}" LOGIN CREATEROLE;'
        f' CREATE ROLE "{made["backup"]}" LOGIN BYPASSRLS; GRANT pg_read_all_data TO "{made["backup"]}"'
    ))
    databases: list[str] = []
    made["databases"] = databases  # type: ignore[assignment]
    yield made
    for name in databases:
        run_apart(admin_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    for role in ("runtime", "backup", "owner"):
        run_apart(admin_sql(f'DROP ROLE IF EXISTS "{made[role]}"'))


def new_database(roles: dict, prefix: str) -> str:
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    roles["databases"].append(name)
    run_apart(admin_sql(f'CREATE DATABASE "{name}" OWNER "{roles["owner"]}"'))
    return name


def test_pg_dump_under_load_restores_with_the_runtime_role(roles, tmp_path):
    owner, runtime, backup = roles["owner"], roles["runtime"], roles["backup"]
    name = new_database(roles, "yoke_bk_src")
    owner_url = with_user(with_database(PG_ADMIN_URL, name), owner)
    role_env = {"YOKE_PG_ROLE": runtime, "YOKE_PG_ROLE_PASSWORD": "pw-1"}
    yoke("migrate", cwd=tmp_path, YOKE_DATABASE_URL=owner_url, **role_env)
    dump = tmp_path / "yoke.dump"

    # The owner cannot dump: FORCE'd row-level security binds it. With
    # --enable-row-security it "succeeds" and dumps no tenant's rows.
    refused = subprocess.run(["pg_dump", "-Fc", "-f", str(tmp_path / "x.dump"), owner_url],
                             capture_output=True, text=True)
    assert refused.returncode != 0 and "row-level security" in refused.stderr

    server = start_server(owner_url, tmp_path / ".yoke", args=APP, **FAST, **role_env)
    try:
        with server.client() as http, Load(server) as load:
            made = http.post("/v1/streams/ticks/-/subscriptions",
                             json={"name": "copy", "receiver": {"kind": "copy", "target": "/ticks-copy"}})
            assert made.status_code == 201, made.text
            load.wait_sent(2 * KEYS)
            while len(listed(http, "counter")) < KEYS:
                load.wait_sent(load.sent + 10)
            empty = subprocess.run(["pg_dump", "-Fc", "--enable-row-security", "-f", str(tmp_path / "e.dump"),
                                    owner_url], capture_output=True, text=True)
            assert empty.returncode == 0  # the trap: exit 0 ...
            listing = subprocess.run(["pg_restore", "-f", "-", "--data-only", "-t", "events",
                                      str(tmp_path / "e.dump")], capture_output=True, text=True, check=True)
            assert "\t" not in listing.stdout.split("COPY public.events", 1)[1].split("\\.", 1)[0]  # ... no rows
            # The procedure: the backup role, while the load goes on.
            subprocess.run(["pg_dump", "-Fc", "-f", str(dump), with_user(owner_url, backup)], check=True)
            sent_at_dump = load.sent
            load.wait_sent(sent_at_dump + 50)
        assert not load.errors, load.errors
    finally:
        stop_server(server)

    # A new cluster has neither the database nor the runtime role.
    run_apart(admin_sql(f'DROP DATABASE "{name}" WITH (FORCE)'))
    run_apart(admin_sql(f'DROP ROLE "{runtime}"'))
    restored = new_database(roles, "yoke_bk_new")
    subprocess.run(["pg_restore", "--no-privileges", "--exit-on-error", "-d",
                    with_database(PG_ADMIN_URL, restored), str(dump)], check=True)
    restored_url = with_user(with_database(PG_ADMIN_URL, restored), owner)
    done = yoke("migrate", cwd=tmp_path, YOKE_DATABASE_URL=restored_url, **{**role_env, "YOKE_PG_ROLE_PASSWORD": "pw-2"})
    assert f'CREATE ROLE "{runtime}" LOGIN PASSWORD ***;' in done.stdout
    assert "REVOKE ALL ON FUNCTION yoke_find_token(text) FROM PUBLIC;" in done.stdout  # the dump's ACLs left out

    server = start_server(restored_url, tmp_path / ".yoke-restored", args=APP, **FAST,
                          **{**role_env, "YOKE_PG_ROLE_PASSWORD": "pw-2"})
    try:
        with server.client() as http:
            ticks = [t for t in events(http, "/ticks") if t["type"] == "tick"]
            assert 2 * KEYS <= len(ticks) <= sent_at_dump + 1
            wait_idle(http, len(ticks))
            per_key = Counter(t["payload"]["k"] for t in ticks)
            [stats] = instances(http, "stats")
            assert stats["state"]["value"] == {"n": len(ticks)}
            for c in instances(http, "counter"):
                k = int(c["key"])
                assert c["state"]["value"] == {"n": per_key[k]}, c
                assert [e["payload"]["n"] for e in events(http, f"/counted/{k}")] == list(range(1, per_key[k] + 1))
            # The copy subscription resumed from its restored cursor: each tick copied once.
            deadline = time.monotonic() + 60
            while True:
                copies = [e["payload"]["i"] for e in events(http, "/ticks-copy")]
                if len(copies) >= len(ticks):
                    break
                assert time.monotonic() < deadline, (len(copies), len(ticks))
                time.sleep(0.1)  # polling the server's progress
            assert sorted(copies) == sorted(t["payload"]["i"] for t in ticks)
    finally:
        stop_server(server)
