"""A run: its options, their recipe form, preparation, the main job, the files it writes."""
