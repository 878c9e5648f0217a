"""From the burst to the real job: the exported training script and the settings in the user's own framework."""
