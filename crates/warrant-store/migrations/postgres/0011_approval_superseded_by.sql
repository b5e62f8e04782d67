-- The request a reviewer's edit replaced a request with (approve with edits).
ALTER TABLE approvals ADD COLUMN superseded_by TEXT;
