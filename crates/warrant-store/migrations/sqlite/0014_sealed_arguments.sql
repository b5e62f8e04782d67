-- A held call's exact arguments sealed at rest, when its contract has a sensitive field: kept
-- while the request may be decided or executed, dropped when it is consumed, rejected or expired.
ALTER TABLE approvals ADD COLUMN sealed_arguments TEXT;
