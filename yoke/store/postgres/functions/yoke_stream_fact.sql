-- yoke_stream_fact: the current definition, as the migrations leave it (the last
-- to define it is migrations/0013_lifecycle.sql). Migrations install it; this
-- file is the text to read: tests/store/test_functions.py checks that it
-- equals what a migrated database holds.
CREATE OR REPLACE FUNCTION public.yoke_stream_fact()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
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
END $function$;
