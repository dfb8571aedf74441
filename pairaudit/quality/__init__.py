"""Quality: scoring answers, pairing the arms, and what a paired table of a given size can show."""
