-- Fixtures that every file in sql/ but setup.sql (which tests CREATE EXTENSION itself)
-- loads first, so that each file runs alone (dev/run-tests regress NAME) as well as in the
-- Makefile's order. A file loads it with
--
--     \set ECHO none
--     \ir sql/include/fixtures.sql
--
-- (pg_regress feeds psql the file on stdin from the directory make runs in, the project
-- root, so the path is relative to it). Nothing
-- here prints; the last line sets ECHO back to all, as pg_regress runs psql.
--
-- Only what does not depend on the order lives here: the extension (created when a file
-- runs alone, left as it is otherwise) and the helpers (replaced by the same definition).
-- Policies, overrides, roles and tables are each file's own: it makes what it uses (under
-- names no other file uses, or made anew so that their versions, and so their buckets,
-- are new) and removes them at its end.

-- The extension, without the NOTICE that it already exists.
SELECT current_setting('client_min_messages') AS rl_fixtures_client_min_messages \gset
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS ratelimit;
SET client_min_messages = :'rl_fixtures_client_min_messages';
\unset rl_fixtures_client_min_messages

-- An error's SQLSTATE and message, or 'no error'.
CREATE OR REPLACE FUNCTION expect_error(statement text) RETURNS text
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE statement;
    RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ': ' || SQLERRM;
END
$$;

\set ECHO all
