-- Lifecycle facts on the tenant's global stream '/'.
--
-- A stream created (any path but '/') or closed, and an actor instance
-- created, adopted (its worker set where it had none) or removed, append one
-- kernel event to '/' in the transaction that makes the change: triggers, so
-- that every path that inserts or changes these rows (yoke_append creating
-- a stream, yoke_fanout creating a keyed instance, adoption, close) records
-- it. yoke_fact appends through yoke_append with p_kernel (a closed or full
-- '/' still takes it). The SQLite backend does the same in its store code.

CREATE FUNCTION yoke_fact(p_tenant text, p_type text, p_payload json, p_now bigint)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_payload text := p_payload::text;
BEGIN
    PERFORM yoke_append(
        p_tenant, '/', 'str_' || substr(md5(random()::text || clock_timestamp()::text), 1, 24), p_now,
        ARRAY[0],
        ARRAY[lpad(to_hex(p_now), 12, '0') || substr(md5(random()::text || v_payload), 1, 20)],
        ARRAY[p_type], ARRAY[v_payload], ARRAY['{}'], ARRAY[NULL::text], ARRAY[NULL::text],
        ARRAY[0], ARRAY[NULL::text], ARRAY[NULL::text], ARRAY[NULL::text],
        ARRAY[octet_length(p_type) + octet_length(v_payload) + 2 + 64], ARRAY[false],
        ARRAY[NULL::text], true);
END $$;

CREATE FUNCTION yoke_stream_fact() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        PERFORM yoke_fact(NEW.tenant_id, 'yoke.stream.created',
            json_build_object('path', NEW.path, 'stream_id', NEW.stream_id, 'created_at', NEW.created_at),
            NEW.created_at);
    ELSE
        PERFORM yoke_fact(NEW.tenant_id, 'yoke.stream.closed',
            json_build_object('path', NEW.path, 'stream_id', NEW.stream_id),
            (extract(epoch FROM clock_timestamp()) * 1000)::bigint);
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER yoke_stream_created AFTER INSERT ON streams
    FOR EACH ROW WHEN (NEW.path <> '/') EXECUTE FUNCTION yoke_stream_fact();
CREATE TRIGGER yoke_stream_closed AFTER UPDATE OF closed ON streams
    FOR EACH ROW WHEN (NEW.closed AND NOT OLD.closed) EXECUTE FUNCTION yoke_stream_fact();

CREATE FUNCTION yoke_instance_fact() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    i actor_instances%ROWTYPE;
    v_type text;
BEGIN
    IF TG_OP = 'DELETE' THEN
        i := OLD;
        v_type := 'yoke.instance.removed';
    ELSE
        i := NEW;
        v_type := CASE TG_OP WHEN 'INSERT' THEN 'yoke.instance.created' ELSE 'yoke.instance.adopted' END;
    END IF;
    PERFORM yoke_fact(i.tenant_id, v_type,
        json_build_object('instance_id', i.instance_id, 'actor', i.actor, 'key', i.key,
                          'parent_id', i.parent_id, 'worker_id', i.worker_id),
        (extract(epoch FROM clock_timestamp()) * 1000)::bigint);
    RETURN NULL;
END $$;

CREATE TRIGGER yoke_instance_created AFTER INSERT ON actor_instances
    FOR EACH ROW EXECUTE FUNCTION yoke_instance_fact();
CREATE TRIGGER yoke_instance_adopted AFTER UPDATE OF worker_id ON actor_instances
    FOR EACH ROW WHEN (OLD.worker_id IS NULL AND NEW.worker_id IS NOT NULL)
    EXECUTE FUNCTION yoke_instance_fact();
CREATE TRIGGER yoke_instance_removed AFTER DELETE ON actor_instances
    FOR EACH ROW EXECUTE FUNCTION yoke_instance_fact();

GRANT EXECUTE ON FUNCTION yoke_fact TO yoke_runtime;
