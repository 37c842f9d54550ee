"""Import paths veRL users know from ``verl.experimental`` (the core never imports this package)."""
