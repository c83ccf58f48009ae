PRAGMA application_id = 1;
