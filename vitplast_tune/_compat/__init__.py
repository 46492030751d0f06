"""Keep other projects' internals in one place, each named with the version it was read from and tested against."""
