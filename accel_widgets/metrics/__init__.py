"""Pure numbers: robust statistics, units, FLOPs and peaks, energy, and the thresholds every reading uses."""
