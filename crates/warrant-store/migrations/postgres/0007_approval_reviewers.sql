-- Who may decide an approval beyond policy (a workflow review's `reviewers`): `{"role": …}` or
-- `{"principals": […]}`; NULL for anyone policy allows.
ALTER TABLE approvals ADD COLUMN reviewers TEXT;
