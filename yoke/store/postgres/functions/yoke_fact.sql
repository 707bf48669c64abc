-- yoke_fact: the current definition, as the migrations leave it (the last
-- to define it is migrations/0013_lifecycle.sql). Migrations install it; this
-- file is the text to read: tests/store/test_functions.py checks that it
-- equals what a migrated database holds.
CREATE OR REPLACE FUNCTION public.yoke_fact(p_tenant text, p_type text, p_payload json, p_now bigint)
 RETURNS void
 LANGUAGE plpgsql
AS $function$
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
END $function$;
