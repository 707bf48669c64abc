-- Tokens may expire (docs/production/security.md): the time, in ms since the
-- epoch, from which the token is refused with token_expired; NULL: never.
-- Numbered 0017, not 0015: 0015 and 0016 are taken by work on other branches.
ALTER TABLE tokens ADD COLUMN expires_at INTEGER;
