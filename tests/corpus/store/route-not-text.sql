-- a BLOB where text is kept (SQLite turns a number into text here, not bytes)
UPDATE trials SET route = X'00ff' WHERE route = 'base';
