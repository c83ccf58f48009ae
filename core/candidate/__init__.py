"""One candidate's work: apply its route, build its engine, check and time it."""
