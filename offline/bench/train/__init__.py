"""Training recipes: losses, schedules, warm starts, and why some runs stall."""
