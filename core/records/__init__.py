"""Records: a trial, and the trial store that keeps every trial of every search."""
