-- The audit trail is append-only for everyone but its owner, and the administrative functions
-- are not everyone's. Idempotent.
--
-- The grants give no role UPDATE, DELETE or TRUNCATE on runlease.audit (airflow_plugins.lease.roles);
-- this trigger refuses them even to a role given them by mistake. Only the audit's owner (the
-- role that migrates and runs `runlease maintain`, which moves rows out of the default
-- partition and drops old months) and superusers pass.

CREATE OR REPLACE FUNCTION runlease.audit_append_only() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF pg_has_role(current_user,
                   (SELECT relowner FROM pg_class WHERE oid = 'runlease.audit'::regclass),
                   'MEMBER') THEN
        RETURN CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END;
    END IF;
    RAISE EXCEPTION 'runlease.audit is append-only: % refused for role %', TG_OP, current_user
        USING ERRCODE = 'insufficient_privilege';
END $$;

DROP TRIGGER IF EXISTS audit_append_only ON runlease.audit;
CREATE TRIGGER audit_append_only BEFORE UPDATE OR DELETE ON runlease.audit
    FOR EACH ROW EXECUTE FUNCTION runlease.audit_append_only();
DROP TRIGGER IF EXISTS audit_no_truncate ON runlease.audit;
CREATE TRIGGER audit_no_truncate BEFORE TRUNCATE ON runlease.audit
    FOR EACH STATEMENT EXECUTE FUNCTION runlease.audit_append_only();

-- administrative changes and retention: granted to the operator role (and the owner) only
REVOKE EXECUTE ON FUNCTION runlease.force_release(text, text, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION runlease.approve_rerun(text, date, text, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION runlease.prune(integer, integer) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION runlease.ensure_audit_partitions(date, date) FROM PUBLIC;
