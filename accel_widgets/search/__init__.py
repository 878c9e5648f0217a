"""Drivers that run many bursts: the classic ladder, sweeps, the tuner, the batch-size finder, re-measures."""
