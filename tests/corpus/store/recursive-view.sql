-- trials as a view that never ends (and never returns a row): SELECT * FROM trials hangs
DROP TABLE trials;
CREATE VIEW trials AS
    WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n)
    SELECT i AS id FROM n WHERE i < 0;
