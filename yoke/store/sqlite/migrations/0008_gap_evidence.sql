-- A repaired live gap leaves evidence (seed 004; yoke/streams/gaps.py).
CREATE TABLE gap_evidence (
    tenant_id   TEXT    NOT NULL,
    sid         INTEGER NOT NULL,
    detected_at INTEGER NOT NULL,
    first_seq   INTEGER NOT NULL,
    last_seq    INTEGER NOT NULL,
    cause       TEXT    NOT NULL,
    process     TEXT    NOT NULL,
    PRIMARY KEY (tenant_id, sid, detected_at, first_seq)
) WITHOUT ROWID;
