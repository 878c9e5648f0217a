"""What a burst is given: the user's workload and the machine it runs on."""
