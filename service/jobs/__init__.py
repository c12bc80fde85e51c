"""Jobs as members see them: submitting (checks, group commit), finding and describing,
sweeps, and what one member may read of another's."""
