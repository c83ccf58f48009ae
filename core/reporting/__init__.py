"""What a run shows: the report files (HTML, Markdown, JSON) and the terminal tables."""
