"""How runs look: colours and names, the runs table, the timeline and comparison figures, the report, the
CLI's progress lines. Read-only over results; plotly is imported only where a figure is built."""
